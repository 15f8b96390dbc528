//! Copies of an object taken at one instant and made chunk by chunk afterwards.
//!
//! [`Engine::begin_clone`] only notes the copy and the source's chunks at that instant. From
//! then on, a change to a chunk of the source first copies the chunk's record into the copy
//! (under the chunk's lock, before the change), and [`Engine::finish_clone`] copies every chunk
//! no change reached yet. So the copy holds the source as it was when the copy began, and the
//! caller needs to hold the source's changes back only while `begin_clone` runs, not while
//! every record is copied (`docs/internals/engine.md`, "Clones").

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockWriteGuard, TryLockError};

use stria_proto::fs::{ChunkId, ObjectId};

use super::{Engine, key, lock};
use crate::EngineError;

/// A copy begun and not finished or cancelled.
#[derive(Debug)]
pub(super) struct Pending {
    source: ObjectId,
    dest: ObjectId,
    /// The source's chunk indices when the copy began, in order: only these are copied (a
    /// chunk made after the begin is no part of the copy).
    chunks: Vec<u64>,
    /// Indices already copied, or found missing: a chunk is copied once, before its first
    /// change after the copy began.
    done: Mutex<HashSet<u64>>,
    /// Chunks copied into `dest` so far.
    copied: AtomicU64,
    /// False once the copy ended (finished or cancelled); a chunk's copy holds it shared, so
    /// once the end returns nothing more is copied into `dest`, not even by a change that
    /// found the copy due just before.
    live: RwLock<bool>,
}

/// Volumes removed lately whose ids a copy may no longer begin into (volume ids are never
/// reused): a begin that reaches a target after its caller gave up and removed the copy's
/// chunks would otherwise leave a copy nobody finishes or removes.
const REMOVED_VOLUMES_KEPT: usize = 4096;

/// The copies under way on one target.
#[derive(Debug, Default)]
pub(super) struct Clones {
    /// Whether `list` is not empty: changes to other objects look no further.
    any: AtomicBool,
    list: Mutex<Vec<Arc<Pending>>>,
    /// The last [`REMOVED_VOLUMES_KEPT`] volumes removed on this target.
    removed: Mutex<VecDeque<ObjectId>>,
}

impl Clones {
    fn find(&self, source: ObjectId, dest: ObjectId) -> Option<Arc<Pending>> {
        lock(&self.list).iter().find(|p| p.source == source && p.dest == dest).cloned()
    }

    /// Takes `pending` off the list, waits for a chunk copy in progress and stops any later
    /// one. Returns whether the copy was still live (not cancelled before).
    fn end(&self, pending: &Arc<Pending>) -> bool {
        let mut list = lock(&self.list);
        list.retain(|p| !Arc::ptr_eq(p, pending));
        self.any.store(!list.is_empty(), Ordering::Release);
        drop(list);
        std::mem::replace(&mut *pending.live.write().unwrap_or_else(|e| e.into_inner()), false)
    }

    /// The copy that `chunk` must be copied into before it changes, if any. A chunk of an
    /// object being copied into may not change at all: the copy would overwrite the change.
    fn due(&self, chunk: ChunkId) -> Result<Option<Arc<Pending>>, EngineError> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(None);
        }
        for pending in lock(&self.list).iter() {
            if pending.dest == chunk.object {
                return Err(EngineError::Invalid(format!(
                    "object {} is being made a copy of object {}: it cannot change until the \
                     copy is finished",
                    pending.dest, pending.source
                )));
            }
            if pending.source == chunk.object
                && pending.chunks.binary_search(&chunk.index).is_ok()
                && !lock(&pending.done).contains(&chunk.index)
            {
                return Ok(Some(pending.clone()));
            }
        }
        Ok(None)
    }
}

