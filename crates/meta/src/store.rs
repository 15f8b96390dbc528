//! The redb tables and the per-transaction helpers every operation is written with.
//!
//! A mutation runs inside [`Tx`]: it opens the tables it uses on first use, collects counter
//! changes in memory (so that an inode touched twice is counted once) and writes them just
//! before commit.

use std::collections::HashMap;
use std::sync::OnceLock;

use redb::{ReadTransaction, ReadableTable, Table, TableDefinition, WriteTransaction};
use stria_proto::fs::{FsStatus, Ino};

use crate::error::{MetaError, Result, fs};
use crate::record::{Inode, size_class};
use crate::types::{FileKind, Usage};

/// ino → encoded [`Inode`].
pub(crate) const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
/// (dir, name) → (ino, seq, kind code).
pub(crate) const DENTRIES: TableDefinition<(u64, &[u8]), (u64, u64, u8)> =
    TableDefinition::new("dentries");
/// (dir, seq) → (ino, kind code, name): the readdir order.
pub(crate) const DIR_SEQ: TableDefinition<(u64, u64), (u64, u8, &[u8])> =
    TableDefinition::new("dir_seq");
/// (ino, name) → value.
pub(crate) const XATTRS: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("xattrs");
/// (counter class, id) → (files, bytes).
pub(crate) const USAGE: TableDefinition<(u8, u64), (u64, u64)> = TableDefinition::new("usage");
/// extension → (files, bytes).
pub(crate) const USAGE_EXT: TableDefinition<&str, (u64, u64)> = TableDefinition::new("usage_ext");
/// ino → unlink time (secs) of inodes with no name left that still hold data.
pub(crate) const ORPHANS: TableDefinition<u64, i64> = TableDefinition::new("orphans");
/// Named scalars: [`KEY_NEXT_INO`], [`KEY_INODES_USED`], [`KEY_FORMAT`], [`KEY_CLEAN_STOP`]...
pub(crate) const SYSTEM: TableDefinition<&str, u64> = TableDefinition::new("system");

pub(crate) const KEY_NEXT_INO: &str = "next_ino";
/// Every inode number below it may have been handed out, even by a create that a crash then
/// undid (lazy commits): it only grows, durably, before any number at or above it is used.
pub(crate) const KEY_INO_RESERVED: &str = "ino_reserved";
/// Inode numbers reserved per durable commit of [`KEY_INO_RESERVED`].
pub(crate) const INO_RESERVE_BATCH: u64 = 4096;
pub(crate) const KEY_INODES_USED: &str = "inodes_used";
pub(crate) const KEY_FORMAT: &str = "format";
/// 1 while the service is stopped cleanly (or the store is new): the clients of the last run
/// that held opens or locks are then named by [`KEY_RECLAIM_PREFIX`] keys. 0 while it serves,
/// so after a crash who held what is unknown (see `Meta::begin_serving`).
pub(crate) const KEY_CLEAN_STOP: &str = "clean_stop";
/// `reclaim/<client id in hex>`: a client that held opens or locks at the last clean stop.
pub(crate) const KEY_RECLAIM_PREFIX: &str = "reclaim/";
/// Version of the table layout as a whole.
pub(crate) const STORE_FORMAT: u64 = 1;

/// Counter classes, the first half of a [`USAGE`] key.
pub(crate) const CLASS_UID: u8 = 0;
pub(crate) const CLASS_GID: u8 = 1;
pub(crate) const CLASS_FILESET: u8 = 2;
pub(crate) const CLASS_SIZE: u8 = 3;
pub(crate) const CLASS_TOTAL: u8 = 4;

fn not_found(context: &'static str) -> MetaError {
    fs(FsStatus::NotFound, context)
}

pub(crate) fn load_inode<T: ReadableTable<u64, &'static [u8]>>(
    table: &T,
    ino: Ino,
) -> Result<Option<Inode>> {
    match table.get(ino)? {
        Some(guard) => Ok(Some(Inode::decode(ino, guard.value())?)),
        None => Ok(None),
    }
}

/// A directory entry as stored.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dentry {
    pub ino: Ino,
    pub seq: u64,
    pub kind: FileKind,
}

pub(crate) fn load_dentry<T: ReadableTable<(u64, &'static [u8]), (u64, u64, u8)>>(
    table: &T,
    dir: Ino,
    name: &[u8],
) -> Result<Option<Dentry>> {
    match table.get((dir, name))? {
        Some(guard) => {
            let (ino, seq, code) = guard.value();
            let kind = FileKind::from_code(code)
                .ok_or_else(|| MetaError::Corrupt(format!("dentry in {dir}: kind {code}")))?;
            Ok(Some(Dentry { ino, seq, kind }))
        }
        None => Ok(None),
    }
}

