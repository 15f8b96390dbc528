//! The server roles of a node as processes of their own.
//!
//! `stria up` runs every role in one process. With `--separate-roles` it runs the storage role
//! and the metadata role as child processes (`stria role storage`, `stria role meta`) and keeps
//! the client-side roles (mount, NBD gateway, management) itself, as a supervisor: when a role
//! process dies, it stops the other one cleanly, frees what the crash left behind (as `stria
//! up` does after a crash of the whole node) and starts both again. The mount stays up
//! throughout; requests made while a role is down fail, and a sync that follows a crash which
//! lost acknowledged changes fails with EIO (see `stria_proto::wire::Epoch`).
//!
//! Each role writes `DATA/roles/ROLE.json` (pid, address) once it serves, and removes it at a
//! clean stop; the supervisor waits for it. Children die with the supervisor
//! (`PR_SET_PDEATHSIG`), so a kill -9 of the node takes every role at once.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use stria_proto::fs::TargetId;
use stria_storage::{DriveAdmin, StorageService};

use crate::epochs::{self, Role};
use crate::interrupt;
use crate::up::{NodeFileRecorder, NodeRecord};

/// How long a role may take to start serving.
const START_LIMIT: Duration = Duration::from_secs(120);
/// How long a role may take to stop after SIGTERM before it is killed.
const STOP_LIMIT: Duration = Duration::from_secs(60);
/// How long the drives of a killed storage role may stay locked (the kernel tears down its
/// I/O after the process is gone).
const DRIVE_RELEASE_LIMIT: Duration = Duration::from_secs(10);

/// Run one server role of a node in this process (what `stria up --separate-roles` starts).
#[derive(Args, Debug)]
pub struct RoleArgs {
    #[command(subcommand)]
    role: RoleCommand,
}

#[derive(Subcommand, Debug)]
enum RoleCommand {
    /// The storage role: the node's targets (RAID arrays and chunk engines) on the storage
    /// RPC service.
    Storage(StorageRoleArgs),
    /// The metadata role: the namespace on the metadata RPC service.
    Meta(MetaRoleArgs),
}

#[derive(Args, Debug)]
struct StorageRoleArgs {
    /// The node's data directory (made by `stria up`).
    #[arg(long)]
    data: PathBuf,
    /// Address of the storage service (port 0 picks a free port).
    #[arg(long)]
    listen: SocketAddr,
    /// Memory for the read cache of small-I/O blocks, shared by the targets (0 = none).
    #[arg(long, value_parser = crate::units::parse_size, default_value = "1G")]
    read_cache: u64,
}

#[derive(Args, Debug)]
struct MetaRoleArgs {
    /// The node's data directory (made by `stria up`).
    #[arg(long)]
    data: PathBuf,
    /// Address of the metadata service (port 0 picks a free port).
    #[arg(long)]
    listen: SocketAddr,
    /// Address of the storage service, asked for the capacity that statfs reports.
    #[arg(long)]
    storage: SocketAddr,
}

/// What a serving role records for its supervisor.
#[derive(Debug, Serialize, Deserialize)]
struct RoleRecord {
    pid: u32,
    addr: SocketAddr,
}

fn record_path(data: &Path, role: Role) -> PathBuf {
    data.join("roles").join(format!("{}.json", role.name()))
}

fn write_record(data: &Path, role: Role, addr: SocketAddr) -> Result<()> {
    let path = record_path(data, role);
    std::fs::create_dir_all(path.parent().expect("in a directory"))?;
    let partial = path.with_extension("new");
    let record = RoleRecord { pid: std::process::id(), addr };
    std::fs::write(&partial, serde_json::to_vec_pretty(&record)?)?;
    std::fs::rename(&partial, &path)
        .with_context(|| format!("cannot write the role record {}", path.display()))
}

/// The pid of the process serving `role` for the node on `data`, from its role record.
pub fn serving_pid(data: &Path, role: Role) -> Option<u32> {
    let bytes = std::fs::read(record_path(data, role)).ok()?;
    serde_json::from_slice::<RoleRecord>(&bytes).ok().map(|r| r.pid)
}

