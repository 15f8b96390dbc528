//! Extended attributes: `trusted.*` is root's, and so are changes to `security.*` (but for
//! dropping `security.capability`); the rest follows the file's read/write permission.

use redb::ReadableTable;
use stria_proto::fs::{
    CAPABILITY_XATTR, FsStatus, Ino, XATTR_NAME_BYTES_MAX, XATTR_VALUE_BYTES_MAX,
};

use crate::Meta;
use crate::error::{Result, fs};
use crate::perm;
use crate::record::Inode;
use crate::types::*;

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > XATTR_NAME_BYTES_MAX {
        return Err(fs(FsStatus::Range, "xattr name empty or too long"));
    }
    Ok(())
}

fn is_trusted(name: &[u8]) -> bool {
    name.starts_with(b"trusted.")
}

/// What a change of `name` takes beyond write permission on the file.
enum Change {
    Set,
    Remove,
}

fn check_access(rec: &Inode, name: &[u8], caller: &Caller, mask: u32) -> Result<()> {
    if is_trusted(name) {
        return if caller.is_root() { Ok(()) } else { Err(fs(FsStatus::Perm, "trusted xattr")) };
    }
    perm::check(rec, caller, mask)
}

/// As [`check_access`] for a change. `security.*` is the kernel's and root's to set (Linux
/// asks CAP_SETFCAP for `security.capability`, CAP_SYS_ADMIN for the rest): write permission
/// on a file must not let anyone give it file capabilities (a squashed root included). Removing
/// `security.capability` only takes privilege away, and the kernel sends it as the writer when
/// it drops a file's capabilities on write, so write permission still does for that.
fn check_change(rec: &Inode, name: &[u8], caller: &Caller, change: Change) -> Result<()> {
    let security = name.starts_with(b"security.");
    let dropping_capability = matches!(change, Change::Remove) && name == CAPABILITY_XATTR;
    if security && !dropping_capability && !caller.is_root() {
        return Err(fs(FsStatus::Perm, "security xattrs are root's to change"));
    }
    check_access(rec, name, caller, W_OK)
}

impl Meta {
    pub fn getxattr(&self, ino: Ino, name: &[u8], caller: &Caller) -> Result<Vec<u8>> {
        check_name(name)?;
        self.read(|rx| {
            let rec = rx.inode(ino)?;
            check_access(&rec, name, caller, R_OK)?;
            match rx.xattrs()?.get((ino, name))? {
                Some(value) => Ok(value.value().to_vec()),
                None => Err(fs(FsStatus::NoData, "no such xattr")),
            }
        })
    }

    /// Sets `name` to `value`; `flags` as XATTR_CREATE / XATTR_REPLACE. A value longer than
    /// `XATTR_VALUE_BYTES_MAX` fails with EFBIG (Linux says E2BIG, which FsStatus lacks).
    pub fn setxattr(
        &self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
        caller: &Caller,
    ) -> Result<()> {
        check_name(name)?;
        if value.len() > XATTR_VALUE_BYTES_MAX {
            return Err(fs(FsStatus::TooBig, "xattr value too large"));
        }
        self.write(|tx| {
            let mut rec = tx.inode(ino)?;
            check_change(&rec, name, caller, Change::Set)?;
            let exists = tx.tables.xattrs.table()?.get((ino, name))?.is_some();
            match flags {
                XattrFlags::Create if exists => {
                    return Err(fs(FsStatus::Exists, "xattr exists"));
                }
                XattrFlags::Replace if !exists => {
                    return Err(fs(FsStatus::NoData, "no such xattr"));
                }
                _ => {}
            }
            tx.put_xattr(ino, name, value)?;
            rec.ctime = self.now();
            tx.put_inode(ino, &rec)
        })
    }

    /// The names of `ino`'s xattrs, in byte order (`trusted.*` only for root).
    pub fn listxattr(&self, ino: Ino, caller: &Caller) -> Result<Vec<Vec<u8>>> {
        self.read(|rx| {
            rx.inode(ino)?;
            let mut out = Vec::new();
            for item in rx.xattrs()?.range((ino, &[][..])..(ino + 1, &[][..]))? {
                let (key, _) = item?;
                let name = key.value().1;
                if caller.is_root() || !is_trusted(name) {
                    out.push(name.to_vec());
                }
            }
            Ok(out)
        })
    }

    pub fn removexattr(&self, ino: Ino, name: &[u8], caller: &Caller) -> Result<()> {
        check_name(name)?;
        self.write(|tx| {
            let mut rec = tx.inode(ino)?;
            check_change(&rec, name, caller, Change::Remove)?;
            if !tx.remove_xattr(ino, name)? {
                return Err(fs(FsStatus::NoData, "no such xattr"));
            }
            rec.ctime = self.now();
            tx.put_inode(ino, &rec)
        })
    }
}
