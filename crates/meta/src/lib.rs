//! Stria's metadata service as a library: the namespace (inodes, directory entries, symlinks,
//! hard links, xattrs, permissions, layouts, small-file data and usage counters) in an embedded
//! ACID store (redb). Every mutation is one write transaction.
//!
//! It owns names and attributes only: it never touches chunk data. Where an operation frees
//! data (unlink, truncate, purge) it returns what the caller must remove from storage. The
//! record formats and transaction rules are in `docs/internals/meta.md`.

pub mod changes;
mod data;
mod error;
pub mod locks;
mod names;
mod namespace;
mod perm;
// Public only so the fuzz targets (crates/fuzzing) can reach the decoder; not an API.
mod opens;
#[doc(hidden)]
pub mod reclaim;
pub mod record;
mod rename;
pub mod service;
pub mod sessions;
mod stats;
mod store;
mod types;
mod xattr;

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redb::{Database, Durability, ReadableDatabase, WriteTransaction};
use stria_proto::fs::{LayoutPolicy, ROOT_INO, TargetId};

pub use error::{MetaError, Result};
pub use types::*;

use record::{Body, DirBody, FIRST_SEQ, Inode};
use store::{Deltas, HeldTxn, Rx, Tx};

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
    /// [`Meta::sync`] or durable commit (one at least every [`LAZY_COMMITS_PER_SYNC`]
    /// mutations); a crash loses the ones since (never half of one). They are gathered into
    /// batches of up to [`BATCH_OPS_MAX`] mutations, one redb transaction each (see
    /// [`Meta::write`]).
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
    /// Open handles per inode and client (this process only, see `opens`): an unlinked file
    /// keeps its data until the last `release`. Locked before any write transaction that may
    /// drop an inode.
    opens: Mutex<opens::Opens>,
    /// Rotating start offset for picking targets, so files spread evenly.
    target_rotor: AtomicU64,
    /// Usage counter changes of lazy commits, not yet in the counter tables (see
    /// [`Meta::commit`]).
    counters: Mutex<Deltas>,
    /// The open write transaction and what it holds; its lock is the writers' lock (taken
    /// before `counters`, after `opens`).
    batch: Mutex<Batch>,
    /// Whether `batch` holds an open transaction: readers then read through it.
    batch_open: AtomicBool,
    /// The snapshot of the last commit, shared by the readers that find no batch open, with
    /// the tables they opened in it; dropped by every commit (see [`Meta::snapshot`]).
    snapshot: Mutex<Option<Arc<Rx<'static>>>>,
    /// Byte-range locks of every client (memory only, see `locks`).
    locks: locks::LockTable,
    /// The clients heard from lately (memory only, see `sessions`).
    sessions: sessions::Sessions,
}

/// In [`Commit::Lazy`] mode at least every this many mutations one commit is durable: redb
/// frees the pages of non-durable commits only at a durable one, so without it the file
/// grows without bound. Each such commit holds the writers' lock through its fsync: at 512,
/// creating 4 KiB files through the mount made about 35 of them a second (175 ms of fsync in
/// 2 s). 4096 (about 32 batches of garbage pages at most, a few MiB): creates 8,145, 7,989
/// and 8,303 → 8,688, 8,723 and 8,689/s, removes 17.6k, 17.3k and 17.7k → 19.5k, 19.6k and
/// 19.7k/s, alternated fresh nodes; the namespace file after mdbench was 7.7 MB either way.
pub const LAZY_COMMITS_PER_SYNC: u64 = 4096;

/// Most mutations gathered into one transaction ([`Commit::Lazy`]).
pub const BATCH_OPS_MAX: u64 = 128;

/// Oldest a batch gets before the next operation commits it ([`Commit::Lazy`]). While a
/// batch is open, readers share its lock; once it is committed they read snapshots again,
/// in parallel.
pub const BATCH_AGE_MAX: Duration = Duration::from_millis(5);

