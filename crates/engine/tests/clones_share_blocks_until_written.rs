//! `clone_object`: the copy names the source's blocks instead of copying them, reads the same
//! bytes, and stays as it was while the source is written, punched, truncated and removed
//! (copy-on-write); blocks come back only when the last record naming them goes, also after
//! the map is reopened (the references are rebuilt from it).

mod common;

use common::*;
use stria_engine::Engine;
use stria_proto::fs::{ObjectId, TargetId};

/// Chunk index -> expected bytes of one object.
type Model = Vec<Vec<u8>>;

fn check(engine: &Engine, object: u64, model: &Model, what: &str) {
    let chunks = engine.list_chunks(ObjectId(object)).expect("list");
    assert_eq!(chunks.len(), model.len(), "{what}: chunk count");
    for (index, want) in model.iter().enumerate() {
        let got = engine.read(chunk(object, index as u64), 0, 1 << 20).expect("read");
        assert!(got == *want, "{what}: chunk {index} ({} bytes, want {})", got.len(), want.len());
    }
}

#[test]
fn a_clone_keeps_its_bytes_while_the_source_changes_and_goes() {
    let (_drives, array) = raid5(32);
    let dir = temp_dir("clone");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    let empty = engine.space().used_bytes;
    let mut rng = Rng::new(7);
    // Object 1: small packed chunks and large ones.
    let mut source: Model = Vec::new();
    for index in 0..6u64 {
        let len = if index % 2 == 0 { 9_000 } else { 400_000 };
        let bytes = rng.bytes(len);
        engine.write(chunk(1, index), 0, &bytes, None).expect("write");
        source.push(bytes);
    }
    engine.sync().expect("sync");
    let used = engine.space().used_bytes;

    assert_eq!(engine.clone_object(ObjectId(1), ObjectId(2)).expect("clone"), 6);
    let snapshot = source.clone();
    check(&engine, 2, &snapshot, "the clone right after");
    assert_eq!(engine.space().used_bytes, used, "a clone takes no data blocks");
    assert_eq!(engine.shared_bytes(), used - empty, "every block of object 1 is shared");
    // fsck's check: sharing is expected of objects that may share, a fault of any other.
    let shared = (used - empty) / 4096;
    let sharing = engine.check_sharing(|_| true).expect("check");
    assert_eq!((sharing.shared_blocks, sharing.wrongly_shared_blocks), (shared, 0));
    let sharing = engine.check_sharing(|o| o != ObjectId(1)).expect("check");
    assert_eq!(sharing.wrongly_shared_blocks, shared, "object 1 may not share its blocks");

    // The source changes: overwrites, a punch, a truncate.
    for index in 0..6u64 {
        let at = rng.below(8_000) as usize;
        let len = 1 + rng.below(20_000) as usize;
        let bytes = rng.bytes(len);
        engine.write(chunk(1, index), at as u32, &bytes, None).expect("overwrite");
        let model = &mut source[index as usize];
        if model.len() < at + bytes.len() {
            model.resize(at + bytes.len(), 0);
        }
        model[at..at + bytes.len()].copy_from_slice(&bytes);
    }
    engine.punch(chunk(1, 1), 4096, 8192).expect("punch");
    source[1][4096..4096 + 8192].fill(0);
    engine.truncate(chunk(1, 3), 5000).expect("truncate");
    source[3].truncate(5000);
    engine.sync().expect("sync");
    check(&engine, 1, &source, "the source after its changes");
    check(&engine, 2, &snapshot, "the clone after the source changed");

    // A clone of the clone, then the source and the first clone go.
    assert_eq!(engine.clone_object(ObjectId(2), ObjectId(3)).expect("clone of a clone"), 6);
    engine.remove_object(ObjectId(1)).expect("remove source");
    engine.remove_object(ObjectId(2)).expect("remove clone");
    engine.sync().expect("sync");
    check(&engine, 3, &snapshot, "the second clone after both others went");
    let shared = engine.shared_bytes();
    assert_eq!(shared, 0, "object 3 alone names its blocks now");

    // Reopened, the references are rebuilt from the map.
    assert_eq!(engine.clone_object(ObjectId(3), ObjectId(4)).expect("clone"), 6);
    let used = engine.space().used_bytes;
    let shared = engine.shared_bytes();
    drop(engine);
    let engine = Engine::open(array.clone(), &dir).expect("reopen");
    assert_eq!(engine.shared_bytes(), shared, "shared blocks counted again at open");
    assert_eq!(engine.space().used_bytes, used);
    check(&engine, 3, &snapshot, "object 3 after reopening");
    check(&engine, 4, &snapshot, "object 4 after reopening");
    engine.remove_object(ObjectId(3)).expect("remove");
    engine.sync().expect("sync");
    check(&engine, 4, &snapshot, "object 4 after its source went");
    engine.remove_object(ObjectId(4)).expect("remove");
    engine.sync().expect("sync");
    let space = engine.space();
    assert_eq!(space.used_bytes, empty, "every block is free once nothing names it");
    assert_eq!(space.used_bytes + space.free_bytes + space.reclaimable_bytes, space.total_bytes);
}

