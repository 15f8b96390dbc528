//! Connections to the services and the encoding of their requests.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use stria_proto::fs::ObjectId;
use stria_proto::fs::{FsStatus, TargetId};
use stria_proto::wire::{
    ChunkMap, ChunkMapReply, ChunkPunch, ChunkRead, ChunkTruncate, ChunkWrite, DriveChangeRefused,
    Epoch, Instance, MetaReply, MetaRequest, ObjectClone, ObjectRemove, ObjectSpace,
    ObjectSpaceReply, ObjectsRemove, TargetFailDrive, TargetInfo, TargetSync, meta_method,
    storage_method,
};
use stria_rpc::{ClusterSecret, Data};
use tokio::sync::OnceCell;

use crate::dir_attrs::DirAttrs;
use crate::durability::{DurabilityWatch, Service};
use crate::{DriveChangeError, FsResult};

/// Deadline of a target's copy of an object's chunk records (a volume snapshot or clone), and of
/// its begin. The copy stages one record per chunk, milliseconds per GiB of chunks; this
/// deadline only bounds a stuck target, so that a caller does not clean up while the target may
/// still make the copy.
pub(crate) const OBJECT_CLONE_TIMEOUT: Duration = Duration::from_secs(600);

/// How every connection of a client talks to its service (from [`crate::ClientConfig`]).
#[derive(Clone, Debug)]
pub(crate) struct ConnSettings {
    /// Deadline of one try of a request.
    pub timeout: Duration,
    pub secret: Option<ClusterSecret>,
    /// How long a request waits for an unreachable service to come back.
    pub reconnect_wait: Duration,
}

/// One service address with a lazily opened, pipelined connection.
#[derive(Debug)]
struct Conn {
    addr: SocketAddr,
    timeout: Duration,
    secret: Option<ClusterSecret>,
    reconnect_wait: Duration,
    client: OnceCell<stria_rpc::Client>,
}

/// A failed try of a request: why, and whether it may have reached the service.
struct Failed {
    status: FsStatus,
    maybe_sent: bool,
}

impl Conn {
    fn new(addr: SocketAddr, settings: &ConnSettings) -> Conn {
        Conn {
            addr,
            timeout: settings.timeout,
            secret: settings.secret.clone(),
            reconnect_wait: settings.reconnect_wait,
            client: OnceCell::new(),
        }
    }

    async fn call(
        &self,
        method: u16,
        message: Bytes,
        data: Bytes,
        idempotent: bool,
        timeout: Duration,
    ) -> FsResult<(Bytes, Data)> {
        let reply = self.call_raw(method, message, data, idempotent, timeout).await?;
        status_to_result(reply.status)?;
        Ok((reply.message, reply.data))
    }

    /// The reply whatever its status: refusals that explain themselves keep their message.
    /// While the service cannot be reached, the request is tried again for up to
    /// `reconnect_wait`: any request the service never got, and an `idempotent` one (the same
    /// result however often it runs) also when the connection broke under it.
    async fn call_raw(
        &self,
        method: u16,
        message: Bytes,
        data: Bytes,
        idempotent: bool,
        timeout: Duration,
    ) -> FsResult<stria_rpc::Reply> {
        let give_up = tokio::time::Instant::now() + self.reconnect_wait;
        let mut pause = Duration::from_millis(20);
        loop {
            match self.try_call(method, message.clone(), data.clone(), timeout).await {
                Ok(reply) => return Ok(reply),
                Err(failed)
                    if (!failed.maybe_sent || idempotent)
                        && tokio::time::Instant::now() + pause < give_up =>
                {
                    tracing::debug!(addr = %self.addr, method, "service unreachable; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(failed) => return Err(failed.status),
            }
        }
    }

    async fn try_call(
        &self,
        method: u16,
        message: Bytes,
        data: Bytes,
        timeout: Duration,
    ) -> Result<stria_rpc::Reply, Failed> {
        let client = self
            .client
            .get_or_try_init(|| async {
                let config =
                    stria_rpc::ClientConfig { secret: self.secret.clone(), ..Default::default() };
                stria_rpc::Client::connect_with(self.addr, config).await.map_err(|error| {
                    tracing::warn!(addr = %self.addr, %error, "cannot connect");
                    match error {
                        stria_rpc::RpcError::Unauthenticated { .. } => {
                            // Waiting does not change the secret: no retry.
                            Failed { status: FsStatus::Access, maybe_sent: true }
                        }
                        _ => Failed { status: FsStatus::Unavailable, maybe_sent: false },
                    }
                })
            })
            .await?;
        client.call(method, message, data, timeout).await.map_err(|error| {
            tracing::warn!(addr = %self.addr, method, %error, "request failed");
            match error {
                // The connection (or reconnection) failed before the request went out.
                stria_rpc::RpcError::Connect { .. } => {
                    Failed { status: FsStatus::Unavailable, maybe_sent: false }
                }
                _ => Failed { status: FsStatus::Io, maybe_sent: true },
            }
        })
    }

    async fn call_typed<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: u16,
        request: &Req,
        data: Bytes,
        idempotent: bool,
    ) -> FsResult<(Resp, Data)> {
        self.call_typed_within(method, request, data, idempotent, self.timeout).await
    }

    /// As [`Conn::call_typed`], with a deadline of its own for each try.
    async fn call_typed_within<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: u16,
        request: &Req,
        data: Bytes,
        idempotent: bool,
        timeout: Duration,
    ) -> FsResult<(Resp, Data)> {
        let message = postcard::to_stdvec(request).map_err(|_| FsStatus::Invalid)?;
        let (message, data) =
            self.call(method, Bytes::from(message), data, idempotent, timeout).await?;
        let reply = postcard::from_bytes(&message).map_err(|error| {
            tracing::error!(addr = %self.addr, method, %error, "undecodable reply");
            FsStatus::Io
        })?;
        Ok((reply, data))
    }
}

