//! On RAID 5/6, writes smaller than a stripe are packed into an open stripe: the array journals
//! no partial-stripe update for them, their parity stays right (a lost drive reads everything
//! back), a sync closes the open stripe so synced blocks are never written again, and space
//! accounting still adds up. The open stripe is held in memory (write-back) until it is full or
//! a sync closes it; a failed stripe write fails the next sync. The write that fills a stripe
//! may leave its array write to the caller (`Engine::write_deferring`), who may do it later,
//! on another thread, or never: a writer short of room or the next sync then does it.

mod common;

use std::sync::Arc;
use std::thread;

use common::*;
use stria_engine::Engine;
use stria_io::BlockDevice;
use stria_io::fault::FaultDevice;
use stria_io::mem::MemDevice;
use stria_proto::fs::{FsStatus, TargetId};
use stria_raid::{Array, ArrayConfig, CreateOptions, Level};

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

fn bytes_written(array: &Array) -> u64 {
    array.status().members.iter().map(|m| m.written_bytes).sum()
}

#[test]
fn small_writes_stay_in_memory_until_their_stripe_is_full_or_synced() {
    let (_drives, array) = raid5(16);
    let dir = temp_dir("packed-writeback");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    let stripe_blocks = array.geometry().stripe_data_bytes() / 4096;
    let block = |i: u64| vec![i as u8 + 1; 4096];
    let (before, journaled) = (bytes_written(&array), array.status().journal_records);
    for i in 0..stripe_blocks - 1 {
        engine.write(chunk(i + 1, 0), 0, &block(i), None).expect("write");
    }
    assert_eq!(bytes_written(&array), before, "a stripe that is not full is not written yet");
    for i in 0..stripe_blocks - 1 {
        let got = engine.read(chunk(i + 1, 0), 0, 4096).expect("read from memory");
        assert!(got == block(i), "block {i} reads back before it reaches the array");
    }
    // The last block fills the stripe: one full-stripe write, nothing journaled.
    let last = stripe_blocks - 1;
    engine.write(chunk(last + 1, 0), 0, &block(last), None).expect("write");
    let full = bytes_written(&array) - before;
    assert!(full >= stripe_blocks * 4096, "the full stripe is written ({full} bytes)");
    assert_eq!(array.status().journal_records, journaled, "a full stripe needs no journal");
    // One more block opens a new stripe; a sync writes it while nearly empty, as an ordinary
    // partial-stripe update (journaled), not a whole stripe of zeros (with the default 256 KiB
    // unit that is far fewer bytes; this test's 16 KiB unit only shows the path taken).
    engine.write(chunk(100, 0), 0, &block(99), None).expect("write");
    engine.sync().expect("sync");
    assert!(array.status().journal_records > journaled, "the nearly empty stripe is journaled");
    // Everything is on the array with its parity: one drive lost, all of it reads back.
    array.fail_drive(2).expect("fail a drive");
    for i in 0..stripe_blocks {
        assert!(engine.read(chunk(i + 1, 0), 0, 4096).expect("read") == block(i), "block {i}");
    }
    assert_eq!(engine.read(chunk(100, 0), 0, 4096).expect("read"), block(99));
}

#[test]
fn a_filled_stripe_is_written_by_its_writer_later_or_else_by_the_next_writer_or_sync() {
    let (_drives, array) = raid5(16);
    let dir = temp_dir("packed-deferred");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    let stripe_blocks = array.geometry().stripe_data_bytes() / 4096;
    let block = |i: u64| vec![(i % 251) as u8 + 1; 4096];
    let write =
        |i: u64| engine.write_deferring(chunk(i + 1, 0), 0, &block(i), None).expect("write");
    let before = bytes_written(&array);
    for i in 0..stripe_blocks - 1 {
        assert_eq!(write(i).1, None, "block {i} did not fill the stripe");
    }
    let retired = write(stripe_blocks - 1).1.expect("the last block fills the stripe");
    assert_eq!(bytes_written(&array), before, "the filled stripe waits for its writer");
    for i in 0..stripe_blocks {
        assert!(engine.read(chunk(i + 1, 0), 0, 4096).expect("read") == block(i), "block {i}");
    }
    engine.write_retired(retired).expect("write out");
    let written = bytes_written(&array);
    assert!(written - before >= stripe_blocks * 4096, "the stripe is written");
    engine.write_retired(retired).expect("a second write-out does nothing");
    assert_eq!(bytes_written(&array), written);

    // Filled stripes nobody writes out: writers short of room write them; no one waits forever.
    // More than the eight the packer lets wait.
    let stripes = 12;
    let mut dropped = 0;
    for i in stripe_blocks..stripe_blocks * (1 + stripes) {
        dropped += usize::from(write(i).1.is_some());
    }
    assert_eq!(dropped, stripes as usize, "one stripe retired per stripe filled");
    assert!(bytes_written(&array) > written, "stripes left alone were written by later writers");
    engine.sync().expect("the sync writes whatever is left");
    // All of it on the array with its parity: one drive lost, every block reads back.
    array.fail_drive(1).expect("fail a drive");
    for i in 0..stripe_blocks * (1 + stripes) {
        assert!(engine.read(chunk(i + 1, 0), 0, 4096).expect("read") == block(i), "block {i}");
    }
}