pub(crate) fn load_usage<T: ReadableTable<(u8, u64), (u64, u64)>>(
    table: &T,
    class: u8,
    id: u64,
) -> Result<Usage> {
    Ok(table
        .get((class, id))?
        .map(|g| {
            let (files, bytes) = g.value();
            Usage { files, bytes }
        })
        .unwrap_or_default())
}

/// What an [`Rx`] reads: a snapshot of the last commit, or the open batch of
/// [`crate::Meta`] (mutations applied but not committed yet, which readers must see).
enum Source<'a> {
    Snapshot(ReadTransaction),
    Batch(&'a Tables<'static>),
}

/// A table as [`Rx`] reads it: of a snapshot, or one the open batch holds open.
pub(crate) enum View<'a, K: redb::Key + 'static, V: redb::Value + 'static> {
    Snapshot(redb::ReadOnlyTable<K, V>),
    Batch(&'a Table<'static, K, V>),
}

impl<K: redb::Key + 'static, V: redb::Value + 'static> redb::ReadableTableMetadata
    for View<'_, K, V>
{
    fn stats(&self) -> redb::Result<redb::TableStats> {
        match self {
            View::Snapshot(table) => table.stats(),
            View::Batch(table) => table.stats(),
        }
    }

    fn len(&self) -> redb::Result<u64> {
        match self {
            View::Snapshot(table) => table.len(),
            View::Batch(table) => table.len(),
        }
    }
}

impl<K: redb::Key + 'static, V: redb::Value + 'static> ReadableTable<K, V> for View<'_, K, V> {
    fn get<'a>(
        &self,
        key: impl std::borrow::Borrow<K::SelfType<'a>>,
    ) -> redb::Result<Option<redb::AccessGuard<'_, V>>> {
        match self {
            View::Snapshot(table) => table.get(key),
            View::Batch(table) => table.get(key),
        }
    }

    fn range<'a, KR>(
        &self,
        range: impl std::ops::RangeBounds<KR> + 'a,
    ) -> redb::Result<redb::Range<'_, K, V>>
    where
        KR: std::borrow::Borrow<K::SelfType<'a>> + 'a,
    {
        match self {
            View::Snapshot(table) => table.range(range),
            View::Batch(table) => table.range(range),
        }
    }

    fn first(&self) -> redb::Result<Option<(redb::AccessGuard<'_, K>, redb::AccessGuard<'_, V>)>> {
        match self {
            View::Snapshot(table) => table.first(),
            View::Batch(table) => table.first(),
        }
    }

    fn last(&self) -> redb::Result<Option<(redb::AccessGuard<'_, K>, redb::AccessGuard<'_, V>)>> {
        match self {
            View::Snapshot(table) => table.last(),
            View::Batch(table) => table.last(),
        }
    }
}

