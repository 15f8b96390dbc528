//! The data path: split file ranges into chunk requests by layout, send them in parallel,
//! queue writes behind, prefetch ahead of sequential readers.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use stria_proto::fs::{ChunkId, FileLayout, FsStatus, INLINE_DATA_MAX, Ino, ObjectId, TargetId};
use stria_proto::wire::{
    ChunkRead, ChunkTruncate, ChunkWrite, MetaReply, MetaRequest, ObjectRemove, TargetSync,
    Timestamp,
};
use stria_rpc::Data;
use tokio::task::JoinSet;

use crate::files::{InFlight, InodeData, OpenFile, Prefetch};
use crate::transport::StorageConns;
use crate::{FsResult, Inner, unexpected};

/// One piece of a file or volume range that falls inside one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub index: u64,
    pub offset_in_chunk: u32,
    pub len: u32,
    /// Where the piece starts inside the caller's range.
    pub offset_in_range: usize,
}

/// Splits `[offset, offset + len)` at chunk boundaries, in order.
pub(crate) fn pieces(chunk_bytes: u32, offset: u64, len: u64) -> impl Iterator<Item = Piece> {
    let chunk = chunk_bytes as u64;
    let end = offset + len;
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let index = at / chunk;
        let offset_in_chunk = at % chunk;
        let take = (chunk - offset_in_chunk).min(end - at);
        let piece = Piece {
            index,
            offset_in_chunk: offset_in_chunk as u32,
            len: take as u32,
            offset_in_range: (at - offset) as usize,
        };
        at += take;
        Some(piece)
    })
}

pub(crate) fn distinct_targets(layout: &FileLayout) -> BTreeSet<TargetId> {
    layout.targets.iter().copied().collect()
}

fn chunk_id(ino: Ino, index: u64) -> ChunkId {
    ChunkId { object: ObjectId(ino), index }
}

/// The largest first write of an empty file that is written before `write` returns rather
/// than behind it.
const AWAITED_FIRST_WRITE_MAX: usize = 64 << 10;

pub(crate) async fn write(
    inner: &Inner,
    file: &OpenFile,
    offset: u64,
    bytes: &[u8],
) -> FsResult<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    file.note_write();
    let inode = &file.inode;
    let end = offset.checked_add(bytes.len() as u64).ok_or(FsStatus::TooBig)?;
    let layout = {
        let mut state = inode.state();
        // A write error this handle has yet to report fails its writes until then, so the
        // writer hears of it early (its flush or fsync still reports it).
        if let Some(error) = file.unseen_error(&state) {
            return Err(error);
        }
        state.prefetch.clear();
        state.inline = None;
        state.layout.clone()
    };
    // The size and mtime the metadata service got with the spill.
    let mut published = None;
    let layout = match layout {
        Some(layout) => layout,
        None if end <= INLINE_DATA_MAX as u64 => {
            match write_inline(inner, inode, offset, bytes).await {
                // A concurrent write moved the file to chunks meanwhile: follow it there.
                Err(FsStatus::TooBig) => spill(inner, inode, None).await?.0,
                done => return done,
            }
        }
        None => {
            let (layout, size) = spill(inner, inode, Some((offset, end))).await?;
            published = size;
            layout
        }
    };
    // Writes overlapping this one that are still in flight go first (see `InFlight`).
    let done = loop {
        let waits: Vec<_> = {
            let mut state = inode.state();
            // The ranges are disjoint and sorted, so their ends are sorted too: the
            // overlapping ones are the last few that start before `end`.
            let waits: Vec<_> = state
                .in_flight
                .range(..end)
                .rev()
                .take_while(|(_, w)| w.end > offset)
                .map(|(_, w)| w.done.clone())
                .collect();
            if waits.is_empty() {
                let (sender, receiver) = tokio::sync::watch::channel(());
                let id = state.next_write_id;
                state.next_write_id += 1;
                state.in_flight.insert(offset, InFlight { end, id, done: receiver });
                let inode = inode.clone();
                break Arc::new(QueuedWrite { inode, start: offset, id, _done: sender });
            }
            waits
        };
        for mut wait in waits {
            // Err means the sender is gone: that write finished.
            let _ = wait.changed().await;
        }
    };
    for piece in pieces(layout.chunk_bytes, offset, bytes.len() as u64) {
        let start = piece.offset_in_range;
        let data = Bytes::copy_from_slice(&bytes[start..start + piece.len as usize]);
        let permit = inode
            .write_budget
            .clone()
            .acquire_many_owned(piece.len)
            .await
            .map_err(|_| FsStatus::Io)?;
        let request = ChunkWrite {
            target: layout.target_of(piece.index),
            chunk: chunk_id(file.ino, piece.index),
            offset: piece.offset_in_chunk,
            crc: stria_proto::crc32c(&data),
            sync: false,
        };
        let storage = inner.storage.clone();
        let purger = inner.purger.clone();
        let inode = inode.clone();
        let done = done.clone();
        let job = async move {
            let mut written = storage.chunk_write(request.clone(), data.clone()).await;
            if written == Err(FsStatus::NoSpace) && purger.drain().await.is_ok() {
                // Removed files' space comes back with the drain: one more try.
                written = storage.chunk_write(request, data).await;
            }
            if let Err(error) = written {
                let mut state = inode.state();
                state.write_error = Some(error);
                state.write_errors += 1;
            }
            drop(permit);
            // The last piece's drop closes the channel: overlapping writes may go.
            drop(done);
        };
        if published.is_some() && bytes.len() <= AWAITED_FIRST_WRITE_MAX {
            // The small first write of a new file (create, write, close): nothing would
            // overlap with it, and the hand-off to a runtime worker and back costs two
            // thread wake-ups. About 10% more creates of 4 KiB files through the mount.
            job.await;
        } else {
            tokio::spawn(job);
        }
    }
    let mut state = inode.state();
    state.size = state.size.max(end);
    state.size_dirty = true;
    // After a `SpillSized` the close still publishes, with the same size and mtime: the
    // service then has nothing to change and commits nothing, unless the file changed in
    // between (a truncate the data landed after), which the publish repairs.
    state.mtime = match published {
        Some((size, mtime)) if state.size <= size => mtime,
        _ => Timestamp::now(),
    };
    Ok(())
}

