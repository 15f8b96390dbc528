//! The Stria client library.
//!
//! Names and attributes go to the metadata service; file data is split by the file's layout
//! into chunk requests that go to the storage targets in parallel, many in flight at once.
//! Writes are acknowledged once they are queued (write-behind, bounded per file); `flush`
//! (close) and `fsync` wait for them and report the first error, and `fsync` also makes every
//! target the file touches and the metadata durable. Sequential reads prefetch whole chunks.
//! Consistency is close-to-open: `open` fetches fresh attributes, `flush` publishes the size.
//! Block volumes ([`Client::volume`]) go through the same storage connections, write-through.
//!
//! The API is synchronous (the FUSE mount calls it from its worker threads) and runs its
//! requests on a tokio runtime it is given.

mod data;
mod dir_attrs;
mod durability;
mod files;
mod locks;
mod purge;
mod reclaim;
mod seen;
mod session;
mod transport;
mod volume;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use stria_proto::fs::{CAPABILITY_XATTR, FsStatus, Ino, LayoutPolicy, TargetId};
use stria_proto::wire::{
    Attr, Caller, Change, ChangeBatch, ChangeCursor, DirEntry, DriveField, FileKind, MetaReply,
    MetaRequest, Released, RenameFlags, SetAttr, StatFs, TargetAddSpare, TargetInfo,
    TargetReplaceDrive, XattrSetMode, storage_method,
};
use tokio::runtime::Handle;

pub use files::FileHandleId;
use files::{OpenFile, OpenFiles};
use transport::{MetaConn, StorageConns};
pub use volume::{VOLUME_IO_BYTES_MAX, VOLUME_REQUESTS_IN_FLIGHT_MAX, VolumeExtent, VolumeIo};

/// Where the services are and how the client behaves.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The metadata service.
    pub meta: SocketAddr,
    /// Which storage service serves each target.
    pub targets: Vec<(TargetId, SocketAddr)>,
    /// Deadline of one request.
    pub request_timeout: Duration,
    /// Most bytes of acknowledged but unfinished writes per open file.
    pub write_behind_bytes: usize,
    /// How far ahead of a sequential reader chunks are fetched.
    pub readahead_bytes: usize,
    /// The cluster secret proven to every service (`DATA/cluster-secret` of the node);
    /// `None` only for services that run without one.
    pub secret: Option<stria_rpc::ClusterSecret>,
    /// How long a request waits for a service that cannot be reached (restarting), trying
    /// again with backoff: every request the service never got, and idempotent ones also when
    /// the connection broke under them. Zero (the default) fails at once, as a command line
    /// tool wants; a mount that should ride out a role restart sets it.
    pub reconnect_wait: Duration,
}

impl ClientConfig {
    /// A configuration without a cluster secret (see [`ClientConfig::with_secret`]).
    pub fn new(meta: SocketAddr, targets: Vec<(TargetId, SocketAddr)>) -> ClientConfig {
        ClientConfig {
            meta,
            targets,
            request_timeout: Duration::from_secs(30),
            write_behind_bytes: 64 << 20,
            readahead_bytes: 8 << 20,
            secret: None,
            reconnect_wait: Duration::ZERO,
        }
    }

    pub fn with_secret(self, secret: stria_rpc::ClusterSecret) -> ClientConfig {
        ClientConfig { secret: Some(secret), ..self }
    }
}

pub type FsResult<T> = Result<T, FsStatus>;

/// A refused drive change: the status, the storage service's explanation and the request
/// field at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DriveChangeError {
    pub status: FsStatus,
    pub message: String,
    pub field: Option<DriveField>,
}

impl DriveChangeError {
    /// An error with no explanation from the service (it did not answer, or sent none).
    pub(crate) fn bare(status: FsStatus) -> DriveChangeError {
        DriveChangeError { status, message: status.to_string(), field: None }
    }
}

/// A connection to one Stria file system. Cheap to clone; every clone shares connections and
/// open-file state.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    runtime: Handle,
    config: ClientConfig,
    meta: Arc<MetaConn>,
    storage: StorageConns,
    files: OpenFiles,
    /// Chunks of released inodes, removed once their release is durable.
    purger: Arc<purge::Purger>,
    /// Which acknowledged changes the services lost by restarting (see `durability`).
    watch: Arc<durability::DurabilityWatch>,
    /// The version of each file a cache in front of this client holds (see `seen`).
    seen: seen::SeenVersions,
    /// This client's identity for byte-range locks (see `locks`).
    locks: locks::LockSession,
}

