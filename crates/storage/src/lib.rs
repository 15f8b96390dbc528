//! The storage service: serves the chunk requests of clients for the targets of this node.
//!
//! Each target is a RAID array with its chunk engine. Requests run on tokio's blocking pool
//! (the engine and the array are synchronous and keep every drive busy from one call), many
//! at once; the engine's per-chunk locks keep concurrent requests to one chunk in order.
//!
//! Each target counts the chunk reads and writes it serves, with their latency inside the
//! service ([`TargetIoStats`]): what clients asked for, before RAID adds parity and mirror
//! writes (the drives count those). The management role turns them into metrics and charts.
//!
//! Drive changes on a live target (replace a failed drive, add a hot spare) are served here
//! too, and reported to the node's record through a [`MembershipRecorder`] (`drive_admin`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use stria_engine::{Engine, EngineError};
use stria_io::LatencyHistogram;
use stria_proto::fs::{CHUNK_BYTES_MAX, ChunkId, FsStatus, TargetId};
pub use stria_proto::wire::Epoch;
use stria_proto::wire::{
    BlockRun, ChunkMap, ChunkMapReply, ChunkPunch, ChunkRead, ChunkTruncate, ChunkWrite,
    ObjectClone, ObjectRemove, ObjectSpace, ObjectSpaceReply, ObjectsRemove, TargetAddSpare,
    TargetFailDrive, TargetInfo, TargetReplaceDrive, TargetSync, new_epoch, storage_method,
};
use stria_raid::Array;
use stria_rpc::Data;

mod drive_admin;

pub use drive_admin::{DriveAdmin, Membership, MembershipRecorder, membership};

/// Chunk requests one target served since the node started. Lock-free: a few relaxed adds per
/// request.
#[derive(Debug, Default)]
pub struct TargetIoStats {
    pub read_ops: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_ops: AtomicU64,
    pub write_bytes: AtomicU64,
    /// Sums of the latencies, for means over an interval.
    pub read_latency_us_total: AtomicU64,
    pub write_latency_us_total: AtomicU64,
    pub read_latency: LatencyHistogram,
    pub write_latency: LatencyHistogram,
}

impl TargetIoStats {
    fn record_read(&self, bytes: usize, latency: Duration) {
        self.read_ops.fetch_add(1, Relaxed);
        self.read_bytes.fetch_add(bytes as u64, Relaxed);
        self.read_latency_us_total.fetch_add(latency.as_micros() as u64, Relaxed);
        self.read_latency.record(latency);
    }

    fn record_write(&self, bytes: usize, latency: Duration) {
        self.write_ops.fetch_add(1, Relaxed);
        self.write_bytes.fetch_add(bytes as u64, Relaxed);
        self.write_latency_us_total.fetch_add(latency.as_micros() as u64, Relaxed);
        self.write_latency.record(latency);
    }
}

/// One target: an array, its chunk engine and the pool it belongs to.
#[derive(Debug)]
pub struct Target {
    pub id: TargetId,
    pub pool: String,
    pub array: Arc<Array>,
    pub engine: Engine,
}

impl Target {
    pub fn info(&self) -> TargetInfo {
        let space = self.engine.space();
        let status = self.array.status();
        TargetInfo {
            target: self.id,
            pool: self.pool.clone(),
            raid: status.level.clone(),
            state: match &status.rebuild {
                Some(rebuild) => format!("{:?} {:.0}%", status.state, rebuild.percent),
                None => format!("{:?}", status.state),
            }
            .to_lowercase(),
            bytes_total: space.total_bytes,
            bytes_used: space.used_bytes,
            chunks: space.chunks,
        }
    }
}

/// The storage service of one node.
#[derive(Debug, Clone)]
pub struct StorageService {
    targets: Arc<BTreeMap<TargetId, Arc<Target>>>,
    io: Arc<BTreeMap<TargetId, Arc<TargetIoStats>>>,
    /// Drive changes are served only with a record to keep them in.
    admin: Option<Arc<drive_admin::Admin>>,
    /// The incarnation of the targets' durable state (see [`Epoch`]).
    epoch: Epoch,
}

/// A refused request: its RPC status and the reply's message part (empty, except for drive
/// changes, which explain themselves with a `DriveChangeRefused`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub message: Vec<u8>,
}

impl From<u16> for Refusal {
    fn from(status: u16) -> Refusal {
        Refusal { status, message: Vec::new() }
    }
}

type Handled = Result<(Vec<u8>, Data), Refusal>;

