//! `write_in_open_stripe`: after a full-stripe write of a stripe's image, later writes of a few
//! blocks each compute parity from the image, read nothing and journal nothing, and leave a
//! stripe whose parity agrees with its data, so any tolerated drive loss reads back the image,
//! whether the drive is lost after the writes or before some of them.

mod common;

use std::sync::Arc;

use common::*;
use stria_io::mem::MemDevice;
use stria_raid::{Array, Level};

const UNIT: u32 = 16 * 1024;
const BLOCK: usize = 4096;

/// Batches of `(first block, blocks)` filling a stripe of `blocks` in order, some crossing a
/// stripe-unit boundary (4 blocks per unit here).
fn batches(blocks: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let (mut at, mut step) = (0, 1);
    while at < blocks {
        let n = step.min(blocks - at);
        out.push((at, n));
        at += n;
        step = step % 3 + 1;
    }
    out
}

/// Fills stripe 2 through an open-stripe sequence over stale data; `fail_at` fails `lost`
/// after that many batches. Returns the array and the stripe's final image.
fn fill(level: Level, n: usize, lost: &[usize], fail_at: usize) -> (Array, Vec<u8>) {
    let drives: Vec<_> =
        (0..n).map(|i| Arc::new(MemDevice::new(format!("d{i}"), 8 << 20))).collect();
    let array = create(&drives, level, UNIT);
    let stripe_bytes = array.geometry().stripe_data_bytes() as usize;
    // Stale contents everywhere, as a reused stripe would hold.
    array.write(0, &pattern(4 * stripe_bytes, 9)).unwrap();
    let stripe = 2u64;
    let base = stripe * stripe_bytes as u64;
    let fresh = pattern(stripe_bytes, 4);
    let mut image = vec![0u8; stripe_bytes];
    let journaled = array.status().journal_records;
    for (i, (from, blocks)) in batches((stripe_bytes / BLOCK) as u64).into_iter().enumerate() {
        if i == fail_at {
            for &slot in lost {
                array.fail_drive(slot).unwrap();
            }
        }
        let (lo, hi) = (from as usize * BLOCK, (from + blocks) as usize * BLOCK);
        image[lo..hi].copy_from_slice(&fresh[lo..hi]);
        if i == 0 {
            array.write(base, &image).unwrap();
        } else {
            array.write_in_open_stripe(stripe, &image, from, from + blocks).unwrap();
        }
    }
    assert_eq!(array.status().journal_records, journaled, "{level}: nothing is journaled");
    if fail_at == usize::MAX {
        assert!(check(&array).clean(), "{level}: parity agrees with the data");
        for &slot in lost {
            array.fail_drive(slot).unwrap();
        }
    }
    let mut back = vec![0u8; stripe_bytes];
    array.read(base, &mut back).unwrap();
    assert!(back == image, "{level} lost {lost:?} (after batch {fail_at}): stripe reads back");
    (array, image)
}

#[test]
fn every_tolerated_loss_after_the_writes_reads_the_image_back() {
    for (level, n, losses) in [
        (Level::Raid5, 4, vec![vec![0], vec![1], vec![2], vec![3]]),
        (Level::Raid6, 5, vec![vec![0], vec![2], vec![4], vec![0, 1], vec![1, 3], vec![3, 4]]),
    ] {
        for lost in losses {
            fill(level, n, &lost, usize::MAX);
        }
    }
}

#[test]
fn writes_to_a_degraded_stripe_keep_it_readable() {
    for (level, n, lost) in
        [(Level::Raid5, 4, vec![1]), (Level::Raid6, 5, vec![2]), (Level::Raid6, 5, vec![0, 3])]
    {
        for fail_at in [1, 3] {
            fill(level, n, &lost, fail_at);
        }
    }
}

#[test]
fn other_levels_take_a_plain_write_and_bad_ranges_are_refused() {
    let drives: Vec<_> =
        (0..4).map(|i| Arc::new(MemDevice::new(format!("d{i}"), 8 << 20))).collect();
    let array = create(&drives, Level::Raid10, UNIT);
    let stripe_bytes = array.geometry().stripe_data_bytes() as usize;
    let image = pattern(stripe_bytes, 3);
    array.write_in_open_stripe(1, &image, 1, 3).unwrap();
    let mut back = vec![0u8; 2 * BLOCK];
    array.read(stripe_bytes as u64 + BLOCK as u64, &mut back).unwrap();
    assert!(back == image[BLOCK..3 * BLOCK]);
    let blocks = (stripe_bytes / BLOCK) as u64;
    assert!(array.write_in_open_stripe(1, &image[..BLOCK], 0, 1).is_err(), "short image");
    assert!(array.write_in_open_stripe(1, &image, 0, blocks + 1).is_err(), "past the stripe");
}
