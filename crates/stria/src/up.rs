//! `stria up`: every role of a node in one process, on drive files under one data directory.
//!
//! The first run creates sparse drive files, one RAID array per target, a chunk engine on
//! each, and an empty file system; later runs reassemble what the directory holds. The roles
//! talk to each other through the same RPC a cluster uses, on loopback.
//!
//! Data directory:
//! ```text
//! DATA/node.json              what the node is made of (targets, levels, drive files, spares)
//! DATA/drives/tT-dI.img       drive I of target T (sparse files)
//! DATA/drives/NAME            drives added while running (`stria target replace-drive`,
//!                             `add-spare` or the API with a bare file name)
//! DATA/targets/T/             target T's chunk map
//! DATA/meta/namespace.redb    the namespace
//! DATA/mgmt/registry.redb     volumes, exports, initiator access lists
//! DATA/mgmt/api-token         the REST API's bearer token (mode 0600, made at the first run)
//! DATA/mgmt/node-id           the node's id (made at the first run)
//! DATA/cluster-secret         the secret every RPC peer proves it holds (mode 0600, made at
//!                             the first run; the CLI reads it to talk to the node)
//! DATA/logs/stria.log         the log
//! DATA/run.json               addresses of the running node (removed at a clean stop)
//! DATA/mnt                    the default mount point
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::{Deserialize, Serialize};
use stria_engine::Engine;
use stria_io::file::{DriveOptions, create_drive_file};
use stria_proto::fs::{LayoutPolicy, TargetId};
use stria_raid::{Array, ArrayConfig, CreateOptions, Level};
use stria_storage::{StorageService, Target};

use crate::units::{format_bytes, parse_size};
use crate::{interrupt, raid_cmd, usage};

/// Arguments of `stria up`. The shape options apply when the node is created; a later run
/// reassembles what the data directory holds and says so if they differ.
#[derive(Args, Debug)]
pub struct UpArgs {
    /// Data directory: drive files, metadata, logs (created on the first run).
    #[arg(long, default_value = "stria-data")]
    pub data: PathBuf,
    /// Drive files per target [first run; default 5].
    #[arg(long)]
    pub drives: Option<usize>,
    /// Size of each (sparse) drive file, e.g. 8G [first run; default 8G].
    #[arg(long, value_parser = parse_size)]
    pub drive_size: Option<u64>,
    /// RAID level of each target: 0, 1, 10, 5 or 6 [first run; default 5, or 1 with 2 drives].
    #[arg(long, value_parser = parse_level)]
    pub raid: Option<Level>,
    /// Number of targets (RAID arrays) files are striped over [first run; default 1].
    #[arg(long)]
    pub targets: Option<usize>,
    /// RAID stripe unit, 4K..1M [first run; default 256K].
    #[arg(long, value_parser = parse_size)]
    pub stripe_unit: Option<u64>,
    /// Rated endurance of each drive in terabytes written (the vendor's TBW figure), for the
    /// wear and remaining life the API and dashboard show [first run; default 0: not rated].
    #[arg(long, value_name = "TB")]
    pub rated_tbw: Option<u64>,
    /// Memory for the storage role's read cache of small-I/O blocks (small files, random
    /// 4 KiB reads), shared by the targets; e.g. 256M, 0 for none.
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    pub read_cache: u64,
    /// Where to mount the file system [default: DATA/mnt].
    #[arg(long)]
    pub mount: Option<PathBuf>,
    /// Do not mount; serve the native API only.
    #[arg(long)]
    pub no_mount: bool,
    #[command(flatten)]
    pub mount_flags: MountFlags,
    /// Address of the metadata service (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7411")]
    pub meta_listen: SocketAddr,
    /// Address of the storage service (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7412")]
    pub storage_listen: SocketAddr,
    /// Address of the management service the CLI talks to (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7413")]
    pub mgmt_listen: SocketAddr,
    /// Address of the NBD gateway serving volume exports (10809 is NBD's port; 0 picks one).
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub nbd_listen: SocketAddr,
    /// Do not serve NBD exports.
    #[arg(long)]
    pub no_nbd: bool,
    /// Run the storage role and the metadata role as processes of their own (`stria role`),
    /// supervised by this one: a role that dies is recovered from and restarted while the
    /// mount, the NBD gateway and the management service stay up; their requests wait for it
    /// (up to a minute) instead of failing, except changes that cannot be safely sent twice
    /// and were in flight at the crash. The REST API and the
    /// dashboard are not served in this mode (they read the drives in this process).
    #[arg(long, conflicts_with = "api_listen")]
    pub separate_roles: bool,
    /// Address of the REST API and /metrics (token in DATA/mgmt/api-token; 0 picks a port).
    #[arg(long, default_value = "127.0.0.1:7480")]
    pub api_listen: SocketAddr,
    /// PEM certificate chain of the NBD gateway: enables TLS (NBD_OPT_STARTTLS).
    #[arg(long, requires = "nbd_tls_key")]
    pub nbd_tls_cert: Option<PathBuf>,
    /// PEM private key for --nbd-tls-cert.
    #[arg(long, requires = "nbd_tls_cert")]
    pub nbd_tls_key: Option<PathBuf>,
    /// PEM CA certificates that sign client certificates: clients are asked for one, and
    /// `stria initiator allow --tls-identity NAME` rules match its name.
    #[arg(long, requires = "nbd_tls_cert")]
    pub nbd_tls_ca: Option<PathBuf>,
    /// Refuse NBD clients that do not start TLS.
    #[arg(long, requires = "nbd_tls_cert")]
    pub nbd_tls_required: bool,
}

