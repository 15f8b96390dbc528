//! Commands that talk to a running node: `df`, `getstripe`, `setstripe`, `target` (fail,
//! replace a drive, add a spare).

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use stria_client::{Client, ClientConfig, DriveChangeError};
use stria_proto::fs::{CHUNK_BYTES_DEFAULT, FsStatus, LayoutPolicy, TargetId};
use stria_proto::wire::{Caller, FileKind};
use stria_rpc::ClusterSecret;

use crate::units::{format_bytes, parse_size};
use crate::up::RunRecord;
use crate::usage;

/// Which node: the data directory `stria up` runs on.
#[derive(Args, Debug, Clone)]
pub struct NodeArgs {
    /// The data directory of the running node (as given to `stria up`).
    #[arg(long, default_value = "stria-data")]
    pub data: PathBuf,
}

/// A client of the node running on `data`, with its own small runtime.
pub struct NodeClient {
    pub client: Client,
    _runtime: tokio::runtime::Runtime,
}

impl NodeClient {
    pub fn connect(node: &NodeArgs) -> Result<NodeClient> {
        let run = RunRecord::load(&node.data)?;
        let secret = crate::up::load_secret(&node.data)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("cannot start the runtime")?;
        let config = node_config(runtime.handle(), run.meta, run.storage, secret)
            .map_err(|e| unreachable_node(&run, e))?;
        let client = Client::new(runtime.handle().clone(), config);
        Ok(NodeClient { client, _runtime: runtime })
    }
}

/// The client configuration for the node whose services listen at `meta` and `storage`.
/// Every target of a single node is served by its one storage service, whose listing gives
/// the target ids; fails as that listing does (`Access` for a wrong secret).
pub fn node_config(
    runtime: &tokio::runtime::Handle,
    meta: SocketAddr,
    storage: SocketAddr,
    secret: ClusterSecret,
) -> Result<ClientConfig, FsStatus> {
    let probe = Client::new(
        runtime.clone(),
        ClientConfig::new(meta, vec![(TargetId(0), storage)]).with_secret(secret.clone()),
    );
    let targets = probe.targets()?;
    let routes = targets.iter().map(|t| (t.target, storage)).collect();
    Ok(ClientConfig::new(meta, routes).with_secret(secret))
}

fn unreachable_node(run: &RunRecord, e: FsStatus) -> anyhow::Error {
    if e == FsStatus::Access {
        return anyhow::anyhow!(
            "the node (pid {}) at {} refused this command's cluster secret: the data \
             directory's cluster-secret differs from the one the node started with",
            run.pid,
            run.storage
        );
    }
    anyhow::anyhow!(
        "the node (pid {}) does not answer at {}: {e}; is `stria up` still running?",
        run.pid,
        run.storage
    )
}

pub fn df(node: NodeArgs) -> Result<()> {
    let node = NodeClient::connect(&node)?;
    let targets = node.client.targets()?;
    let statfs = node.client.statfs()?;
    println!(
        "{:<8} {:<10} {:<8} {:<18} {:>10} {:>10} {:>10} {:>5}",
        "TARGET", "POOL", "RAID", "STATE", "SIZE", "USED", "AVAIL", "USE%"
    );
    for t in &targets {
        let avail = t.bytes_total.saturating_sub(t.bytes_used);
        println!(
            "{:<8} {:<10} {:<8} {:<18} {:>10} {:>10} {:>10} {:>4}%",
            t.target.to_string(),
            t.pool,
            t.raid,
            t.state,
            format_bytes(t.bytes_total),
            format_bytes(t.bytes_used),
            format_bytes(avail),
            percent(t.bytes_used, t.bytes_total)
        );
    }
    let used = statfs.bytes_total.saturating_sub(statfs.bytes_free);
    println!(
        "{:<8} {:<10} {:<8} {:<18} {:>10} {:>10} {:>10} {:>4}%",
        "total",
        "",
        "",
        format!("{} targets", targets.len()),
        format_bytes(statfs.bytes_total),
        format_bytes(used),
        format_bytes(statfs.bytes_free),
        percent(used, statfs.bytes_total)
    );
    println!("inodes: {} used of {}", statfs.files_used, statfs.files_total);
    Ok(())
}

fn percent(part: u64, whole: u64) -> u64 {
    if whole == 0 { 0 } else { part * 100 / whole }
}

/// The inode number of a path inside a Stria mount (FUSE reports our numbers as st_ino).
fn ino_of(path: &Path) -> Result<(u64, bool)> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
    Ok((meta.ino(), meta.is_dir()))
}

