//! rename(2) and renameat2(2): replacing targets, RENAME_NOREPLACE, RENAME_EXCHANGE, moving
//! directories (never into their own subtree) and moving usage between filesets.

use stria_proto::fs::{FsStatus, Ino, ROOT_INO};

use crate::error::{Result, fs};
use crate::namespace::{child_fileset, drop_link};
use crate::perm;
use crate::record::{Inode, extension_of};
use crate::store::Tx;
use crate::types::*;
use crate::{Meta, names};

impl Meta {
    /// Renames `parent/name` to `new_parent/new_name`. Returns what happened to a replaced
    /// target (its purge when it was the last link).
    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
        caller: &Caller,
    ) -> Result<Option<Unlinked>> {
        if flags.noreplace && flags.exchange {
            return Err(fs(FsStatus::Invalid, "NOREPLACE with EXCHANGE"));
        }
        names::check(name, FsStatus::Busy)?;
        names::check(new_name, FsStatus::Busy)?;
        let opens = self.lock_opens();
        self.write(|tx| {
            let src_dir = tx.dir(parent)?;
            perm::check(&src_dir, caller, W_OK | X_OK)?;
            let dst_dir = tx.dir(new_parent)?;
            perm::check(&dst_dir, caller, W_OK | X_OK)?;
            let src =
                tx.dentry(parent, name)?.ok_or_else(|| fs(FsStatus::NotFound, "no such entry"))?;
            let target = tx.dentry(new_parent, new_name)?;
            if flags.exchange && target.is_none() {
                return Err(fs(FsStatus::NotFound, "exchange target missing"));
            }
            if parent == new_parent && name == new_name {
                tx.unchanged = true;
                return Ok(None);
            }
            let src_rec = tx.inode(src.ino)?;
            perm::check_sticky(&src_dir, &src_rec, caller)?;
            let moves_dir = src.kind == FileKind::Dir && parent != new_parent;
            if moves_dir {
                // Its `..` changes, which is a write to the directory itself.
                perm::check(&src_rec, caller, W_OK)?;
                check_not_inside(tx, src.ino, new_parent)?;
            }
            let now = self.now();
            let Some(target) = target else {
                if moves_dir && dst_dir.nlink >= LINK_COUNT_MAX {
                    return Err(fs(FsStatus::TooManyLinks, "too many subdirectories"));
                }
                tx.remove_dentry(parent, name)?;
                self.place(tx, src.ino, new_parent, new_name, parent, now)?;
                touch_dirs(tx, parent, new_parent, now)?;
                return Ok(None);
            };
            if flags.noreplace {
                return Err(fs(FsStatus::Exists, "target exists"));
            }
            let target_rec = tx.inode(target.ino)?;
            perm::check_sticky(&dst_dir, &target_rec, caller)?;
            if flags.exchange {
                if target.kind == FileKind::Dir && parent != new_parent {
                    perm::check(&target_rec, caller, W_OK)?;
                    check_not_inside(tx, target.ino, parent)?;
                }
                tx.remove_dentry(parent, name)?;
                tx.remove_dentry(new_parent, new_name)?;
                self.place(tx, src.ino, new_parent, new_name, parent, now)?;
                self.place(tx, target.ino, parent, name, new_parent, now)?;
                touch_dirs(tx, parent, new_parent, now)?;
                return Ok(None);
            }
            if target.ino == src.ino {
                // Two links to one inode: POSIX says do nothing.
                tx.unchanged = true;
                return Ok(None);
            }
            match (src.kind == FileKind::Dir, target.kind == FileKind::Dir) {
                (true, false) => return Err(fs(FsStatus::NotDir, "directory over non-directory")),
                (false, true) => return Err(fs(FsStatus::IsDir, "non-directory over directory")),
                (true, true) if !tx.dir_is_empty(target.ino)? => {
                    return Err(fs(FsStatus::NotEmpty, "target directory not empty"));
                }
                _ => {}
            }
            tx.remove_dentry(new_parent, new_name)?;
            let replaced = if target.kind == FileKind::Dir {
                tx.free_inode(target.ino)?;
                let mut dst = tx.inode(new_parent)?;
                dst.nlink -= 1;
                tx.put_inode(new_parent, &dst)?;
                Unlinked { ino: target.ino, nlink: 0, purge: None }
            } else {
                drop_link(tx, &opens, target.ino, target_rec, now)?
            };
            tx.remove_dentry(parent, name)?;
            self.place(tx, src.ino, new_parent, new_name, parent, now)?;
            touch_dirs(tx, parent, new_parent, now)?;
            Ok(Some(replaced))
        })
    }

    /// Puts inode `ino` (whose old entry is already removed from `old_parent`) under
    /// `parent/name`: the entry, link counts of both parents, `..`, fileset and extension.
    fn place(
        &self,
        tx: &mut Tx<'_>,
        ino: Ino,
        parent: Ino,
        name: &[u8],
        old_parent: Ino,
        now: Timestamp,
    ) -> Result<()> {
        let mut rec = tx.inode(ino)?;
        let before = rec.clone();
        let mut dir = tx.dir(parent)?;
        tx.add_dentry(parent, &mut dir, name, ino, rec.kind)?;
        if rec.is_dir() && parent != old_parent {
            dir.nlink += 1;
            tx.put_inode(parent, &dir)?;
            let mut old = tx.dir(old_parent)?;
            old.nlink -= 1;
            tx.put_inode(old_parent, &old)?;
        } else {
            tx.put_inode(parent, &dir)?;
        }
        rec.ctime = now;
        if rec.is_dir() || rec.nlink <= 1 {
            rec.parent = parent;
        }
        if rec.kind == FileKind::File && rec.nlink <= 1 {
            rec.ext = extension_of(name);
        }
        let fileset = child_fileset(parent, &dir, ino, rec.kind);
        let old_fileset = rec.fileset;
        if fileset != old_fileset && (rec.is_dir() || rec.nlink <= 1) {
            rec.fileset = fileset;
            if rec.is_dir() {
                move_subtree_fileset(tx, ino, old_fileset, fileset)?;
            }
        }
        tx.account(Some(&before), Some(&rec));
        tx.put_inode(ino, &rec)
    }
}

