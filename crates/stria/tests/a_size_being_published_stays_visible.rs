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

use stria_proto::fs::{FsStatus, ROOT_INO};
use stria_proto::wire::{Caller, FileKind, SetAttr};
use support::node::{Node, native_client, pattern, require_fuse, scratch};

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

/// A truncate the metadata service refuses changes nothing here either: the size of writes not
/// yet published stays marked so, and the close publishes it. Before, the client took the new
/// size as its own before asking, and a refused truncate lost the end of the file at the close.
#[test]
fn a_refused_truncate_leaves_the_unpublished_size_to_the_close() {
    require_fuse();
    let dir = scratch("refused-truncate");
    let node = Node::start(&dir, &ARGS);
    let (client, _runtime) = native_client(&node);
    let root = Caller::root();
    let mib = 1u64 << 20;
    let ino = client.create(&root, ROOT_INO, b"f", FileKind::File, 0o644, 0, true).unwrap().ino;
    let (fh, _) = client.open(&root, ino, (libc::R_OK | libc::W_OK) as u32).unwrap();
    // The first write's size comes with its spill; the second's is left to the close.
    client.write(fh, 0, &pattern(1, 0, mib as usize)).unwrap();
    client.write(fh, mib, &pattern(1, mib, mib as usize)).unwrap();
    let other = Caller::new(65_534, 65_534);
    let cut = SetAttr { size: Some(4096), ..SetAttr::default() };
    assert_eq!(client.setattr(&other, ino, cut), Err(FsStatus::Access), "0644 is not theirs");
    assert_eq!(client.getattr(ino).unwrap().size, 2 * mib, "getattr after the refused truncate");
    client.release(fh).unwrap();

    let (fh, attr) = client.open(&root, ino, libc::R_OK as u32).unwrap();
    assert_eq!(attr.size, 2 * mib, "the close published the size");
    assert_eq!(client.read(fh, mib, mib as u32).unwrap(), pattern(1, mib, mib as usize));
    client.release(fh).unwrap();
    assert_eq!(std::fs::metadata(node.mount.join("f")).unwrap().len(), 2 * mib, "the mount");
}
