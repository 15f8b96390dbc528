//! File-system ids, layouts, limits and status codes shared by meta, storage, client and fuse.
//!
//! The numbers here are stable: they travel in RPC frames and are stored on disk.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An inode number. The root directory is [`ROOT_INO`]. A regular file's data chunks are
/// addressed by its inode number, so an `Ino` is also an [`ObjectId`] for files.
pub type Ino = u64;

/// The root directory's inode number (as FUSE expects).
pub const ROOT_INO: Ino = 1;

/// Files up to this size keep their bytes inside the inode record; larger files live in chunks.
pub const INLINE_DATA_MAX: usize = 3 * 1024;

/// Longest name of one directory entry, in bytes (as NAME_MAX on Linux).
pub const NAME_BYTES_MAX: usize = 255;
/// Longest symlink target, in bytes.
pub const SYMLINK_BYTES_MAX: usize = 4095;
/// Largest extended attribute value and name.
pub const XATTR_VALUE_BYTES_MAX: usize = 64 * 1024;
pub const XATTR_NAME_BYTES_MAX: usize = 255;

/// The extended attribute that holds a file's capabilities: a write, a chown and a truncate
/// drop it, as on a local file system.
pub const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// Whether a write by someone without CAP_FSETID clears bits of `mode`: set-user-ID, or
/// set-group-ID with group execute (without it, set-group-ID marks mandatory locking).
pub fn has_suid(mode: u32) -> bool {
    const SUID: u32 = 0o4000;
    const SGID_GROUP_EXEC: u32 = 0o2010;
    mode & SUID != 0 || mode & SGID_GROUP_EXEC == SGID_GROUP_EXEC
}

/// Chunk (stripe) size bounds for a file layout; a chunk never spans targets.
pub const CHUNK_BYTES_MIN: u32 = 64 * 1024;
pub const CHUNK_BYTES_MAX: u32 = 16 * 1024 * 1024;
/// The default chunk size of new files: one 1 MiB piece per target in round robin.
pub const CHUNK_BYTES_DEFAULT: u32 = 1024 * 1024;
/// Most targets one file may be striped over.
pub const STRIPE_COUNT_MAX: u32 = 256;

/// The object whose chunks a target stores: a file's inode number, or a volume's id
/// (volumes take ids with the top bit set so they never collide with inodes).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct ObjectId(pub u64);

impl ObjectId {
    pub const VOLUME_BIT: u64 = 1 << 63;
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// One chunk: the `index`-th piece of an object, `chunk_bytes` long in the object's layout.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct ChunkId {
    pub object: ObjectId,
    pub index: u64,
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.object, self.index)
    }
}

/// A storage target's number, unique in the cluster (assigned by mgmt at registration).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct TargetId(pub u32);

impl fmt::Display for TargetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

/// How a file's bytes are spread: chunk `i` covers bytes `[i*chunk_bytes, (i+1)*chunk_bytes)`
/// and lives on `targets[i % targets.len()]` (Lustre's RAID-0 striping, 3FS's chunk layout).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct FileLayout {
    pub pool: String,
    pub chunk_bytes: u32,
    pub targets: Vec<TargetId>,
}

impl FileLayout {
    /// The target that stores chunk `index`.
    pub fn target_of(&self, index: u64) -> TargetId {
        self.targets[(index % self.targets.len() as u64) as usize]
    }

    /// Checks the bounds every layout must respect, naming the one that fails.
    pub fn validate(&self) -> Result<(), String> {
        if !(CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX).contains(&self.chunk_bytes)
            || !self.chunk_bytes.is_power_of_two()
        {
            return Err(format!(
                "stripe size {} must be a power of two between {} KiB and {} MiB",
                self.chunk_bytes,
                CHUNK_BYTES_MIN / 1024,
                CHUNK_BYTES_MAX / (1024 * 1024)
            ));
        }
        if self.targets.is_empty() || self.targets.len() > STRIPE_COUNT_MAX as usize {
            return Err(format!(
                "stripe count {} must be between 1 and {STRIPE_COUNT_MAX}",
                self.targets.len()
            ));
        }
        Ok(())
    }
}

/// A directory's default layout, inherited by files created in it. A stripe count of 0 means
/// "every target of the pool".
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct LayoutPolicy {
    pub pool: String,
    pub chunk_bytes: u32,
    pub stripe_count: u32,
}

impl Default for LayoutPolicy {
    fn default() -> Self {
        LayoutPolicy { pool: "default".into(), chunk_bytes: CHUNK_BYTES_DEFAULT, stripe_count: 0 }
    }
}

/// Stable status codes of every file-system RPC. Each maps to one Linux errno, which the FUSE
/// mount returns as is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[repr(u16)]
pub enum FsStatus {
    NotFound = 1,
    Exists = 2,
    NotDir = 3,
    IsDir = 4,
    NotEmpty = 5,
    Access = 6,
    Perm = 7,
    NoSpace = 8,
    Io = 9,
    Invalid = 10,
    NameTooLong = 11,
    NoData = 12,
    Range = 13,
    TooManyLinks = 14,
    CrossDevice = 15,
    Busy = 16,
    Loop = 17,
    ReadOnly = 18,
    Unavailable = 19,
    TooBig = 20,
    NotSupported = 21,
    Stale = 22,
    Quota = 23,
    /// A byte-range lock another owner holds (F_SETLK's EAGAIN).
    LockConflict = 24,
    /// A wait (F_SETLKW) ended by a signal to the waiting process.
    Interrupted = 25,
    /// No room for another byte-range lock.
    NoLocks = 26,
    /// The metadata service restarted and gives its clients a grace period to reclaim the
    /// locks they held; new locks wait for its end (a client tries again).
    Grace = 27,
    /// A lock wait (F_SETLKW) that would close a cycle of owners waiting for each other.
    Deadlock = 28,
}

