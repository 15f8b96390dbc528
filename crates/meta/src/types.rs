//! The public value types of the metadata API.

use stria_proto::fs::{FileLayout, Ino};

/// Set-user-id, set-group-id and sticky bits of `mode`.
pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const S_ISVTX: u32 = 0o1000;
/// Permission bits a mode may carry (the file type lives in [`FileKind`]).
pub const MODE_BITS: u32 = 0o7777;

/// Access masks for [`crate::Meta::access`] (as `access(2)`); `F_OK` is 0.
pub const R_OK: u32 = 4;
pub const W_OK: u32 = 2;
pub const X_OK: u32 = 1;

/// Most links one inode may have (and most subdirectories of one directory).
pub const LINK_COUNT_MAX: u32 = 65_000;
/// Most entries one `readdir` call returns.
pub const READDIR_ENTRIES_MAX: usize = 4096;
/// Upper bounds of the file-size histogram classes; the last class is everything above.
pub const SIZE_CLASS_BOUNDS: [u64; 4] = [4 << 10, 64 << 10, 1 << 20, 64 << 20];
pub const SIZE_CLASSES: usize = SIZE_CLASS_BOUNDS.len() + 1;
/// Longest file-name extension that is counted on its own; longer ones count as "".
pub const EXTENSION_BYTES_MAX: usize = 16;

pub use stria_proto::wire::{Caller, DirEntry, FileKind, Timestamp};

/// The attributes of one inode, as `stat` shows them.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits, `MODE_BITS` only.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Device number of character and block devices.
    pub rdev: u32,
    /// Where a chunked regular file's bytes live; `None` for inline files and the rest.
    pub layout: Option<FileLayout>,
}

/// What `setattr` changes, and the times it sets (the server's clock or a given time), are
/// the wire types: `SetTime` is [`stria_proto::wire::TimeSet`].
pub use stria_proto::wire::{SetAttr, TimeSet as SetTime};

/// What `setattr` did: the new attributes and, for truncate, the size before.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SetAttrOutcome {
    pub attr: Attr,
    pub old_size: u64,
}

/// What a new non-directory inode is (`mknod`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NodeKind {
    File,
    Fifo,
    Socket,
    CharDevice { rdev: u32 },
    BlockDevice { rdev: u32 },
}

/// An inode whose data the caller must remove from storage now.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Purge {
    pub ino: Ino,
    pub size: u64,
    /// `None`: the data was inline (or it was not a regular file); nothing to remove.
    pub layout: Option<FileLayout>,
}

/// What `unlink` (or a replacing `rename`) did to the inode.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Unlinked {
    pub ino: Ino,
    /// Links left; 0 means the name was the last one.
    pub nlink: u32,
    /// Set when the inode is gone and its chunks must be removed now. `None` with `nlink == 0`
    /// means the file is still open: it became an orphan and `release` returns its purge.
    pub purge: Option<Purge>,
}

/// `renameat2` flags.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct RenameFlags {
    /// `RENAME_NOREPLACE`: fail with EEXIST if the target exists.
    pub noreplace: bool,
    /// `RENAME_EXCHANGE`: swap source and target atomically; both must exist.
    pub exchange: bool,
}

impl RenameFlags {
    pub const NONE: RenameFlags = RenameFlags { noreplace: false, exchange: false };
    pub const NOREPLACE: RenameFlags = RenameFlags { noreplace: true, exchange: false };
    pub const EXCHANGE: RenameFlags = RenameFlags { noreplace: false, exchange: true };
}

/// `setxattr` flags.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum XattrFlags {
    /// Create or replace.
    #[default]
    Any,
    /// `XATTR_CREATE`: fail with EEXIST if it exists.
    Create,
    /// `XATTR_REPLACE`: fail with ENODATA if it does not exist.
    Replace,
}

/// The outcome of `write_inline`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum InlineWrite {
    /// Written into the inode; the file's size now.
    Written { size: u64 },
    /// The write would make the file larger than `INLINE_DATA_MAX`: nothing was written; spill
    /// the file (`spill_begin`/`spill_commit`) and write to chunks.
    MustSpill,
    /// The file is already chunked: write to chunks and call `extend_size`.
    Chunked,
}

/// What [`crate::Meta::spill`] did.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Spilled {
    /// The file is chunked (it was, or it was empty and now is): its attributes.
    Chunked(Attr),
    /// The file holds inline bytes: write them to the plan's layout, then `spill_commit`.
    Plan(SpillPlan),
}

/// How to move an inline file to chunks; see [`crate::Meta::spill_begin`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SpillPlan {
    pub ino: Ino,
    /// The file's bytes: write them at offset 0 of the new layout before `spill_commit`.
    pub bytes: Vec<u8>,
    pub layout: FileLayout,
    /// The inline data version the plan was made from; a later inline write makes the
    /// commit fail with `EAGAIN` (plan again).
    pub version: u64,
}

/// Files and bytes counted against one uid, gid, fileset, size class or extension.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Usage {
    pub files: u64,
    pub bytes: u64,
}

/// Most entries [`crate::Meta::analytics`] returns per ranking.
pub const ANALYTICS_TOP_MAX: usize = 1000;

/// Usage of one fileset (a top-level directory, or the files directly in the root).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FilesetUsage {
    /// The top-level directory's inode; `ROOT_INO` for the files directly in the root.
    pub ino: Ino,
    /// Its name in the root (lossy UTF-8); "/" for the root's own files.
    pub name: String,
    pub usage: Usage,
}

/// The file-system analytics of one snapshot: rankings by bytes (ties by files, then id).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Analytics {
    pub total: Usage,
    pub users: Vec<(u32, Usage)>,
    pub groups: Vec<(u32, Usage)>,
    pub filesets: Vec<FilesetUsage>,
    /// "" is files without an extension.
    pub extensions: Vec<(String, Usage)>,
    /// Classes bounded by [`SIZE_CLASS_BOUNDS`].
    pub size_histogram: [Usage; SIZE_CLASSES],
}

/// `statfs`: inode counts from the namespace, byte capacity from the caller.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct StatFs {
    pub bytes_total: u64,
    pub bytes_free: u64,
    /// Sum of the sizes of all regular files (logical bytes, hard links once).
    pub bytes_used_logical: u64,
    pub inodes_total: u64,
    pub inodes_used: u64,
    pub inodes_free: u64,
    pub files: u64,
    pub name_bytes_max: u32,
}
