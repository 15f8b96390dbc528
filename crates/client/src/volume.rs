//! Block volumes: a thin-provisioned device stored as the chunks of one object, striped over
//! targets by a [`FileLayout`] exactly like a file's data.
//!
//! Everything is write-through (NBD clients keep their own cache): a call returns once every
//! chunk request it made has been answered. The pieces of one call go out concurrently, at
//! most [`VOLUME_REQUESTS_IN_FLIGHT_MAX`] at once. A volume keeps no metadata of its own: its
//! size lives with whoever registered it (mgmt), and unwritten ranges are holes or missing
//! chunks, both of which read as zeros.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use stria_proto::BLOCK_BYTES;
use stria_proto::fs::{ChunkId, FileLayout, FsStatus, ObjectId, TargetId};
use stria_proto::wire::{
    BlockRun, ChunkMap, ChunkPunch, ChunkRead, ChunkWrite, ObjectClone, ObjectSpace,
};
use stria_rpc::Data;
use tokio::runtime::Handle;
use tokio::task::JoinSet;

use crate::data::{Piece, distinct_targets, pieces, remove_chunks, sync_targets};
use crate::transport::StorageConns;
use crate::{Client, FsResult};

/// Most chunk requests one volume call keeps in flight.
pub const VOLUME_REQUESTS_IN_FLIGHT_MAX: usize = 64;
/// Most bytes of chunk data one call keeps in flight (fewer requests with large chunks).
const VOLUME_IN_FLIGHT_BYTES_MAX: u64 = 128 << 20;
/// Largest single read or write; NBD sends at most 32 MiB.
pub const VOLUME_IO_BYTES_MAX: usize = 64 << 20;

const _: () = assert!(VOLUME_IO_BYTES_MAX >= 32 << 20);
const _: () = assert!(VOLUME_IN_FLIGHT_BYTES_MAX >= stria_proto::fs::CHUNK_BYTES_MAX as u64 * 2);

/// One allocation-map run of [`VolumeIo::block_status`]: `len` bytes that hold data
/// (`allocated`) or are a hole.
pub type VolumeExtent = (u64, bool);

/// A blocking handle on one volume's data. Cheap to clone; clones share the connections and
/// the size, so one handle can serve every NBD connection and thread of an export.
#[derive(Clone, Debug)]
pub struct VolumeIo {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    runtime: Handle,
    storage: StorageConns,
    object: ObjectId,
    layout: FileLayout,
    size: AtomicU64,
    in_flight_max: usize,
    /// Why every request is refused: the id or the layout was not a volume's.
    refused: Option<FsStatus>,
}

impl Client {
    /// A handle on the data of the volume `object` (its id carries [`ObjectId::VOLUME_BIT`]),
    /// striped by `layout`, `size` bytes long. A handle whose id is not a volume's or whose
    /// layout breaks its bounds refuses every request with `Invalid` (logged here, once), so
    /// a volume can never write into a file's chunks.
    pub fn volume(&self, object: ObjectId, layout: FileLayout, size: u64) -> VolumeIo {
        let mut refused = None;
        if object.0 & ObjectId::VOLUME_BIT == 0 {
            tracing::error!(%object, "volume id without the volume bit: every request refused");
            refused = Some(FsStatus::Invalid);
        }
        if let Err(reason) = layout.validate() {
            tracing::error!(%object, %reason, "volume layout refused: every request refused");
            refused = Some(FsStatus::Invalid);
        }
        let chunk_bytes = (layout.chunk_bytes as u64).max(1);
        let in_flight_max = (VOLUME_IN_FLIGHT_BYTES_MAX / chunk_bytes)
            .clamp(1, VOLUME_REQUESTS_IN_FLIGHT_MAX as u64) as usize;
        VolumeIo {
            shared: Arc::new(Shared {
                runtime: self.inner.runtime.clone(),
                storage: self.inner.storage.clone(),
                object,
                layout,
                size: AtomicU64::new(size),
                in_flight_max,
                refused,
            }),
        }
    }
}