#[test]
fn a_clone_needs_an_empty_destination_other_than_its_source() {
    let (_drives, array) = raid5(16);
    let dir = temp_dir("clone-refused");
    let engine = Engine::create(array, &dir, TargetId(1)).expect("create");
    engine.write(chunk(1, 0), 0, &[1u8; 5000], None).expect("write");
    engine.write(chunk(2, 0), 0, &[2u8; 5000], None).expect("write");
    assert!(engine.clone_object(ObjectId(1), ObjectId(1)).is_err(), "onto itself");
    assert!(engine.clone_object(ObjectId(1), ObjectId(2)).is_err(), "onto chunks");
    assert_eq!(engine.read(chunk(2, 0), 0, 5000).expect("read"), vec![2u8; 5000]);
    assert_eq!(engine.clone_object(ObjectId(9), ObjectId(10)).expect("empty source"), 0);
    assert_eq!(engine.shared_bytes(), 0);
}

/// Writers keep rewriting the source's chunks (each write a whole chunk of one byte value, so
/// every state a chunk has is uniform) while it is cloned again and again: every chunk of every
/// clone is one state its source chunk really had, and once everything is removed every block
/// is free again.
#[test]
fn clones_taken_under_writes_hold_states_their_source_had() {
    let (_drives, array) = raid5(32);
    let dir = temp_dir("clone-concurrent");
    let engine = std::sync::Arc::new(Engine::create(array, &dir, TargetId(1)).expect("create"));
    let empty = engine.space().used_bytes;
    let sizes = [8192usize, 65_536, 300_000];
    for (index, &len) in sizes.iter().enumerate() {
        engine.write(chunk(1, index as u64), 0, &vec![1u8; len], None).expect("first write");
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (engine, stop) = (engine.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(100 + w);
                let mut value = 2u8 + w as u8;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let index = rng.below(sizes.len() as u64);
                    let len = sizes[index as usize];
                    engine.write(chunk(1, index), 0, &vec![value; len], None).expect("write");
                    value = value.wrapping_add(2).max(2);
                }
            })
        })
        .collect();
    for clone in 0..20u64 {
        let dest = 10 + clone;
        assert_eq!(engine.clone_object(ObjectId(1), ObjectId(dest)).expect("clone"), 3);
        for (index, &len) in sizes.iter().enumerate() {
            let got = engine.read(chunk(dest, index as u64), 0, 1 << 20).expect("read clone");
            assert_eq!(got.len(), len, "clone {clone} chunk {index}: length");
            assert!(got.iter().all(|&b| b == got[0]), "clone {clone} chunk {index}: torn");
        }
    }
    stop_writers(&stop, writers);
    remove_all_and_check_free(&engine, empty);
}

fn stop_writers(stop: &std::sync::atomic::AtomicBool, writers: Vec<std::thread::JoinHandle<()>>) {
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.join().expect("writer");
    }
}

/// Removes the source (object 1) and the copies (10..30); then no block is shared or used.
fn remove_all_and_check_free(engine: &Engine, empty: u64) {
    let all: Vec<ObjectId> = [1u64].into_iter().chain(10..30).map(ObjectId).collect();
    engine.remove_objects(&all).expect("remove");
    engine.sync().expect("sync");
    assert_eq!(engine.shared_bytes(), 0);
    assert_eq!(engine.space().used_bytes, empty, "every block is free once nothing names it");
}

