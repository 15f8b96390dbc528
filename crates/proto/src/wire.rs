//! Request and reply messages of the file-system services (meta and storage), carried as the
//! postcard-encoded message part of an RPC frame. Bulk data (chunk contents) travels as the
//! frame's raw data part, never inside these structs.
//!
//! Compatibility rule: variants and fields are only ever appended; the method numbers below are
//! stable and name the operation in logs and metrics.

use serde::{Deserialize, Serialize};

use crate::fs::{ChunkId, FileLayout, FsStatus, Ino, LayoutPolicy, ObjectId, TargetId};

/// The incarnation of a service's durable state: the same while nothing it acknowledged can
/// be lost, new after it lost acknowledged but unsynced changes (a restart after a crash). A
/// clean stop hands its epoch to the next start, since it synced everything.
///
/// Replies carry it so a client can tell whether a sync covers its earlier changes: the meta
/// service answers every call with `(Epoch, MetaReply, Instance)`, and the storage service answers
/// `CHUNK_WRITE`, `CHUNK_TRUNCATE`, `CHUNK_PUNCH`, `OBJECT_REMOVE`, `OBJECTS_REMOVE` and
/// `TARGET_SYNC` with the
/// epoch of the target's service. A change made under one epoch and a sync answered under
/// another means the change may be gone: the client reports the sync as failed (as NFS does
/// with its write verifier).
pub type Epoch = u64;

/// One run of the metadata service, new at every start (clean or not, unlike the epoch): a
/// client that sees it change tells the new run what it held ([`MetaRequest::Reclaim`]).
pub type Instance = u64;

/// A fresh epoch for a service whose unsynced state may have been lost.
pub fn new_epoch() -> Epoch {
    let id = crate::Uuid::random().0;
    u64::from_le_bytes([id[0], id[1], id[2], id[3], id[4], id[5], id[6], id[7]])
}

/// Method numbers of the metadata service (block 1000..1999).
pub mod meta_method {
    pub const CALL: u16 = 1000;
}

/// Method numbers of the storage service (block 2000..2999).
pub mod storage_method {
    pub const CHUNK_READ: u16 = 2000;
    pub const CHUNK_WRITE: u16 = 2001;
    pub const CHUNK_TRUNCATE: u16 = 2002;
    pub const OBJECT_REMOVE: u16 = 2003;
    pub const TARGET_SYNC: u16 = 2004;
    pub const TARGET_LIST: u16 = 2005;
    /// Administrative: mark one drive of a target failed (the array goes degraded).
    pub const TARGET_FAIL_DRIVE: u16 = 2006;
    /// Make a byte range of a chunk read as zeros, freeing its whole blocks (volume trim).
    pub const CHUNK_PUNCH: u16 = 2007;
    /// Which blocks of a chunk hold data (volume block status).
    pub const CHUNK_MAP: u16 = 2008;
    /// How many chunks and bytes one object holds on a target (volume allocated size).
    pub const OBJECT_SPACE: u16 = 2009;
    /// Administrative: put a new drive (or the slot's own drive, returning) into a failed slot
    /// of a running target and start its rebuild in the background.
    pub const TARGET_REPLACE_DRIVE: u16 = 2010;
    /// Administrative: label a drive as a hot spare of a running target.
    pub const TARGET_ADD_SPARE: u16 = 2011;
    /// Removes every chunk of many objects on one target in one chunk-map commit (the
    /// client's purge of removed files).
    pub const OBJECTS_REMOVE: u16 = 2012;
    /// Makes one object a copy of another on one target, sharing its blocks (copy-on-write):
    /// volume snapshots and clones. The whole copy in one call.
    pub const OBJECT_CLONE: u16 = 2013;
    /// Begins such a copy at this instant (quick: notes the source's chunks); later changes
    /// to the source copy their chunk first, and `OBJECT_CLONE_FINISH` finishes it.
    pub const OBJECT_CLONE_BEGIN: u16 = 2014;
    /// Finishes a copy `OBJECT_CLONE_BEGIN` began; `Invalid` when none is under way (the
    /// target restarted, or the copy was removed), so a copy is never silently begun late.
    pub const OBJECT_CLONE_FINISH: u16 = 2015;
}

/// RPC status codes of file-system errors: `FS_STATUS_BASE + FsStatus as u16`.
pub const FS_STATUS_BASE: u16 = 3000;

impl FsStatus {
    /// The RPC status code carrying this error.
    pub fn rpc_code(self) -> u16 {
        FS_STATUS_BASE + self as u16
    }

    /// The error an RPC status code carries, if it is a file-system code.
    pub fn from_rpc_code(code: u16) -> Option<FsStatus> {
        FsStatus::ALL.into_iter().find(|s| s.rpc_code() == code)
    }
}

/// Seconds and nanoseconds since the Unix epoch.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize,
)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    pub const fn new(secs: i64, nanos: u32) -> Timestamp {
        Timestamp { secs, nanos }
    }

    pub fn now() -> Timestamp {
        let d =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timestamp { secs: d.as_secs() as i64, nanos: d.subsec_nanos() }
    }
}

