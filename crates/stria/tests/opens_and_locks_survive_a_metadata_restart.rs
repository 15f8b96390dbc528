//! The metadata service keeps open handles and byte-range locks in memory. When it restarts
//! under a running mount (`stria up --separate-roles`, its role killed with -9), the mount's
//! client tells the new run what it holds. A lock taken before the crash still excludes
//! another mount. An unlinked file still open through the mount keeps its data until it is
//! closed; its space then comes back. Meanwhile, in the grace period, no new lock is granted
//! over a lock that has not been reclaimed yet: F_SETLKW waits for its end and F_SETLK fails. Takes about a minute: after
//! a crash the grace period is a whole lease (30 s).

#![allow(clippy::unwrap_used)]

mod support;

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use stria_proto::wire::LOCK_LEASE;
use support::node::{Node, SecondMount, require_fuse, role_pid, scratch};

const ARGS: [&str; 7] =
    ["--drives", "3", "--drive-size", "256M", "--raid", "5", "--separate-roles"];

const UNLINKED_BYTES: usize = 16 << 20;

fn pattern() -> Vec<u8> {
    (0..UNLINKED_BYTES).map(|i| (i * 13 + i / 4096) as u8).collect()
}

/// fcntl(F_SETLKW if `wait`, else F_SETLK) of a write lock over `start..start + len`: Ok or
/// the errno.
fn write_lock(file: &std::fs::File, wait: bool, start: i64, len: i64) -> Result<(), i32> {
    // SAFETY: flock is plain data; every field that matters is set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as i16;
    lock.l_whence = libc::SEEK_SET as i16;
    lock.l_start = start;
    lock.l_len = len;
    let cmd = if wait { libc::F_SETLKW } else { libc::F_SETLK };
    // SAFETY: fcntl with a valid descriptor and a pointer to a live flock.
    if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &lock) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

fn try_lock(file: &std::fs::File, start: i64, len: i64) -> Result<(), i32> {
    write_lock(file, false, start, len)
}

/// Free bytes of the file system mounted at `mount` (statvfs).
fn free_bytes(mount: &Path) -> u64 {
    let path = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs fills a plain struct from a valid path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut st) }, 0, "statvfs");
    st.f_bfree * st.f_frsize
}

/// Reads the whole file through the mount, not from the kernel's page cache.
fn read_uncached(file: &std::fs::File) -> Vec<u8> {
    // SAFETY: posix_fadvise on a valid descriptor; it only drops clean cached pages.
    let dropped = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(dropped, 0, "posix_fadvise");
    let mut read = vec![0u8; UNLINKED_BYTES];
    file.read_exact_at(&mut read, 0).unwrap();
    read
}

fn open_rw(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap()
}

#[test]
fn opens_and_locks_survive_a_metadata_restart() {
    require_fuse();
    let dir = scratch("reclaim");
    let node = Node::start(&dir, &ARGS);
    let second = SecondMount::start(&node, &dir.join("m2"));
    let m1 = node.mount.clone();
    std::fs::write(m1.join("locked"), vec![0u8; 4096]).unwrap();
    let mine = open_rw(&m1.join("locked"));
    mine.sync_all().unwrap();
    let theirs = open_rw(&second.path.join("locked"));
    try_lock(&mine, 0, 100).unwrap();
    assert_eq!(try_lock(&theirs, 50, 10), Err(libc::EAGAIN));

    let mut file = std::fs::File::create(m1.join("unlinked")).unwrap();
    std::io::Write::write_all(&mut file, &pattern()).unwrap();
    file.sync_all().unwrap();
    drop(file);
    let unlinked = std::fs::File::open(m1.join("unlinked")).unwrap();
    std::fs::remove_file(m1.join("unlinked")).unwrap();
    // Made durable, as the crash below would lose a change that is not (lazy commits).
    std::fs::File::open(&m1).unwrap().sync_all().unwrap();
    // The metadata role learns the targets' space once a second.
    std::thread::sleep(Duration::from_secs(2));
    let free_while_held = free_bytes(&m1);

    // The metadata role crashes; the node restarts it on the same address.
    let old = role_pid(&node.data, "meta").expect("meta role record");
    // SAFETY: kill with a pid from the role's record and a valid signal.
    assert_eq!(unsafe { libc::kill(old as i32, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while role_pid(&node.data, "meta").is_none_or(|pid| pid == old) {
        assert!(Instant::now() < deadline, "the meta role was not restarted: {}", node.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    let restarted = Instant::now();
    // The first answer the mount's client gets from the new run sets off its reclaim.
    free_bytes(&m1);

    // During the grace period an F_SETLKW waits even for a free range, and an F_SETLK is
    // refused at once: a lock yet to be reclaimed may be in the way.
    let waiter = {
        let theirs = theirs.try_clone().unwrap();
        std::thread::spawn(move || {
            write_lock(&theirs, true, 300, 10).unwrap();
            restarted.elapsed()
        })
    };
    assert_eq!(try_lock(&theirs, 400, 10), Err(libc::EAGAIN), "granted in the grace period");
    // After it, the reclaimed lock still excludes the other mount; free ranges are granted.
    std::thread::sleep((restarted + LOCK_LEASE + Duration::from_secs(2)) - Instant::now());
    assert_eq!(try_lock(&theirs, 50, 10), Err(libc::EAGAIN), "granted over a reclaimed lock");
    try_lock(&theirs, 200, 10).unwrap();
    let waited = waiter.join().unwrap();
    assert!(
        waited >= LOCK_LEASE - Duration::from_secs(5),
        "a wait for a free range was granted {waited:?} after the restart, in the grace period"
    );

    // The orphans of the last run nobody reclaimed are purged once the grace period is over
    // (within one round of the node's expiry, 10 s): this one was reclaimed and stays.
    std::thread::sleep(Duration::from_secs(12));
    assert!(read_uncached(&unlinked) == pattern(), "the open unlinked file lost its data");
    assert!(
        free_bytes(&m1) < free_while_held + UNLINKED_BYTES as u64 / 2,
        "the open unlinked file's space was given back"
    );

    // Closing the holders frees what they held.
    drop(unlinked);
    drop(mine);
    let closed = Instant::now();
    loop {
        let freed = free_bytes(&m1) >= free_while_held + UNLINKED_BYTES as u64 / 2;
        let locked = try_lock(&theirs, 50, 10).is_ok();
        if freed && locked {
            break;
        }
        assert!(
            closed.elapsed() < Duration::from_secs(20),
            "after the closes: space {}, lock {}",
            if freed { "back" } else { "still taken" },
            if locked { "free" } else { "still held" }
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(second);
}
