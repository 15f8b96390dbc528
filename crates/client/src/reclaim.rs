//! Taking back what this client held when the metadata service restarted. The service keeps
//! open handles and byte-range locks in memory only (see `stria_meta::reclaim`); every reply
//! names the run of the service it came from, and the first reply from a new run sets off a
//! reclaim: the client tells its open handles per file and its locks, in pieces, under the
//! gate of `locks::LockSession` so that no open, close or lock changes them meanwhile.

use std::sync::Arc;
use std::time::Duration;

use stria_proto::wire::{MetaReply, MetaRequest, RECLAIM_PIECE_MAX};

use crate::{Client, FsResult, Inner, unexpected};

/// Tries of a reclaim that fails (the service may be restarting again).
const RECLAIM_TRIES: u32 = 5;
const RECLAIM_RETRY_PAUSE: Duration = Duration::from_secs(1);

impl Client {
    /// From now on, a restart of the metadata service makes this client reclaim.
    pub(crate) fn reclaim_on_restart(&self) {
        let inner = Arc::downgrade(&self.inner);
        self.inner.meta.on_restart(Box::new(move || {
            let Some(inner) = inner.upgrade() else { return };
            let runtime = inner.runtime.clone();
            // Off the runtime's workers: the reclaim waits for the gate and blocks on calls.
            runtime.spawn_blocking(move || Client { inner }.reclaim_with_retries());
        }));
    }

    fn reclaim_with_retries(&self) {
        for attempt in 1..=RECLAIM_TRIES {
            match self.reclaim() {
                Ok(()) => return,
                Err(e) if attempt < RECLAIM_TRIES => {
                    tracing::warn!(%e, attempt, "telling the restarted metadata service what this client holds");
                    std::thread::sleep(RECLAIM_RETRY_PAUSE);
                }
                Err(e) => {
                    tracing::error!(
                        %e,
                        "could not tell the restarted metadata service what this client holds \
                         (tried again at its next answer): its open files may lose their data \
                         if unlinked, and its locks are not held"
                    );
                    self.inner.meta.forget_instance();
                }
            }
        }
    }

    /// Tells the metadata service every handle open here and every lock held (see the module
    /// doc). Locks it did not give back are dropped from the record, and reported.
    pub fn reclaim(&self) -> FsResult<()> {
        let inner: &Inner = &self.inner;
        let _gate = inner.locks.gate.write().unwrap_or_else(|e| e.into_inner());
        let opens = inner.files.open_counts();
        let locks = inner.locks.held();
        let pieces = opens.len().max(locks.len()).div_ceil(RECLAIM_PIECE_MAX).max(1);
        let (mut opens_lost, mut locks_lost) = (0, Vec::new());
        for piece in 0..pieces {
            let part = |len: usize| {
                (piece * RECLAIM_PIECE_MAX).min(len)..((piece + 1) * RECLAIM_PIECE_MAX).min(len)
            };
            let request = MetaRequest::Reclaim {
                client: inner.locks.id(),
                first: piece == 0,
                opens: opens[part(opens.len())].to_vec(),
                locks: locks[part(locks.len())].to_vec(),
            };
            match self.meta(request)? {
                MetaReply::Reclaimed { opens_lost: o, locks_lost: l } => {
                    opens_lost += o;
                    locks_lost.extend(l);
                }
                other => return Err(unexpected(&other)),
            }
        }
        inner.locks.lost(&locks_lost);
        if opens_lost > 0 || !locks_lost.is_empty() {
            tracing::error!(
                opens_lost,
                locks_lost = locks_lost.len(),
                "the restarted metadata service did not take back everything this client held: \
                 files unlinked while open are gone, and the processes that held the lost \
                 locks are not told"
            );
        } else {
            tracing::info!(
                opens = opens.len(),
                locks = locks.len(),
                "told the restarted metadata service what this client holds"
            );
        }
        Ok(())
    }
}
