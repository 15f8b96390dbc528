//! Open files: handles, and the per-inode state their writes and reads share.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use stria_proto::fs::{FileLayout, FsStatus, Ino, has_suid};
use stria_proto::wire::{Attr, Timestamp};
use stria_rpc::Data;
use tokio::sync::{OnceCell, Semaphore};

use crate::FsResult;

/// The handle `open` returns; the FUSE mount hands it back on every call.
pub type FileHandleId = u64;

#[derive(Debug)]
pub(crate) struct OpenFile {
    pub ino: Ino,
    pub inode: Arc<InodeData>,
    /// Whether the handle was opened for writing or a write came through it. A handle that
    /// is neither has nothing of its own to flush: its flush and release leave the inode's
    /// queued writes (and their errors) to the handles that made them. (With the kernel's
    /// writeback cache, a WRITE may come through another writable handle than the one the
    /// application wrote with; both are writable.)
    writable: AtomicBool,
    /// How many of the inode's write errors (`InodeState::write_errors`) this handle has seen:
    /// those of before its open, and those its flushes and fsyncs reported.
    errors_seen: AtomicU64,
}

impl OpenFile {
    pub fn note_write(&self) {
        self.writable.store(true, Ordering::Relaxed);
    }

    pub fn writable(&self) -> bool {
        self.writable.load(Ordering::Relaxed)
    }

    /// The inode's latest write error when this handle has not seen it yet (`state` is its
    /// inode's, locked).
    pub fn unseen_error(&self, state: &InodeState) -> Option<FsStatus> {
        let seen = self.errors_seen.load(Ordering::Relaxed);
        if state.write_errors > seen { state.write_error } else { None }
    }

    /// [`OpenFile::unseen_error`], marked seen: a flush or fsync reports it, once per handle.
    pub fn take_unseen_error(&self, state: &InodeState) -> Option<FsStatus> {
        let error = self.unseen_error(state);
        self.errors_seen.store(state.write_errors, Ordering::Relaxed);
        error
    }
}

/// A chunk being (or already) fetched ahead of a sequential reader.
pub(crate) type Prefetch = Arc<OnceCell<FsResult<Data>>>;

/// State shared by every open handle of one inode in this client.
#[derive(Debug)]
pub(crate) struct InodeData {
    pub ino: Ino,
    state: Mutex<InodeState>,
    /// Queued writes hold permits (one per byte); waiting for all of them drains the queue.
    pub write_budget: Arc<Semaphore>,
    pub write_budget_bytes: u32,
    /// Serializes moving the file out of its inode (concurrent writes would race to spill).
    pub spill_lock: tokio::sync::Mutex<()>,
    /// Held while a flush publishes the size: a second flush waits for the first one's
    /// publish instead of returning while it is still in flight (close-to-open).
    pub publish_lock: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
pub(crate) struct InodeState {
    pub opens: u32,
    /// `None` while the file's bytes live inside its inode.
    pub layout: Option<FileLayout>,
    /// The size including queued writes.
    pub size: u64,
    /// The size or mtime changed here and the metadata service has not been told yet.
    pub size_dirty: bool,
    pub mtime: Timestamp,
    /// The latest error of a queued write. Every handle open when it happened reports it once,
    /// at its next flush or fsync, as Linux reports a writeback error to each open file
    /// (errseq): the first handle to flush must not take it from the writer's.
    pub write_error: Option<FsStatus>,
    /// Queued writes failed so far (see [`OpenFile::unseen_error`]).
    pub write_errors: u64,
    pub prefetch: HashMap<u64, Prefetch>,
    /// Where the next read of a sequential reader would start.
    pub next_sequential: u64,
    /// Reads in a row that started where the previous one ended (about).
    pub sequential_hits: u32,
    /// An inline file's bytes as the open fetched them, while nothing here changed them:
    /// reads are served from it (close-to-open: another client's writes show at the next
    /// open). Dropped by every write, truncate or spill.
    pub inline: Option<Vec<u8>>,
    /// Queued chunk writes still in flight, by first byte. A write that overlaps one waits
    /// for it before it is queued, so overlapping writes reach the targets in the order they
    /// were made (independent requests may otherwise overtake each other), and the ranges
    /// here never overlap. A write's entry leaves when its last piece has finished.
    pub in_flight: BTreeMap<u64, InFlight>,
    /// Tells the entries of `in_flight` apart (one range may be written again and again).
    pub next_write_id: u64,
    /// This client created the file and set no extended attribute on it since: it has none
    /// (as far as close-to-open consistency goes: another client's setxattr meanwhile is
    /// seen at the next open).
    pub no_xattrs: bool,
    /// This client asked for the file's `security.capability` while it had the file open and
    /// there was none (the kernel asks before every write to a file; see `Client::getxattr`).
    /// Same consistency as `no_xattrs`.
    pub no_capability: bool,
    /// The file's mode, as last seen here, has bits a write by someone without CAP_FSETID
    /// clears (set-user-ID, or set-group-ID with group execute); also set while a change of
    /// the mode or owner through this client is unanswered.
    pub suidgid: bool,
    /// Extended-attribute, mode and owner changes made through this client while the file was
    /// open: an answer to a request sent before one of them says nothing about the file after
    /// it.
    pub xattr_changes: u64,
}

/// A queued write's end and id; the receiver closes when the write has finished.
#[derive(Debug)]
pub(crate) struct InFlight {
    pub end: u64,
    pub id: u64,
    pub done: tokio::sync::watch::Receiver<()>,
}

impl InodeData {
    pub fn state(&self) -> MutexGuard<'_, InodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a write to the open file must first ask the metadata service to drop
    /// privileges (see `Client::drop_privileges_for_write`): it may have a capability, or
    /// `suidgid` and its mode may have set-ID bits. When it must, the count of changes made
    /// here so far, for [`InodeData::privileges_dropped`].
    pub fn privileges_to_drop(&self, suidgid: bool) -> Option<u64> {
        let state = self.state();
        let capability = !(state.no_xattrs || state.no_capability);
        (capability || suidgid && state.suidgid).then_some(state.xattr_changes)
    }