type DentriesView<'a> = View<'a, (u64, &'static [u8]), (u64, u64, u8)>;
type DirSeqView<'a> = View<'a, (u64, u64), (u64, u8, &'static [u8])>;
type XattrsView<'a> = View<'a, (u64, &'static [u8]), &'static [u8]>;

/// Read-only view of the namespace: a snapshot, or the open batch. Tables open on first
/// use: a lookup touches two of the eight, and opening a table costs about as much as
/// reading a record from it.
pub(crate) struct Rx<'a> {
    source: Source<'a>,
    inodes: OnceLock<View<'a, u64, &'static [u8]>>,
    dentries: OnceLock<DentriesView<'a>>,
    dir_seq: OnceLock<DirSeqView<'a>>,
    xattrs: OnceLock<XattrsView<'a>>,
    usage: OnceLock<View<'a, (u8, u64), (u64, u64)>>,
    usage_ext: OnceLock<View<'a, &'static str, (u64, u64)>>,
    orphans: OnceLock<View<'a, u64, i64>>,
    system: OnceLock<View<'a, &'static str, u64>>,
}

/// The table in `cell`, opened from `source` on first use: `def` of a snapshot, or the
/// batch's table `held` picks (opened there if no mutation of the batch opened it yet).
fn opened<'c, 'a, K: redb::Key + 'static, V: redb::Value + 'static>(
    cell: &'c OnceLock<View<'a, K, V>>,
    source: &Source<'a>,
    def: TableDefinition<K, V>,
    held: for<'h> fn(&'h Tables<'static>) -> &'h Lazy<'static, K, V>,
) -> Result<&'c View<'a, K, V>> {
    if let Some(table) = cell.get() {
        return Ok(table);
    }
    let table = match source {
        Source::Snapshot(txn) => View::Snapshot(txn.open_table(def)?),
        Source::Batch(tables) => View::Batch(held(tables).table()?),
    };
    Ok(cell.get_or_init(|| table))
}

impl<'a> Rx<'a> {
    /// Reads the snapshot `txn`.
    pub fn open(txn: ReadTransaction) -> Rx<'static> {
        Rx::with_source(Source::Snapshot(txn))
    }

    /// Reads through the tables of the open batch (which nothing writes meanwhile); only
    /// [`HeldTxn::read`] has them.
    fn of_batch(tables: &'a Tables<'static>) -> Rx<'a> {
        Rx::with_source(Source::Batch(tables))
    }

    fn with_source(source: Source<'a>) -> Rx<'a> {
        Rx {
            source,
            inodes: OnceLock::new(),
            dentries: OnceLock::new(),
            dir_seq: OnceLock::new(),
            xattrs: OnceLock::new(),
            usage: OnceLock::new(),
            usage_ext: OnceLock::new(),
            orphans: OnceLock::new(),
            system: OnceLock::new(),
        }
    }

    pub fn inodes(&self) -> Result<&View<'a, u64, &'static [u8]>> {
        opened(&self.inodes, &self.source, INODES, |t| &t.inodes)
    }

    pub fn dentries(&self) -> Result<&DentriesView<'a>> {
        opened(&self.dentries, &self.source, DENTRIES, |t| &t.dentries)
    }

    pub fn dir_seq(&self) -> Result<&DirSeqView<'a>> {
        opened(&self.dir_seq, &self.source, DIR_SEQ, |t| &t.dir_seq)
    }

    pub fn xattrs(&self) -> Result<&XattrsView<'a>> {
        opened(&self.xattrs, &self.source, XATTRS, |t| &t.xattrs)
    }

    pub fn usage(&self) -> Result<&View<'a, (u8, u64), (u64, u64)>> {
        opened(&self.usage, &self.source, USAGE, |t| &t.usage)
    }

    pub fn usage_ext(&self) -> Result<&View<'a, &'static str, (u64, u64)>> {
        opened(&self.usage_ext, &self.source, USAGE_EXT, |t| &t.usage_ext)
    }

    pub fn orphans(&self) -> Result<&View<'a, u64, i64>> {
        opened(&self.orphans, &self.source, ORPHANS, |t| &t.orphans)
    }

    pub fn inode(&self, ino: Ino) -> Result<Inode> {
        load_inode(self.inodes()?, ino)?.ok_or_else(|| not_found("no such inode"))
    }

    pub fn dentry(&self, dir: Ino, name: &[u8]) -> Result<Option<Dentry>> {
        load_dentry(self.dentries()?, dir, name)
    }

    pub fn system_table(&self) -> Result<&View<'a, &'static str, u64>> {
        opened(&self.system, &self.source, SYSTEM, |t| &t.system)
    }

    pub fn system(&self, key: &str) -> Result<u64> {
        Ok(self.system_table()?.get(key)?.map(|g| g.value()).unwrap_or(0))
    }
}

/// Counter changes, netted per key: of one transaction, or (in `Meta`) of the lazy commits
/// whose changes are not in the counter tables yet.
#[derive(Default, Debug, Clone)]
pub(crate) struct Deltas {
    usage: HashMap<(u8, u64), (i64, i64)>,
    ext: HashMap<String, (i64, i64)>,
}

impl Deltas {
    pub fn is_empty(&self) -> bool {
        self.usage.is_empty() && self.ext.is_empty()
    }

    /// Adds `other`'s changes to these.
    pub fn merge(&mut self, other: Deltas) {
        for (key, (files, bytes)) in other.usage {
            let entry = self.usage.entry(key).or_default();
            entry.0 += files;
            entry.1 += bytes;
        }
        for (key, (files, bytes)) in other.ext {
            let entry = self.ext.entry(key).or_default();
            entry.0 += files;
            entry.1 += bytes;
        }
    }

    fn add(&mut self, rec: &Inode, sign: i64) {
        let bytes = rec.size as i64 * sign;
        for key in [
            (CLASS_UID, rec.uid as u64),
            (CLASS_GID, rec.gid as u64),
            (CLASS_FILESET, rec.fileset),
            (CLASS_SIZE, size_class(rec.size)),
            (CLASS_TOTAL, 0),
        ] {
            let entry = self.usage.entry(key).or_default();
            entry.0 += sign;
            entry.1 += bytes;
        }
        let entry = self.ext.entry(rec.ext.clone()).or_default();
        entry.0 += sign;
        entry.1 += bytes;
    }
}