/// What an inode is. The discriminants are the stable codes stored on disk.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub enum FileKind {
    File = 0,
    Dir = 1,
    Symlink = 2,
    Fifo = 3,
    Socket = 4,
    CharDevice = 5,
    BlockDevice = 6,
}

impl FileKind {
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<FileKind> {
        Some(match code {
            0 => FileKind::File,
            1 => FileKind::Dir,
            2 => FileKind::Symlink,
            3 => FileKind::Fifo,
            4 => FileKind::Socket,
            5 => FileKind::CharDevice,
            6 => FileKind::BlockDevice,
            _ => return None,
        })
    }
}

/// The identity a request acts as: permission checks use it.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Caller {
    pub fn root() -> Caller {
        Caller::default()
    }

    pub fn new(uid: u32, gid: u32) -> Caller {
        Caller { uid, gid, groups: Vec::new() }
    }

    pub fn with_groups(mut self, groups: &[u32]) -> Caller {
        self.groups = groups.to_vec();
        self
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// The primary group or one of the supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// An inode's attributes as clients see them.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits including setuid, setgid and sticky (07777).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub rdev: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
    /// Where a chunked file's bytes live; `None` for inline files and everything else.
    pub layout: Option<FileLayout>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum TimeSet {
    Now,
    At(Timestamp),
}

/// The attributes a setattr changes; `None` leaves one as it is.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// The change comes through a handle the caller opened for writing (ftruncate(2)): write
    /// permission was checked at that open and is not checked again for the size, nor for
    /// times set to now, as on a local file system. A change by name (truncate(2)) leaves it
    /// false.
    pub writable_handle: bool,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileKind,
    /// Pass this cookie to continue reading after this entry.
    pub next_cookie: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct StatFs {
    pub bytes_total: u64,
    pub bytes_free: u64,
    pub files_total: u64,
    pub files_used: u64,
}

/// What an unlink, rmdir or replacing rename released: when the last link of a chunked file
/// went away, the caller removes its chunks from these targets.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Released {
    pub ino: Ino,
    pub layout: Option<FileLayout>,
}

/// Flags of rename(2)/renameat2(2).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct RenameFlags {
    pub no_replace: bool,
    pub exchange: bool,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum XattrSetMode {
    Any,
    Create,
    Replace,
}