    /// The metadata service dropped the file's privileges, after `changes` changes made here,
    /// and answered `attr`: kept if no change was made here since.
    pub fn privileges_dropped(&self, attr: &Attr, changes: u64) {
        let mut state = self.state();
        if state.xattr_changes == changes {
            state.no_capability = true;
            state.suidgid = has_suid(u32::from(attr.perm));
        }
    }
}

#[derive(Debug)]
pub(crate) struct OpenFiles {
    handles: Mutex<HashMap<FileHandleId, Arc<OpenFile>>>,
    inodes: Mutex<HashMap<Ino, Arc<InodeData>>>,
    next_handle: AtomicU64,
    write_behind_bytes: u32,
    /// Sizes published by this client so far: an attribute reply fetched while one was being
    /// published may predate it, though the size is no longer marked unpublished.
    publishes: AtomicU64,
}

impl OpenFiles {
    pub fn new(write_behind_bytes: usize) -> OpenFiles {
        OpenFiles {
            handles: Mutex::new(HashMap::new()),
            inodes: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            write_behind_bytes: write_behind_bytes.clamp(16 << 20, u32::MAX as usize) as u32,
            publishes: AtomicU64::new(0),
        }
    }

    /// Opens a handle; `inline` is the file's bytes when they live in its inode and came
    /// with the open.
    pub fn open(&self, attr: &Attr, inline: Option<Vec<u8>>, writable: bool) -> FileHandleId {
        let mut inodes = self.inodes.lock().unwrap_or_else(|e| e.into_inner());
        let inode = inodes
            .entry(attr.ino)
            .or_insert_with(|| {
                Arc::new(InodeData {
                    ino: attr.ino,
                    state: Mutex::new(InodeState {
                        opens: 0,
                        layout: attr.layout.clone(),
                        size: attr.size,
                        size_dirty: false,
                        mtime: attr.mtime,
                        write_error: None,
                        write_errors: 0,
                        prefetch: HashMap::new(),
                        next_sequential: 0,
                        sequential_hits: 0,
                        inline: None,
                        in_flight: BTreeMap::new(),
                        next_write_id: 0,
                        no_xattrs: false,
                        no_capability: false,
                        suidgid: false,
                        xattr_changes: 0,
                    }),
                    write_budget: Arc::new(Semaphore::new(self.write_behind_bytes as usize)),
                    write_budget_bytes: self.write_behind_bytes,
                    spill_lock: tokio::sync::Mutex::new(()),
                    publish_lock: tokio::sync::Mutex::new(()),
                })
            })
            .clone();
        let errors_seen = {
            let mut state = inode.state();
            state.opens += 1;
            // What this client knew of the file's extended attributes holds until the next
            // open (close-to-open): another client may have set some meanwhile.
            state.no_xattrs = false;
            state.no_capability = false;
            state.suidgid |= has_suid(u32::from(attr.perm));
            if state.layout.is_none() {
                state.layout = attr.layout.clone();
            }
            // Chunks read ahead for a handle already open may predate another client's
            // writes that this open must see (close-to-open): the reader starts again.
            state.prefetch.clear();
            // The bytes that came with the open serve reads, if they are the whole file. With
            // other handles open, only while the copy here is still as fetched: none means a
            // write or truncate here changed the file, which the open's bytes may predate.
            let sole = state.opens == 1 && !state.size_dirty;
            let fresh =
                inline.filter(|bytes| state.layout.is_none() && bytes.len() as u64 == attr.size);
            state.inline = if sole || state.inline.is_some() { fresh } else { None };
            // Handles already open here know at least as much as the metadata service, whose
            // answer may predate a publish of theirs; only a fresh inode takes its size.
            if state.opens == 0 {
                state.size = attr.size;
            } else if !state.size_dirty {
                state.size = state.size.max(attr.size);
            }
            // Write errors from before the open are not this handle's to report.
            state.write_errors
        };
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let file = Arc::new(OpenFile {
            ino: attr.ino,
            inode,
            writable: AtomicBool::new(writable),
            errors_seen: AtomicU64::new(errors_seen),
        });
        self.handles.lock().unwrap_or_else(|e| e.into_inner()).insert(fh, file);
        fh
    }