/// Mutations applied in one redb write transaction that is not committed yet.
///
/// A redb commit costs several times what a create does to the tables (the commit of each
/// mutation was about 40% of the metadata work of creating a small file), so in
/// [`Commit::Lazy`] mode mutations share a transaction until it holds [`BATCH_OPS_MAX`] of
/// them or is [`BATCH_AGE_MAX`] old. Each mutation is still all or nothing: one that fails
/// takes back its own changes ([`Tx::roll_back`]) and leaves the others in the batch.
#[derive(Default)]
struct Batch {
    /// The transaction, with the tables its mutations and readers opened.
    txn: Option<HeldTxn>,
    /// Mutations in `txn`.
    ops: u64,
    began: Option<Instant>,
    /// Counter changes of the mutations in `txn` (they join `Meta::counters` when it
    /// commits).
    deltas: Deltas,
    /// Mutations since the last durable commit.
    since_durable: u64,
}

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
            opens: Mutex::new(opens::Opens::default()),
            target_rotor: AtomicU64::new(0),
            counters: Mutex::new(Deltas::default()),
            batch: Mutex::new(Batch::default()),
            batch_open: AtomicBool::new(false),
            snapshot: Mutex::new(None),
            locks: locks::LockTable::default(),
            sessions: sessions::Sessions::default(),
        };
        meta.init()?;
        Ok(meta)
    }

    /// Creates the tables and the root directory on first open; checks the format after.
    fn init(&self) -> Result<()> {
        let txn = self.db.begin_write()?;
        {
            let mut tx = Tx::open(&txn);
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
                tx.set_system(store::KEY_FORMAT, store::STORE_FORMAT)?;
                tx.set_system(store::KEY_NEXT_INO, ROOT_INO + 1)?;
                tx.set_system(store::KEY_INODES_USED, 1)?;
                tx.set_system(store::KEY_CLEAN_STOP, 1)?;
            } else if format != store::STORE_FORMAT {
                return Err(MetaError::Corrupt(format!("unknown store format {format}")));
            }
            // Creates that a crash undid may have used numbers up to the reservation (and
            // written chunks under them): new files start past it.
            let reserved = tx.system(store::KEY_INO_RESERVED)?;
            if tx.system(store::KEY_NEXT_INO)? < reserved {
                tx.set_system(store::KEY_NEXT_INO, reserved)?;
            }
        }
        self.commit_txn(txn)
    }

    /// How mutations are committed.
    pub fn commit_mode(&self) -> Commit {
        self.options.commit
    }

    /// The byte-range locks of every client.
    pub fn locks(&self) -> &locks::LockTable {
        &self.locks
    }

    /// The clients heard from lately.
    pub fn sessions(&self) -> &sessions::Sessions {
        &self.sessions
    }

    /// Makes every committed mutation durable (for [`Commit::Lazy`]).
    pub fn sync(&self) -> Result<()> {
        let mut batch = self.lock_batch();
        // In lazy mode the batch is committed lazily, then made durable by an empty durable
        // commit: the fsync then runs with no batch open, so readers read snapshots instead of
        // waiting for the disk under the batch lock. (Its mutations were visible already.)
        self.seal(&mut batch, Commit::Lazy)?;
        self.durable_commit(&mut batch)
    }

    pub(crate) fn now(&self) -> Timestamp {
        (self.options.clock)()
    }

    /// Runs `f` as one mutation: all of it is kept if `f` succeeds, none of it if `f` fails.
    ///
    /// In [`Commit::Durable`] mode each mutation is a durable commit of its own. In
    /// [`Commit::Lazy`] mode it joins the open [`Batch`], which is committed once it is full
    /// or old (or a mutation must be durable at once); readers see it meanwhile, since they
    /// read through the batch while it is open.
    pub(crate) fn write<T>(&self, f: impl FnOnce(&mut Tx<'_>) -> Result<T>) -> Result<T> {
        let mut batch = self.lock_batch();
        if batch.txn.is_none() {
            batch.txn = Some(HeldTxn::new(self.db.begin_write()?));
            batch.began = Some(Instant::now());
            // Under Commit::Durable nothing is seen before its commit: readers keep reading
            // snapshots, in parallel with the fsync.
            if self.options.commit == Commit::Lazy {
                self.batch_open.store(true, Ordering::Release);
            }
        }
        let alone = batch.ops == 0;
        let held = batch.txn.as_mut().expect("begun above");
        let (result, kept, durable, deltas, rolled_back) = held.mutate(|tx| {
            // A panic is a bug, but the other mutations of the batch stay: this one is taken
            // back as if it had failed, then the panic goes on.
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| f(tx)));
            let deltas = tx.take_deltas();
            // "Nothing changed" keeps nothing either, as an aborted transaction did.
            let kept = matches!(result, Ok(Ok(_))) && !(tx.unchanged && deltas.is_empty());
            let rolled_back = if kept { Ok(()) } else { tx.roll_back() };
            (result, kept, tx.durable, deltas, rolled_back)
        });
        if !kept {
            if let Err(undo) = &rolled_back {
                tracing::error!(%undo, ops = batch.ops, "a metadata mutation could not be taken back: its batch is dropped (the mutations in it are lost, as in a crash)");
            }
            // A batch holding nothing else is let go (it cost no commit).
            if alone || rolled_back.is_err() {
                self.abort_batch(&mut batch);
            }
        }
        let out = match result {
            Ok(Ok(out)) => out,
            Ok(Err(error)) => return Err(error),
            Err(panic) => {
                // Let go of the lock first: it is not poisoned, the batch is whole.
                drop(batch);
                std::panic::resume_unwind(panic);
            }
        };
        if !kept {
            return rolled_back.map(|()| out);
        }
        batch.ops += 1;
        batch.since_durable += 1;
        batch.deltas.merge(deltas);
        if durable || self.options.commit == Commit::Durable {
            // Durable before anyone sees it (an inode-number reservation must be): one durable
            // commit of the batch, which readers wait for.
            self.seal(&mut batch, Commit::Durable)?;
        } else if batch.since_durable >= LAZY_COMMITS_PER_SYNC {
            // Only to let redb free pages (see LAZY_COMMITS_PER_SYNC): as `sync` does it. A
            // failed fsync is not this mutation's failure; the next mutation tries again.
            self.seal(&mut batch, Commit::Lazy)?;
            if let Err(error) = self.durable_commit(&mut batch) {
                tracing::warn!(%error, "periodic durable metadata commit failed; retried at the next mutation");
            }
        } else if batch.ops >= BATCH_OPS_MAX || batch.is_old() {
            self.seal(&mut batch, Commit::Lazy)?;
        }
        Ok(out)
    }

    /// Commits the open batch, if any, in one commit: durably (`Commit::Durable`) or not. A
    /// durable one is visible only once it is durable (redb), and readers wait for it under
    /// the batch lock meanwhile.
    fn seal(&self, batch: &mut Batch, commit: Commit) -> Result<()> {
        let Some(txn) = batch.txn.take() else {
            return Ok(());
        };
        let deltas = std::mem::take(&mut batch.deltas);
        let ops = std::mem::take(&mut batch.ops);
        batch.began = None;
        let committed = self.commit(txn.into_txn(), deltas, commit);
        // Cleared after the commit: a reader that finds no open batch reads a snapshot that
        // has everything the batch held.
        self.batch_open.store(false, Ordering::Release);
        if let Err(error) = &committed {
            tracing::error!(%error, ops, "metadata commit failed: the mutations of its batch are lost, as in a crash");
        }
        committed?;
        if commit == Commit::Durable {
            batch.since_durable = 0;
        }
        Ok(())
    }

    /// An empty durable commit, which makes every lazy commit before it durable too. The
    /// caller holds the batch lock and has no batch open.
    fn durable_commit(&self, batch: &mut Batch) -> Result<()> {
        let txn = self.db.begin_write()?;
        self.commit(txn, Deltas::default(), Commit::Durable)?;
        batch.since_durable = 0;
        Ok(())
    }

    /// Drops the open batch and every mutation in it.
    fn abort_batch(&self, batch: &mut Batch) {
        if let Some(txn) = batch.txn.take()
            && let Err(error) = txn.into_txn().abort()
        {
            tracing::warn!(%error, "metadata transaction abort failed");
        }
        batch.ops = 0;
        batch.began = None;
        batch.deltas = Deltas::default();
        self.batch_open.store(false, Ordering::Release);
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
            self.commit_txn(txn)?;
            pending.merge(deltas);
            return Ok(());
        }
        self.commit_counted(txn, &mut pending, deltas, Durability::Immediate)
    }

    /// Commits `txn`; readers that start after it read a new snapshot. Every commit of the
    /// store goes through here.
    fn commit_txn(&self, txn: WriteTransaction) -> Result<()> {
        let committed = txn.commit();
        // Also after a failed commit: which state it left is for redb to say.
        *self.lock_snapshot() = None;
        Ok(committed?)
    }

    /// The snapshot readers share while no batch is open: of the last commit, opened by the
    /// first reader after it. Opening a snapshot and its tables cost a stat through the mount
    /// about 7% of its CPU when every reader opened its own.
    ///
    /// A commit drops the shared one after it is done ([`Meta::commit_txn`]), under the same
    /// lock a reader opens a new one under. So a reader that starts after a commit has
    /// returned cannot get an older snapshot: one opened before the commit was dropped by it,
    /// and one opened after it has it.
    fn snapshot(&self) -> Result<Arc<Rx<'static>>> {
        let mut shared = self.lock_snapshot();
        if let Some(rx) = &*shared {
            return Ok(rx.clone());
        }
        let rx = Arc::new(Rx::open(self.db.begin_read()?));
        *shared = Some(rx.clone());
        Ok(rx)
    }

    /// A write transaction of its own for the holder of the writers' lock `batch`: the open
    /// batch is committed first.
    fn exclusive_txn(&self, batch: &mut Batch) -> Result<WriteTransaction> {
        self.seal(batch, Commit::Lazy)?;
        Ok(self.db.begin_write()?)
    }

    /// Reads with the usage counters current: what lazy commits left pending is written into
    /// the counter tables first, so `f` finds them complete.
    pub(crate) fn read_counters<T>(&self, f: impl FnOnce(&Rx<'_>) -> Result<T>) -> Result<T> {
        self.flush_counters()?;
        self.read(f)
    }

    /// Commits the open batch, and writes the pending counter changes into the counter
    /// tables, in a lazy commit (only lazy commits leave changes pending).
    fn flush_counters(&self) -> Result<()> {
        let mut batch = self.lock_batch();
        if batch.txn.is_none() && self.lock_counters().is_empty() {
            return Ok(());
        }
        let txn = self.exclusive_txn(&mut batch)?;
        let mut pending = self.lock_counters();
        self.commit_counted(txn, &mut pending, Deltas::default(), Durability::None)
    }

    /// Recounts the usage counters from the inodes (a scan of every inode) and returns one
    /// line per counter that differs from the recount; with `repair` the counters are set to
    /// the recount, durably. For `stria fsck`: at every durable commit they must match.
    pub fn check_usage_counters(&self, repair: bool) -> Result<Vec<String>> {
        let mut batch = self.lock_batch();
        let mut txn = self.exclusive_txn(&mut batch)?;
        // As in `commit`: the pending changes go into the tables of this transaction, and no
        // commit can add to them meanwhile.
        let mut pending = self.lock_counters();
        let found = {
            let mut tx = Tx::open(&txn);
            tx.flush_counters(pending.clone())?;
            tx.recount_usage(repair)?
        };
        if !repair || found.is_empty() {
            txn.abort()?;
            return Ok(found);
        }
        txn.set_durability(Durability::Immediate)?;
        self.commit_txn(txn)?;
        *pending = Deltas::default();
        batch.since_durable = 0;
        Ok(found)
    }

    /// Runs `f` on the namespace as it is now: through the open batch, or on a snapshot
    /// (in parallel with other readers) when none is open. A batch older than
    /// [`BATCH_AGE_MAX`] is committed first, so readers go back to snapshots soon after
    /// writes stop.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Rx<'_>) -> Result<T>) -> Result<T> {
        if self.batch_open.load(Ordering::Acquire) {
            let mut batch = self.lock_batch();
            if batch.txn.is_some() && batch.is_old() {
                self.seal(&mut batch, Commit::Lazy)?;
            }
            if let Some(txn) = &mut batch.txn {
                // A panicking reader must not poison the lock: that would drop the batch.
                let read = std::panic::catch_unwind(AssertUnwindSafe(|| txn.read(|rx| f(rx))));
                drop(batch);
                return read.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            }
        }
        f(&*self.snapshot()?)
    }

    pub(crate) fn lock_opens(&self) -> MutexGuard<'_, opens::Opens> {
        self.opens.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Writes `pending` and `deltas` into the counter tables of `txn` and commits it with
    /// `durability`; `pending` is emptied once the commit succeeded. The caller holds the
    /// counters' lock and `txn` is the only writer, so nothing is added to `pending` meanwhile.
    fn commit_counted(
        &self,
        mut txn: WriteTransaction,
        pending: &mut Deltas,
        deltas: Deltas,
        durability: Durability,
    ) -> Result<()> {
        let mut all = pending.clone();
        all.merge(deltas);
        Tx::open(&txn).flush_counters(all)?;
        txn.set_durability(durability)?;
        self.commit_txn(txn)?;
        *pending = Deltas::default();
        Ok(())
    }

    fn lock_counters(&self) -> MutexGuard<'_, Deltas> {
        self.counters.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_snapshot(&self) -> MutexGuard<'_, Option<Arc<Rx<'static>>>> {
        self.snapshot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The writers' lock. Poisoned, it is a panic in the middle of a commit: the batch is
    /// dropped rather than trusted (its mutations are lost, as in a crash).
    fn lock_batch(&self) -> MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(|poisoned| {
            self.batch.clear_poison();
            let mut batch = poisoned.into_inner();
            tracing::error!(ops = batch.ops, "a metadata commit panicked: its batch is dropped");
            self.abort_batch(&mut batch);
            batch
        })
    }

    pub(crate) fn next_rotor(&self) -> u64 {
        self.target_rotor.fetch_add(1, Ordering::Relaxed)
    }
}

