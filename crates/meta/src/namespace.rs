//! Names: lookup, create, mkdir, mknod, symlink, link, unlink, rmdir, readdir, and the
//! open-handle counting that keeps unlinked files alive until their last close.

use redb::ReadableTable;
use stria_proto::fs::{FsStatus, Ino, ROOT_INO, SYMLINK_BYTES_MAX};

use crate::error::{Result, fs};
use crate::opens::{Opens, Release};
use crate::perm;
use crate::record::{Body, DirBody, FIRST_SEQ, FileData, Inode, extension_of};
use crate::store::Tx;
use crate::types::*;
use crate::{Meta, names};

/// The fileset a new child `ino` of `parent` counts against.
pub(crate) fn child_fileset(parent: Ino, parent_rec: &Inode, ino: Ino, kind: FileKind) -> Ino {
    if parent == ROOT_INO {
        if kind == FileKind::Dir { ino } else { ROOT_INO }
    } else {
        parent_rec.fileset
    }
}

impl Meta {
    /// Finds `name` in `parent`; needs search (x) permission on `parent`. `.` and `..` are
    /// answered too (root's `..` is root).
    pub fn lookup(&self, parent: Ino, name: &[u8], caller: &Caller) -> Result<Attr> {
        self.read(|rx| {
            let dir = rx.inode(parent)?;
            if !dir.is_dir() {
                return Err(fs(FsStatus::NotDir, "lookup in a non-directory"));
            }
            perm::check(&dir, caller, X_OK)?;
            let ino = match name {
                b"." => parent,
                b".." => dir.parent,
                _ => {
                    names::check(name, FsStatus::Invalid)?;
                    rx.dentry(parent, name)?
                        .ok_or_else(|| fs(FsStatus::NotFound, "no such entry"))?
                        .ino
                }
            };
            Ok(rx.inode(ino)?.attr(ino))
        })
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.read(|rx| Ok(rx.inode(ino)?.attr(ino)))
    }

    /// `access(2)`: `mask` is 0 (exists) or R_OK|W_OK|X_OK.
    pub fn access(&self, ino: Ino, caller: &Caller, mask: u32) -> Result<()> {
        self.read(|rx| perm::check(&rx.inode(ino)?, caller, mask & 7))
    }

    /// Creates a regular file. `mode` is the permission bits after the caller's umask.
    pub fn create(&self, parent: Ino, name: &[u8], mode: u32, caller: &Caller) -> Result<Attr> {
        self.mknod(parent, name, NodeKind::File, mode, caller)
    }

