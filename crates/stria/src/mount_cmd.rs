//! `stria mount`: one more client of a running node, mounted through FUSE. A compute node
//! mounts the file system this way; several mounts of one node (on one machine or many) share
//! its namespace and data, with close-to-open consistency between them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use stria_proto::fs::FsStatus;
use stria_proto::wire::ClientInfo;

use crate::up::{RunRecord, load_secret};
use crate::{interrupt, usage};

/// Arguments of `stria mount`.
#[derive(Args, Debug)]
pub struct MountArgs {
    /// Where to mount (created if missing).
    pub mountpoint: PathBuf,
    /// The data directory of a node running on this machine: its addresses and its cluster
    /// secret are read from there [default: stria-data, unless --meta is given].
    #[arg(long, conflicts_with_all = ["meta", "storage", "secret_file"])]
    pub data: Option<PathBuf>,
    /// The node's metadata service (`stria up --meta-listen`), for a node on another machine;
    /// needs --storage and --secret-file.
    #[arg(long, requires_all = ["storage", "secret_file"])]
    pub meta: Option<SocketAddr>,
    /// The node's storage service (`stria up --storage-listen`).
    #[arg(long, requires = "meta")]
    pub storage: Option<SocketAddr>,
    /// A copy of the node's DATA/cluster-secret (keep it mode 0600: it admits its holder to
    /// every service of the node).
    #[arg(long, requires = "meta")]
    pub secret_file: Option<PathBuf>,
    #[command(flatten)]
    pub flags: crate::up::MountFlags,
}

/// How long a request waits for a node that cannot be reached (restarting) before it fails.
const NODE_RESTART_WAIT: Duration = Duration::from_secs(60);

pub fn run(args: MountArgs) -> Result<()> {
    let mountpoint = std::path::absolute(&args.mountpoint)
        .with_context(|| format!("bad mount point {}", args.mountpoint.display()))?;
    let (meta, storage, secret) = match (&args.meta, &args.storage, &args.secret_file) {
        (Some(meta), Some(storage), Some(secret_file)) => {
            let secret = stria_rpc::ClusterSecret::load(secret_file).map_err(|e| {
                usage(format!(
                    "{e}: --secret-file must be a copy of the node's DATA/cluster-secret"
                ))
            })?;
            (*meta, *storage, secret)
        }
        (None, None, None) => {
            let data = args.data.clone().unwrap_or_else(|| PathBuf::from("stria-data"));
            let run = RunRecord::load(&data)?;
            (run.meta, run.storage, load_secret(&data)?)
        }
        _ => return Err(usage("give --data DIR, or all of --meta, --storage and --secret-file")),
    };
    interrupt::install();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()).max(2))
        .thread_name("stria-mount")
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let mut config = crate::fs_cmd::node_config(runtime.handle(), meta, storage, secret).map_err(
        |e| match e {
            FsStatus::Access => anyhow::anyhow!(
                "the node at {storage} refused the cluster secret: it is not the one the node \
                 started with"
            ),
            e => anyhow::anyhow!(
                "the node at {storage} does not answer: {e}; is `stria up` running?"
            ),
        },
    )?;
    // A node that restarts on the same addresses is waited for, not failed.
    config.reconnect_wait = NODE_RESTART_WAIT;
    let client = stria_client::Client::new(runtime.handle().clone(), config);
    let mount = crate::up::mount_fs(client.clone(), &mountpoint, &args.flags.options())?;
    // The node lists this mount among its clients (`GET /api/v1/clients`).
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let info = ClientInfo {
        kind: "fuse".into(),
        mount: mountpoint.display().to_string(),
        host: if host.trim().is_empty() { "unknown host".into() } else { host.trim().to_string() },
        pid: std::process::id(),
    };
    if let Err(e) = client.announce(info) {
        tracing::warn!(%e, "the node will not list this mount among its clients");
    }
    println!(
        "mounted the node at {meta} (metadata) and {storage} (storage) on {}",
        mountpoint.display()
    );
    println!("Ctrl-C, SIGTERM or `umount {}` unmounts", mountpoint.display());
    while !interrupt::requested() && mount.is_mounted() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let unmounted_outside = !mount.is_mounted();
    mount.unmount().with_context(|| format!("cannot unmount {}", mountpoint.display()))?;
    // Chunks of files removed through this mount, still queued, go before the client does.
    if let Err(e) = client.sync_meta() {
        tracing::warn!(%e, "removing the chunks of removed files at unmount");
    }
    if let Err(e) = client.goodbye() {
        tracing::warn!(%e, "telling the node this mount stops (it drops it from its list in 30 s)");
    }
    drop(client);
    runtime.shutdown_timeout(Duration::from_secs(5));
    if unmounted_outside {
        eprintln!("{} was unmounted; stopped", mountpoint.display());
    } else {
        eprintln!("unmounted {}", mountpoint.display());
    }
    Ok(())
}
