//! Stria's metadata service as a library: the namespace (inodes, directory entries, symlinks,
//! hard links, xattrs, permissions, layouts, small-file data and usage counters) in an embedded
//! ACID store (redb). Every mutation is one write transaction.
//!
//! It owns names and attributes only: it never touches chunk data. Where an operation frees
//! data (unlink, truncate, purge) it returns what the caller must remove from storage. The
//! record formats and transaction rules are in `docs/internals/meta.md`.

mod data;
mod error;
mod names;
mod namespace;
mod perm;
// Public only so the fuzz targets (crates/fuzzing) can reach the decoder; not an API.
#[doc(hidden)]
pub mod record;
mod rename;
pub mod service;
mod stats;
mod store;
mod types;
mod xattr;

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use redb::{Database, Durability, ReadableDatabase, WriteTransaction};
use stria_proto::fs::{Ino, LayoutPolicy, ROOT_INO, TargetId};

pub use error::{MetaError, Result};
pub use types::*;

use record::{Body, DirBody, FIRST_SEQ, Inode};
use store::{Deltas, Rx, Tx};

/// Maps a pool name to the targets it has now (from mgmt's registry).
pub type TargetResolver = Arc<dyn Fn(&str) -> Vec<TargetId> + Send + Sync>;
/// The clock timestamps come from (a seam for tests).
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// When a committed mutation reaches the disk.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Commit {
    /// Every mutation is on disk when it returns (fsync per transaction).
    #[default]
    Durable,
    /// Mutations are atomic and visible at once but reach the disk only at the next
    /// [`Meta::sync`] or durable commit (every [`LAZY_COMMITS_PER_SYNC`]-th commit is one);
    /// a crash loses the ones since (never half of one).
    Lazy,
}

/// How to open a [`Meta`].
#[derive(Clone)]
pub struct MetaOptions {
    pub commit: Commit,
    /// The root directory's default layout policy when the store is created.
    pub root_policy: LayoutPolicy,
    /// Mode, owner and group of a new root directory.
    pub root_mode: u32,
    pub root_uid: u32,
    pub root_gid: u32,
    /// Most inodes the namespace holds (ENOSPC beyond).
    pub inodes_max: u64,
    pub resolver: TargetResolver,
    pub clock: Clock,
}

impl Default for MetaOptions {
    fn default() -> Self {
        MetaOptions {
            commit: Commit::Durable,
            root_policy: LayoutPolicy::default(),
            root_mode: 0o755,
            root_uid: 0,
            root_gid: 0,
            inodes_max: 1 << 40,
            resolver: Arc::new(|_| Vec::new()),
            clock: Arc::new(Timestamp::now),
        }
    }
}

impl fmt::Debug for MetaOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetaOptions")
            .field("commit", &self.commit)
            .field("root_policy", &self.root_policy)
            .field("root_mode", &format_args!("{:o}", self.root_mode))
            .field("inodes_max", &self.inodes_max)
            .finish_non_exhaustive()
    }
}

/// The metadata service: one namespace in one redb database. `Send + Sync`; every method
/// takes `&self`. Writers are serialized by redb; readers run on snapshots in parallel.
pub struct Meta {
    db: Database,
    options: MetaOptions,
    /// Open handles per inode (this process only): an unlinked file keeps its data until
    /// the last `release`. Locked before any write transaction that may drop an inode.
    opens: Mutex<HashMap<Ino, u32>>,
    /// Rotating start offset for picking targets, so files spread evenly.
    target_rotor: AtomicU64,
    /// Lazy commits since the last durable one.
    lazy_commits: AtomicU64,
    /// Usage counter changes of lazy commits, not yet in the counter tables (see
    /// [`Meta::commit`]).
    counters: Mutex<Deltas>,
}

/// In [`Commit::Lazy`] mode every this many commits one is made durable: redb frees the pages
/// of non-durable commits only at a durable one, so without it the file grows without bound.
pub const LAZY_COMMITS_PER_SYNC: u64 = 512;

impl fmt::Debug for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meta").field("options", &self.options).finish_non_exhaustive()
    }
}