/// A RAID 5 of four in-memory drives whose faults a test injects.
fn faulty_raid5() -> (Vec<Arc<FaultDevice>>, Arc<Array>) {
    let faulty: Vec<Arc<FaultDevice>> = (0..4)
        .map(|i| {
            let mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(format!("d{i}"), 16 << 20));
            Arc::new(FaultDevice::new(mem))
        })
        .collect();
    let devs: Vec<Arc<dyn BlockDevice>> =
        faulty.iter().map(|d| d.clone() as Arc<dyn BlockDevice>).collect();
    let config = ArrayConfig {
        level: Level::Raid5,
        stripe_unit_bytes: 16 * 1024,
        rated_tbw: 0,
        journal_bytes: None,
    };
    let array = Arc::new(
        Array::create(
            devs,
            &config,
            &CreateOptions { skip_discard: true, ..CreateOptions::default() },
        )
        .expect("array"),
    );
    (faulty, array)
}

#[test]
fn a_stripe_that_cannot_be_written_fails_the_sync_and_later_writes() {
    let (faulty, array) = faulty_raid5();
    let dir = temp_dir("packed-failed");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    engine.write(chunk(1, 0), 0, &[5u8; 4096], None).expect("write into memory");
    // Two drives of a RAID 5 die before the stripe reaches the array.
    faulty[0].fail();
    faulty[1].fail();
    let err = engine.sync().expect_err("the stripe cannot be written");
    assert!(matches!(err.status(), FsStatus::Io | FsStatus::ReadOnly), "{err}");
    let err = engine.write(chunk(2, 0), 0, &[6u8; 4096], None).expect_err("target refuses");
    assert!(matches!(err.status(), FsStatus::Io | FsStatus::ReadOnly), "{err}");
    std::mem::forget(engine); // dropping would try to sync the dead array again
}

#[test]
fn a_filled_stripe_written_out_later_reports_its_failure_then_and_at_the_sync() {
    let (faulty, array) = faulty_raid5();
    let dir = temp_dir("packed-deferred-failed");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    let stripe_blocks = array.geometry().stripe_data_bytes() / 4096;
    let mut retired = None;
    for i in 0..stripe_blocks {
        let (_, r) = engine.write_deferring(chunk(i + 1, 0), 0, &[7u8; 4096], None).expect("write");
        retired = retired.or(r);
    }
    let retired = retired.expect("the stripe filled");
    faulty[0].fail();
    faulty[1].fail();
    let err = engine.write_retired(retired).expect_err("the stripe cannot be written");
    assert!(matches!(err.status(), FsStatus::Io | FsStatus::ReadOnly), "{err}");
    let err = engine.sync().expect_err("the sync reports it too");
    assert!(matches!(err.status(), FsStatus::Io | FsStatus::ReadOnly), "{err}");
    std::mem::forget(engine); // dropping would try to sync the dead array again
}