/// Held by every piece of a queued write; the last one to finish takes the write's entry out
/// of `in_flight` and then closes its channel, which lets overlapping writes go.
struct QueuedWrite {
    inode: Arc<InodeData>,
    start: u64,
    id: u64,
    _done: tokio::sync::watch::Sender<()>,
}

impl Drop for QueuedWrite {
    fn drop(&mut self) {
        let mut state = self.inode.state();
        if state.in_flight.get(&self.start).is_some_and(|w| w.id == self.id) {
            state.in_flight.remove(&self.start);
        }
    }
}

async fn write_inline(inner: &Inner, inode: &InodeData, offset: u64, bytes: &[u8]) -> FsResult<()> {
    let reply = inner
        .meta
        .call(MetaRequest::WriteInline { ino: inode.ino, offset, data: bytes.to_vec() })
        .await?;
    let MetaReply::Attr(attr) = reply else {
        return Err(unexpected(&reply));
    };
    // The version before this write is unknown here: the next open checks.
    inner.seen.forget(inode.ino);
    let mut state = inode.state();
    state.size = attr.size.max(if state.size_dirty { state.size } else { 0 });
    Ok(())
}

/// Moves an inline file to chunks: the inline bytes go to chunk 0 durably before the
/// metadata service switches the file over, so a crash in between keeps the inline copy.
/// With `write` (the range of the write that spills), an empty file takes its end as size in
/// the same commit; the size and mtime the service then has are returned with the layout.
async fn spill(
    inner: &Inner,
    inode: &InodeData,
    write: Option<(u64, u64)>,
) -> FsResult<(FileLayout, Option<(u64, Timestamp)>)> {
    let _one_at_a_time = inode.spill_lock.lock().await;
    if let Some(layout) = inode.state().layout.clone() {
        return Ok((layout, None));
    }
    let (layout, published) = match write {
        Some((offset, end)) => spill_sized(inner, inode.ino, offset, end).await?,
        None => (spill_ino(inner, inode.ino).await?, None),
    };
    if let Some((size, mtime)) = published {
        inner.files.published();
        inner.seen.note(inode.ino, size, mtime);
    }
    inode.state().layout = Some(layout.clone());
    Ok((layout, published))
}