/// How a FUSE mount behaves (`stria up`'s own mount, and `stria mount`).
#[derive(Args, Debug, Clone)]
pub struct MountFlags {
    /// Use the kernel's writeback cache on the mount: faster small buffered writes, but the
    /// mount then trusts its own file sizes and never sees what other clients (the client
    /// library, other mounts) change in files it has cached. Only when the mount is the sole
    /// writer of its files.
    #[arg(long)]
    pub writeback_cache: bool,
    /// Threads that take the kernel's requests on the mount (1-256; default one per CPU, at
    /// least 2 and at most 16). More than the CPUs slows small operations down.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub fuse_threads: Option<u16>,
    /// Treat root (uid 0) and group 0 on the mount as the unprivileged user and group nobody
    /// (65534), as NFS's root_squash: root on a client machine gets no more rights to files than
    /// anyone else, and what it creates belongs to nobody.
    #[arg(long)]
    pub root_squash: bool,
    /// Seconds the kernel may keep names and attributes while the mount hears every change
    /// other clients make (it drops what they change within milliseconds): a bound on how
    /// stale they get should a change go unheard (a metadata service restart, say).
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = parse_ttl)]
    pub attr_ttl_watched: f64,
    /// Seconds the kernel may keep names and attributes while changes of other clients are
    /// not heard of (with --no-watch, or while the metadata service is away).
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = parse_ttl)]
    pub attr_ttl: f64,
    /// Do not listen for other clients' changes: names and attributes are then kept for
    /// --attr-ttl only, and what other clients change shows once that runs out.
    #[arg(long)]
    pub no_watch: bool,
}

impl MountFlags {
    pub fn options(&self) -> stria_fuse::MountOptions {
        stria_fuse::MountOptions {
            writeback_cache: self.writeback_cache,
            root_squash: self.root_squash,
            threads: self.fuse_threads.map_or_else(stria_fuse::default_threads, usize::from),
            attr_ttl: Duration::from_secs_f64(self.attr_ttl),
            watched_attr_ttl: Duration::from_secs_f64(self.attr_ttl_watched),
            watch_changes: !self.no_watch,
            ..Default::default()
        }
    }
}

/// A cache timeout in seconds: 0 (no caching) to a day.
fn parse_ttl(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if (0.0..=86_400.0).contains(&seconds) => Ok(seconds),
        _ => Err(format!("`{text}` is not a number of seconds from 0 to 86400")),
    }
}

fn parse_level(text: &str) -> Result<Level, String> {
    let text = text.trim_start_matches("raid");
    text.parse()
}

const NODE_FORMAT: u32 = 1;
/// Five drives in RAID 5 with a 256 KiB unit make a 1 MiB data stripe: the default 1 MiB file
/// chunk is then exactly one full stripe, written without read-modify-write or journal.
const DRIVES_DEFAULT: usize = 5;
const DRIVE_BYTES_DEFAULT: u64 = 8 << 30;
const STRIPE_UNIT_DEFAULT: u64 = 256 << 10;

/// `DATA/node.json`: what the node is made of.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct NodeRecord {
    pub format: u32,
    pub targets: Vec<TargetRecord>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct TargetRecord {
    pub id: u32,
    pub pool: String,
    pub level: String,
    /// The array's drives in slot order: paths relative to the data directory (drive files
    /// under it) or absolute (drives elsewhere, block devices).
    pub drives: Vec<PathBuf>,
    /// Hot spares, written the same way (absent in records of older nodes).
    #[serde(default)]
    pub spares: Vec<PathBuf>,
}

/// `DATA/run.json`: where a running node listens, for the other commands.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct RunRecord {
    pub pid: u32,
    pub meta: SocketAddr,
    pub storage: SocketAddr,
    pub mount: Option<PathBuf>,
    /// The management service (absent in records of older nodes).
    #[serde(default)]
    pub mgmt: Option<SocketAddr>,
    /// The NBD gateway, when it runs.
    #[serde(default)]
    pub nbd: Option<SocketAddr>,
    /// The REST API and /metrics.
    #[serde(default)]
    pub api: Option<SocketAddr>,
}

