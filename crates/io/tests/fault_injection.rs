//! The fault-injecting device does exactly the damage it is told to, and nothing else: the RAID
//! tests built on it are only as trustworthy as these faults are precise.

// Tests unwrap freely: a panic is the failure report.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pattern;
use stria_io::fault::FaultDevice;
use stria_io::mem::MemDevice;
use stria_io::{BlockDevice, IoError, IoOp, OpKind};

const CAPACITY_BYTES: u64 = 1 << 20;

fn fault_over_memory() -> (Arc<MemDevice>, FaultDevice) {
    let mem = Arc::new(MemDevice::new("mem0", CAPACITY_BYTES));
    let fault = FaultDevice::new(mem.clone());
    (mem, fault)
}

fn every_kind_of_request(dev: &dyn BlockDevice) -> Vec<Result<(), IoError>> {
    vec![
        dev.read_at(0, 4096).map(drop),
        dev.write_at(4096, pattern(1, 4096)),
        dev.flush(),
        dev.submit(IoOp::Discard { offset: 8192, len: 4096 }).wait().map(drop),
    ]
}

#[test]
fn a_failed_device_fails_every_request_until_healed() {
    let (mem, dev) = fault_over_memory();
    dev.write_at(0, pattern(7, 4096)).unwrap();
    dev.fail();
    assert!(dev.is_failed());
    for outcome in every_kind_of_request(&dev) {
        assert!(matches!(outcome, Err(IoError::DeviceFailed { .. })), "{outcome:?}");
    }
    assert_eq!(mem.contents()[4096..8192], [0; 4096], "a failed write must not reach the medium");
    assert_eq!(dev.stats().snapshot().errors, 4);
    assert_eq!(mem.stats().snapshot().errors, 0, "injected failures never reach the inner device");

    dev.heal();
    for outcome in every_kind_of_request(&dev) {
        outcome.unwrap();
    }
    assert!(dev.read_at(0, 4096).unwrap() == pattern(7, 4096));
}

#[test]
fn range_faults_hit_only_overlapping_requests_of_the_chosen_kinds() {
    let (_mem, dev) = fault_over_memory();
    dev.write_at(65536, pattern(3, 4096)).unwrap();
    dev.fail_range(65536 + 100, 1, &[OpKind::Read, OpKind::Discard]);

    match dev.read_at(65536, 4096) {
        Err(IoError::Injected { offset, .. }) => assert_eq!(offset, 65536 + 100),
        other => panic!("overlapping read: {other:?}"),
    }
    match dev.read_at(0, 128 * 1024) {
        Err(IoError::Injected { offset, .. }) => assert_eq!(offset, 65536 + 100),
        other => panic!("read spanning the range: {other:?}"),
    }
    assert!(matches!(
        dev.submit(IoOp::Discard { offset: 65536, len: 4096 }).wait(),
        Err(IoError::Injected { .. })
    ));
    // Neighbours on both sides, writes to the range itself, and flushes are untouched.
    dev.read_at(61440, 4096).unwrap();
    dev.read_at(69632, 4096).unwrap();
    dev.write_at(65536, pattern(4, 4096)).unwrap();
    dev.flush().unwrap();

    dev.clear_ranges();
    assert!(dev.read_at(65536, 4096).unwrap() == pattern(4, 4096));
}

#[test]
fn flip_bit_changes_exactly_one_stored_bit() {
    let (mem, dev) = fault_over_memory();
    let original = pattern(11, 3 * 4096);
    dev.write_at(4096, original.clone()).unwrap();
    let before = dev.stats().snapshot();

    let bit = (4096 + 5000) * 8 + 3;
    dev.flip_bit(bit).unwrap();

    let back = dev.read_at(4096, 3 * 4096).unwrap();
    let differing: Vec<(usize, u8)> = back
        .iter()
        .zip(original.iter())
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| (i, a ^ b))
        .collect();
    assert_eq!(differing, vec![(5000, 1 << 3)]);
    assert_eq!(mem.contents()[4096 + 5000] ^ original[5000], 1 << 3, "the medium itself changed");
    // Bit rot is not I/O that the device's users did.
    let after = dev.stats().snapshot();
    assert_eq!((after.write_ops, after.read_ops), (before.write_ops, before.read_ops + 1));

    dev.flip_bit(bit).unwrap();
    assert!(dev.read_at(4096, 3 * 4096).unwrap() == original, "flipping twice restores");
    assert!(matches!(dev.flip_bit(CAPACITY_BYTES * 8), Err(IoError::OutOfRange { .. })));
}