/// One metadata request. Method number [`meta_method::CALL`]; [`MetaRequest::op_name`] names it
/// for logs and metrics.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum MetaRequest {
    Lookup {
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
    },
    GetAttr {
        ino: Ino,
    },
    SetAttr {
        caller: Caller,
        ino: Ino,
        set: SetAttr,
    },
    Create {
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
        kind: FileKind,
        mode: u32,
        rdev: u32,
        exclusive: bool,
        /// Also open the file (FUSE's create) for this access mask (`R_OK`/`W_OK` bits): the
        /// reply is `Open` instead of `Attr`. The creator of a new file may open it whatever
        /// its mode; a file that already existed (not `exclusive`, another client was first)
        /// is checked against the mask like any open.
        open: Option<u32>,
        /// The client the open is counted for (its session id, see `Hello`).
        client: u64,
    },
    Mkdir {
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
        mode: u32,
    },
    Symlink {
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
        target: Vec<u8>,
    },
    Link {
        caller: Caller,
        ino: Ino,
        new_parent: Ino,
        new_name: Vec<u8>,
    },
    Unlink {
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
    },
    Rmdir {
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
    },
    Rename {
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
        new_parent: Ino,
        new_name: Vec<u8>,
        flags: RenameFlags,
    },
    Readlink {
        ino: Ino,
    },
    Readdir {
        caller: Caller,
        ino: Ino,
        cookie: u64,
        max_entries: u32,
    },
    Access {
        caller: Caller,
        ino: Ino,
        mask: u32,
    },
    /// Checks open permission (mask from the access mode) and returns the attributes, plus the
    /// inline bytes of a small file.
    Open {
        caller: Caller,
        ino: Ino,
        mask: u32,
        /// The client the open is counted for (its session id, see `Hello`).
        client: u64,
    },
    ReadInline {
        ino: Ino,
    },
    /// Writes into an inline file; fails with `TooBig` when the result would not fit inline.
    WriteInline {
        ino: Ino,
        offset: u64,
        data: Vec<u8>,
    },
    /// First step of moving an inline file to chunks: returns the layout it will get and its
    /// inline bytes, changing nothing. The caller writes the bytes to chunk 0 durably, then
    /// sends `SpillCommit`, so a crash in between leaves the inline copy in force.
    Spill {
        ino: Ino,
    },
    /// Second step: the file becomes chunked with `layout`; refused with `Unavailable` when
    /// the inline bytes changed since the plan's `version` (plan again).
    SpillCommit {
        ino: Ino,
        layout: FileLayout,
        version: u64,
    },
    /// The close of a handle `client` opened with `Open`: an unlinked file is purged at its
    /// last release, and the reply names the chunks to remove. A release the client has no
    /// open left for (they went with its session, `ExpireClients`) changes nothing.
    Release {
        ino: Ino,
        client: u64,
    },
    /// Raises the size to at least `size` and sets mtime (data written through chunks);
    /// answered with `Extended` (the version before).
    ExtendSize {
        ino: Ino,
        size: u64,
        mtime: Timestamp,
    },
    GetXattr {
        caller: Caller,
        ino: Ino,
        name: Vec<u8>,
    },
    SetXattr {
        caller: Caller,
        ino: Ino,
        name: Vec<u8>,
        value: Vec<u8>,
        mode: XattrSetMode,
    },
    ListXattr {
        caller: Caller,
        ino: Ino,
    },
    RemoveXattr {
        caller: Caller,
        ino: Ino,
        name: Vec<u8>,
    },
    StatFs,
    /// Gives an empty regular file the layout `policy` describes (`setstripe` on a file).
    SetFileLayout {
        caller: Caller,
        ino: Ino,
        policy: LayoutPolicy,
    },
    GetLayoutPolicy {
        ino: Ino,
    },
    SetLayoutPolicy {
        caller: Caller,
        ino: Ino,
        policy: LayoutPolicy,
    },
    /// Makes every earlier metadata change durable.
    Sync,
    /// Usage rankings from the metadata service's counters ([`Analytics`]); `top` is at most
    /// [`ANALYTICS_TOP_MAX`], or the request is `Invalid`.
    Analytics {
        top: u32,
    },
    /// `Spill` for a first write that ends at `size`: an empty inline file becomes chunked
    /// and takes `size` and `mtime` in the same commit, so the close that follows has no size
    /// to publish. A file with inline bytes is answered as `Spill` is (`Spilled`); a chunked
    /// one with its attributes, unchanged.
    SpillSized {
        ino: Ino,
        size: u64,
        mtime: Timestamp,
    },
    /// F_GETLK: the first lock of another owner that would keep `owner` from taking `kind`
    /// (`Read` or `Write`) over `range` (`Lock(None)`: none would).
    GetLock {
        ino: Ino,
        owner: LockOwnerId,
        range: LockRange,
        kind: LockKind,
    },
    /// F_SETLK: takes `kind` over `range` for `owner`, or with `Unlock` drops the owner's
    /// locks there; `LockConflict` while another owner holds a conflicting lock. With `wait`
    /// (F_SETLKW, the client tries again while it conflicts) a conflict that closes a cycle of
    /// owners waiting for each other is `Deadlock`.
    SetLock {
        ino: Ino,
        owner: LockOwnerId,
        pid: u32,
        range: LockRange,
        kind: LockKind,
        wait: bool,
    },
    /// Drops every lock `owner` holds on the file (its process closed the file).
    ReleaseLocks {
        ino: Ino,
        owner: LockOwnerId,
    },
    /// Keeps the locks of `client` for another lease (see `meta::locks`); `Stale` when the
    /// lease had run out and its locks were dropped.
    RenewLocks {
        client: u64,
    },
    /// A client says who it is, and again every `LOCK_RENEW` while it runs: the sessions
    /// listed by `ListClients` (a mount of another machine, say). `NoSpace` past
    /// `CLIENT_SESSIONS_MAX` clients.
    Hello {
        client: u64,
        info: ClientInfo,
    },
    /// The client stops: its session goes from the list at once, and the files it still
    /// counts as open are released at the next `ExpireClients`.
    Goodbye {
        client: u64,
    },
    /// The sessions heard from within the last `LOCK_LEASE`: `Clients`.
    ListClients,
    /// Ends the sessions not heard from for a `LOCK_LEASE` (and those that said goodbye): the
    /// files their clients still had open are released, as their closes would have, and the
    /// unlinked ones among them purged: `Expired` names their chunks for the caller to remove
    /// (at most `EXPIRED_PURGES_MAX`; the rest come with the next call). Clients that never
    /// said hello (a node's own mount) keep their opens.
    ExpireClients,
    /// What a client held when the metadata service it talks to restarted (its replies came
    /// from a new `Instance`): its open handles per file and its byte-range locks, told in pieces
    /// of at most [`RECLAIM_PIECE_MAX`] each. The `first` piece replaces the opens the
    /// service counts for the client, later ones add to them. Locks are granted back only
    /// during the service's grace period and where nothing conflicts (or the owner still holds
    /// them: a lock is never lost by telling it again). `Reclaimed` says what could not be
    /// taken back.
    Reclaim {
        client: u64,
        first: bool,
        opens: Vec<(Ino, u32)>,
        locks: Vec<ReclaimedLock>,
    },
    /// The namespace changes made through other connections since `after` (None: from now
    /// on), waiting up to `wait_ms` (at most [`CHANGES_WAIT_MAX_MS`]) for one: `Changes`. A
    /// mount uses them to drop what its kernel cached of names and attributes another client
    /// changed, so it can cache them for longer than it could otherwise.
    WatchChanges {
        after: Option<ChangeCursor>,
        wait_ms: u32,
    },
    /// What a write takes from a regular file before it lands: its `security.capability`,
    /// always, and set-user-ID and set-group-ID (the latter only with group execute) when
    /// `suidgid` (the writer may not keep them: it lacks CAP_FSETID). A mount sends it when
    /// the kernel leaves this to the file system (FUSE_HANDLE_KILLPRIV_V2) instead of asking
    /// for the capability before every write. The writer opened the file for writing, so no
    /// permission is checked: it only ever takes away. `Dropped`.
    DropPrivileges {
        ino: Ino,
        suidgid: bool,
    },
}