fn status_to_result(status: u16) -> FsResult<()> {
    if status == 0 {
        return Ok(());
    }
    match FsStatus::from_rpc_code(status) {
        Some(error) => Err(error),
        None => {
            tracing::warn!(status, "request failed with a transport status");
            Err(
                if status == stria_rpc::status::DEADLINE_EXCEEDED
                    || status == stria_rpc::status::OVERLOADED
                {
                    FsStatus::Unavailable
                } else {
                    FsStatus::Io
                },
            )
        }
    }
}

pub(crate) struct MetaConn {
    conn: Conn,
    watch: Arc<DurabilityWatch>,
    /// The run of the service the last reply came from (0 before the first).
    instance: AtomicU64,
    /// Called when a reply comes from a new run of the service (it restarted).
    on_restart: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Directories' attributes as this client's last changes of them left them.
    pub dirs: DirAttrs,
}

impl std::fmt::Debug for MetaConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaConn").field("conn", &self.conn).finish_non_exhaustive()
    }
}

impl MetaConn {
    pub fn new(addr: SocketAddr, settings: &ConnSettings, watch: Arc<DurabilityWatch>) -> MetaConn {
        MetaConn {
            conn: Conn::new(addr, settings),
            watch,
            instance: AtomicU64::new(0),
            on_restart: OnceLock::new(),
            dirs: DirAttrs::default(),
        }
    }

    /// What to do when the service restarts (at most one hook; later ones are ignored).
    pub fn on_restart(&self, hook: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_restart.set(hook);
    }

    /// Makes the next reply count as one from a new run (a reclaim that failed is tried
    /// again then).
    pub fn forget_instance(&self) {
        self.instance.store(u64::MAX, Ordering::Relaxed);
    }

    /// Notes the run a reply came from; a change from a known one calls the restart hook.
    fn heard_from(&self, instance: Instance) {
        let last = self.instance.load(Ordering::Relaxed);
        if last == instance {
            return;
        }
        let swapped =
            self.instance.compare_exchange(last, instance, Ordering::AcqRel, Ordering::Relaxed);
        if swapped.is_ok() && last != 0 {
            tracing::info!("the metadata service restarted: telling it what this client holds");
            if let Some(hook) = self.on_restart.get() {
                hook();
            }
        }
    }

    pub async fn call(&self, request: MetaRequest) -> FsResult<MetaReply> {
        Ok(self.call_at(request).await?.1)
    }