pub fn run(args: RoleArgs) -> Result<()> {
    match args.role {
        RoleCommand::Storage(a) => run_storage(a),
        RoleCommand::Meta(a) => run_meta(a),
    }
}

fn role_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()).max(2))
        .max_blocking_threads(64)
        .thread_name("stria-role")
        .enable_all()
        .build()
        .context("cannot start the runtime")
}

fn start_role(data: &Path, role: Role) -> Result<(PathBuf, stria_rpc::ClusterSecret, NodeRecord)> {
    let data = crate::up::absolute(data)?;
    std::fs::create_dir_all(data.join("logs"))?;
    crate::init_file_logging(&data.join("logs").join(format!("{}.log", role.name())))?;
    interrupt::install();
    let secret = crate::up::load_secret(&data)?;
    let node = NodeRecord::load(&data)?;
    Ok((data, secret, node))
}

/// Opens every target of the node, waiting while a killed process's I/O still holds drives.
pub fn open_storage(data: &Path, node: &NodeRecord) -> Result<StorageService> {
    let mut targets = Vec::new();
    for record in &node.targets {
        let started = Instant::now();
        let target = loop {
            match crate::up::open_target(data, record) {
                Ok(target) => break target,
                Err(e)
                    if format!("{e:#}").contains("in use by another")
                        && started.elapsed() < DRIVE_RELEASE_LIMIT =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        };
        targets.push(target);
    }
    Ok(StorageService::new(targets).with_drive_admin(DriveAdmin {
        drive_dir: data.join("drives"),
        reserved_dirs: vec![data.to_path_buf()],
        recorder: Arc::new(NodeFileRecorder { data: data.to_path_buf() }),
    }))
}

fn run_storage(args: StorageRoleArgs) -> Result<()> {
    let (data, secret, node) = start_role(&args.data, Role::Storage)?;
    let storage = open_storage(&data, &node)?;
    let epoch = epochs::take(&data, Role::Storage)?;
    let storage = storage.with_epoch(epoch);
    storage.set_read_cache_bytes(args.read_cache);
    let runtime = role_runtime()?;
    let serving =
        runtime.block_on(crate::node::serve_storage(args.listen, storage.clone(), &secret))?;
    serve_until_stopped(&data, Role::Storage, epoch, runtime, serving, || {
        storage.sync_all().context("syncing the targets")
    })
}

/// Records the serving role for its supervisor, serves until SIGTERM or Ctrl-C, then stops
/// the server, makes the role's state durable with `sync` and hands its epoch over.
fn serve_until_stopped(
    data: &Path,
    role: Role,
    epoch: stria_proto::wire::Epoch,
    runtime: tokio::runtime::Runtime,
    serving: crate::node::Serving,
    sync: impl FnOnce() -> Result<()>,
) -> Result<()> {
    write_record(data, role, serving.addr)?;
    tracing::info!(addr = %serving.addr, epoch, "{} role serving", role.name());
    while !interrupt::requested() {
        std::thread::sleep(Duration::from_millis(100));
    }
    runtime.block_on(serving.shutdown());
    runtime.shutdown_timeout(Duration::from_secs(5));
    sync()?;
    epochs::hand_over(data, role, epoch)?;
    let _ = std::fs::remove_file(record_path(data, role));
    tracing::info!("{} role stopped cleanly", role.name());
    Ok(())
}

fn run_meta(args: MetaRoleArgs) -> Result<()> {
    let (data, secret, node) = start_role(&args.data, Role::Meta)?;
    let pool: Vec<TargetId> = node.targets.iter().map(|t| TargetId(t.id)).collect();
    let meta = crate::node::open_meta(&data.join("meta/namespace.redb"), &pool)?;
    let epoch = epochs::take(&data, Role::Meta)?;
    let runtime = role_runtime()?;

    // statfs reports the targets' space, asked of the storage role every second.
    let space = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let client = stria_client::Client::new(
        runtime.handle().clone(),
        stria_client::ClientConfig::new(
            args.listen,
            pool.iter().map(|t| (*t, args.storage)).collect(),
        )
        .with_secret(secret.clone()),
    );
    {
        let space = space.clone();
        std::thread::Builder::new().name("capacity".into()).spawn(move || {
            while !interrupt::requested() {
                if let Ok(targets) = client.targets() {
                    let total = targets.iter().map(|t| t.bytes_total).sum();
                    let used: u64 = targets.iter().map(|t| t.bytes_used).sum();
                    space.0.store(total, Relaxed);
                    space.1.store(total - used.min(total), Relaxed);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })?;
    }
    let capacity: stria_meta::service::CapacitySource =
        Arc::new(move || (space.0.load(Relaxed), space.1.load(Relaxed)));
    let (serving, _ops) = runtime.block_on(crate::node::serve_meta(
        args.listen,
        meta.clone(),
        capacity,
        epoch,
        &secret,
    ))?;
    serve_until_stopped(&data, Role::Meta, epoch, runtime, serving, || {
        meta.record_clean_stop().context("syncing the namespace")
    })
}

/// One role process the supervisor runs.
#[derive(Debug)]
struct RoleProcess {
    role: Role,
    child: Child,
    addr: SocketAddr,
}

/// The storage and metadata role processes of a node, started and watched by `stria up
/// --separate-roles`.
#[derive(Debug)]
pub struct Roles {
    data: PathBuf,
    read_cache: u64,
    storage_listen: SocketAddr,
    meta_listen: SocketAddr,
    storage: Option<RoleProcess>,
    meta: Option<RoleProcess>,
    /// Role processes that died and were recovered from, since the start.
    pub restarts: u64,
}

impl Roles {
    /// Starts the storage role, then the metadata role. A port 0 is replaced by the port the
    /// role picked, so a restart serves on the same address.
    pub fn start(
        data: &Path,
        read_cache: u64,
        storage_listen: SocketAddr,
        meta_listen: SocketAddr,
    ) -> Result<Roles> {
        let mut roles = Roles {
            data: data.to_path_buf(),
            read_cache,
            storage_listen,
            meta_listen,
            storage: None,
            meta: None,
            restarts: 0,
        };
        roles.spawn_both()?;
        Ok(roles)
    }

    pub fn storage_addr(&self) -> SocketAddr {
        self.storage.as_ref().map_or(self.storage_listen, |p| p.addr)
    }

    pub fn meta_addr(&self) -> SocketAddr {
        self.meta.as_ref().map_or(self.meta_listen, |p| p.addr)
    }

    fn spawn_both(&mut self) -> Result<()> {
        let cache = self.read_cache.to_string();
        let storage = self.spawn(Role::Storage, self.storage_listen, &["--read-cache", &cache])?;
        self.storage_listen = storage.addr;
        let storage_addr = storage.addr.to_string();
        self.storage = Some(storage);
        let meta = self.spawn(Role::Meta, self.meta_listen, &["--storage", &storage_addr])?;
        self.meta_listen = meta.addr;
        self.meta = Some(meta);
        Ok(())
    }

    fn spawn(&self, role: Role, listen: SocketAddr, extra: &[&str]) -> Result<RoleProcess> {
        let record = record_path(&self.data, role);
        let _ = std::fs::remove_file(&record);
        let exe = std::env::current_exe().context("cannot find this program to start a role")?;
        let mut command = Command::new(exe);
        command
            .args(["role", role.name(), "--data"])
            .arg(&self.data)
            .args(["--listen", &listen.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: prctl is async-signal-safe; it only asks the kernel to kill the child when
        // this process dies, so a kill -9 of the node takes its roles with it.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child =
            command.spawn().with_context(|| format!("cannot start the {} role", role.name()))?;
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "the {} role exited at its start ({status}); see {}",
                    role.name(),
                    self.data.join("logs").join(format!("{}.log", role.name())).display()
                );
            }
            let found = std::fs::read(&record)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<RoleRecord>(&bytes).ok())
                .filter(|r| r.pid == child.id());
            if let Some(found) = found {
                return Ok(RoleProcess { role, child, addr: found.addr });
            }
            if started.elapsed() > START_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the {} role did not start serving within {START_LIMIT:?}", role.name());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Checks the role processes; if one died, stops the other, recovers and starts both
    /// again. Returns the role that died, if one did.
    pub fn watch(
        &mut self,
        volumes: impl Fn() -> Result<Vec<stria_mgmt::VolumeRecord>>,
        live_sizes: impl Fn() -> std::collections::BTreeMap<stria_proto::fs::Ino, u64>,
    ) -> Result<Option<Role>> {
        let mut died = None;
        for process in [self.storage.as_mut(), self.meta.as_mut()].into_iter().flatten() {
            if let Some(status) = process.child.try_wait()? {
                died = Some((process.role, status));
                break;
            }
        }
        let Some((role, status)) = died else {
            return Ok(None);
        };
        eprintln!(
            "the {} role died ({status}); restarting the server roles after recovery",
            role.name()
        );
        tracing::error!(role = role.name(), %status, "role process died; recovering");
        self.stop()?;
        // Taken with both roles stopped: no write of the client can land after it.
        self.recover(&volumes()?, &live_sizes())?;
        self.spawn_both()?;
        self.restarts += 1;
        eprintln!("the server roles serve again");
        tracing::info!(restarts = self.restarts, "server roles restarted");
        Ok(Some(role))
    }

    /// What a crash of either role can leave: chunk data no file or volume owns, or past its
    /// file's end (see `fsck::free_strays`), not counting what the surviving client wrote up
    /// to the sizes it has not published yet (`live_sizes`: its data, synced or not, whose
    /// size a dead metadata role may have lost or never got). If any is freed, the storage
    /// role comes back under a new epoch: a client's unsynced data may have been among it.
    fn recover(
        &self,
        volumes: &[stria_mgmt::VolumeRecord],
        live_sizes: &std::collections::BTreeMap<stria_proto::fs::Ino, u64>,
    ) -> Result<()> {
        let node = NodeRecord::load(&self.data)?;
        let storage = open_storage(&self.data, &node)?;
        let pool: Vec<TargetId> = node.targets.iter().map(|t| TargetId(t.id)).collect();
        let meta = crate::node::open_meta(&self.data.join("meta/namespace.redb"), &pool)?;
        let targets: Vec<&stria_storage::Target> = storage.targets().map(|t| t.as_ref()).collect();
        let freed = crate::fsck::free_strays(&meta, volumes, &targets, live_sizes)
            .context("freeing the chunk data a crashed role left behind")?;
        drop(targets);
        meta.sync().context("syncing the namespace")?;
        storage.sync_all().context("syncing the targets")?;
        drop(meta);
        drop(storage);
        if freed > 0 {
            tracing::info!(chunks = freed, "freed stray chunk data left by the crashed role");
            epochs::take(&self.data, Role::Storage)?;
        }
        Ok(())
    }

    /// Stops both roles cleanly (SIGTERM; SIGKILL past [`STOP_LIMIT`]).
    pub fn stop(&mut self) -> Result<()> {
        let mut result = Ok(());
        // The metadata role first: it asks the storage role for capacity.
        for process in [self.meta.take(), self.storage.take()].into_iter().flatten() {
            if let Err(e) = stop_process(process) {
                result = Err(e);
            }
        }
        result
    }
}

fn stop_process(mut process: RoleProcess) -> Result<()> {
    if process.child.try_wait()?.is_some() {
        return Ok(());
    }
    // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
    unsafe { libc::kill(process.child.id() as i32, libc::SIGTERM) };
    let started = Instant::now();
    loop {
        if let Some(status) = process.child.try_wait()? {
            if !status.success() {
                bail!("the {} role stopped with {status}", process.role.name());
            }
            return Ok(());
        }
        if started.elapsed() > STOP_LIMIT {
            let _ = process.child.kill();
            let _ = process.child.wait();
            bail!("the {} role did not stop within {STOP_LIMIT:?}; killed", process.role.name());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