/// The last clone of a client removes the chunks still queued for removal (see `purge`), so
/// a short-lived client (a CLI command) leaves none behind.
impl Drop for Inner {
    fn drop(&mut self) {
        if self.purger.is_empty() {
            return;
        }
        let purger = self.purger.clone();
        if tokio::runtime::Handle::try_current().is_ok() {
            // Inside the runtime: no blocking here, the drain goes on as a task.
            self.runtime.spawn(async move { purger.drain().await });
            return;
        }
        let drained = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.runtime.block_on(purger.drain())
        }));
        if !matches!(drained, Ok(Ok(()))) {
            tracing::warn!("chunks of removed files left for `stria fsck --repair`");
        }
    }
}

impl Client {
    /// Connects lazily: the first request to each service opens its connection.
    pub fn new(runtime: Handle, config: ClientConfig) -> Client {
        let watch = Arc::new(durability::DurabilityWatch::default());
        let settings = transport::ConnSettings {
            timeout: config.request_timeout,
            secret: config.secret.clone(),
            reconnect_wait: config.reconnect_wait,
        };
        let meta = MetaConn::new(config.meta, &settings, watch.clone());
        let storage = StorageConns::new(&config.targets, &settings, watch.clone());
        let files = OpenFiles::new(config.write_behind_bytes);
        let meta = Arc::new(meta);
        let purger = purge::Purger::new(meta.clone(), storage.clone());
        runtime.spawn(purger.clone().run());
        let seen = seen::SeenVersions::default();
        let locks = locks::LockSession::new();
        let inner = Inner { runtime, config, meta, storage, files, purger, watch, seen, locks };
        let client = Client { inner: Arc::new(inner) };
        client.reclaim_on_restart();
        client
    }

    fn block<T>(&self, work: impl Future<Output = T>) -> T {
        self.inner.runtime.block_on(work)
    }

    fn meta(&self, request: MetaRequest) -> FsResult<MetaReply> {
        self.block(self.inner.meta.call(request))
    }

    fn meta_at(&self, request: MetaRequest) -> FsResult<(stria_proto::wire::Epoch, MetaReply)> {
        self.block(self.inner.meta.call_at(request))
    }

    fn attr_reply(&self, request: MetaRequest) -> FsResult<Attr> {
        let since = self.inner.files.publishes();
        match self.meta(request)? {
            MetaReply::Attr(attr) => Ok(self.inner.files.overlay(attr, since)),
            other => Err(unexpected(&other)),
        }
    }

    pub fn lookup(&self, caller: &Caller, parent: Ino, name: &[u8]) -> FsResult<Attr> {
        self.attr_reply(MetaRequest::Lookup { caller: caller.clone(), parent, name: name.to_vec() })
    }