impl FsStatus {
    /// Every status, in code order.
    pub const ALL: [FsStatus; 28] = [
        FsStatus::NotFound,
        FsStatus::Exists,
        FsStatus::NotDir,
        FsStatus::IsDir,
        FsStatus::NotEmpty,
        FsStatus::Access,
        FsStatus::Perm,
        FsStatus::NoSpace,
        FsStatus::Io,
        FsStatus::Invalid,
        FsStatus::NameTooLong,
        FsStatus::NoData,
        FsStatus::Range,
        FsStatus::TooManyLinks,
        FsStatus::CrossDevice,
        FsStatus::Busy,
        FsStatus::Loop,
        FsStatus::ReadOnly,
        FsStatus::Unavailable,
        FsStatus::TooBig,
        FsStatus::NotSupported,
        FsStatus::Stale,
        FsStatus::Quota,
        FsStatus::LockConflict,
        FsStatus::Interrupted,
        FsStatus::NoLocks,
        FsStatus::Grace,
        FsStatus::Deadlock,
    ];

    /// The Linux errno the FUSE mount returns for this status.
    pub fn errno(self) -> i32 {
        match self {
            FsStatus::NotFound => 2,      // ENOENT
            FsStatus::Exists => 17,       // EEXIST
            FsStatus::NotDir => 20,       // ENOTDIR
            FsStatus::IsDir => 21,        // EISDIR
            FsStatus::NotEmpty => 39,     // ENOTEMPTY
            FsStatus::Access => 13,       // EACCES
            FsStatus::Perm => 1,          // EPERM
            FsStatus::NoSpace => 28,      // ENOSPC
            FsStatus::Io => 5,            // EIO
            FsStatus::Invalid => 22,      // EINVAL
            FsStatus::NameTooLong => 36,  // ENAMETOOLONG
            FsStatus::NoData => 61,       // ENODATA
            FsStatus::Range => 34,        // ERANGE
            FsStatus::TooManyLinks => 31, // EMLINK
            FsStatus::CrossDevice => 18,  // EXDEV
            FsStatus::Busy => 16,         // EBUSY
            FsStatus::Loop => 40,         // ELOOP
            FsStatus::ReadOnly => 30,     // EROFS
            FsStatus::Unavailable => 11,  // EAGAIN
            FsStatus::TooBig => 27,       // EFBIG
            FsStatus::NotSupported => 95, // EOPNOTSUPP
            FsStatus::Stale => 116,       // ESTALE
            FsStatus::Quota => 122,       // EDQUOT
            FsStatus::LockConflict => 11, // EAGAIN
            FsStatus::Interrupted => 4,   // EINTR
            FsStatus::NoLocks => 37,      // ENOLCK
            FsStatus::Grace => 11,        // EAGAIN
            FsStatus::Deadlock => 35,     // EDEADLK
        }
    }
}

impl fmt::Display for FsStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            FsStatus::NotFound => "no such file or directory",
            FsStatus::Exists => "file exists",
            FsStatus::NotDir => "not a directory",
            FsStatus::IsDir => "is a directory",
            FsStatus::NotEmpty => "directory not empty",
            FsStatus::Access => "permission denied",
            FsStatus::Perm => "operation not permitted",
            FsStatus::NoSpace => "no space left on device",
            FsStatus::Io => "input/output error",
            FsStatus::Invalid => "invalid argument",
            FsStatus::NameTooLong => "file name too long",
            FsStatus::NoData => "no such attribute",
            FsStatus::Range => "result too large",
            FsStatus::TooManyLinks => "too many links",
            FsStatus::CrossDevice => "cross-device link",
            FsStatus::Busy => "resource busy",
            FsStatus::Loop => "too many levels of symbolic links",
            FsStatus::ReadOnly => "read-only file system",
            FsStatus::Unavailable => "service unavailable, try again",
            FsStatus::TooBig => "file too large",
            FsStatus::NotSupported => "operation not supported",
            FsStatus::Stale => "stale file handle",
            FsStatus::Quota => "quota exceeded",
            FsStatus::LockConflict => "the range is locked by another owner",
            FsStatus::Interrupted => "interrupted",
            FsStatus::NoLocks => "no locks available",
            FsStatus::Grace => "the metadata service restarted: locks wait for its grace period",
            FsStatus::Deadlock => "resource deadlock avoided",
        };
        f.write_str(text)
    }
}

impl std::error::Error for FsStatus {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_robin_and_bounds() {
        let layout = FileLayout {
            pool: "default".into(),
            chunk_bytes: CHUNK_BYTES_DEFAULT,
            targets: vec![TargetId(4), TargetId(7), TargetId(9)],
        };
        assert_eq!(layout.validate(), Ok(()));
        assert_eq!(layout.target_of(0), TargetId(4));
        assert_eq!(layout.target_of(4), TargetId(7));
        let bad = FileLayout { chunk_bytes: 3000, ..layout.clone() };
        assert!(bad.validate().unwrap_err().contains("power of two"));
        let empty = FileLayout { targets: vec![], ..layout };
        assert!(empty.validate().unwrap_err().contains("stripe count"));
    }

    #[test]
    fn statuses_map_to_linux_errnos() {
        assert_eq!(FsStatus::NotFound.errno(), 2);
        assert_eq!(FsStatus::NotEmpty.errno(), 39);
        assert_eq!(FsStatus::NoSpace.to_string(), "no space left on device");
    }
}