impl VolumeIo {
    pub fn object(&self) -> ObjectId {
        self.shared.object
    }

    /// Makes the volume's writes on `targets` durable; fails with `Io` when a target's service
    /// restarted and lost some of them since the last sync (see `durability`).
    async fn sync(&self, targets: impl IntoIterator<Item = TargetId>) -> FsResult<()> {
        sync_targets(&self.shared.storage, targets).await?;
        if self.shared.storage.take_lost(self.shared.object.0) {
            tracing::error!(object = %self.shared.object, "volume flush failed: writes were lost by a restart");
            return Err(FsStatus::Io);
        }
        Ok(())
    }

    pub fn layout(&self) -> &FileLayout {
        &self.shared.layout
    }

    /// The size requests are checked against.
    pub fn size(&self) -> u64 {
        self.shared.size.load(Ordering::Acquire)
    }

    /// Sets the size after the volume was resized. Growing exposes zeros only if the data
    /// past the old end was dropped first ([`VolumeIo::shrink_to`] on the way down).
    pub fn set_size(&self, size: u64) {
        self.shared.size.store(size, Ordering::Release);
    }

    /// Reads `len` bytes at `offset`; holes read as zeros. A range past the end is `Invalid`.
    pub fn read(&self, offset: u64, len: usize) -> FsResult<Vec<u8>> {
        // Checked before the buffer is allocated.
        if len > VOLUME_IO_BYTES_MAX {
            return Err(FsStatus::Invalid);
        }
        self.check_range(offset, len as u64)?;
        let mut out = vec![0u8; len];
        self.read_into(offset, &mut out)?;
        Ok(out)
    }

    /// As [`VolumeIo::read`], into the caller's buffer.
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> FsResult<()> {
        self.block(self.read_into_async(offset, buf))
    }

    /// As [`VolumeIo::read_into`], for callers already on the client's runtime (the NBD
    /// gateway), without a blocking thread.
    pub async fn read_into_async(&self, offset: u64, buf: &mut [u8]) -> FsResult<()> {
        let jobs = self.read_jobs(offset, buf.len())?;
        self.run(jobs, |(piece, data): (Piece, Data)| {
            // A chunk shorter than the piece (or missing) is a hole there: zeros.
            let out = &mut buf[piece.offset_in_range..piece.offset_in_range + piece.len as usize];
            let take = data.len().min(out.len());
            data.copy_to_slice(&mut out[..take]);
            out[take..].fill(0);
        })
        .await
    }

    /// As [`VolumeIo::read_into_async`], but the bytes stay in the buffers the targets'
    /// replies came in (in process, the targets' cached blocks): in order, `len` bytes together
    /// (holes as buffers of zeros). A caller that sends them on (the NBD gateway) then copies
    /// nothing.
    pub async fn read_parts_async(&self, offset: u64, len: usize) -> FsResult<Vec<Bytes>> {
        let jobs = self.read_jobs(offset, len)?;
        let mut pieces: Vec<(usize, Data)> = Vec::new();
        self.run(jobs, |(piece, data): (Piece, Data)| {
            let want = piece.len as usize;
            let mut data = data.slice(..data.len().min(want));
            // A chunk shorter than the piece (or missing) is a hole there: zeros.
            data.push(Bytes::from(vec![0u8; want - data.len()]));
            pieces.push((piece.offset_in_range, data));
        })
        .await?;
        pieces.sort_unstable_by_key(|&(at, _)| at);
        Ok(pieces.into_iter().flat_map(|(_, data)| data.into_parts()).collect())
    }

