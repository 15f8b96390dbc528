//! A new array describes an all-zero data area (checksums and parity). On drives whose discard
//! leaves the old bytes (block devices may), creation must zero the area itself.

mod common;

use common::*;
use stria_raid::Level;

#[test]
fn old_bytes_left_by_discard_are_zeroed_at_creation() {
    for level in [Level::Raid1, Level::Raid5, Level::Raid6] {
        let drives: Vec<_> = (0..4)
            .map(|i| LoggingDevice::with_stale_discard(&format!("d{i}"), 24 << 20, 0xa5))
            .collect();
        let array = create(&drives, level, 16 * 1024);
        let mut back = vec![1u8; array.capacity_bytes() as usize];
        array.read(0, &mut back).expect("a new array reads back");
        assert!(back.iter().all(|&b| b == 0), "{level}: a new array must read as zeros");
        assert!(check(&array).clean(), "{level}: a new array must check clean");
        // A partial-stripe write computes parity from the untouched rows: they must be zeros.
        array.write(4096, &pattern(4096, 1)).unwrap();
        array.fail_drive(0).unwrap();
        let mut first = vec![0u8; 65536];
        array.read(0, &mut first).unwrap();
        assert!(first[..4096].iter().all(|&b| b == 0), "{level}");
        assert!(first[4096..8192] == pattern(4096, 1)[..], "{level}");
    }
}
