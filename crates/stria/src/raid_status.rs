//! `stria raid status`: the array as its drives' labels describe it.
//!
//! Labels are read without opening the drives for I/O or locking them, so status works while
//! another process runs the array; a label caught mid-write fails its checksum and is listed as
//! unreadable rather than trusted.

use std::path::Path;

use anyhow::{Result, anyhow};
use clap::Args;
use serde::Serialize;
use stria_io::file::read_header;
use stria_raid::bitmap::WriteIntent;
use stria_raid::superblock::{Layout, SUPERBLOCK_BYTES, Superblock};
use stria_raid::{ArrayState, ArrayStatus};

use crate::raid_cmd::Drives;
use crate::units::{format_bytes, format_rate};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Print the status as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    drives: Drives,
}

/// The Stria label on `path`, if it has a valid one.
pub fn read_label(path: &Path) -> Result<Superblock, String> {
    let raw = read_header(path, SUPERBLOCK_BYTES).map_err(|e| match e {
        // The path is shown next to the reason already.
        stria_io::IoError::Open { message, .. } => message,
        other => other.to_string(),
    })?;
    Superblock::decode(&raw).map_err(|e| e.to_string())
}

/// The write-intent regions marked in the on-disk bitmaps of the array's labelled members (as
/// assembly reads them: the union of every copy), which a crash now would resync. None when no
/// bitmap could be read.
fn marked_on_disk(labels: &[(String, Superblock)], status: &ArrayStatus) -> Option<u64> {
    let members = labels.iter().filter(|(_, l)| l.array_uuid.to_string() == status.uuid);
    let mut union: Option<(Vec<u8>, &Layout)> = None;
    for (path, Superblock { layout, .. }) in members {
        let end = (layout.bitmap_offset + layout.bitmap_bytes) as usize;
        let Ok(raw) = read_header(Path::new(path), end) else { continue };
        let (bits, _) =
            union.get_or_insert_with(|| (vec![0; layout.bitmap_bytes as usize], layout));
        bits.iter_mut().zip(&raw[layout.bitmap_offset as usize..]).for_each(|(u, b)| *u |= b);
    }
    let (bits, layout) = union?;
    let bitmap =
        WriteIntent::new(layout.bitmap_region_bytes, layout.data_bytes, layout.bitmap_bytes);
    bitmap.load(&bits);
    Some(bitmap.dirty_regions().len() as u64)
}

#[derive(Serialize, Debug)]
struct UnreadableDrive {
    device: String,
    reason: String,
}

#[derive(Serialize, Debug)]
struct StatusReport {
    #[serde(flatten)]
    status: ArrayStatus,
    unreadable: Vec<UnreadableDrive>,
}

pub fn run(args: StatusArgs) -> Result<()> {
    let mut labels = Vec::new();
    let mut unreadable = Vec::new();
    for path in &args.drives.paths {
        let name = path.display().to_string();
        match read_label(path) {
            Ok(label) => labels.push((name, label)),
            Err(reason) => unreadable.push(UnreadableDrive { device: name, reason }),
        }
    }
    let Some(mut status) = stria_raid::inspect(&labels) else {
        let reasons: Vec<String> =
            unreadable.iter().map(|u| format!("{}: {}", u.device, u.reason)).collect();
        return Err(anyhow!("no drive has a readable Stria label ({})", reasons.join("; ")));
    };
    status.bitmap_marked_regions = marked_on_disk(&labels, &status);
    let report = StatusReport { status, unreadable };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    print_status(&report.status);
    if !report.unreadable.is_empty() {
        println!("unreadable drives:");
        for u in &report.unreadable {
            println!("  {}: {}", u.device, u.reason);
        }
    }
    Ok(())
}

/// One line for the array's state: `optimal`, `degraded: slot 2 failed`, `rebuilding slot 2:
/// 42% at 310 MB/s`, `failed: ...`.
pub fn describe_state(status: &ArrayStatus) -> String {
    let out: Vec<String> = status
        .members
        .iter()
        .filter(|m| m.state != "active" && m.state != "rebuilding")
        .map(|m| {
            format!(
                "slot {} {}",
                m.slot.map(|s| s.to_string()).unwrap_or_else(|| "?".into()),
                m.state
            )
        })
        .collect();
    let out = if out.is_empty() { String::new() } else { format!(" ({})", out.join(", ")) };
    match status.state {
        ArrayState::Optimal => "optimal".to_string(),
        ArrayState::Degraded => format!("degraded{out}"),
        ArrayState::Failed => format!("failed{out}"),
        ArrayState::Rebuilding => match &status.rebuild {
            Some(r) if r.error.is_some() => format!(
                "rebuild of slot {} stopped at {:.0}%: {}{out}",
                r.slot,
                r.percent,
                r.error.as_deref().unwrap_or_default()
            ),
            Some(r) if r.rate_bytes_s > 0 => {
                format!(
                    "rebuilding slot {} {:.0}% at {}{out}",
                    r.slot,
                    r.percent,
                    format_rate(r.rate_bytes_s)
                )
            }
            Some(r) => format!("rebuilding slot {} {:.0}%{out}", r.slot, r.percent),
            None => format!("rebuilding{out}"),
        },
    }
}

fn print_status(s: &ArrayStatus) {
    println!("array        {} ({})", s.uuid, s.level);
    println!(
        "geometry     {} drives, stripe unit {}, capacity {} ({} bytes)",
        s.drives,
        format_bytes(s.stripe_unit_bytes as u64),
        format_bytes(s.capacity_bytes),
        s.capacity_bytes
    );
    println!("state        {}", describe_state(s));
    println!("events       {}", s.events);
    let region = format_bytes(s.bitmap_region_bytes);
    match s.bitmap_marked_regions {
        Some(marked) => println!("bitmap       {marked} regions of {region} marked for resync"),
        None => println!("bitmap       regions of {region}"),
    }
    println!();
    let width = s.members.iter().chain(&s.spares).map(|m| m.device.len()).max().unwrap_or(6).max(6);
    println!(
        "{:<5} {:<width$} {:<11} {:>7} {:>11} {:>7}",
        "slot", "device", "state", "errors", "written", "wear"
    );
    for m in s.members.iter().chain(&s.spares) {
        let slot = m.slot.map(|s| s.to_string()).unwrap_or_else(|| "spare".into());
        let wear = m.wear_percent.map(|w| format!("{w:.2}%")).unwrap_or_else(|| "-".into());
        println!(
            "{slot:<5} {:<width$} {:<11} {:>7} {:>11} {:>7}",
            m.device,
            m.state,
            m.errors,
            format_bytes(m.lifetime_written_bytes),
            wear
        );
    }
    if !s.warnings.is_empty() {
        println!();
        println!("warnings:");
        for w in &s.warnings {
            println!("  {w}");
        }
    }
}
