//! Degraded reads on parity levels rebuild the missing data from one read of each surviving
//! member per stripe, and still verify and repair every block they use.

mod common;

use std::sync::Arc;

use common::*;
use stria_io::BlockDevice;
use stria_io::fault::FaultDevice;
use stria_io::mem::MemDevice;
use stria_raid::Level;

const UNIT: u32 = 16 * 1024;

fn rig(level: Level, n: usize) -> (Vec<Arc<FaultDevice>>, stria_raid::Array, Vec<u8>) {
    let faults: Vec<_> = (0..n)
        .map(|i| Arc::new(FaultDevice::new(Arc::new(MemDevice::new(format!("d{i}"), 24 << 20)))))
        .collect();
    let array = create(&faults, level, UNIT);
    let data = pattern(4 << 20, 6);
    array.write(0, &data).unwrap();
    (faults, array, data)
}

#[test]
fn degraded_reads_return_the_data_at_every_alignment() {
    for (level, n, lost) in
        [(Level::Raid5, 4, &[2][..]), (Level::Raid6, 6, &[1][..]), (Level::Raid6, 6, &[0, 4][..])]
    {
        let (_faults, array, data) = rig(level, n);
        for &slot in lost {
            array.fail_drive(slot).unwrap();
        }
        for (offset, len) in [(0, 4 << 20), (4096, 8192), (12288, 3 * 65536 + 4096), (65536, 4096)]
        {
            let mut back = vec![0u8; len];
            array.read(offset as u64, &mut back).unwrap();
            assert!(back == data[offset..offset + len], "{level} lost {lost:?} at {offset}+{len}");
        }
    }
}

#[test]
fn each_surviving_member_is_read_once_per_stripe() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 6)] {
        let (faults, array, data) = rig(level, n);
        array.fail_drive(0).unwrap();
        let g = array.geometry();
        let before: Vec<u64> = faults.iter().map(|f| f.stats().snapshot().read_bytes).collect();
        let mut back = vec![0u8; data.len()];
        array.read(0, &mut back).unwrap();
        assert!(back == data);
        let read: u64 =
            faults.iter().zip(&before).map(|(f, b)| f.stats().snapshot().read_bytes - b).sum();
        let stripes = (data.len() as u64).div_ceil(g.stripe_data_bytes());
        // At most every survivor's chunk once per stripe (RAID 6 can leave Q unread).
        let survivors = (n - 1) as u64;
        assert!(
            read <= stripes * survivors * UNIT as u64,
            "{level}: read {read} bytes for {stripes} stripes"
        );
    }
}

#[test]
fn a_bad_block_met_by_a_degraded_read_is_rebuilt_and_repaired() {
    let (faults, array, data) = rig(Level::Raid6, 6);
    array.fail_drive(3).unwrap();
    let layout = array.layout();
    // Rot in a data block of a survivor, inside a stripe that also lost slot 3.
    faults[0].flip_bit((layout.data_offset + 5 * UNIT as u64 + 8192) * 8 + 1).unwrap();
    let mut back = vec![0u8; data.len()];
    array.read(0, &mut back).unwrap();
    assert!(back == data);
    let status = array.status();
    assert!(status.checksum_errors >= 1 && status.repaired_blocks >= 1, "{status:?}");
    assert!(check(&array).clean());
}