impl Engine {
    /// Makes `dest` a copy of `source`, sharing its blocks: each chunk record of `source` is
    /// copied under `dest`, and every block it names gains a reference instead of being copied
    /// (writes are copy-on-write, so a later write to either object takes new blocks and leaves
    /// the other as it was). Like any change, the copy is durable after the next
    /// [`Engine::sync`]. `dest` must have no chunks. Returns the number of chunks copied.
    ///
    /// The copy is of `source` as it was when this was called: chunks are copied one at a time,
    /// each under its lock (and its copy's), so the rest of the target goes on meanwhile, and a
    /// change to `source` meanwhile copies its chunk first. This is [`Engine::begin_clone`]
    /// then [`Engine::finish_clone`]; a caller that wants one instant across targets takes the
    /// two steps itself and holds the source's changes back only during the begin. On an error, some chunks may have been copied: remove `dest` before
    /// using it again.
    pub fn clone_object(&self, source: ObjectId, dest: ObjectId) -> Result<u64, EngineError> {
        self.begin_clone(source, dest)?;
        self.finish_clone(source, dest)
    }

    /// Begins making `dest` a copy of `source` as it is now, sharing its blocks: see
    /// [`Engine::clone_object`], which this and [`Engine::finish_clone`] split in two. This
    /// only notes the source's chunks, so it is quick; from its return on, every change to
    /// `source` first copies the chunk it changes, and `dest` may not change until the copy is
    /// finished or cancelled (removing `dest` cancels it). Returns the number of chunks to copy.
    pub fn begin_clone(&self, source: ObjectId, dest: ObjectId) -> Result<u64, EngineError> {
        self.committer.check()?;
        if source == dest {
            return Err(EngineError::Invalid(format!("cannot clone object {source} onto itself")));
        }
        if !self.chunk_indices(dest)?.is_empty() {
            return Err(EngineError::Invalid(format!(
                "cannot clone into object {dest}: it has chunks already"
            )));
        }
        // The list's lock, then the removed list's, as a removal takes them: a removal either
        // came first (and is seen here) or finds this copy listed (and cancels it).
        let mut list = lock(&self.clones.list);
        if lock(&self.clones.removed).contains(&dest) {
            return Err(EngineError::Invalid(format!(
                "cannot clone into object {dest}: it was removed (a copy given up on)"
            )));
        }
        let busy = [source, dest];
        if let Some(p) = list.iter().find(|p| busy.contains(&p.source) || busy.contains(&p.dest)) {
            return Err(EngineError::Invalid(format!(
                "a copy of object {} into object {} is under way; it must finish first",
                p.source, p.dest
            )));
        }
        // Listed under the list's lock: a change to `source` either finished before (and is
        // in the copy) or finds the copy due.
        let chunks = self.chunk_indices(source)?;
        let count = chunks.len() as u64;
        list.push(Arc::new(Pending {
            source,
            dest,
            chunks,
            done: Mutex::new(HashSet::new()),
            copied: AtomicU64::new(0),
            live: RwLock::new(true),
        }));
        self.clones.any.store(true, Ordering::Release);
        Ok(count)
    }

    /// Copies every chunk of a copy [`Engine::begin_clone`] began that no change copied yet, and
    /// ends it. Returns the number of chunks the copy holds from this call and from changes.
    /// On failure the copy is cancelled; `dest` may hold some chunks then.
    pub fn finish_clone(&self, source: ObjectId, dest: ObjectId) -> Result<u64, EngineError> {
        let Some(pending) = self.clones.find(source, dest) else {
            return Err(EngineError::Invalid(format!(
                "no copy of object {source} into object {dest} is under way"
            )));
        };
        for &index in &pending.chunks {
            let from = ChunkId { object: source, index };
            let to = ChunkId { object: dest, index };
            // Two locks, in stripe order (as remove_objects takes many).
            let (a, b) = (Self::lock_index(from), Self::lock_index(to));
            let _first = self.locks[a.min(b)].write().unwrap_or_else(|e| e.into_inner());
            let _second =
                (a != b).then(|| self.locks[a.max(b)].write().unwrap_or_else(|e| e.into_inner()));
            if let Err(e) = self.copy_chunk(&pending, index) {
                drop((_first, _second));
                self.clones.end(&pending);
                return Err(e);
            }
        }
        if !self.clones.end(&pending) {
            return Err(EngineError::Invalid(format!(
                "the copy of object {source} into object {dest} was cancelled (its copy was removed)"
            )));
        }
        let copied = pending.copied.load(Ordering::Relaxed);
        tracing::info!(target = %self.sb.target, %source, %dest, chunks = copied, "object cloned");
        Ok(copied)
    }