/// Longest a [`MetaRequest::WatchChanges`] waits for a change.
pub const CHANGES_WAIT_MAX_MS: u32 = 10_000;
/// Most changes one [`ChangeBatch`] carries; the rest come with the next call.
pub const CHANGES_PER_BATCH_MAX: usize = 4096;

/// Where a client is in the metadata service's log of changes: the log (one per run of the
/// service) and the sequence number of the next change to read.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ChangeCursor {
    pub log: u64,
    pub next: u64,
}

/// One namespace change, as a client's caches see it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Change {
    /// The name `name` in `parent` now names something else, or nothing, or (created) names
    /// something where it named nothing.
    Entry { parent: Ino, name: Vec<u8> },
    /// The attributes of `ino` (a directory's for a change of its entries) changed.
    Attr { ino: Ino },
}

/// The reply to [`MetaRequest::WatchChanges`].
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ChangeBatch {
    /// Changes made through other connections, oldest first.
    pub changes: Vec<Change>,
    /// Where the next call starts.
    pub cursor: ChangeCursor,
    /// False when changes after the caller's cursor are no longer known (the log moved past
    /// them, or the service restarted): anything cached may be stale.
    pub complete: bool,
}

/// Most opens, and most locks, in one [`MetaRequest::Reclaim`] (more is `Invalid`).
pub const RECLAIM_PIECE_MAX: usize = 65536;

/// A byte-range lock a client held before the metadata service restarted.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ReclaimedLock {
    pub ino: Ino,
    /// The owner within the client (the client is the request's).
    pub owner: u64,
    pub pid: u32,
    pub range: LockRange,
    /// `Read` or `Write`.
    pub kind: LockKind,
}

/// Most purges one [`MetaReply::Expired`] carries.
pub const EXPIRED_PURGES_MAX: usize = 1024;

/// Most client sessions the metadata service lists at once.
pub const CLIENT_SESSIONS_MAX: usize = 4096;
/// Longest text field of a [`ClientInfo`] (bytes); longer ones are refused (`Invalid`).
pub const CLIENT_INFO_TEXT_MAX: usize = 256;

/// What a client tells about itself ([`MetaRequest::Hello`]).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ClientInfo {
    /// `fuse` for a mount.
    pub kind: String,
    /// Its mount point, on its own machine.
    pub mount: String,
    /// Its machine's host name.
    pub host: String,
    /// Its process id, on its own machine.
    pub pid: u32,
}

/// A client heard from lately ([`MetaReply::Clients`]).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ClientSession {
    pub client: u64,
    pub info: ClientInfo,
    /// First heard from, in seconds since the Unix epoch.
    pub since_unix_s: u64,
}

/// How long the metadata service keeps a client's byte-range locks without hearing from it.
pub const LOCK_LEASE: std::time::Duration = std::time::Duration::from_secs(30);
/// How often a client that holds locks renews its lease (a third of it: two renewals may be
/// lost before the locks are).
pub const LOCK_RENEW: std::time::Duration = std::time::Duration::from_secs(10);

/// A byte-range lock's kind, as F_RDLCK, F_WRLCK and F_UNLCK.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum LockKind {
    Read,
    Write,
    Unlock,
}

/// Who holds a lock: a client (the random id it picked at start) and the owner within it
/// (the kernel's lock owner: one per process, for POSIX locks).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub struct LockOwnerId {
    pub client: u64,
    pub owner: u64,
}

/// Bytes `start..=end` of a file. An `end` of `i64::MAX` (the kernel's own) or more reaches
/// past any end of file; the mount reports a lock's end as at most `i64::MAX`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct LockRange {
    pub start: u64,
    pub end: u64,
}

/// A lock someone holds, as F_GETLK reports it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct LockHolder {
    pub range: LockRange,
    /// `Read` or `Write`.
    pub kind: LockKind,
    /// The holder's process id, on its own machine.
    pub pid: u32,
}

