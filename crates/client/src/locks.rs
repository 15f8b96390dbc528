//! POSIX byte-range locks, held in the metadata service so that processes on different
//! clients exclude each other (see `stria_meta::locks`). Each client picks a random id at
//! start; a lock's owner is that id with the caller's own owner (the kernel's lock owner, one
//! per process). While the client holds locks it renews its lease every `LOCK_RENEW`; a
//! client that stops (crash, lost network) loses its locks one `LOCK_LEASE` later.
//!
//! The client also keeps its own record of the locks it holds: a restarted metadata service
//! starts with none, and the client takes them back from that record (see `reclaim`). New
//! locks wait while the restarted service gives its clients that chance (`Grace`).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, Weak};
use std::time::Duration;

use stria_proto::fs::{FsStatus, Ino};
use stria_proto::wire::{
    LOCK_RENEW, LockHolder, LockKind, LockOwnerId, LockRange, MetaReply, MetaRequest, ReclaimedLock,
};

use crate::{Client, FsResult, Inner, unexpected};

/// First pause of a waiting lock request between tries; doubles up to [`LOCK_RETRY_MAX`].
const LOCK_RETRY_FIRST: Duration = Duration::from_millis(2);
const LOCK_RETRY_MAX: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub(crate) struct LockSession {
    /// This client's id in every lock owner it sends.
    id: u64,
    /// Set at the first lock taken: from then on a task renews the lease.
    renewing: AtomicBool,
    /// The task that keeps saying hello (see `session`), stopped by the goodbye.
    pub(crate) hello: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
    /// The locks this client holds, per file and owner, as the service granted them.
    held: Mutex<HashMap<(Ino, u64), Vec<HeldRange>>>,
    /// Held shared by each request that changes what the client holds (opens, closes, locks)
    /// together with the client's record of it, and exclusively by a reclaim: what a reclaim
    /// tells is then exactly what the service granted.
    pub(crate) gate: RwLock<()>,
}

/// A byte range an owner holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HeldRange {
    pub range: LockRange,
    pub write: bool,
    pub pid: u32,
}

/// Applies a granted `kind` over `range` to an owner's ranges: the part of them inside
/// `range` goes, and (unless unlocking) the new range comes.
fn apply(ranges: &mut Vec<HeldRange>, range: LockRange, kind: LockKind, pid: u32) {
    let mut kept = Vec::with_capacity(ranges.len() + 2);
    for held in ranges.drain(..) {
        let r = held.range;
        if r.end < range.start || range.end < r.start {
            kept.push(held);
            continue;
        }
        if r.start < range.start {
            kept.push(HeldRange {
                range: LockRange { start: r.start, end: range.start - 1 },
                ..held
            });
        }
        if r.end > range.end {
            kept.push(HeldRange { range: LockRange { start: range.end + 1, end: r.end }, ..held });
        }
    }
    if kind != LockKind::Unlock {
        kept.push(HeldRange { range, write: kind == LockKind::Write, pid });
    }
    *ranges = kept;
}

impl LockSession {
    /// This client's id in its locks, its opens and its session.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn new() -> LockSession {
        // RandomState is seeded from the operating system's randomness.
        let seed = (std::process::id(), std::time::SystemTime::now());
        let id = std::hash::RandomState::new().hash_one(seed);
        LockSession {
            id,
            renewing: AtomicBool::new(false),
            hello: Default::default(),
            held: Mutex::default(),
            gate: RwLock::new(()),
        }
    }

    fn record(&self) -> MutexGuard<'_, HashMap<(Ino, u64), Vec<HeldRange>>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a granted `kind` over `range` of `ino` for `owner`.
    fn granted(&self, ino: Ino, owner: u64, range: LockRange, kind: LockKind, pid: u32) {
        let mut held = self.record();
        let ranges = held.entry((ino, owner)).or_default();
        apply(ranges, range, kind, pid);
        if ranges.is_empty() {
            held.remove(&(ino, owner));
        }
    }

    /// Every lock held, for a reclaim.
    pub fn held(&self) -> Vec<ReclaimedLock> {
        let held = self.record();
        let mut out = Vec::new();
        for (&(ino, owner), ranges) in held.iter() {
            for r in ranges {
                let kind = if r.write { LockKind::Write } else { LockKind::Read };
                out.push(ReclaimedLock { ino, owner, pid: r.pid, range: r.range, kind });
            }
        }
        out
    }

    /// Forgets locks a restarted service did not give back.
    pub fn lost(&self, lost: &[ReclaimedLock]) {
        for lock in lost {
            self.granted(lock.ino, lock.owner, lock.range, LockKind::Unlock, lock.pid);
        }
    }

    /// The gate, shared: held by a request that changes what the client holds.
    pub fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// Renews the client's lease every [`LOCK_RENEW`] until the client is gone.
