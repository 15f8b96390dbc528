//! Chunk-map changes are staged and committed in batches: every reader sees a change as soon
//! as the call that made it returns (single reads, reads whose record left the record cache,
//! scans of an object, of the whole map, and space per object), before, across and after a
//! batch commit, and a sync makes all of them durable.

mod common;

use std::collections::BTreeMap;

use common::*;
use stria_engine::Engine;
use stria_proto::fs::{ChunkId, ObjectId, TargetId};

/// What the map must hold: chunk -> bytes.
type Model = BTreeMap<(u64, u64), Vec<u8>>;

fn check_scans(engine: &Engine, model: &Model, when: &str) {
    let all: Vec<((u64, u64), u32)> = engine
        .all_chunks()
        .expect("all chunks")
        .into_iter()
        .map(|(c, len)| ((c.object.0, c.index), len))
        .collect();
    let want: Vec<((u64, u64), u32)> =
        model.iter().map(|(&key, bytes)| (key, bytes.len() as u32)).collect();
    assert_eq!(all, want, "all_chunks {when}");
    for object in 1..=12u64 {
        let listed = engine.list_chunks(ObjectId(object)).expect("list");
        let want: Vec<(u64, u32)> = model
            .range((object, 0)..=(object, u64::MAX))
            .map(|(&(_, index), bytes)| (index, bytes.len() as u32))
            .collect();
        assert_eq!(listed, want, "list_chunks of object {object} {when}");
        let usage = engine.object_usage(ObjectId(object)).expect("usage");
        assert_eq!(usage.chunks, want.len() as u64, "object_usage of {object} {when}");
    }
}

fn check_reads(engine: &Engine, model: &Model, when: &str) {
    for (&(object, index), bytes) in model {
        let chunk = ChunkId { object: ObjectId(object), index };
        let got = engine.read(chunk, 0, bytes.len() as u32).expect("read");
        assert!(got == *bytes, "chunk {chunk} reads back {when}");
    }
}

#[test]
fn every_reader_sees_staged_changes_and_a_sync_keeps_them() {
    let (_drives, array) = raid5(32);
    let dir = temp_dir("staged");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    let mut rng = Rng::new(7);
    let mut model = Model::new();
    // Far fewer changes than a batch: all of them are staged, none committed.
    for step in 0..150u64 {
        let (object, index) = (1 + rng.below(12), rng.below(8));
        let blocks = 1 + rng.below(3) as usize;
        let bytes = rng.bytes(4096 * blocks);
        engine.write(chunk(object, index), 0, &bytes, None).expect("write");
        let previous = model.insert((object, index), bytes);
        if let Some(previous) = previous
            && previous.len() > model[&(object, index)].len()
        {
            // A shorter rewrite keeps the old length: the tail is the old bytes.
            let entry = model.get_mut(&(object, index)).expect("just written");
            let at = entry.len();
            entry.extend_from_slice(&previous[at..]);
        }
        if step % 9 == 0 {
            let (object, index) = (1 + rng.below(12), rng.below(8));
            engine.remove(chunk(object, index)).expect("remove");
            model.remove(&(object, index));
        }
        if matches!(step, 5 | 40 | 63 | 64 | 65 | 100 | 149) {
            let when = format!("after step {step}");
            check_scans(&engine, &model, &when);
            check_reads(&engine, &model, &when);
        }
    }
    // An empty write takes the record out of the record cache and does not put it back: the
    // next read finds it staged (or committed).
    for &(object, index) in model.keys() {
        engine.write(chunk(object, index), 0, &[], None).expect("empty write");
    }
    check_reads(&engine, &model, "after the record cache lost every record");
    check_scans(&engine, &model, "after the record cache lost every record");

    engine.sync().expect("sync");
    drop(engine);
    let engine = Engine::open(array, &dir).expect("reopen");
    check_scans(&engine, &model, "after a sync and a reopen");
    check_reads(&engine, &model, "after a sync and a reopen");
}