    /// The chunk reads of `[offset, offset + len)`, each answering with its piece.
    fn read_jobs(
        &self,
        offset: u64,
        len: usize,
    ) -> FsResult<
        impl Iterator<Item = impl Future<Output = FsResult<(Piece, Data)>> + Send + use<>> + '_,
    > {
        if len > VOLUME_IO_BYTES_MAX {
            return Err(FsStatus::Invalid);
        }
        self.check_range(offset, len as u64)?;
        Ok(self.pieces(offset, len as u64).map(|(piece, target, chunk)| {
            let storage = self.shared.storage.clone();
            let request =
                ChunkRead { target, chunk, offset: piece.offset_in_chunk, len: piece.len };
            async move { Ok((piece, storage.chunk_read(request).await?)) }
        }))
    }

    /// Writes `data` at `offset` (any alignment: the targets merge partial blocks). With
    /// `fua`, the data is durable on every target it touched before this returns. A range past
    /// the end is `Invalid` and writes nothing.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> FsResult<()> {
        self.block(self.write_async(offset, data, fua))
    }

    /// As [`VolumeIo::write`], for callers already on the client's runtime.
    pub async fn write_async(&self, offset: u64, data: &[u8], fua: bool) -> FsResult<()> {
        if data.len() > VOLUME_IO_BYTES_MAX {
            return Err(FsStatus::Invalid);
        }
        self.check_range(offset, data.len() as u64)?;
        let touched = self.touched(offset, data.len() as u64);
        let sync_each = fua && self.one_piece_per_target(offset, data.len() as u64);
        let jobs = self.pieces(offset, data.len() as u64).map(|(piece, target, chunk)| {
            let start = piece.offset_in_range;
            let bytes = Bytes::copy_from_slice(&data[start..start + piece.len as usize]);
            self.write_job(piece, target, chunk, bytes, sync_each)
        });
        self.run(jobs, |()| ()).await?;
        if fua && !sync_each {
            self.sync(touched).await?;
        }
        Ok(())
    }

    /// Makes every write that completed before this call durable, whichever handle or thread
    /// made it: a sync of every target of the layout.
    pub fn flush(&self) -> FsResult<()> {
        self.usable()?;
        self.block(self.sync(distinct_targets(&self.shared.layout)))
    }

    /// The caller no longer needs `[offset, offset + len)`: it reads as zeros afterwards, its
    /// whole blocks are freed and chunks left empty are removed. Not durable until a flush.
    pub fn trim(&self, offset: u64, len: u64) -> FsResult<()> {
        self.block(self.trim_async(offset, len))
    }

    /// As [`VolumeIo::trim`], for callers already on the client's runtime.
    pub async fn trim_async(&self, offset: u64, len: u64) -> FsResult<()> {
        self.check_range(offset, len)?;
        self.punch(offset, len).await
    }

    /// Makes `[offset, offset + len)` read as zeros: by freeing it (`may_trim`, as
    /// [`VolumeIo::trim`]) or by writing zero blocks, which stay allocated. With `fua` the
    /// change is durable before this returns.
    pub fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool, fua: bool) -> FsResult<()> {
        self.block(self.write_zeroes_async(offset, len, may_trim, fua))
    }

    /// As [`VolumeIo::write_zeroes`], for callers already on the client's runtime.
    pub async fn write_zeroes_async(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> FsResult<()> {
        self.check_range(offset, len)?;
        let touched = self.touched(offset, len);
        let sync_each = !may_trim && fua && self.one_piece_per_target(offset, len);
        if may_trim {
            self.punch(offset, len).await?;
        } else {
            // One chunk of zeros, shared by every piece (slices of it are reference counted).
            let chunk_bytes = self.shared.layout.chunk_bytes as u64;
            let zeros = Bytes::from(vec![0u8; len.min(chunk_bytes) as usize]);
            let jobs = self.pieces(offset, len).map(|(piece, target, chunk)| {
                let bytes = zeros.slice(..piece.len as usize);
                self.write_job(piece, target, chunk, bytes, sync_each)
            });
            self.run(jobs, |()| ()).await?;
        }
        if fua && !sync_each {
            self.sync(touched).await?;
        }
        Ok(())
    }

    /// The allocation map of `[offset, offset + len)`: runs `(bytes, allocated)` in order,
    /// adjacent runs of the same kind merged, covering the range exactly. Allocation is known
    /// per 4 KiB block: a block that holds data counts as allocated even where it reads zeros.
    pub fn block_status(&self, offset: u64, len: u64) -> FsResult<Vec<VolumeExtent>> {
        self.check_range(offset, len)?;
        let all: Vec<_> = self.pieces(offset, len).collect();
        let mut maps: Vec<Vec<BlockRun>> = vec![Vec::new(); all.len()];
        let jobs = all.iter().enumerate().map(|(at, &(_, target, chunk))| {
            let storage = self.shared.storage.clone();
            async move { Ok((at, storage.chunk_map(ChunkMap { target, chunk }).await?.runs)) }
        });
        self.block(self.run(jobs, |(at, runs): (usize, Vec<BlockRun>)| maps[at] = runs))?;
        let mut out = Vec::new();
        for ((piece, _, _), runs) in all.iter().zip(&maps) {
            piece_extents(piece.offset_in_chunk, piece.len, runs, &mut out);
        }
        Ok(out)
    }

    /// Bytes of data blocks the volume holds, over every target of its layout.
    pub fn allocated_bytes(&self) -> FsResult<u64> {
        self.usable()?;
        let object = self.shared.object;
        let jobs = distinct_targets(&self.shared.layout).into_iter().map(|target| {
            let storage = self.shared.storage.clone();
            async move { storage.object_space(ObjectSpace { target, object }).await }
        });
        let mut total = 0u64;
        self.block(self.run(jobs, |reply| total += reply.allocated_bytes))?;
        Ok(total)
    }

    /// Drops every byte past `size` (whole chunks removed, the boundary chunk's tail freed) and
    /// lowers the handle's size to `size` if it was larger, first, so later requests past it
    /// are refused. A volume grown back afterwards reads zeros there. Not durable until a flush.
    pub fn shrink_to(&self, size: u64) -> FsResult<()> {
        self.usable()?;
        self.shared.size.fetch_min(size, Ordering::AcqRel);
        let shared = &self.shared;
        let chunk = shared.layout.chunk_bytes as u64;
        self.block(async {
            let whole =
                remove_chunks(&shared.storage, shared.object, &shared.layout, size.div_ceil(chunk));
            let boundary = async {
                if size.is_multiple_of(chunk) {
                    return Ok(());
                }
                let index = size / chunk;
                let offset = (size % chunk) as u32;
                let request = ChunkPunch {
                    target: shared.layout.target_of(index),
                    chunk: ChunkId { object: shared.object, index },
                    offset,
                    len: shared.layout.chunk_bytes - offset,
                };
                shared.storage.chunk_punch(request).await
            };
            let (whole, boundary) = tokio::join!(whole, boundary);
            whole.and(boundary)
        })
    }

    /// Removes every chunk of the volume on every target of its layout (the volume is being
    /// deleted). Not durable until a flush.
    pub fn remove_all(&self) -> FsResult<()> {
        self.usable()?;
        let shared = &self.shared;
        self.block(remove_chunks(&shared.storage, shared.object, &shared.layout, 0))
    }

    /// Makes the volume `dest` (an id with [`ObjectId::VOLUME_BIT`], no data yet) a copy of
    /// this one, on every target of the layout: the targets copy their chunk records and share
    /// the blocks (copy-on-write), so the copy costs no data I/O and either volume's later
    /// writes leave the other as it was. Durable after a flush of `dest`.
    ///
    /// The copy is of this volume as it is while this runs. For one instant on every target,
    /// use [`VolumeIo::begin_clone_to`] with writes to this volume held back (the NBD gateway
    /// does that), then [`VolumeIo::finish_clone_to`] with writes going on. On failure some
    /// targets may hold their part of the copy: remove `dest`'s chunks before using its id
    /// again, which also cancels a begun copy.
    pub fn clone_to(&self, dest: ObjectId) -> FsResult<()> {
        self.clone_call(dest, CloneStep::Whole)
    }

    /// Begins the copy of [`VolumeIo::clone_to`] on every target: quick (each target notes the
    /// volume's chunks), and from then on a change to this volume first copies the chunk it
    /// changes; `dest` may not change until [`VolumeIo::finish_clone_to`] returns.
    pub fn begin_clone_to(&self, dest: ObjectId) -> FsResult<()> {
        self.clone_call(dest, CloneStep::Begin)
    }

    /// Makes the copy begun by [`VolumeIo::begin_clone_to`]: the volume as it was then. Fails
    /// (`Invalid`) where a target has no such copy under way.
    pub fn finish_clone_to(&self, dest: ObjectId) -> FsResult<()> {
        self.clone_call(dest, CloneStep::Finish)
    }

    fn clone_call(&self, dest: ObjectId, step: CloneStep) -> FsResult<()> {
        self.usable()?;
        if dest.0 & ObjectId::VOLUME_BIT == 0 || dest == self.shared.object {
            return Err(FsStatus::Invalid);
        }
        let source = self.shared.object;
        let clones = distinct_targets(&self.shared.layout).into_iter().map(|target| {
            let storage = self.shared.storage.clone();
            async move {
                let request = ObjectClone { target, source, dest };
                match step {
                    CloneStep::Whole => storage.object_clone(request).await,
                    CloneStep::Begin => storage.object_clone_begin(request).await,
                    CloneStep::Finish => storage.object_clone_finish(request).await,
                }
            }
        });
        self.block(self.run(clones, |()| ()))
    }

    fn block<T>(&self, work: impl Future<Output = T>) -> T {
        self.shared.runtime.block_on(work)
    }

    /// Refuses everything on a handle made with a bad id or layout.
    fn usable(&self) -> FsResult<()> {
        self.shared.refused.map_or(Ok(()), Err)
    }

    fn check_range(&self, offset: u64, len: u64) -> FsResult<()> {
        self.usable()?;
        let size = self.size();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => {
                tracing::debug!(object = %self.shared.object, offset, len, size,
                    "volume request past the end refused");
                Err(FsStatus::Invalid)
            }
        }
    }

    /// The pieces of a range with the target and chunk each goes to.
    fn pieces(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Iterator<Item = (Piece, TargetId, ChunkId)> + '_ {
        let shared = &self.shared;
        pieces(shared.layout.chunk_bytes, offset, len).map(move |piece| {
            let target = shared.layout.target_of(piece.index);
            (piece, target, ChunkId { object: shared.object, index: piece.index })
        })
    }

    fn touched(&self, offset: u64, len: u64) -> std::collections::BTreeSet<TargetId> {
        self.pieces(offset, len).map(|(_, target, _)| target).collect()
    }

    /// Whether no target gets two pieces of the range: then a write can carry its own sync
    /// (one round trip), else one sync per target after all the writes is cheaper.
    fn one_piece_per_target(&self, offset: u64, len: u64) -> bool {
        self.pieces(offset, len).count() == self.touched(offset, len).len()
    }

    fn write_job(
        &self,
        piece: Piece,
        target: TargetId,
        chunk: ChunkId,
        bytes: Bytes,
        sync: bool,
    ) -> impl Future<Output = FsResult<()>> + Send + 'static {
        let storage = self.shared.storage.clone();
        let request = ChunkWrite {
            target,
            chunk,
            offset: piece.offset_in_chunk,
            crc: stria_proto::crc32c(&bytes),
            sync,
        };
        async move { storage.chunk_write(request, bytes).await }
    }

    /// Punches `[offset, offset + len)` chunk by chunk.
    async fn punch(&self, offset: u64, len: u64) -> FsResult<()> {
        let jobs = self.pieces(offset, len).map(|(piece, target, chunk)| {
            let storage = self.shared.storage.clone();
            let request =
                ChunkPunch { target, chunk, offset: piece.offset_in_chunk, len: piece.len };
            async move { storage.chunk_punch(request).await }
        });
        self.run(jobs, |()| ()).await
    }

    /// Runs `jobs` with at most `in_flight_max` at once, handing each result to `done` as it
    /// arrives. After a failure no new job starts, the ones in flight finish (a write is never
    /// abandoned half sent), and the first error is returned.
    async fn run<T, F>(
        &self,
        jobs: impl Iterator<Item = F>,
        mut done: impl FnMut(T),
    ) -> FsResult<()>
    where
        T: Send + 'static,
        F: Future<Output = FsResult<T>> + Send + 'static,
    {
        // One piece (a small request inside one chunk): no task to spawn and join.
        let mut jobs = jobs.peekable();
        let Some(first) = jobs.next() else { return Ok(()) };
        if jobs.peek().is_none() {
            return first.await.map(done);
        }
        let jobs = std::iter::once(first).chain(jobs);
        let mut running = JoinSet::new();
        let mut first_error = None;
        let mut finish = |joined: Result<FsResult<T>, tokio::task::JoinError>,
                          first_error: &mut Option<FsStatus>| {
            match joined.map_err(|_| FsStatus::Io).and_then(|r| r) {
                Ok(value) => done(value),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        };
        for job in jobs {
            while running.len() >= self.shared.in_flight_max {
                let Some(joined) = running.join_next().await else { break };
                finish(joined, &mut first_error);
            }
            if first_error.is_some() {
                break;
            }
            running.spawn(job);
        }
        while let Some(joined) = running.join_next().await {
            finish(joined, &mut first_error);
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Appends the allocation runs of one piece (`len` bytes at `offset_in_chunk`) given its
/// chunk's mapped block runs, merging with the run before when it is of the same kind.
fn piece_extents(offset_in_chunk: u32, len: u32, runs: &[BlockRun], out: &mut Vec<VolumeExtent>) {
    let block = BLOCK_BYTES as u64;
    let start = offset_in_chunk as u64;
    let end = start + len as u64;
    let mut at = start;
    for run in runs {
        let run_start = (run.first_block as u64 * block).max(start);
        let run_end = ((run.first_block as u64 + run.blocks as u64) * block).min(end);
        if run_start >= run_end {
            continue;
        }
        push_extent(out, run_start - at, false);
        push_extent(out, run_end - run_start, true);
        at = run_end;
    }
    push_extent(out, end.saturating_sub(at), false);
}

fn push_extent(out: &mut Vec<VolumeExtent>, len: u64, allocated: bool) {
    if len == 0 {
        return;
    }
    match out.last_mut() {
        Some((last_len, last_allocated)) if *last_allocated == allocated => *last_len += len,
        _ => out.push((len, allocated)),
    }
}

/// Which part of a copy [`VolumeIo::clone_call`] asks the targets for.
#[derive(Clone, Copy, Debug)]
enum CloneStep {
    Whole,
    Begin,
    Finish,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first_block: u32, blocks: u32) -> BlockRun {
        BlockRun { first_block, blocks }
    }

    #[test]
    fn piece_extents_cover_the_piece_and_merge() {
        let mut out = Vec::new();
        // Blocks 1..3 and 5 mapped; the piece starts mid-block 0 and ends mid-block 5.
        piece_extents(512, 5 * 4096, &[run(1, 2), run(5, 1), run(9, 4)], &mut out);
        assert_eq!(out, vec![(4096 - 512, false), (8192, true), (8192, false), (512, true)]);
        assert_eq!(out.iter().map(|e| e.0).sum::<u64>(), 5 * 4096);
        // The next piece starts with a mapped block: merged with the run before.
        piece_extents(0, 8192, &[run(0, 1)], &mut out);
        assert_eq!(out[3..], [(512 + 4096, true), (4096, false)]);
        // A missing chunk is one hole.
        let mut holes = Vec::new();
        piece_extents(0, 65536, &[], &mut holes);
        piece_extents(0, 100, &[], &mut holes);
        assert_eq!(holes, vec![(65636, false)]);
    }
}