    pub fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        self.attr_reply(MetaRequest::GetAttr { ino })
    }

    /// [`Client::getattr`], answered without a request for a directory this client changed
    /// within `max_age` (the attributes came with the change; see `dir_attrs`).
    pub fn getattr_within(&self, ino: Ino, max_age: std::time::Duration) -> FsResult<Attr> {
        match self.inner.meta.dirs.get(ino, max_age) {
            Some(attr) => Ok(attr),
            None => self.getattr(ino),
        }
    }

    /// The namespace changes other clients made after `after` (None: from now on), waiting up
    /// to `wait` for one (see `MetaRequest::WatchChanges`). Directory attributes this client
    /// holds from its own changes (`getattr_within`) are dropped for every directory named,
    /// and so is what it knows of the extended attributes and mode of a file open here
    /// (another client may have given it a capability or set-ID bits a write must drop).
    pub async fn watch_changes(
        &self,
        after: Option<ChangeCursor>,
        wait: std::time::Duration,
    ) -> FsResult<ChangeBatch> {
        let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        match self.inner.meta.call(MetaRequest::WatchChanges { after, wait_ms }).await? {
            MetaReply::Changes(batch) => {
                for change in &batch.changes {
                    if let Change::Attr { ino } = change {
                        self.inner.meta.dirs.forget(*ino);
                        self.inner.files.changed_elsewhere(*ino);
                    }
                }
                Ok(batch)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Changes attributes; a size change waits for queued writes and trims or removes the
    /// chunks past the new end. `set.writable_handle` is taken as the caller says (see
    /// [`Client::setattr_handle`]).
    pub fn setattr(&self, caller: &Caller, ino: Ino, set: SetAttr) -> FsResult<Attr> {
        // The size this client's handles know, written but perhaps not yet published: chunks
        // up to it may hold data the metadata service's old size does not cover.
        let mut local_size = 0;
        let mut size_before = None;
        if let Some(size) = set.size {
            self.block(data::drain(&self.inner, ino))?;
            local_size = self.inner.files.inode(ino).map_or(0, |inode| inode.state().size);
            if size > stria_proto::fs::INLINE_DATA_MAX as u64 {
                let attr = self.getattr(ino)?;
                if attr.kind == FileKind::File && attr.layout.is_none() {
                    self.block(data::ensure_chunked(&self.inner, ino))?;
                }
            }
            size_before = self.inner.files.before_truncate(ino, size);
        }
        let changes_mode = set.mode.is_some() || set.uid.is_some() || set.gid.is_some();
        if changes_mode {
            self.inner.files.may_change_mode(ino);
        }
        let truncating = set.size.is_some();
        let sets_mtime = set.mtime.is_some();
        let since = self.inner.files.publishes();
        let reply = self.meta(MetaRequest::SetAttr { caller: caller.clone(), ino, set });
        let (attr, old_size) = match reply {
            Ok(MetaReply::SetAttr { attr, old_size }) => (attr, old_size),
            failed => {
                // The file keeps its size: unpublished writes are still the close's to publish.
                if let Some(before) = size_before {
                    self.inner.files.truncate_failed(ino, before);
                }
                return Err(match failed {
                    Ok(other) => unexpected(&other),
                    Err(error) => error,
                });
            }
        };
        if changes_mode {
            // Again once done: a privilege drop answered meanwhile may predate the change.
            self.inner.files.may_change_mode(ino);
        }
        if sets_mtime {
            self.inner.files.mtime_set(ino, attr.mtime);
        }
        if truncating
            && attr.size < old_size.max(local_size)
            && let Some(layout) = &attr.layout
        {
            self.block(data::trim(&self.inner, ino, layout, attr.size))?;
        }
        // Which version the change replaced is not known here: the next open checks.
        self.inner.seen.forget(ino);
        Ok(self.inner.files.overlay(attr, since))
    }

    /// [`Client::setattr`] through the open handle `fh` of `ino` (ftruncate(2)): a handle
    /// opened for writing had write permission checked at its open, and a size change
    /// through it is not checked again (`SetAttr::writable_handle`), as on a local file
    /// system; through any other handle (or one not open here) it is checked as a change by
    /// name.
    pub fn setattr_handle(
        &self,
        caller: &Caller,
        ino: Ino,
        fh: FileHandleId,
        set: SetAttr,
    ) -> FsResult<Attr> {
        let file = self.inner.files.get(fh);
        let writable_handle = file.is_ok_and(|file| file.ino == ino && file.writable());
        self.setattr(caller, ino, SetAttr { writable_handle, ..set })
    }

    // The arguments are those of mknod(2)/FUSE's create; the mount passes them straight on.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        rdev: u32,
        exclusive: bool,
    ) -> FsResult<Attr> {
        self.attr_reply(MetaRequest::Create {
            caller: caller.clone(),
            parent,
            name: name.to_vec(),
            kind,
            mode,
            rdev,
            exclusive,
            open: None,
            client: self.inner.locks.id(),
        })
    }

    /// Creates a regular file and opens it for `mask` (`R_OK`/`W_OK` bits), in one round trip
    /// (FUSE's create). Without `exclusive` a file another client made first is opened
    /// instead, if `mask` is allowed on it; its size then tells it from a new one.
    pub fn create_open(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        mask: u32,
    ) -> FsResult<(FileHandleId, Attr)> {
        let request = MetaRequest::Create {
            caller: caller.clone(),
            parent,
            name: name.to_vec(),
            kind: FileKind::File,
            mode,
            rdev: 0,
            exclusive,
            open: Some(mask),
            client: self.inner.locks.id(),
        };
        let since = self.inner.files.publishes();
        // The open is counted here before a reclaim can tell it (see `reclaim`).
        let _gate = self.inner.locks.shared();
        match self.meta(request)? {
            // An empty file's (no) bytes are known; one that already held bytes is read as
            // any other.
            MetaReply::Open { attr, inline, created } => {
                let known = if attr.size == 0 { Some(Vec::new()) } else { inline };
                let fh = self.inner.files.open(&attr, known, opens_for_writing(mask));
                if created {
                    self.inner.files.no_xattrs(attr.ino);
                    self.inner.seen.note_attr(&attr);
                }
                Ok((fh, self.inner.files.overlay(attr, since)))
            }
            other => Err(unexpected(&other)),
        }
    }

    pub fn mkdir(&self, caller: &Caller, parent: Ino, name: &[u8], mode: u32) -> FsResult<Attr> {
        self.attr_reply(MetaRequest::Mkdir {
            caller: caller.clone(),
            parent,
            name: name.to_vec(),
            mode,
        })
    }

    pub fn symlink(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        target: &[u8],
    ) -> FsResult<Attr> {
        self.attr_reply(MetaRequest::Symlink {
            caller: caller.clone(),
            parent,
            name: name.to_vec(),
            target: target.to_vec(),
        })
    }

    pub fn link(
        &self,
        caller: &Caller,
        ino: Ino,
        new_parent: Ino,
        new_name: &[u8],
    ) -> FsResult<Attr> {
        self.attr_reply(MetaRequest::Link {
            caller: caller.clone(),
            ino,
            new_parent,
            new_name: new_name.to_vec(),
        })
    }

    pub fn unlink(&self, caller: &Caller, parent: Ino, name: &[u8]) -> FsResult<()> {
        let reply = self.meta_at(MetaRequest::Unlink {
            caller: caller.clone(),
            parent,
            name: name.to_vec(),
        })?;
        self.release_inode(reply)
    }

    pub fn rmdir(&self, caller: &Caller, parent: Ino, name: &[u8]) -> FsResult<()> {
        self.meta(MetaRequest::Rmdir { caller: caller.clone(), parent, name: name.to_vec() })?;
        Ok(())
    }

    pub fn rename(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> FsResult<()> {
        let reply = self.meta_at(MetaRequest::Rename {
            caller: caller.clone(),
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            flags,
        })?;
        self.release_inode(reply)
    }

    /// Queues the chunks of an inode the metadata service released (its last link went away
    /// and nobody has it open; an open one is released by its last `release`) for removal.
    fn release_inode(&self, (epoch, reply): (stria_proto::wire::Epoch, MetaReply)) -> FsResult<()> {
        let released = match reply {
            MetaReply::Released(released) => released,
            other => return Err(unexpected(&other)),
        };
        let Some(Released { ino, layout: Some(layout) }) = released else {
            return Ok(());
        };
        // Not before the release is durable (see `purge`).
        self.inner.purger.push(ino, layout, epoch);
        Ok(())
    }

    pub fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        match self.meta(MetaRequest::Readlink { ino })? {
            MetaReply::Bytes(target) => Ok(target),
            other => Err(unexpected(&other)),
        }
    }

    /// Up to `max_entries` entries from `cookie` on (0 = the start), without `.` and `..`.
    pub fn readdir(
        &self,
        caller: &Caller,
        ino: Ino,
        cookie: u64,
        max_entries: u32,
    ) -> FsResult<Vec<DirEntry>> {
        match self.meta(MetaRequest::Readdir {
            caller: caller.clone(),
            ino,
            cookie,
            max_entries,
        })? {
            MetaReply::Entries(entries) => Ok(entries),
            other => Err(unexpected(&other)),
        }
    }

    pub fn access(&self, caller: &Caller, ino: Ino, mask: u32) -> FsResult<()> {
        self.meta(MetaRequest::Access { caller: caller.clone(), ino, mask })?;
        Ok(())
    }

    /// Opens a file for I/O (`mask`: the R_OK/W_OK bits the open needs).
    pub fn open(&self, caller: &Caller, ino: Ino, mask: u32) -> FsResult<(FileHandleId, Attr)> {
        let since = self.inner.files.publishes();
        let _gate = self.inner.locks.shared();
        let (attr, inline) = match self.meta(MetaRequest::Open {
            caller: caller.clone(),
            ino,
            mask,
            client: self.inner.locks.id(),
        })? {
            MetaReply::Open { attr, inline, .. } => (attr, inline),
            other => return Err(unexpected(&other)),
        };
        let fh = self.inner.files.open(&attr, inline, opens_for_writing(mask));
        Ok((fh, self.inner.files.overlay(attr, since)))
    }

    /// Whether a cache in front of this client (the mount's page cache) still holds the
    /// version of the file that `attr`, fresh from an open, shows: false when another client
    /// changed the file since this client last saw or changed it, or when this client has
    /// seen no version of it. Notes `attr`'s version as the one cached from now on.
    pub fn cache_is_current(&self, attr: &Attr) -> bool {
        self.inner.seen.is_current(attr)
    }

    /// Handles of `ino` open in this client.
    pub fn handles_open(&self, ino: Ino) -> u32 {
        self.inner.files.inode(ino).map_or(0, |inode| inode.state().opens)
    }

    /// The cache in front of this client dropped everything of `ino`.
    pub fn forget_cached(&self, ino: Ino) {
        self.inner.seen.forget(ino);
    }

    pub fn read(&self, fh: FileHandleId, offset: u64, len: u32) -> FsResult<Vec<u8>> {
        let file = self.inner.files.get(fh)?;
        self.block(data::read(&self.inner, &file, offset, len))
    }

    /// Queues a write; its outcome is reported by a later `flush` or `fsync` if it fails.
    pub fn write(&self, fh: FileHandleId, offset: u64, bytes: &[u8]) -> FsResult<u32> {
        let file = self.inner.files.get(fh)?;
        self.block(data::write(&self.inner, &file, offset, bytes))?;
        Ok(bytes.len() as u32)
    }

    /// Whether the metadata service knows `DropPrivileges` (one older than it does not): a
    /// mount leaves privilege drops to the client only then. Asked on the root directory,
    /// where it drops nothing.
    pub fn knows_drop_privileges(&self) -> bool {
        let probe = MetaRequest::DropPrivileges { ino: stria_proto::fs::ROOT_INO, suidgid: false };
        matches!(self.meta(probe), Ok(MetaReply::Dropped { .. }))
    }

    /// Takes from the file what a write through `fh` must take first, when the kernel leaves
    /// that to the file system (FUSE_HANDLE_KILLPRIV_V2) instead of asking for the file's
    /// capability before every write: its `security.capability`, and set-user-ID and
    /// set-group-ID when `suidgid` (the writer lacks CAP_FSETID). The metadata service is
    /// asked only while the open file may have one of them: for a file opened (not created)
    /// here, once per open, and again after a change of its mode, owner or extended
    /// attributes through this client, or one by another client that the mount's watcher
    /// heard of (`Client::watch_changes`). True when something was dropped: the file's
    /// attributes changed.
    pub fn drop_privileges_for_write(&self, fh: FileHandleId, suidgid: bool) -> FsResult<bool> {
        let file = self.inner.files.get(fh)?;
        let Some(changes) = file.inode.privileges_to_drop(suidgid) else {
            return Ok(false);
        };
        match self.meta(MetaRequest::DropPrivileges { ino: file.ino, suidgid })? {
            MetaReply::Dropped { attr, dropped } => {
                file.inode.privileges_dropped(&attr, changes);
                Ok(dropped)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Waits for queued writes and publishes the size (close-to-open consistency). A handle
    /// opened without write access that never wrote flushes nothing: the writes of the file's
    /// other handles, and their errors, are theirs to flush and report.
    pub fn flush(&self, fh: FileHandleId) -> FsResult<()> {
        let file = self.inner.files.get(fh)?;
        self.flush_own(&file)
    }

    /// The flush of `file`'s own writes: none for a handle that cannot write.
    fn flush_own(&self, file: &OpenFile) -> FsResult<()> {
        if !file.writable() {
            return Ok(());
        }
        self.block(data::flush(&self.inner, file, false))
    }

    /// Whether a flush or close of `fh` would wait for queued writes: it can write, and writes
    /// to its file are still on their way to storage.
    pub fn has_queued_writes(&self, fh: FileHandleId) -> bool {
        self.inner
            .files
            .get(fh)
            .is_ok_and(|file| file.writable() && !file.inode.state().in_flight.is_empty())
    }

    /// The runtime the client's requests run on; callers that must not wait for a slow call
    /// on their own thread can run it on one of its blocking threads.
    pub fn runtime(&self) -> &Handle {
        &self.inner.runtime
    }

    /// Makes the file's data and metadata durable on every target it touches.
    pub fn fsync(&self, fh: FileHandleId) -> FsResult<()> {
        let file = self.inner.files.get(fh)?;
        self.block(data::flush(&self.inner, &file, true))
    }

    /// Closes a handle: queued writes finish and the size is published (for a handle that can
    /// write, as [`Client::flush`]); the last close of an unlinked file removes its chunks.
    pub fn release(&self, fh: FileHandleId) -> FsResult<()> {
        let file = self.inner.files.get(fh)?;
        let flushed = self.flush_own(&file);
        let gate = self.inner.locks.shared();
        self.inner.files.close(fh);
        let released =
            self.meta_at(MetaRequest::Release { ino: file.ino, client: self.inner.locks.id() })?;
        drop(gate);
        self.release_inode(released)?;
        flushed
    }

    pub fn getxattr(&self, caller: &Caller, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        // A file this client created and still has open has none: no request for that.
        if self.inner.files.has_no_xattrs(ino) {
            return Err(FsStatus::NoData);
        }
        // The kernel asks for security.capability before every write to a file (to drop file
        // capabilities a write must not keep). An open file that had none when asked is taken
        // to have none until this client changes its attributes or closes it: one request per
        // open, not one per write.
        let capability = name == CAPABILITY_XATTR;
        if capability && self.inner.files.has_no_capability(ino) {
            return Err(FsStatus::NoData);
        }
        let changes = self.inner.files.xattr_changes(ino);
        let reply =
            self.meta(MetaRequest::GetXattr { caller: caller.clone(), ino, name: name.to_vec() });
        match reply {
            Ok(MetaReply::Bytes(value)) => Ok(value),
            Err(FsStatus::NoData) => {
                if let (true, Some(changes)) = (capability, changes) {
                    self.inner.files.no_capability_since(ino, changes);
                }
                Err(FsStatus::NoData)
            }
            Ok(other) => Err(unexpected(&other)),
            Err(error) => Err(error),
        }
    }

    pub fn setxattr(
        &self,
        caller: &Caller,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrSetMode,
    ) -> FsResult<()> {
        self.inner.files.may_have_xattrs(ino);
        let set = self.meta(MetaRequest::SetXattr {
            caller: caller.clone(),
            ino,
            name: name.to_vec(),
            value: value.to_vec(),
            mode,
        });
        // Again once it is done: a getxattr sent meanwhile may have been answered before it.
        self.inner.files.may_have_xattrs(ino);
        set?;
        Ok(())
    }

    pub fn listxattr(&self, caller: &Caller, ino: Ino) -> FsResult<Vec<Vec<u8>>> {
        match self.meta(MetaRequest::ListXattr { caller: caller.clone(), ino })? {
            MetaReply::Names(names) => Ok(names),
            other => Err(unexpected(&other)),
        }
    }

    pub fn removexattr(&self, caller: &Caller, ino: Ino, name: &[u8]) -> FsResult<()> {
        self.inner.files.may_have_xattrs(ino);
        self.meta(MetaRequest::RemoveXattr { caller: caller.clone(), ino, name: name.to_vec() })?;
        Ok(())
    }

    pub fn statfs(&self) -> FsResult<StatFs> {
        // Space of removed files counts as free once it is.
        let _ = self.block(self.inner.purger.drain());
        match self.meta(MetaRequest::StatFs)? {
            MetaReply::StatFs(statfs) => Ok(statfs),
            other => Err(unexpected(&other)),
        }
    }

    /// Usage rankings (top `top` users, groups, filesets, extensions; at most
    /// [`stria_proto::wire::ANALYTICS_TOP_MAX`]), the size histogram and the total.
    pub fn analytics(&self, top: u32) -> FsResult<stria_proto::wire::Analytics> {
        match self.meta(MetaRequest::Analytics { top })? {
            MetaReply::Analytics(analytics) => Ok(analytics),
            other => Err(unexpected(&other)),
        }
    }

    pub fn layout_policy(&self, ino: Ino) -> FsResult<LayoutPolicy> {
        match self.meta(MetaRequest::GetLayoutPolicy { ino })? {
            MetaReply::Policy(policy) => Ok(policy),
            other => Err(unexpected(&other)),
        }
    }

    pub fn set_layout_policy(
        &self,
        caller: &Caller,
        ino: Ino,
        policy: LayoutPolicy,
    ) -> FsResult<()> {
        self.meta(MetaRequest::SetLayoutPolicy { caller: caller.clone(), ino, policy })?;
        Ok(())
    }

    /// Every target's capacity and state, as the storage services report them.
    pub fn targets(&self) -> FsResult<Vec<TargetInfo>> {
        self.block(self.inner.storage.list_targets())
    }

    /// Marks one drive of a target failed (administrative; the target goes degraded).
    pub fn fail_drive(&self, target: TargetId, slot: u32) -> FsResult<TargetInfo> {
        let request = stria_proto::wire::TargetFailDrive { target, slot };
        self.block(self.inner.storage.fail_drive(request))
    }

    /// Puts the drive at `path` into failed `slot` of `target` (administrative); the rebuild
    /// runs in the background. `path` is absolute, or a bare file name meaning the node's drive
    /// directory; with `create_bytes` a sparse drive file of that size is created there first
    /// (it must not exist). Shared by the CLI and the REST API.
    pub fn replace_drive(
        &self,
        target: TargetId,
        slot: u32,
        path: &str,
        create_bytes: Option<u64>,
    ) -> Result<TargetInfo, DriveChangeError> {
        let request = TargetReplaceDrive { target, slot, path: path.to_string(), create_bytes };
        self.block(self.inner.storage.change_drive(
            target,
            storage_method::TARGET_REPLACE_DRIVE,
            &request,
        ))
    }

    /// Labels the drive at `path` as a hot spare of `target` (administrative); paths as for
    /// [`Client::replace_drive`]. A slot that is out already takes the spare at once.
    pub fn add_spare(
        &self,
        target: TargetId,
        path: &str,
        create_bytes: Option<u64>,
    ) -> Result<TargetInfo, DriveChangeError> {
        let request = TargetAddSpare { target, path: path.to_string(), create_bytes };
        self.block(self.inner.storage.change_drive(
            target,
            storage_method::TARGET_ADD_SPARE,
            &request,
        ))
    }

    /// Gives an empty regular file the layout `policy` describes.
    pub fn set_file_layout(&self, caller: &Caller, ino: Ino, policy: LayoutPolicy) -> FsResult<()> {
        self.meta(MetaRequest::SetFileLayout { caller: caller.clone(), ino, policy })?;
        Ok(())
    }

    /// Makes every metadata change durable, and removes the chunks of released inodes.
    pub fn sync_meta(&self) -> FsResult<()> {
        self.block(self.inner.purger.sync())
    }

    /// `fsync` of directory `ino`: every metadata change durable; fails with `Io` when a
    /// change to the directory's entries was lost by a restart of the metadata service since
    /// the last sync (see `durability`).
    pub fn fsyncdir(&self, ino: Ino) -> FsResult<()> {
        self.sync_meta()?;
        if self.inner.watch.take_lost(ino) {
            return Err(FsStatus::Io);
        }
        Ok(())
    }

    /// Every file open through this client with the size it knows, its writes not yet
    /// published included: what recovery after a crashed service must not take for strays.
    pub fn open_file_sizes(&self) -> Vec<(Ino, u64)> {
        self.inner.files.sizes()
    }

    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }
}

/// Whether an open with access `mask` (access(2) bits: 4 read, 2 write) may write.
fn opens_for_writing(mask: u32) -> bool {
    const W_OK: u32 = 2;
    mask & W_OK != 0
}

pub(crate) fn unexpected(reply: &MetaReply) -> FsStatus {
    tracing::error!(?reply, "metadata service sent a reply of the wrong kind");
    FsStatus::Io
}
