//! Batched commits of chunk-map changes into redb.
//!
//! A change is staged, not committed: it waits in memory with the others until
//! [`PENDING_MAX`] of them have gathered or a sync makes everything durable; then one write
//! transaction applies them all. Commits were never durable on their own (a crash rolls the map
//! back to the last durable commit either way), so a staged change is as safe as a
//! non-durable commit, and much cheaper: a redb write transaction costs more than the 4 KiB
//! write it records, and a lone writer (one NBD connection, one FUSE writer) never had company
//! to share it with.
//!
//! Readers of single records look in the staged changes before the map
//! ([`Committer::staged`]); scans merge them into what they read
//! ([`Committer::read_with_staged`]).
//! A failed commit poisons the committer: every later change is refused, as a failed fsync must
//! not be retried as if nothing happened. What it failed to commit stays staged, so reads go on
//! returning what writers were told was written, until the target is reopened (and the map is
//! back at its last durable commit).

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, MutexGuard};

use redb::{Database, Durability, ReadTransaction, ReadableDatabase, TableDefinition};

use crate::EngineError;
use crate::hash::WordHash;
use crate::record::ChunkRecord;

/// The chunk map: (object id, chunk index) -> encoded [`crate::record::ChunkRecord`].
pub(crate) const CHUNKS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("chunks");
/// Engine identity and settings: name -> postcard bytes.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// Staged changes that make a commit. Random 4 KiB writes re-stage the record of their chunk
/// each time (a fragmented 1 MiB chunk's record is about 3 KiB), and a change of a chunk
/// already in the batch costs nothing more: the larger the batch, the more of them. A batch of
/// 1024 records of fragmented chunks encodes to about 3 MiB, committed in a few milliseconds.
/// Measured with fio's `nbd` engine (4 KiB random writes, iodepth 32, 2 GiB volume, RAID 0 of
/// 5 file drives; docs/internals/engine.md): 64 → 1024 took 40-45k to 49-58k IOPS.
pub(crate) const PENDING_MAX: usize = 1024;

/// A key of the chunk map and its change: the new record, or `None` for a removal.
pub(crate) type Change = ((u64, u64), Option<Arc<ChunkRecord>>);

#[derive(Debug, Default)]
struct Staged {
    /// The newest staged change of each key: the record, or `None` for a removal.
    changes: HashMap<(u64, u64), Option<Arc<ChunkRecord>>, WordHash>,
    /// Changes staged so far, and how many of them the last durable commit covered.
    staged: u64,
    durable_upto: u64,
    failed: Option<String>,
    /// A sync is between taking its batch and dropping what it committed: no other commit may
    /// run (a durable commit makes every earlier commit durable, and those of changes staged
    /// after the sync began may name blocks its flush did not cover).
    syncing: bool,
}

impl Staged {
    /// Every staged change, for a commit.
    fn batch(&self) -> Vec<Change> {
        self.changes.iter().map(|(&key, rec)| (key, rec.clone())).collect()
    }
}

