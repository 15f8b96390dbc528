//! Allocation: a small chunk takes one 4 KiB block, not a stripe; a large write lands on a
//! stripe-aligned contiguous run so the array sees full-stripe writes.

mod common;

use common::*;
use stria_engine::Engine;
use stria_proto::fs::TargetId;

#[test]
fn small_chunks_take_blocks_and_large_writes_take_whole_stripes() {
    let (_drives, array) = raid5(8);
    let stripe_bytes = array.geometry().stripe_data_bytes();
    assert_eq!(stripe_bytes, 3 * 16 * 1024);
    let dir = temp_dir("alloc");
    let engine = Engine::create(array, &dir, TargetId(1)).expect("create");
    for i in 0..5 {
        engine.write(chunk(1, i), 0, &[1u8; 100], None).expect("small write");
    }
    assert_eq!(engine.space().used_bytes, 5 * 4096, "a 100-byte chunk uses one block");
    let big = chunk(2, 0);
    engine.write(big, 0, &vec![2u8; 1 << 20], None).expect("large write");
    let start = engine.locate(big, 0).expect("locate").expect("mapped");
    assert_eq!(start % stripe_bytes, 0, "large write starts on a stripe boundary");
    for block in 0..256u64 {
        let at = engine.locate(big, (block * 4096) as u32).expect("locate").expect("mapped");
        assert_eq!(at, start + block * 4096, "large write is one contiguous run");
    }
    assert_eq!(engine.locate(chunk(3, 0), 0).expect("locate"), None);
    drop(engine);
}