/// `SpillSized`: an empty file becomes chunked with the end of the write at `offset` as its
/// size in one commit; a file with inline bytes takes the two-step spill (its size is
/// published at the next flush).
async fn spill_sized(
    inner: &Inner,
    ino: Ino,
    offset: u64,
    size: u64,
) -> FsResult<(FileLayout, Option<(u64, Timestamp)>)> {
    let mtime = Timestamp::now();
    match inner.meta.call(MetaRequest::SpillSized { ino, size, mtime }).await? {
        MetaReply::Attr(attr) => {
            let layout = attr.layout.ok_or(FsStatus::Io)?;
            // Chunked by someone else first: its size is not this write's.
            let ours = attr.size >= size && attr.mtime == mtime;
            if ours && offset > 0 {
                // The write leaves a hole before it, where a failed spill may have left bytes
                // (see `clear_spill_leftovers`); a write from 0 covers them.
                clear_spill_leftovers(inner, ino, &layout).await?;
            }
            Ok((layout, ours.then_some((attr.size, mtime))))
        }
        MetaReply::Spilled { .. } => Ok((spill_ino(inner, ino).await?, None)),
        other => Err(unexpected(&other)),
    }
}

/// Makes sure a regular file is chunked (a truncate past the inline limit needs that).
pub(crate) async fn ensure_chunked(inner: &Inner, ino: Ino) -> FsResult<()> {
    let layout = spill_ino(inner, ino).await?;
    if let Some(inode) = inner.files.inode(ino) {
        inode.state().layout = Some(layout);
    }
    Ok(())
}

async fn spill_ino(inner: &Inner, ino: Ino) -> FsResult<FileLayout> {
    const ATTEMPTS: usize = 3;
    for _ in 0..ATTEMPTS {
        let reply = inner.meta.call(MetaRequest::Spill { ino }).await?;
        let (layout, data, version) = match reply {
            MetaReply::Spilled { layout, data, version } => (layout, data, version),
            // Already chunked (another client spilled it first).
            MetaReply::Attr(attr) => return attr.layout.ok_or(FsStatus::Io),
            other => return Err(unexpected(&other)),
        };
        // Chunk 0 then holds exactly the inline bytes, whatever an earlier spill left there.
        clear_spill_leftovers(inner, ino, &layout).await?;
        if !data.is_empty() {
            let data = Bytes::from(data);
            let request = ChunkWrite {
                target: layout.target_of(0),
                chunk: chunk_id(ino, 0),
                offset: 0,
                crc: stria_proto::crc32c(&data),
                sync: true,
            };
            inner.storage.chunk_write(request, data).await?;
        }
        let commit = MetaRequest::SpillCommit { ino, layout: layout.clone(), version };
        match inner.meta.call(commit).await {
            Ok(_) => return Ok(layout),
            // The inline bytes changed meanwhile: plan again.
            Err(FsStatus::Unavailable) => continue,
            Err(error) => return Err(error),
        }
    }
    Err(FsStatus::Unavailable)
}

/// Removes the chunks a spill of `ino` to `layout` may find before it: those of an earlier
/// spill whose chunk write landed but whose commit never did (a crash of the metadata
/// service, a client that gave up, a plan that lost a race), and those a client wrote after
/// such a lost commit, believing the file chunked. Until the file is chunked no reader looks
/// there, but its growth would show them where zeros belong.
async fn clear_spill_leftovers(inner: &Inner, ino: Ino, layout: &FileLayout) -> FsResult<()> {
    remove_chunks(&inner.storage, ObjectId(ino), layout, 0).await
}

/// Waits until every write queued for the inode has finished.
pub(crate) async fn drain(inner: &Inner, ino: Ino) -> FsResult<()> {
    let Some(inode) = inner.files.inode(ino) else {
        return Ok(());
    };
    drain_inode(&inode).await
}

async fn drain_inode(inode: &InodeData) -> FsResult<()> {
    let _all = inode
        .write_budget
        .acquire_many(inode.write_budget_bytes)
        .await
        .map_err(|_| FsStatus::Io)?;
    Ok(())
}