#[derive(Args, Debug)]
pub struct GetStripeArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Files or directories inside the Stria mount.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

pub fn getstripe(args: GetStripeArgs) -> Result<()> {
    let node = NodeClient::connect(&args.node)?;
    for path in &args.paths {
        let (ino, is_dir) = ino_of(path)?;
        println!("{}", path.display());
        if is_dir {
            let policy = node.client.layout_policy(ino)?;
            let count = if policy.stripe_count == 0 {
                "all targets".to_string()
            } else {
                policy.stripe_count.to_string()
            };
            println!("  default layout of new files:");
            println!(
                "  stripe_count: {count}  stripe_size: {}  pool: {}",
                policy.chunk_bytes, policy.pool
            );
            continue;
        }
        let attr = node.client.getattr(ino)?;
        match (&attr.kind, &attr.layout) {
            (FileKind::File, Some(layout)) => {
                println!(
                    "  stripe_count: {}  stripe_size: {}  pool: {}",
                    layout.targets.len(),
                    layout.chunk_bytes,
                    layout.pool
                );
                let list: Vec<String> = layout.targets.iter().map(|t| t.to_string()).collect();
                println!("  targets: {}", list.join(" "));
            }
            (FileKind::File, None) => {
                println!("  inline: the {} bytes live inside the inode (up to 3 KiB)", attr.size)
            }
            _ => println!("  not a regular file: no layout"),
        }
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct SetStripeArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Targets to stripe over (0 = every target of the pool).
    #[arg(short = 'c', long = "stripe-count")]
    pub stripe_count: Option<u32>,
    /// Bytes per target in round robin (a power of two, 64K..16M).
    #[arg(short = 'S', long = "stripe-size", value_parser = parse_size)]
    pub stripe_size: Option<u64>,
    /// The pool new files draw their targets from.
    #[arg(short = 'p', long)]
    pub pool: Option<String>,
    /// A directory (sets the default of new files under it) or a file, created empty if it
    /// does not exist (gets this layout; an existing file must be empty).
    pub path: PathBuf,
}

pub fn setstripe(args: SetStripeArgs) -> Result<()> {
    let node = NodeClient::connect(&args.node)?;
    if !args.path.exists() {
        std::fs::File::create(&args.path)
            .with_context(|| format!("cannot create {}", args.path.display()))?;
    }
    let (ino, is_dir) = ino_of(&args.path)?;
    let current = if is_dir { node.client.layout_policy(ino)? } else { LayoutPolicy::default() };
    let chunk_bytes = match args.stripe_size {
        Some(size) => u32::try_from(size).map_err(|_| usage("--stripe-size is at most 16M"))?,
        None if is_dir => current.chunk_bytes,
        None => CHUNK_BYTES_DEFAULT,
    };
    let policy = LayoutPolicy {
        pool: args.pool.unwrap_or(current.pool),
        chunk_bytes,
        stripe_count: args.stripe_count.unwrap_or(current.stripe_count),
    };
    // SAFETY: getuid/getgid have no preconditions.
    let caller = Caller {
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
        groups: Vec::new(),
    };
    let result = if is_dir {
        node.client.set_layout_policy(&caller, ino, policy)
    } else {
        node.client.set_file_layout(&caller, ino, policy)
    };
    result.map_err(|e| match e {
        FsStatus::Invalid => usage("invalid layout: the stripe size must be a power of two from 64K to 16M, the count at most 256"),
        FsStatus::Busy | FsStatus::Exists => anyhow::anyhow!("{} already has data: its layout is fixed (copy it to a new file instead)", args.path.display()),
        other => anyhow::anyhow!("setstripe {}: {other}", args.path.display()),
    })
}

#[derive(Subcommand, Debug)]
pub enum TargetCommand {
    /// Mark one drive of a running target failed: the target goes degraded and keeps serving.
    FailDrive(FailDriveArgs),
    /// Put a new drive (or the slot's own drive, returning) into a failed slot of a running
    /// target: it rebuilds in the background while the target keeps serving, and the node
    /// records it in DATA/node.json so a restart assembles it.
    ReplaceDrive(ReplaceDriveArgs),
    /// Label a drive as a hot spare of a running target: it takes the place of the next drive
    /// that fails (at once, if a slot is out already). Recorded in DATA/node.json.
    AddSpare(AddSpareArgs),
}

/// How to name the drive for `replace-drive` and `add-spare`.
const DRIVE_PATH_HELP: &str = "An absolute path (a drive file or a block device), a bare file \
    name (meaning DATA/drives/NAME on the node), or a relative path with a directory part \
    (./new.img, taken from the current directory)";

#[derive(Args, Debug)]
pub struct ReplaceDriveArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// The target (as `stria df` lists it, without the `t`).
    #[arg(long)]
    pub target: u32,
    /// The failed slot to fill (0-based).
    #[arg(long)]
    pub slot: u32,
    /// The new drive.
    #[arg(long = "with", value_name = "PATH", long_help = DRIVE_PATH_HELP)]
    pub with: PathBuf,
    /// Create the drive file first, sparse, of this size (e.g. 8G); it must not exist yet.
    /// Without it the drive must exist.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub size: Option<u64>,
}