    /// The reply and the epoch it was given under. Changes are noted in the durability
    /// watch, and a `Sync` settles the changes noted before it.
    pub async fn call_at(&self, request: MetaRequest) -> FsResult<(Epoch, MetaReply)> {
        // Only a sync settles earlier changes; other requests need no mark.
        let mark = matches!(request, MetaRequest::Sync).then(|| self.watch.mark());
        let idempotent = request.is_idempotent();
        let mut changed = request.changed_inodes();
        let in_flight = self.dirs.sending(&changed);
        let (answer, _): ((Epoch, MetaReply, Instance), _) =
            self.conn.call_typed(meta_method::CALL, &request, Bytes::new(), idempotent).await?;
        let (epoch, reply, instance) = answer;
        self.heard_from(instance);
        let reply = match reply {
            MetaReply::WithParent { reply, parent } => {
                in_flight.answered(Some(parent));
                *reply
            }
            reply => {
                in_flight.answered(None);
                // Fresher than what a change of this client left: that goes.
                if let MetaReply::Attr(attr) = &reply
                    && attr.kind == stria_proto::wire::FileKind::Dir
                {
                    self.dirs.forget(attr.ino);
                }
                reply
            }
        };
        if let Some(mark) = mark {
            self.watch.synced(Service::Meta, mark, epoch);
            return Ok((epoch, reply));
        }
        if matches!(
            request,
            MetaRequest::Create { .. } | MetaRequest::Mkdir { .. } | MetaRequest::Symlink { .. }
        ) && let MetaReply::Attr(attr) | MetaReply::Open { attr, .. } = &reply
        {
            changed.push(attr.ino);
        }
        self.watch.changed(Service::Meta, epoch, &changed);
        Ok((epoch, reply))
    }
}

/// Connections to the storage services, one per address, shared by the targets they serve.
#[derive(Clone, Debug)]
pub(crate) struct StorageConns {
    targets: Arc<HashMap<TargetId, Arc<Conn>>>,
    all: Arc<Vec<Arc<Conn>>>,
    watch: Arc<DurabilityWatch>,
}

impl StorageConns {
    pub fn new(
        targets: &[(TargetId, SocketAddr)],
        settings: &ConnSettings,
        watch: Arc<DurabilityWatch>,
    ) -> StorageConns {
        let mut by_addr: HashMap<SocketAddr, Arc<Conn>> = HashMap::new();
        let mut map = HashMap::new();
        for (target, addr) in targets {
            let conn = by_addr
                .entry(*addr)
                .or_insert_with(|| Arc::new(Conn::new(*addr, settings)))
                .clone();
            map.insert(*target, conn);
        }
        StorageConns {
            targets: Arc::new(map),
            all: Arc::new(by_addr.into_values().collect()),
            watch,
        }
    }

    /// Whether a change to `object` was lost by a restart since it was last asked.
    pub fn take_lost(&self, object: u64) -> bool {
        self.watch.take_lost(object)
    }

    /// A change to `object`'s chunks on `target`, acknowledged under `epoch`.
    fn changed(&self, target: TargetId, object: ObjectId, epoch: Epoch) {
        self.watch.changed(Service::Target(target), epoch, &[object.0]);
    }

    fn conn(&self, target: TargetId) -> FsResult<&Conn> {
        self.targets.get(&target).map(|c| c.as_ref()).ok_or_else(|| {
            tracing::error!(%target, "no storage service known for target");
            FsStatus::Unavailable
        })
    }

    /// The bytes read, as the buffers the target answered with (its cached blocks, in process).
    pub async fn chunk_read(&self, request: ChunkRead) -> FsResult<Data> {
        let conn = self.conn(request.target)?;
        let ((), data) =
            conn.call_typed(storage_method::CHUNK_READ, &request, Bytes::new(), true).await?;
        Ok(data)
    }

    pub async fn chunk_write(&self, request: ChunkWrite, data: Bytes) -> FsResult<()> {
        let conn = self.conn(request.target)?;
        let (epoch, _) = conn.call_typed(storage_method::CHUNK_WRITE, &request, data, true).await?;
        self.changed(request.target, request.chunk.object, epoch);
        Ok(())
    }

    pub async fn chunk_truncate(&self, request: ChunkTruncate) -> FsResult<()> {
        let conn = self.conn(request.target)?;
        let (epoch, _) =
            conn.call_typed(storage_method::CHUNK_TRUNCATE, &request, Bytes::new(), true).await?;
        self.changed(request.target, request.chunk.object, epoch);
        Ok(())
    }

    pub async fn object_remove(&self, request: ObjectRemove) -> FsResult<()> {
        let conn = self.conn(request.target)?;
        let (epoch, _) =
            conn.call_typed(storage_method::OBJECT_REMOVE, &request, Bytes::new(), true).await?;
        self.changed(request.target, request.object, epoch);
        Ok(())
    }

    pub async fn objects_remove(&self, request: ObjectsRemove) -> FsResult<()> {
        let conn = self.conn(request.target)?;
        let (epoch, _) =
            conn.call_typed(storage_method::OBJECTS_REMOVE, &request, Bytes::new(), true).await?;
        let inos: Vec<u64> = request.objects.iter().map(|o| o.0).collect();
        self.watch.changed(Service::Target(request.target), epoch, &inos);
        Ok(())
    }

