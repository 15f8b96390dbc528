//! Without any fsync, what was written and closed is durable a few seconds later: the
//! metadata role and the storage role each sync their changes once a second. Before the
//! storage role synced on its own, a crash kept a small file's size (the metadata sync made it
//! durable) and lost its bytes (the chunk map never was), so the file read back as zeros.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use support::node::{Node, pattern, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "256M", "--raid", "5"];

#[test]
fn closed_files_are_durable_seconds_later_without_fsync() {
    require_fuse();
    let dir = scratch("periodic-sync");
    let mut node = Node::start(&dir, &ARGS);
    // An inline file, a packed small file (its block waits in the open stripe's memory image)
    // and a file of several chunks.
    let files = [("inline", 2000), ("small", 4096), ("chunked", 3_000_000)];
    for (i, (name, len)) in files.iter().enumerate() {
        std::fs::write(node.mount.join(name), pattern(i as u64 + 1, 0, *len)).unwrap();
    }
    // Both roles sync once a second; give them time, then crash.
    std::thread::sleep(Duration::from_secs(4));
    node.kill();
    node.restart();
    for (i, (name, len)) in files.iter().enumerate() {
        let back = std::fs::read(node.mount.join(name)).unwrap();
        assert_eq!(back.len(), *len, "{name}: size");
        assert!(back == pattern(i as u64 + 1, 0, *len), "{name}: the bytes survive the crash");
    }
    node.stop();
    let out = node.cli(&["fsck"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}