    /// Cancels the copies into any of `objects` (they are being removed), and keeps the
    /// volumes among them from being copied into later.
    pub(super) fn cancel_clones_into(&self, objects: &[ObjectId]) {
        // Both under the list's lock, so no copy into these begins between the two steps.
        let list = lock(&self.clones.list);
        let mut removed = lock(&self.clones.removed);
        for &object in objects.iter().filter(|o| o.0 & ObjectId::VOLUME_BIT != 0) {
            if removed.len() == REMOVED_VOLUMES_KEPT {
                removed.pop_front();
            }
            removed.push_back(object);
        }
        drop(removed);
        let into: Vec<Arc<Pending>> =
            list.iter().filter(|p| objects.contains(&p.dest)).cloned().collect();
        drop(list);
        for pending in into {
            tracing::info!(source = %pending.source, dest = %pending.dest, "copy cancelled");
            self.clones.end(&pending);
        }
    }

    /// Finishes the copies out of any of `objects` (they are being removed).
    pub(super) fn finish_clones_from(&self, objects: &[ObjectId]) -> Result<(), EngineError> {
        let from: Vec<(ObjectId, ObjectId)> = lock(&self.clones.list)
            .iter()
            .filter(|p| objects.contains(&p.source))
            .map(|p| (p.source, p.dest))
            .collect();
        for (source, dest) in from {
            self.finish_clone(source, dest)?;
        }
        Ok(())
    }

    /// Whether a change to `chunk` would have to copy it into a copy under way first.
    pub(super) fn clone_due(&self, chunk: ChunkId) -> Result<bool, EngineError> {
        Ok(self.clones.due(chunk)?.is_some())
    }

    /// Takes `chunk`'s lock exclusively for a change, after copying the chunk into any copy of
    /// its object under way that does not have it yet.
    pub(super) fn lock_for_change(
        &self,
        chunk: ChunkId,
    ) -> Result<RwLockWriteGuard<'_, ()>, EngineError> {
        loop {
            let guard = self.lock_of(chunk).write().unwrap_or_else(|e| e.into_inner());
            let Some(pending) = self.clones.due(chunk)? else { return Ok(guard) };
            let to = ChunkId { object: pending.dest, index: chunk.index };
            let (a, b) = (Self::lock_index(chunk), Self::lock_index(to));
            if a == b {
                self.copy_chunk(&pending, chunk.index)?;
                return Ok(guard);
            }
            // The copy's lock comes after the chunk's only when it is free; otherwise both are
            // taken again in stripe order, the order every holder of two locks keeps.
            let second = match self.locks[b].try_write() {
                Ok(second) => Some(second),
                Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            };
            if let Some(_second) = second {
                self.copy_chunk(&pending, chunk.index)?;
                return Ok(guard);
            }
            drop(guard);
            let _first = self.locks[a.min(b)].write().unwrap_or_else(|e| e.into_inner());
            let _second = self.locks[a.max(b)].write().unwrap_or_else(|e| e.into_inner());
            self.copy_chunk(&pending, chunk.index)?;
        }
    }

    /// Copies chunk `index` of the source into `pending`'s copy unless it was copied already or
    /// the copy was cancelled; the caller holds the locks of the chunk and of its copy.
    fn copy_chunk(&self, pending: &Pending, index: u64) -> Result<(), EngineError> {
        let live = pending.live.read().unwrap_or_else(|e| e.into_inner());
        if !*live || lock(&pending.done).contains(&index) {
            return Ok(());
        }
        let from = ChunkId { object: pending.source, index };
        let to = ChunkId { object: pending.dest, index };
        if self.load_record(to)?.is_some() {
            // Only a write racing the begin's check could have put it there.
            return Err(EngineError::Invalid(format!("the copy's chunk {to} exists already")));
        }
        if let Some(rec) = self.load_record(from)? {
            // The references are taken before the copy is staged. If staging fails, the
            // target is poisoned and frees no parked block until it is reopened, when the
            // counts are rebuilt from the map: the references are simply left.
            lock(&self.alloc).share(&rec.physical_runs());
            self.committer.commit(&self.db, (key(to), Some(rec.clone())))?;
            self.records.put(Self::lock_index(to), to, rec);
            self.chunks.fetch_add(1, Ordering::Relaxed);
            pending.copied.fetch_add(1, Ordering::Relaxed);
        }
        lock(&pending.done).insert(index);
        Ok(())
    }
}
