//! POSIX byte-range locks (fcntl) are held by the metadata service, so processes on two
//! mounts of one node (`stria up`'s own and a `stria mount`) exclude each other: a
//! conflicting F_SETLK fails with EAGAIN, F_GETLK names the holder, read locks share, a
//! partial unlock frees only its part, F_SETLKW waits until the holder closes the file, data
//! written under a lock is what the next holder on the other mount reads, a
//! read-only handle's locks go with its close, many waiters leave the mount serving the rest,
//! and a waiter killed with SIGKILL exits instead of hanging in the kernel. flock(2) locks hold
//! across the mounts too, with flock's ownership: per open file, kept by dups, dropped at
//! the open file's last close. Waits that would close a cycle of owners waiting for each
//! other fail with EDEADLK.

#![allow(clippy::unwrap_used)]

mod support;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use support::node::{Node, SecondMount, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "256M", "--raid", "5"];

fn flock(kind: i32, start: i64, len: i64) -> libc::flock {
    // SAFETY: flock is plain data; every field that matters is set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as i16;
    lock.l_whence = libc::SEEK_SET as i16;
    lock.l_start = start;
    lock.l_len = len;
    lock
}

/// fcntl(F_SETLK or F_SETLKW) on `fd`: Ok or the errno.
fn set_lock(fd: i32, wait: bool, kind: i32, start: i64, len: i64) -> Result<(), i32> {
    let lock = flock(kind, start, len);
    let cmd = if wait { libc::F_SETLKW } else { libc::F_SETLK };
    // SAFETY: fcntl with a valid descriptor and a pointer to a live flock.
    if unsafe { libc::fcntl(fd, cmd, &lock) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

/// fcntl(F_GETLK): the lock in the way of `kind` over the range, as the kernel reports it.
fn get_lock(fd: i32, kind: i32, start: i64, len: i64) -> libc::flock {
    let mut lock = flock(kind, start, len);
    // SAFETY: fcntl with a valid descriptor and a pointer to a live flock.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_GETLK, &mut lock) }, 0);
    lock
}

fn open_rw(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap()
}

/// Polls F_SETLK until it is granted (a lock dropped by a close goes with the RELEASE the
/// kernel sends after `close` returned).
fn eventually_lock(fd: i32, kind: i32, start: i64, len: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match set_lock(fd, false, kind, start, len) {
            Ok(()) => return,
            Err(libc::EAGAIN) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{what}: still refused (errno {e}) 10 s after the holder closed"),
        }
    }
}

/// Joins `thread`, failing the test if it has not finished within 10 s.
fn join_within<T>(thread: std::thread::JoinHandle<T>, what: &str) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !thread.is_finished() {
        assert!(Instant::now() < deadline, "{what}: still waiting after 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    thread.join().unwrap()
}

/// Forks a child that opens `path` and waits for a write lock on byte `at` (F_SETLKW); it
/// exits 0 once it has the lock.
fn fork_waiter(path: &Path, at: i64) -> libc::pid_t {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let lock = flock(libc::F_WRLCK, at, 1);
    // SAFETY: the child only makes async-signal-safe calls (open, fcntl, _exit) on data
    // prepared before the fork.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let fd = libc::open(path.as_ptr(), libc::O_RDWR);
            if fd < 0 {
                libc::_exit(2);
            }
            let code = if libc::fcntl(fd, libc::F_SETLKW, &lock) == 0 { 0 } else { 3 };
            libc::_exit(code);
        }
        pid
    }
}

/// The child's exit: `Some(status)` once it is gone (waitpid with WNOHANG).
fn reaped(pid: libc::pid_t) -> Option<i32> {
    let mut status = 0;
    // SAFETY: waitpid on our own child with a valid status pointer.
    let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    (got == pid).then_some(status)
}