impl Batch {
    fn is_old(&self) -> bool {
        self.began.is_some_and(|began| began.elapsed() >= BATCH_AGE_MAX)
    }
}

impl Drop for Meta {
    /// redb makes the lazy commits durable when the database closes: the open batch is
    /// committed and the counter changes left pending go into the tables first, or the
    /// counts would be off after a reopen.
    fn drop(&mut self) {
        if let Err(error) = self.flush_counters() {
            tracing::warn!(%error, "usage counters not written at close: they may not match the files after the next open");
        }
        // Before the database closes.
        *self.lock_snapshot() = None;
    }
}

#[cfg(test)]
mod tests {
    use redb::ReadableTable;
    use stria_proto::fs::{FsStatus, Ino};

    use super::*;

    #[test]
    fn meta_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Meta>();
    }

    /// A namespace in memory with lazy commits, so with batches.
    fn lazy_meta() -> Meta {
        let options = MetaOptions { commit: Commit::Lazy, ..MetaOptions::default() };
        Meta::open_in_memory(options).expect("open")
    }

    /// A lazy namespace with files `a` (committed: its create reserved inode numbers) and `b`
    /// (its create waits in the open batch); returns `a`'s inode.
    fn batch_with_two_creates() -> (Meta, Caller, Ino) {
        let meta = lazy_meta();
        let root = Caller::root();
        let a = meta.create(ROOT_INO, b"a", 0o644, &root).expect("create a").ino;
        meta.create(ROOT_INO, b"b", 0o644, &root).expect("create b");
        assert!(meta.lock_batch().ops > 0, "the create of b waits in the open batch");
        (meta, root, a)
    }

    /// Every row of every table, as text, through [`Meta::read`] (the open batch or a
    /// snapshot).
    fn dump(meta: &Meta) -> Vec<String> {
        fn rows<K, V>(name: &str, table: &impl ReadableTable<K, V>, out: &mut Vec<String>)
        where
            K: redb::Key + 'static,
            V: redb::Value + 'static,
            for<'a> K::SelfType<'a>: fmt::Debug,
            for<'a> V::SelfType<'a>: fmt::Debug,
        {
            for item in table.range::<K::SelfType<'_>>(..).expect("range") {
                let (key, value) = item.expect("row");
                out.push(format!("{name} {:?} = {:?}", key.value(), value.value()));
            }
        }
        meta.read(|rx| {
            let mut out = Vec::new();
            rows("inodes", rx.inodes()?, &mut out);
            rows("dentries", rx.dentries()?, &mut out);
            rows("dir_seq", rx.dir_seq()?, &mut out);
            rows("xattrs", rx.xattrs()?, &mut out);
            rows("usage", rx.usage()?, &mut out);
            rows("usage_ext", rx.usage_ext()?, &mut out);
            rows("orphans", rx.orphans()?, &mut out);
            rows("system", rx.system_table()?, &mut out);
            Ok(out)
        })
        .expect("dump")
    }

    #[test]
    fn a_failed_mutation_takes_back_its_own_changes_and_keeps_the_rest_of_its_batch() {
        let meta = lazy_meta();
        let root = Caller::root();
        let a = meta.create(ROOT_INO, b"a", 0o644, &root).expect("create a").ino;
        meta.setxattr(a, b"user.k", b"v1", XattrFlags::Any, &root).expect("setxattr");
        // Counter rows in the tables, so the failed mutation has some to change.
        meta.sync().expect("sync");
        meta.create(ROOT_INO, b"b", 0o644, &root).expect("create b");
        assert!(meta.lock_batch().ops > 0, "the create of b waits in the open batch");
        let before = dump(&meta);
        assert!(before.iter().any(|row| row.starts_with("usage ")), "{before:#?}");

        // A bit of every kind of change, then a failure.
        let failed: Result<()> = meta.write(|tx| {
            let rec = tx.inode(a)?;
            tx.put_xattr(a, b"user.k", b"v2")?;
            tx.put_xattr(a, b"user.new", b"x")?;
            tx.set_orphan(a, 7)?;
            tx.remove_dentry(ROOT_INO, b"a")?;
            let mut dir = tx.dir(ROOT_INO)?;
            tx.add_dentry(ROOT_INO, &mut dir, b"z", a, FileKind::File)?;
            tx.put_inode(ROOT_INO, &dir)?;
            let fresh = tx.alloc_ino(u64::MAX)?;
            tx.put_inode(fresh, &rec)?;
            tx.account(Some(&rec), None);
            let deltas = tx.take_deltas();
            tx.flush_counters(deltas)?;
            tx.free_inode(a)?;
            Err(error::fs(FsStatus::Io, "injected failure"))
        });
        assert_eq!(failed.expect_err("the mutation fails").status(), FsStatus::Io);
        assert_eq!(dump(&meta), before, "read through the open batch");
        assert!(meta.lock_batch().ops > 0, "the batch stays open with the create of b");
        meta.sync().expect("sync");
        // The durable commit wrote b's counter changes into the counter tables.
        let tables = |rows: Vec<String>| -> Vec<String> {
            rows.into_iter().filter(|row| !row.starts_with("usage")).collect()
        };
        assert_eq!(tables(dump(&meta)), tables(before), "read from the committed snapshot");
        assert_eq!(meta.usage_total().expect("usage").files, 2);
        assert!(meta.lookup(ROOT_INO, b"b", &root).is_ok());
        assert_eq!(meta.getxattr(a, b"user.k", &root).expect("xattr"), b"v1");
    }

    #[test]
    fn a_mutation_that_panics_is_taken_back_and_the_batch_lives_on() {
        let (meta, root, a) = batch_with_two_creates();
        let before = dump(&meta);
        let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let _: Result<()> = meta.write(|tx| {
                tx.put_xattr(a, b"user.half", b"done")?;
                tx.remove_dentry(ROOT_INO, b"a")?;
                panic!("a bug half way through a mutation");
            });
        }));
        assert!(panicked.is_err());
        assert!(!meta.batch.is_poisoned());
        assert_eq!(dump(&meta), before);
        meta.sync().expect("sync");
        assert!(meta.lookup(ROOT_INO, b"a", &root).is_ok());
        assert!(meta.lookup(ROOT_INO, b"b", &root).is_ok(), "the batch was kept");
    }

    #[test]
    fn a_reader_that_panics_leaves_the_batch_alone() {
        let (meta, root, _) = batch_with_two_creates();
        let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let _: Result<()> = meta.read(|_| panic!("a bug in a reader"));
        }));
        assert!(panicked.is_err());
        assert!(!meta.batch.is_poisoned());
        assert!(meta.lock_batch().ops > 0, "the batch is still open");
        meta.sync().expect("sync");
        assert!(meta.lookup(ROOT_INO, b"b", &root).is_ok());
    }

    #[test]
    fn a_mutation_that_changed_nothing_keeps_nothing() {
        let (meta, _, a) = batch_with_two_creates();
        let before = dump(&meta);
        meta.write(|tx| {
            tx.put_xattr(a, b"user.x", b"written, then declared unchanged")?;
            tx.unchanged = true;
            Ok(())
        })
        .expect("write");
        assert_eq!(dump(&meta), before);
        assert!(meta.lock_batch().ops > 0, "the batch is still open");
    }

    #[test]
    fn a_reader_that_starts_after_a_commit_reads_it_while_others_share_snapshots() {
        for commit in [Commit::Durable, Commit::Lazy] {
            let meta = Arc::new(
                Meta::open_in_memory(MetaOptions { commit, ..MetaOptions::default() })
                    .expect("open"),
            );
            let root = Caller::root();
            let stop = Arc::new(AtomicBool::new(false));
            // Readers that keep opening and sharing snapshots meanwhile.
            let busy: Vec<_> = (0..2)
                .map(|_| {
                    let (meta, stop) = (meta.clone(), stop.clone());
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            let _ = meta.lookup(ROOT_INO, b"f0", &Caller::root());
                            let _ = meta.getattr(ROOT_INO);
                        }
                    })
                })
                .collect();
            let (sender, receiver) = std::sync::mpsc::channel::<(String, Ino)>();
            let checker = {
                let meta = meta.clone();
                std::thread::spawn(move || {
                    for (name, ino) in receiver {
                        let found = meta.lookup(ROOT_INO, name.as_bytes(), &Caller::root());
                        assert_eq!(
                            found.map(|attr| attr.ino).ok(),
                            Some(ino),
                            "{commit:?}: {name}"
                        );
                    }
                })
            };
            for i in 0..300 {
                let name = format!("f{i}");
                let ino = meta.create(ROOT_INO, name.as_bytes(), 0o644, &root).expect("create").ino;
                if i % 2 == 0 {
                    // Commits the batch in lazy mode: the next readers read snapshots.
                    meta.sync().expect("sync");
                }
                sender.send((name, ino)).expect("checker");
            }
            drop(sender);
            checker.join().expect("every create was seen by a reader that started after it");
            stop.store(true, Ordering::Relaxed);
            for thread in busy {
                thread.join().expect("reader");
            }
        }
    }

    #[test]
    fn readers_see_the_open_batch_and_snapshots_once_it_is_committed() {
        let meta = lazy_meta();
        let root = Caller::root();
        // The first create reserves inode numbers, durably: a commit of its own.
        meta.create(ROOT_INO, b"first", 0o644, &root).expect("create");
        let a = meta.create(ROOT_INO, b"a", 0o644, &root).expect("create").ino;
        assert!(meta.batch_open.load(Ordering::Acquire));
        assert_eq!(meta.lookup(ROOT_INO, b"a", &root).expect("lookup").ino, a);
        std::thread::sleep(BATCH_AGE_MAX);
        // An old batch is committed by the next reader, which then reads a snapshot.
        assert_eq!(meta.getattr(a).expect("getattr").ino, a);
        assert!(!meta.batch_open.load(Ordering::Acquire));
        assert!(meta.lock_batch().txn.is_none());
        assert_eq!(meta.lookup(ROOT_INO, b"a", &root).expect("lookup").ino, a);
    }
}
