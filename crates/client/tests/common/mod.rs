//! An in-process storage node for client tests: a few targets (RAID 5 arrays over memory
//! drives, each with a chunk engine whose map lives in a crash-simulating memory store), the
//! storage service on a loopback RPC server, and a client on its own runtime. Volume I/O needs
//! no metadata service; the client's metadata address points nowhere and is never dialled.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use stria_client::{Client, ClientConfig, VolumeIo};
use stria_engine::Engine;
use stria_engine::testing::MemMapStore;
#[allow(unused_imports)]
pub use stria_engine::testing::Rng;
use stria_io::BlockDevice;
use stria_io::mem::MemDevice;
use stria_proto::fs::{FileLayout, ObjectId, TargetId};
use stria_raid::{Array, ArrayConfig, CreateOptions, Level};
use stria_rpc::{Server, ShutdownHandle};
use stria_storage::{StorageRpc, StorageService, Target};

/// Seeds to run: `STRIA_CLIENT_SEED` picks one, `STRIA_CLIENT_SEEDS` sets how many fixed ones
/// (for long soak runs), else `count` fixed ones.
pub fn seeds(count: u64) -> Vec<u64> {
    let env = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    match env("STRIA_CLIENT_SEED") {
        Some(seed) => vec![seed],
        None => (1..=env("STRIA_CLIENT_SEEDS").unwrap_or(count)).map(|i| i * 7919).collect(),
    }
}

/// One target's pieces that outlive a simulated crash: its array and its chunk-map medium.
struct Disk {
    id: TargetId,
    array: Arc<Array>,
    store: MemMapStore,
}

/// The storage service of `targets` targets, serving on loopback.
pub struct Node {
    pub runtime: tokio::runtime::Runtime,
    disks: Vec<Disk>,
    pub storage: Option<StorageService>,
    pub addr: SocketAddr,
    shutdown: Option<ShutdownHandle>,
    serving: Option<tokio::task::JoinHandle<()>>,
}

fn array_of(drive_mib: u64) -> Arc<Array> {
    let drives: Vec<Arc<dyn BlockDevice>> = (0..4)
        .map(|i| Arc::new(MemDevice::new(format!("d{i}"), drive_mib << 20)) as Arc<dyn BlockDevice>)
        .collect();
    let config = ArrayConfig {
        level: Level::Raid5,
        stripe_unit_bytes: 16 * 1024,
        rated_tbw: 0,
        journal_bytes: None,
    };
    Arc::new(
        Array::create(
            drives,
            &config,
            &CreateOptions { skip_discard: true, ..CreateOptions::default() },
        )
        .expect("array"),
    )
}

impl Node {
    /// `targets` targets (ids 1..), each RAID 5 over four memory drives of `drive_mib` MiB.
    pub fn start(targets: u32, drive_mib: u64) -> Node {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(16)
            .enable_all()
            .build()
            .expect("runtime");
        let disks = (1..=targets)
            .map(|t| Disk {
                id: TargetId(t),
                array: array_of(drive_mib),
                store: MemMapStore::new(),
            })
            .collect();
        let mut node = Node {
            runtime,
            disks,
            storage: None,
            addr: "127.0.0.1:0".parse().expect("addr"),
            shutdown: None,
            serving: None,
        };
        node.serve(true);
        node
    }

    fn serve(&mut self, create: bool) {
        self.serve_at(create, "127.0.0.1:0".parse().expect("addr"), None);
    }

