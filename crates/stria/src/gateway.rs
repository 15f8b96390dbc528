//! The NBD gateway of `stria up`: serves the registry's exports (`stria export`), each over its
//! volume's data on the targets, through the client library.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use stria_client::{Client, VolumeIo};
use stria_mgmt::{ExportRecord, ExportStats, Gateway, GatewayClient, VolumeRecord, WriteHold};
use stria_nbd::{
    AclRule, Backend, BackendError, BackendErrorKind, BackendFuture, Export, Exports, Extent,
    PartsFuture, TlsConfig,
};
use stria_proto::fs::{FsStatus, ObjectId};
use stria_proto::mgmt::VolumeIoCounts;

/// A volume as an NBD backend. One per volume, shared by all its exports and connections, so
/// a resize reaches every connection at once.
struct VolumeBackend {
    io: VolumeIo,
    counts: Counts,
    /// Every change (write, trim, zeroes) holds this shared; a snapshot holds it exclusively
    /// ([`Gateway::hold_writes`]), so it waits for the changes in progress and new ones wait
    /// for it. The lock is fair: a waiting snapshot is not starved by a stream of writes.
    changes: Arc<ChangeLock>,
}

/// Held shared by every change of a volume's data, exclusively by a snapshot.
type ChangeLock = tokio::sync::RwLock<()>;

/// Requests served, for `stria_volume_*` metrics.
#[derive(Default)]
struct Counts {
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    read_ops: AtomicU64,
    write_ops: AtomicU64,
    read_latency_us: AtomicU64,
    write_latency_us: AtomicU64,
}

impl Counts {
    fn read(&self, bytes: usize, started: Instant) {
        self.read_bytes.fetch_add(bytes as u64, Relaxed);
        self.read_ops.fetch_add(1, Relaxed);
        self.read_latency_us.fetch_add(started.elapsed().as_micros() as u64, Relaxed);
    }

    fn written(&self, bytes: usize, started: Instant) {
        self.written_bytes.fetch_add(bytes as u64, Relaxed);
        self.write_ops.fetch_add(1, Relaxed);
        self.write_latency_us.fetch_add(started.elapsed().as_micros() as u64, Relaxed);
    }
}

/// Runs `work` to completion on this thread, outside any runtime.
fn block_on_here<T>(work: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime needs no resources that can run out")
        .block_on(work)
}

fn backend_error(what: &str, status: FsStatus) -> BackendError {
    let kind = match status {
        FsStatus::NoSpace => BackendErrorKind::NoSpace,
        FsStatus::Invalid | FsStatus::TooBig => BackendErrorKind::Invalid,
        FsStatus::ReadOnly => BackendErrorKind::ReadOnly,
        _ => BackendErrorKind::Io,
    };
    BackendError::new(kind, format!("{what}: {status}"))
}

impl Backend for VolumeBackend {
    fn size(&self) -> u64 {
        self.io.size()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        let started = Instant::now();
        self.io.read_into(offset, buf).map_err(|e| backend_error("read", e))?;
        self.counts.read(buf.len(), started);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), BackendError> {
        let started = Instant::now();
        let _change = self.changes.blocking_read();
        self.io.write(offset, data, fua).map_err(|e| backend_error("write", e))?;
        self.counts.written(data.len(), started);
        Ok(())
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.io.flush().map_err(|e| backend_error("flush", e))
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        let _change = self.changes.blocking_read();
        self.io.trim(offset, len).map_err(|e| backend_error("trim", e))
    }

    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), BackendError> {
        let _change = self.changes.blocking_read();
        self.io
            .write_zeroes(offset, len, may_trim, fua)
            .map_err(|e| backend_error("write zeroes", e))
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BackendError> {
        let runs =
            self.io.block_status(offset, len).map_err(|e| backend_error("block status", e))?;
        Ok(runs
            .into_iter()
            .filter(|(length, _)| *length > 0)
            .map(|(length, allocated)| Extent { length, hole: !allocated, zero: !allocated })
            .collect())
    }

    // A flush syncs every target of the volume's layout, which covers writes from every
    // connection and every export of the volume.

    fn read_parts_async(&self, offset: u64, len: usize) -> Option<PartsFuture<'_>> {
        Some(Box::pin(async move {
            let started = Instant::now();
            let parts = self
                .io
                .read_parts_async(offset, len)
                .await
                .map_err(|e| backend_error("read", e))?;
            self.counts.read(len, started);
            Ok(parts)
        }))
    }

    fn trim_async(&self, offset: u64, len: u64) -> Option<BackendFuture<'_>> {
        Some(Box::pin(async move {
            let _change = self.changes.read().await;
            self.io.trim_async(offset, len).await.map_err(|e| backend_error("trim", e))
        }))
    }

    fn write_zeroes_async(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Option<BackendFuture<'_>> {
        Some(Box::pin(async move {
            let _change = self.changes.read().await;
            let zeroed = self.io.write_zeroes_async(offset, len, may_trim, fua).await;
            zeroed.map_err(|e| backend_error("write zeroes", e))
        }))
    }

    fn write_async<'a>(
        &'a self,
        offset: u64,
        data: &'a [u8],
        fua: bool,
    ) -> Option<BackendFuture<'a>> {
        Some(Box::pin(async move {
            let started = Instant::now();
            let _change = self.changes.read().await;
            self.io.write_async(offset, data, fua).await.map_err(|e| backend_error("write", e))?;
            self.counts.written(data.len(), started);
            Ok(())
        }))
    }
}