    /// Creates a regular file, fifo, socket or device node.
    pub fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        kind: NodeKind,
        mode: u32,
        caller: &Caller,
    ) -> Result<Attr> {
        let (kind, rdev, body) = match kind {
            NodeKind::File => (FileKind::File, 0, Body::File(FileData::Inline(Vec::new()))),
            NodeKind::Fifo => (FileKind::Fifo, 0, Body::Special),
            NodeKind::Socket => (FileKind::Socket, 0, Body::Special),
            NodeKind::CharDevice { rdev } | NodeKind::BlockDevice { rdev } if !caller.is_root() => {
                let _ = rdev;
                return Err(fs(FsStatus::Perm, "device nodes need root"));
            }
            NodeKind::CharDevice { rdev } => (FileKind::CharDevice, rdev, Body::Special),
            NodeKind::BlockDevice { rdev } => (FileKind::BlockDevice, rdev, Body::Special),
        };
        self.make_node(parent, name, kind, mode, rdev, caller, |_| body)
    }

    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, caller: &Caller) -> Result<Attr> {
        self.make_node(parent, name, FileKind::Dir, mode, 0, caller, |dir| {
            let policy = match &dir.body {
                Body::Dir(d) => d.policy.clone(),
                _ => Default::default(),
            };
            Body::Dir(DirBody { next_seq: FIRST_SEQ, policy })
        })
    }

    pub fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        caller: &Caller,
    ) -> Result<Attr> {
        if target.is_empty() {
            return Err(fs(FsStatus::NotFound, "empty symlink target"));
        }
        if target.len() > SYMLINK_BYTES_MAX || target.contains(&0) {
            return Err(fs(FsStatus::NameTooLong, "symlink target too long"));
        }
        let target = target.to_vec();
        self.make_node(parent, name, FileKind::Symlink, 0o777, 0, caller, |_| Body::Symlink(target))
    }

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.read(|rx| match rx.inode(ino)?.body {
            Body::Symlink(target) => Ok(target),
            _ => Err(fs(FsStatus::Invalid, "not a symlink")),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn make_node(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        rdev: u32,
        caller: &Caller,
        body: impl FnOnce(&Inode) -> Body,
    ) -> Result<Attr> {
        names::check(name, FsStatus::Exists)?;
        self.write(|tx| {
            let mut dir = tx.dir(parent)?;
            perm::check(&dir, caller, W_OK | X_OK)?;
            if tx.dentry(parent, name)?.is_some() {
                return Err(fs(FsStatus::Exists, "name exists"));
            }
            if kind == FileKind::Dir && dir.nlink >= LINK_COUNT_MAX {
                return Err(fs(FsStatus::TooManyLinks, "too many subdirectories"));
            }
            let ino = tx.alloc_ino(self.options.inodes_max)?;
            let now = self.now();
            let mut mode = mode & MODE_BITS;
            let mut gid = caller.gid;
            if dir.mode & S_ISGID != 0 {
                gid = dir.gid;
                if kind == FileKind::Dir {
                    mode |= S_ISGID;
                }
            }
            if kind != FileKind::Dir
                && mode & S_ISGID != 0
                && !caller.is_root()
                && !caller.in_group(gid)
            {
                mode &= !S_ISGID;
            }
            let body = body(&dir);
            let size = match &body {
                Body::Symlink(target) => target.len() as u64,
                _ => 0,
            };
            let rec = Inode {
                kind,
                mode,
                uid: caller.uid,
                gid,
                nlink: if kind == FileKind::Dir { 2 } else { 1 },
                size,
                atime: now,
                mtime: now,
                ctime: now,
                rdev,
                parent,
                fileset: child_fileset(parent, &dir, ino, kind),
                version: 0,
                ext: if kind == FileKind::File { extension_of(name) } else { String::new() },
                body,
            };
            tx.add_dentry(parent, &mut dir, name, ino, kind)?;
            if kind == FileKind::Dir {
                dir.nlink += 1;
            }
            dir.mtime = now;
            dir.ctime = now;
            tx.put_inode(parent, &dir)?;
            tx.put_inode(ino, &rec)?;
            tx.account(None, Some(&rec));
            Ok(rec.attr(ino))
        })
    }

    /// Adds the name `new_name` in `new_parent` for the non-directory `ino`.
    pub fn link(
        &self,
        ino: Ino,
        new_parent: Ino,
        new_name: &[u8],
        caller: &Caller,
    ) -> Result<Attr> {
        names::check(new_name, FsStatus::Exists)?;
        self.write(|tx| {
            let mut rec = tx.inode(ino)?;
            if rec.is_dir() {
                return Err(fs(FsStatus::Perm, "hard link to a directory"));
            }
            if rec.nlink == 0 {
                return Err(fs(FsStatus::NotFound, "inode has no name left"));
            }
            if rec.nlink >= LINK_COUNT_MAX {
                return Err(fs(FsStatus::TooManyLinks, "too many links"));
            }
            let mut dir = tx.dir(new_parent)?;
            perm::check(&dir, caller, W_OK | X_OK)?;
            if tx.dentry(new_parent, new_name)?.is_some() {
                return Err(fs(FsStatus::Exists, "name exists"));
            }
            let now = self.now();
            tx.add_dentry(new_parent, &mut dir, new_name, ino, rec.kind)?;
            dir.mtime = now;
            dir.ctime = now;
            tx.put_inode(new_parent, &dir)?;
            rec.nlink += 1;
            rec.ctime = now;
            tx.put_inode(ino, &rec)?;
            Ok(rec.attr(ino))
        })
    }

    /// Removes the non-directory entry `name`. When it was the inode's last link the result
    /// says whether the data must be removed now (`purge`) or after the last `release`.
    pub fn unlink(&self, parent: Ino, name: &[u8], caller: &Caller) -> Result<Unlinked> {
        names::check(name, FsStatus::IsDir)?;
        let opens = self.lock_opens();
        self.write(|tx| {
            let mut dir = tx.dir(parent)?;
            perm::check(&dir, caller, W_OK | X_OK)?;
            let dentry =
                tx.dentry(parent, name)?.ok_or_else(|| fs(FsStatus::NotFound, "no such entry"))?;
            if dentry.kind == FileKind::Dir {
                return Err(fs(FsStatus::IsDir, "unlink of a directory"));
            }
            let rec = tx.inode(dentry.ino)?;
            perm::check_sticky(&dir, &rec, caller)?;
            tx.remove_dentry(parent, name)?;
            let now = self.now();
            dir.mtime = now;
            dir.ctime = now;
            tx.put_inode(parent, &dir)?;
            drop_link(tx, &opens, dentry.ino, rec, now)
        })
    }

    /// Removes the empty directory `name`.
    pub fn rmdir(&self, parent: Ino, name: &[u8], caller: &Caller) -> Result<()> {
        if name == b".." {
            return Err(fs(FsStatus::NotEmpty, "rmdir of '..'"));
        }
        names::check(name, FsStatus::Invalid)?;
        self.write(|tx| {
            let mut dir = tx.dir(parent)?;
            perm::check(&dir, caller, W_OK | X_OK)?;
            let dentry =
                tx.dentry(parent, name)?.ok_or_else(|| fs(FsStatus::NotFound, "no such entry"))?;
            if dentry.kind != FileKind::Dir {
                return Err(fs(FsStatus::NotDir, "rmdir of a non-directory"));
            }
            let rec = tx.inode(dentry.ino)?;
            perm::check_sticky(&dir, &rec, caller)?;
            if !tx.dir_is_empty(dentry.ino)? {
                return Err(fs(FsStatus::NotEmpty, "directory not empty"));
            }
            tx.remove_dentry(parent, name)?;
            tx.free_inode(dentry.ino)?;
            let now = self.now();
            dir.nlink -= 1;
            dir.mtime = now;
            dir.ctime = now;
            tx.put_inode(parent, &dir)
        })
    }

    /// Up to `limit` entries of `dir` whose cookie is at least `cookie`, in creation order.
    /// Start with cookie 0; continue with the last entry's `next_cookie`. An entry that exists
    /// for the whole listing is returned exactly once, whatever is added or removed between
    /// calls. `.` and `..` are not returned: the caller adds them (cookies 1 and 2 are free
    /// for that: real entries start at 3). Needs read permission.
    pub fn readdir(
        &self,
        dir: Ino,
        cookie: u64,
        limit: usize,
        caller: &Caller,
    ) -> Result<Vec<DirEntry>> {
        let limit = limit.clamp(1, READDIR_ENTRIES_MAX);
        self.read(|rx| {
            let rec = rx.inode(dir)?;
            if !rec.is_dir() {
                return Err(fs(FsStatus::NotDir, "readdir of a non-directory"));
            }
            perm::check(&rec, caller, R_OK)?;
            let start = cookie.max(FIRST_SEQ);
            let mut out = Vec::with_capacity(limit.min(256));
            for item in rx.dir_seq()?.range((dir, start)..=(dir, u64::MAX))?.take(limit) {
                let (key, value) = item?;
                let (_, seq) = key.value();
                let (ino, code, name) = value.value();
                let kind = FileKind::from_code(code).ok_or_else(|| {
                    crate::MetaError::Corrupt(format!("dir_seq in {dir}: kind {code}"))
                })?;
                out.push(DirEntry { name: name.to_vec(), ino, kind, next_cookie: seq + 1 });
            }
            Ok(out)
        })
    }

    /// open(O_CREAT): creates `name` (or, unless `exclusive`, finds what is there and checks
    /// `mask` against it) and counts an open of it for `client`, all under the open-handle
    /// lock, so an unlink by another client cannot take the inode between the create and the
    /// count (open(O_CREAT) must not fail with ENOENT). Returns the attributes and whether
    /// the file was created.
    #[allow(clippy::too_many_arguments)]
    pub fn create_open(
        &self,
        parent: Ino,
        name: &[u8],
        node: NodeKind,
        mode: u32,
        caller: &Caller,
        exclusive: bool,
        mask: u32,
        client: u64,
    ) -> Result<(Attr, bool)> {
        let mut opens = self.lock_opens();
        let (attr, created) = match self.mknod(parent, name, node, mode, caller) {
            Ok(attr) => (attr, true),
            // Without O_EXCL, what is there is opened.
            Err(crate::MetaError::Fs { status: FsStatus::Exists, .. }) if !exclusive => {
                (self.lookup(parent, name, caller)?, false)
            }
            Err(error) => return Err(error),
        };
        // The creator may open what it just created whatever the mode says; what was already
        // there is checked as any open is.
        if !created {
            self.access(attr.ino, caller, mask)?;
        }
        opens.open(attr.ino, client);
        Ok((attr, created))
    }

    /// Counts an open handle of `ino` for `client`; while any is open an unlinked inode keeps
    /// its data.
    pub fn open_file(&self, ino: Ino, client: u64) -> Result<()> {
        let mut opens = self.lock_opens();
        self.read(|rx| rx.inode(ino).map(|_| ()))?;
        opens.open(ino, client);
        Ok(())
    }

    /// Drops an open handle of `client`. At the last one of an unlinked inode the inode is
    /// deleted and its purge returned: the caller removes the chunks. A client with no handle
    /// of `ino` counted (its opens went with its session, or were not reclaimed) drops
    /// nothing, but an unlinked inode that nobody has open then goes. During a grace period
    /// (see `reclaim`) no inode goes: a client may yet reclaim an open of it.
    pub fn release(&self, ino: Ino, client: u64) -> Result<Option<Purge>> {
        let mut opens = self.lock_opens();
        match opens.release(ino, client) {
            Release::StillOpen => return Ok(None),
            // During a grace period another client may yet reclaim an open of it: an orphan
            // then waits for the sweep at its end.
            Release::Last if opens.in_grace() => return Ok(None),
            // Not counted for this client (its opens went with its session, or it did not
            // reclaim them after a restart): an orphan nobody may have open goes now.
            Release::NotOpen if opens.may_be_open(ino) => return Ok(None),
            Release::NotOpen | Release::Last => {}
        }
        // Most closes are of files that still have a name: a read decides, no commit needed.
        if self.read(|rx| Ok(rx.inode(ino).map(|rec| rec.nlink > 0).unwrap_or(true)))? {
            return Ok(None);
        }
        self.write(|tx| match crate::store::load_inode(tx.tables.inodes.table()?, ino)? {
            Some(rec) if rec.nlink == 0 => Ok(Some(purge_inode(tx, ino, &rec)?)),
            _ => {
                tx.unchanged = true;
                Ok(None)
            }
        })
    }

    /// Handles open on `ino` in this process.
    pub fn open_count(&self, ino: Ino) -> u32 {
        self.lock_opens().count(ino)
    }

    /// The files `client` has open count as closed (its session ended without its closes);
    /// the next [`Meta::expire_clients`] purges those of them that were unlinked.
    pub fn drop_client_opens(&self, client: u64) {
        self.lock_opens().drop_client(client);
    }

    /// Ends the sessions not heard from for a lease and drops their opens; then purges up to
    /// `EXPIRED_PURGES_MAX` of the unlinked files left unopened by ended sessions, and (once,
    /// after the grace period, see `reclaim`) by the last run (the rest at the next call).
    /// The caller removes the purged files' chunks.
    pub fn expire_clients(&self) -> Result<Vec<Purge>> {
        let ended = self.sessions.expire();
        let mut opens = self.lock_opens();
        for client in ended {
            opens.drop_client(client);
        }
        if opens.take_sweep() {
            // The orphans the last run left that nobody reclaimed an open of.
            let unopened: Vec<Ino> =
                self.orphans()?.into_iter().filter(|&ino| opens.count(ino) == 0).collect();
            opens.queue_purge(unopened);
        }
        if opens.in_grace() {
            // Files left unopened may be open at a client yet to reclaim.
            return Ok(Vec::new());
        }
        let candidates = opens.take_pending(stria_proto::wire::EXPIRED_PURGES_MAX);
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        self.write(|tx| {
            let mut purged = Vec::new();
            for ino in candidates {
                match crate::store::load_inode(tx.tables.inodes.table()?, ino)? {
                    Some(rec) if rec.nlink == 0 => purged.push(purge_inode(tx, ino, &rec)?),
                    _ => {}
                }
            }
            tx.unchanged = purged.is_empty();
            Ok(purged)
        })
    }

    /// Inodes with no name left that still hold data: open ones, and after a restart the
    /// ones that were open when the process stopped. Purge the latter with [`Meta::purge`].
    pub fn orphans(&self) -> Result<Vec<Ino>> {
        self.read(|rx| {
            let mut out = Vec::new();
            for item in rx.orphans()?.range::<u64>(..)? {
                out.push(item?.0.value());
            }
            Ok(out)
        })
    }

    /// Deletes an orphan that is not open and returns what to remove from storage.
    pub fn purge(&self, ino: Ino) -> Result<Purge> {
        let opens = self.lock_opens();
        if opens.may_be_open(ino) {
            return Err(fs(FsStatus::Busy, "orphan still open, or may be (grace period)"));
        }
        self.write(|tx| {
            let rec = tx.inode(ino)?;
            if rec.nlink != 0 {
                return Err(fs(FsStatus::Invalid, "inode still has names"));
            }
            purge_inode(tx, ino, &rec)
        })
    }
}

fn purge_inode(tx: &mut Tx<'_>, ino: Ino, rec: &Inode) -> Result<Purge> {
    tx.free_inode(ino)?;
    Ok(Purge { ino, size: rec.size, layout: rec.layout().cloned() })
}

/// Takes one link from a non-directory whose name the caller removed; deletes the inode if it
/// was the last link and nobody has it open, makes it an orphan if someone does.
pub(crate) fn drop_link(
    tx: &mut Tx<'_>,
    opens: &Opens,
    ino: Ino,
    mut rec: Inode,
    now: Timestamp,
) -> Result<Unlinked> {
    let before = rec.clone();
    rec.nlink = rec.nlink.saturating_sub(1);
    rec.ctime = now;
    tx.account(Some(&before), Some(&rec));
    if rec.nlink > 0 {
        tx.put_inode(ino, &rec)?;
        return Ok(Unlinked { ino, nlink: rec.nlink, purge: None });
    }
    if opens.may_be_open(ino) {
        tx.put_inode(ino, &rec)?;
        tx.set_orphan(ino, now.secs)?;
        return Ok(Unlinked { ino, nlink: 0, purge: None });
    }
    let purge = purge_inode(tx, ino, &rec)?;
    Ok(Unlinked { ino, nlink: 0, purge: Some(purge) })
}
