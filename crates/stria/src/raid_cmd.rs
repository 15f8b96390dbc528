//! `stria raid ...`: array management commands.
//!
//! An array is named by its drive paths. Every command that opens the array assembles it from
//! those drives, prints the assembly's warnings, does its work and closes the array again so the
//! superblocks record a clean stop, also when the work itself failed. `status` alone reads the
//! labels without opening the drives, so it works while another process runs the array.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use stria_io::BlockDevice;
use stria_io::file::{DriveOptions, create_drive_file, open_drive};
use stria_raid::superblock::{SlotState, Superblock};
use stria_raid::{Array, ArrayConfig, ArrayState, CreateOptions, Level, ScrubReport};

use crate::raid_status::{describe_state, read_label};
use crate::units::{format_bytes, format_rate, parse_rate, parse_size};
use crate::{interrupt, raid_bench, raid_io, raid_status, torture, usage};

/// How often progress bars poll the array.
const PROGRESS_POLL: Duration = Duration::from_millis(200);
/// A rebuild whose progress has not moved for this long is checked for having stopped on an
/// error (the array keeps such a slot in the rebuilding state).
const REBUILD_STALL: Duration = Duration::from_secs(10);

#[derive(Args, Debug)]
pub struct RaidArgs {
    #[command(subcommand)]
    command: RaidCommand,
}

#[derive(Subcommand, Debug)]
enum RaidCommand {
    /// Create a new array on DRIVEs; what they held is discarded.
    Create(CreateArgs),
    /// Show level, state, rebuild progress and per-drive health, read from the drives' labels
    /// (works while another process runs the array).
    Status(raid_status::StatusArgs),
    /// Take a drive out of service; a hot spare, if any, starts rebuilding in its place.
    Fail(FailArgs),
    /// Put a new drive (or the slot's own drive, returning) into a failed slot and rebuild it.
    Replace(ReplaceArgs),
    /// Assemble the array, which resumes an interrupted rebuild or resync, and wait for it.
    Rebuild(RebuildArgs),
    /// Label a drive as a hot spare of the array.
    AddSpare(AddSpareArgs),
    /// Verify every block's checksum and every stripe's parity or mirror copies, repairing
    /// what redundancy allows.
    Scrub(ScrubArgs),
    /// Like scrub but read-only: report problems without repairing (exit 1 if any).
    Check(ScrubArgs),
    /// Copy bytes out of the array, like dd on an md device (any offset and length).
    Read(raid_io::ReadArgs),
    /// Copy bytes into the array, like dd on an md device (any offset and length), then flush.
    Write(raid_io::WriteArgs),
    /// Measure random IOPS and sequential throughput per level and state on scratch drive files.
    Bench(raid_bench::BenchArgs),
    /// Crash-test writer and verifier (used by the crash test suite).
    #[command(hide = true)]
    Torture(torture::TortureArgs),
}

/// The drives naming an array.
#[derive(Args, Debug, Clone)]
pub struct Drives {
    /// The array's drives: block devices or drive files, in any order (a shell glob works).
    #[arg(value_name = "DRIVE", required = true)]
    pub paths: Vec<PathBuf>,
}

#[derive(Args, Debug)]
struct CreateArgs {
    /// RAID level: 0, 1, 10, 5 or 6.
    #[arg(long, value_parser = parse_level)]
    level: Level,
    /// Bytes placed on one drive before the stripe moves to the next: a power of two from 4K
    /// to 1M.
    #[arg(long, value_name = "SIZE", default_value = "64K", value_parser = parse_size)]
    stripe_unit: u64,
    /// Rated endurance of each drive in terabytes written (the vendor's TBW figure), for the
    /// wear column of `status`; 0 means unknown.
    #[arg(long, value_name = "TB", default_value_t = 0)]
    rated_tbw: u64,
    /// Create the drive files (and spare files) first, sparse, of this size (e.g. 1G). They
    /// must not exist yet.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    size: Option<u64>,
    /// A hot spare to label along with the array; repeat for more.
    #[arg(long = "spare", value_name = "PATH")]
    spares: Vec<PathBuf>,
    /// Overwrite drives that already carry a Stria label (they may belong to a live array).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    drives: Drives,
}