/// `begin_clone` notes the instant; changes to the source before `finish_clone` (overwrites,
/// punches, truncates, removed and new chunks) copy their chunk first, so the finished copy
/// is the source at the begin. Meanwhile the copy may not change, and no second copy of
/// either object begins.
#[test]
fn a_begun_copy_is_of_its_begin_whatever_changes_before_it_is_finished() {
    for seed in seeds(4) {
        let (_drives, array) = raid5(32);
        let dir = temp_dir("clone-begun");
        let engine = Engine::create(array, &dir, TargetId(1)).expect("create");
        let empty = engine.space().used_bytes;
        let mut rng = Rng::new(seed);
        let mut source: Model = Vec::new();
        for index in 0..6u64 {
            let len = 1 + rng.below(300_000) as usize;
            let bytes = rng.bytes(len);
            engine.write(chunk(1, index), 0, &bytes, None).expect("write");
            source.push(bytes);
        }
        assert_eq!(engine.begin_clone(ObjectId(1), ObjectId(2)).expect("begin"), 6);
        let at_begin = source.clone();
        assert!(engine.write(chunk(2, 0), 0, &[9u8; 4096], None).is_err(), "the copy is fixed");
        assert!(engine.begin_clone(ObjectId(1), ObjectId(3)).is_err(), "one copy at a time");
        assert!(engine.begin_clone(ObjectId(2), ObjectId(3)).is_err(), "not of a copy underway");
        // Chunks that exist, one removed, and new ones past the end.
        for _ in 0..40 {
            let index = rng.below(8);
            let model = (index as usize) < source.len();
            match rng.below(4) {
                0 if model => {
                    let len = source[index as usize].len();
                    let at = rng.below(len as u64 + 1) as u32;
                    let n = rng.below(20_000) as u32;
                    engine.punch(chunk(1, index), at, n).expect("punch");
                    let end = (at as usize + n as usize).min(len);
                    source[index as usize][at as usize..end.max(at as usize)].fill(0);
                }
                1 if model => {
                    let len = rng.below(200_000) as u32;
                    engine.truncate(chunk(1, index), len).expect("truncate");
                    source[index as usize].resize(len as usize, 0);
                }
                2 if index == 5 => {
                    engine.remove(chunk(1, 5)).expect("remove a chunk");
                    source[5].clear();
                }
                _ => {
                    let at = rng.below(100_000) as usize;
                    let len = 1 + rng.below(70_000) as usize;
                    let bytes = rng.bytes(len);
                    engine.write(chunk(1, index), at as u32, &bytes, None).expect("write");
                    if !model {
                        source.resize(index as usize + 1, Vec::new());
                    }
                    let m = &mut source[index as usize];
                    if m.len() < at + bytes.len() {
                        m.resize(at + bytes.len(), 0);
                    }
                    m[at..at + bytes.len()].copy_from_slice(&bytes);
                }
            }
        }
        assert_eq!(engine.finish_clone(ObjectId(1), ObjectId(2)).expect("finish"), 6);
        check(&engine, 2, &at_begin, "the copy");
        for (index, want) in source.iter().enumerate() {
            let got = engine.read(chunk(1, index as u64), 0, 1 << 20).expect("read source");
            assert!(got == *want, "seed {seed}: source chunk {index}");
        }
        assert!(engine.finish_clone(ObjectId(1), ObjectId(2)).is_err(), "finished once");
        engine.write(chunk(2, 0), 0, &[9u8; 4096], None).expect("the copy is a volume now");
        engine.remove_objects(&[ObjectId(1), ObjectId(2)]).expect("remove");
        engine.sync().expect("sync");
        assert_eq!(engine.space().used_bytes, empty, "seed {seed}: every block is free");
    }
}

/// Removing the source of a copy under way finishes the copy first; removing the copy
/// cancels it, and the source goes on unhindered.
#[test]
fn removing_either_side_of_a_begun_copy() {
    let (_drives, array) = raid5(32);
    let dir = temp_dir("clone-removed");
    let engine = Engine::create(array, &dir, TargetId(1)).expect("create");
    let empty = engine.space().used_bytes;
    let mut rng = Rng::new(5);
    let source: Model = (0..4).map(|_| rng.bytes(100_000)).collect();
    for (index, bytes) in source.iter().enumerate() {
        engine.write(chunk(1, index as u64), 0, bytes, None).expect("write");
    }
    engine.begin_clone(ObjectId(1), ObjectId(2)).expect("begin");
    engine.write(chunk(1, 0), 0, &[7u8; 8192], None).expect("write copies chunk 0 first");
    engine.remove_object(ObjectId(1)).expect("remove the source");
    check(&engine, 2, &source, "the copy of a removed source");
    assert!(engine.finish_clone(ObjectId(1), ObjectId(2)).is_err(), "finished by the removal");

    engine.begin_clone(ObjectId(2), ObjectId(3)).expect("begin");
    engine.write(chunk(2, 1), 0, &[8u8; 8192], None).expect("write copies chunk 1 first");
    engine.remove_object(ObjectId(3)).expect("remove the copy");
    assert!(engine.finish_clone(ObjectId(2), ObjectId(3)).is_err(), "cancelled");
    assert!(engine.list_chunks(ObjectId(3)).expect("list").is_empty(), "nothing copied after");
    engine.write(chunk(2, 2), 0, &[9u8; 8192], None).expect("no copy due any more");
    engine.write(chunk(3, 0), 0, &[1u8; 4096], None).expect("object 3 is free to use");
    engine.remove_objects(&[ObjectId(2), ObjectId(3)]).expect("remove");
    engine.sync().expect("sync");
    assert_eq!(engine.shared_bytes(), 0);
    assert_eq!(engine.space().used_bytes, empty, "every block is free once nothing names it");
}

