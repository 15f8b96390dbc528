//! A full target answers NoSpace without damaging what it stores, and removing chunks gives the
//! space back (a write that runs short syncs once to reuse blocks parked by removals).

mod common;

use common::*;
use stria_engine::{Engine, EngineError};
use stria_proto::fs::{FsStatus, TargetId};

const MIB: usize = 1 << 20;

#[test]
fn filling_up_gives_no_space_and_removal_gives_it_back() {
    let (_drives, array) = raid5(4);
    let dir = temp_dir("nospace");
    let engine = Engine::create(array, &dir, TargetId(2)).expect("create");
    let total = engine.space().total_bytes;
    assert!(total > 4 * MIB as u64, "array too small for the test: {total}");
    let payload = |i: u64| vec![(i % 251) as u8 + 1; MIB];
    let mut written = 0u64;
    let err = loop {
        match engine.write(chunk(1, written), 0, &payload(written), None) {
            Ok(_) => written += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, EngineError::NoSpace { .. }), "expected NoSpace, got {err}");
    assert_eq!(err.status(), FsStatus::NoSpace);
    assert_eq!(written, total / MIB as u64, "every whole MiB of the data area is usable");
    let space = engine.space();
    assert_eq!(space.used_bytes, written * MIB as u64);
    assert_eq!(space.chunks, written);
    // The refused write left no trace, and a small write still fits the tail.
    assert_eq!(engine.chunk_len(chunk(1, written)).expect("len"), None);
    // Overwriting needs fresh blocks too (copy-on-write): refused, old data intact.
    let free_blocks = space.free_bytes / 4096;
    let err = engine
        .write(chunk(1, 0), 0, &vec![0xee; (free_blocks as usize + 1) * 4096], None)
        .expect_err("overwrite larger than free space");
    assert!(matches!(err, EngineError::NoSpace { .. }));
    for i in 0..written {
        assert_eq!(engine.read(chunk(1, i), 0, MIB as u32).expect("read"), payload(i), "chunk {i}");
    }
    // Remove two chunks: their blocks wait for a durable commit, which the next short write
    // triggers by itself.
    assert!(engine.remove(chunk(1, 0)).expect("remove"));
    assert_eq!(engine.remove_object(stria_proto::fs::ObjectId(7)).expect("nothing"), 0);
    assert!(engine.remove(chunk(1, 1)).expect("remove"));
    assert_eq!(engine.space().reclaimable_bytes, 2 * MIB as u64);
    engine.write(chunk(2, 0), 0, &vec![0x55; 2 * MIB], None).expect("space came back");
    assert_eq!(engine.read(chunk(2, 0), MIB as u32, 8).expect("read"), vec![0x55; 8]);
    for i in 2..written {
        assert_eq!(engine.read(chunk(1, i), 0, MIB as u32).expect("read"), payload(i), "chunk {i}");
    }
    // Remove the whole object: all of its space returns after a sync.
    assert_eq!(engine.remove_object(stria_proto::fs::ObjectId(1)).expect("remove"), written - 2);
    engine.sync().expect("sync");
    let space = engine.space();
    assert_eq!(space.used_bytes, 2 * MIB as u64);
    assert_eq!(space.free_bytes + space.used_bytes, space.total_bytes);
    drop(engine);
}