#[derive(Args, Debug)]
pub struct AddSpareArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// The target (as `stria df` lists it, without the `t`).
    #[arg(long)]
    pub target: u32,
    /// The drive to label as a hot spare.
    #[arg(value_name = "PATH", long_help = DRIVE_PATH_HELP)]
    pub path: PathBuf,
    /// Create the drive file first, sparse, of this size (e.g. 8G); it must not exist yet.
    /// Without it the drive must exist.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub size: Option<u64>,
}

/// The drive path to send to the node: absolute paths and bare file names as they are (the
/// node puts bare names in DATA/drives), other relative paths made absolute here.
fn drive_path(path: &Path) -> Result<String> {
    let bare = path.components().count() == 1
        && matches!(path.components().next(), Some(std::path::Component::Normal(_)));
    let path = if path.is_absolute() || bare {
        path.to_path_buf()
    } else {
        let absolute =
            std::env::current_dir().context("cannot read the current directory")?.join(path);
        // The parent is resolved so `../x.img` names a real place (the node refuses `..`).
        match (absolute.parent().map(Path::canonicalize), absolute.file_name()) {
            (Some(Ok(parent)), Some(name)) => parent.join(name),
            _ => absolute,
        }
    };
    path.to_str().map(str::to_string).ok_or_else(|| {
        usage(format!("{} is not valid UTF-8: give a drive path in UTF-8", path.display()))
    })
}

/// A refused drive change as a CLI error: bad arguments are usage errors (exit 2).
fn drive_change_error(e: DriveChangeError, target: u32) -> anyhow::Error {
    match e.status {
        FsStatus::Stale => usage(format!("no target {target} on this node (see `stria df`)")),
        FsStatus::Invalid | FsStatus::NotFound | FsStatus::Exists => usage(e.message),
        _ => anyhow::anyhow!("refused: {}", e.message),
    }
}

#[derive(Args, Debug)]
pub struct FailDriveArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// The target (as `stria df` lists it, without the `t`).
    #[arg(long)]
    pub target: u32,
    /// The drive's slot in the target's array.
    #[arg(long)]
    pub slot: u32,
}

pub fn target(command: TargetCommand) -> Result<()> {
    match command {
        TargetCommand::FailDrive(args) => {
            let node = NodeClient::connect(&args.node)?;
            let info =
                node.client.fail_drive(TargetId(args.target), args.slot).map_err(|e| match e {
                    FsStatus::Stale => {
                        usage(format!("no target {} on this node (see `stria df`)", args.target))
                    }
                    FsStatus::Busy => anyhow::anyhow!(
                        "refused: failing slot {} would lose data or the slot does not exist",
                        args.slot
                    ),
                    other => anyhow::anyhow!("fail-drive: {other}"),
                })?;
            println!(
                "target {} slot {} failed; target is now {}",
                info.target, args.slot, info.state
            );
            Ok(())
        }
        TargetCommand::ReplaceDrive(args) => {
            let path = drive_path(&args.with)?;
            let node = NodeClient::connect(&args.node)?;
            let info = node
                .client
                .replace_drive(TargetId(args.target), args.slot, &path, args.size)
                .map_err(|e| drive_change_error(e, args.target))?;
            println!(
                "target {} slot {}: {path} is in and rebuilds in the background; target is now {}",
                args.target, args.slot, info.state
            );
            println!("  follow it with `stria df --data {}`", args.node.data.display());
            Ok(())
        }
        TargetCommand::AddSpare(args) => {
            let path = drive_path(&args.path)?;
            let node = NodeClient::connect(&args.node)?;
            let info = node
                .client
                .add_spare(TargetId(args.target), &path, args.size)
                .map_err(|e| drive_change_error(e, args.target))?;
            println!(
                "{path} is a hot spare of target {}; target is now {}",
                args.target, info.state
            );
            Ok(())
        }
    }
}