    /// Serves the targets on `addr`; under `epoch` if given (a clean stop's), else a fresh one.
    fn serve_at(&mut self, create: bool, addr: SocketAddr, epoch: Option<u64>) {
        let targets = self
            .disks
            .iter()
            .map(|disk| {
                let engine = if create {
                    Engine::create_with_backend(disk.array.clone(), disk.store.backend(), disk.id)
                } else {
                    Engine::open_with_backend(disk.array.clone(), disk.store.backend())
                }
                .expect("engine");
                Target { id: disk.id, pool: "default".into(), array: disk.array.clone(), engine }
            })
            .collect();
        let mut storage = StorageService::new(targets);
        if let Some(epoch) = epoch {
            storage = storage.with_epoch(epoch);
        }
        if create {
            storage.sync_all().expect("first sync");
        }
        let server = self.runtime.block_on(Server::bind(addr)).expect("bind");
        self.addr = server.local_addr();
        self.shutdown = Some(server.shutdown_handle());
        let service = Arc::new(StorageRpc(storage.clone()));
        self.serving = Some(self.runtime.spawn(async move {
            server.serve(service).await.expect("serve");
        }));
        self.storage = Some(storage);
    }

    pub fn target_ids(&self) -> Vec<TargetId> {
        self.disks.iter().map(|d| d.id).collect()
    }

    /// A fresh client of this node (dropped clients close their connections).
    pub fn client(&self) -> Client {
        let targets = self.target_ids().into_iter().map(|t| (t, self.addr)).collect();
        let nowhere: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let mut config = ClientConfig::new(nowhere, targets);
        config.request_timeout = Duration::from_secs(20);
        Client::new(self.runtime.handle().clone(), config)
    }

    /// A layout over every target with `chunk_bytes` chunks.
    pub fn layout(&self, chunk_bytes: u32) -> FileLayout {
        FileLayout { pool: "default".into(), chunk_bytes, targets: self.target_ids() }
    }

    /// A volume of `size` bytes striped over every target.
    pub fn volume(&self, client: &Client, id: u64, chunk_bytes: u32, size: u64) -> VolumeIo {
        client.volume(ObjectId(ObjectId::VOLUME_BIT | id), self.layout(chunk_bytes), size)
    }

    /// Bytes parked on each target (freed by changes not yet made durable by a sync).
    pub fn reclaimable_bytes(&self) -> Vec<u64> {
        let storage = self.storage.as_ref().expect("serving");
        storage.targets().map(|t| t.engine.space().reclaimable_bytes).collect()
    }

    /// Power loss on every target: the chunk maps keep only what was synced. Clients of the
    /// old server must be dropped first. The node then serves again on a new address.
    pub fn crash_and_restart(&mut self) {
        self.stop_serving();
        for disk in &self.disks {
            disk.store.crash(false);
        }
        // The engines' final syncs go to the dead boots: nothing of them survives.
        drop(self.storage.take());
        self.serve(false);
    }

    /// The storage service process restarts on the same address, so clients reconnect:
    /// after a crash (unsynced changes lost, a new epoch) or after a clean stop (everything
    /// synced, the epoch handed over).
    pub fn restart_in_place(&mut self, crash: bool) {
        let addr = self.addr;
        let epoch = self.storage.as_ref().expect("serving").epoch();
        self.stop_serving();
        if crash {
            for disk in &self.disks {
                disk.store.crash(false);
            }
        } else {
            self.storage.as_ref().expect("serving").sync_all().expect("clean stop");
        }
        drop(self.storage.take());
        self.serve_at(false, addr, (!crash).then_some(epoch));
    }

    fn stop_serving(&mut self) {
        if let Some(handle) = self.shutdown.take() {
            handle.shutdown();
        }
        if let Some(serving) = self.serving.take() {
            self.runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(20), serving)
                    .await
                    .expect("server stops")
                    .expect("server task");
            });
        }
    }
}

/// The model of a volume: its bytes, which 4 KiB blocks hold data, and each chunk's length
/// on its target (a punch frees a block that is whole up to the chunk's end, and a chunk left
/// with nothing mapped is removed, so its length starts again from zero).
pub struct Model {
    pub bytes: Vec<u8>,
    pub allocated: Vec<bool>,
    chunk_bytes: usize,
    chunk_len: Vec<usize>,
}

