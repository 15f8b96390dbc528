//! POSIX byte-range locks, held in the metadata service so that processes on different
//! clients exclude each other (see `stria_meta::locks`). Each client picks a random id at
//! start; a lock's owner is that id with the caller's own owner (the kernel's lock owner, one
//! per process). While the client holds locks it renews its lease every `LOCK_RENEW`; a
//! client that stops (crash, lost network) loses its locks one `LOCK_LEASE` later.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use stria_proto::fs::{FsStatus, Ino};
use stria_proto::wire::{
    LOCK_RENEW, LockHolder, LockKind, LockOwnerId, LockRange, MetaReply, MetaRequest,
};

use crate::transport::MetaConn;
use crate::{Client, FsResult, unexpected};

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
        LockSession { id, renewing: AtomicBool::new(false), hello: Default::default() }
    }
}

/// Renews `client`'s lease every [`LOCK_RENEW`] until the client is gone.
async fn renew(meta: Weak<MetaConn>, client: u64) {
    loop {
        tokio::time::sleep(LOCK_RENEW).await;
        let Some(meta) = meta.upgrade() else { return };
        match meta.call(MetaRequest::RenewLocks { client }).await {
            Ok(_) => {}
            Err(FsStatus::Stale) => tracing::error!(
                "this client was not heard from for a whole lock lease: the metadata service \
                 dropped every byte-range lock it held, and processes here are not told"
            ),
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
        let owner = self.lock_owner(owner);
        let request = MetaRequest::SetLock { ino, owner, pid, range, kind };
        let mut pause = LOCK_RETRY_FIRST;
        loop {
            match self.meta(request.clone()) {
                Err(FsStatus::LockConflict) if let Some(gave_up) = wait => {
                    if gave_up() {
                        return Err(FsStatus::Interrupted);
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(LOCK_RETRY_MAX);
                }
                Err(e) => return Err(e),
                Ok(_) => break,
            }
        }
        if kind != LockKind::Unlock && !self.inner.locks.renewing.swap(true, Ordering::SeqCst) {
            let meta = Arc::downgrade(&self.inner.meta);
            self.inner.runtime.spawn(renew(meta, self.inner.locks.id));
        }
        Ok(())
    }

    /// Drops every lock `owner` holds on `ino` (its process closed the file).
    pub fn release_locks(&self, ino: Ino, owner: u64) -> FsResult<()> {
        let owner = self.lock_owner(owner);
        self.meta(MetaRequest::ReleaseLocks { ino, owner }).map(|_| ())
    }
}