impl MetaRequest {
    /// The inodes whose durable state the request changes (for a create, the new inode is in
    /// the reply): a directory for a change of its entries, a file for its attributes, size,
    /// inline bytes, extended attributes or layout. Empty for reads, `Open`, `Release` (its
    /// effect, a purge, is tracked by the purge queue), `Spill` (a plan) and `Sync`.
    pub fn changed_inodes(&self) -> Vec<Ino> {
        match self {
            MetaRequest::SetAttr { ino, .. }
            | MetaRequest::WriteInline { ino, .. }
            | MetaRequest::SpillCommit { ino, .. }
            | MetaRequest::ExtendSize { ino, .. }
            | MetaRequest::SpillSized { ino, .. }
            | MetaRequest::SetXattr { ino, .. }
            | MetaRequest::RemoveXattr { ino, .. }
            | MetaRequest::SetFileLayout { ino, .. }
            | MetaRequest::SetLayoutPolicy { ino, .. } => vec![*ino],
            MetaRequest::Create { parent, .. }
            | MetaRequest::Mkdir { parent, .. }
            | MetaRequest::Symlink { parent, .. }
            | MetaRequest::Unlink { parent, .. }
            | MetaRequest::Rmdir { parent, .. } => vec![*parent],
            MetaRequest::Link { ino, new_parent, .. } => vec![*ino, *new_parent],
            MetaRequest::Rename { parent, new_parent, .. } => vec![*parent, *new_parent],
            MetaRequest::Lookup { .. }
            | MetaRequest::GetAttr { .. }
            | MetaRequest::Readlink { .. }
            | MetaRequest::Readdir { .. }
            | MetaRequest::Access { .. }
            | MetaRequest::Open { .. }
            | MetaRequest::ReadInline { .. }
            | MetaRequest::Spill { .. }
            | MetaRequest::Release { .. }
            | MetaRequest::GetXattr { .. }
            | MetaRequest::ListXattr { .. }
            | MetaRequest::StatFs
            | MetaRequest::GetLayoutPolicy { .. }
            | MetaRequest::Sync
            | MetaRequest::Analytics { .. }
            | MetaRequest::GetLock { .. }
            | MetaRequest::SetLock { .. }
            | MetaRequest::ReleaseLocks { .. }
            | MetaRequest::RenewLocks { .. }
            | MetaRequest::Hello { .. }
            | MetaRequest::Goodbye { .. }
            | MetaRequest::ListClients
            | MetaRequest::ExpireClients
            | MetaRequest::Reclaim { .. }
            | MetaRequest::WatchChanges { .. }
            // Only when something was dropped (the service notes it then).
            | MetaRequest::DropPrivileges { .. } => Vec::new(),
        }
    }

    /// The one directory whose entries the request changes, if it names one: the service
    /// answers with its attributes too ([`MetaReply::WithParent`]).
    pub fn parent_changed(&self) -> Option<Ino> {
        match self {
            MetaRequest::Create { parent, .. }
            | MetaRequest::Mkdir { parent, .. }
            | MetaRequest::Symlink { parent, .. }
            | MetaRequest::Unlink { parent, .. }
            | MetaRequest::Rmdir { parent, .. } => Some(*parent),
            MetaRequest::Link { new_parent, .. } => Some(*new_parent),
            _ => None,
        }
    }

    /// What a successful run of the request changes as other clients' caches see it: the
    /// names it adds, removes or rebinds (a mount caches names as absent too), and the
    /// attributes of [`MetaRequest::changed_inodes`].
    pub fn namespace_changes(&self) -> Vec<Change> {
        let mut changes = match self {
            MetaRequest::Unlink { parent, name, .. }
            | MetaRequest::Rmdir { parent, name, .. }
            | MetaRequest::Create { parent, name, .. }
            | MetaRequest::Mkdir { parent, name, .. }
            | MetaRequest::Symlink { parent, name, .. }
            | MetaRequest::Link { new_parent: parent, new_name: name, .. } => {
                vec![Change::Entry { parent: *parent, name: name.clone() }]
            }
            MetaRequest::Rename { parent, name, new_parent, new_name, .. } => vec![
                Change::Entry { parent: *parent, name: name.clone() },
                Change::Entry { parent: *new_parent, name: new_name.clone() },
            ],
            _ => Vec::new(),
        };
        changes.extend(self.changed_inodes().into_iter().map(|ino| Change::Attr { ino }));
        changes
    }

    /// Whether running the request twice leaves the same state and answer as running it once,
    /// so a client may send it again when the connection broke before the reply: reads, and
    /// changes that set absolute values. Not the ones that add or remove names, count opens,
    /// or refuse a second time (creates, links, removals, renames, opens, releases, xattr
    /// changes).
    pub fn is_idempotent(&self) -> bool {
        self.is_read_only()
            || matches!(
                self,
                MetaRequest::SetAttr { .. }
                    | MetaRequest::WriteInline { .. }
                    | MetaRequest::Spill { .. }
                    | MetaRequest::SpillSized { .. }
                    | MetaRequest::SpillCommit { .. }
                    | MetaRequest::ExtendSize { .. }
                    | MetaRequest::SetFileLayout { .. }
                    | MetaRequest::SetLayoutPolicy { .. }
                    | MetaRequest::DropPrivileges { .. }
                    | MetaRequest::Sync
                    | MetaRequest::GetLock { .. }
                    | MetaRequest::SetLock { .. }
                    | MetaRequest::ReleaseLocks { .. }
                    | MetaRequest::RenewLocks { .. }
                    | MetaRequest::Hello { .. }
                    | MetaRequest::Goodbye { .. }
                    | MetaRequest::ListClients
            )
    }

