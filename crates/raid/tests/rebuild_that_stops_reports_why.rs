//! A rebuild that stops on an error is reported as stopped, with its reason, and no longer as
//! progressing.

mod common;

use std::sync::Arc;

use common::*;
use stria_io::fault::FaultDevice;
use stria_io::mem::MemDevice;
use stria_raid::Level;

#[test]
fn a_dead_rebuild_shows_stopped_with_its_reason() {
    let faults: Vec<_> = (0..3)
        .map(|i| Arc::new(FaultDevice::new(Arc::new(MemDevice::new(format!("d{i}"), 24 << 20)))))
        .collect();
    let array = create(&faults, Level::Raid5, 16 * 1024);
    array.write(0, &pattern(4 << 20, 2)).unwrap();
    array.fail_drive(2).unwrap();
    // A bad block on a survivor: that stripe cannot be rebuilt with slot 2 gone.
    let layout = array.layout();
    faults[0].flip_bit((layout.data_offset + 20 * 16384) * 8 + 3).unwrap();
    let fresh = Arc::new(FaultDevice::new(Arc::new(MemDevice::new("fresh", 24 << 20))));
    array.replace(2, fresh).unwrap();
    let err = array.wait_rebuild().expect_err("the rebuild cannot finish");
    assert!(err.to_string().contains("cannot be recovered"), "{err}");
    let status = array.status();
    let rebuild = status.rebuild.expect("the slot is still rebuilding");
    assert!(!rebuild.running, "{rebuild:?}");
    assert_eq!(rebuild.rate_bytes_s, 0, "a stopped rebuild has no rate");
    assert!(
        rebuild.error.as_deref().is_some_and(|e| e.contains("cannot be recovered")),
        "{rebuild:?}"
    );
    assert!(array.rebuild_progress().is_none(), "a stopped rebuild must not report progress");
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(array.status().rebuild.expect("still listed").percent, rebuild.percent);
}
