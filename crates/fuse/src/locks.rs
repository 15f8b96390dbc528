//! The mount's side of POSIX byte-range locks: which lock owners took locks through which
//! handles, so a close can drop them, and whether a process waiting for a lock gave up.
//!
//! The kernel leaves a lock to the file system once the mount offers `FUSE_POSIX_LOCKS`, and
//! expects it to drop an owner's locks on a file when the owner closes it: the FLUSH of every
//! close names the owner. A read-only handle sends no FLUSH (`FOPEN_NOFLUSH`), so its RELEASE
//! drops what was locked through it.
//!
//! With `FUSE_FLOCK_LOCKS` offered too, the kernel sends flock(2) as a lock over the whole file
//! whose owner is the open file (the kernel's own emulation of flock over POSIX locks, as NFS
//! does): dups and forks share it, another open of the file is another owner, and the FLUSH
//! of a close (owned by the process) leaves it. The RELEASE of the open file's last close
//! drops it, being a handle the owner locked through. fuser does not pass the flock mark on,
//! so flock and fcntl locks on one file meet in one table and exclude each other (on a local
//! file system they are independent).

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

/// What the mount knows of one lock owner on one file.
#[derive(Debug, Default)]
struct Holder {
    /// The handles it locked through.
    handles: Vec<u64>,
    /// Its lock requests still on their way to the metadata service.
    in_flight: u32,
    /// A close came while some were: each drops the owner's locks once it is answered.
    closed: bool,
}

/// Lock owners that may hold locks, by (inode, owner).
#[derive(Debug, Default)]
pub(crate) struct LockHolders {
    held: Mutex<HashMap<(u64, u64), Holder>>,
}

impl LockHolders {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64), Holder>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `owner` asks for a lock on `ino` through handle `fh`; [`LockHolders::answered`] follows.
    pub fn asking(&self, ino: u64, owner: u64, fh: u64) {
        let mut held = self.lock();
        let holder = held.entry((ino, owner)).or_default();
        if holder.in_flight == 0 {
            // A close before this request was dealt with then.
            holder.closed = false;
        }
        holder.in_flight += 1;
        if !holder.handles.contains(&fh) {
            holder.handles.push(fh);
        }
    }

    /// A lock request of `owner` on `ino` was answered: whether the owner closed the file
    /// meanwhile, so what the request took is to be dropped now.
    pub fn answered(&self, ino: u64, owner: u64) -> bool {
        let mut held = self.lock();
        let Some(holder) = held.get_mut(&(ino, owner)) else { return false };
        holder.in_flight -= 1;
        let closed = holder.closed;
        if closed && holder.in_flight == 0 {
            held.remove(&(ino, owner));
        }
        closed
    }

    /// `owner` closed `ino`: whether it may hold locks there (they are to be dropped).
    pub fn owner_closed(&self, ino: u64, owner: u64) -> bool {
        let mut held = self.lock();
        match held.get_mut(&(ino, owner)) {
            None => false,
            Some(holder) if holder.in_flight > 0 => {
                holder.closed = true;
                true
            }
            Some(_) => held.remove(&(ino, owner)).is_some(),
        }
    }

    /// Handle `fh` of `ino` was released: the owners that locked through it (closed as by
    /// [`LockHolders::owner_closed`]).
    pub fn handle_released(&self, ino: u64, fh: u64) -> Vec<u64> {
        let owners: Vec<u64> = self
            .lock()
            .iter()
            .filter(|&(&(i, _), holder)| i == ino && holder.handles.contains(&fh))
            .map(|(&(_, owner), _)| owner)
            .collect();
        owners.into_iter().filter(|&owner| self.owner_closed(ino, owner)).collect()
    }
}

/// Drops every lock `owner` holds on `ino` (its process closed the file); a failure is
/// logged: the locks then go with the client's lease at the latest.
pub(crate) fn release_locks(client: &stria_client::Client, ino: u64, owner: u64) {
    if let Err(e) = client.release_locks(ino, owner) {
        tracing::warn!(ino, %e, "dropping the byte-range locks of a closing process");
    }
}

/// The outcome of a lock request of `owner` on `ino` (see [`LockHolders::asking`]). A lock
/// whose owner closed the file meanwhile is dropped again. A lock granted makes the kernel
/// drop its cached attributes of the file, so the next read asks for them and drops cached
/// pages another client's writes made stale (`AUTO_INVAL_DATA`): what the last holder wrote
/// and published at its unlock or close is read.
pub(crate) fn taken(
    client: &stria_client::Client,
    holders: &LockHolders,
    notifier: Option<&fuser::Notifier>,
    ino: u64,
    owner: u64,
    result: Result<(), stria_proto::fs::FsStatus>,
) -> Result<(), stria_proto::fs::FsStatus> {
    let closed = holders.answered(ino, owner);
    if result.is_ok() {
        if closed {
            release_locks(client, ino, owner);
        } else {
            client.forget_cached(ino);
            crate::drop_cached_attrs(notifier, ino);
        }
    }
    result
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
        for (ino, owner, fh) in [(7, 100, 1), (7, 100, 2), (7, 200, 3), (8, 100, 1)] {
            holders.asking(ino, owner, fh);
            assert!(!holders.answered(ino, owner));
        }
        assert!(holders.owner_closed(7, 100));
        assert!(!holders.owner_closed(7, 100), "dropped once");
        assert_eq!(holders.handle_released(7, 3), vec![200]);
        assert_eq!(holders.handle_released(7, 3), Vec::<u64>::new());
        assert_eq!(holders.handle_released(8, 1), vec![100]);
    }

    #[test]
    fn a_close_while_a_lock_is_on_its_way_drops_it_once_answered() {
        let holders = LockHolders::default();
        holders.asking(7, 100, 1);
        assert!(holders.owner_closed(7, 100), "drop what is held now");
        assert!(holders.answered(7, 100), "and what the request in flight took");
        assert!(!holders.owner_closed(7, 100), "nothing left after that");
        // A request after the close is the owner's again.
        holders.asking(7, 100, 1);
        assert!(!holders.answered(7, 100));
        assert!(holders.owner_closed(7, 100));
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