pub const BLOCK: usize = 4096;

impl Model {
    pub fn new(size: usize, chunk_bytes: u32) -> Model {
        let chunk_bytes = chunk_bytes as usize;
        Model {
            bytes: vec![0; size],
            allocated: vec![false; size.div_ceil(BLOCK)],
            chunk_bytes,
            chunk_len: vec![0; size.div_ceil(chunk_bytes)],
        }
    }

    /// `(chunk index, start, end)` within the chunk, for each chunk `[offset, offset+len)` touches.
    fn pieces(&self, offset: usize, len: usize) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let index = at / self.chunk_bytes;
            let start = at % self.chunk_bytes;
            let end = (start + offset + len - at).min(self.chunk_bytes);
            out.push((index, start, end));
            at += end - start;
        }
        out
    }

    pub fn write(&mut self, offset: usize, data: &[u8]) {
        self.bytes[offset..offset + data.len()].copy_from_slice(data);
        for (index, start, end) in self.pieces(offset, data.len()) {
            self.chunk_len[index] = self.chunk_len[index].max(end);
            let base = index * self.chunk_bytes / BLOCK;
            for block in start / BLOCK..=(end - 1) / BLOCK {
                self.allocated[base + block] = true;
            }
        }
    }

    /// The engine's discard, chunk by chunk: the range reads zeros; blocks wholly inside it
    /// (up to the chunk's end) are freed, edge blocks keep their allocation.
    pub fn punch(&mut self, offset: usize, len: usize) {
        self.bytes[offset..offset + len].fill(0);
        for (index, start, end) in self.pieces(offset, len) {
            self.punch_chunk(index, start, end);
        }
    }

    fn punch_chunk(&mut self, index: usize, start: usize, end: usize) {
        let chunk_len = self.chunk_len[index];
        let end = end.min(chunk_len);
        let base = index * self.chunk_bytes / BLOCK;
        if start < end {
            for block in start / BLOCK..=(end - 1) / BLOCK {
                if start <= block * BLOCK && end >= ((block + 1) * BLOCK).min(chunk_len) {
                    self.allocated[base + block] = false;
                }
            }
        }
        let blocks = self.chunk_bytes / BLOCK;
        let last = (base + blocks).min(self.allocated.len());
        if !self.allocated[base..last].iter().any(|&a| a) {
            self.chunk_len[index] = 0;
        }
    }

    /// `shrink_to(size)`: everything past `size` is dropped.
    pub fn shrink_to(&mut self, size: usize) {
        if size >= self.bytes.len() {
            return;
        }
        let old = self.bytes.len();
        self.bytes[size..].fill(0);
        let keep_whole = size.div_ceil(self.chunk_bytes);
        for index in keep_whole..self.chunk_len.len() {
            self.chunk_len[index] = 0;
            let base = index * self.chunk_bytes / BLOCK;
            let last = (base + self.chunk_bytes / BLOCK).min(self.allocated.len());
            self.allocated[base..last].fill(false);
        }
        if !size.is_multiple_of(self.chunk_bytes) {
            self.punch_chunk(size / self.chunk_bytes, size % self.chunk_bytes, self.chunk_bytes);
        }
        debug_assert_eq!(self.bytes.len(), old);
    }

    /// The merged allocation runs of `[offset, offset + len)`.
    pub fn block_status(&self, offset: usize, len: usize) -> Vec<(u64, bool)> {
        let mut out: Vec<(u64, bool)> = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let block = at / BLOCK;
            let end = ((block + 1) * BLOCK).min(offset + len);
            let allocated = self.allocated[block];
            match out.last_mut() {
                Some((n, a)) if *a == allocated => *n += (end - at) as u64,
                _ => out.push(((end - at) as u64, allocated)),
            }
            at = end;
        }
        out
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.iter().filter(|&&a| a).count() as u64 * BLOCK as u64
    }
}
