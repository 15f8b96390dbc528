//! A label whose checksum is right but whose layout cannot describe a real drive (found by the
//! `drive_superblock` fuzz target) is refused when it is decoded, so assembly reports the
//! drive as unlabelled instead of panicking on the sums and buffers it sizes from the layout.

mod common;

use std::sync::Arc;

use common::*;
use stria_io::mem::MemDevice;
use stria_io::{AlignedBuf, BlockDevice};
use stria_raid::superblock::{Layout, Superblock, SuperblockError};
use stria_raid::{Array, Level};

/// Creates a RAID 5 array, closes it, and rewrites every label with `forge` applied to its
/// layout (with a correct checksum, as a forged or mis-written label would have).
fn forged_drives(forge: impl Fn(&mut Layout)) -> Vec<Arc<MemDevice>> {
    let drives: Vec<Arc<MemDevice>> =
        (0..3).map(|i| Arc::new(MemDevice::new(format!("d{i}"), 24 << 20))).collect();
    create(&drives, Level::Raid5, 16 * 1024).close().expect("close");
    for d in &drives {
        let mut sb = Superblock::decode(&d.read_at(0, 4096).expect("read")).expect("label");
        forge(&mut sb.layout);
        d.write_at(0, AlignedBuf::from_slice(&sb.encode())).expect("write label");
    }
    drives
}

fn refused(forge: impl Fn(&mut Layout)) {
    let drives = forged_drives(&forge);
    let raw = drives[0].read_at(0, 4096).expect("read");
    assert_eq!(Superblock::decode(&raw), Err(SuperblockError::Field("layout")));
    match Array::assemble(devs(&drives)) {
        Ok(_) => panic!("assembled from labels with an impossible layout"),
        Err(e) => assert!(e.to_string().contains("layout"), "{e}"),
    }
}

#[test]
fn a_bitmap_too_small_for_the_data_area_is_refused() {
    // One write-intent bit per 512 bytes would need more bits than the 4 KiB bitmap holds.
    refused(|l| l.bitmap_region_bytes = 512);
}

#[test]
fn a_data_area_past_the_end_of_the_address_space_is_refused() {
    refused(|l| l.data_offset = u64::MAX - 4096);
}

#[test]
fn an_oversized_bitmap_is_refused() {
    refused(|l| l.bitmap_bytes = 1 << 40);
}

#[test]
fn overlapping_regions_are_refused() {
    refused(|l| l.journal_offset = l.bitmap_offset);
}