#[derive(Args, Debug)]
struct FailArgs {
    /// The slot to take out of service (0-based, as `stria raid status` lists them).
    #[arg(long)]
    slot: usize,
    /// Do not wait for a hot spare's rebuild; it then resumes at the next assembly (for
    /// example `stria raid rebuild`).
    #[arg(long)]
    no_wait: bool,
    #[command(flatten)]
    drives: Drives,
}

#[derive(Args, Debug)]
struct ReplaceArgs {
    /// The failed slot to fill (0-based, as `stria raid status` lists them).
    #[arg(long)]
    slot: usize,
    /// The new drive, or the slot's own drive returning (then only what changed while it was
    /// away is resynced).
    #[arg(long = "with", value_name = "PATH")]
    with: PathBuf,
    /// Create the new drive file first, sparse, of this size; it must not exist yet.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    size: Option<u64>,
    /// Rebuild rate limit in bytes per second (e.g. 200M); default 200 MiB/s.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<u64>,
    /// Do not wait for the rebuild; it then resumes at the next assembly.
    #[arg(long)]
    no_wait: bool,
    /// Use the new drive even if it carries the label of another Stria array.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    drives: Drives,
}

#[derive(Args, Debug)]
struct RebuildArgs {
    /// Rebuild rate limit in bytes per second (e.g. 200M); default 200 MiB/s.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<u64>,
    #[command(flatten)]
    drives: Drives,
}

#[derive(Args, Debug)]
struct AddSpareArgs {
    /// The drive to label as a hot spare.
    #[arg(long, value_name = "PATH")]
    spare: PathBuf,
    /// Create the spare drive file first, sparse, of this size; it must not exist yet.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    size: Option<u64>,
    /// If a slot is out and the spare starts rebuilding it, do not wait for the rebuild.
    #[arg(long)]
    no_wait: bool,
    /// Use the drive even if it carries the label of another Stria array.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    drives: Drives,
}

#[derive(Args, Debug)]
struct ScrubArgs {
    /// Limit reading to this many bytes per second (e.g. 500M); default: as fast as the
    /// drives go.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    drives: Drives,
}

fn parse_level(text: &str) -> Result<Level, String> {
    text.parse()
}

pub fn run(args: RaidArgs) -> Result<()> {
    // The torture writer must die like a crashing process when killed, so it keeps the default
    // signal dispositions.
    if !matches!(args.command, RaidCommand::Torture(_)) {
        interrupt::install();
    }
    match args.command {
        RaidCommand::Create(a) => create(a),
        RaidCommand::Status(a) => raid_status::run(a),
        RaidCommand::Fail(a) => fail(a),
        RaidCommand::Replace(a) => replace(a),
        RaidCommand::Rebuild(a) => rebuild(a),
        RaidCommand::AddSpare(a) => add_spare(a),
        RaidCommand::Scrub(a) => scrub(a, true),
        RaidCommand::Check(a) => scrub(a, false),
        RaidCommand::Read(a) => raid_io::read(a),
        RaidCommand::Write(a) => raid_io::write(a),
        RaidCommand::Bench(a) => raid_bench::run(a),
        RaidCommand::Torture(a) => torture::run(a),
    }
}

// ------------------------------------------------------------------------------------------
// Opening arrays
// ------------------------------------------------------------------------------------------

