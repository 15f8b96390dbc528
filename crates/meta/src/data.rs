//! Attributes and data: setattr (chmod, chown, truncate, utimes), inline small-file data,
//! size growth from chunk writes, the inline-to-chunks spill, and layouts.

use redb::ReadableTable;
use stria_proto::fs::{
    CAPABILITY_XATTR, CHUNK_BYTES_MAX, CHUNK_BYTES_MIN, FileLayout, FsStatus, INLINE_DATA_MAX, Ino,
    LayoutPolicy, ROOT_INO, STRIPE_COUNT_MAX, has_suid,
};

use crate::error::{MetaError, Result, fs};
use crate::perm;
use crate::record::{Body, FileData, Inode};
use crate::types::*;
use crate::{Commit, Meta};

/// Clears set-user-id, and set-group-id when group execute is set (as Linux does when a
/// file is chowned or written by a non-root user; without group execute setgid means
/// mandatory locking and stays).
fn kill_suid(rec: &mut Inode) {
    if rec.is_dir() {
        return;
    }
    rec.mode &= !S_ISUID;
    if rec.mode & 0o010 != 0 {
        rec.mode &= !S_ISGID;
    }
}

/// Whether `rec` already has the size and mtime a close would publish.
fn published(rec: &Inode, size: u64, mtime: Timestamp) -> bool {
    rec.size >= size && rec.mtime == mtime
}

fn regular(rec: &Inode) -> Result<()> {
    match rec.kind {
        FileKind::File => Ok(()),
        FileKind::Dir => Err(fs(FsStatus::IsDir, "not a regular file")),
        _ => Err(fs(FsStatus::Invalid, "not a regular file")),
    }
}

impl Meta {
    /// chmod, chown, truncate and utimes in one transaction. A size change on an inline file
    /// beyond `INLINE_DATA_MAX` fails with [`MetaError::MustSpill`] and changes nothing.
    ///
    /// A size that shrinks is durable when this returns, even with lazy commits: the caller
    /// trims the chunks past the new end right after, and a crash that kept the trim but lost
    /// the new size would leave the old size over zeros.
    pub fn setattr(&self, ino: Ino, caller: &Caller, set: &SetAttr) -> Result<SetAttrOutcome> {
        let outcome = self.setattr_commit(ino, caller, set)?;
        if outcome.attr.size < outcome.old_size && self.commit_mode() == Commit::Lazy {
            self.sync()?;
        }
        Ok(outcome)
    }

    fn setattr_commit(&self, ino: Ino, caller: &Caller, set: &SetAttr) -> Result<SetAttrOutcome> {
        self.write(|tx| {
            let mut rec = tx.inode(ino)?;
            let before = rec.clone();
            let now = self.now();
            let old_size = rec.size;
            if let Some(uid) = set.uid
                && !caller.is_root()
                && !(caller.uid == rec.uid && uid == rec.uid)
            {
                return Err(fs(FsStatus::Perm, "chown needs root"));
            }
            if let Some(gid) = set.gid
                && !caller.is_root()
                && !(caller.uid == rec.uid && (gid == rec.gid || caller.in_group(gid)))
            {
                return Err(fs(FsStatus::Perm, "chgrp to a group the caller is not in"));
            }
            if let Some(mode) = set.mode {
                // A writer who is not the owner may only drop setuid/setgid of a regular file:
                // that is the kernel clearing them on write (FUSE sends it as a chmod from the
                // writer). A directory's setgid is its owner's to change.
                let only_clears_suid = regular(&rec).is_ok()
                    && mode & MODE_BITS == rec.mode & !(S_ISUID | S_ISGID)
                    && mode & MODE_BITS != rec.mode;
                if only_clears_suid && !caller.is_root() && caller.uid != rec.uid {
                    perm::check(&rec, caller, W_OK)?;
                } else {
                    perm::check_owner(&rec, caller)?;
                }
                let mut mode = mode & MODE_BITS;
                let gid = set.gid.unwrap_or(rec.gid);
                if !caller.is_root() && !caller.in_group(gid) {
                    mode &= !S_ISGID;
                }
                rec.mode = mode;
            }
            if set.uid.is_some() || set.gid.is_some() {
                rec.uid = set.uid.unwrap_or(rec.uid);
                rec.gid = set.gid.unwrap_or(rec.gid);
                kill_suid(&mut rec);
                if !rec.is_dir() {
                    tx.remove_xattr(ino, CAPABILITY_XATTR)?;
                }
            }
            if let Some(size) = set.size {
                regular(&rec)?;
                if !set.writable_handle {
                    perm::check(&rec, caller, W_OK)?;
                }
                if let Body::File(FileData::Inline(bytes)) = &mut rec.body {
                    if size > INLINE_DATA_MAX as u64 {
                        return Err(MetaError::MustSpill);
                    }
                    bytes.resize(size as usize, 0);
                }
                if size != rec.size {
                    rec.size = size;
                    rec.version += 1;
                    rec.mtime = now;
                }
                // As a local file system: any truncate drops the capabilities, and set-user-ID
                // and set-group-ID unless the caller may keep them (root, for CAP_FSETID).
                if !caller.is_root() {
                    kill_suid(&mut rec);
                }
                tx.remove_xattr(ino, CAPABILITY_XATTR)?;
            }
            for (which, slot) in [(set.atime, &mut rec.atime), (set.mtime, &mut rec.mtime)] {
                match which {
                    None => {}
                    Some(SetTime::At(t)) => {
                        perm::check_owner(&before, caller)?;
                        *slot = t;
                    }
                    Some(SetTime::Now) => {
                        if !(caller.is_root() || caller.uid == before.uid || set.writable_handle) {
                            perm::check(&before, caller, W_OK)?;
                        }
                        *slot = now;
                    }
                }
            }
            rec.ctime = now;
            tx.account(Some(&before), Some(&rec));
            tx.put_inode(ino, &rec)?;
            Ok(SetAttrOutcome { attr: rec.attr(ino), old_size })
        })
    }

