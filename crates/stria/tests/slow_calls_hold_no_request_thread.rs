//! A call on the mount that waits long (an fsync, or a close that waits for queued writes)
//! runs off the threads that take the kernel's requests. With one such thread
//! (`--fuse-threads 1`) and a storage role that does not answer (stopped with SIGSTOP), an
//! fsync and a close wait for it while other operations on the mount go on; once storage
//! answers again they finish and the data reads back.

#![allow(clippy::unwrap_used)]

mod support;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use support::node::{Node, pattern, require_fuse, role_pid, scratch};

const ARGS: [&str; 9] = [
    "--drives",
    "4",
    "--drive-size",
    "256M",
    "--raid",
    "5",
    "--separate-roles",
    "--fuse-threads",
    "1",
];

fn signal(pid: u32, signal: i32) {
    // SAFETY: kill with a pid from the role's record and a valid signal.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0, "signal {signal} to {pid}");
}

/// A process stopped with SIGSTOP until this is dropped (also when an assertion fails).
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        signal(pid, libc::SIGSTOP);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

/// Runs `call` on a thread of its own and returns once that thread is inside the system call
/// numbered `syscall` (read from /proc), with the thread's handle.
fn blocked_in<T: Send + 'static>(
    syscall: i64,
    call: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let (tid_sender, tid) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tid_sender.send(unsafe { libc::gettid() }).unwrap();
        call()
    });
    let tid = tid.recv().unwrap();
    let path = format!("/proc/self/task/{tid}/syscall");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = std::fs::read_to_string(&path).unwrap_or_default();
        if now.split_whitespace().next() == Some(syscall.to_string().as_str()) {
            return thread;
        }
        assert!(!thread.is_finished(), "the call finished although storage does not answer");
        assert!(Instant::now() < deadline, "the thread never entered system call {syscall}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Metadata-only operations (the metadata role still answers) while `waiting` waits.
fn mount_goes_on(mnt: &Path, name: &str, waiting: &JoinHandle<impl Sized>) {
    std::fs::create_dir(mnt.join(name)).unwrap();
    assert!(mnt.join(name).metadata().unwrap().is_dir());
    assert!(std::fs::read_dir(mnt).unwrap().count() >= 2);
    assert!(
        !waiting.is_finished(),
        "the waiting call is over: the test proved nothing (storage answered?)"
    );
}

#[test]
fn an_fsync_and_a_close_waiting_for_storage_hold_up_nothing_else() {
    require_fuse();
    let dir = scratch("slow-calls");
    let mut node = Node::start(&dir, &ARGS);
    let mnt = node.mount.clone();
    let storage = role_pid(&node.data, "storage").expect("storage role record");

    // A file with chunks already: later writes to it are queued, not awaited by write().
    let mut file = File::create(mnt.join("f")).unwrap();
    file.write_all(&pattern(1, 0, 1 << 20)).unwrap();
    file.sync_all().unwrap();

    let stopped = Stopped::new(storage);
    file.write_all_at(&pattern(2, 0, 64 << 10), 0).unwrap();
    let fsync = blocked_in(libc::SYS_fsync, move || file.sync_all());
    mount_goes_on(&mnt, "during-fsync", &fsync);
    drop(stopped);
    fsync.join().unwrap().expect("the fsync succeeds once storage answers");

    let stopped = Stopped::new(storage);
    let file = OpenOptions::new().write(true).open(mnt.join("f")).unwrap();
    file.write_all_at(&pattern(3, 64 << 10, 64 << 10), 64 << 10).unwrap();
    let close = blocked_in(libc::SYS_close, move || drop(file));
    mount_goes_on(&mnt, "during-close", &close);
    drop(stopped);
    close.join().unwrap();

    let mut expected = pattern(1, 0, 1 << 20);
    expected[..64 << 10].copy_from_slice(&pattern(2, 0, 64 << 10));
    expected[64 << 10..128 << 10].copy_from_slice(&pattern(3, 64 << 10, 64 << 10));
    assert!(std::fs::read(mnt.join("f")).unwrap() == expected, "the file reads back as written");
    node.stop();
}