    pub fn get(&self, fh: FileHandleId) -> FsResult<Arc<OpenFile>> {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fh)
            .cloned()
            .ok_or(FsStatus::Stale)
    }

    /// Forgets a handle; true when it was the inode's last one here.
    pub fn close(&self, fh: FileHandleId) -> bool {
        let Some(file) = self.handles.lock().unwrap_or_else(|e| e.into_inner()).remove(&fh) else {
            return false;
        };
        let mut inodes = self.inodes.lock().unwrap_or_else(|e| e.into_inner());
        let last = {
            let mut state = file.inode.state();
            state.opens -= 1;
            state.opens == 0
        };
        if last {
            inodes.remove(&file.ino);
        }
        last
    }

    /// Handles open here per inode.
    pub fn open_counts(&self) -> Vec<(Ino, u32)> {
        let inodes = self.inodes.lock().unwrap_or_else(|e| e.into_inner());
        inodes
            .iter()
            .map(|(&ino, inode)| (ino, inode.state().opens))
            .filter(|&(_, opens)| opens > 0)
            .collect()
    }

    pub fn inode(&self, ino: Ino) -> Option<Arc<InodeData>> {
        self.inodes.lock().unwrap_or_else(|e| e.into_inner()).get(&ino).cloned()
    }

    /// Every inode open here, with the size this client knows for it.
    pub fn sizes(&self) -> Vec<(Ino, u64)> {
        let inodes: Vec<Arc<InodeData>> =
            self.inodes.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        inodes.iter().map(|inode| (inode.ino, inode.state().size)).collect()
    }

    /// Taken before asking the metadata service for attributes, for [`OpenFiles::overlay`].
    pub fn publishes(&self) -> u64 {
        self.publishes.load(Ordering::SeqCst)
    }

    /// A size was published: called before its inode's unpublished mark is cleared.
    pub fn published(&self) {
        self.publishes.fetch_add(1, Ordering::SeqCst);
    }

    /// Attributes as this client sees them: the metadata service's, with the size and mtime of
    /// writes still queued here, or published since `since` (a [`OpenFiles::publishes`] taken
    /// before the request: its reply may predate the publish).
    pub fn overlay(&self, mut attr: Attr, since: u64) -> Attr {
        if let Some(inode) = self.inode(attr.ino) {
            let state = inode.state();
            if state.size_dirty || self.publishes() != since {
                attr.size = attr.size.max(state.size);
                attr.mtime = attr.mtime.max(state.mtime);
            }
            if attr.layout.is_none() {
                attr.layout = state.layout.clone();
            }
        }
        attr
    }