/// The keys whose `(files, bytes)` differ between `stored` and `counted` (a missing key is
/// `(0, 0)`), in key order, with both values.
fn differences<K: Ord + std::hash::Hash + Clone>(
    stored: &HashMap<K, (i64, i64)>,
    counted: &HashMap<K, (i64, i64)>,
) -> Vec<(K, (i64, i64), (i64, i64))> {
    let mut keys: Vec<&K> = stored.keys().chain(counted.keys()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .filter_map(|key| {
            let was = stored.get(key).copied().unwrap_or_default();
            let now = counted.get(key).copied().unwrap_or_default();
            (was != now).then(|| (key.clone(), was, now))
        })
        .collect()
}

/// A usage key as a person reads it.
fn class_name((class, id): (u8, u64)) -> String {
    match class {
        CLASS_UID => format!("of uid {id}"),
        CLASS_GID => format!("of gid {id}"),
        CLASS_FILESET => format!("of fileset {id}"),
        CLASS_SIZE => format!("of size class {id}"),
        CLASS_TOTAL => "of all files".to_string(),
        other => format!("of unknown class {other}, id {id}"),
    }
}

fn apply(current: (u64, u64), delta: (i64, i64)) -> (u64, u64) {
    (current.0.saturating_add_signed(delta.0), current.1.saturating_add_signed(delta.1))
}

/// A table of a write transaction, opened on first use: an operation opens only the tables
/// it touches, and redb's commit has only those to flush.
pub(crate) struct Lazy<'t, K: redb::Key + 'static, V: redb::Value + 'static> {
    txn: &'t WriteTransaction,
    def: TableDefinition<'static, K, V>,
    table: OnceLock<Table<'t, K, V>>,
}

impl<'t, K: redb::Key + 'static, V: redb::Value + 'static> Lazy<'t, K, V> {
    fn new(txn: &'t WriteTransaction, def: TableDefinition<'static, K, V>) -> Self {
        Lazy { txn, def, table: OnceLock::new() }
    }

    pub fn table(&self) -> Result<&Table<'t, K, V>> {
        if let Some(table) = self.table.get() {
            return Ok(table);
        }
        let table = self.txn.open_table(self.def)?;
        Ok(self.table.get_or_init(|| table))
    }

    /// For [`Tx`]'s own writers only: every change goes through one that records its undo.
    fn table_mut(&mut self) -> Result<&mut Table<'t, K, V>> {
        self.table()?;
        Ok(self.table.get_mut().expect("opened above"))
    }
}

/// The tables of one write transaction, each opened on first use. The open batch of
/// [`crate::Meta`] keeps them open from one mutation to the next: opening a table costs
/// about as much as the lookup made in it, and a remove touches five.
pub(crate) struct Tables<'t> {
    pub inodes: Lazy<'t, u64, &'static [u8]>,
    pub dentries: Lazy<'t, (u64, &'static [u8]), (u64, u64, u8)>,
    pub dir_seq: Lazy<'t, (u64, u64), (u64, u8, &'static [u8])>,
    pub xattrs: Lazy<'t, (u64, &'static [u8]), &'static [u8]>,
    pub usage: Lazy<'t, (u8, u64), (u64, u64)>,
    pub usage_ext: Lazy<'t, &'static str, (u64, u64)>,
    pub orphans: Lazy<'t, u64, i64>,
    pub system: Lazy<'t, &'static str, u64>,
}

impl<'t> Tables<'t> {
    pub fn new(txn: &'t WriteTransaction) -> Tables<'t> {
        Tables {
            inodes: Lazy::new(txn, INODES),
            dentries: Lazy::new(txn, DENTRIES),
            dir_seq: Lazy::new(txn, DIR_SEQ),
            xattrs: Lazy::new(txn, XATTRS),
            usage: Lazy::new(txn, USAGE),
            usage_ext: Lazy::new(txn, USAGE_EXT),
            orphans: Lazy::new(txn, ORPHANS),
            system: Lazy::new(txn, SYSTEM),
        }
    }
}

/// A write transaction that keeps its tables open across the mutations it holds (the open
/// batch of [`crate::Meta`]): they are opened by the first mutation or reader that needs them
/// and closed when the transaction commits or is dropped.
///
/// The tables borrow the transaction, so the two cannot be an ordinary struct: the
/// transaction lives on the heap, where moving the holder does not move it, and the tables
/// carry a `'static` lifetime that nothing outside this type sees: it lends them only to
/// closures generic over the lifetime ([`HeldTxn::mutate`], [`HeldTxn::read`]) and has them
/// back before it returns.
pub(crate) struct HeldTxn {
    /// `None` while a mutation has them.
    tables: Option<Tables<'static>>,
    /// Owned (from `Box::leak`); freed by `into_txn` or `drop`, after the tables.
    txn: std::ptr::NonNull<WriteTransaction>,
}

// SAFETY: a `HeldTxn` owns its transaction and every table that borrows it, and both are
// `Send` (checked below), so moving it to another thread moves all of them together. Nothing
// in it is shared with another holder.
unsafe impl Send for HeldTxn {}

const _: fn() = || {
    fn send<T: Send>() {}
    send::<WriteTransaction>();
    send::<Tables<'static>>();
};

impl HeldTxn {
    pub fn new(txn: WriteTransaction) -> HeldTxn {
        let txn = std::ptr::NonNull::from(Box::leak(Box::new(txn)));
        // SAFETY: the transaction is on the heap and freed only after the tables are dropped
        // (`into_txn`, `drop`); see the type's comment for why the lifetime does not escape.
        let tables = Tables::new(unsafe { txn.as_ref() });
        HeldTxn { tables: Some(tables), txn }
    }

