//! POSIX permission checks.

use stria_proto::fs::FsStatus;

use crate::error::{Result, fs};
use crate::record::Inode;
use crate::types::{Caller, S_ISVTX, X_OK};

/// Whether `caller` may access `rec` with `mask` (R_OK|W_OK|X_OK). Root may read and write
/// anything, and execute a non-directory only if some execute bit is set.
pub(crate) fn allowed(rec: &Inode, caller: &Caller, mask: u32) -> bool {
    if caller.is_root() {
        return mask & X_OK == 0 || rec.is_dir() || rec.mode & 0o111 != 0;
    }
    let bits = if caller.uid == rec.uid {
        (rec.mode >> 6) & 7
    } else if caller.in_group(rec.gid) {
        (rec.mode >> 3) & 7
    } else {
        rec.mode & 7
    };
    bits & mask == mask
}

pub(crate) fn check(rec: &Inode, caller: &Caller, mask: u32) -> Result<()> {
    if allowed(rec, caller, mask) { Ok(()) } else { Err(fs(FsStatus::Access, "permission denied")) }
}

/// In a sticky directory only the owner of the entry, the owner of the directory or root
/// may remove or rename the entry.
pub(crate) fn check_sticky(dir: &Inode, victim: &Inode, caller: &Caller) -> Result<()> {
    if dir.mode & S_ISVTX == 0
        || caller.is_root()
        || caller.uid == victim.uid
        || caller.uid == dir.uid
    {
        Ok(())
    } else {
        Err(fs(FsStatus::Perm, "sticky directory"))
    }
}

/// Owner or root (chmod, utimes to a given time, layout changes).
pub(crate) fn check_owner(rec: &Inode, caller: &Caller) -> Result<()> {
    if caller.is_root() || caller.uid == rec.uid {
        Ok(())
    } else {
        Err(fs(FsStatus::Perm, "not the owner"))
    }
}
