//! What clients held when the service restarted: their open handles and byte-range locks live
//! in memory only, so a restarted service asks its clients to tell them again (as NFSv4's
//! reclaim). A client notices the restart by the new `Instance` its replies carry and sends
//! `Reclaim`.
//!
//! Until the clients of the last run have reclaimed (the grace period), the service cannot
//! tell an unopened file from one a client has open, nor a free range from a lock yet to be
//! reclaimed: a last unlink keeps the file as an orphan, orphans are not purged, and new locks
//! wait. The grace period lasts a lock lease at most (every live client talks to the service
//! within one). After a clean stop the service knows which clients held anything and ends it
//! as soon as they all have reclaimed; with none, there is none; after a crash it lasts the
//! whole lease.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use stria_proto::fs::{FsStatus, Ino};
use stria_proto::wire::ReclaimedLock;

use crate::opens::Grace;
use crate::store::{KEY_CLEAN_STOP, KEY_RECLAIM_PREFIX};
use crate::{Meta, MetaError, Result};

/// What a [`Meta::reclaim`] could not take back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReclaimLoss {
    /// Open handles of files that no longer exist.
    pub opens: u32,
    /// Locks refused: another owner holds a conflicting one, or the grace period is over.
    pub locks: Vec<ReclaimedLock>,
}

impl Meta {
    /// Starts serving: decides the grace period from how the last run ended (see the module
    /// doc), and marks the store as serving, durably, so that a crash from now on is known
    /// at the next start. `lease` is the longest grace period. The orphans of the last run
    /// are purged by [`Meta::expire_clients`] once it is over.
    pub fn begin_serving(&self, lease: Duration) -> Result<()> {
        let mut opens = self.lock_opens();
        let (clean, awaited) = self.write(|tx| {
            let clean = tx.system(KEY_CLEAN_STOP)? == 1;
            let mut awaited = HashSet::new();
            for (key, _) in tx.system_with_prefix(KEY_RECLAIM_PREFIX)? {
                if let Ok(client) = u64::from_str_radix(&key[KEY_RECLAIM_PREFIX.len()..], 16) {
                    awaited.insert(client);
                }
                tx.remove_system(&key)?;
            }
            tx.set_system(KEY_CLEAN_STOP, 0)?;
            Ok((clean, awaited))
        })?;
        self.sync()?;
        let grace = match (clean, awaited.is_empty()) {
            (true, true) => Grace::new(None, None),
            (true, false) => Grace::new(Some(Instant::now() + lease), Some(awaited.clone())),
            (false, _) => Grace::new(Some(Instant::now() + lease), None),
        };
        if !clean {
            tracing::info!(
                grace_s = lease.as_secs(),
                "the last run did not stop cleanly: clients may reclaim their opens and locks \
                 meanwhile, and new locks wait"
            );
        } else if !awaited.is_empty() {
            tracing::info!(
                clients = awaited.len(),
                "waiting for the clients of the last run to reclaim their opens and locks"
            );
        }
        opens.begin(grace);
        Ok(())
    }

    /// Whether clients of the last run may still reclaim (new locks wait meanwhile).
    pub fn in_grace(&self) -> bool {
        self.lock_opens().in_grace()
    }

    /// Takes back what `client` held before the restart: `opens` replace the opens counted
    /// for it (`first`) or add to them; `locks` are kept where the owner still holds them and
    /// granted during the grace period where nothing conflicts.
    pub fn reclaim(
        &self,
        client: u64,
        first: bool,
        opens: &[(Ino, u32)],
        locks: &[ReclaimedLock],
    ) -> Result<ReclaimLoss> {
        let mut loss = ReclaimLoss::default();
        let mut table = self.lock_opens();
        let in_grace = table.in_grace();
        let mut kept = Vec::with_capacity(opens.len());
        self.read(|rx| {
            for &(ino, count) in opens {
                match rx.inode(ino) {
                    Ok(_) => kept.push((ino, count)),
                    Err(MetaError::Fs { status: FsStatus::NotFound, .. }) => loss.opens += count,
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })?;
        // Locks first, while the open-handle map is held: the grace period cannot end (by
        // this reclaim or by time) between `in_grace` and the grant, so no new lock slips
        // in over one being reclaimed.
        loss.locks = self.locks.reclaim(client, locks, in_grace);
        table.reclaim(client, first, &kept);
        drop(table);
        if loss.opens > 0 || !loss.locks.is_empty() {
            tracing::warn!(
                client,
                opens_lost = loss.opens,
                locks_lost = loss.locks.len(),
                "a client could not take back everything it held before the restart"
            );
        }
        Ok(loss)
    }

    /// `client` stops: its opens count as closed and its locks go.
    pub fn drop_client(&self, client: u64) {
        self.drop_client_opens(client);
        self.locks.drop_client(client);
    }

    /// Records, durably, that the service stops cleanly, with the clients that hold opens or
    /// locks now: the next run waits for them to reclaim (and only for them). Stopped during
    /// a grace period, the clients still awaited are waited for again; if those are unknown
    /// (it followed a crash) the next run gets the whole grace period, as after a crash.
    pub fn record_clean_stop(&self) -> Result<()> {
        let opens = self.lock_opens();
        let awaited = opens.awaited();
        let mut holders: Vec<u64> = opens.clients().chain(self.locks.holders()).collect();
        if let Some(Some(awaited)) = &awaited {
            holders.extend(awaited);
        }
        holders.sort_unstable();
        holders.dedup();
        let clean = !matches!(awaited, Some(None));
        self.write(|tx| {
            for client in &holders {
                tx.set_system(&format!("{KEY_RECLAIM_PREFIX}{client:016x}"), 1)?;
            }
            tx.set_system(KEY_CLEAN_STOP, u64::from(clean))
        })?;
        drop(opens);
        self.sync()
    }
}