/// The running gateway.
pub struct NbdGateway {
    client: Client,
    exports: Exports,
    addr: SocketAddr,
    backends: Mutex<HashMap<ObjectId, Arc<VolumeBackend>>>,
    /// Each volume's change lock, for as long as any backend of it lives: a connection keeps
    /// its backend after the export is removed (or replaced), and a snapshot must hold its
    /// writes back too.
    change_locks: Mutex<HashMap<ObjectId, Weak<ChangeLock>>>,
    handle: stria_nbd::ShutdownHandle,
    clients: stria_nbd::Clients,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl NbdGateway {
    /// Listens on `addr` (with TLS when `tls` is given) and serves no export until the
    /// management service says which.
    pub async fn start(
        addr: SocketAddr,
        client: Client,
        tls: Option<TlsConfig>,
    ) -> anyhow::Result<Arc<NbdGateway>> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| crate::node::bind_error(addr, "NBD", "--nbd-listen", e))?;
        let addr = listener.local_addr()?;
        let exports = Exports::new();
        let with_tls = tls.is_some();
        let config = stria_nbd::ServerConfig { tls, ..stria_nbd::ServerConfig::default() };
        let server = stria_nbd::Server::new(exports.clone(), config)
            .map_err(|e| anyhow::anyhow!("cannot start the NBD gateway: {e}"))?;
        let handle = server.shutdown_handle();
        let clients = server.clients();
        let task = tokio::spawn(async move {
            if let Err(e) = server.serve(listener).await {
                tracing::error!(%e, "NBD gateway stopped");
            }
        });
        tracing::info!(%addr, tls = with_tls, "NBD gateway listening");
        Ok(Arc::new(NbdGateway {
            client,
            exports,
            addr,
            backends: Mutex::new(HashMap::new()),
            change_locks: Mutex::new(HashMap::new()),
            handle,
            clients,
            task: Mutex::new(Some(task)),
        }))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for connections to finish.
    pub async fn shutdown(&self) {
        self.handle.shutdown();
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    fn backend(&self, volume: &VolumeRecord) -> Arc<VolumeBackend> {
        let mut backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        let backend = backends.entry(volume.object).or_insert_with(|| {
            let mut locks = self.change_locks.lock().unwrap_or_else(|e| e.into_inner());
            locks.retain(|_, lock| lock.strong_count() > 0);
            let changes = match locks.get(&volume.object).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(ChangeLock::default());
                    locks.insert(volume.object, Arc::downgrade(&lock));
                    lock
                }
            };
            Arc::new(VolumeBackend {
                io: self.client.volume(volume.object, volume.layout.clone(), volume.size_bytes),
                counts: Counts::default(),
                changes,
            })
        });
        backend.io.set_size(volume.size_bytes);
        backend.clone()
    }
}

impl Gateway for NbdGateway {
    fn apply(&self, set: Vec<(ExportRecord, VolumeRecord)>) {
        let wanted: Vec<String> = set.iter().map(|(e, _)| e.name.clone()).collect();
        for name in self.exports.names() {
            if !wanted.contains(&name) {
                self.exports.remove(&name);
                tracing::info!(export = %name, "export removed");
            }
        }
        let live: Vec<ObjectId> = set.iter().map(|(_, v)| v.object).collect();
        self.backends.lock().unwrap_or_else(|e| e.into_inner()).retain(|o, _| live.contains(o));
        for (export, volume) in set {
            let mut acl = Vec::new();
            for rule in &export.acl {
                match AclRule::new(&rule.net, rule.tls_identity.as_deref()) {
                    Ok(rule) => acl.push(rule),
                    Err(e) => {
                        tracing::error!(export = %export.name, "access rule {} skipped: {e}", rule.net)
                    }
                }
            }
            let backend: Arc<dyn Backend> = self.backend(&volume);
            let served = Export {
                backend,
                description: export.description.clone(),
                read_only: export.read_only,
                acl,
            };
            if let Err(e) = self.exports.insert(&export.name, served) {
                tracing::error!(export = %export.name, "cannot serve export: {e}");
            }
        }
    }

    fn clients(&self) -> Vec<GatewayClient> {
        self.clients
            .list()
            .into_iter()
            .map(|c| GatewayClient {
                peer: c.peer,
                export: c.export,
                tls: c.tls,
                since_unix_s: c.since_unix_s,
            })
            .collect()
    }

    fn hold_writes(&self, object: ObjectId) -> Option<WriteHold> {
        let changes = {
            let locks = self.change_locks.lock().unwrap_or_else(|e| e.into_inner());
            locks.get(&object)?.upgrade()?
        };
        // Called off the runtime's workers (management requests run on a blocking pool).
        let hold = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime.block_on(changes.write_owned()),
            Err(_) => block_on_here(changes.write_owned()),
        };
        Some(Box::new(hold))
    }

    fn in_use(&self, object: ObjectId) -> bool {
        let locks = self.change_locks.lock().unwrap_or_else(|e| e.into_inner());
        // Every backend of the volume holds its change lock; nothing else keeps it for long.
        locks.get(&object).is_some_and(|lock| lock.strong_count() > 0)
    }

    fn volume_io(&self, object: ObjectId) -> VolumeIoCounts {
        let backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        let Some(b) = backends.get(&object) else { return VolumeIoCounts::default() };
        VolumeIoCounts {
            read_bytes: b.counts.read_bytes.load(Relaxed),
            written_bytes: b.counts.written_bytes.load(Relaxed),
            read_ops: b.counts.read_ops.load(Relaxed),
            write_ops: b.counts.write_ops.load(Relaxed),
            read_latency_us_total: b.counts.read_latency_us.load(Relaxed),
            write_latency_us_total: b.counts.write_latency_us.load(Relaxed),
        }
    }

    fn stats(&self, export: &str) -> ExportStats {
        self.exports
            .stats(export)
            .map(|s| ExportStats { connections: s.opens(), refused: s.refusals() })
            .unwrap_or_default()
    }
}