    /// Whether the request only reads the namespace.
    pub fn is_read_only(&self) -> bool {
        matches!(
            self,
            MetaRequest::Lookup { .. }
                | MetaRequest::GetAttr { .. }
                | MetaRequest::Readlink { .. }
                | MetaRequest::Readdir { .. }
                | MetaRequest::Access { .. }
                | MetaRequest::ReadInline { .. }
                | MetaRequest::GetXattr { .. }
                | MetaRequest::ListXattr { .. }
                | MetaRequest::StatFs
                | MetaRequest::GetLayoutPolicy { .. }
                | MetaRequest::Analytics { .. }
                | MetaRequest::WatchChanges { .. }
        )
    }

    pub fn op_name(&self) -> &'static str {
        match self {
            MetaRequest::Lookup { .. } => "lookup",
            MetaRequest::GetAttr { .. } => "getattr",
            MetaRequest::SetAttr { .. } => "setattr",
            MetaRequest::Create { .. } => "create",
            MetaRequest::Mkdir { .. } => "mkdir",
            MetaRequest::Symlink { .. } => "symlink",
            MetaRequest::Link { .. } => "link",
            MetaRequest::Unlink { .. } => "unlink",
            MetaRequest::Rmdir { .. } => "rmdir",
            MetaRequest::Rename { .. } => "rename",
            MetaRequest::Readlink { .. } => "readlink",
            MetaRequest::Readdir { .. } => "readdir",
            MetaRequest::Access { .. } => "access",
            MetaRequest::Open { .. } => "open",
            MetaRequest::ReadInline { .. } => "read_inline",
            MetaRequest::WriteInline { .. } => "write_inline",
            MetaRequest::Spill { .. } => "spill",
            MetaRequest::SpillSized { .. } => "spill_sized",
            MetaRequest::SpillCommit { .. } => "spill_commit",
            MetaRequest::Release { .. } => "release",
            MetaRequest::ExtendSize { .. } => "extend_size",
            MetaRequest::GetXattr { .. } => "getxattr",
            MetaRequest::SetXattr { .. } => "setxattr",
            MetaRequest::ListXattr { .. } => "listxattr",
            MetaRequest::RemoveXattr { .. } => "removexattr",
            MetaRequest::StatFs => "statfs",
            MetaRequest::SetFileLayout { .. } => "set_file_layout",
            MetaRequest::GetLayoutPolicy { .. } => "get_layout_policy",
            MetaRequest::SetLayoutPolicy { .. } => "set_layout_policy",
            MetaRequest::Sync => "sync",
            MetaRequest::Analytics { .. } => "analytics",
            MetaRequest::GetLock { .. } => "getlk",
            MetaRequest::SetLock { .. } => "setlk",
            MetaRequest::ReleaseLocks { .. } => "release_locks",
            MetaRequest::RenewLocks { .. } => "renew_locks",
            MetaRequest::Hello { .. } => "hello",
            MetaRequest::Goodbye { .. } => "goodbye",
            MetaRequest::ListClients => "list_clients",
            MetaRequest::ExpireClients => "expire_clients",
            MetaRequest::Reclaim { .. } => "reclaim",
            MetaRequest::WatchChanges { .. } => "watch_changes",
            MetaRequest::DropPrivileges { .. } => "drop_privileges",
        }
    }
}

/// The reply to a [`MetaRequest`] (errors travel as RPC status codes, not here).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum MetaReply {
    Attr(Attr),
    /// setattr: the new attributes and the size before (so a truncate can trim chunks).
    SetAttr {
        attr: Attr,
        old_size: u64,
    },
    Released(Option<Released>),
    Bytes(Vec<u8>),
    Entries(Vec<DirEntry>),
    Open {
        attr: Attr,
        inline: Option<Vec<u8>>,
        /// The open created the file (FUSE's create): it has no extended attributes yet.
        created: bool,
    },
    Spilled {
        layout: FileLayout,
        data: Vec<u8>,
        version: u64,
    },
    Names(Vec<Vec<u8>>),
    StatFs(StatFs),
    Policy(LayoutPolicy),
    Done,
    Analytics(Analytics),
    Lock(Option<LockHolder>),
    /// `ExtendSize`: the size and mtime the file had just before.
    Extended {
        size_before: u64,
        mtime_before: Timestamp,
    },
    Clients(Vec<ClientSession>),
    /// What `ExpireClients` released: the purged files' chunks, for the caller to remove.
    Expired(Vec<Released>),
    /// `Reclaim`: how many open handles were of files that are gone, and the locks not
    /// granted back.
    Reclaimed {
        opens_lost: u32,
        locks_lost: Vec<ReclaimedLock>,
    },
    /// The reply to a change of one directory's entries ([`MetaRequest::parent_changed`]),
    /// with the directory's attributes just after it.
    WithParent {
        reply: Box<MetaReply>,
        parent: Attr,
    },
    Changes(ChangeBatch),
    /// `DropPrivileges`: the attributes after, and whether anything was dropped.
    Dropped {
        attr: Attr,
        dropped: bool,
    },
}