impl StorageService {
    pub fn new(targets: Vec<Target>) -> StorageService {
        let io = targets.iter().map(|t| (t.id, Arc::default())).collect();
        let targets = targets.into_iter().map(|t| (t.id, Arc::new(t))).collect();
        StorageService {
            targets: Arc::new(targets),
            io: Arc::new(io),
            admin: None,
            epoch: new_epoch(),
        }
    }

    /// Serves under `epoch` instead of a fresh one: the one a clean stop handed over.
    pub fn with_epoch(mut self, epoch: Epoch) -> StorageService {
        self.epoch = epoch;
        self
    }

    /// The epoch the changing requests are answered with.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    pub fn targets(&self) -> impl Iterator<Item = &Arc<Target>> {
        self.targets.values()
    }

    /// The chunk requests `target` served since the node started.
    pub fn io_stats(&self, target: TargetId) -> Option<&TargetIoStats> {
        self.io.get(&target).map(|s| s.as_ref())
    }

    fn target(&self, id: TargetId) -> Result<Arc<Target>, FsStatus> {
        self.targets.get(&id).cloned().ok_or_else(|| {
            tracing::warn!(target = %id, "request for a target this node does not serve");
            FsStatus::Stale
        })
    }

    /// Makes every target durable (used at shutdown).
    pub fn sync_all(&self) -> Result<(), EngineError> {
        for target in self.targets.values() {
            target.engine.sync()?;
        }
        Ok(())
    }

    /// Serves one request: the method number, the encoded message and the bulk data; returns
    /// the encoded reply and its bulk data, or an RPC status code.
    pub fn handle(
        &self,
        method: u16,
        message: Bytes,
        data: Bytes,
    ) -> Pin<Box<dyn Future<Output = Handled> + Send + 'static>> {
        if method == storage_method::CHUNK_READ
            && let Some(answer) = self.read_from_memory(&message)
        {
            // Every block was in memory: answered without a thread hop.
            return Box::pin(std::future::ready(answer));
        }
        if method == storage_method::CHUNK_WRITE && self.buffered_write(&message, data.len()) {
            // Copied into the open stripe's image and committed, no array I/O: CPU work of
            // tens of µs, cheaper here than two thread wake-ups through the blocking pool.
            // The array write of a stripe it fills goes to the blocking pool.
            return Box::pin(std::future::ready(self.chunk_write(&message, data, true)));
        }
        let service = self.clone();
        Box::pin(async move {
            let work = move || service.handle_blocking(method, &message, data);
            match tokio::task::spawn_blocking(work).await {
                Ok(result) => result,
                Err(_) => Err(FsStatus::Io.rpc_code().into()),
            }
        })
    }

    /// Answers a chunk read (up to 1 MiB) whose blocks are all in memory (read cache, open
    /// stripes); None when it needs the array (or is not a valid read: the blocking path reports that).
    fn read_from_memory(&self, message: &[u8]) -> Option<Handled> {
        let r: ChunkRead = decode(message).ok()?;
        let target = self.targets.get(&r.target)?;
        let started = Instant::now();
        let data: Data = match target.engine.read_if_in_memory(r.chunk, r.offset, r.len) {
            Ok(Some(parts)) => Data::from(parts),
            Ok(None) | Err(_) => return None,
        };
        if let Some(io) = self.io.get(&r.target) {
            io.record_read(data.len(), started.elapsed());
        }
        Some(encode(&()).map(|reply| (reply, data)).map_err(Into::into))
    }

    /// A chunk write. With `off_thread` (a write run on the async worker), the array write of a
    /// stripe of packed writes it fills is handed to the blocking pool, so the worker never
    /// waits for a drive: the write's bytes are readable at once, and a failure of that stripe
    /// write fails the target's next writes and syncs (`Engine::write_retired`).
    fn chunk_write(&self, message: &[u8], data: Bytes, off_thread: bool) -> Handled {
        let w: ChunkWrite = decode(message)?;
        let target = self.target(w.target).map_err(FsStatus::rpc_code)?;
        let started = Instant::now();
        let written = target.engine.write_deferring(w.chunk, w.offset, &data, Some(w.crc));
        let (_, retired) = written.map_err(status_of)?;
        if let Some(retired) = retired {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) if off_thread => {
                    let target = target.clone();
                    runtime.spawn_blocking(move || {
                        if let Err(e) = target.engine.write_retired(retired) {
                            tracing::error!(target = %target.id, "stripe write failed: {e}");
                        }
                    });
                }
                _ => target.engine.write_retired(retired).map_err(status_of)?,
            }
        }
        if w.sync {
            target.engine.sync().map_err(status_of)?;
        }
        if let Some(io) = self.io.get(&w.target) {
            io.record_write(data.len(), started.elapsed());
        }
        Ok((encode(&self.epoch)?, Data::new()))
    }

    /// Whether a chunk write is taken by its target's open stripe (see
    /// [`Engine::write_is_buffered`]) and asks for no sync.
    fn buffered_write(&self, message: &[u8], len: usize) -> bool {
        let Ok(w) = decode::<ChunkWrite>(message) else { return false };
        !w.sync
            && u32::try_from(len).is_ok_and(|len| {
                self.targets
                    .get(&w.target)
                    .is_some_and(|t| t.engine.write_is_buffered(w.offset, len))
            })
    }

    /// Sizes the targets' read caches of small-I/O blocks: `bytes` in all, split evenly.
    pub fn set_read_cache_bytes(&self, bytes: u64) {
        let each = bytes / self.targets.len().max(1) as u64;
        for target in self.targets.values() {
            target.engine.set_read_cache_bytes(each);
        }
    }

    /// Syncs every target changed since its last sync; logs failures (a failed sync leaves
    /// the target read-only, and the next client sync reports it).
    pub fn sync_changed(&self) {
        for (id, target) in self.targets.iter() {
            if let Err(e) = target.engine.sync_if_changed() {
                tracing::error!(target = %id, %e, "periodic target sync failed");
            }
        }
    }

    fn handle_blocking(&self, method: u16, message: &[u8], data: Bytes) -> Handled {
        match method {
            storage_method::CHUNK_READ => {
                let r: ChunkRead = decode(message)?;
                let target = self.target(r.target).map_err(FsStatus::rpc_code)?;
                let started = Instant::now();
                let parts = target.engine.read_parts(r.chunk, r.offset, r.len);
                let data = Data::from(parts.map_err(status_of)?);
                if let Some(io) = self.io.get(&r.target) {
                    io.record_read(data.len(), started.elapsed());
                }
                Ok((encode(&())?, data))
            }
            storage_method::CHUNK_WRITE => self.chunk_write(message, data, false),
            storage_method::CHUNK_TRUNCATE => {
                let t: ChunkTruncate = decode(message)?;
                let target = self.target(t.target).map_err(FsStatus::rpc_code)?;
                target.engine.truncate(t.chunk, t.len).map_err(status_of)?;
                Ok((encode(&self.epoch)?, Data::new()))
            }
            storage_method::OBJECT_REMOVE => {
                let r: ObjectRemove = decode(message)?;
                let target = self.target(r.target).map_err(FsStatus::rpc_code)?;
                if r.from_index == 0 {
                    target.engine.remove_object(r.object).map_err(status_of)?;
                } else {
                    let chunks = target.engine.list_chunks(r.object).map_err(status_of)?;
                    for (index, _) in chunks.into_iter().filter(|(i, _)| *i >= r.from_index) {
                        target
                            .engine
                            .remove(ChunkId { object: r.object, index })
                            .map_err(status_of)?;
                    }
                }
                Ok((encode(&self.epoch)?, Data::new()))
            }
            storage_method::OBJECTS_REMOVE => {
                let r: ObjectsRemove = decode(message)?;
                if r.objects.len() > stria_proto::wire::OBJECTS_REMOVE_MAX {
                    tracing::debug!(
                        objects = r.objects.len(),
                        "batch removal past the limit refused"
                    );
                    return Err(FsStatus::Invalid.rpc_code().into());
                }
                let target = self.target(r.target).map_err(FsStatus::rpc_code)?;
                target.engine.remove_objects(&r.objects).map_err(status_of)?;
                Ok((encode(&self.epoch)?, Data::new()))
            }
            method @ (storage_method::OBJECT_CLONE
            | storage_method::OBJECT_CLONE_BEGIN
            | storage_method::OBJECT_CLONE_FINISH) => {
                let c: ObjectClone = decode(message)?;
                let engine = &self.target(c.target).map_err(FsStatus::rpc_code)?.engine;
                match method {
                    storage_method::OBJECT_CLONE_BEGIN => engine.begin_clone(c.source, c.dest),
                    storage_method::OBJECT_CLONE_FINISH => engine.finish_clone(c.source, c.dest),
                    _ => engine.clone_object(c.source, c.dest),
                }
                .map_err(status_of)?;
                Ok((encode(&self.epoch)?, Data::new()))
            }
            storage_method::TARGET_SYNC => {
                let s: TargetSync = decode(message)?;
                let target = self.target(s.target).map_err(FsStatus::rpc_code)?;
                target.engine.sync().map_err(status_of)?;
                Ok((encode(&self.epoch)?, Data::new()))
            }
            storage_method::TARGET_FAIL_DRIVE => {
                let f: TargetFailDrive = decode(message)?;
                let target = self.target(f.target).map_err(FsStatus::rpc_code)?;
                if let Err(error) = target.array.fail_drive(f.slot as usize) {
                    tracing::warn!(target = %f.target, slot = f.slot, %error, "refused to fail a drive");
                    return Err(FsStatus::Busy.rpc_code().into());
                }
                tracing::warn!(target = %f.target, slot = f.slot, "drive failed by operator request");
                // A hot spare may have taken the slot: the record follows.
                self.record_after_fail(&target);
                Ok((encode(&target.info())?, Data::new()))
            }
            storage_method::TARGET_REPLACE_DRIVE => {
                let r: TargetReplaceDrive = decode(message)?;
                let target = self.serve_replace(&r)?;
                Ok((encode(&target.info())?, Data::new()))
            }
            storage_method::TARGET_ADD_SPARE => {
                let a: TargetAddSpare = decode(message)?;
                let target = self.serve_add_spare(&a)?;
                Ok((encode(&target.info())?, Data::new()))
            }
            storage_method::CHUNK_PUNCH => {
                let p: ChunkPunch = decode(message)?;
                if p.offset as u64 + p.len as u64 > CHUNK_BYTES_MAX as u64 {
                    tracing::debug!(chunk = %p.chunk, offset = p.offset, len = p.len,
                        "punch past the chunk limit refused");
                    return Err(FsStatus::Invalid.rpc_code().into());
                }
                let target = self.target(p.target).map_err(FsStatus::rpc_code)?;
                target.engine.discard(p.chunk, p.offset, p.len).map_err(status_of)?;
                Ok((encode(&self.epoch)?, Data::new()))
            }
            storage_method::CHUNK_MAP => {
                let m: ChunkMap = decode(message)?;
                let target = self.target(m.target).map_err(FsStatus::rpc_code)?;
                let runs = target.engine.mapped_runs(m.chunk).map_err(status_of)?;
                let runs = runs
                    .into_iter()
                    .map(|(first_block, blocks)| BlockRun { first_block, blocks })
                    .collect();
                Ok((encode(&ChunkMapReply { runs })?, Data::new()))
            }
            storage_method::OBJECT_SPACE => {
                let o: ObjectSpace = decode(message)?;
                let target = self.target(o.target).map_err(FsStatus::rpc_code)?;
                let usage = target.engine.object_usage(o.object).map_err(status_of)?;
                let reply = ObjectSpaceReply {
                    allocated_bytes: usage.allocated_bytes(),
                    chunks: usage.chunks,
                };
                Ok((encode(&reply)?, Data::new()))
            }
            storage_method::TARGET_LIST => {
                let infos: Vec<TargetInfo> = self.targets.values().map(|t| t.info()).collect();
                Ok((encode(&infos)?, Data::new()))
            }
            _ => Err(stria_rpc::status::UNKNOWN_METHOD.into()),
        }
    }
}