pub(crate) async fn read(
    inner: &Inner,
    file: &OpenFile,
    offset: u64,
    len: u32,
) -> FsResult<Vec<u8>> {
    let inode = &file.inode;
    drain_inode(inode).await?;
    let (layout, size, inline) = {
        let state = inode.state();
        let inline = if state.layout.is_none() { state.inline.clone() } else { None };
        (state.layout.clone(), state.size, inline)
    };
    if offset >= size || len == 0 {
        return Ok(Vec::new());
    }
    let len = (len as u64).min(size - offset);
    let Some(layout) = layout else {
        let data = match inline {
            Some(data) => data,
            None => match inner.meta.call(MetaRequest::ReadInline { ino: file.ino }).await? {
                MetaReply::Bytes(data) => data,
                reply => return Err(unexpected(&reply)),
            },
        };
        let mut out = vec![0u8; len as usize];
        let start = (offset as usize).min(data.len());
        let end = ((offset + len) as usize).min(data.len());
        out[..end - start].copy_from_slice(&data[start..end]);
        return Ok(out);
    };
    let prefetched = plan_prefetch(inner, inode, &layout, offset, len, size);
    let piece_read = |piece: Piece| {
        let cached =
            prefetched.iter().find(|(index, _)| *index == piece.index).map(|p| p.1.clone());
        let target = layout.target_of(piece.index);
        read_piece(
            inner.storage.clone(),
            cached,
            target,
            chunk_id(file.ino, piece.index),
            layout.chunk_bytes,
            piece,
        )
    };
    let mut pieces = pieces(layout.chunk_bytes, offset, len).peekable();
    let first = pieces.next().expect("len > 0 gives a piece");
    let mut out = Vec::with_capacity(len as usize);
    if pieces.peek().is_none() {
        // One piece (small reads, most reads of small files): no task to spawn and wake.
        let (piece, data) = piece_read(first).await?;
        append_piece(&mut out, &piece, &data);
        return Ok(out);
    }
    let mut reads = JoinSet::new();
    for piece in std::iter::once(first).chain(pieces) {
        reads.spawn(piece_read(piece));
    }
    let mut read = Vec::with_capacity(reads.len());
    while let Some(joined) = reads.join_next().await {
        read.push(joined.map_err(|_| FsStatus::Io)??);
    }
    read.sort_unstable_by_key(|(piece, _)| piece.offset_in_range);
    for (piece, data) in &read {
        append_piece(&mut out, piece, data);
    }
    Ok(out)
}

/// Appends a piece's bytes to the read's buffer, which holds the pieces before it (they tile
/// the range in order). A chunk shorter than the piece is a hole at its end: zeros. The buffer
/// is not zeroed first: that cost a pass over every 1 MiB read.
fn append_piece(out: &mut Vec<u8>, piece: &Piece, data: &Data) {
    debug_assert_eq!(out.len(), piece.offset_in_range, "pieces arrive in order, without gaps");
    let mut take = data.len().min(piece.len as usize);
    for part in data.parts() {
        let n = part.len().min(take);
        out.extend_from_slice(&part[..n]);
        take -= n;
        if take == 0 {
            break;
        }
    }
    out.resize(piece.offset_in_range + piece.len as usize, 0);
}

/// Reads one piece: from the prefetch window when it holds the chunk, else from its target.
async fn read_piece(
    storage: StorageConns,
    cached: Option<Prefetch>,
    target: TargetId,
    chunk: ChunkId,
    chunk_bytes: u32,
    piece: Piece,
) -> FsResult<(Piece, Data)> {
    let data = match cached {
        Some(cell) => {
            let whole = cell
                .get_or_init(|| fetch_chunk(storage, target, chunk, chunk_bytes))
                .await
                .clone()?;
            let start = (piece.offset_in_chunk as usize).min(whole.len());
            let end = (start + piece.len as usize).min(whole.len());
            whole.slice(start..end)
        }
        None => {
            let request =
                ChunkRead { target, chunk, offset: piece.offset_in_chunk, len: piece.len };
            storage.chunk_read(request).await?
        }
    };
    Ok((piece, data))
}

async fn fetch_chunk(
    storage: StorageConns,
    target: TargetId,
    chunk: ChunkId,
    chunk_bytes: u32,
) -> FsResult<Data> {
    storage.chunk_read(ChunkRead { target, chunk, offset: 0, len: chunk_bytes }).await
}

