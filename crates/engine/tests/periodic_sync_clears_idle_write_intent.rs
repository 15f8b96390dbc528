//! The periodic sync (`Engine::sync_if_changed`) also runs when the array's write-intent bitmap
//! holds bits of regions no longer being written. A flush keeps the bits of regions written
//! since the flush before, so without it the bits a burst of writes leaves would stay set until
//! the next write or a clean stop (and a crash meanwhile would resync those regions). With it
//! they go one interval after the burst, and an idle target with a clean bitmap costs nothing.

mod common;

use common::*;
use stria_engine::Engine;
use stria_engine::testing::MemMapStore;
use stria_io::BlockDevice;
use stria_proto::fs::TargetId;

#[test]
fn a_burst_of_writes_leaves_no_write_intent_behind() {
    let (drives, array) = raid5(24);
    let marked_on_disk = || {
        let bitmap = drives.0[0].read_at(array.layout().bitmap_offset, 4096).expect("bitmap");
        bitmap.iter().any(|&b| b != 0)
    };
    let store = MemMapStore::new();
    let engine =
        Engine::create_with_backend(array.clone(), store.backend(), TargetId(1)).expect("create");
    engine.sync().expect("sync");
    for _ in 0..3 {
        engine.sync_if_changed().expect("settle");
    }
    assert!(!marked_on_disk() && !array.write_intent_idle());
    assert!(!engine.sync_if_changed().expect("idle"), "an idle, clean target costs nothing");

    engine.write(chunk(1, 0), 0, &vec![7u8; 1 << 20], None).expect("write");
    assert!(marked_on_disk(), "the write marked its region first");
    assert!(engine.sync_if_changed().expect("sync"), "the write is a change");
    // That flush kept the bit: its region was written in the interval it closed.
    assert!(marked_on_disk());
    assert!(array.write_intent_idle(), "nothing written since");
    assert!(engine.sync_if_changed().expect("sync"), "the idle bit is reason enough");
    assert!(!marked_on_disk(), "cleared one interval after the burst");
    assert!(!engine.sync_if_changed().expect("idle"), "then nothing to do");
    let back = engine.read(chunk(1, 0), 0, 1 << 20).expect("read");
    assert!(back.len() == 1 << 20 && back.iter().all(|&b| b == 7));
}
