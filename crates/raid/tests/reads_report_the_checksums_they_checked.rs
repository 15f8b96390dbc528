//! `Array::read_with_crcs` hands back the CRC32C of every block it returns, whichever way the
//! block came: the fast path, a degraded stripe's reconstruction, or the repair of a rotten
//! block. The chunk engine compares these with its own checksums instead of checksumming the
//! bytes again, so a wrong one would let bad data through or fail good data.

mod common;

use std::sync::Arc;

use common::*;
use stria_io::fault::FaultDevice;
use stria_io::mem::MemDevice;
use stria_raid::Level;

const UNIT: u32 = 16 * 1024;
const BLOCK: usize = 4096;

fn rig(level: Level, n: usize) -> (Vec<Arc<FaultDevice>>, stria_raid::Array, Vec<u8>) {
    let faults: Vec<_> = (0..n)
        .map(|i| Arc::new(FaultDevice::new(Arc::new(MemDevice::new(format!("d{i}"), 24 << 20)))))
        .collect();
    let array = create(&faults, level, UNIT);
    let data = pattern(2 << 20, 9);
    array.write(0, &data).unwrap();
    (faults, array, data)
}

/// Reads `len` bytes at `offset` with their CRCs, and checks both against `data`.
fn read_and_check(array: &stria_raid::Array, data: &[u8], offset: usize, len: usize, what: &str) {
    let mut back = vec![0u8; len];
    let mut crcs = vec![0u32; len / BLOCK];
    array.read_with_crcs(offset as u64, &mut back, &mut crcs).unwrap();
    assert!(back == data[offset..offset + len], "{what}: bytes at {offset}+{len}");
    let want: Vec<u32> = back.chunks_exact(BLOCK).map(crc32c::crc32c).collect();
    assert_eq!(crcs, want, "{what}: CRCs at {offset}+{len}");
}

const SPANS: [(usize, usize); 4] =
    [(0, 2 << 20), (4096, 8192), (12288, 3 * 65536 + 4096), (65536, 4096)];

#[test]
fn optimal_reads_report_the_crc_of_every_block() {
    for (level, n) in [
        (Level::Raid0, 3),
        (Level::Raid1, 2),
        (Level::Raid10, 4),
        (Level::Raid5, 4),
        (Level::Raid6, 6),
    ] {
        let (_faults, array, data) = rig(level, n);
        for (offset, len) in SPANS {
            read_and_check(&array, &data, offset, len, &format!("{level} optimal"));
        }
    }
}

#[test]
fn degraded_reads_report_the_crc_of_reconstructed_blocks() {
    for (level, n, lost) in [
        (Level::Raid1, 2, &[0][..]),
        (Level::Raid10, 4, &[1][..]),
        (Level::Raid5, 4, &[2][..]),
        (Level::Raid6, 6, &[0, 4][..]),
    ] {
        let (_faults, array, data) = rig(level, n);
        for &slot in lost {
            array.fail_drive(slot).unwrap();
        }
        for (offset, len) in SPANS {
            read_and_check(&array, &data, offset, len, &format!("{level} lost {lost:?}"));
        }
    }
}

#[test]
fn a_repaired_block_reports_the_crc_of_the_good_bytes() {
    for (level, n, rotten) in
        [(Level::Raid1, 2, &[0][..]), (Level::Raid5, 4, &[1][..]), (Level::Raid6, 6, &[0, 1][..])]
    {
        let (faults, array, data) = rig(level, n);
        let layout = array.layout();
        // Rot in a block of the first stripe on as many members as the level can repair: the
        // fast path finds the mismatch and the read rebuilds the block from redundancy.
        for &slot in rotten {
            faults[slot].flip_bit((layout.data_offset + 8192) * 8 + 3).unwrap();
        }
        read_and_check(&array, &data, 0, 2 << 20, &format!("{level} with rot"));
        let status = array.status();
        assert!(status.checksum_errors >= 1 && status.repaired_blocks >= 1, "{level}: {status:?}");
    }
}