    /// Runs one mutation on the tables, which stay open for the next. `f` is generic over
    /// the tables' lifetime, so nothing that borrows the transaction leaves it.
    pub fn mutate<R>(&mut self, f: impl FnOnce(&mut Tx<'_>) -> R) -> R {
        let mut tx = Tx::with_tables(self.take_tables());
        let out = f(&mut tx);
        self.tables = Some(tx.into_tables());
        out
    }

    /// Runs a reader of the batch on its tables (as [`HeldTxn::mutate`]).
    pub fn read<R>(&mut self, f: impl FnOnce(&Rx<'_>) -> R) -> R {
        f(&Rx::of_batch(self.tables()))
    }

    /// The tables, out of the holder for one mutation. (Tables a panicking mutation dropped
    /// were closed: a fresh set opens them again.)
    fn take_tables(&mut self) -> Tables<'static> {
        let txn = self.txn;
        // SAFETY: as in `new`.
        self.tables.take().unwrap_or_else(|| Tables::new(unsafe { txn.as_ref() }))
    }

    fn tables(&mut self) -> &Tables<'static> {
        let txn = self.txn;
        // SAFETY: as in `new`.
        self.tables.get_or_insert_with(|| Tables::new(unsafe { txn.as_ref() }))
    }

    /// Closes the tables and gives the transaction back, for its commit or abort.
    pub fn into_txn(mut self) -> WriteTransaction {
        self.tables = None;
        let txn = self.txn;
        std::mem::forget(self);
        // SAFETY: from `Box::leak` in `new`; every table that borrowed it is dropped above,
        // and `forget` keeps `drop` from freeing it a second time.
        *unsafe { Box::from_raw(txn.as_ptr()) }
    }
}

impl Drop for HeldTxn {
    /// Drops the tables, then the transaction (which aborts it, as redb does).
    fn drop(&mut self) {
        self.tables = None;
        // SAFETY: as in `into_txn`.
        drop(unsafe { Box::from_raw(self.txn.as_ptr()) });
    }
}

/// One mutation in a write transaction, with that transaction's tables.
pub(crate) struct Tx<'t> {
    pub tables: Tables<'t>,
    deltas: Deltas,
    /// Set by an operation that changed nothing: the transaction is aborted instead of
    /// committed, which saves the commit (and its fsync).
    pub unchanged: bool,
    /// Set when the transaction must be durable before its effects are used, whatever the
    /// commit mode (it reserved inode numbers).
    pub durable: bool,
    /// How to take back every change of this operation, in the order made (see
    /// [`Tx::roll_back`]).
    undo: Vec<Undo>,
}

/// One change of a [`Tx`], as the value its key held before (`None`: absent).
enum Undo {
    Inode(u64, Option<Vec<u8>>),
    Dentry((u64, Vec<u8>), Option<(u64, u64, u8)>),
    DirSeq((u64, u64), Option<(u64, u8, Vec<u8>)>),
    Xattr((u64, Vec<u8>), Option<Vec<u8>>),
    Usage((u8, u64), Option<(u64, u64)>),
    UsageExt(String, Option<(u64, u64)>),
    Orphan(u64, Option<i64>),
    System(String, Option<u64>),
}

/// A `dir_seq` value as the undo log keeps it.
fn owned_dir_seq((ino, code, name): (u64, u8, &[u8])) -> (u64, u8, Vec<u8>) {
    (ino, code, name.to_vec())
}

/// Puts `old` back under `key` of `table`, or removes the key when it was absent.
fn restore<'k, 'v, K: redb::Key + 'static, V: redb::Value + 'static>(
    table: &mut Table<'_, K, V>,
    key: impl std::borrow::Borrow<K::SelfType<'k>>,
    old: Option<impl std::borrow::Borrow<V::SelfType<'v>>>,
) -> Result<()> {
    match old {
        Some(value) => table.insert(key, value).map(drop)?,
        None => table.remove(key).map(drop)?,
    }
    Ok(())
}