/// Waits for the child to end; its wait status. Fails the test after 10 s with `what`.
fn reap_within(pid: libc::pid_t, what: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = reaped(pid) {
            return status;
        }
        assert!(Instant::now() < deadline, "{what} after 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn byte_range_locks_hold_across_mounts() {
    require_fuse();
    let dir = scratch("locks");
    let node = Node::start(&dir, &ARGS);
    let second = SecondMount::start(&node, &dir.join("m2"));
    let (m1, m2) = (node.mount.clone(), second.path.clone());
    std::fs::write(m1.join("locked"), vec![0u8; 8192]).unwrap();

    let a = open_rw(&m1.join("locked"));
    let b = open_rw(&m2.join("locked"));
    let (fa, fb) = (a.as_raw_fd(), b.as_raw_fd());
    set_lock(fa, false, libc::F_WRLCK, 0, 100).unwrap();
    assert_eq!(set_lock(fb, false, libc::F_WRLCK, 50, 10), Err(libc::EAGAIN));
    assert_eq!(set_lock(fb, false, libc::F_RDLCK, 0, 1), Err(libc::EAGAIN));
    let holder = get_lock(fb, libc::F_WRLCK, 50, 10);
    assert_eq!(holder.l_type, libc::F_WRLCK as i16);
    assert_eq!((holder.l_start, holder.l_len), (0, 100));
    assert_eq!(holder.l_pid, std::process::id() as i32);
    let free = get_lock(fb, libc::F_WRLCK, 100, 50);
    assert_eq!(free.l_type, libc::F_UNLCK as i16, "nothing in the way past the lock");

    // Read locks share; a write lock over a shared range waits for both readers.
    set_lock(fb, false, libc::F_RDLCK, 200, 100).unwrap();
    set_lock(fa, false, libc::F_RDLCK, 250, 10).unwrap();
    assert_eq!(set_lock(fa, false, libc::F_WRLCK, 250, 10), Err(libc::EAGAIN));

    // Unlocking part of a lock frees only that part.
    set_lock(fa, false, libc::F_UNLCK, 0, 50).unwrap();
    set_lock(fb, false, libc::F_WRLCK, 0, 50).unwrap();
    assert_eq!(set_lock(fb, false, libc::F_WRLCK, 50, 10), Err(libc::EAGAIN));

    // F_SETLKW through m2 waits until the holder on m1 closes the file (POSIX: a close drops
    // the process's locks on it).
    let waiter = std::thread::spawn(move || set_lock(fb, true, libc::F_WRLCK, 60, 10));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "F_SETLKW returned while the range was locked");
    drop(a);
    assert_eq!(join_within(waiter, "F_SETLKW after the holder closed"), Ok(()));

    // A read-only handle's locks go with its close (it sends no FLUSH, only a RELEASE).
    let ro = std::fs::File::open(m1.join("locked")).unwrap();
    set_lock(ro.as_raw_fd(), false, libc::F_RDLCK, 1000, 10).unwrap();
    assert_eq!(set_lock(fb, false, libc::F_WRLCK, 1000, 10), Err(libc::EAGAIN));
    drop(ro);
    eventually_lock(fb, libc::F_WRLCK, 1000, 10, "the read-only handle's lock");

    // Many waiters at once (more than the mount's request threads and its 16 slow calls)
    // leave the mount serving everything else, the holder's own I/O included.
    const WAITERS: usize = 24;
    let holder = open_rw(&m1.join("locked"));
    set_lock(holder.as_raw_fd(), false, libc::F_WRLCK, 3000, 10).unwrap();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let path = m2.join("locked");
            std::thread::spawn(move || {
                let file = open_rw(&path);
                set_lock(file.as_raw_fd(), true, libc::F_WRLCK, 3000, 10)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert!(waiters.iter().all(|w| !w.is_finished()), "a waiter got a held lock");
    for mount in [&m1, &m2] {
        std::fs::write(mount.join("meanwhile"), b"served").unwrap();
        assert_eq!(std::fs::read(mount.join("meanwhile")).unwrap(), b"served");
    }
    drop(holder);
    for waiter in waiters {
        assert_eq!(join_within(waiter, "one of many waiters"), Ok(()));
    }

    // A lock orders data between mounts: what m1 writes under a lock and unlocks is what m2
    // reads under the lock it takes next, through a handle whose pages it had cached.
    let mut cached = vec![0u8; 4096];
    {
        use std::os::unix::fs::FileExt;
        b.read_exact_at(&mut cached, 0).unwrap();
        let writer = open_rw(&m1.join("locked"));
        set_lock(writer.as_raw_fd(), true, libc::F_WRLCK, 0, 4096).unwrap();
        writer.write_all_at(&[b'x'; 4096], 0).unwrap();
        set_lock(writer.as_raw_fd(), false, libc::F_UNLCK, 0, 4096).unwrap();
        set_lock(fb, true, libc::F_RDLCK, 0, 4096).unwrap();
        b.read_exact_at(&mut cached, 0).unwrap();
        assert!(cached.iter().all(|&byte| byte == b'x'), "m2 read stale bytes under its lock");
        set_lock(fb, false, libc::F_UNLCK, 0, 4096).unwrap();
        drop(writer);
    }

    // Another process on the same mount is excluded as well, and one killed while it waits
    // in F_SETLKW exits: it does not hang in the kernel until the lock comes free.
    let c = open_rw(&m1.join("locked"));
    set_lock(c.as_raw_fd(), false, libc::F_WRLCK, 5000, 1).unwrap();
    let child = fork_waiter(&m1.join("locked"), 5000);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(reaped(child), None, "the child got a lock this process holds");
    // SAFETY: kill our own child.
    unsafe { libc::kill(child, libc::SIGKILL) };
    let status = reap_within(child, "a killed F_SETLKW waiter still hangs");
    assert!(libc::WIFSIGNALED(status), "the child was not killed: status {status}");
    // Once this process lets go, a waiter gets the lock.
    let child = fork_waiter(&m2.join("locked"), 5000);
    std::thread::sleep(Duration::from_millis(200));
    drop(c);
    let status = reap_within(child, "the waiter did not get the freed lock");
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status}");
    drop(b);
}

/// flock(2) on `fd`: Ok or the errno.
fn flock_file(fd: i32, operation: i32) -> Result<(), i32> {
    // SAFETY: flock on a valid descriptor.
    if unsafe { libc::flock(fd, operation) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

/// Polls flock(LOCK_NB) until it is granted (the lock an open file held goes with the RELEASE
/// the kernel sends after its last `close` returned).
fn eventually_flock(fd: i32, operation: i32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match flock_file(fd, operation | libc::LOCK_NB) {
            Ok(()) => return,
            Err(libc::EWOULDBLOCK) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{what}: still refused (errno {e}) 10 s after the holder closed"),
        }
    }
}

#[test]
fn flock_locks_hold_across_mounts() {
    require_fuse();
    let dir = scratch("flocks");
    let node = Node::start(&dir, &ARGS);
    let second = SecondMount::start(&node, &dir.join("m2"));
    let (m1, m2) = (node.mount.clone(), second.path.clone());
    std::fs::write(m1.join("flocked"), b"shared").unwrap();
    const NB: i32 = libc::LOCK_NB;

    let a = open_rw(&m1.join("flocked"));
    let b = open_rw(&m2.join("flocked"));
    let (fa, fb) = (a.as_raw_fd(), b.as_raw_fd());
    flock_file(fa, libc::LOCK_EX | NB).unwrap();
    assert_eq!(flock_file(fb, libc::LOCK_EX | NB), Err(libc::EWOULDBLOCK), "other mount");
    assert_eq!(flock_file(fb, libc::LOCK_SH | NB), Err(libc::EWOULDBLOCK), "shared vs exclusive");
    // flock's owner is the open file: another open in this same process is excluded too.
    let other_open = open_rw(&m1.join("flocked"));
    assert_eq!(flock_file(other_open.as_raw_fd(), libc::LOCK_EX | NB), Err(libc::EWOULDBLOCK));
    drop(other_open);
    // A dup shares the open file: closing it (a FLUSH from this process) keeps the lock.
    let dup = a.try_clone().unwrap();
    drop(dup);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        flock_file(fb, libc::LOCK_EX | NB),
        Err(libc::EWOULDBLOCK),
        "kept after a dup's close"
    );
    // fuser does not tell a flock from a POSIX lock: the two kinds exclude each other here
    // (as on NFS), where a local file system keeps them apart.
    assert_eq!(set_lock(fb, false, libc::F_WRLCK, 0, 1), Err(libc::EAGAIN));

    // Unlocked, shared locks share across the mounts and keep out an exclusive one.
    flock_file(fa, libc::LOCK_UN).unwrap();
    flock_file(fb, libc::LOCK_SH | NB).unwrap();
    flock_file(fa, libc::LOCK_SH | NB).unwrap();
    assert_eq!(
        flock_file(fa, libc::LOCK_EX | NB),
        Err(libc::EWOULDBLOCK),
        "an upgrade past a reader"
    );

    // A blocking flock through m1 waits for both readers: m1's own lets go with LOCK_UN, m2's
    // with the last close of its open file.
    let c = open_rw(&m1.join("flocked"));
    let fc = c.as_raw_fd();
    flock_file(fa, libc::LOCK_UN).unwrap();
    let waiter = std::thread::spawn(move || flock_file(fc, libc::LOCK_EX));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "flock(LOCK_EX) returned while m2 held a shared lock");
    drop(b);
    assert_eq!(join_within(waiter, "flock(LOCK_EX) after the reader closed"), Ok(()));
    let d = open_rw(&m2.join("flocked"));
    assert_eq!(flock_file(d.as_raw_fd(), libc::LOCK_SH | NB), Err(libc::EWOULDBLOCK));
    drop(c);
    eventually_flock(d.as_raw_fd(), libc::LOCK_EX, "the closed holder's flock");
    drop((a, d));
}