#[test]
fn only_writes_that_gain_are_packed_and_only_small_ones_are_cached() {
    // RAID 0 of 8 drives with a 64 KiB unit: a 512 KiB stripe. Without parity, packing only
    // batches, so a 128 KiB write (a quarter of the stripe) goes to the array on its own.
    let drives = Drives::new(8, 16 << 20);
    let array = drives.create(stria_raid::Level::Raid0, 64 * 1024);
    let dir = temp_dir("packed-plain-wide");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    assert!(engine.write_is_buffered(0, 64 * 1024), "a 64 KiB write is batched");
    assert!(!engine.write_is_buffered(0, 128 * 1024), "a 128 KiB write is not");
    let before = bytes_written(&array);
    let large = vec![7u8; 128 * 1024];
    engine.write(chunk(1, 0), 0, &large, None).expect("write");
    assert!(bytes_written(&array) - before >= large.len() as u64, "written at once");
    assert_eq!(engine.read(chunk(1, 0), 0, 1 << 20).expect("read"), large);

    // RAID 5 of 12 drives with a 16 KiB unit: a 176 KiB stripe (44 blocks). An 80 KiB write
    // is packed (it would be a journaled partial-stripe update on its own), but when the
    // stripe is written only the small write's blocks go into the read cache.
    let drives = Drives::new(12, 16 << 20);
    let array = drives.create(stria_raid::Level::Raid5, 16 * 1024);
    let dir = temp_dir("packed-parity-wide");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    engine.set_read_cache_bytes(16 << 20);
    assert!(engine.write_is_buffered(0, 80 * 1024));
    let (journaled, before) = (array.status().journal_records, bytes_written(&array));
    let large = vec![9u8; 80 * 1024];
    let small = vec![3u8; 8 * 1024];
    engine.write(chunk(2, 0), 0, &large, None).expect("write");
    engine.write(chunk(3, 0), 0, &small, None).expect("write");
    assert_eq!(bytes_written(&array), before, "both wait in the open stripe");
    engine.sync().expect("sync");
    assert_eq!(array.status().journal_records, journaled, "one full-stripe write");
    assert_eq!(
        engine.read_cache_stats().held_bytes,
        small.len() as u64,
        "only the small write's blocks are cached"
    );
    // Written stripes' images are reused: fill several stripes with both sizes, out of order,
    // and everything reads back, also with a drive lost.
    let mut model: Vec<Vec<u8>> = vec![Vec::new(); 8];
    let mut rng = Rng::new(4242);
    for _ in 0..200 {
        let object = rng.below(8);
        let blocks = if rng.below(2) == 0 { 1 + rng.below(3) } else { 17 + rng.below(5) };
        let offset = rng.below(8) as usize * 4096;
        let data = rng.bytes(blocks as usize * 4096);
        engine.write(chunk(10 + object, 0), offset as u32, &data, None).expect("write");
        model_write(&mut model[object as usize], offset, &data);
    }
    engine.sync().expect("sync");
    array.fail_drive(5).expect("fail a drive");
    for (object, want) in model.iter().enumerate() {
        let got = engine.read(chunk(10 + object as u64, 0), 0, 1 << 20).expect("read");
        assert!(got == *want, "object {object} reads back");
    }
    assert_eq!(engine.read(chunk(2, 0), 0, 1 << 20).expect("read"), large);
}

#[test]
fn a_write_longer_than_the_room_left_fills_the_stripe_and_goes_on_in_the_next() {
    // RAID 5 of 12 drives, 16 KiB unit: 44 data blocks a stripe. Writes of 20 blocks fill
    // 22 x 20 / 44 = 10 stripes exactly when each one's room is used; left unused, every
    // stripe would hold two writes and the 22 would take 11.
    let drives = Drives::new(12, 16 << 20);
    let array = drives.create(stria_raid::Level::Raid5, 16 * 1024);
    let dir = temp_dir("packed-split");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    let stripe_bytes = 12 * 16 * 1024; // data and parity
    let before = bytes_written(&array);
    let mut rng = Rng::new(31);
    let writes: Vec<Vec<u8>> = (0..22).map(|_| rng.bytes(20 * 4096)).collect();
    for (i, data) in writes.iter().enumerate() {
        engine.write(chunk(i as u64 + 1, 0), 0, data, None).expect("write");
    }
    engine.sync().expect("sync");
    let written = bytes_written(&array) - before;
    assert!(
        (10 * stripe_bytes..10 * stripe_bytes + stripe_bytes / 2).contains(&written),
        "ten stripes written, not eleven: {written} bytes"
    );
    array.fail_drive(3).expect("fail a drive");
    for (i, data) in writes.iter().enumerate() {
        let got = engine.read(chunk(i as u64 + 1, 0), 0, 1 << 20).expect("read");
        assert!(got == *data, "write {i} reads back");
    }
    let space = engine.space();
    assert_eq!(space.used_bytes + space.free_bytes + space.reclaimable_bytes, space.total_bytes);
}
