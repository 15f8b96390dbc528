//! Byte-range locks and client leases, end to end: a mount that holds a lock longer than the
//! 30 s lease keeps it (the client renews its lease in the background), and the locks of a
//! mount whose process was killed come free once its lease runs out, so a crashed client
//! cannot block the others for ever. Takes about a minute: the lease is 30 s.

#![allow(clippy::unwrap_used)]

mod support;

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use stria_proto::wire::LOCK_LEASE;
use support::node::{Node, SecondMount, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "256M", "--raid", "5"];

/// fcntl(F_SETLK) of a write lock over bytes 0..10: Ok or the errno.
fn try_lock(file: &std::fs::File) -> Result<(), i32> {
    // SAFETY: flock is plain data; every field that matters is set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as i16;
    lock.l_whence = libc::SEEK_SET as i16;
    lock.l_len = 10;
    // SAFETY: fcntl with a valid descriptor and a pointer to a live flock.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

#[test]
fn lock_leases_outlive_quiet_holders_not_dead_ones() {
    require_fuse();
    let dir = scratch("lock-leases");
    let node = Node::start(&dir, &ARGS);
    let mut second = SecondMount::start(&node, &dir.join("m2"));
    std::fs::write(node.mount.join("f"), b"0123456789").unwrap();
    let open = |path: &std::path::Path| {
        std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap()
    };
    let mine = open(&node.mount.join("f"));
    let theirs = open(&second.path.join("f"));

    try_lock(&theirs).unwrap();
    // The holder says nothing for longer than a lease; its client renews in the background.
    std::thread::sleep(LOCK_LEASE + Duration::from_secs(5));
    assert_eq!(try_lock(&mine), Err(libc::EAGAIN), "a quiet holder lost its lock");

    // The holder's client dies: nobody releases the lock, the lease does.
    second.kill();
    let killed = Instant::now();
    loop {
        match try_lock(&mine) {
            Ok(()) => break,
            Err(libc::EAGAIN) => {
                assert!(
                    killed.elapsed() < LOCK_LEASE * 2,
                    "a dead client's lock still held {:?} after it died",
                    killed.elapsed()
                );
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("F_SETLK failed with errno {e}"),
        }
    }
    drop(theirs);
}