/// Refuses paths that do not exist or are listed twice, before anything is opened.
fn check_paths(paths: &[PathBuf]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for path in paths {
        if !path.exists() {
            return Err(usage(format!(
                "{} does not exist: check the drive list (create drive files with --size where the command offers it)",
                path.display()
            )));
        }
        let canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
        if !seen.insert(canonical) {
            return Err(usage(format!("{} is listed twice: give each drive once", path.display())));
        }
    }
    Ok(())
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

pub fn open_drives(paths: &[PathBuf], options: &DriveOptions) -> Result<Vec<Arc<dyn BlockDevice>>> {
    paths.iter().map(|p| open_drive(p, options).map_err(anyhow::Error::from)).collect()
}

/// Opens the drives and assembles the array, printing its warnings to stderr.
///
/// A drive the array recorded as failed stays out even when it is listed (a glob matches it):
/// failing a drive is a decision, undone only by `stria raid replace --with` that drive.
pub fn assemble(paths: &[PathBuf]) -> Result<Array> {
    check_paths(paths)?;
    let failed = failed_drives(paths);
    let kept: Vec<PathBuf> =
        paths.iter().filter(|p| !failed.iter().any(|(f, _)| f == *p)).cloned().collect();
    if kept.is_empty() {
        return Err(usage("every listed drive is recorded as failed: nothing to assemble"));
    }
    for (path, slot) in &failed {
        eprintln!(
            "note: {} is slot {slot}'s failed drive and stays out; to re-add it: stria raid replace --slot {slot} --with {} DRIVE...",
            path.display(),
            path.display()
        );
    }
    let devs = open_drives(&kept, &DriveOptions::default())?;
    let array = Array::assemble(devs)?;
    for warning in array.warnings() {
        eprintln!("warning: {warning}");
    }
    Ok(array)
}

/// The listed drives that the array's newest label records as failed, with their slots.
/// Labels are read without locks; a torn read only means a drive is not recognised here and
/// assembly decides about it instead.
fn failed_drives(paths: &[PathBuf]) -> Vec<(PathBuf, usize)> {
    let labels: Vec<(&PathBuf, Superblock)> =
        paths.iter().filter_map(|p| read_label(p).ok().map(|l| (p, l))).collect();
    let Some(newest) = labels.iter().map(|(_, l)| l).max_by_key(|l| l.events) else {
        return Vec::new();
    };
    labels
        .iter()
        .filter(|(_, l)| l.array_uuid == newest.array_uuid)
        .filter_map(|(path, l)| {
            let slot = newest
                .slots
                .iter()
                .take(newest.drives as usize)
                .position(|e| e.drive_uuid == l.drive_uuid && e.state == SlotState::Failed)?;
            Some(((*path).clone(), slot))
        })
        .collect()
}

/// Assembles the array, runs `work` and closes the array whether or not `work` succeeded, so
/// the labels always record a clean stop.
pub fn with_array<T>(paths: &[PathBuf], work: impl FnOnce(&Array) -> Result<T>) -> Result<T> {
    let array = assemble(paths)?;
    let result = work(&array);
    let closed = array.close().context("closing the array");
    match (result, closed) {
        (Ok(value), Ok(())) => Ok(value),
        (Err(e), Ok(())) => Err(e),
        (Ok(_), Err(e)) => Err(e),
        (Err(e), Err(close)) => {
            eprintln!("note: closing the array failed too: {close:#}");
            Err(e)
        }
    }
}

/// Refuses a slot number outside the array, naming the valid range.
fn check_slot(array: &Array, slot: usize) -> Result<()> {
    let drives = array.geometry().drives;
    if slot >= drives {
        return Err(usage(format!(
            "--slot {slot} does not exist: the array has slots 0..{}",
            drives - 1
        )));
    }
    Ok(())
}

/// Creates a drive file of `size` bytes if asked; returns whether it did, so a failed command
/// can remove what it created.
fn create_if_asked(path: &Path, size: Option<u64>) -> Result<bool> {
    match size {
        Some(size) => {
            create_drive_file(path, size)?;
            Ok(true)
        }
        None if path.exists() => Ok(false),
        None => Err(usage(format!(
            "{} does not exist: pass --size to create it as a drive file",
            path.display()
        ))),
    }
}

/// Refuses a drive labelled for another array unless `force`: it may be a live array's member.
fn refuse_foreign_label(path: &Path, own_array: Option<&str>, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    if let Ok(label) = read_label(path) {
        let uuid = label.array_uuid.to_string();
        if own_array != Some(uuid.as_str()) {
            return Err(usage(format!(
                "{} carries the label of Stria array {uuid} ({}, slot {}): pass --force to overwrite it",
                path.display(),
                label.level,
                label.slot
            )));
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// create
// ------------------------------------------------------------------------------------------

fn create(args: CreateArgs) -> Result<()> {
    let stripe_unit_bytes = u32::try_from(args.stripe_unit).map_err(|_| {
        usage(format!(
            "--stripe-unit {} is too large: use a power of two from 4K to 1M",
            args.stripe_unit
        ))
    })?;
    let all: Vec<PathBuf> = args.drives.paths.iter().chain(&args.spares).cloned().collect();
    let mut created = Vec::new();
    let mut result = Ok(());
    if let Some(size) = args.size {
        for path in &all {
            result = create_drive_file(path, size).map_err(anyhow::Error::from);
            if result.is_err() {
                break;
            }
            created.push(path.clone());
        }
    }
    if result.is_ok() {
        result = create_array(&args, &all, stripe_unit_bytes);
    }
    for path in &created {
        remove_if_failed(path, true, &result);
    }
    result
}

fn create_array(args: &CreateArgs, all: &[PathBuf], stripe_unit_bytes: u32) -> Result<()> {
    check_paths(all)?;
    for path in all {
        refuse_foreign_label(path, None, args.force)?;
    }
    let options = DriveOptions::default();
    let devs = open_drives(&args.drives.paths, &options)?;
    let config = ArrayConfig {
        level: args.level,
        stripe_unit_bytes,
        rated_tbw: args.rated_tbw,
        journal_bytes: None,
    };
    let array = Array::create(devs, &config, &CreateOptions::default())?;
    for spare in open_drives(&args.spares, &options)? {
        array.add_spare(spare)?;
    }
    let g = array.geometry();
    let shape = match g.level {
        Level::Raid0 => "striped, no redundancy".to_string(),
        Level::Raid1 => format!("{}-way mirror", g.drives),
        Level::Raid10 => format!("{} mirrored pairs, striped", g.drives / 2),
        Level::Raid5 | Level::Raid6 => {
            format!(
                "{} data + {} parity chunks per stripe",
                g.data_chunks(),
                g.level.parity_chunks()
            )
        }
    };
    println!("created {} array {}", g.level, array.uuid());
    println!("  drives       {} ({shape}), {} spare(s)", g.drives, args.spares.len());
    println!(
        "  stripe unit  {} per drive, {} of data per stripe, {} stripes",
        format_bytes(g.unit()),
        format_bytes(g.stripe_data_bytes()),
        g.stripes()
    );
    println!("  capacity     {} ({} bytes)", format_bytes(g.capacity_bytes()), g.capacity_bytes());
    array.close().context("closing the new array")
}

// ------------------------------------------------------------------------------------------
// fail, replace, rebuild, add-spare
// ------------------------------------------------------------------------------------------

fn fail(args: FailArgs) -> Result<()> {
    with_array(&args.drives.paths, |array| {
        check_slot(array, args.slot)?;
        // The array itself refuses a failure it could not survive, before recording anything.
        array.fail_drive(args.slot)?;
        println!("slot {} failed", args.slot);
        finish_membership_change(array, args.no_wait)
    })
}

/// After a membership change: waits for a rebuild that started (unless `no_wait`) and prints
/// the state the array is left in.
fn finish_membership_change(array: &Array, no_wait: bool) -> Result<()> {
    if let Some(r) = array.status().rebuild {
        if no_wait {
            println!(
                "slot {} is rebuilding; not waiting: the rebuild stops when this command exits and resumes at the next assembly (e.g. `stria raid rebuild`)",
                r.slot
            );
        } else {
            wait_for_rebuild(array)?;
        }
    }
    println!("state: {}", describe_state(&array.status()));
    Ok(())
}

/// Shows a progress bar until no slot is rebuilding; returns the rebuild's error, if any.
pub fn wait_for_rebuild(array: &Array) -> Result<()> {
    let started = Instant::now();
    let bar = progress_bar("rebuilding");
    let mut last_done = None;
    let mut last_change = Instant::now();
    let mut slots = BTreeSet::new();
    while let Some((done, total, rate)) = array.rebuild_progress() {
        if interrupt::requested() {
            bar.abandon();
            return Err(anyhow!(
                "interrupted: the rebuild stops here and resumes at the next assembly (`stria raid rebuild DRIVE...`)"
            ));
        }
        if let Some(r) = array.status().rebuild {
            slots.insert(r.slot);
            bar.set_prefix(format!("rebuilding slot {}", r.slot));
        }
        bar.set_length(total.max(1));
        bar.set_position(done);
        bar.set_message(format_rate(rate));
        if last_done != Some(done) {
            last_done = Some(done);
            last_change = Instant::now();
        } else if last_change.elapsed() > REBUILD_STALL {
            // Either very slow or stopped on an error; wait_rebuild tells which.
            break;
        }
        std::thread::sleep(PROGRESS_POLL);
    }
    bar.finish_and_clear();
    array.wait_rebuild()?;
    let slots: Vec<String> = slots.iter().map(|s| format!(" of slot {s}")).collect();
    println!("rebuild{} finished in {:.1} s", slots.join(","), started.elapsed().as_secs_f64());
    Ok(())
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress_bar(prefix: &str) -> ProgressBar {
    let bar = ProgressBar::new(1);
    let style = ProgressStyle::with_template("{prefix} [{bar:40}] {percent:>3}% {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(prefix.to_string());
    bar
}

fn replace(args: ReplaceArgs) -> Result<()> {
    let created = create_if_asked(&args.with, args.size)?;
    // The new drive is opened once, for the replacement; if it is in the list (a returning
    // drive matched by a glob) it stays out of the assembly.
    let others: Vec<PathBuf> =
        args.drives.paths.iter().filter(|p| !same_file(p, &args.with)).cloned().collect();
    let mut joined = false;
    let result = with_array(&others, |array| {
        check_slot(array, args.slot)?;
        refuse_foreign_label(&args.with, Some(&array.uuid().to_string()), args.force)?;
        let dev = open_drive(&args.with, &DriveOptions::default())?;
        if let Some(rate) = args.rate {
            array.set_rebuild_rate(rate);
        }
        array.replace(args.slot, dev)?;
        joined = true;
        println!("slot {}: {} is rebuilding", args.slot, args.with.display());
        finish_membership_change(array, args.no_wait)
    });
    // Once in the array the drive stays, even if waiting for its rebuild failed.
    remove_if_failed(&args.with, created && !joined, &result);
    result
}

/// Removes a drive file this command created when the command failed, so a retry does not
/// trip over "already exists".
fn remove_if_failed<T>(path: &Path, created: bool, result: &Result<T>) {
    if created && result.is_err() {
        let _ = std::fs::remove_file(path);
    }
}

fn rebuild(args: RebuildArgs) -> Result<()> {
    with_array(&args.drives.paths, |array| {
        if let Some(rate) = args.rate {
            array.set_rebuild_rate(rate);
        }
        let status = array.status();
        if status.rebuild.is_some() {
            wait_for_rebuild(array)?;
        } else {
            match status.state {
                ArrayState::Optimal => println!("nothing to rebuild: the array is optimal"),
                _ => {
                    let out: Vec<String> = status
                        .members
                        .iter()
                        .filter(|m| m.state != "active")
                        .filter_map(|m| m.slot.map(|s| s.to_string()))
                        .collect();
                    println!(
                        "nothing is rebuilding; slot {} is out: give it a drive with `stria raid replace --slot N --with PATH`",
                        out.join(", ")
                    );
                }
            }
        }
        println!("state: {}", describe_state(&array.status()));
        Ok(())
    })
}

fn add_spare(args: AddSpareArgs) -> Result<()> {
    let created = create_if_asked(&args.spare, args.size)?;
    let others: Vec<PathBuf> =
        args.drives.paths.iter().filter(|p| !same_file(p, &args.spare)).cloned().collect();
    let mut joined = false;
    let result = with_array(&others, |array| {
        refuse_foreign_label(&args.spare, Some(&array.uuid().to_string()), args.force)?;
        let dev = open_drive(&args.spare, &DriveOptions::default())?;
        array.add_spare(dev)?;
        joined = true;
        println!("{} is a hot spare of array {}", args.spare.display(), array.uuid());
        finish_membership_change(array, args.no_wait)
    });
    remove_if_failed(&args.spare, created && !joined, &result);
    result
}

// ------------------------------------------------------------------------------------------
// scrub, check
// ------------------------------------------------------------------------------------------

fn scrub(args: ScrubArgs, repair: bool) -> Result<()> {
    let verb = if repair { "scrub" } else { "check" };
    let (report, seconds) = with_array(&args.drives.paths, |array| {
        let g = array.geometry();
        let stripe_bytes = g.unit() * g.drives as u64;
        let bar = progress_bar(if repair { "scrubbing" } else { "checking" });
        let started = Instant::now();
        let mut last_message = Instant::now();
        let mut progress = |done: u64, total: u64| {
            bar.set_length(total.max(1));
            bar.set_position(done);
            if last_message.elapsed() >= PROGRESS_POLL {
                last_message = Instant::now();
                let rate = (done * stripe_bytes) as f64 / started.elapsed().as_secs_f64().max(1e-3);
                bar.set_message(format_rate(rate as u64));
            }
        };
        let report = array.scrub(repair, args.rate, interrupt::flag(), &mut progress);
        bar.finish_and_clear();
        Ok((report?, started.elapsed().as_secs_f64()))
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_scrub_report(verb, &report, seconds);
    }
    if report.stopped_early {
        return Err(anyhow!(
            "{verb} interrupted after {} stripes; the report covers only those",
            report.stripes_checked
        ));
    }
    if repair && report.unrecoverable_blocks > 0 {
        return Err(anyhow!(
            "scrub could not repair {} blocks: redundancy was not enough; their data is lost (reads of them fail)",
            report.unrecoverable_blocks
        ));
    }
    if !repair && !report.clean() {
        return Err(anyhow!(
            "check found problems ({} checksum errors, {} parity mismatches, {} unrecoverable blocks): run `stria raid scrub` to repair what redundancy allows",
            report.checksum_errors,
            report.parity_mismatches,
            report.unrecoverable_blocks
        ));
    }
    Ok(())
}

fn print_scrub_report(verb: &str, r: &ScrubReport, seconds: f64) {
    println!(
        "{verb}: {} stripes, {} read in {seconds:.1} s ({})",
        r.stripes_checked,
        format_bytes(r.bytes_checked),
        format_rate((r.bytes_checked as f64 / seconds.max(1e-3)) as u64)
    );
    println!("  checksum errors       {}", r.checksum_errors);
    println!("  parity mismatches     {}", r.parity_mismatches);
    println!("  repaired blocks       {}", r.repaired_blocks);
    println!("  unrecoverable blocks  {}", r.unrecoverable_blocks);
    let verdict = if r.clean() {
        "clean"
    } else if verb == "scrub" && r.unrecoverable_blocks == 0 {
        "repaired"
    } else {
        "problems found"
    };
    println!("result: {verdict}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_with_or_without_prefix() {
        assert_eq!(parse_level("6"), Ok(Level::Raid6));
        assert_eq!(parse_level("raid10"), Ok(Level::Raid10));
        assert!(parse_level("7").expect_err("no raid7").contains("7"));
    }
}