impl Meta {
    /// Opens (or creates) the namespace stored in the file `path`.
    pub fn open(path: impl AsRef<Path>, options: MetaOptions) -> Result<Meta> {
        let db = Database::create(path)?;
        Meta::with_database(db, options)
    }

    /// A namespace in memory only (tests, benchmarks).
    pub fn open_in_memory(options: MetaOptions) -> Result<Meta> {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new())?;
        Meta::with_database(db, options)
    }

    fn with_database(db: Database, options: MetaOptions) -> Result<Meta> {
        let meta = Meta {
            db,
            options,
            opens: Mutex::new(HashMap::new()),
            target_rotor: AtomicU64::new(0),
            lazy_commits: AtomicU64::new(0),
            counters: Mutex::new(Deltas::default()),
        };
        meta.init()?;
        Ok(meta)
    }

    /// Creates the tables and the root directory on first open; checks the format after.
    fn init(&self) -> Result<()> {
        let txn = self.db.begin_write()?;
        {
            let mut tx = Tx::open(&txn)?;
            // Opening a table in a write transaction creates it; readers expect all of them.
            tx.create_tables()?;
            let format = tx.system(store::KEY_FORMAT)?;
            if format == 0 {
                let now = self.now();
                let root = Inode {
                    kind: FileKind::Dir,
                    mode: self.options.root_mode & MODE_BITS,
                    uid: self.options.root_uid,
                    gid: self.options.root_gid,
                    nlink: 2,
                    size: 0,
                    atime: now,
                    mtime: now,
                    ctime: now,
                    rdev: 0,
                    parent: ROOT_INO,
                    fileset: ROOT_INO,
                    version: 0,
                    ext: String::new(),
                    body: Body::Dir(DirBody {
                        next_seq: FIRST_SEQ,
                        policy: self.options.root_policy.clone(),
                    }),
                };
                tx.put_inode(ROOT_INO, &root)?;
                tx.system.table_mut()?.insert(store::KEY_FORMAT, store::STORE_FORMAT)?;
                tx.system.table_mut()?.insert(store::KEY_NEXT_INO, ROOT_INO + 1)?;
                tx.system.table_mut()?.insert(store::KEY_INODES_USED, 1)?;
            } else if format != store::STORE_FORMAT {
                return Err(MetaError::Corrupt(format!("unknown store format {format}")));
            }
            // Creates that a crash undid may have used numbers up to the reservation (and
            // written chunks under them): new files start past it.
            let reserved = tx.system(store::KEY_INO_RESERVED)?;
            if tx.system(store::KEY_NEXT_INO)? < reserved {
                tx.system.table_mut()?.insert(store::KEY_NEXT_INO, reserved)?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// How mutations are committed.
    pub fn commit_mode(&self) -> Commit {
        self.options.commit
    }

    /// Makes every committed mutation durable (for [`Commit::Lazy`]).
    pub fn sync(&self) -> Result<()> {
        let txn = self.db.begin_write()?;
        self.commit(txn, Deltas::default(), Commit::Durable)
    }

    pub(crate) fn now(&self) -> Timestamp {
        (self.options.clock)()
    }

    /// Runs `f` in one write transaction and commits it if `f` succeeds; on error nothing
    /// of it is kept.
    pub(crate) fn write<T>(&self, f: impl FnOnce(&mut Tx<'_>) -> Result<T>) -> Result<T> {
        let txn = self.db.begin_write()?;
        let mut commit = self.options.commit;
        if commit == Commit::Lazy
            && (self.lazy_commits.fetch_add(1, Ordering::Relaxed) + 1)
                .is_multiple_of(LAZY_COMMITS_PER_SYNC)
        {
            commit = Commit::Durable;
        }
        let (out, unchanged, deltas) = {
            let mut tx = Tx::open(&txn)?;
            let out = f(&mut tx)?;
            if tx.durable {
                commit = Commit::Durable;
            }
            (out, tx.unchanged, tx.take_deltas())
        };
        if unchanged && deltas.is_empty() {
            txn.abort()?;
        } else {
            self.commit(txn, deltas, commit)?;
        }
        Ok(out)
    }

    /// Commits `txn`, whose operation changed the usage counters by `deltas`: durably
    /// (`Commit::Durable`) or not (`Commit::Lazy`).
    ///
    /// A lazy commit leaves the counter tables alone and adds `deltas` to the in-memory
    /// [`Meta::counters`]: writing seven counter rows into two more tables cost each create
    /// and unlink about a fifth of its time. A durable commit writes everything pending into
    /// the tables, so at every durable commit, the state a crash returns to, the tables hold
    /// exactly the counts of the namespace (`docs/internals/meta.md`, "Usage counters").
    fn commit(&self, mut txn: WriteTransaction, deltas: Deltas, commit: Commit) -> Result<()> {
        // Taken while this transaction is the only writer and held through its commit: a
        // later durable commit cannot flush the pending counters between this commit and
        // the merge of its deltas.
        let mut pending = self.lock_counters();
        if commit == Commit::Lazy {
            txn.set_durability(Durability::None)?;
            txn.commit()?;
            pending.merge(deltas);
            return Ok(());
        }
        commit_counted(txn, &mut pending, deltas, Durability::Immediate)
    }

    /// Reads with the usage counters current: what lazy commits left pending is written into
    /// the counter tables first, so `f` finds them complete.
    pub(crate) fn read_counters<T>(&self, f: impl FnOnce(&Rx) -> Result<T>) -> Result<T> {
        self.flush_counters()?;
        self.read(f)
    }

    /// Writes the pending counter changes into the counter tables, in a lazy commit (only
    /// lazy commits leave changes pending).
    fn flush_counters(&self) -> Result<()> {
        if self.lock_counters().is_empty() {
            return Ok(());
        }
        let txn = self.db.begin_write()?;
        let mut pending = self.lock_counters();
        commit_counted(txn, &mut pending, Deltas::default(), Durability::None)
    }

    /// Recounts the usage counters from the inodes (a scan of every inode) and returns one
    /// line per counter that differs from the recount; with `repair` the counters are set to
    /// the recount, durably. For `stria fsck`: at every durable commit they must match.
    pub fn check_usage_counters(&self, repair: bool) -> Result<Vec<String>> {
        let mut txn = self.db.begin_write()?;
        // As in `commit`: the pending changes go into the tables of this transaction, and no
        // commit can add to them meanwhile.
        let mut pending = self.lock_counters();
        let found = {
            let mut tx = Tx::open(&txn)?;
            tx.flush_counters(pending.clone())?;
            tx.recount_usage(repair)?
        };
        if !repair || found.is_empty() {
            txn.abort()?;
            return Ok(found);
        }
        txn.set_durability(Durability::Immediate)?;
        txn.commit()?;
        *pending = Deltas::default();
        Ok(found)
    }

    pub(crate) fn read<T>(&self, f: impl FnOnce(&Rx) -> Result<T>) -> Result<T> {
        let rx = Rx::open(self.db.begin_read()?);
        f(&rx)
    }

    pub(crate) fn lock_opens(&self) -> MutexGuard<'_, HashMap<Ino, u32>> {
        self.opens.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_counters(&self) -> MutexGuard<'_, Deltas> {
        self.counters.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn next_rotor(&self) -> u64 {
        self.target_rotor.fetch_add(1, Ordering::Relaxed)
    }
}

/// Writes `pending` and `deltas` into the counter tables of `txn` and commits it with
/// `durability`; `pending` is emptied once the commit succeeded. The caller holds the
/// counters' lock and `txn` is the only writer, so nothing is added to `pending` meanwhile.
fn commit_counted(
    mut txn: WriteTransaction,
    pending: &mut Deltas,
    deltas: Deltas,
    durability: Durability,
) -> Result<()> {
    let mut all = pending.clone();
    all.merge(deltas);
    Tx::open(&txn)?.flush_counters(all)?;
    txn.set_durability(durability)?;
    txn.commit()?;
    *pending = Deltas::default();
    Ok(())
}

impl Drop for Meta {
    /// redb makes the lazy commits durable when the database closes: the counter changes
    /// they left pending go into the tables first, or the counts would be off after a reopen.
    fn drop(&mut self) {
        if let Err(error) = self.flush_counters() {
            tracing::warn!(%error, "usage counters not written at close: they may not match the files after the next open");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Meta>();
    }
}
