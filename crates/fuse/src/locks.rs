//! The mount's side of POSIX byte-range locks: which lock owners took locks through which
//! handles, so a close can drop them, and whether a process waiting for a lock gave up.
//!
//! The kernel leaves a lock to the file system once the mount offers `FUSE_POSIX_LOCKS`, and
//! expects it to drop an owner's locks on a file when the owner closes it: the FLUSH of every
//! close names the owner. A read-only handle sends no FLUSH (`FOPEN_NOFLUSH`), so its RELEASE
//! drops what was locked through it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Most F_SETLKW calls waiting at once; past it a wait is refused with ENOLCK.
pub(crate) const LOCK_WAITERS_MAX: usize = 1024;

/// The F_SETLKW calls waiting for a lock. Each waits on a thread of its own, not on a request
/// thread nor among the capped slow calls: a lock may stay held for as long as its holder
/// likes, and the holder's own requests must still be served.
#[derive(Debug, Default)]
pub(crate) struct LockWaiters {
    waiting: AtomicUsize,
    stopping: AtomicBool,
}

/// One waiting call; dropping it ends its count.
pub(crate) struct WaiterSlot(Arc<LockWaiters>);

impl Drop for WaiterSlot {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl LockWaiters {
    /// A slot for one more waiting call, unless [`LOCK_WAITERS_MAX`] wait already.
    pub fn start(self: &Arc<Self>) -> Option<WaiterSlot> {
        let before = self.waiting.fetch_add(1, Ordering::SeqCst);
        let slot = WaiterSlot(self.clone());
        (before < LOCK_WAITERS_MAX).then_some(slot)
    }

    /// The mount is going away: every wait ends (EINTR).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

/// Lock owners holding locks, by (inode, owner), with the handles they locked through.
#[derive(Debug, Default)]
pub(crate) struct LockHolders {
    held: Mutex<HashMap<(u64, u64), Vec<u64>>>,
}

impl LockHolders {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64), Vec<u64>>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `owner` took a lock on `ino` through handle `fh`.
    pub fn took(&self, ino: u64, owner: u64, fh: u64) {
        let mut held = self.lock();
        let handles = held.entry((ino, owner)).or_default();
        if !handles.contains(&fh) {
            handles.push(fh);
        }
    }

    /// `owner` closed `ino`: whether it may hold locks there (they are to be dropped).
    pub fn owner_closed(&self, ino: u64, owner: u64) -> bool {
        self.lock().remove(&(ino, owner)).is_some()
    }

    /// Handle `fh` of `ino` was released: the owners that locked through it.
    pub fn handle_released(&self, ino: u64, fh: u64) -> Vec<u64> {
        let mut held = self.lock();
        let owners: Vec<u64> = held
            .iter()
            .filter(|&(&(i, _), handles)| i == ino && handles.contains(&fh))
            .map(|(&(_, owner), _)| owner)
            .collect();
        for owner in &owners {
            held.remove(&(ino, *owner));
        }
        owners
    }
}

/// Whether the process (thread) `pid`, waiting in F_SETLKW, is gone or has a signal to take
/// (SIGKILL, or one it neither blocks nor ignores): its wait is then over (EINTR). The kernel
/// would tell us with FUSE_INTERRUPT, which fuser does not pass on; a killed waiter would
/// otherwise stay in the kernel until the lock came free.
pub(crate) fn waiter_gave_up(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    let mask = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| u64::from_str_radix(value.trim(), 16).ok())
            .unwrap_or(0)
    };
    // SIGKILL can be neither blocked nor ignored.
    let pending = mask("SigPnd:") | mask("ShdPnd:");
    pending & !mask("SigBlk:") & !mask("SigIgn:") != 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn closes_and_releases_find_the_owners_that_locked() {
        let holders = LockHolders::default();
        holders.took(7, 100, 1);
        holders.took(7, 100, 2);
        holders.took(7, 200, 3);
        holders.took(8, 100, 1);
        assert!(holders.owner_closed(7, 100));
        assert!(!holders.owner_closed(7, 100), "dropped once");
        assert_eq!(holders.handle_released(7, 3), vec![200]);
        assert_eq!(holders.handle_released(7, 3), Vec::<u64>::new());
        assert_eq!(holders.handle_released(8, 1), vec![100]);
    }

    #[test]
    fn waiters_are_capped_and_their_slots_come_back() {
        let waiters = Arc::new(LockWaiters::default());
        let slots: Vec<WaiterSlot> =
            (0..LOCK_WAITERS_MAX).map(|_| waiters.start().unwrap()).collect();
        assert!(waiters.start().is_none(), "one past the cap");
        drop(slots);
        assert!(waiters.start().is_some(), "slots come back");
        assert!(!waiters.stopping());
        waiters.stop();
        assert!(waiters.stopping());
    }

    #[test]
    fn a_live_quiet_process_has_not_given_up_and_a_dead_one_has() {
        assert!(!waiter_gave_up(std::process::id()));
        // Far above any pid_max.
        assert!(waiter_gave_up(u32::MAX - 1));
        assert!(!waiter_gave_up(0), "the kernel's own requests wait");
    }
}
