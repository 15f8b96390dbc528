//! A close (FUSE flush) publishes the size of the writes a client made; until the metadata
//! service has it, every getattr must still show it. Found by the fsx exerciser: a flush sent
//! by the kernel because another process exec'd with the file descriptor inherited (every
//! fork + exec closes the child's copies) cleared the client's "unpublished" mark before the
//! size reached the metadata service, and a stat in between cached the old size.

#![allow(clippy::unwrap_used)]

mod support;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use support::node::{Node, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "128M", "--raid", "5"];

#[test]
fn stat_shows_every_write_while_closes_elsewhere_publish_sizes() {
    require_fuse();
    let dir = scratch("size-publish");
    let node = Node::start(&dir, &ARGS);
    let path = node.mount.join("grows");
    let file = OpenOptions::new().create(true).read(true).write(true).open(&path).unwrap();
    // Chunked from the start, so each write is queued and its size published by a flush.
    file.write_all_at(&vec![7u8; 8192], 0).unwrap();

    // Forks that exec: each closes the child's inherited copy of the descriptor, which the
    // kernel turns into a flush of the file.
    let stop = Arc::new(AtomicBool::new(false));
    let spawner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut spawned = 0u64;
            while !stop.load(Ordering::Relaxed) {
                Command::new("true").status().unwrap();
                spawned += 1;
            }
            spawned
        })
    };
    let mut size = 8192u64;
    for _ in 0..1500 {
        file.write_all_at(&[1u8; 100], size).unwrap();
        size += 100;
        let seen = std::fs::metadata(&path).unwrap().len();
        let seen_fd = file.metadata().unwrap().len();
        assert!(seen == size && seen_fd == size, "stat {seen}, fstat {seen_fd}, written {size}");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(spawner.join().unwrap() > 10, "the flushes from other processes did not happen");
}