/// Decides which chunks a read may take from (or add to) the prefetch window. A reader is
/// sequential after two reads in a row that start near where the previous one ended (the
/// kernel sends its read-ahead requests slightly out of order); then the chunks up to
/// `readahead_bytes` past this read are fetched in the background. A random reader that lands
/// near its last read by chance must not trigger megabytes of prefetch.
fn plan_prefetch(
    inner: &Inner,
    inode: &InodeData,
    layout: &FileLayout,
    offset: u64,
    len: u64,
    size: u64,
) -> Vec<(u64, Prefetch)> {
    let chunk = layout.chunk_bytes as u64;
    let mut state = inode.state();
    const NEAR_BYTES: u64 = 256 * 1024;
    let near = offset.abs_diff(state.next_sequential) <= NEAR_BYTES.max(2 * len);
    state.sequential_hits = if near { state.sequential_hits.saturating_add(1) } else { 0 };
    let sequential = state.sequential_hits >= 2;
    state.next_sequential = offset + len;
    let first = offset / chunk;
    let last = (offset + len - 1) / chunk;
    state.prefetch.retain(|&index, _| index >= first);
    let mut used: Vec<(u64, Prefetch)> = (first..=last)
        .filter_map(|index| state.prefetch.get(&index).map(|cell| (index, cell.clone())))
        .collect();
    if !sequential {
        return used;
    }
    let window = (inner.config.readahead_bytes as u64).max(chunk) / chunk;
    let end_index = (size.saturating_sub(1)) / chunk;
    for index in first..=(last + window).min(end_index) {
        if state.prefetch.contains_key(&index) {
            continue;
        }
        let cell: Prefetch = Default::default();
        state.prefetch.insert(index, cell.clone());
        if index <= last {
            used.push((index, cell));
            continue;
        }
        let storage = inner.storage.clone();
        let target = layout.target_of(index);
        let chunk_id = chunk_id(inode.ino, index);
        let chunk_bytes = layout.chunk_bytes;
        tokio::spawn(async move {
            let _ = cell.get_or_init(|| fetch_chunk(storage, target, chunk_id, chunk_bytes)).await;
        });
    }
    used
}

/// Waits for queued writes, publishes the size and, when `durable`, makes the data stable on
/// every target of the file and the metadata durable.
pub(crate) async fn flush(inner: &Inner, file: &OpenFile, durable: bool) -> FsResult<()> {
    let inode = &file.inode;
    drain_inode(inode).await?;
    let _publishing = inode.publish_lock.lock().await;
    // The size stays marked unpublished until the metadata service has it: until then every
    // getattr must still add it (a getattr answered in between would show the old size, and
    // the kernel would keep it for the attribute timeout).
    let (error, dirty, size, mtime, layout) = {
        let state = inode.state();
        let error = file.take_unseen_error(&state);
        (error, state.size_dirty, state.size, state.mtime, state.layout.clone())
    };
    if let Some(error) = error {
        // The writes that did succeed still extend the file: published at the next flush.
        return Err(error);
    }
    if durable && let Some(layout) = &layout {
        sync_targets(&inner.storage, distinct_targets(layout)).await?;
    }
    if dirty {
        let extend = MetaRequest::ExtendSize { ino: file.ino, size, mtime };
        let reply = match inner.meta.call(extend.clone()).await {
            // The service has the file inline again (see `recommit_spill`).
            Err(FsStatus::Invalid) if let Some(layout) = &layout => {
                recommit_spill(inner, file.ino, layout).await?;
                inner.meta.call(extend).await?
            }
            done => done?,
        };
        match reply {
            MetaReply::Extended { size_before, mtime_before } => {
                let after = (size.max(size_before), mtime);
                inner.seen.advance(file.ino, (size_before, mtime_before), after);
            }
            _ => inner.seen.forget(file.ino),
        }
        let mut state = inode.state();
        // A write that came meanwhile is for the next flush.
        if state.size == size && state.mtime == mtime {
            inner.files.published();
            state.size_dirty = false;
        }
    }
    if durable {
        inner.meta.call(MetaRequest::Sync).await?;
        // A target or the metadata service that restarted since this file's last sync lost
        // what it had not made durable yet.
        if inner.watch.take_lost(file.ino) {
            tracing::error!(ino = file.ino, "fsync failed: changes were lost by a restart");
            return Err(FsStatus::Io);
        }
    }
    Ok(())
}