#[test]
fn a_drive_dies_after_the_allowed_number_of_writes() {
    let (mem, dev) = fault_over_memory();
    dev.fail_after_writes(3);
    // Reads and flushes do not use up the allowance.
    dev.read_at(0, 4096).unwrap();
    dev.flush().unwrap();
    for i in 0..3u64 {
        dev.write_at(i * 4096, pattern(i, 4096)).unwrap();
    }
    assert!(matches!(dev.write_at(3 * 4096, pattern(3, 4096)), Err(IoError::DeviceFailed { .. })));
    assert!(dev.is_failed());
    assert!(matches!(dev.read_at(0, 4096), Err(IoError::DeviceFailed { .. })));
    assert_eq!(mem.contents()[3 * 4096..4 * 4096], [0; 4096]);
    assert!(mem.contents()[2 * 4096..3 * 4096] == pattern(2, 4096)[..]);

    dev.heal();
    dev.write_at(3 * 4096, pattern(3, 4096)).unwrap();
    dev.write_at(4 * 4096, pattern(4, 4096)).unwrap();
}

#[test]
fn injected_latency_is_added_to_every_request() {
    let (_mem, dev) = fault_over_memory();
    let latency = Duration::from_millis(20);
    dev.set_latency(latency);
    let started = Instant::now();
    dev.read_at(0, 4096).unwrap();
    assert!(started.elapsed() >= latency);
    let started = Instant::now();
    dev.write_at(0, pattern(1, 4096)).unwrap();
    assert!(started.elapsed() >= latency);
    // The counters see the slow drive too: nothing faster than 16 ms (bucket 15 and up).
    let snapshot = dev.stats().snapshot();
    assert_eq!(snapshot.read_latency[..15].iter().sum::<u64>(), 0);
    assert_eq!(snapshot.read_latency.iter().sum::<u64>(), 1);

    dev.set_latency(Duration::ZERO);
    let started = Instant::now();
    dev.read_at(0, 4096).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn corrupted_reads_lie_but_leave_the_medium_alone() {
    let (mem, dev) = fault_over_memory();
    let original = pattern(5, 4 * 4096);
    dev.write_at(0, original.clone()).unwrap();
    dev.corrupt_reads(4096 + 10, 4096);

    let back = dev.read_at(0, 4 * 4096).unwrap();
    let flipped: Vec<usize> = (0..back.len()).filter(|&i| back[i] != original[i]).collect();
    // The range touches blocks 1 and 2; each gets one bit flipped at its first byte in range.
    assert_eq!(flipped, vec![4096 + 10, 2 * 4096]);
    assert!(mem.contents()[..4 * 4096] == original[..]);
    assert!(dev.inner().read_at(0, 4 * 4096).unwrap() == original);
    assert_eq!(dev.stats().snapshot().errors, 0, "silent corruption is not an error");

    dev.clear_ranges();
    assert!(dev.read_at(0, 4 * 4096).unwrap() == original);
}

#[test]
fn misuse_is_reported_as_misuse_even_on_a_failed_device() {
    let (_mem, dev) = fault_over_memory();
    dev.fail();
    assert!(matches!(dev.read_at(100, 4096), Err(IoError::Misaligned { .. })));
}

#[test]
fn faults_can_be_set_while_other_threads_do_io() {
    let (_mem, dev) = fault_over_memory();
    let dev = Arc::new(dev);
    std::thread::scope(|scope| {
        for thread in 0..4u64 {
            let dev = dev.clone();
            scope.spawn(move || {
                for i in 0..200u64 {
                    let offset = (thread * 64 + i % 64) * 4096;
                    // Each request either succeeds or fails with an injected error; nothing else.
                    match dev.write_at(offset, pattern(i, 4096)) {
                        Ok(()) | Err(IoError::DeviceFailed { .. } | IoError::Injected { .. }) => {}
                        Err(e) => panic!("unexpected error {e}"),
                    }
                }
            });
        }
        for _ in 0..50 {
            dev.fail();
            dev.fail_range(0, 1 << 19, &[OpKind::Write]);
            dev.heal();
            dev.clear_ranges();
        }
    });
    dev.write_at(0, pattern(1, 4096)).unwrap();
    let stats = dev.stats().snapshot();
    assert_eq!(stats.write_ops + stats.errors, 4 * 200 + 1);
}
