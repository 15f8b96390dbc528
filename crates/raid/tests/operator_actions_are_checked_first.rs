//! Operator requests that would lose data are refused before anything is recorded, and `check`
//! writes nothing on any level, whatever it finds.

mod common;

use std::sync::Arc;

use common::*;
use stria_io::BlockDevice;
use stria_io::fault::FaultDevice;
use stria_io::mem::MemDevice;
use stria_raid::{ArrayState, Level};

#[test]
fn failing_a_drive_beyond_tolerance_is_refused_and_changes_nothing() {
    for (level, drives, tolerated) in
        [(Level::Raid5, 4, 1), (Level::Raid6, 5, 2), (Level::Raid1, 3, 2), (Level::Raid0, 2, 0)]
    {
        let devices: Vec<_> =
            (0..drives).map(|i| LoggingDevice::new(&format!("d{i}"), 24 << 20)).collect();
        let array = create(&devices, level, 16 * 1024);
        for slot in 0..tolerated {
            array.fail_drive(slot).unwrap();
        }
        let events = array.status().events;
        let err = array.fail_drive(tolerated).expect_err("one more loss than tolerated");
        assert!(err.to_string().contains("refused"), "{level}: {err}");
        let status = array.status();
        assert_eq!(status.members[tolerated].state, "active", "{level}");
        assert_eq!(status.events, events, "{level}: the refused request was recorded");
        assert_ne!(status.state, ArrayState::Failed, "{level}");
        array.write(0, &pattern(65536, 1)).unwrap();
    }
}

#[test]
fn raid10_refuses_to_fail_the_second_drive_of_a_pair_only() {
    let devices: Vec<_> = (0..4).map(|i| LoggingDevice::new(&format!("d{i}"), 24 << 20)).collect();
    let array = create(&devices, Level::Raid10, 16 * 1024);
    array.fail_drive(0).unwrap();
    assert!(array.fail_drive(1).is_err(), "slot 1 holds the last copy of pair 0");
    array.fail_drive(2).unwrap();
    assert_eq!(array.status().state, ArrayState::Degraded);
}

#[test]
fn check_reports_but_never_writes_on_any_level() {
    for (level, drives) in
        [(Level::Raid1, 2), (Level::Raid10, 4), (Level::Raid5, 4), (Level::Raid6, 5)]
    {
        let faults: Vec<_> = (0..drives)
            .map(|i| {
                Arc::new(FaultDevice::new(Arc::new(MemDevice::new(format!("d{i}"), 24 << 20))))
            })
            .collect();
        let array = create(&faults, level, 16 * 1024);
        array.write(0, &pattern(1 << 20, 9)).unwrap();
        array.flush().unwrap();
        let layout = array.layout();
        faults[1].flip_bit((layout.data_offset + 4096 + 17) * 8).unwrap();
        let written: Vec<u64> = faults.iter().map(|f| f.stats().snapshot().write_bytes).collect();
        let report = check(&array);
        assert_eq!(report.checksum_errors, 1, "{level}: {report:?}");
        assert_eq!(report.repaired_blocks, 0, "{level}: check repaired: {report:?}");
        let after: Vec<u64> = faults.iter().map(|f| f.stats().snapshot().write_bytes).collect();
        assert_eq!(written, after, "{level}: check wrote to the drives");
        // It is still there for the next check to find, and scrub repairs it.
        assert_eq!(check(&array).checksum_errors, 1, "{level}");
        let stop = std::sync::atomic::AtomicBool::new(false);
        let scrub = array.scrub(true, None, &stop, &mut |_, _| {}).unwrap();
        assert_eq!((scrub.checksum_errors, scrub.repaired_blocks), (1, 1), "{level}: {scrub:?}");
        assert!(check(&array).clean(), "{level}");
    }
}
