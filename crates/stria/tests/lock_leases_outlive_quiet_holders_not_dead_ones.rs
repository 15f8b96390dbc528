//! Byte-range locks, open files and client leases, end to end: a mount that holds a lock or an
//! unlinked file open longer than the 30 s lease keeps them (the client renews its lease and
//! its session in the background), and once a mount's process was killed its locks come free
//! and the unlinked file only it had open gives its space back when its session runs out, so
//! a crashed client can neither block the others nor pin space for ever. Takes about a
//! minute: the lease is 30 s.

#![allow(clippy::unwrap_used)]

mod support;

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
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

/// Free bytes of the file system mounted at `mount` (statvfs).
fn free_bytes(mount: &std::path::Path) -> u64 {
    let path = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs fills a plain struct from a valid path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut st) }, 0, "statvfs");
    st.f_bfree * st.f_frsize
}

const UNLINKED_BYTES: usize = 32 << 20;

fn pattern() -> Vec<u8> {
    (0..UNLINKED_BYTES).map(|i| (i * 7 + i / 4096) as u8).collect()
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
    // A file the second mount holds open, unlinked through the first: its data stays while
    // the second mount's session lives.
    std::fs::write(node.mount.join("unlinked"), pattern()).unwrap();
    let unlinked = std::fs::File::open(second.path.join("unlinked")).unwrap();
    std::fs::remove_file(node.mount.join("unlinked")).unwrap();
    let free_while_held = free_bytes(&node.mount);

    try_lock(&theirs).unwrap();
    // The holder says nothing for longer than a lease; its client renews in the background.
    std::thread::sleep(LOCK_LEASE + Duration::from_secs(5));
    assert_eq!(try_lock(&mine), Err(libc::EAGAIN), "a quiet holder lost its lock");
    let mut read = vec![0u8; UNLINKED_BYTES];
    unlinked.read_exact_at(&mut read, 0).unwrap();
    assert!(read == pattern(), "the unlinked file a live client holds open lost its data");

    // The holder's client dies: nobody releases the lock nor closes the file; the lease and
    // the session's end do.
    second.kill();
    let killed = Instant::now();
    let mut locked = false;
    loop {
        if !locked {
            match try_lock(&mine) {
                Ok(()) => locked = true,
                Err(libc::EAGAIN) => {}
                Err(e) => panic!("F_SETLK failed with errno {e}"),
            }
        }
        let freed = free_bytes(&node.mount) >= free_while_held + UNLINKED_BYTES as u64;
        if locked && freed {
            break;
        }
        assert!(
            killed.elapsed() < LOCK_LEASE * 2,
            "{:?} after the client died: its lock {}, its unlinked file's space {}",
            killed.elapsed(),
            if locked { "came free" } else { "still held" },
            if freed { "came back" } else { "still taken" },
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    drop((theirs, unlinked));
}