    /// Takes from a regular file what a write must: its capabilities, and set-user-ID and
    /// set-group-ID when `suidgid` (see [`stria_proto::wire::MetaRequest::DropPrivileges`]).
    /// Changes nothing, and commits nothing, when there is nothing to take. The attributes
    /// after, and whether anything was taken.
    pub fn drop_privileges(&self, ino: Ino, suidgid: bool) -> Result<(Attr, bool)> {
        // Read first: most writes find nothing to drop, and a read takes no write lock.
        let (attr, needed) = self.read(|rx| {
            let rec = rx.inode(ino)?;
            let capability = rx.xattrs()?.get((ino, CAPABILITY_XATTR))?.is_some();
            let needed =
                rec.kind == FileKind::File && (capability || suidgid && has_suid(rec.mode));
            Ok((rec.attr(ino), needed))
        })?;
        if !needed {
            return Ok((attr, false));
        }
        self.write(|tx| {
            let mut rec = tx.inode(ino)?;
            if rec.kind != FileKind::File {
                return Ok((rec.attr(ino), false));
            }
            let before = rec.clone();
            let dropped = tx.remove_xattr(ino, CAPABILITY_XATTR)?;
            if suidgid {
                kill_suid(&mut rec);
            }
            let dropped = dropped || rec.mode != before.mode;
            if dropped {
                rec.ctime = self.now();
                tx.account(Some(&before), Some(&rec));
                tx.put_inode(ino, &rec)?;
            }
            Ok((rec.attr(ino), dropped))
        })
    }