#[test]
fn waits_that_close_a_cycle_fail_with_edeadlk() {
    require_fuse();
    let dir = scratch("lock-deadlock");
    let node = Node::start(&dir, &ARGS);
    let second = SecondMount::start(&node, &dir.join("m2"));
    std::fs::write(node.mount.join("pair"), vec![0u8; 100]).unwrap();
    // One owner on each mount (the mounts' clients differ), each holding one byte.
    let a = open_rw(&node.mount.join("pair"));
    let b = open_rw(&second.path.join("pair"));
    let (fa, fb) = (a.as_raw_fd(), b.as_raw_fd());
    set_lock(fa, false, libc::F_WRLCK, 0, 1).unwrap();
    set_lock(fb, false, libc::F_WRLCK, 10, 1).unwrap();

    // a waits for b's byte; b waiting for a's would never end: EDEADLK, at once.
    let waiter = std::thread::spawn(move || set_lock(fa, true, libc::F_WRLCK, 10, 1));
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiter.is_finished(), "a's wait ended while b holds the byte");
    let closing = std::thread::spawn(move || set_lock(fb, true, libc::F_WRLCK, 0, 1));
    let closed = join_within(closing, "the wait that closes the cycle");
    assert_eq!(closed, Err(libc::EDEADLK));
    // A wait that closes no cycle still waits: b unlocks its byte, and a gets it.
    set_lock(fb, false, libc::F_UNLCK, 10, 1).unwrap();
    assert_eq!(join_within(waiter, "a's wait for the byte b unlocked"), Ok(()));
    assert_eq!(set_lock(fb, false, libc::F_WRLCK, 10, 1), Err(libc::EAGAIN));
    drop((a, b, second));
}
