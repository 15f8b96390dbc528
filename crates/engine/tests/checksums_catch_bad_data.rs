//! CRC32C end to end: a payload that does not match the caller's CRC is refused, and a block
//! whose bytes no longer match the CRC kept in the chunk map fails the read instead of
//! returning wrong data.

mod common;

use common::*;
use stria_engine::{Engine, EngineError};
use stria_proto::fs::{FsStatus, TargetId};

#[test]
fn a_payload_with_the_wrong_crc_is_refused_and_stores_nothing() {
    let (_drives, array) = raid5(4);
    let dir = temp_dir("crc-payload");
    let engine = Engine::create(array, &dir, TargetId(1)).expect("create");
    let data = vec![3u8; 9000];
    let good = crc32c::crc32c(&data);
    let err = engine.write(chunk(1, 0), 0, &data, Some(good ^ 1)).expect_err("bad crc");
    assert!(matches!(err, EngineError::PayloadChecksum { .. }), "{err}");
    assert_eq!(err.status(), FsStatus::Invalid);
    assert_eq!(engine.chunk_len(chunk(1, 0)).expect("len"), None);
    assert_eq!(engine.space().used_bytes, 0);
    engine.write(chunk(1, 0), 0, &data, Some(good)).expect("good crc");
    assert_eq!(engine.read(chunk(1, 0), 0, 9000).expect("read"), data);
    // Whole blocks are checked through their block CRCs: one flipped bit anywhere, or the
    // CRC of other bytes, is refused just the same.
    let blocks: Vec<u8> = (0..64 * 4096).map(|i| (i * 7 % 251) as u8).collect();
    let good = crc32c::crc32c(&blocks);
    for bad in [good ^ 1, good ^ 0x8000_0000, crc32c::crc32c(&blocks[4096..])] {
        let err = engine.write(chunk(1, 1), 8192, &blocks, Some(bad)).expect_err("bad crc");
        assert!(matches!(err, EngineError::PayloadChecksum { .. }), "{err}");
    }
    let mut flipped = blocks.clone();
    flipped[40 * 4096 + 17] ^= 4;
    let err = engine.write(chunk(1, 1), 8192, &flipped, Some(good)).expect_err("flipped");
    assert!(matches!(err, EngineError::PayloadChecksum { .. }), "{err}");
    assert_eq!(engine.chunk_len(chunk(1, 1)).expect("len"), None);
    engine.write(chunk(1, 1), 8192, &blocks, Some(good)).expect("good crc");
    assert_eq!(engine.read(chunk(1, 1), 8192, blocks.len() as u32).expect("read"), blocks);
    drop(engine);
}

#[test]
fn a_block_changed_behind_the_engine_fails_its_read() {
    let (_drives, array) = raid5(4);
    let dir = temp_dir("crc-block");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    let c = chunk(5, 3);
    let data: Vec<u8> = (0..5 * 4096).map(|i| (i % 253) as u8).collect();
    engine.write(c, 0, &data, None).expect("write");
    // Small writes wait in the open stripe's image until a sync writes them out.
    engine.sync().expect("sync");
    // Rewrite block 2 of the chunk through the array: RAID's own checksums are updated, so
    // only the engine's CRC can notice.
    let at = engine.locate(c, 2 * 4096 + 17).expect("locate").expect("mapped");
    array.write(at, &vec![0xab; 4096]).expect("raw write");
    let err = engine.read(c, 0, 5 * 4096).expect_err("corrupt block must fail the read");
    match &err {
        EngineError::Corrupt { chunk: bad, block, .. } => {
            assert_eq!((*bad, *block), (c, 2));
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    assert_eq!(err.status(), FsStatus::Io);
    assert!(err.to_string().contains("block 2"), "{err}");
    // Blocks that are intact still read.
    assert_eq!(engine.read(c, 0, 2 * 4096).expect("read"), data[..2 * 4096]);
    assert_eq!(engine.read(c, 3 * 4096, 2 * 4096).expect("read"), data[3 * 4096..]);
    // A partial write into the bad block must not launder it into a good checksum.
    let err = engine.write(c, 2 * 4096 + 100, b"x", None).expect_err("rmw of a bad block");
    assert!(matches!(err, EngineError::Corrupt { .. }));
    // Overwriting the whole block replaces it and the chunk reads again.
    engine.write(c, 2 * 4096, &data[2 * 4096..3 * 4096], None).expect("overwrite");
    assert_eq!(engine.read(c, 0, 5 * 4096).expect("read"), data);
    drop(engine);
}