/// The metadata service has an inline file that this client moved to chunks: it restarted
/// and lost the spill's commit, acknowledged but not yet durable. Everything this client wrote
/// since went to the file's chunks under `layout` (what the lost spill wrote to chunk 0 too,
/// unless the restart's recovery freed it as a stray: then the storage service reports that
/// loss), so the move is committed again with that layout and the same chunks, as they are.
/// A file that changed meanwhile (another client wrote inline bytes) fails: EIO, since the
/// data written here cannot be placed.
async fn recommit_spill(inner: &Inner, ino: Ino, layout: &FileLayout) -> FsResult<()> {
    let version = match inner.meta.call(MetaRequest::Spill { ino }).await? {
        MetaReply::Spilled { version, .. } => version,
        MetaReply::Attr(attr) if attr.layout.as_ref() == Some(layout) => return Ok(()),
        MetaReply::Attr(_) => return Err(FsStatus::Io),
        other => return Err(unexpected(&other)),
    };
    tracing::warn!(
        ino,
        "the metadata service lost this file's move to chunks; committing it again"
    );
    let commit = MetaRequest::SpillCommit { ino, layout: layout.clone(), version };
    match inner.meta.call(commit).await {
        Ok(_) => Ok(()),
        Err(FsStatus::Unavailable) => Err(FsStatus::Io),
        Err(error) => Err(error),
    }
}

/// Drops the chunk data past `size` after a truncate.
pub(crate) async fn trim(inner: &Inner, ino: Ino, layout: &FileLayout, size: u64) -> FsResult<()> {
    let chunk = layout.chunk_bytes as u64;
    let whole = remove_chunks(&inner.storage, ObjectId(ino), layout, size.div_ceil(chunk));
    let boundary = async {
        if size.is_multiple_of(chunk) {
            return Ok(());
        }
        let index = size / chunk;
        let request = ChunkTruncate {
            target: layout.target_of(index),
            chunk: chunk_id(ino, index),
            len: (size % chunk) as u32,
        };
        inner.storage.chunk_truncate(request).await
    };
    let (whole, boundary) = tokio::join!(whole, boundary);
    whole.and(boundary)
}

/// Removes the chunks of `object` from index `from_index` on, on every target of `layout`
/// at once (0: the whole object, as when a file's last link is gone).
pub(crate) async fn remove_chunks(
    storage: &StorageConns,
    object: ObjectId,
    layout: &FileLayout,
    from_index: u64,
) -> FsResult<()> {
    let mut work = JoinSet::new();
    for target in distinct_targets(layout) {
        let storage = storage.clone();
        let request = ObjectRemove { target, object, from_index };
        work.spawn(async move { storage.object_remove(request).await });
    }
    let mut result = Ok(());
    while let Some(joined) = work.join_next().await {
        let done = joined.map_err(|_| FsStatus::Io).and_then(|r| r);
        result = result.and(done);
    }
    result
}

/// Makes every change that returned so far durable on each of `targets`, at once.
pub(crate) async fn sync_targets(
    storage: &StorageConns,
    targets: impl IntoIterator<Item = TargetId>,
) -> FsResult<()> {
    let mut syncs = JoinSet::new();
    for target in targets {
        let storage = storage.clone();
        syncs.spawn(async move { storage.target_sync(TargetSync { target }).await });
    }
    let mut result = Ok(());
    while let Some(joined) = syncs.join_next().await {
        let done = joined.map_err(|_| FsStatus::Io).and_then(|r| r);
        result = result.and(done);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_at_chunk_boundaries() {
        let got: Vec<Piece> = pieces(1024, 1000, 2100).collect();
        assert_eq!(
            got,
            vec![
                Piece { index: 0, offset_in_chunk: 1000, len: 24, offset_in_range: 0 },
                Piece { index: 1, offset_in_chunk: 0, len: 1024, offset_in_range: 24 },
                Piece { index: 2, offset_in_chunk: 0, len: 1024, offset_in_range: 1048 },
                Piece { index: 3, offset_in_chunk: 0, len: 28, offset_in_range: 2072 },
            ]
        );
        assert_eq!(pieces(1024, 5, 0).count(), 0);
    }
}