/// Fails with EINVAL when `dir` is `moved` or inside it: a directory cannot move into itself.
fn check_not_inside(tx: &Tx<'_>, moved: Ino, dir: Ino) -> Result<()> {
    let mut at = dir;
    // The depth of a tree is bounded by its inode count; the walk stops at the root.
    loop {
        if at == moved {
            return Err(fs(FsStatus::Invalid, "directory into its own subtree"));
        }
        if at == ROOT_INO {
            return Ok(());
        }
        at = tx.inode(at)?.parent;
    }
}

fn touch_dirs(tx: &mut Tx<'_>, parent: Ino, new_parent: Ino, now: Timestamp) -> Result<()> {
    for ino in [parent, new_parent] {
        let mut dir = tx.inode(ino)?;
        dir.mtime = now;
        dir.ctime = now;
        tx.put_inode(ino, &dir)?;
        if parent == new_parent {
            break;
        }
    }
    Ok(())
}

/// A directory moved from fileset `from` to `to`: everything below it that counted against
/// `from` now counts against `to`. Costs one read and write per inode of the subtree.
fn move_subtree_fileset(tx: &mut Tx<'_>, top: Ino, from: Ino, to: Ino) -> Result<()> {
    let mut pending = vec![top];
    while let Some(dir) = pending.pop() {
        for (ino, kind) in tx.children(dir)? {
            let mut rec: Inode = tx.inode(ino)?;
            if rec.fileset != from {
                continue;
            }
            let before = rec.clone();
            rec.fileset = to;
            tx.account(Some(&before), Some(&rec));
            tx.put_inode(ino, &rec)?;
            if kind == FileKind::Dir {
                pending.push(ino);
            }
        }
    }
    Ok(())
}
