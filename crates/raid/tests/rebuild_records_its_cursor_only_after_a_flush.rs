//! A rebuild's cursor in the labels says "stripes below this are on the new drive": it may only
//! be written once those stripes and their checksums are flushed there.

mod common;

use common::*;
use stria_raid::{Array, Level};

#[test]
fn every_cursor_label_follows_a_flush_of_the_rebuilt_stripes() {
    let drives: Vec<_> = (0..4).map(|i| LoggingDevice::new(&format!("d{i}"), 48 << 20)).collect();
    let array = create(&drives, Level::Raid5, 16 * 1024);
    array.write(0, &pattern(8 << 20, 5)).unwrap();
    array.fail_drive(2).unwrap();
    let fresh = LoggingDevice::new("fresh", 48 << 20);
    // Slow enough that the cursor is recorded several times (about once a second), then stop
    // mid-way, which records it once more.
    array.set_rebuild_rate(12 << 20);
    array.replace(2, fresh.clone()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2300));
    array.close().unwrap();
    let data_offset = fresh.label().layout.data_offset;
    let crc_offset = fresh.label().layout.crc_offset;
    let log = fresh.take_log();
    let mut cursor_labels = 0;
    let mut last_cursor = 0;
    for (i, op) in log.iter().enumerate() {
        let Logged::Write { offset: 0, data } = op else { continue };
        let sb = stria_raid::superblock::Superblock::decode(data).unwrap();
        let cursor = sb.slots[2].rebuild_cursor;
        if cursor <= last_cursor {
            continue;
        }
        last_cursor = cursor;
        cursor_labels += 1;
        let last_flush = log[..i].iter().rposition(|op| matches!(op, Logged::Flush));
        let last_payload = log[..i].iter().rposition(|op| {
            matches!(op, Logged::Write { offset, .. } if *offset >= crc_offset && *offset != 0)
        });
        assert!(
            matches!((last_flush, last_payload), (Some(f), Some(w)) if f > w),
            "label {i} records cursor {cursor} without a flush after the rebuilt data"
        );
        // The checksum table must have been written since the previous label as well.
        assert!(
            log[..i].iter().any(|op| matches!(op, Logged::Write { offset, .. }
                if *offset >= crc_offset && *offset < data_offset)),
            "cursor {cursor} recorded before any checksum page reached the new drive"
        );
    }
    assert!(cursor_labels >= 2, "the cursor was recorded only {cursor_labels} times");
    // The recorded cursor is honest: resume, finish, and check.
    let array = Array::assemble(devs(&[&drives[..2], &[fresh], &drives[3..]].concat())).unwrap();
    array.wait_rebuild().unwrap();
    assert!(check(&array).clean());
    let mut back = vec![0u8; 8 << 20];
    array.read(0, &mut back).unwrap();
    assert!(back == pattern(8 << 20, 5));
}