impl NodeRecord {
    /// Reads `DATA/node.json`.
    pub fn load(data: &Path) -> Result<NodeRecord> {
        let path = data.join("node.json");
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "{} holds no node (no {}): create one with `stria up`",
                data.display(),
                path.display()
            )
        })?;
        let node: NodeRecord = serde_json::from_str(&text)
            .with_context(|| format!("{} is damaged", path.display()))?;
        if node.format != NODE_FORMAT {
            bail!("{} has format {}, this stria reads {NODE_FORMAT}", path.display(), node.format);
        }
        Ok(node)
    }

    /// Writes `DATA/node.json` atomically: a whole new file, synced, renamed over the old one,
    /// and the directory synced, so a crash leaves the old record or the new one.
    pub fn save(&self, data: &Path) -> Result<()> {
        use std::io::Write;
        let tmp = data.join("node.json.tmp");
        let mut file = std::fs::File::create(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        file.write_all(&serde_json::to_vec_pretty(self)?)?;
        file.sync_all().with_context(|| format!("cannot sync {}", tmp.display()))?;
        drop(file);
        std::fs::rename(&tmp, data.join("node.json"))
            .with_context(|| format!("cannot rename {} to node.json", tmp.display()))?;
        std::fs::File::open(data)
            .and_then(|dir| dir.sync_all())
            .with_context(|| format!("cannot sync {}", data.display()))?;
        Ok(())
    }
}

/// How a drive path is written in the record: relative to the data directory when it is
/// under it, absolute otherwise.
fn record_path(data: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(data).map_or_else(|_| path.to_path_buf(), Path::to_path_buf)
}

/// The record of a target after a drive change: `members` (by slot) and `spares` as the
/// storage service reports them. A slot with no drive attached (its drive was missing at
/// assembly) keeps the path the record had for it, so the drive is found again if it comes
/// back.
fn updated_drives(
    data: &Path,
    old: &TargetRecord,
    membership: &stria_storage::Membership,
) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut drives: Vec<PathBuf> = Vec::new();
    for (slot, member) in membership.members.iter().enumerate() {
        let path = match member {
            Some(path) => record_path(data, path),
            None => match old.drives.get(slot) {
                Some(path) => path.clone(),
                None => continue,
            },
        };
        if !drives.contains(&path) {
            drives.push(path);
        }
    }
    let mut spares: Vec<PathBuf> = Vec::new();
    for path in membership.spares.iter().map(|p| record_path(data, p)) {
        if !drives.contains(&path) && !spares.contains(&path) {
            spares.push(path);
        }
    }
    (drives, spares)
}

/// Keeps `DATA/node.json` in step with the drive changes the storage service makes while the
/// node runs (a replaced drive, a new spare, a spare that took a failed slot), so the next
/// start assembles the same arrays.
#[derive(Debug)]
pub struct NodeFileRecorder {
    pub data: PathBuf,
}

impl stria_storage::MembershipRecorder for NodeFileRecorder {
    fn record(
        &self,
        target: TargetId,
        membership: &stria_storage::Membership,
    ) -> std::result::Result<(), String> {
        let mut node = NodeRecord::load(&self.data).map_err(|e| format!("{e:#}"))?;
        let record = node
            .targets
            .iter_mut()
            .find(|t| t.id == target.0)
            .ok_or_else(|| format!("node.json has no target {target}"))?;
        let (drives, spares) = updated_drives(&self.data, record, membership);
        if record.drives == drives && record.spares == spares {
            return Ok(());
        }
        tracing::info!(%target, ?drives, ?spares, "recording the target's drives in node.json");
        record.drives = drives;
        record.spares = spares;
        node.save(&self.data).map_err(|e| format!("{e:#}"))
    }
}

/// `DATA/cluster-secret`: what every RPC connection to the node's services must prove.
pub fn secret_path(data: &Path) -> PathBuf {
    data.join("cluster-secret")
}

/// The cluster secret of the node on `data`, for commands that talk to it.
pub fn load_secret(data: &Path) -> Result<stria_rpc::ClusterSecret> {
    stria_rpc::ClusterSecret::load(&secret_path(data)).map_err(|e| {
        anyhow::anyhow!(
            "{e}: commands that talk to the node need its secret; run them as a user who can \
             read it (the node's owner or root)"
        )
    })
}

impl RunRecord {
    /// Reads the record of the node running on `data`.
    pub fn load(data: &Path) -> Result<RunRecord> {
        let path = data.join("run.json");
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "no node is running on {} (no {}): start one with `stria up`",
                data.display(),
                path.display()
            )
        })?;
        serde_json::from_str(&text).with_context(|| format!("{} is damaged", path.display()))
    }
}

