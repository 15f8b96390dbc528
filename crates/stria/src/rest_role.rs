//! The management role's REST API and metrics in `stria up` (`--api-listen`).
//!
//! `crates/mgmt` owns the API; this file gives it the node: [`LocalView`] implements
//! [`NodeView`] over the local storage service (drives, targets, rebuild rate, scrub jobs),
//! and [`start`] makes or reads the API token and the node id under `DATA/mgmt/`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use stria_mgmt::api_auth::{ApiToken, token_path};
use stria_mgmt::node_view::{
    DriveStatus, Geometry, NodeAddresses, NodeIdentity, NodeView, ReadCache, RebuildStatus,
    ScrubFindings, ScrubState, ScrubStatus, Space, TargetIo, TargetState, TargetStatus,
    level_shape, remaining_life_days,
};
use stria_mgmt::{ApiServer, Mgmt};
use stria_proto::fs::TargetId;
use stria_proto::mgmt::{MgmtError, MgmtStatus};
use stria_raid::{ArrayState, MemberStatus, REBUILD_RATE_BYTES_S_DEFAULT};
use stria_storage::StorageService;

fn unix_now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One scrub of one target, run on its own thread.
#[derive(Debug)]
struct ScrubJob {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    total: Arc<AtomicU64>,
    status: Arc<Mutex<ScrubStatus>>,
    thread: Option<JoinHandle<()>>,
}

/// The node's hardware, as mgmt sees it.
pub struct LocalView {
    storage: StorageService,
    started: Instant,
    rebuild_limits: Mutex<HashMap<TargetId, u64>>,
    scrubs: Mutex<HashMap<TargetId, ScrubJob>>,
    capacities: Mutex<HashMap<String, Option<u64>>>,
    metadata_ops: Arc<stria_meta::service::OpCounts>,
    mount_requests: Option<Arc<stria_fuse::RequestCounts>>,
}

impl std::fmt::Debug for LocalView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalView").finish_non_exhaustive()
    }
}

fn not_found(target: TargetId) -> MgmtError {
    MgmtError::new(MgmtStatus::NotFound, format!("no target {target} on this node"))
}

/// Size of a drive file or block device; None when it cannot be opened.
fn device_bytes(path: &str) -> Option<u64> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_file() {
        return Some(meta.len());
    }
    use std::io::Seek;
    std::fs::File::open(path).ok()?.seek(std::io::SeekFrom::End(0)).ok()
}

impl LocalView {
    pub fn new(storage: StorageService, counters: RequestCounters) -> LocalView {
        LocalView {
            metadata_ops: counters.metadata,
            mount_requests: counters.mount,
            storage,
            started: Instant::now(),
            rebuild_limits: Mutex::new(HashMap::new()),
            scrubs: Mutex::new(HashMap::new()),
            capacities: Mutex::new(HashMap::new()),
        }
    }

    fn capacity(&self, device: &str) -> Option<u64> {
        if device == "-" || device.is_empty() {
            return None;
        }
        let mut cache = self.capacities.lock().unwrap_or_else(|e| e.into_inner());
        *cache.entry(device.to_string()).or_insert_with(|| device_bytes(device))
    }

    fn drive(&self, target: TargetId, m: &MemberStatus) -> DriveStatus {
        let session_s = self.started.elapsed().as_secs_f64();
        DriveStatus {
            id: m.drive_uuid.clone(),
            device: m.device.clone(),
            backend: m.backend.clone(),
            target,
            slot: m.slot.map(|s| s as u32),
            state: m.state.to_string(),
            capacity_bytes: self.capacity(&m.device),
            read_bytes: m.read_bytes,
            written_bytes: m.written_bytes,
            read_ops: m.read_ops,
            write_ops: m.write_ops,
            errors: m.errors,
            lifetime_written_bytes: m.lifetime_written_bytes,
            rated_endurance_bytes: m.rated_endurance_bytes,
            wear_percent: m.wear_percent,
            remaining_life_days: remaining_life_days(
                m.rated_endurance_bytes,
                m.lifetime_written_bytes,
                m.written_bytes,
                session_s,
            ),
            read_latency_p99_us: m.read_latency_p99_us,
            write_latency_p99_us: m.write_latency_p99_us,
        }
    }

