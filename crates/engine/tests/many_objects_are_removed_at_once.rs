//! `remove_objects`: every chunk of many objects goes in one chunk-map commit; objects not
//! named keep their data, missing objects are no error, and the blocks come back at the next
//! sync like those of any removal.

mod common;

use common::*;
use stria_engine::Engine;
use stria_proto::fs::{ObjectId, TargetId};

#[test]
fn named_objects_lose_every_chunk_and_the_rest_keep_theirs() {
    let (_drives, array) = raid5(32);
    let dir = temp_dir("remove-objects");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    let mut rng = Rng::new(42);
    let data = |rng: &mut Rng, object: u64| {
        // Small files (packed) and objects of several chunks.
        if object % 3 == 0 { rng.bytes(300_000) } else { rng.bytes(4096) }
    };
    let mut kept = Vec::new();
    for object in 1..=60u64 {
        let chunks = if object % 3 == 0 { 3 } else { 1 };
        let mut bytes = Vec::new();
        for index in 0..chunks {
            let b = data(&mut rng, object);
            engine.write(chunk(object, index), 0, &b, None).expect("write");
            bytes.push(b);
        }
        kept.push((object, bytes));
    }
    engine.sync().expect("sync");
    let used = engine.space().used_bytes;
    let gone: Vec<ObjectId> = (1..=40u64).map(ObjectId).chain([ObjectId(999)]).collect();
    let removed = engine.remove_objects(&gone).expect("remove");
    let expected: u64 = (1..=40u64).map(|o| if o % 3 == 0 { 3 } else { 1 }).sum();
    assert_eq!(removed, expected, "every chunk of the named objects");
    for object in 1..=40u64 {
        assert!(engine.list_chunks(ObjectId(object)).expect("list").is_empty(), "{object}");
    }
    for (object, bytes) in kept.iter().filter(|(o, _)| *o > 40) {
        for (index, want) in bytes.iter().enumerate() {
            let got = engine.read(chunk(*object, index as u64), 0, 1 << 20).expect("read");
            assert!(got == *want, "object {object} chunk {index} keeps its data");
        }
    }
    assert_eq!(engine.remove_objects(&gone).expect("again"), 0, "removing twice is harmless");
    engine.sync().expect("sync");
    let space = engine.space();
    assert!(space.used_bytes < used, "the removed chunks' blocks are free after a sync");
    assert_eq!(space.used_bytes + space.free_bytes + space.reclaimable_bytes, space.total_bytes);
}

/// An object named twice is removed once: its chunks are counted once and its blocks released
/// once, so a block it shares with a clone stays the clone's, and the next sync frees each block
/// one time.
#[test]
fn an_object_named_twice_is_removed_once() {
    let (_drives, array) = raid5(32);
    let dir = temp_dir("remove-objects-twice");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    let volume = |n: u64| ObjectId(ObjectId::VOLUME_BIT | n);
    let mut rng = Rng::new(7);
    let source = rng.bytes(1 << 20);
    engine
        .write(stria_proto::fs::ChunkId { object: volume(1), index: 0 }, 0, &source, None)
        .expect("write");
    engine.write(chunk(5, 0), 0, &rng.bytes(300_000), None).expect("write");
    engine.clone_object(volume(1), volume(2)).expect("clone");
    engine.sync().expect("sync");
    assert_eq!(
        engine.remove_objects(&[volume(1), volume(1), ObjectId(5), ObjectId(5)]).expect("remove"),
        2
    );
    engine.sync().expect("sync after the removal");
    // Whatever was freed is taken again by new data; the clone keeps its bytes.
    for i in 0..20u64 {
        engine.write(chunk(100 + i, 0), 0, &rng.bytes(1 << 20), None).expect("refill");
    }
    engine.sync().expect("sync");
    let clone = stria_proto::fs::ChunkId { object: volume(2), index: 0 };
    assert!(engine.read(clone, 0, 1 << 20).expect("the clone reads") == source);
}