pub fn run(args: UpArgs) -> Result<()> {
    let data = absolute(&args.data)?;
    std::fs::create_dir_all(data.join("logs"))
        .with_context(|| format!("cannot create the data directory {}", data.display()))?;
    let log_path = data.join("logs/stria.log");
    crate::init_file_logging(&log_path)?;
    interrupt::install();

    // A run record left behind means the last run did not stop cleanly.
    let crashed_before = data.join("run.json").exists();
    let node = load_or_create_node(&data, &args)?;
    let secret = stria_rpc::ClusterSecret::load_or_create(&secret_path(&data))?;
    let storage = crate::roles::open_storage(&data, &node)?;
    let pool_targets: Vec<TargetId> = storage.targets().map(|t| t.id).collect();

    std::fs::create_dir_all(data.join("meta"))?;
    let meta = crate::node::open_meta(&data.join("meta/namespace.redb"), &pool_targets)?;
    std::fs::create_dir_all(data.join("mgmt"))?;
    let registry = stria_mgmt::Registry::open(&data.join("mgmt/registry.redb"))?;
    if crashed_before {
        free_strays_after_a_crash(&meta, &registry, &storage)?;
    }
    let target_lines = target_lines(&node, &storage);

    let api_listener =
        if args.separate_roles { None } else { Some(crate::rest_role::bind(args.api_listen)?) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()).max(2))
        .max_blocking_threads(64)
        .thread_name("stria-rt")
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let servers = if args.separate_roles {
        // The roles open the targets and the namespace themselves: close them here first.
        meta.sync().context("syncing the namespace")?;
        storage.sync_all().context("syncing the targets")?;
        drop(meta);
        drop(storage);
        Servers::Separate(crate::roles::Roles::start(
            &data,
            args.read_cache,
            args.storage_listen,
            args.meta_listen,
        )?)
    } else {
        let meta_epoch = crate::epochs::take(&data, crate::epochs::Role::Meta)?;
        let storage_epoch = crate::epochs::take(&data, crate::epochs::Role::Storage)?;
        let storage = storage.with_epoch(storage_epoch);
        storage.set_read_cache_bytes(args.read_cache);
        let services = runtime.block_on(crate::node::serve(
            args.meta_listen,
            args.storage_listen,
            meta.clone(),
            storage.clone(),
            meta_epoch,
            &secret,
        ))?;
        Servers::InProcess { services, meta, storage, meta_epoch, storage_epoch }
    };
    let (meta_addr, storage_addr) = servers.addrs();
    let mut client_config = stria_client::ClientConfig::new(
        meta_addr,
        pool_targets.iter().map(|t| (*t, storage_addr)).collect(),
    )
    .with_secret(secret.clone());
    if args.separate_roles {
        // Requests made while a role restarts wait for it rather than fail.
        client_config.reconnect_wait = ROLE_RESTART_WAIT;
    }
    let client = stria_client::Client::new(runtime.handle().clone(), client_config);
    // Files that `stria mount`s killed with them open (unlinked meanwhile) lose their chunks
    // once those clients' sessions run out.
    client.start_expiring_clients();

    let pools: stria_mgmt::PoolResolver = {
        let targets = pool_targets.clone();
        Arc::new(move |pool: &str| if pool == "default" { targets.clone() } else { Vec::new() })
    };
    let mgmt = stria_mgmt::Mgmt::new(registry, client.clone(), pools)?;
    let mgmt_server = runtime
        .block_on(stria_rpc::Server::bind_with(
            args.mgmt_listen,
            crate::node::server_config(&secret),
        ))
        .map_err(|e| crate::node::bind_error(args.mgmt_listen, "management", "--mgmt-listen", e))?;
    let mgmt_addr = mgmt_server.local_addr();
    let mgmt_handle = mgmt_server.shutdown_handle();
    let mgmt_task = runtime.spawn({
        let service = Arc::new(stria_mgmt::MgmtRpc(mgmt.clone()));
        async move {
            if let Err(e) = mgmt_server.serve(service).await {
                tracing::error!(%e, "management server stopped");
            }
        }
    });
    let gateway = if args.no_nbd {
        None
    } else {
        let tls = match (&args.nbd_tls_cert, &args.nbd_tls_key) {
            (Some(cert), Some(key)) => Some(stria_nbd::TlsConfig {
                cert: absolute(cert)?,
                key: absolute(key)?,
                client_ca: args.nbd_tls_ca.as_deref().map(absolute).transpose()?,
                required: args.nbd_tls_required,
            }),
            _ => None,
        };
        let gateway = runtime.block_on(crate::gateway::NbdGateway::start(
            args.nbd_listen,
            client.clone(),
            tls,
        ))?;
        mgmt.set_gateway(gateway.clone())?;
        Some(gateway)
    };

    let mount_point = if args.no_mount {
        None
    } else {
        Some(args.mount.clone().map(|m| absolute(&m)).transpose()?.unwrap_or(data.join("mnt")))
    };
    let mount = match &mount_point {
        Some(path) => match mount_fs(client.clone(), path, &args.mount_flags.options()) {
            Ok(mount) => Some(mount),
            Err(reason) => {
                eprintln!("warning: not mounted: {reason:#}");
                eprintln!("         the native API keeps serving (meta {meta_addr})");
                None
            }
        },
        None => None,
    };
    let rest = match (&servers, api_listener) {
        (Servers::InProcess { services, storage, .. }, Some(api_listener)) => {
            Some(crate::rest_role::start(
                &runtime,
                api_listener,
                &data,
                &mgmt,
                storage,
                crate::rest_role::RequestCounters {
                    metadata: services.meta_ops.clone(),
                    mount: mount.as_ref().map(stria_fuse::Mount::requests),
                },
                crate::rest_role::RoleAddresses {
                    mgmt: mgmt_addr,
                    meta: meta_addr,
                    storage: storage_addr,
                    nbd: gateway.as_ref().map(|g| g.local_addr()),
                    mount: mount.as_ref().and(mount_point.clone()),
                },
            )?)
        }
        _ => None,
    };
    let run = RunRecord {
        pid: std::process::id(),
        meta: meta_addr,
        storage: storage_addr,
        mount: mount.as_ref().and(mount_point.clone()),
        mgmt: Some(mgmt_addr),
        nbd: gateway.as_ref().map(|g| g.local_addr()),
        api: rest.as_ref().map(|r| r.local_addr()),
    };
    std::fs::write(data.join("run.json"), serde_json::to_vec_pretty(&run)?)?;

    let rest_lines = match &rest {
        Some(rest) => rest.banner_lines(),
        None => vec![
            "  roles    storage and metadata in processes of their own (stria role), restarted \
             after a crash; no REST API or dashboard in this mode"
                .to_string(),
        ],
    };
    print_banner(&data, &target_lines, &run, &log_path, &rest_lines);
    if let Some(warning) = sparse_drives_warning(&data, &node) {
        eprintln!("warning: {warning}");
        tracing::warn!("{warning}");
    }
    let mut servers = servers;
    while !interrupt::requested() {
        std::thread::sleep(Duration::from_millis(100));
        if let Servers::Separate(roles) = &mut servers {
            // An unreadable registry stops the recovery: every volume's data would look stray.
            let volumes = || mgmt.registry().data_owners().context("listing volumes");
            let live = || client.open_file_sizes().into_iter().collect();
            if let Err(e) = roles.watch(volumes, live) {
                eprintln!("error: cannot restart the server roles: {e:#}");
                tracing::error!(error = %format!("{e:#}"), "cannot restart the server roles");
                interrupt::flag().store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }
    eprintln!("stopping: unmounting and syncing");
    let mut result = Ok(());
    if let Some(mount) = mount {
        if let Err(e) = mount.unmount() {
            result = Err(anyhow::anyhow!("unmount failed: {e}"));
        }
    }
    if let Some(rest) = rest {
        rest.shutdown(&runtime);
    }
    if let Some(gateway) = &gateway {
        runtime.block_on(gateway.shutdown());
    }
    mgmt_handle.shutdown();
    let _ = runtime.block_on(mgmt_task);
    drop(mgmt);
    // Removed files' chunks still queued go now, while the services still run.
    if let Err(e) = client.sync_meta() {
        tracing::warn!(%e, "removing the chunks of removed files at stop");
    }
    // The mount is gone with its opens and locks: the next run need not wait for it.
    if let Err(e) = client.goodbye() {
        tracing::warn!(%e, "telling the metadata service the node's own client stops");
    }
    drop(client);
    match servers {
        Servers::Separate(mut roles) => {
            runtime.shutdown_timeout(Duration::from_secs(5));
            roles.stop().context("stopping the server roles")?;
        }
        Servers::InProcess { services, meta, storage, meta_epoch, storage_epoch } => {
            runtime.block_on(services.shutdown());
            runtime.shutdown_timeout(Duration::from_secs(5));
            meta.record_clean_stop().context("syncing the namespace")?;
            storage.sync_all().context("syncing the targets")?;
            crate::epochs::hand_over(&data, crate::epochs::Role::Meta, meta_epoch)?;
            crate::epochs::hand_over(&data, crate::epochs::Role::Storage, storage_epoch)?;
        }
    }
    let _ = std::fs::remove_file(data.join("run.json"));
    eprintln!("stopped cleanly");
    result
}

/// How long a request of the mount, the gateway or the management service waits for a role
/// process that is being restarted (`--separate-roles`).
const ROLE_RESTART_WAIT: Duration = Duration::from_secs(60);

/// Where the node's storage and metadata services run.
enum Servers {
    /// In this process (the default).
    InProcess {
        services: crate::node::Services,
        meta: Arc<stria_meta::Meta>,
        storage: StorageService,
        meta_epoch: stria_proto::wire::Epoch,
        storage_epoch: stria_proto::wire::Epoch,
    },
    /// In role processes this one supervises (`--separate-roles`).
    Separate(crate::roles::Roles),
}

impl Servers {
    fn addrs(&self) -> (SocketAddr, SocketAddr) {
        match self {
            Servers::InProcess { services, .. } => (services.meta_addr, services.storage_addr),
            Servers::Separate(roles) => (roles.meta_addr(), roles.storage_addr()),
        }
    }
}

/// The drive files are sparse: they take host space as they fill. If they can grow by more
/// than the host file system has free, filling the node would make the host run out, and
/// drives that cannot write are failed (the target then refuses I/O). Says so, with the
/// figures, when that is the case.
fn sparse_drives_warning(data: &Path, node: &NodeRecord) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mut growth = 0u64;
    let mut on_host_fs = None;
    for record in &node.targets {
        for drive in record.drives.iter().chain(&record.spares) {
            let path = if drive.is_absolute() { drive.clone() } else { data.join(drive) };
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            if !meta.is_file() {
                continue;
            }
            growth += meta.len().saturating_sub(meta.blocks() * 512);
            on_host_fs.get_or_insert(path);
        }
    }
    let path = on_host_fs?;
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a valid NUL-terminated path and a zeroed statvfs for the kernel to fill.
    let free = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c_path.as_ptr(), &mut st) != 0 {
            return None;
        }
        st.f_bavail as u64 * st.f_frsize as u64
    };
    (growth > free).then(|| {
        format!(
            "the drive files can still grow by {} but their file system has {} free: if it \
             fills, drives that cannot write are failed; free space, or use smaller drives \
             (--drive-size) on a new node",
            format_bytes(growth),
            format_bytes(free)
        )
    })
}