    /// Waits up to [`OBJECT_CLONE_TIMEOUT`]: a target that gave up waiting would still make
    /// the copy, after the caller cleaned up. The whole copy in one call.
    pub async fn object_clone(&self, request: ObjectClone) -> FsResult<()> {
        self.object_clone_call(storage_method::OBJECT_CLONE, request).await
    }

    /// Begins a copy at this instant on the target: later changes to the source copy their
    /// chunk first; [`Self::object_clone_finish`] finishes it.
    pub async fn object_clone_begin(&self, request: ObjectClone) -> FsResult<()> {
        self.object_clone_call(storage_method::OBJECT_CLONE_BEGIN, request).await
    }

    /// Finishes a copy [`Self::object_clone_begin`] began; `Invalid` when the target has none
    /// under way.
    pub async fn object_clone_finish(&self, request: ObjectClone) -> FsResult<()> {
        self.object_clone_call(storage_method::OBJECT_CLONE_FINISH, request).await
    }

    async fn object_clone_call(&self, method: u16, request: ObjectClone) -> FsResult<()> {
        let conn = self.conn(request.target)?;
        // Not idempotent: a second run finds the copy there (or under way) and is refused.
        let (epoch, _) = conn
            .call_typed_within(method, &request, Bytes::new(), false, OBJECT_CLONE_TIMEOUT)
            .await?;
        self.changed(request.target, request.dest, epoch);
        Ok(())
    }

    pub async fn chunk_punch(&self, request: ChunkPunch) -> FsResult<()> {
        let conn = self.conn(request.target)?;
        let (epoch, _) =
            conn.call_typed(storage_method::CHUNK_PUNCH, &request, Bytes::new(), true).await?;
        self.changed(request.target, request.chunk.object, epoch);
        Ok(())
    }

    pub async fn chunk_map(&self, request: ChunkMap) -> FsResult<ChunkMapReply> {
        let conn = self.conn(request.target)?;
        let (reply, _) =
            conn.call_typed(storage_method::CHUNK_MAP, &request, Bytes::new(), true).await?;
        Ok(reply)
    }

    pub async fn object_space(&self, request: ObjectSpace) -> FsResult<ObjectSpaceReply> {
        let conn = self.conn(request.target)?;
        let (reply, _) =
            conn.call_typed(storage_method::OBJECT_SPACE, &request, Bytes::new(), true).await?;
        Ok(reply)
    }

    pub async fn target_sync(&self, request: TargetSync) -> FsResult<()> {
        let conn = self.conn(request.target)?;
        let mark = self.watch.mark();
        let (epoch, _) =
            conn.call_typed(storage_method::TARGET_SYNC, &request, Bytes::new(), true).await?;
        self.watch.synced(Service::Target(request.target), mark, epoch);
        Ok(())
    }

    pub async fn fail_drive(&self, request: TargetFailDrive) -> FsResult<TargetInfo> {
        let conn = self.conn(request.target)?;
        let (info, _) = conn
            .call_typed(storage_method::TARGET_FAIL_DRIVE, &request, Bytes::new(), false)
            .await?;
        Ok(info)
    }

    /// A drive change (replace, add spare): the target after it, or the service's refusal
    /// with its explanation.
    pub async fn change_drive<Req: Serialize>(
        &self,
        target: TargetId,
        method: u16,
        request: &Req,
    ) -> Result<TargetInfo, DriveChangeError> {
        let conn = self.conn(target).map_err(DriveChangeError::bare)?;
        let message =
            postcard::to_stdvec(request).map_err(|_| DriveChangeError::bare(FsStatus::Invalid))?;
        let reply = conn
            .call_raw(method, Bytes::from(message), Bytes::new(), false, conn.timeout)
            .await
            .map_err(DriveChangeError::bare)?;
        if let Err(status) = status_to_result(reply.status) {
            let refused: Option<DriveChangeRefused> = postcard::from_bytes(&reply.message).ok();
            return Err(match refused {
                Some(r) => DriveChangeError { status, message: r.message, field: r.field },
                None => DriveChangeError::bare(status),
            });
        }
        postcard::from_bytes(&reply.message).map_err(|error| {
            tracing::error!(addr = %conn.addr, method, %error, "undecodable reply");
            DriveChangeError::bare(FsStatus::Io)
        })
    }

    pub async fn list_targets(&self) -> FsResult<Vec<TargetInfo>> {
        let mut all = Vec::new();
        for conn in self.all.iter() {
            let (infos, _): (Vec<TargetInfo>, _) =
                conn.call_typed(storage_method::TARGET_LIST, &(), Bytes::new(), true).await?;
            all.extend(infos);
        }
        all.sort_by_key(|info| info.target);
        Ok(all)
    }
}
