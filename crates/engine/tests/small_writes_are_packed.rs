//! On RAID 5/6, writes smaller than a stripe are packed into an open stripe: the array journals
//! no partial-stripe update for them, their parity stays right (a lost drive reads everything
//! back), a sync closes the open stripe so synced blocks are never written again, and space
//! accounting still adds up.

mod common;

use std::sync::Arc;
use std::thread;

use common::*;
use stria_engine::Engine;
use stria_proto::fs::TargetId;

const THREADS: u64 = 6;
const WRITES: u64 = 150;

fn stripe_of(array: &stria_raid::Array, byte: u64) -> u64 {
    byte / array.geometry().stripe_data_bytes()
}

#[test]
fn concurrent_small_writes_are_packed_and_survive_a_lost_drive() {
    let (_drives, array) = raid5(16);
    let dir = temp_dir("packed");
    let engine = Arc::new(Engine::create(array.clone(), &dir, TargetId(1)).expect("create"));
    let journaled = array.status().journal_records;
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let engine = engine.clone();
            thread::spawn(move || {
                let mut rng = Rng::new(77 + t);
                let mut model: Vec<Vec<u8>> = vec![Vec::new(); 4];
                for _ in 0..WRITES {
                    let i = rng.below(4);
                    // Whole blocks, 1..3 of them, at block offsets: no edge reads.
                    let offset = rng.below(16) as usize * 4096;
                    let blocks = rng.below(3) as usize + 1;
                    let data = rng.bytes(blocks * 4096);
                    engine.write(chunk(t + 1, i), offset as u32, &data, None).expect("write");
                    model_write(&mut model[i as usize], offset, &data);
                }
                model
            })
        })
        .collect();
    let models: Vec<Vec<Vec<u8>>> =
        workers.into_iter().map(|w| w.join().expect("worker")).collect();
    assert_eq!(
        array.status().journal_records,
        journaled,
        "small block-aligned writes never reach the array as partial-stripe updates"
    );
    let read_all = |what: &str| {
        for (t, model) in models.iter().enumerate() {
            for (i, want) in model.iter().enumerate() {
                let got = engine.read(chunk(t as u64 + 1, i as u64), 0, 1 << 20).expect("read");
                assert!(got == *want, "{what}: chunk {}/{i}", t + 1);
            }
        }
    };
    read_all("before sync");
    engine.sync().expect("sync");
    let space = engine.space();
    assert_eq!(space.used_bytes + space.free_bytes + space.reclaimable_bytes, space.total_bytes);
    array.fail_drive(1).expect("fail a drive");
    read_all("with a drive lost");
}

#[test]
fn a_sync_closes_the_open_stripe() {
    let (_drives, array) = raid5(16);
    let dir = temp_dir("packed-sync");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    let block = vec![7u8; 4096];
    engine.write(chunk(1, 0), 0, &block, None).expect("write a");
    engine.write(chunk(2, 0), 0, &block, None).expect("write b");
    let a = engine.locate(chunk(1, 0), 0).expect("locate").expect("mapped");
    let b = engine.locate(chunk(2, 0), 0).expect("locate").expect("mapped");
    assert_eq!(b, a + 4096, "consecutive small writes take consecutive blocks");
    let free_before = engine.space().free_bytes;
    engine.sync().expect("sync");
    engine.write(chunk(3, 0), 0, &block, None).expect("write c");
    let c = engine.locate(chunk(3, 0), 0).expect("locate").expect("mapped");
    assert_ne!(stripe_of(&array, c), stripe_of(&array, a), "synced stripes are not written again");
    assert_eq!(engine.space().free_bytes, free_before - 4096, "the closed tail is free again");
    // The closed stripe's free tail is still usable by ordinary allocations.
    let big = vec![9u8; 3 * 4096];
    engine.write(chunk(4, 0), 4096, &big, None).expect("write d");
    assert_eq!(engine.read(chunk(4, 0), 4096, 3 * 4096).expect("read d"), big);
    assert_eq!(engine.read(chunk(1, 0), 0, 4096).expect("read a"), block);
}

#[test]
fn filling_the_array_with_small_writes_uses_every_block() {
    let (_drives, array) = raid5(4);
    let dir = temp_dir("packed-full");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    let total = engine.space().total_bytes / 4096;
    let block = vec![3u8; 4096];
    let mut written = 0u64;
    loop {
        match engine.write(chunk(written + 1, 0), 0, &block, None) {
            Ok(_) => written += 1,
            Err(e) => {
                assert_eq!(e.status(), stria_proto::fs::FsStatus::NoSpace, "{e}");
                break;
            }
        }
    }
    assert_eq!(written, total, "every data block holds a chunk");
    for i in [1, written / 2, written] {
        assert_eq!(engine.read(chunk(i, 0), 0, 4096).expect("read"), block);
    }
}

#[test]
fn overwriting_far_more_than_the_capacity_never_runs_out_of_space() {
    let (_drives, array) = raid5(4);
    let dir = temp_dir("packed-overwrite");
    let engine = Arc::new(Engine::create(array.clone(), &dir, TargetId(1)).expect("create"));
    let capacity = engine.space().total_bytes;
    // A working set of a quarter of the target, rewritten until five capacities went by, with
    // no sync from the caller: parked blocks must come back when space runs short.
    let chunks = (capacity / 4 / (64 * 1024)).max(1);
    let per_thread = 5 * capacity / 4 / 16384;
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let engine = engine.clone();
            thread::spawn(move || {
                let mut rng = Rng::new(500 + t);
                for i in 0..per_thread {
                    let c = chunk(1, rng.below(chunks));
                    let offset = rng.below(4) as u32 * 16384;
                    let data = rng.bytes(16384);
                    if let Err(e) = engine.write(c, offset, &data, None) {
                        panic!("thread {t} write {i}: {e} ({:?})", engine.space());
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
}

#[test]
fn levels_without_parity_batch_small_writes_too() {
    for (level, count, lost) in
        [(stria_raid::Level::Raid0, 3, None), (stria_raid::Level::Raid10, 4, Some(1))]
    {
        let drives = Drives::new(count, 16 << 20);
        let array = drives.create(level, 16 * 1024);
        let dir = temp_dir("packed-plain");
        let engine = Arc::new(Engine::create(array.clone(), &dir, TargetId(1)).expect("create"));
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                let engine = engine.clone();
                thread::spawn(move || {
                    let mut rng = Rng::new(900 + t);
                    let mut model = Vec::new();
                    for _ in 0..100 {
                        let offset = rng.below(8) as usize * 4096;
                        let data = rng.bytes(4096);
                        engine.write(chunk(t + 1, 0), offset as u32, &data, None).expect("write");
                        model_write(&mut model, offset, &data);
                    }
                    model
                })
            })
            .collect();
        let models: Vec<Vec<u8>> = workers.into_iter().map(|w| w.join().expect("worker")).collect();
        let a = engine.locate(chunk(1, 0), 0).expect("locate");
        assert!(a.is_some(), "{level}: written blocks are mapped");
        if let Some(slot) = lost {
            array.fail_drive(slot).expect("fail a mirror");
        }
        for (t, want) in models.iter().enumerate() {
            let got = engine.read(chunk(t as u64 + 1, 0), 0, 1 << 20).expect("read");
            assert!(got == *want, "{level}: chunk {} reads back", t + 1);
        }
        engine.sync().expect("sync");
        let space = engine.space();
        assert_eq!(
            space.used_bytes + space.free_bytes + space.reclaimable_bytes,
            space.total_bytes
        );
    }
}