/// After a crash, chunk data that no file or volume owns, or that lies past its file's end,
/// goes before anything can grow a file over it (see `fsck::free_strays`).
fn free_strays_after_a_crash(
    meta: &stria_meta::Meta,
    registry: &stria_mgmt::Registry,
    storage: &StorageService,
) -> Result<()> {
    let volumes = registry.data_owners().context("listing volumes")?;
    let targets: Vec<&stria_storage::Target> = storage.targets().map(|t| t.as_ref()).collect();
    let freed = crate::fsck::free_strays(meta, &volumes, &targets, &Default::default())
        .context("freeing the chunk data a crash left behind")?;
    if freed > 0 {
        tracing::info!(chunks = freed, "freed stray chunk data left by the last crash");
    }
    Ok(())
}

pub fn absolute(path: &Path) -> Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    Ok(std::env::current_dir().context("cannot read the current directory")?.join(path))
}

fn load_or_create_node(data: &Path, args: &UpArgs) -> Result<NodeRecord> {
    let record_path = data.join("node.json");
    if record_path.exists() {
        let text = std::fs::read_to_string(&record_path)?;
        let node: NodeRecord = serde_json::from_str(&text)
            .with_context(|| format!("{} is damaged", record_path.display()))?;
        if node.format != NODE_FORMAT {
            bail!(
                "{} has format {}, this stria reads {NODE_FORMAT}",
                record_path.display(),
                node.format
            );
        }
        if args.drives.is_some()
            || args.raid.is_some()
            || args.targets.is_some()
            || args.drive_size.is_some()
            || args.stripe_unit.is_some()
            || args.rated_tbw.is_some()
        {
            eprintln!(
                "note: {} already holds a node; its shape is kept (the shape options apply when creating)",
                data.display()
            );
        }
        return Ok(node);
    }
    create_node(data, args)
}