fn status_of(error: EngineError) -> u16 {
    let status = error.status();
    if status == FsStatus::Io {
        tracing::error!(%error, "chunk request failed");
    } else {
        tracing::debug!(%error, "chunk request refused");
    }
    status.rpc_code()
}

fn decode<T: DeserializeOwned>(message: &[u8]) -> Result<T, u16> {
    postcard::from_bytes(message).map_err(|_| stria_rpc::status::BAD_REQUEST)
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, u16> {
    postcard::to_stdvec(value).map_err(|_| FsStatus::Io.rpc_code())
}

/// The storage service as a service of the internal RPC server.
#[derive(Clone, Debug)]
pub struct StorageRpc(pub StorageService);

impl stria_rpc::Service for StorageRpc {
    fn call(
        &self,
        request: stria_rpc::Request,
    ) -> stria_rpc::BoxFuture<'static, stria_rpc::Response> {
        let work = self.0.handle(request.method, request.message, request.data);
        Box::pin(async move {
            match work.await {
                Ok((message, data)) => stria_rpc::Response::ok(Bytes::from(message), data),
                Err(refusal) => stria_rpc::Response::with_status(
                    refusal.status,
                    Bytes::from(refusal.message),
                    Bytes::new(),
                ),
            }
        })
    }
}