impl<'t> Tx<'t> {
    /// A mutation in `txn` with tables of its own (closed when it is dropped).
    pub fn open(txn: &'t WriteTransaction) -> Tx<'t> {
        Tx::with_tables(Tables::new(txn))
    }

    /// A mutation in the transaction `tables` belong to; [`Tx::into_tables`] gives them
    /// back, still open, for the next one.
    fn with_tables(tables: Tables<'t>) -> Tx<'t> {
        Tx { tables, deltas: Deltas::default(), unchanged: false, durable: false, undo: Vec::new() }
    }

    fn into_tables(self) -> Tables<'t> {
        self.tables
    }

    /// Opens every table, which creates those that do not exist yet.
    pub fn create_tables(&self) -> Result<()> {
        self.tables.inodes.table()?;
        self.tables.dentries.table()?;
        self.tables.dir_seq.table()?;
        self.tables.xattrs.table()?;
        self.tables.usage.table()?;
        self.tables.usage_ext.table()?;
        self.tables.orphans.table()?;
        self.tables.system.table()?;
        Ok(())
    }

    pub fn inode(&self, ino: Ino) -> Result<Inode> {
        load_inode(self.tables.inodes.table()?, ino)?.ok_or_else(|| not_found("no such inode"))
    }

    /// The inode `ino`, which must be a directory.
    pub fn dir(&self, ino: Ino) -> Result<Inode> {
        let rec = self.inode(ino)?;
        if !rec.is_dir() {
            return Err(fs(FsStatus::NotDir, "parent is not a directory"));
        }
        Ok(rec)
    }

    pub fn put_inode(&mut self, ino: Ino, rec: &Inode) -> Result<()> {
        let old = self.tables.inodes.table_mut()?.insert(ino, rec.encode()?.as_slice())?;
        self.undo.push(Undo::Inode(ino, old.map(|g| g.value().to_vec())));
        Ok(())
    }

    pub fn dentry(&self, dir: Ino, name: &[u8]) -> Result<Option<Dentry>> {
        load_dentry(self.tables.dentries.table()?, dir, name)
    }

    /// Adds `name → ino` to directory `dir` (whose record the caller writes back).
    pub fn add_dentry(
        &mut self,
        dir: Ino,
        dir_rec: &mut Inode,
        name: &[u8],
        ino: Ino,
        kind: FileKind,
    ) -> Result<()> {
        let body =
            dir_rec.dir_body().ok_or_else(|| fs(FsStatus::NotDir, "parent is not a directory"))?;
        let seq = body.next_seq;
        body.next_seq += 1;
        let old = self.tables.dentries.table_mut()?.insert((dir, name), (ino, seq, kind.code()))?;
        self.undo.push(Undo::Dentry((dir, name.to_vec()), old.map(|g| g.value())));
        let old = self.tables.dir_seq.table_mut()?.insert((dir, seq), (ino, kind.code(), name))?;
        let old = old.map(|g| owned_dir_seq(g.value()));
        self.undo.push(Undo::DirSeq((dir, seq), old));
        Ok(())
    }

    pub fn remove_dentry(&mut self, dir: Ino, name: &[u8]) -> Result<Option<Dentry>> {
        let Some(dentry) = self.dentry(dir, name)? else {
            return Ok(None);
        };
        let old = self.tables.dentries.table_mut()?.remove((dir, name))?;
        self.undo.push(Undo::Dentry((dir, name.to_vec()), old.map(|g| g.value())));
        let old = self.tables.dir_seq.table_mut()?.remove((dir, dentry.seq))?;
        let old = old.map(|g| owned_dir_seq(g.value()));
        self.undo.push(Undo::DirSeq((dir, dentry.seq), old));
        Ok(Some(dentry))
    }

    pub fn dir_is_empty(&self, dir: Ino) -> Result<bool> {
        Ok(self.tables.dir_seq.table()?.range((dir, 0)..=(dir, u64::MAX))?.next().is_none())
    }

    /// The entries of `dir` (ino, kind), all of them.
    pub fn children(&self, dir: Ino) -> Result<Vec<(Ino, FileKind)>> {
        let mut out = Vec::new();
        for item in self.tables.dir_seq.table()?.range((dir, 0)..=(dir, u64::MAX))? {
            let (_, value) = item?;
            let (ino, code, _) = value.value();
            let kind = FileKind::from_code(code)
                .ok_or_else(|| MetaError::Corrupt(format!("dir_seq in {dir}: kind {code}")))?;
            out.push((ino, kind));
        }
        Ok(out)
    }

    pub fn system(&self, key: &str) -> Result<u64> {
        Ok(self.tables.system.table()?.get(key)?.map(|g| g.value()).unwrap_or(0))
    }

    /// A fresh inode number, counted as used.
    pub fn alloc_ino(&mut self, inodes_max: u64) -> Result<Ino> {
        let used = self.system(KEY_INODES_USED)?;
        if used >= inodes_max {
            return Err(fs(FsStatus::NoSpace, "inode limit reached"));
        }
        let ino = self.system(KEY_NEXT_INO)?;
        if ino >= self.system(KEY_INO_RESERVED)? {
            // A crash may undo this create but not the chunks written under its number, so
            // a number is never handed out twice: reserve a batch, durably.
            self.set_system(KEY_INO_RESERVED, ino + INO_RESERVE_BATCH)?;
            self.durable = true;
        }
        self.set_system(KEY_NEXT_INO, ino + 1)?;
        self.set_system(KEY_INODES_USED, used + 1)?;
        Ok(ino)
    }

    /// Deletes an inode record, its xattrs and its orphan mark.
    pub fn free_inode(&mut self, ino: Ino) -> Result<()> {
        let old = self.tables.inodes.table_mut()?.remove(ino)?;
        self.undo.push(Undo::Inode(ino, old.map(|g| g.value().to_vec())));
        self.clear_orphan(ino)?;
        let names: Vec<Vec<u8>> = self
            .tables
            .xattrs
            .table()?
            .range((ino, &[][..])..(ino + 1, &[][..]))?
            .map(|item| item.map(|(k, _)| k.value().1.to_vec()))
            .collect::<Result<_, _>>()?;
        for name in names {
            self.remove_xattr(ino, &name)?;
        }
        let used = self.system(KEY_INODES_USED)?;
        self.set_system(KEY_INODES_USED, used.saturating_sub(1))
    }

    pub fn set_system(&mut self, key: &str, value: u64) -> Result<()> {
        let old = self.tables.system.table_mut()?.insert(key, value)?;
        self.undo.push(Undo::System(key.to_string(), old.map(|g| g.value())));
        Ok(())
    }

    pub fn remove_system(&mut self, key: &str) -> Result<()> {
        let old = self.tables.system.table_mut()?.remove(key)?;
        self.undo.push(Undo::System(key.to_string(), old.map(|g| g.value())));
        Ok(())
    }

    /// The named scalars whose names start with `prefix`.
    pub fn system_with_prefix(&mut self, prefix: &str) -> Result<Vec<(String, u64)>> {
        let mut out = Vec::new();
        for item in self.tables.system.table_mut()?.range(prefix..)? {
            let (key, value) = item?;
            if !key.value().starts_with(prefix) {
                break;
            }
            out.push((key.value().to_string(), value.value()));
        }
        Ok(out)
    }

    pub fn put_xattr(&mut self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        let old = self.tables.xattrs.table_mut()?.insert((ino, name), value)?;
        self.undo.push(Undo::Xattr((ino, name.to_vec()), old.map(|g| g.value().to_vec())));
        Ok(())
    }

    /// Whether `ino` had the xattr `name`.
    pub fn remove_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<bool> {
        let Some(old) = self.tables.xattrs.table_mut()?.remove((ino, name))? else {
            return Ok(false);
        };
        self.undo.push(Undo::Xattr((ino, name.to_vec()), Some(old.value().to_vec())));
        Ok(true)
    }

    /// Marks `ino` as an orphan (no name left, still open) since `secs`.
    pub fn set_orphan(&mut self, ino: Ino, secs: i64) -> Result<()> {
        let old = self.tables.orphans.table_mut()?.insert(ino, secs)?;
        self.undo.push(Undo::Orphan(ino, old.map(|g| g.value())));
        Ok(())
    }

    fn clear_orphan(&mut self, ino: Ino) -> Result<()> {
        if let Some(old) = self.tables.orphans.table_mut()?.remove(ino)? {
            self.undo.push(Undo::Orphan(ino, Some(old.value())));
        }
        Ok(())
    }

    /// Takes back every change this operation made, newest first, so a failed operation
    /// leaves the batch it ran in as it found it. An error here leaves the transaction
    /// half undone: the caller must abort it.
    pub fn roll_back(&mut self) -> Result<()> {
        while let Some(undo) = self.undo.pop() {
            match undo {
                Undo::Inode(ino, old) => {
                    restore(self.tables.inodes.table_mut()?, ino, old.as_deref())?
                }
                Undo::Dentry((dir, name), old) => {
                    restore(self.tables.dentries.table_mut()?, (dir, name.as_slice()), old)?
                }
                Undo::DirSeq(key, old) => {
                    let old = old.as_ref().map(|(ino, code, name)| (*ino, *code, name.as_slice()));
                    restore(self.tables.dir_seq.table_mut()?, key, old)?
                }
                Undo::Xattr((ino, name), old) => restore(
                    self.tables.xattrs.table_mut()?,
                    (ino, name.as_slice()),
                    old.as_deref(),
                )?,
                Undo::Usage(key, old) => restore(self.tables.usage.table_mut()?, key, old)?,
                Undo::UsageExt(ext, old) => {
                    restore(self.tables.usage_ext.table_mut()?, ext.as_str(), old)?
                }
                Undo::Orphan(ino, old) => restore(self.tables.orphans.table_mut()?, ino, old)?,
                Undo::System(key, old) => {
                    restore(self.tables.system.table_mut()?, key.as_str(), old)?
                }
            }
        }
        self.deltas = Deltas::default();
        Ok(())
    }

    /// Records a change of a regular file's counted state (`None`: not counted).
    pub fn account(&mut self, before: Option<&Inode>, after: Option<&Inode>) {
        if let Some(rec) = before.filter(|r| r.counted()) {
            self.deltas.add(rec, -1);
        }
        if let Some(rec) = after.filter(|r| r.counted()) {
            self.deltas.add(rec, 1);
        }
    }

    /// Recounts the usage counters from every inode and compares them with the counter
    /// tables: one line per row that differs (`(files, bytes)` stored, then recounted). With
    /// `repair` the tables are rewritten to the recount in this transaction.
    pub fn recount_usage(&mut self, repair: bool) -> Result<Vec<String>> {
        let mut counted = Deltas::default();
        for item in self.tables.inodes.table()?.iter()? {
            let (ino, bytes) = item?;
            let rec = Inode::decode(ino.value(), bytes.value())?;
            if rec.counted() {
                counted.add(&rec, 1);
            }
        }
        let signed = |(files, bytes): (u64, u64)| (files as i64, bytes as i64);
        let mut stored = Deltas::default();
        for item in self.tables.usage.table()?.iter()? {
            let (key, value) = item?;
            stored.usage.insert(key.value(), signed(value.value()));
        }
        for item in self.tables.usage_ext.table()?.iter()? {
            let (key, value) = item?;
            stored.ext.insert(key.value().to_string(), signed(value.value()));
        }
        // The repair is the difference, applied as any counter change is.
        let mut found = Vec::new();
        let mut fix = Deltas::default();
        for (key, was, now) in differences(&stored.usage, &counted.usage) {
            found.push(format!(
                "usage counter {}: {was:?} stored, {now:?} counted",
                class_name(key)
            ));
            fix.usage.insert(key, (now.0 - was.0, now.1 - was.1));
        }
        for (ext, was, now) in differences(&stored.ext, &counted.ext) {
            found.push(format!(
                "usage counter of extension {ext:?}: {was:?} stored, {now:?} counted"
            ));
            fix.ext.insert(ext, (now.0 - was.0, now.1 - was.1));
        }
        if repair {
            self.flush_counters(fix)?;
        }
        Ok(found)
    }

    /// The counter changes this transaction made so far, taken out of it.
    pub fn take_deltas(&mut self) -> Deltas {
        std::mem::take(&mut self.deltas)
    }

    /// Writes netted counter changes into the counter tables.
    pub fn flush_counters(&mut self, deltas: Deltas) -> Result<()> {
        for (key, delta) in deltas.usage {
            if delta == (0, 0) {
                continue;
            }
            let current = load_usage(self.tables.usage.table()?, key.0, key.1)?;
            let next = apply((current.files, current.bytes), delta);
            let old = if next == (0, 0) {
                self.tables.usage.table_mut()?.remove(key)?
            } else {
                self.tables.usage.table_mut()?.insert(key, next)?
            };
            self.undo.push(Undo::Usage(key, old.map(|g| g.value())));
        }
        for (ext, delta) in deltas.ext {
            if delta == (0, 0) {
                continue;
            }
            let current = self
                .tables
                .usage_ext
                .table()?
                .get(ext.as_str())?
                .map(|g| g.value())
                .unwrap_or((0, 0));
            let next = apply(current, delta);
            let old = if next == (0, 0) {
                self.tables.usage_ext.table_mut()?.remove(ext.as_str())?
            } else {
                self.tables.usage_ext.table_mut()?.insert(ext.as_str(), next)?
            };
            self.undo.push(Undo::UsageExt(ext.clone(), old.map(|g| g.value())));
        }
        Ok(())
    }
}