#[derive(Debug, Default)]
pub(crate) struct Committer {
    staged: Mutex<Staged>,
    /// Held to stage a change and across every commit but a sync's; a sync holds it while it
    /// takes its batch and the parked blocks, so that every parked block it frees was replaced
    /// by a change in its batch.
    commit_lock: Mutex<()>,
    /// One sync at a time.
    sync_lock: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Committer {
    /// Stages `change`; readers see it at once. Commits the batch when it is full.
    pub(crate) fn commit(&self, db: &Database, change: Change) -> Result<(), EngineError> {
        self.commit_all(db, vec![change])
    }

    /// Stages `changes`, in order; commits the batch when it is full.
    pub(crate) fn commit_all(
        &self,
        db: &Database,
        changes: Vec<Change>,
    ) -> Result<(), EngineError> {
        let _commit = lock(&self.commit_lock);
        let full = {
            let mut staged = lock(&self.staged);
            if let Some(reason) = &staged.failed {
                return Err(EngineError::Poisoned(reason.clone()));
            }
            for (key, change) in changes {
                staged.changes.insert(key, change);
                staged.staged += 1;
            }
            // While a sync runs, changes pile up: the first change after it commits them.
            !staged.syncing && staged.changes.len() >= PENDING_MAX
        };
        if full { self.commit_staged(db) } else { Ok(()) }
    }

    /// The staged change of `key`, if any: `Some(None)` when it was removed.
    pub(crate) fn staged(&self, key: (u64, u64)) -> Option<Option<Arc<ChunkRecord>>> {
        lock(&self.staged).changes.get(&key).cloned()
    }

    /// A read transaction of the map and the changes staged over it in `range`, by key: the
    /// two together are the map as of now. Taken under the staged lock, which a commit holds to
    /// drop what it committed, so no change is in both halves with different values or in
    /// neither.
    pub(crate) fn read_with_staged(
        &self,
        db: &Database,
        range: &RangeInclusive<(u64, u64)>,
    ) -> Result<(ReadTransaction, Vec<Change>), EngineError> {
        let staged = lock(&self.staged);
        let mut changes: Vec<Change> = staged
            .changes
            .iter()
            .filter(|(key, _)| range.contains(key))
            .map(|(&key, rec)| (key, rec.clone()))
            .collect();
        let tx = db.begin_read()?;
        drop(staged);
        changes.sort_unstable_by_key(|&(key, _)| key);
        Ok((tx, changes))
    }

    /// Applies the staged changes in one transaction and drops them once it has committed
    /// (until then readers find them staged). The caller holds the commit lock, so nothing is
    /// staged meanwhile.
    fn commit_staged(&self, db: &Database) -> Result<(), EngineError> {
        let batch: Vec<Change> = {
            let staged = lock(&self.staged);
            if let Some(reason) = &staged.failed {
                return Err(EngineError::Poisoned(reason.clone()));
            }
            staged.batch()
        };
        match apply(db, &batch, Durability::None) {
            Ok(()) => {
                lock(&self.staged).changes.clear();
                Ok(())
            }
            Err(e) => {
                tracing::error!("chunk map commit failed, target goes read-only: {e}");
                lock(&self.staged)
                    .failed
                    .get_or_insert_with(|| format!("chunk map commit failed: {e}"));
                Err(e)
            }
        }
    }

    /// A sync: takes the staged changes and, with nothing staged in between, runs
    /// `take_parked` (the blocks those changes replaced); then, with writers free to go on
    /// staging, runs `flush` (the array flush) and commits the changes it took durably; then
    /// drops from the staged changes those it committed (not those staged again since), and
    /// hands what `take_parked` returned to `settle` with the outcome (to free or put back).
    /// Syncs run one at a time, `settle` included, and no other commit runs until this one is
    /// done.
    pub(crate) fn durable<P>(
        &self,
        db: &Database,
        take_parked: impl FnOnce() -> P,
        flush: impl FnOnce() -> Result<(), EngineError>,
        settle: impl FnOnce(P, bool),
    ) -> Result<(), EngineError> {
        let _one = lock(&self.sync_lock);
        let (batch, upto, parked) = {
            let _commit = lock(&self.commit_lock);
            let mut staged = lock(&self.staged);
            if let Some(reason) = &staged.failed {
                return Err(EngineError::Poisoned(reason.clone()));
            }
            staged.syncing = true;
            let batch = staged.batch();
            let upto = staged.staged;
            drop(staged);
            (batch, upto, take_parked())
        };
        let result = flush().and_then(|()| apply(db, &batch, Durability::Immediate));
        let mut staged = lock(&self.staged);
        staged.syncing = false;
        match &result {
            Ok(()) => {
                for (key, committed) in batch {
                    let unchanged =
                        staged.changes.get(&key).is_some_and(|now| match (now, &committed) {
                            (Some(now), Some(committed)) => Arc::ptr_eq(now, committed),
                            (None, None) => true,
                            _ => false,
                        });
                    if unchanged {
                        staged.changes.remove(&key);
                    }
                }
                staged.durable_upto = staged.durable_upto.max(upto);
            }
            Err(e) => {
                tracing::error!("sync failed, target goes read-only: {e}");
                staged.failed.get_or_insert_with(|| format!("sync failed: {e}"));
            }
        }
        drop(staged);
        settle(parked, result.is_ok());
        result
    }

    /// Whether a change was staged since the last durable commit covered everything.
    pub(crate) fn has_changes_to_sync(&self) -> bool {
        let staged = lock(&self.staged);
        staged.staged > staged.durable_upto
    }

    /// Err once a commit or sync has failed.
    pub(crate) fn check(&self) -> Result<(), EngineError> {
        match &lock(&self.staged).failed {
            Some(reason) => Err(EngineError::Poisoned(reason.clone())),
            None => Ok(()),
        }
    }
}

fn apply(db: &Database, batch: &[Change], durability: Durability) -> Result<(), EngineError> {
    let mut tx = db.begin_write()?;
    tx.set_durability(durability)?;
    {
        let mut table = tx.open_table(CHUNKS)?;
        for (key, change) in batch {
            match change {
                Some(rec) => {
                    table.insert(*key, rec.encode().as_slice())?;
                }
                None => {
                    table.remove(*key)?;
                }
            }
        }
    }
    tx.commit()?;
    Ok(())
}

/// Reads one record's bytes from the committed map.
pub(crate) fn get(db: &Database, key: (u64, u64)) -> Result<Option<Vec<u8>>, EngineError> {
    let tx = db.begin_read()?;
    let table = match tx.open_table(CHUNKS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(table.get(key)?.map(|v| v.value().to_vec()))
}

#[cfg(test)]
mod tests {
    use redb::backends::InMemoryBackend;

    use super::*;

    fn db() -> Database {
        Database::builder().create_with_backend(InMemoryBackend::new()).expect("in-memory redb")
    }

    fn record(len_bytes: u32) -> Arc<ChunkRecord> {
        Arc::new(ChunkRecord { len_bytes, blocks: Vec::new() })
    }

    fn committed_len(db: &Database, key: (u64, u64)) -> Option<u32> {
        get(db, key)
            .expect("read")
            .map(|bytes| ChunkRecord::decode(&bytes).expect("decode").len_bytes)
    }

    #[test]
    fn staged_changes_are_seen_at_once_and_committed_in_batches() {
        let db = db();
        let committer = Committer::default();
        // Below the batch size: staged, visible through `staged`, not yet in the map.
        for i in 0..PENDING_MAX as u64 - 1 {
            committer.commit(&db, ((1, i), Some(record(i as u32)))).expect("stage");
        }
        assert_eq!(committer.staged((1, 5)).flatten().map(|r| r.len_bytes), Some(5));
        assert_eq!(committed_len(&db, (1, 5)), None);
        // A removal staged over a staged record hides it.
        committer.commit(&db, ((1, 7), None)).expect("stage");
        assert!(matches!(committer.staged((1, 7)), Some(None)));
        // The batch is full now: committed, nothing left staged.
        committer.commit(&db, ((2, 0), Some(record(4096)))).expect("stage");
        assert!(committer.staged((1, 5)).is_none());
        assert_eq!(committed_len(&db, (1, 5)), Some(5));
        assert_eq!(committed_len(&db, (1, 7)), None);
        assert_eq!(committed_len(&db, (2, 0)), Some(4096));
        // A scan gets the staged part; a durable commit covers every change staged before it.
        committer.commit(&db, ((3, 0), Some(record(1)))).expect("stage");
        assert!(committer.has_changes_to_sync());
        let (_, staged) = committer.read_with_staged(&db, &((3, 0)..=(3, u64::MAX))).expect("read");
        assert_eq!(staged.len(), 1);
        committer.commit(&db, ((3, 1), Some(record(2)))).expect("stage");
        committer.durable(&db, || (), || Ok(()), |(), synced| assert!(synced)).expect("durable");
        assert_eq!(committed_len(&db, (3, 0)), Some(1));
        assert_eq!(committed_len(&db, (3, 1)), Some(2));
        assert!(!committer.has_changes_to_sync());
    }

    #[test]
    fn a_failed_sync_refuses_every_later_change() {
        let db = db();
        let committer = Committer::default();
        committer.commit(&db, ((1, 0), Some(record(1)))).expect("stage");
        let failed = committer.durable(
            &db,
            || (),
            || Err(EngineError::Poisoned("flush failed".into())),
            |(), synced| assert!(!synced),
        );
        assert!(failed.is_err());
        assert!(matches!(
            committer.commit(&db, ((1, 1), Some(record(1)))),
            Err(EngineError::Poisoned(_))
        ));
        // What was staged before stays visible: it was acknowledged.
        assert_eq!(committer.staged((1, 0)).flatten().map(|r| r.len_bytes), Some(1));
    }
}