fn create_node(data: &Path, args: &UpArgs) -> Result<NodeRecord> {
    let drives = args.drives.unwrap_or(DRIVES_DEFAULT);
    let level = args.raid.unwrap_or(if drives == 2 { Level::Raid1 } else { Level::Raid5 });
    let targets = args.targets.unwrap_or(1);
    let drive_bytes = args.drive_size.unwrap_or(DRIVE_BYTES_DEFAULT);
    let stripe_unit = args.stripe_unit.unwrap_or(STRIPE_UNIT_DEFAULT);
    if targets == 0 || targets > 64 {
        return Err(usage("--targets must be between 1 and 64"));
    }
    let stripe_unit_bytes =
        u32::try_from(stripe_unit).map_err(|_| usage("--stripe-unit must be at most 1M"))?;
    std::fs::create_dir_all(data.join("drives"))?;
    let mut records = Vec::new();
    for t in 1..=targets as u32 {
        let paths: Vec<PathBuf> =
            (0..drives).map(|i| PathBuf::from(format!("drives/t{t}-d{i}.img"))).collect();
        let full: Vec<PathBuf> = paths.iter().map(|p| data.join(p)).collect();
        for path in &full {
            create_drive_file(path, drive_bytes)
                .with_context(|| format!("creating drive file {}", path.display()))?;
        }
        let devs = raid_cmd::open_drives(&full, &DriveOptions::default())?;
        let rated_tbw = args.rated_tbw.unwrap_or(0);
        let config = ArrayConfig { level, stripe_unit_bytes, rated_tbw, journal_bytes: None };
        // The drive files were created sparse a moment ago, so they read as zeros already:
        // no discard, and no pass over them to prove it.
        let fresh = CreateOptions { skip_discard: true, ..CreateOptions::default() };
        let array = Array::create(devs, &config, &fresh)
            .map_err(|e| usage(format!("cannot create target {t}: {e}")))?;
        let dir = data.join(format!("targets/{t}"));
        std::fs::create_dir_all(&dir)?;
        let engine = Engine::create(Arc::new(array), &dir, TargetId(t))
            .with_context(|| format!("creating target {t}'s chunk engine"))?;
        engine.sync()?;
        drop(engine);
        records.push(TargetRecord {
            id: t,
            pool: LayoutPolicy::default().pool,
            level: format!("{level}"),
            drives: paths,
            spares: Vec::new(),
        });
    }
    let node = NodeRecord { format: NODE_FORMAT, targets: records };
    // Written last: a node.json means the node was created completely.
    node.save(data)?;
    Ok(node)
}