/// Most entries per ranking an [`MetaRequest::Analytics`] may ask for.
pub const ANALYTICS_TOP_MAX: u32 = 100;

/// Regular files and their logical bytes (hard links counted once).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct UsageCount {
    pub files: u64,
    pub bytes: u64,
}

/// Usage of one uid or gid.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct IdUsage {
    pub id: u32,
    pub usage: UsageCount,
}

/// Usage of one fileset: a top-level directory, or the files directly in the root.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct FilesetUsage {
    /// The top-level directory (`ROOT_INO` for the root's own files).
    pub ino: Ino,
    /// Its name in the root (lossy UTF-8), "/" for the root's own files.
    pub name: String,
    pub usage: UsageCount,
}

/// Usage of one lower-case file-name extension ("" for names without one).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ExtensionUsage {
    pub extension: String,
    pub usage: UsageCount,
}

/// The reply to [`MetaRequest::Analytics`]: rankings by bytes, most first, from one snapshot.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Analytics {
    pub total: UsageCount,
    pub users: Vec<IdUsage>,
    pub groups: Vec<IdUsage>,
    pub filesets: Vec<FilesetUsage>,
    pub extensions: Vec<ExtensionUsage>,
    /// One entry per size class, smallest first; class `i` holds files of at least
    /// `size_class_bounds_bytes[i - 1]` and under `size_class_bounds_bytes[i]` bytes.
    pub size_histogram: Vec<UsageCount>,
    /// The upper bounds of all classes but the last (which is open).
    pub size_class_bounds_bytes: Vec<u64>,
}

/// Storage requests; chunk contents go in the frame's data part.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ChunkRead {
    pub target: TargetId,
    pub chunk: ChunkId,
    pub offset: u32,
    pub len: u32,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ChunkWrite {
    pub target: TargetId,
    pub chunk: ChunkId,
    pub offset: u32,
    /// CRC32C of the data part, checked by the target before anything is stored.
    pub crc: u32,
    /// Make the write durable before replying (O_SYNC/FUA semantics).
    pub sync: bool,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ChunkTruncate {
    pub target: TargetId,
    pub chunk: ChunkId,
    pub len: u32,
}

/// Removes the chunks of `object` with index >= `from_index` on one target.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ObjectRemove {
    pub target: TargetId,
    pub object: ObjectId,
    pub from_index: u64,
}

/// Most objects one [`ObjectsRemove`] may name.
pub const OBJECTS_REMOVE_MAX: usize = 4096;

/// Removes every chunk of each of `objects` on one target (at most [`OBJECTS_REMOVE_MAX`]).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ObjectsRemove {
    pub target: TargetId,
    pub objects: Vec<ObjectId>,
}

/// Makes `dest` a copy of `source` on one target: every chunk record of `source` is copied
/// and names the same blocks, which are shared until either object writes them. `dest` must
/// have no chunks there (`Invalid` otherwise). Durable after the target's next sync, as a
/// write is; the reply is the epoch. The body of `OBJECT_CLONE`, `OBJECT_CLONE_BEGIN` and
/// `OBJECT_CLONE_FINISH`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ObjectClone {
    pub target: TargetId,
    pub source: ObjectId,
    pub dest: ObjectId,
}

/// Makes `[offset, offset + len)` of a chunk read as zeros: whole blocks in the range are
/// freed, partial edge blocks are rewritten with the range zeroed. A chunk left with no block
/// holding data is removed (it reads as zeros just the same); a missing chunk stays missing.
/// The range must end within [`crate::fs::CHUNK_BYTES_MAX`], or the request is `Invalid`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ChunkPunch {
    pub target: TargetId,
    pub chunk: ChunkId,
    pub offset: u32,
    pub len: u32,
}

/// Asks which blocks of a chunk hold data; the reply is a [`ChunkMapReply`].
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ChunkMap {
    pub target: TargetId,
    pub chunk: ChunkId,
}

/// A run of logical 4 KiB blocks ([`crate::BLOCK_BYTES`]) of a chunk that hold data.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct BlockRun {
    pub first_block: u32,
    pub blocks: u32,
}

/// The mapped runs of a chunk in block order; every block outside them is a hole (reads as
/// zeros). A missing chunk has none. At most [`CHUNK_MAP_RUNS_MAX`] runs.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ChunkMapReply {
    pub runs: Vec<BlockRun>,
}

/// Most runs a chunk can have: every other block of the largest chunk mapped.
pub const CHUNK_MAP_RUNS_MAX: usize =
    (crate::fs::CHUNK_BYTES_MAX as usize / crate::BLOCK_BYTES).div_ceil(2);
// The largest map reply (about 10 bytes a run) fits one RPC message with room to spare.
const _: () = assert!(CHUNK_MAP_RUNS_MAX * 10 < 1024 * 1024);

