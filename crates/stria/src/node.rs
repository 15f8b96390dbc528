//! Starting the roles of a node: the metadata and storage services on their RPC servers.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use stria_meta::service::{CapacitySource, MetaService};
use stria_meta::{Commit, Meta, MetaOptions};
use stria_proto::fs::{LayoutPolicy, TargetId};
use stria_rpc::{ClusterSecret, Server, ServerConfig, ShutdownHandle};
use stria_storage::{StorageRpc, StorageService};

/// Opens the namespace; new files spread over `targets`.
pub fn open_meta(path: &Path, targets: &[TargetId]) -> Result<Arc<Meta>> {
    let pool: Vec<TargetId> = targets.to_vec();
    let options = MetaOptions {
        // Mutations are atomic at once and durable at the next sync: fsync, fsyncdir and
        // shutdown sync, and a background task syncs every second (see `serve`).
        commit: Commit::Lazy,
        root_policy: LayoutPolicy::default(),
        root_mode: 0o1777,
        resolver: Arc::new(move |_pool: &str| pool.clone()),
        ..MetaOptions::default()
    };
    let meta = Meta::open(path, options)
        .with_context(|| format!("opening the namespace {}", path.display()))?;
    Ok(Arc::new(meta))
}

/// The running services of a node.
#[derive(Debug)]
pub struct Services {
    pub meta_addr: SocketAddr,
    /// Metadata requests served, by operation (for metrics).
    pub meta_ops: Arc<stria_meta::service::OpCounts>,
    pub storage_addr: SocketAddr,
    serving: Vec<Serving>,
}

impl Services {
    /// Stops accepting, lets requests in flight finish.
    pub async fn shutdown(self) {
        for serving in self.serving {
            serving.shutdown().await;
        }
    }
}

pub fn bind_error(addr: SocketAddr, role: &str, flag: &str, e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        anyhow::anyhow!(
            "the {role} address {addr} is in use: is another `stria up` running? pick another with {flag}"
        )
    } else {
        anyhow::anyhow!("cannot listen on {addr} for the {role} service: {e}")
    }
}

/// The configuration of every RPC server of a node: peers must prove they hold `secret`; the
/// node's own clients (mount, NBD gateway, management) call servers of their process directly.
pub fn server_config(secret: &ClusterSecret) -> ServerConfig {
    ServerConfig { secret: Some(secret.clone()), in_process: true, ..ServerConfig::default() }
}

/// One RPC service of a node, serving.
#[derive(Debug)]
pub struct Serving {
    pub addr: SocketAddr,
    handle: ShutdownHandle,
    task: tokio::task::JoinHandle<()>,
    /// The periodic sync of the role's state; stopped with the server.
    flusher: tokio::task::JoinHandle<()>,
    /// The metadata service's change log, closed first at a stop so the mounts' waiting
    /// watch requests end at once rather than hold the stop (up to 5 s each).
    change_log: Option<Arc<stria_meta::changes::ChangeLog>>,
}

impl Serving {
    /// Stops accepting, lets requests in flight finish, stops the periodic sync.
    pub async fn shutdown(self) {
        if let Some(log) = &self.change_log {
            log.close();
        }
        self.handle.shutdown();
        let _ = self.task.await;
        self.flusher.abort();
        let _ = self.flusher.await;
    }
}

/// Runs `sync` on the blocking pool every `interval`, until aborted.
fn spawn_flusher(
    interval: std::time::Duration,
    sync: impl Fn() + Clone + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            let _ = tokio::task::spawn_blocking(sync.clone()).await;
        }
    })
}

/// How often the storage role makes its targets' changes durable without being asked, as the
/// metadata role does with its lazy commits: a crash loses at most about this much.
const STORAGE_SYNC_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves the storage role on `listen` (current runtime), and syncs changed targets every
/// [`STORAGE_SYNC_INTERVAL`].
pub async fn serve_storage(
    listen: SocketAddr,
    storage: StorageService,
    secret: &ClusterSecret,
) -> Result<Serving> {
    let server = Server::bind_with(listen, server_config(secret))
        .await
        .map_err(|e| bind_error(listen, "storage", "--storage-listen", e))?;
    let flushed = storage.clone();
    let flusher = spawn_flusher(STORAGE_SYNC_INTERVAL, move || flushed.sync_changed());
    Ok(Serving {
        flusher,
        change_log: None,
        addr: server.local_addr(),
        handle: server.shutdown_handle(),
        task: tokio::spawn(async move {
            if let Err(e) = server.serve(Arc::new(StorageRpc(storage))).await {
                tracing::error!(%e, "storage server stopped");
            }
        }),
    })
}

/// The space of the targets of an in-process storage role, for statfs.
pub fn local_capacity(storage: &StorageService) -> CapacitySource {
    let storage = storage.clone();
    Arc::new(move || {
        storage.targets().fold((0, 0), |(total, free), t| {
            let space = t.engine.space();
            (total + space.total_bytes, free + space.free_bytes + space.reclaimable_bytes)
        })
    })
}

/// Serves the metadata role on `listen` (current runtime), and makes its lazy commits
/// durable every second. Returns the service's request counters too.
pub async fn serve_meta(
    listen: SocketAddr,
    meta: Arc<Meta>,
    capacity: CapacitySource,
    epoch: stria_proto::wire::Epoch,
    secret: &ClusterSecret,
) -> Result<(Serving, Arc<stria_meta::service::OpCounts>)> {
    let server = Server::bind_with(listen, server_config(secret))
        .await
        .map_err(|e| bind_error(listen, "metadata", "--meta-listen", e))?;
    // Clients of the last run get a grace period to tell what they held (see
    // `stria_meta::reclaim`).
    meta.begin_serving(stria_proto::wire::LOCK_LEASE).context("starting the metadata service")?;
    let service = Arc::new(MetaService::new(meta.clone(), capacity).with_epoch(epoch));
    let ops = service.op_counts();
    let change_log = Some(service.change_log());
    // Lazy metadata commits reach the disk within a second even without fsync.
    let flusher = spawn_flusher(std::time::Duration::from_secs(1), move || {
        if let Err(e) = meta.sync() {
            tracing::error!(%e, "periodic metadata sync failed");
        }
    });
    let serving = Serving {
        addr: server.local_addr(),
        handle: server.shutdown_handle(),
        task: tokio::spawn(async move {
            if let Err(e) = server.serve(service).await {
                tracing::error!(%e, "metadata server stopped");
            }
        }),
        flusher,
        change_log,
    };
    Ok((serving, ops))
}

/// Starts both services on the current runtime (every role in one process).
pub async fn serve(
    meta_listen: SocketAddr,
    storage_listen: SocketAddr,
    meta: Arc<Meta>,
    storage: StorageService,
    meta_epoch: stria_proto::wire::Epoch,
    secret: &ClusterSecret,
) -> Result<Services> {
    let capacity = local_capacity(&storage);
    let storage = serve_storage(storage_listen, storage, secret).await?;
    let (meta, meta_ops) = serve_meta(meta_listen, meta, capacity, meta_epoch, secret).await?;
    Ok(Services {
        meta_ops,
        meta_addr: meta.addr,
        storage_addr: storage.addr,
        serving: vec![meta, storage],
    })
}