pub fn open_target(data: &Path, record: &TargetRecord) -> Result<Target> {
    // Members and spares together: assembly tells them apart by their labels (a spare may
    // have taken a failed slot since the record was written).
    let paths: Vec<PathBuf> =
        record.drives.iter().chain(&record.spares).map(|p| data.join(p)).collect();
    // A node that was just killed holds its drive locks until the kernel has torn down its
    // io_uring instances, a moment after the process is gone: wait for them a little.
    let mut attempts = 0;
    let array = loop {
        match raid_cmd::assemble(&paths) {
            Ok(array) => break Arc::new(array),
            Err(e) if attempts < 100 && format!("{e:#}").contains("in use by another") => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e.context(format!("assembling target {}", record.id))),
        }
    };
    let engine = Engine::open(array.clone(), &data.join(format!("targets/{}", record.id)))
        .with_context(|| format!("opening target {}'s chunk engine", record.id))?;
    Ok(Target { id: TargetId(record.id), pool: record.pool.clone(), array, engine })
}

/// Mounts `client`'s file system at `path` (created if missing), first detaching the dead
/// mount a killed process may have left there.
pub fn mount_fs(
    client: stria_client::Client,
    path: &Path,
    options: &stria_fuse::MountOptions,
) -> Result<stria_fuse::Mount> {
    if !Path::new("/dev/fuse").exists() {
        bail!(
            "/dev/fuse does not exist: load the fuse module (modprobe fuse) or give the container the device (--device /dev/fuse)"
        );
    }
    clear_stale_mount(path, false);
    std::fs::create_dir_all(path)
        .with_context(|| format!("cannot create the mount point {}", path.display()))?;
    let mut mounted = stria_fuse::mount(client.clone(), path, options);
    if let Err(e) = &mounted
        && e.raw_os_error() == Some(libc::ENOTCONN)
    {
        // The dead mount of a killed node was still being torn down a moment ago.
        clear_stale_mount(path, true);
        std::thread::sleep(Duration::from_millis(200));
        mounted = stria_fuse::mount(client, path, options);
    }
    mounted.map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
            " (mounting needs root, or fusermount3 from the fuse3 package for other users)"
        } else {
            ""
        };
        anyhow::anyhow!("cannot mount at {}: {e}{hint}", path.display())
    })
}

/// A node killed with -9 leaves its mount behind ("transport endpoint is not connected");
/// detach it so the new node can mount in its place.
fn clear_stale_mount(path: &Path, known_dead: bool) {
    let listed = std::fs::read_to_string("/proc/self/mounts").is_ok_and(|mounts| {
        let want = path.display().to_string();
        mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
    });
    // The kernel may answer a stat from cached attributes: `known_dead` says the mount itself
    // failed with "not connected".
    let dead = known_dead
        || matches!(std::fs::metadata(path), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN));
    if listed && dead {
        let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
            return;
        };
        // SAFETY: a valid NUL-terminated path; umount2 has no other preconditions.
        let rc = unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) };
        if rc == 0 {
            eprintln!("note: detached the stale mount left at {}", path.display());
        }
    }
}

