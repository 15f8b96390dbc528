//! After a crash, replaying the journal must leave each stripe with its newest contents: a
//! partial-stripe record must not roll back a later full-stripe write (which is not journaled),
//! and the replayed data must be durable before the labels start a new journal epoch.

mod common;

use common::*;
use stria_io::BlockDevice;
use stria_raid::{Array, Level};

const UNIT: u32 = 16 * 1024;

#[test]
fn partial_record_is_not_replayed_over_a_later_full_stripe_write() {
    for level in [Level::Raid5, Level::Raid6] {
        let drives: Vec<_> =
            (0..5).map(|i| LoggingDevice::new(&format!("d{i}"), 24 << 20)).collect();
        let array = create(&drives, level, UNIT);
        let stripe_bytes = array.geometry().stripe_data_bytes() as usize;
        array.flush().unwrap();
        // A partial-stripe write (journaled), then a full-stripe write over the same stripe.
        array.write(0, &pattern(8192, 1)).unwrap();
        let full = pattern(stripe_bytes, 2);
        array.write(0, &full).unwrap();
        crash(array);
        let array = Array::assemble(devs(&drives)).unwrap();
        let mut back = vec![0u8; stripe_bytes];
        array.read(0, &mut back).unwrap();
        assert!(back == full, "{level}: the full-stripe write was rolled back by journal replay");
        assert!(check(&array).clean(), "{level}: parity inconsistent after recovery");
        // The same with a drive gone: the missing drive's chunk must reconstruct to the newest
        // data too.
        array.fail_drive(1).unwrap();
        array.read(0, &mut back).unwrap();
        assert!(back == full, "{level}: degraded read after recovery returned old data");
    }
}

#[test]
fn a_partial_write_after_the_full_stripe_write_is_still_replayed() {
    let drives: Vec<_> = (0..4).map(|i| LoggingDevice::new(&format!("d{i}"), 24 << 20)).collect();
    let array = create(&drives, Level::Raid5, UNIT);
    let stripe_bytes = array.geometry().stripe_data_bytes() as usize;
    array.write(0, &pattern(4096, 1)).unwrap();
    let mut expected = pattern(stripe_bytes, 2);
    array.write(0, &expected).unwrap();
    let late = pattern(8192, 3);
    array.write(4096, &late).unwrap();
    expected[4096..4096 + 8192].copy_from_slice(&late);
    crash(array);
    let array = Array::assemble(devs(&drives)).unwrap();
    let mut back = vec![0u8; stripe_bytes];
    array.read(0, &mut back).unwrap();
    assert!(back == expected);
    assert!(check(&array).clean());
}

#[test]
fn replayed_rows_are_flushed_before_the_new_epoch_is_labelled() {
    let drives: Vec<_> = (0..4).map(|i| LoggingDevice::new(&format!("d{i}"), 24 << 20)).collect();
    let array = create(&drives, Level::Raid5, UNIT);
    array.flush().unwrap();
    let old_epoch = drives[0].label().journal_epoch;
    array.write(4096, &pattern(4096, 7)).unwrap();
    crash(array);
    for d in &drives {
        d.take_log();
    }
    let array = Array::assemble(devs(&drives)).unwrap();
    let data_offset = array.layout().data_offset;
    let mut replayed_somewhere = false;
    for d in &drives {
        let log = d.take_log();
        // The first label that names another epoch, and the replay writes before it.
        let label_at = log.iter().position(|op| match op {
            Logged::Write { offset: 0, data } => {
                stria_raid::superblock::Superblock::decode(data).unwrap().journal_epoch != old_epoch
            }
            _ => false,
        });
        let Some(label_at) = label_at else { continue };
        let last_data_write = log[..label_at]
            .iter()
            .rposition(|op| matches!(op, Logged::Write { offset, .. } if *offset >= data_offset));
        if let Some(w) = last_data_write {
            replayed_somewhere = true;
            assert!(
                log[w..label_at].iter().any(|op| matches!(op, Logged::Flush)),
                "{}: the new epoch was labelled before the replayed rows were flushed",
                d.name()
            );
        }
    }
    assert!(replayed_somewhere, "the journal record was not replayed");
    drop(array);
}
