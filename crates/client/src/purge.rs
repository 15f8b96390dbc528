//! Removing the chunks of released inodes, only once their release is durable.
//!
//! The metadata service commits an unlink or a replacing rename lazily: a crash before its
//! next sync undoes it, and the name comes back. Had the chunks already gone, the file would
//! come back without its bytes. So a released inode's chunks wait in this queue; a drain makes
//! the metadata durable with one sync, then removes every queued inode's chunks. One sync
//! covers a whole batch, so removing many files costs few syncs.
//!
//! A drain runs in the background at least every [`DRAIN_EVERY`], at once when
//! [`BATCH_MAX`] inodes wait, and before anything that must see the space back: `fsync` of a
//! directory, `statfs`, a write refused for lack of space, and the client's shutdown. A crash
//! between the sync and the removal leaves chunks no file owns; `stria up` frees those when
//! it starts after a crash.
//!
//! Each release is queued with the metadata service's epoch that acknowledged it. A sync
//! answered under another epoch means the service restarted after losing unsynced changes,
//! perhaps this release: the name may be back, so those chunks are kept (if the release had
//! been durable after all, the recovery after that crash frees them).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stria_proto::fs::{FileLayout, FsStatus, Ino, ObjectId, TargetId};
use stria_proto::wire::{Epoch, MetaRequest, OBJECTS_REMOVE_MAX, ObjectsRemove};
use tokio::sync::Notify;

use crate::FsResult;
use crate::data::distinct_targets;
use crate::transport::{MetaConn, StorageConns};

/// Most released inodes waiting before a drain starts by itself. Each drain costs a durable
/// metadata commit, during which unlinks wait: at 256, removing 4 KiB files at 16k/s through
/// the mount made 60 of them a second. At 4096 the 200 ms timer starts most drains instead,
/// and the same removes ran at 17.5k/s against 16k (mdbench, 4 alternated pairs; fdatasyncs
/// of the node halved).
pub(crate) const BATCH_MAX: usize = 4096;
/// Longest a released inode's chunks wait.
pub(crate) const DRAIN_EVERY: Duration = Duration::from_millis(200);

/// A released inode, its layout, and the epoch its release was acknowledged under.
type Queued = (Ino, FileLayout, Epoch);

#[derive(Debug)]
pub(crate) struct Purger {
    meta: Arc<MetaConn>,
    storage: StorageConns,
    queue: Mutex<Vec<Queued>>,
    /// One drain at a time, so a drain that returns has removed everything queued before it.
    draining: tokio::sync::Mutex<()>,
    wake: Notify,
}

impl Purger {
    pub fn new(meta: Arc<MetaConn>, storage: StorageConns) -> Arc<Purger> {
        Arc::new(Purger {
            meta,
            storage,
            queue: Mutex::new(Vec::new()),
            draining: tokio::sync::Mutex::new(()),
            wake: Notify::new(),
        })
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<Queued>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_empty(&self) -> bool {
        self.queue().is_empty()
    }

    /// Queues the chunks of a released inode.
    pub fn push(&self, ino: Ino, layout: FileLayout, epoch: Epoch) {
        let waiting = {
            let mut queue = self.queue();
            queue.push((ino, layout, epoch));
            queue.len()
        };
        if waiting >= BATCH_MAX {
            self.wake.notify_one();
        }
    }

    /// Makes every queued release durable, then removes the chunks. On failure the inodes
    /// stay queued for the next drain.
    pub async fn drain(&self) -> FsResult<()> {
        self.sync_and_drain(false).await
    }

    /// Makes every metadata change durable (one sync, whether or not anything is queued),
    /// then removes the queued chunks.
    pub async fn sync(&self) -> FsResult<()> {
        self.sync_and_drain(true).await
    }

    async fn sync_and_drain(&self, always_sync: bool) -> FsResult<()> {
        let _one = self.draining.lock().await;
        let batch = std::mem::take(&mut *self.queue());
        if batch.is_empty() && !always_sync {
            return Ok(());
        }
        let synced_under = match self.meta.call_at(MetaRequest::Sync).await {
            Ok((epoch, _)) => epoch,
            Err(error) => {
                self.queue().extend(batch);
                return Err(error);
            }
        };
        let batch: Vec<Queued> = batch
            .into_iter()
            .filter(|(ino, _, released_under)| {
                let kept = *released_under != synced_under;
                if kept {
                    tracing::warn!(
                        ino,
                        "the metadata service restarted before this release was durable: \
                         keeping the file's chunks"
                    );
                }
                !kept
            })
            .collect();
        // One request per target for the whole batch: the target removes every object's
        // chunks with one chunk-map commit.
        let mut by_target: BTreeMap<TargetId, Vec<ObjectId>> = BTreeMap::new();
        for (ino, layout, _) in &batch {
            for target in distinct_targets(layout) {
                by_target.entry(target).or_default().push(ObjectId(*ino));
            }
        }
        let mut removals = tokio::task::JoinSet::new();
        for (target, objects) in by_target {
            for objects in objects.chunks(OBJECTS_REMOVE_MAX) {
                let storage = self.storage.clone();
                let request = ObjectsRemove { target, objects: objects.to_vec() };
                removals.spawn(async move { (target, storage.objects_remove(request).await) });
            }
        }
        let mut result = Ok(());
        let mut failed_targets = BTreeSet::new();
        let mut lost_track = false;
        while let Some(joined) = removals.join_next().await {
            let Ok((target, removed)) = joined else {
                lost_track = true;
                result = Err(FsStatus::Io);
                continue;
            };
            if let Err(error) = removed {
                tracing::warn!(%target, %error, "removing released files' chunks failed; retrying later");
                failed_targets.insert(target);
                result = Err(error);
            }
        }
        if lost_track || !failed_targets.is_empty() {
            // Removal is idempotent: the inodes with a chunk on a failed target go back whole.
            let again = batch.into_iter().filter(|(_, layout, _)| {
                lost_track || distinct_targets(layout).iter().any(|t| failed_targets.contains(t))
            });
            self.queue().extend(again);
        }
        result
    }

    /// The background drain: wakes on a full batch or every [`DRAIN_EVERY`]; stops once the
    /// client is gone (only the task still holds the purger).
    pub async fn run(self: Arc<Purger>) {
        loop {
            let _ = tokio::time::timeout(DRAIN_EVERY, self.wake.notified()).await;
            let _ = self.drain().await;
            if Arc::strong_count(&self) == 1 {
                return;
            }
        }
    }
}