/// One banner line per target: id, level, drives, usable space, state.
fn target_lines(node: &NodeRecord, storage: &StorageService) -> Vec<String> {
    storage
        .targets()
        .map(|target| {
            let record = node.targets.iter().find(|r| r.id == target.id.0);
            let space = target.engine.space();
            format!(
                "  target   {} {} over {} drives, {} usable, {}",
                target.id,
                record.map_or("?", |r| r.level.as_str()),
                record.map_or(0, |r| r.drives.len()),
                format_bytes(space.total_bytes),
                target.info().state
            )
        })
        .collect()
}

fn print_banner(
    data: &Path,
    target_lines: &[String],
    run: &RunRecord,
    log_path: &Path,
    rest_lines: &[String],
) {
    println!("stria is up");
    match &run.mount {
        Some(mount) => println!("  mount    {}", mount.display()),
        None => println!("  mount    (none)"),
    }
    println!("  data     {}", data.display());
    for line in target_lines {
        println!("{line}");
    }
    println!("  logs     {}", log_path.display());
    println!("  meta     {}   storage {}", run.meta, run.storage);
    println!(
        "  secret   {} (RPC peers and the CLI prove they hold it)",
        secret_path(data).display()
    );
    if let Some(mgmt) = run.mgmt {
        println!("  mgmt     {mgmt}   (stria volume / export / initiator talk to it)");
    }
    if let Some(nbd) = run.nbd {
        println!("  nbd      nbd://{nbd}/EXPORT");
    }
    for line in rest_lines {
        println!("{line}");
    }
    println!("Ctrl-C or SIGTERM stops the node and unmounts cleanly.");
}

#[cfg(test)]
mod tests {
    use super::*;
    use stria_storage::Membership;

    fn target(drives: &[&str], spares: &[&str]) -> TargetRecord {
        TargetRecord {
            id: 1,
            pool: "default".into(),
            level: "raid5".into(),
            drives: drives.iter().map(PathBuf::from).collect(),
            spares: spares.iter().map(PathBuf::from).collect(),
        }
    }

    fn paths(list: &[&str]) -> Vec<PathBuf> {
        list.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn the_record_follows_replacements_and_spares() {
        let data = Path::new("/data");
        let old = target(&["drives/t1-d0.img", "drives/t1-d1.img", "drives/t1-d2.img"], &[]);
        // Slot 1 replaced by a new file under DATA/drives, a spare on a block device.
        let now = Membership {
            members: vec![
                Some("/data/drives/t1-d0.img".into()),
                Some("/data/drives/new.img".into()),
                Some("/data/drives/t1-d2.img".into()),
            ],
            spares: vec!["/dev/nvme3n1".into()],
        };
        assert_eq!(
            updated_drives(data, &old, &now),
            (
                paths(&["drives/t1-d0.img", "drives/new.img", "drives/t1-d2.img"]),
                paths(&["/dev/nvme3n1"])
            )
        );
        // The spare took slot 2; a pending drive listed twice is recorded once, as a member.
        let now = Membership {
            members: vec![Some("/data/drives/t1-d0.img".into()), None, Some("/dev/nvme3n1".into())],
            spares: vec!["/dev/nvme3n1".into()],
        };
        let old =
            target(&["drives/t1-d0.img", "drives/gone.img", "drives/t1-d2.img"], &["/dev/nvme3n1"]);
        assert_eq!(
            updated_drives(data, &old, &now),
            (paths(&["drives/t1-d0.img", "drives/gone.img", "/dev/nvme3n1"]), paths(&[])),
            "a slot without a drive keeps its recorded path for when the drive comes back"
        );
    }

    #[test]
    fn records_of_older_nodes_without_spares_still_load() {
        let text = r#"{"format":1,"targets":[{"id":1,"pool":"default","level":"raid5",
            "drives":["drives/t1-d0.img","drives/t1-d1.img"]}]}"#;
        let node: NodeRecord = serde_json::from_str(text).expect("an old record loads");
        assert!(node.targets[0].spares.is_empty());
    }

    #[test]
    fn sparse_drives_that_can_outgrow_the_host_file_system_are_reported() {
        let dir = std::env::temp_dir().join(format!("stria-sparse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch");
        let small = std::fs::File::create(dir.join("small.img")).expect("small");
        small.set_len(1 << 20).expect("1 MiB sparse");
        let node = |drives: &[&str]| NodeRecord { format: 1, targets: vec![target(drives, &[])] };
        assert_eq!(sparse_drives_warning(&dir, &node(&["small.img"])), None);
        // Sparse far past any free space this machine has: no blocks, all growth.
        let huge = std::fs::File::create(dir.join("huge.img")).expect("huge");
        huge.set_len(1 << 43).expect("8 TiB sparse");
        let warning =
            sparse_drives_warning(&dir, &node(&["small.img", "huge.img"])).expect("a warning");
        assert!(warning.contains("can still grow by") && warning.contains("free"), "{warning}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
