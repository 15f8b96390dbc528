//! POSIX behaviour through the real FUSE mount of `stria up`: the table of system calls in
//! `support/posix_table.rs` (validated against ext4), as root and as an unprivileged user, and
//! readdir of a 100,000-entry directory.

mod support;

use support::node::{Node, require_fuse, scratch};
use support::posix_table;

#[test]
fn posix_table_through_the_mount() {
    require_fuse();
    let dir = scratch("posix");
    let mut node = Node::start(&dir, &["--drives", "4", "--raid", "5", "--drive-size", "256M"]);
    // The mount's root is world-writable and sticky (as /tmp), so the unprivileged user can
    // create its fixtures there.
    let report = posix_table::run_all(&node.mount);
    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        report.cases.len(),
        failures.join("\n")
    );
    assert!(report.cases.len() >= 50, "the table ran only {} cases", report.cases.len());

    let report = posix_table::run_unprivileged(&node.mount, 65_534, 65_534, 4242);
    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "unprivileged: {} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        report.cases.len() >= 10,
        "the unprivileged table ran only {} cases",
        report.cases.len()
    );

    posix_table::readdir_large(&node.mount, 100_000).expect("readdir of 100,000 entries");
    node.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