async fn renew(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(LOCK_RENEW).await;
        let Some(inner) = inner.upgrade() else { return };
        let client = inner.locks.id;
        match inner.meta.call(MetaRequest::RenewLocks { client }).await {
            Ok(_) => {}
            Err(FsStatus::Stale) => {
                // Not to be taken back by a later reclaim: another client may have held them
                // meanwhile.
                inner.locks.record().clear();
                tracing::error!(
                    "this client was not heard from for a whole lock lease: the metadata \
                     service dropped every byte-range lock it held, and processes here are not \
                     told"
                );
            }
            Err(e) => tracing::warn!(%e, "renewing this client's byte-range lock lease"),
        }
    }
}

impl Client {
    fn lock_owner(&self, owner: u64) -> LockOwnerId {
        LockOwnerId { client: self.inner.locks.id, owner }
    }

    /// The lock of another owner that keeps `owner` from taking `kind` over `range` of `ino`
    /// (F_GETLK), if any.
    pub fn getlk(
        &self,
        ino: Ino,
        owner: u64,
        range: LockRange,
        kind: LockKind,
    ) -> FsResult<Option<LockHolder>> {
        let owner = self.lock_owner(owner);
        match self.meta(MetaRequest::GetLock { ino, owner, range, kind })? {
            MetaReply::Lock(holder) => Ok(holder),
            other => Err(unexpected(&other)),
        }
    }

    /// Takes `kind` over `range` of `ino` for `owner` (process `pid`), or drops the owner's
    /// locks there with `Unlock` (F_SETLK). Without `wait` a conflicting lock fails it with
    /// `LockConflict`; with it (F_SETLKW) the call tries again until the lock is free, or
    /// fails with `Interrupted` once `wait` says the caller gave up.
    pub fn setlk(
        &self,
        ino: Ino,
        owner: u64,
        pid: u32,
        range: LockRange,
        kind: LockKind,
        wait: Option<&dyn Fn() -> bool>,
    ) -> FsResult<()> {
        let lock_owner = self.lock_owner(owner);
        let request =
            MetaRequest::SetLock { ino, owner: lock_owner, pid, range, kind, wait: wait.is_some() };
        let mut pause = LOCK_RETRY_FIRST;
        loop {
            // The gate is held for one try only: a reclaim must not wait for a waiter.
            let gate = self.inner.locks.shared();
            let outcome = self.meta(request.clone());
            if outcome.is_ok() {
                self.inner.locks.granted(ino, owner, range, kind, pid);
            }
            drop(gate);
            match outcome {
                // A restarted service lets new locks wait while its clients reclaim theirs.
                Err(FsStatus::LockConflict) | Err(FsStatus::Grace) if let Some(gave_up) = wait => {
                    if gave_up() {
                        return Err(FsStatus::Interrupted);
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(LOCK_RETRY_MAX);
                }
                // F_SETLK answers at once: a lock yet to be reclaimed may be in the way, as far
                // as anyone can tell (waiting here would hold a request thread of the mount).
                Err(FsStatus::Grace) => return Err(FsStatus::LockConflict),
                Err(e) => return Err(e),
                Ok(_) => break,
            }
        }
        if kind != LockKind::Unlock && !self.inner.locks.renewing.swap(true, Ordering::SeqCst) {
            self.inner.runtime.spawn(renew(Arc::downgrade(&self.inner)));
        }
        Ok(())
    }

    /// Drops every lock `owner` holds on `ino` (its process closed the file).
    pub fn release_locks(&self, ino: Ino, owner: u64) -> FsResult<()> {
        let _gate = self.inner.locks.shared();
        let lock_owner = self.lock_owner(owner);
        // Forgotten here whatever the answer: the owner closed the file, and a later reclaim
        // must not take back what it let go.
        self.inner.locks.record().remove(&(ino, owner));
        self.meta(MetaRequest::ReleaseLocks { ino, owner: lock_owner }).map(|_| ())
    }
}