    /// The file was just created by this client: it has no extended attributes.
    pub fn no_xattrs(&self, ino: Ino) {
        if let Some(inode) = self.inode(ino) {
            inode.state().no_xattrs = true;
        }
    }

    /// Whether the file is open here and known to have no extended attributes.
    pub fn has_no_xattrs(&self, ino: Ino) -> bool {
        self.inode(ino).is_some_and(|inode| inode.state().no_xattrs)
    }

    /// An extended attribute is being set or removed through this client.
    pub fn may_have_xattrs(&self, ino: Ino) {
        if let Some(inode) = self.inode(ino) {
            let mut state = inode.state();
            state.no_xattrs = false;
            state.no_capability = false;
            state.xattr_changes += 1;
        }
    }

    /// Whether the file is open here and known to have no `security.capability`.
    pub fn has_no_capability(&self, ino: Ino) -> bool {
        self.inode(ino).is_some_and(|inode| {
            let state = inode.state();
            state.no_xattrs || state.no_capability
        })
    }

    /// How many extended-attribute changes this client made to the open file so far (None when
    /// it is not open here).
    pub fn xattr_changes(&self, ino: Ino) -> Option<u64> {
        self.inode(ino).map(|inode| inode.state().xattr_changes)
    }

    /// The mode or owner of the file is being changed through this client: until a write
    /// drops them again, it may have privileges to drop.
    pub fn may_change_mode(&self, ino: Ino) {
        if let Some(inode) = self.inode(ino) {
            let mut state = inode.state();
            state.suidgid = true;
            state.xattr_changes += 1;
        }
    }

    /// Another client changed the file's attributes: it may have extended attributes or
    /// set-ID bits this client does not know of.
    pub fn changed_elsewhere(&self, ino: Ino) {
        if let Some(inode) = self.inode(ino) {
            let mut state = inode.state();
            state.no_xattrs = false;
            state.no_capability = false;
            state.suidgid = true;
            state.xattr_changes += 1;
        }
    }

    /// The file had no `security.capability` when asked, after `changes` changes made here:
    /// kept if no change was made here since.
    pub fn no_capability_since(&self, ino: Ino, changes: u64) {
        if let Some(inode) = self.inode(ino) {
            let mut state = inode.state();
            if state.xattr_changes == changes {
                state.no_capability = true;
            }
        }
    }

    /// A truncate is about to set the size: forget what this client believed. What it
    /// believed is returned, for [`OpenFiles::truncate_failed`].
    pub fn before_truncate(&self, ino: Ino, size: u64) -> Option<SizeBefore> {
        let inode = self.inode(ino)?;
        let mut state = inode.state();
        let before = SizeBefore { size: state.size, dirty: state.size_dirty, truncated_to: size };
        state.size = size;
        state.size_dirty = false;
        state.prefetch.clear();
        state.inline = None;
        Some(before)
    }

    /// The truncate after [`OpenFiles::before_truncate`] failed, so the file keeps its size:
    /// the size this client knew stands again, and so does its mark if the metadata service
    /// has yet to be told (the close publishes it). A write made meanwhile keeps its own.
    pub fn truncate_failed(&self, ino: Ino, before: SizeBefore) {
        let Some(inode) = self.inode(ino) else {
            return;
        };
        let mut state = inode.state();
        if state.size == before.truncated_to && !state.size_dirty {
            state.size = before.size;
            state.size_dirty = before.dirty;
        } else {
            state.size = state.size.max(before.size);
            state.size_dirty |= before.dirty;
        }
    }

    /// A setattr set the file's mtime: the next publish of the size carries it, not the time
    /// of the writes made before (`cp -p` sets the times of the file it has just written,
    /// before closing it). A later write moves it on again.
    pub fn mtime_set(&self, ino: Ino, mtime: Timestamp) {
        if let Some(inode) = self.inode(ino) {
            inode.state().mtime = mtime;
        }
    }
}

/// What an open file's state held before a truncate (see [`OpenFiles::before_truncate`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SizeBefore {
    size: u64,
    dirty: bool,
    truncated_to: u64,
}
