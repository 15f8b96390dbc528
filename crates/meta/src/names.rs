//! Checks on the names of directory entries.

use stria_proto::fs::{FsStatus, NAME_BYTES_MAX};

use crate::error::{Result, fs};

/// A name that is a single component: not empty, no `/` or NUL, at most 255 bytes.
/// `.` and `..` are answered with `dots` (what each operation returns for them differs).
pub(crate) fn check(name: &[u8], dots: FsStatus) -> Result<()> {
    if name.is_empty() {
        return Err(fs(FsStatus::NotFound, "empty name"));
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(fs(FsStatus::NameTooLong, "name longer than 255 bytes"));
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(fs(FsStatus::Invalid, "name contains '/' or NUL"));
    }
    if name == b"." || name == b".." {
        return Err(fs(dots, "'.' or '..'"));
    }
    Ok(())
}
