//! Group commit of chunk-map changes into redb.
//!
//! redb has one writer at a time, so each caller queues its change and the first waiter becomes
//! the leader: it takes every queued change, applies them all in one write transaction
//! (non-durable: visible at once, written out by the next durable commit), and wakes the others.
//! A failed commit poisons the committer: every later change is refused, as a failed fsync
//! must not be retried as if nothing happened.

use std::sync::{Condvar, Mutex, MutexGuard};

use redb::{Database, Durability, ReadableDatabase, TableDefinition};

use crate::EngineError;

/// The chunk map: (object id, chunk index) -> encoded [`crate::record::ChunkRecord`].
pub(crate) const CHUNKS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("chunks");
/// Engine identity and settings: name -> postcard bytes.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// One change to the chunk map.
#[derive(Debug)]
pub(crate) enum MapOp {
    Put((u64, u64), Vec<u8>),
    Delete((u64, u64)),
}

#[derive(Debug, Default)]
struct Queue {
    ops: Vec<MapOp>,
    enqueued: u64,
    committed: u64,
    leader: bool,
    failed: Option<String>,
    /// `committed` as of the last durable commit.
    durable_upto: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Committer {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Held while a transaction commits; a sync holds it across the array flush and the durable
    /// commit so that no commit lands between them (its data would not be flushed).
    commit_lock: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Committer {
    /// Applies `op` and returns once it is committed (visible to readers), not yet durable.
    pub(crate) fn commit(&self, db: &Database, op: MapOp) -> Result<(), EngineError> {
        self.commit_all(db, vec![op])
    }

    /// Applies `ops` (in one transaction) and returns once they are committed.
    pub(crate) fn commit_all(&self, db: &Database, ops: Vec<MapOp>) -> Result<(), EngineError> {
        let mut q = lock(&self.queue);
        q.ops.extend(ops);
        q.enqueued += 1;
        let ticket = q.enqueued;
        loop {
            if q.committed >= ticket {
                return Ok(());
            }
            if let Some(reason) = &q.failed {
                return Err(EngineError::Poisoned(reason.clone()));
            }
            if !q.leader {
                q.leader = true;
                let batch = std::mem::take(&mut q.ops);
                let upto = q.enqueued;
                drop(q);
                let result = {
                    let _commit = lock(&self.commit_lock);
                    apply(db, batch)
                };
                q = lock(&self.queue);
                q.leader = false;
                match result {
                    Ok(()) => q.committed = upto,
                    Err(e) => {
                        tracing::error!("chunk map commit failed, target goes read-only: {e}");
                        q.failed = Some(format!("chunk map commit failed: {e}"));
                    }
                }
                self.wake.notify_all();
                continue;
            }
            q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Runs `flush` (the array flush) and then a durable commit, with no commit in between,
    /// then `done` with the outcome, still under the commit lock: a sync that waited for this
    /// one sees everything `done` did.
    pub(crate) fn durable(
        &self,
        db: &Database,
        flush: impl FnOnce() -> Result<(), EngineError>,
        done: impl FnOnce(bool),
    ) -> Result<(), EngineError> {
        self.check()?;
        let _commit = lock(&self.commit_lock);
        // No commit runs while the commit lock is held: this is what the durable commit covers.
        let upto = lock(&self.queue).committed;
        let result = flush().and_then(|()| {
            let mut tx = db.begin_write()?;
            tx.set_durability(Durability::Immediate)?;
            tx.commit()?;
            Ok(())
        });
        done(result.is_ok());
        if result.is_ok() {
            let mut q = lock(&self.queue);
            q.durable_upto = q.durable_upto.max(upto);
        }
        if let Err(e) = &result {
            tracing::error!("sync failed, target goes read-only: {e}");
            lock(&self.queue).failed.get_or_insert_with(|| format!("sync failed: {e}"));
        }
        result
    }

    /// Whether a change was queued since the last durable commit covered everything.
    pub(crate) fn has_changes_to_sync(&self) -> bool {
        let q = lock(&self.queue);
        q.enqueued > q.durable_upto
    }

    /// Err once a commit or sync has failed.
    pub(crate) fn check(&self) -> Result<(), EngineError> {
        match &lock(&self.queue).failed {
            Some(reason) => Err(EngineError::Poisoned(reason.clone())),
            None => Ok(()),
        }
    }
}

fn apply(db: &Database, batch: Vec<MapOp>) -> Result<(), EngineError> {
    let mut tx = db.begin_write()?;
    tx.set_durability(Durability::None)?;
    {
        let mut table = tx.open_table(CHUNKS)?;
        for op in batch {
            match op {
                MapOp::Put(key, value) => {
                    table.insert(key, value.as_slice())?;
                }
                MapOp::Delete(key) => {
                    table.remove(key)?;
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
