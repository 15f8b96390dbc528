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
    handles: Vec<ShutdownHandle>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Services {
    /// Stops accepting, lets requests in flight finish.
    pub async fn shutdown(self) {
        for handle in &self.handles {
            handle.shutdown();
        }
        for task in self.tasks {
            let _ = task.await;
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

/// The configuration of every RPC server of a node: peers must prove they hold `secret`.
pub fn server_config(secret: &ClusterSecret) -> ServerConfig {
    ServerConfig { secret: Some(secret.clone()), ..ServerConfig::default() }
}

/// Starts both services on the current runtime.
pub async fn serve(
    meta_listen: SocketAddr,
    storage_listen: SocketAddr,
    meta: Arc<Meta>,
    storage: StorageService,
    secret: &ClusterSecret,
) -> Result<Services> {
    let storage_server = Server::bind_with(storage_listen, server_config(secret))
        .await
        .map_err(|e| bind_error(storage_listen, "storage", "--storage-listen", e))?;
    let meta_server = Server::bind_with(meta_listen, server_config(secret))
        .await
        .map_err(|e| bind_error(meta_listen, "metadata", "--meta-listen", e))?;
    let capacity_from = storage.clone();
    let capacity: CapacitySource = Arc::new(move || {
        capacity_from.targets().fold((0, 0), |(total, free), t| {
            let space = t.engine.space();
            (total + space.total_bytes, free + space.free_bytes + space.reclaimable_bytes)
        })
    });
    let meta_service = Arc::new(MetaService::new(meta.clone(), capacity));
    let services = Services {
        meta_ops: meta_service.op_counts(),
        meta_addr: meta_server.local_addr(),
        storage_addr: storage_server.local_addr(),
        handles: vec![meta_server.shutdown_handle(), storage_server.shutdown_handle()],
        tasks: vec![
            tokio::spawn(async move {
                if let Err(e) = meta_server.serve(meta_service).await {
                    tracing::error!(%e, "metadata server stopped");
                }
            }),
            tokio::spawn(async move {
                if let Err(e) = storage_server.serve(Arc::new(StorageRpc(storage))).await {
                    tracing::error!(%e, "storage server stopped");
                }
            }),
        ],
    };
    // Lazy metadata commits reach the disk within a second even without fsync.
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tick.tick().await;
            let meta = meta.clone();
            let synced = tokio::task::spawn_blocking(move || meta.sync()).await;
            if let Ok(Err(e)) = synced {
                tracing::error!(%e, "periodic metadata sync failed");
            }
        }
    });
    Ok(services)
}