/// Asks what one object holds on one target; the reply is an [`ObjectSpaceReply`].
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ObjectSpace {
    pub target: TargetId,
    pub object: ObjectId,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct ObjectSpaceReply {
    /// Bytes of the blocks that hold the object's data (4 KiB per mapped block).
    pub allocated_bytes: u64,
    /// The object's chunks on this target.
    pub chunks: u64,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct TargetSync {
    pub target: TargetId,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct TargetFailDrive {
    pub target: TargetId,
    pub slot: u32,
}

/// Puts `path` into failed `slot` of `target`; the rebuild runs in the background. The reply is
/// the target's [`TargetInfo`]; a refusal carries a [`DriveChangeRefused`] in its message part.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct TargetReplaceDrive {
    pub target: TargetId,
    pub slot: u32,
    /// See [`check_drive_path`].
    pub path: String,
    /// Create the drive file first, sparse, of this many bytes (it must not exist yet);
    /// `None`: the path must exist (a drive file or a block device).
    pub create_bytes: Option<u64>,
}

/// Labels `path` as a hot spare of `target`; if a slot is out already, the spare takes it at
/// once and rebuilds in the background. Reply and refusal as for [`TargetReplaceDrive`].
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct TargetAddSpare {
    pub target: TargetId,
    /// See [`check_drive_path`].
    pub path: String,
    pub create_bytes: Option<u64>,
}

/// The request field a refused drive change is about.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum DriveField {
    Target,
    Slot,
    Path,
    CreateBytes,
}

/// The message part of a refused [`TargetReplaceDrive`] or [`TargetAddSpare`] (the RPC status
/// is the [`FsStatus`]): one sentence for the operator, and the field at fault.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct DriveChangeRefused {
    pub message: String,
    pub field: Option<DriveField>,
}

/// Longest drive path a drive change accepts (Linux's PATH_MAX).
pub const DRIVE_PATH_BYTES_MAX: usize = 4096;
/// Largest drive file a drive change creates (1 PiB; the file is sparse, but a size past what
/// the file system allows is refused there).
pub const DRIVE_CREATE_BYTES_MAX: u64 = 1 << 50;

/// Where a drive named in a drive change is, before any file is looked at.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DrivePath<'a> {
    /// An absolute path, used as it is.
    Absolute(&'a str),
    /// A bare file name: the file of that name in the node's drive directory (`DATA/drives/`
    /// under `stria up`).
    InDriveDir(&'a str),
}

/// Checks the path of a drive change: absolute without `..` components, or a bare file name
/// (no `/`, not `.` or `..`) meaning the node's drive directory. Pure: the storage service,
/// the REST API and the CLI all call it, so they refuse the same paths with the same words.
pub fn check_drive_path(path: &str) -> Result<DrivePath<'_>, String> {
    if path.is_empty() {
        return Err("the drive path is empty: give an absolute path or a bare file name".into());
    }
    if path.len() > DRIVE_PATH_BYTES_MAX {
        return Err(format!("the drive path is longer than {DRIVE_PATH_BYTES_MAX} bytes"));
    }
    if path.contains('\0') {
        return Err("the drive path contains a NUL byte".into());
    }
    if let Some(rest) = path.strip_prefix('/') {
        if rest.split('/').any(|c| c == "..") {
            return Err(format!("drive path '{path}' must not contain '..' components"));
        }
        return Ok(DrivePath::Absolute(path));
    }
    if path.contains('/') || path == "." || path == ".." {
        return Err(format!(
            "drive path '{path}' is relative: give an absolute path, or a bare file name (it then \
             means the node's drive directory, DATA/drives/NAME)"
        ));
    }
    Ok(DrivePath::InDriveDir(path))
}

/// One target's state as the storage service reports it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct TargetInfo {
    pub target: TargetId,
    pub pool: String,
    pub raid: String,
    pub state: String,
    pub bytes_total: u64,
    pub bytes_used: u64,
    pub chunks: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drive_paths_are_absolute_or_bare_names() {
        assert_eq!(check_drive_path("/dev/nvme1n1"), Ok(DrivePath::Absolute("/dev/nvme1n1")));
        assert_eq!(check_drive_path("/a/./b.img"), Ok(DrivePath::Absolute("/a/./b.img")));
        assert_eq!(check_drive_path("new.img"), Ok(DrivePath::InDriveDir("new.img")));
        for bad in
            ["", ".", "..", "drives/x.img", "./x.img", "../x.img", "/a/../etc/passwd", "a\0b"]
        {
            assert!(check_drive_path(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(check_drive_path(&format!("/{}", "a".repeat(DRIVE_PATH_BYTES_MAX))).is_err());
        assert!(check_drive_path("..").expect_err("refused").contains("relative"));
    }

    #[test]
    fn fs_status_codes_round_trip() {
        for code in FS_STATUS_BASE..FS_STATUS_BASE + 30 {
            if let Some(s) = FsStatus::from_rpc_code(code) {
                assert_eq!(s.rpc_code(), code);
            }
        }
        assert_eq!(FsStatus::from_rpc_code(FsStatus::Quota.rpc_code()), Some(FsStatus::Quota));
        assert_eq!(FsStatus::from_rpc_code(0), None);
    }
}