    fn scrub_status(&self, target: TargetId) -> ScrubStatus {
        let scrubs = self.scrubs.lock().unwrap_or_else(|e| e.into_inner());
        let Some(job) = scrubs.get(&target) else { return ScrubStatus::idle() };
        let mut status = job.status.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if status.state == ScrubState::Running {
            let total = job.total.load(Relaxed);
            status.progress_ratio =
                if total == 0 { 0.0 } else { job.done.load(Relaxed) as f64 / total as f64 };
        }
        status
    }

    /// Stops every running scrub and waits for it (at shutdown, before the arrays close).
    pub fn stop_all_scrubs(&self) {
        let threads: Vec<JoinHandle<()>> = {
            let mut scrubs = self.scrubs.lock().unwrap_or_else(|e| e.into_inner());
            scrubs
                .values_mut()
                .filter_map(|job| {
                    job.stop.store(true, Relaxed);
                    job.thread.take()
                })
                .collect()
        };
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl NodeView for LocalView {
    fn targets(&self) -> Vec<TargetStatus> {
        let limits = self.rebuild_limits.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.storage
            .targets()
            .map(|t| {
                let status = t.array.status();
                let space = t.engine.space();
                let drives = status.drives as u32;
                let (data_drives, tolerated_failures) = level_shape(&status.level, drives);
                let io = self
                    .storage
                    .io_stats(t.id)
                    .map(|s| TargetIo {
                        read_ops: s.read_ops.load(Relaxed),
                        read_bytes: s.read_bytes.load(Relaxed),
                        write_ops: s.write_ops.load(Relaxed),
                        written_bytes: s.write_bytes.load(Relaxed),
                        read_latency_us_total: s.read_latency_us_total.load(Relaxed),
                        write_latency_us_total: s.write_latency_us_total.load(Relaxed),
                        read_latency_buckets: s.read_latency.counts().to_vec(),
                        write_latency_buckets: s.write_latency.counts().to_vec(),
                    })
                    .unwrap_or_default();
                let rebuild_limit = status
                    .rebuild
                    .as_ref()
                    .map(|r| r.rate_limit_bytes_s)
                    .or_else(|| limits.get(&t.id).copied())
                    .unwrap_or(REBUILD_RATE_BYTES_S_DEFAULT);
                TargetStatus {
                    id: t.id,
                    pool: t.pool.clone(),
                    state: match status.state {
                        ArrayState::Optimal => TargetState::Optimal,
                        ArrayState::Degraded => TargetState::Degraded,
                        ArrayState::Rebuilding => TargetState::Rebuilding,
                        ArrayState::Failed => TargetState::Failed,
                    },
                    geometry: Geometry {
                        level: status.level.clone(),
                        drives,
                        data_drives,
                        stripe_unit_bytes: status.stripe_unit_bytes,
                        tolerated_failures,
                        array_capacity_bytes: status.capacity_bytes,
                    },
                    space: Space {
                        total_bytes: space.total_bytes,
                        used_bytes: space.used_bytes,
                        free_bytes: space.free_bytes,
                        reclaimable_bytes: space.reclaimable_bytes,
                        chunks: space.chunks,
                    },
                    rebuild: status.rebuild.as_ref().map(|r| RebuildStatus {
                        slot: r.slot as u32,
                        progress_ratio: r.percent / 100.0,
                        running: r.running,
                        error: r.error.clone(),
                        rate_bytes_per_s: r.rate_bytes_s,
                    }),
                    rebuild_rate_limit_bytes_per_s: rebuild_limit,
                    scrub: self.scrub_status(t.id),
                    checksum_errors: status.checksum_errors,
                    repaired_blocks: status.repaired_blocks,
                    unrecoverable_blocks: status.unrecoverable_blocks,
                    io,
                    read_cache: {
                        let c = t.engine.read_cache_stats();
                        ReadCache {
                            capacity_bytes: c.capacity_bytes,
                            held_bytes: c.held_bytes,
                            hits: c.hits,
                            misses: c.misses,
                        }
                    },
                    warnings: status.warnings.clone(),
                    drives: status
                        .members
                        .iter()
                        .chain(&status.spares)
                        .map(|m| self.drive(t.id, m))
                        .collect(),
                }
            })
            .collect()
    }

    fn set_rebuild_rate(&self, target: TargetId, bytes_per_s: u64) -> Result<(), MgmtError> {
        let t = self.storage.targets().find(|t| t.id == target).ok_or_else(|| not_found(target))?;
        t.array.set_rebuild_rate(bytes_per_s);
        self.rebuild_limits.lock().unwrap_or_else(|e| e.into_inner()).insert(target, bytes_per_s);
        tracing::info!(%target, bytes_per_s, "rebuild rate set");
        Ok(())
    }

    fn start_scrub(
        &self,
        target: TargetId,
        repair: bool,
        rate_bytes_per_s: Option<u64>,
    ) -> Result<(), MgmtError> {
        let t = self.storage.targets().find(|t| t.id == target).ok_or_else(|| not_found(target))?;
        let mut scrubs = self.scrubs.lock().unwrap_or_else(|e| e.into_inner());
        let runs = match scrubs.get(&target) {
            Some(job) => {
                let status = job.status.lock().unwrap_or_else(|e| e.into_inner());
                if status.state == ScrubState::Running {
                    return Err(MgmtError::new(
                        MgmtStatus::Conflict,
                        format!("a scrub of target {target} runs already; stop it first"),
                    ));
                }
                status.runs
            }
            None => 0,
        };
        if t.array.status().state == ArrayState::Failed {
            return Err(MgmtError::new(
                MgmtStatus::Conflict,
                format!("target {target} has failed: there is nothing left to scrub"),
            ));
        }
        let status = Arc::new(Mutex::new(ScrubStatus {
            state: ScrubState::Running,
            runs,
            progress_ratio: 0.0,
            started_unix_s: Some(unix_now_s()),
            finished_unix_s: None,
            rate_limit_bytes_per_s: rate_bytes_per_s,
            findings: None,
            error: None,
        }));
        let (stop, done, total) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let array = t.array.clone();
        let thread = {
            let (stop, done, total, status) =
                (stop.clone(), done.clone(), total.clone(), status.clone());
            std::thread::Builder::new()
                .name(format!("stria-scrub-{}", target.0))
                .spawn(move || {
                    let mut progress = |d: u64, t: u64| {
                        done.store(d, Relaxed);
                        total.store(t, Relaxed);
                    };
                    let result = array.scrub(repair, rate_bytes_per_s, &stop, &mut progress);
                    let mut s = status.lock().unwrap_or_else(|e| e.into_inner());
                    s.finished_unix_s = Some(unix_now_s());
                    s.runs += 1;
                    match result {
                        Ok(report) => {
                            let t = total.load(Relaxed).max(1);
                            s.progress_ratio = (report.stripes_checked as f64 / t as f64).min(1.0);
                            s.state = if report.stopped_early {
                                ScrubState::Stopped
                            } else {
                                ScrubState::Finished
                            };
                            s.findings = Some(ScrubFindings {
                                stripes_checked: report.stripes_checked,
                                bytes_checked: report.bytes_checked,
                                checksum_errors: report.checksum_errors,
                                repaired_blocks: report.repaired_blocks,
                                parity_mismatches: report.parity_mismatches,
                                unrecoverable_blocks: report.unrecoverable_blocks,
                            });
                        }
                        Err(e) => {
                            tracing::error!(%e, "scrub failed");
                            s.state = ScrubState::Failed;
                            s.error = Some(e.to_string());
                        }
                    }
                })
                .map_err(|e| {
                    MgmtError::new(
                        MgmtStatus::Internal,
                        format!("cannot start a scrub thread: {e}"),
                    )
                })?
        };
        if let Some(old) =
            scrubs.insert(target, ScrubJob { stop, done, total, status, thread: Some(thread) })
            && let Some(thread) = old.thread
        {
            let _ = thread.join();
        }
        tracing::info!(%target, repair, ?rate_bytes_per_s, "scrub started");
        Ok(())
    }

    fn metadata_ops(&self) -> Vec<(String, u64)> {
        self.metadata_ops.snapshot().into_iter().map(|(op, n)| (op.to_string(), n)).collect()
    }

    fn mount_requests(&self) -> Vec<(String, u64)> {
        let Some(requests) = &self.mount_requests else { return Vec::new() };
        requests.snapshot().into_iter().map(|(op, n)| (op.to_string(), n)).collect()
    }

    fn stop_scrub(&self, target: TargetId) -> Result<(), MgmtError> {
        self.storage.targets().find(|t| t.id == target).ok_or_else(|| not_found(target))?;
        let thread = {
            let mut scrubs = self.scrubs.lock().unwrap_or_else(|e| e.into_inner());
            let running = scrubs.get(&target).is_some_and(|job| {
                job.status.lock().unwrap_or_else(|e| e.into_inner()).state == ScrubState::Running
            });
            let job = scrubs.get_mut(&target).filter(|_| running).ok_or_else(|| {
                MgmtError::new(MgmtStatus::Conflict, format!("no scrub of target {target} runs"))
            })?;
            job.stop.store(true, Relaxed);
            job.thread.take()
        };
        // The walk checks the flag before each stripe: this returns within one stripe's time.
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        tracing::info!(%target, "scrub stopped by request");
        Ok(())
    }
}

/// The running REST role.
#[derive(Debug)]
pub struct RestRole {
    server: ApiServer,
    view: Arc<LocalView>,
    token_path: PathBuf,
    /// The token, when it was made at this start (it is shown this once).
    new_token: Option<String>,
}

/// The node's id, made at its first start (`DATA/mgmt/node-id`).
fn node_id(mgmt_dir: &Path) -> Result<String> {
    let path = mgmt_dir.join("node-id");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let id = text.trim().to_string();
        if !id.is_empty() {
            return Ok(id);
        }
    }
    let id = stria_proto::Uuid::random().to_string();
    std::fs::write(&path, format!("{id}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(id)
}

/// Where the other roles of the node listen, for the cluster resource.
#[derive(Debug, Clone)]
pub struct RoleAddresses {
    pub mgmt: SocketAddr,
    pub meta: SocketAddr,
    pub storage: SocketAddr,
    pub nbd: Option<SocketAddr>,
    pub mount: Option<PathBuf>,
}

/// Takes the API's address (`--api-listen`) before anything else starts, so a busy port stops
/// the node at once with a clear message.
pub fn bind(listen: SocketAddr) -> Result<std::net::TcpListener> {
    std::net::TcpListener::bind(listen)
        .map_err(|e| crate::node::bind_error(listen, "REST API", "--api-listen", e))
}

/// The request counters of the node's roles that the REST API reports.
pub struct RequestCounters {
    pub metadata: Arc<stria_meta::service::OpCounts>,
    /// None without a mount.
    pub mount: Option<Arc<stria_fuse::RequestCounts>>,
}

/// Starts the REST API on `listener` (and its sampler).
pub fn start(
    runtime: &tokio::runtime::Runtime,
    listener: std::net::TcpListener,
    data: &Path,
    mgmt: &Mgmt,
    storage: &StorageService,
    counters: RequestCounters,
    roles: RoleAddresses,
) -> Result<RestRole> {
    let mgmt_dir = data.join("mgmt");
    let token_path = token_path(&mgmt_dir);
    let (token, created) = ApiToken::load_or_create(&token_path)
        .with_context(|| format!("API token {}", token_path.display()))?;
    let identity = NodeIdentity {
        id: node_id(&mgmt_dir)?,
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        data_dir: data.display().to_string(),
        started_unix_s: unix_now_s(),
        addresses: NodeAddresses {
            api: None,
            mgmt: Some(roles.mgmt),
            meta: roles.meta,
            storage: roles.storage,
            nbd: roles.nbd,
            mount: roles.mount.map(|m| m.display().to_string()),
        },
    };
    let view = Arc::new(LocalView::new(storage.clone(), counters));
    let new_token = created.then(|| token.as_str().to_string());
    let server = {
        let _entered = runtime.enter();
        ApiServer::start(listener, mgmt.clone(), view.clone(), identity, token)
            .context("starting the REST API")?
    };
    Ok(RestRole { server, view, token_path, new_token })
}

impl RestRole {
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Lines for `stria up`'s banner: where the API is and where its token is.
    pub fn banner_lines(&self) -> Vec<String> {
        let addr = self.local_addr();
        let mut lines =
            vec![format!("  api      http://{addr}/api/v1   metrics http://{addr}/metrics")];
        match &self.new_token {
            Some(token) => {
                lines.push(format!("  token    {token}"));
                lines.push(format!(
                    "           (shown once; kept in {} with mode 0600)",
                    self.token_path.display()
                ));
                lines.push(format!("  web      http://{addr}/#token={token}"));
            }
            None => {
                lines.push(format!("  token    in {}", self.token_path.display()));
                lines.push(format!("  web      http://{addr}/   (it asks for the token once)"));
            }
        }
        lines
    }

    /// Stops the API, its sampler and any running scrub.
    pub fn shutdown(self, runtime: &tokio::runtime::Runtime) {
        runtime.block_on(self.server.shutdown());
        self.view.stop_all_scrubs();
    }
}