/// As the NBD gateway does: writers hold a shared lock around each write, and a copy takes it
/// exclusively only for `begin_clone`, then finishes while the writers go on. Every chunk of
/// every copy holds the value its source chunk had at the begin.
#[test]
fn copies_held_only_for_their_begin_are_of_that_instant() {
    use std::sync::{Arc, Mutex, RwLock};
    let (_drives, array) = raid5(32);
    let dir = temp_dir("clone-instant");
    let engine = Arc::new(Engine::create(array, &dir, TargetId(1)).expect("create"));
    let empty = engine.space().used_bytes;
    let sizes = [8192usize, 65_536, 300_000, 12_288];
    // The value each chunk was last written with, changed under the hold with the write.
    let last = Arc::new(Mutex::new(vec![1u8; sizes.len()]));
    for (index, &len) in sizes.iter().enumerate() {
        engine.write(chunk(1, index as u64), 0, &vec![1u8; len], None).expect("first write");
    }
    let hold = Arc::new(RwLock::new(()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (engine, stop, hold, last) =
                (engine.clone(), stop.clone(), hold.clone(), last.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(300 + w);
                let mut value = 2u8 + w as u8;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let index = rng.below(sizes.len() as u64);
                    let len = sizes[index as usize];
                    let _held = hold.read().expect("hold");
                    // Writers of the same chunk race; the lock on `last` orders them.
                    let mut last = last.lock().expect("last");
                    engine.write(chunk(1, index), 0, &vec![value; len], None).expect("write");
                    last[index as usize] = value;
                    drop(last);
                    value = value.wrapping_add(2).max(2);
                }
            })
        })
        .collect();
    for copy in 0..20u64 {
        let dest = 10 + copy;
        let at_begin = {
            let _held = hold.write().expect("hold");
            engine.begin_clone(ObjectId(1), ObjectId(dest)).expect("begin");
            last.lock().expect("last").clone()
        };
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(engine.finish_clone(ObjectId(1), ObjectId(dest)).expect("finish"), 4);
        for (index, &len) in sizes.iter().enumerate() {
            let got = engine.read(chunk(dest, index as u64), 0, 1 << 20).expect("read copy");
            assert_eq!(got, vec![at_begin[index]; len], "copy {copy} chunk {index}");
        }
    }
    stop_writers(&stop, writers);
    remove_all_and_check_free(&engine, empty);
}

/// A copy must be begun to be finished, cannot begin into a volume removed before (its caller
/// gave up on it), and a finish that finds its copy cancelled fails.
#[test]
fn finishing_needs_a_live_copy_and_removed_volumes_take_none() {
    let (_drives, array) = raid5(16);
    let dir = temp_dir("clone-refused-late");
    let engine = Engine::create(array, &dir, TargetId(1)).expect("create");
    let volume = |n: u64| ObjectId(ObjectId::VOLUME_BIT | n);
    engine.write(chunk(volume(1).0, 0), 0, &[1u8; 8192], None).expect("write");
    assert!(engine.finish_clone(volume(1), volume(2)).is_err(), "nothing begun");
    assert!(engine.list_chunks(volume(2)).expect("list").is_empty(), "and nothing copied");
    // The caller gave up and removed its copy before the begin reached the target.
    engine.remove_objects(&[volume(3)]).expect("remove");
    assert!(engine.begin_clone(volume(1), volume(3)).is_err(), "a removed volume");
    engine.write(chunk(volume(1).0, 0), 0, &[2u8; 8192], None).expect("no copy due");
    // Begun, then cancelled by the copy's removal: the finish fails.
    engine.begin_clone(volume(1), volume(4)).expect("begin");
    engine.remove_object(volume(4)).expect("remove the copy");
    assert!(engine.finish_clone(volume(1), volume(4)).is_err(), "cancelled");
    assert_eq!(engine.clone_object(volume(1), volume(5)).expect("a whole copy still works"), 1);
    assert_eq!(engine.read(chunk(volume(5).0, 0), 0, 8192).expect("read"), vec![2u8; 8192]);
}
