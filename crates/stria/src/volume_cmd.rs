//! `stria volume`, `stria export`, `stria initiator`: block volumes, their NBD exports and the
//! initiators allowed to use them, on a running node (through its management service).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;
use stria_proto::mgmt::{
    ExportInfo, MgmtReply, MgmtRequest, MgmtResult, MgmtStatus, VolumeInfo, mgmt_method,
};

use crate::fs_cmd::NodeArgs;
use crate::units::{format_bytes, parse_size};
use crate::up::RunRecord;
use crate::usage;

#[derive(Subcommand, Debug)]
pub enum VolumeCommand {
    /// Create a thin volume: space is taken on first write.
    Create(VolumeCreateArgs),
    /// List volumes with size, allocation and exports.
    List(ListArgs),
    /// One volume in detail.
    Show(NameArgs),
    /// Grow a volume, or shrink it with --force (the data past the new end is lost).
    Resize(ResizeArgs),
    /// Delete a volume and its data (remove its exports first).
    Delete(NameArgs),
    /// Make a read-only copy of a volume as it is now, copy-on-write.
    ///
    /// No data is copied: the copy shares the volume's blocks and takes space only as the two
    /// diverge. Writes to the volume pause only while every target notes which chunks the
    /// volume has (about a millisecond); the chunk maps are copied afterwards, while writes go
    /// on. A snapshot is exported only with --read-only and keeps its size; deleting the volume
    /// leaves it whole.
    Snapshot(CopyArgs),
    /// Make a writable copy of a volume or snapshot, copy-on-write.
    ///
    /// As a snapshot, but the copy is an ordinary volume: exported read-write, resizable.
    Clone(CopyArgs),
    /// Give a volume the data and size of one of its own snapshots.
    ///
    /// What was written to the volume since the snapshot is dropped; the snapshot stays. Its
    /// exports pause while it runs (no data is copied: the volume shares the snapshot's
    /// blocks), and it is refused while an NBD client is connected to the volume, since that
    /// client's cached blocks would no longer match. A stop half way leaves either the volume
    /// as it was or the rollback done, never a mix.
    Rollback(RollbackArgs),
}

#[derive(Subcommand, Debug)]
pub enum ExportCommand {
    /// Serve a volume over NBD. Nobody may connect until `stria initiator allow`.
    Add(ExportAddArgs),
    /// List exports with their access lists and live connection counts.
    List(ListArgs),
    /// Stop serving an export (connected clients are cut off once their requests in flight
    /// are answered).
    Remove(NameArgs),
}

#[derive(Subcommand, Debug)]
pub enum InitiatorCommand {
    /// Let an address or CIDR block (optionally only with a TLS identity) use an export.
    Allow(RuleArgs),
    /// Remove a rule added with `allow`. Connected clients the list no longer lets in are cut
    /// off once their requests in flight are answered.
    Deny(RuleArgs),
    /// Show the access lists of every export, or of one.
    List(InitiatorListArgs),
}