    /// Writes `data` at `offset` into an inline file (holes read as zeros). Permission is
    /// the caller's business (checked at open).
    pub fn write_inline(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<InlineWrite> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| fs(FsStatus::TooBig, "offset overflow"))?;
        if end > INLINE_DATA_MAX as u64 {
            // The write is never applied here: a read says which way it goes, with no write
            // transaction to begin and abort.
            return self.read(|rx| {
                let rec = rx.inode(ino)?;
                regular(&rec)?;
                Ok(match rec.body {
                    Body::File(FileData::Inline(_)) => InlineWrite::MustSpill,
                    _ => InlineWrite::Chunked,
                })
            });
        }
        self.write(|tx| {
            let mut rec = tx.inode(ino)?;
            regular(&rec)?;
            let before = rec.clone();
            let Body::File(FileData::Inline(bytes)) = &mut rec.body else {
                tx.unchanged = true;
                return Ok(InlineWrite::Chunked);
            };
            let (offset, end) = (offset as usize, end as usize);
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[offset..end].copy_from_slice(data);
            rec.size = bytes.len() as u64;
            let now = self.now();
            rec.mtime = now;
            rec.ctime = now;
            rec.version += 1;
            tx.account(Some(&before), Some(&rec));
            tx.put_inode(ino, &rec)?;
            Ok(InlineWrite::Written { size: rec.size })
        })
    }

    /// Up to `len` bytes at `offset` of an inline file; `None` when the file is chunked.
    pub fn read_inline(&self, ino: Ino, offset: u64, len: usize) -> Result<Option<Vec<u8>>> {
        self.read(|rx| {
            let rec = rx.inode(ino)?;
            regular(&rec)?;
            match &rec.body {
                Body::File(FileData::Inline(bytes)) => {
                    let start = (offset.min(bytes.len() as u64)) as usize;
                    let end = start.saturating_add(len).min(bytes.len());
                    Ok(Some(bytes[start..end].to_vec()))
                }
                _ => Ok(None),
            }
        })
    }

    /// After a chunk write that ended at `new_size`: grows the size (never shrinks it) and
    /// sets mtime. Returns the size now.
    pub fn extend_size(&self, ino: Ino, new_size: u64, mtime: Timestamp) -> Result<u64> {
        self.extend_size_from(ino, new_size, mtime).map(|(size, _)| size)
    }

    /// [`Meta::extend_size`], also returning the size and mtime the file had just before:
    /// a client that finds there the version it last saw knows nobody else changed the file
    /// in between (close-to-open between clients).
    pub fn extend_size_from(
        &self,
        ino: Ino,
        new_size: u64,
        mtime: Timestamp,
    ) -> Result<(u64, (u64, Timestamp))> {
        // Mostly already there (a `SpillSized`, or an earlier close, published it): a read
        // finds that with no write transaction to begin and abort.
        let current = self.read(|rx| {
            let rec = rx.inode(ino)?;
            regular(&rec)?;
            let done = rec.layout().is_some() && published(&rec, new_size, mtime);
            Ok(done.then_some((rec.size, (rec.size, rec.mtime))))
        })?;
        if let Some(done) = current {
            return Ok(done);
        }
        self.write(|tx| {
            let mut rec = tx.inode(ino)?;
            regular(&rec)?;
            if rec.layout().is_none() {
                return Err(fs(FsStatus::Invalid, "extend_size on an inline file"));
            }
            if published(&rec, new_size, mtime) {
                // Published between the read and this transaction: nothing to commit.
                tx.unchanged = true;
                return Ok((rec.size, (rec.size, rec.mtime)));
            }
            let before = rec.clone();
            rec.size = rec.size.max(new_size);
            rec.mtime = mtime;
            rec.ctime = self.now();
            rec.version += 1;
            tx.account(Some(&before), Some(&rec));
            tx.put_inode(ino, &rec)?;
            Ok((rec.size, (before.size, before.mtime)))
        })
    }

    /// Step 1 of moving an inline file to chunks: the bytes and a layout (from the policy of
    /// the file's directory). Changes nothing. The caller then writes `bytes` at offset 0 of
    /// `layout` and calls [`Meta::spill_commit`]; until the commit the inode stays inline and
    /// readers see the inline bytes, so a crash in between loses nothing (the chunks written
    /// are garbage for the chunk scrubber). Writers of one file must be serialized by the
    /// caller across the two steps.
    pub fn spill_begin(&self, ino: Ino) -> Result<SpillPlan> {
        match self.spill_plan(ino)? {
            Spilled::Plan(plan) => Ok(plan),
            Spilled::Chunked(_) => Err(fs(FsStatus::Invalid, "file is already chunked")),
        }
    }

    /// Moves a file to chunks as far as the metadata can alone, in one read and (for an
    /// empty file) one write: a chunked file answers its attributes; an empty inline file
    /// becomes chunked at once, with `sized` (size and mtime) published in the same commit;
    /// a file with inline bytes returns the plan to carry out (write the bytes, then
    /// [`Meta::spill_commit`]).
    pub fn spill(&self, ino: Ino, sized: Option<(u64, Timestamp)>) -> Result<Spilled> {
        let plan = match self.spill_plan(ino)? {
            Spilled::Plan(plan) if plan.bytes.is_empty() => plan,
            other => return Ok(other),
        };
        match self.commit_spill(&plan, sized) {
            Ok(attr) => Ok(Spilled::Chunked(attr)),
            // Another writer spilled it first: that one's layout stands.
            Err(error) => match self.getattr(ino)? {
                attr if attr.layout.is_some() => Ok(Spilled::Chunked(attr)),
                _ => Err(error),
            },
        }
    }

    /// The plan for an inline file (its bytes and a layout from its directory's policy), or
    /// the attributes of a chunked one; one read.
    fn spill_plan(&self, ino: Ino) -> Result<Spilled> {
        self.read(|rx| {
            let rec = rx.inode(ino)?;
            regular(&rec)?;
            let Body::File(FileData::Inline(bytes)) = &rec.body else {
                return Ok(Spilled::Chunked(rec.attr(ino)));
            };
            let policy = match rx.inode(rec.parent).map(|p| p.body) {
                Ok(Body::Dir(d)) => d.policy,
                _ => match rx.inode(ROOT_INO)?.body {
                    Body::Dir(d) => d.policy,
                    _ => return Err(MetaError::Corrupt("root is not a directory".into())),
                },
            };
            let layout = self.choose_layout(&policy)?;
            Ok(Spilled::Plan(SpillPlan { ino, bytes: bytes.clone(), layout, version: rec.version }))
        })
    }

    /// Step 2: the chunks hold the plan's bytes; the inode becomes chunked with the plan's
    /// layout. Fails with EAGAIN (and changes nothing) if the inline data changed since the
    /// plan was made.
    pub fn spill_commit(&self, plan: &SpillPlan) -> Result<()> {
        self.commit_spill(plan, None).map(|_| ())
    }

    /// [`Meta::spill_commit`], and with `sized` (for an empty file's plan) the size raised to
    /// it and mtime set in the same commit: the first write past the inline limit publishes
    /// its size with the layout (`SpillSized`). Returns the file's new attributes.
    fn commit_spill(&self, plan: &SpillPlan, sized: Option<(u64, Timestamp)>) -> Result<Attr> {
        plan.layout.validate().map_err(|_| fs(FsStatus::Invalid, "invalid layout"))?;
        self.write(|tx| {
            let mut rec = tx.inode(plan.ino)?;
            regular(&rec)?;
            if !matches!(rec.body, Body::File(FileData::Inline(_))) || rec.version != plan.version {
                return Err(fs(FsStatus::Unavailable, "file changed since the spill plan"));
            }
            let before = rec.clone();
            rec.body = Body::File(FileData::Chunked(plan.layout.clone()));
            rec.version += 1;
            if let Some((size, mtime)) = sized {
                rec.size = rec.size.max(size);
                rec.mtime = mtime;
                rec.ctime = self.now();
                tx.account(Some(&before), Some(&rec));
            }
            tx.put_inode(plan.ino, &rec)?;
            Ok(rec.attr(plan.ino))
        })
    }

    /// The layout of a chunked file; `None` while the file is inline.
    pub fn file_layout(&self, ino: Ino) -> Result<Option<FileLayout>> {
        self.read(|rx| {
            let rec = rx.inode(ino)?;
            regular(&rec)?;
            Ok(rec.layout().cloned())
        })
    }

    /// Gives an empty regular file an explicit layout (`setstripe`); the file becomes chunked.
    /// A file that holds data keeps its layout: EBUSY.
    pub fn set_file_layout(&self, ino: Ino, layout: &FileLayout, caller: &Caller) -> Result<()> {
        layout.validate().map_err(|_| fs(FsStatus::Invalid, "invalid layout"))?;
        self.write(|tx| {
            let mut rec = tx.inode(ino)?;
            regular(&rec)?;
            perm::check_owner(&rec, caller)?;
            if rec.size > 0 {
                return Err(fs(FsStatus::Busy, "file has data; its layout is fixed"));
            }
            rec.body = Body::File(FileData::Chunked(layout.clone()));
            rec.version += 1;
            rec.ctime = self.now();
            tx.put_inode(ino, &rec)
        })
    }

    /// A directory's default layout policy.
    pub fn layout_policy(&self, dir: Ino) -> Result<LayoutPolicy> {
        self.read(|rx| match rx.inode(dir)?.body {
            Body::Dir(d) => Ok(d.policy),
            _ => Err(fs(FsStatus::NotDir, "not a directory")),
        })
    }

    /// Sets the policy new files and subdirectories of `dir` inherit (existing ones keep
    /// theirs). Owner or root.
    pub fn set_layout_policy(
        &self,
        dir: Ino,
        policy: &LayoutPolicy,
        caller: &Caller,
    ) -> Result<()> {
        if !(CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX).contains(&policy.chunk_bytes)
            || !policy.chunk_bytes.is_power_of_two()
            || policy.stripe_count > STRIPE_COUNT_MAX
            || policy.pool.is_empty()
        {
            return Err(fs(FsStatus::Invalid, "invalid layout policy"));
        }
        self.write(|tx| {
            let mut rec = tx.inode(dir)?;
            perm::check_owner(&rec, caller)?;
            let now = self.now();
            let Some(body) = rec.dir_body() else {
                return Err(fs(FsStatus::NotDir, "not a directory"));
            };
            body.policy = policy.clone();
            rec.ctime = now;
            tx.put_inode(dir, &rec)
        })
    }

    /// `stripe_count` targets of the policy's pool (all of them for 0), starting at a
    /// rotating offset so that consecutive files start on different targets.
    pub fn choose_layout(&self, policy: &LayoutPolicy) -> Result<FileLayout> {
        let pool = (self.options.resolver)(&policy.pool);
        if pool.is_empty() {
            return Err(fs(FsStatus::NoSpace, "pool has no targets"));
        }
        let n = pool.len();
        let count = match policy.stripe_count as usize {
            0 => n,
            c => c.min(n),
        }
        .min(STRIPE_COUNT_MAX as usize);
        let start = (self.next_rotor() % n as u64) as usize;
        let targets = (0..count).map(|i| pool[(start + i) % n]).collect();
        let layout =
            FileLayout { pool: policy.pool.clone(), chunk_bytes: policy.chunk_bytes, targets };
        layout.validate().map_err(|_| fs(FsStatus::Invalid, "invalid layout policy"))?;
        Ok(layout)
    }
}