#[derive(Args, Debug)]
pub struct VolumeCreateArgs {
    /// Volume name: letters, digits, '.', '_', '-'.
    pub name: String,
    /// Provisioned size, e.g. 10G (a multiple of 512 bytes).
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// Pool whose targets hold the data.
    #[arg(long, default_value = "default")]
    pub pool: String,
    /// Targets to stripe over [default: every target of the pool].
    #[arg(long)]
    pub stripe_count: Option<u32>,
    /// Bytes per chunk on one target before the next, e.g. 1M [default: 1M].
    #[arg(long, value_parser = parse_size)]
    pub stripe_size: Option<u64>,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct NameArgs {
    /// The volume's (or export's) name.
    pub name: String,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CopyArgs {
    /// The volume (or snapshot) to copy.
    pub source: String,
    /// The new volume's name.
    pub name: String,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RollbackArgs {
    /// The volume to roll back.
    pub name: String,
    /// The snapshot (of this volume) whose data it gets.
    #[arg(long = "to", value_name = "SNAPSHOT")]
    pub snapshot: String,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ResizeArgs {
    /// The volume's name.
    pub name: String,
    /// New size, e.g. 20G.
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// Allow shrinking (destroys the data past the new end).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ExportAddArgs {
    /// The volume to serve.
    pub volume: String,
    /// Export name clients ask for [default: the volume's name].
    #[arg(long)]
    pub name: Option<String>,
    /// Refuse writes, trims and zeroing.
    #[arg(long)]
    pub read_only: bool,
    /// Free text shown to clients that ask (NBD_INFO_DESCRIPTION).
    #[arg(long, default_value = "")]
    pub description: String,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RuleArgs {
    /// The export.
    pub export: String,
    /// Client address or CIDR block, e.g. 10.0.0.7 or 10.0.0.0/24 or ::1.
    pub net: String,
    /// Also require a TLS client certificate with this name (subject CN or DNS SAN).
    #[arg(long)]
    pub tls_identity: Option<String>,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct InitiatorListArgs {
    /// Only this export.
    pub export: Option<String>,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Deleting or shrinking a large volume removes its chunks before the reply.
const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Sends one request to the management service of the node running on `node`.
pub(crate) fn call(node: &NodeArgs, request: MgmtRequest) -> Result<MgmtReply> {
    let run = RunRecord::load(&node.data)?;
    let Some(addr) = run.mgmt else {
        anyhow::bail!(
            "the node (pid {}) runs no management service: it was started by an older stria; \
             restart it with this one",
            run.pid
        );
    };
    let secret = crate::up::load_secret(&node.data)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let result: MgmtResult = runtime
        .block_on(async {
            let config = stria_rpc::ClientConfig { secret: Some(secret), ..Default::default() };
            let client = stria_rpc::Client::connect_with(addr, config).await?;
            let (reply, _) = client
                .call_typed(mgmt_method::CALL, &request, bytes::Bytes::new(), CALL_TIMEOUT)
                .await?;
            Ok::<_, stria_rpc::RpcError>(reply)
        })
        .map_err(|e| match e {
            stria_rpc::RpcError::Unauthenticated { .. } => anyhow::anyhow!(
                "the node (pid {}) refused this command: {e}; the data directory's \
                 cluster-secret differs from the one the node started with",
                run.pid
            ),
            _ => anyhow::anyhow!(
                "the node (pid {}) does not answer at {addr}: {e}; is `stria up` still running?",
                run.pid
            ),
        })?;
    result.map_err(|e| match e.status {
        MgmtStatus::Invalid => usage(e.message),
        _ => anyhow::anyhow!(e.message),
    })
}

fn print_json<T: Serialize + ?Sized>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

#[derive(Serialize)]
struct VolumeJson<'a> {
    name: &'a str,
    object: String,
    size_bytes: u64,
    allocated_bytes: Option<u64>,
    pool: &'a str,
    stripe_count: usize,
    stripe_bytes: u32,
    targets: Vec<u32>,
    state: &'a str,
    exports: &'a [String],
    created_unix_s: u64,
    nbd_read_bytes: u64,
    nbd_written_bytes: u64,
    origin: Option<&'a str>,
    snapshot: bool,
}

fn volume_json(v: &VolumeInfo) -> VolumeJson<'_> {
    VolumeJson {
        name: &v.name,
        object: format!("{:016x}", v.object),
        size_bytes: v.size_bytes,
        allocated_bytes: v.allocated_bytes,
        pool: &v.pool,
        stripe_count: v.targets.len(),
        stripe_bytes: v.chunk_bytes,
        targets: v.targets.iter().map(|t| t.0).collect(),
        state: &v.state,
        exports: &v.exports,
        created_unix_s: v.created_unix_s,
        nbd_read_bytes: v.io.read_bytes,
        nbd_written_bytes: v.io.written_bytes,
        origin: v.origin.as_deref(),
        snapshot: v.snapshot,
    }
}

#[derive(Serialize)]
struct ExportJson<'a> {
    name: &'a str,
    volume: &'a str,
    read_only: bool,
    description: &'a str,
    acl: Vec<RuleJson<'a>>,
    connections: u64,
    refused: u64,
}

#[derive(Serialize)]
struct RuleJson<'a> {
    net: &'a str,
    tls_identity: Option<&'a str>,
}

fn export_json(e: &ExportInfo) -> ExportJson<'_> {
    ExportJson {
        name: &e.name,
        volume: &e.volume,
        read_only: e.read_only,
        description: &e.description,
        acl: e
            .acl
            .iter()
            .map(|r| RuleJson { net: &r.net, tls_identity: r.tls_identity.as_deref() })
            .collect(),
        connections: e.connections,
        refused: e.refused,
    }
}

fn show_volume(v: &VolumeInfo) {
    let allocated = v.allocated_bytes.map_or_else(|| "?".into(), format_bytes);
    println!("volume      {}", v.name);
    println!("state       {}", v.state);
    if let Some(origin) = &v.origin {
        let kind = if v.snapshot { "snapshot (read-only)" } else { "clone" };
        println!("origin      {kind} of {origin}");
    }
    println!("size        {} ({} bytes)", format_bytes(v.size_bytes), v.size_bytes);
    println!("allocated   {allocated}");
    println!("pool        {}", v.pool);
    let targets: Vec<String> = v.targets.iter().map(|t| t.to_string()).collect();
    println!(
        "layout      {} targets x {} stripe ({})",
        v.targets.len(),
        format_bytes(v.chunk_bytes as u64),
        targets.join(", ")
    );
    println!("object      {:016x}", v.object);
    let exports = if v.exports.is_empty() { "-".to_string() } else { v.exports.join(", ") };
    println!("exports     {exports}");
}

fn list_volumes(volumes: &[VolumeInfo]) {
    println!(
        "{:<24} {:>10} {:>10} {:<10} {:<9} EXPORTS",
        "NAME", "SIZE", "ALLOCATED", "POOL", "STATE"
    );
    for v in volumes {
        let allocated = v.allocated_bytes.map_or_else(|| "?".into(), format_bytes);
        let exports = if v.exports.is_empty() { "-".to_string() } else { v.exports.join(",") };
        println!(
            "{:<24} {:>10} {:>10} {:<10} {:<9} {exports}",
            v.name,
            format_bytes(v.size_bytes),
            allocated,
            v.pool,
            v.state
        );
    }
}

fn rule_text(net: &str, id: Option<&str>) -> String {
    match id {
        Some(id) => format!("{net} (TLS identity {id})"),
        None => net.to_string(),
    }
}

fn list_exports(exports: &[ExportInfo]) {
    println!(
        "{:<24} {:<24} {:<4} {:>5} {:>7} INITIATORS",
        "EXPORT", "VOLUME", "MODE", "CONNS", "REFUSED"
    );
    for e in exports {
        let acl: Vec<String> =
            e.acl.iter().map(|r| rule_text(&r.net, r.tls_identity.as_deref())).collect();
        let acl = if acl.is_empty() { "(nobody)".to_string() } else { acl.join(", ") };
        println!(
            "{:<24} {:<24} {:<4} {:>5} {:>7} {acl}",
            e.name,
            e.volume,
            if e.read_only { "ro" } else { "rw" },
            e.connections,
            e.refused
        );
    }
}

fn volume_reply(reply: MgmtReply, json: bool) -> Result<()> {
    match reply {
        MgmtReply::Volume(v) if json => print_json(&volume_json(&v)),
        MgmtReply::Volume(v) => {
            show_volume(&v);
            Ok(())
        }
        MgmtReply::Volumes(all) if json => {
            print_json(&all.iter().map(volume_json).collect::<Vec<_>>())
        }
        MgmtReply::Volumes(all) => {
            list_volumes(&all);
            Ok(())
        }
        other => anyhow::bail!("unexpected reply from the node: {other:?}"),
    }
}

fn export_reply(reply: MgmtReply, json: bool) -> Result<()> {
    match reply {
        MgmtReply::Export(e) if json => print_json(&export_json(&e)),
        MgmtReply::Export(e) => {
            list_exports(std::slice::from_ref(&e));
            Ok(())
        }
        MgmtReply::Exports(all) if json => {
            print_json(&all.iter().map(export_json).collect::<Vec<_>>())
        }
        MgmtReply::Exports(all) => {
            list_exports(&all);
            Ok(())
        }
        other => anyhow::bail!("unexpected reply from the node: {other:?}"),
    }
}

fn copy_volume(a: CopyArgs, snapshot: bool) -> Result<()> {
    let request = MgmtRequest::VolumeCopy { source: a.source, name: a.name, snapshot };
    volume_reply(call(&a.node, request)?, a.json)
}

pub fn volume(command: VolumeCommand) -> Result<()> {
    match command {
        VolumeCommand::Create(a) => {
            let stripe_bytes = match a.stripe_size {
                None => 0,
                Some(s) => u32::try_from(s)
                    .map_err(|_| usage(format!("--stripe-size {s} is too large")))?,
            };
            let request = MgmtRequest::VolumeCreate {
                name: a.name,
                size_bytes: a.size,
                pool: a.pool,
                stripe_count: a.stripe_count.unwrap_or(0),
                stripe_bytes,
            };
            volume_reply(call(&a.node, request)?, a.json)
        }
        VolumeCommand::List(a) => volume_reply(call(&a.node, MgmtRequest::VolumeList)?, a.json),
        VolumeCommand::Show(a) => {
            volume_reply(call(&a.node, MgmtRequest::VolumeShow { name: a.name })?, a.json)
        }
        VolumeCommand::Resize(a) => {
            let request =
                MgmtRequest::VolumeResize { name: a.name, size_bytes: a.size, force: a.force };
            volume_reply(call(&a.node, request)?, a.json)
        }
        VolumeCommand::Delete(a) => {
            volume_reply(call(&a.node, MgmtRequest::VolumeDelete { name: a.name })?, a.json)
        }
        VolumeCommand::Snapshot(a) => copy_volume(a, true),
        VolumeCommand::Clone(a) => copy_volume(a, false),
        VolumeCommand::Rollback(a) => {
            let request = MgmtRequest::VolumeRollback { name: a.name, snapshot: a.snapshot };
            volume_reply(call(&a.node, request)?, a.json)
        }
    }
}

pub fn export(command: ExportCommand) -> Result<()> {
    match command {
        ExportCommand::Add(a) => {
            let request = MgmtRequest::ExportAdd {
                volume: a.volume,
                name: a.name,
                read_only: a.read_only,
                description: a.description,
            };
            export_reply(call(&a.node, request)?, a.json)
        }
        ExportCommand::List(a) => export_reply(call(&a.node, MgmtRequest::ExportList)?, a.json),
        ExportCommand::Remove(a) => {
            export_reply(call(&a.node, MgmtRequest::ExportRemove { name: a.name })?, a.json)
        }
    }
}

pub fn initiator(command: InitiatorCommand) -> Result<()> {
    match command {
        InitiatorCommand::Allow(a) => {
            let request = MgmtRequest::InitiatorAllow {
                export: a.export,
                net: a.net,
                tls_identity: a.tls_identity,
            };
            export_reply(call(&a.node, request)?, a.json)
        }
        InitiatorCommand::Deny(a) => {
            let request = MgmtRequest::InitiatorDeny {
                export: a.export,
                net: a.net,
                tls_identity: a.tls_identity,
            };
            export_reply(call(&a.node, request)?, a.json)
        }
        InitiatorCommand::List(a) => {
            let MgmtReply::Exports(mut all) = call(&a.node, MgmtRequest::ExportList)? else {
                anyhow::bail!("unexpected reply from the node");
            };
            if let Some(name) = &a.export {
                all.retain(|e| &e.name == name);
                if all.is_empty() {
                    anyhow::bail!("no export named '{name}'");
                }
            }
            if a.json {
                return print_json(&all.iter().map(export_json).collect::<Vec<_>>());
            }
            println!("{:<24} {:<40} TLS IDENTITY", "EXPORT", "INITIATOR");
            for e in &all {
                for r in &e.acl {
                    println!(
                        "{:<24} {:<40} {}",
                        e.name,
                        r.net,
                        r.tls_identity.as_deref().unwrap_or("-")
                    );
                }
            }
            Ok(())
        }
    }
}
