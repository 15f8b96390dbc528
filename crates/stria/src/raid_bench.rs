//! `stria raid bench`: what each RAID level costs, optimal, degraded and while rebuilding.
//!
//! Every cell (level x state) gets a fresh array on scratch drive files in `--dir` (a tmpfs by
//! default, so the numbers are the software's own cost: parity, checksums, locking, copies), a
//! prefilled working set, then fixed-time runs: 4 KiB random I/O at five read/write mixes and
//! sequential writes and reads at several queue depths (threads, each walking its own region).
//! The files are removed after each cell, also when the run fails or is interrupted.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use stria_io::BlockDevice;
use stria_io::file::{DriveOptions, create_drive_file, open_drive};
use stria_proto::{ARRAY_DRIVES_MAX, BLOCK_BYTES};
use stria_raid::{Array, ArrayConfig, CreateOptions, Geometry, Kernel, Level};

use crate::interrupt;
use crate::raid_bench_report::{
    BenchConfig, BenchReport, CellResult, RandomResult, SeqResult, print_report, ratios,
};
use crate::rng::SplitMix64;
use crate::units::{format_bytes, parse_size};
use crate::usage;

const BLOCK: u64 = BLOCK_BYTES as u64;
/// The nominal sequential request; parity levels round it to whole stripes.
pub(crate) const SEQ_IO_BYTES: u64 = 1024 * 1024;
/// Read percentages of the random mixes.
pub(crate) const RANDOM_READ_PERCENTS: [u32; 5] = [100, 70, 50, 30, 0];
/// Most threads one measurement may start.
const THREADS_MAX: usize = 256;
/// Longest single measurement.
const SECONDS_MAX: f64 = 600.0;
/// Threads that prefill the working set.
const PREFILL_THREADS: usize = 4;
/// statfs(2) f_type of tmpfs, where O_DIRECT is refused and pointless.
const TMPFS_MAGIC: i64 = 0x0102_1994;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BenchState {
    /// All drives in service.
    Optimal,
    /// Slot 0 failed after the prefill; reads of its data are reconstructed.
    Degraded,
    /// Slot 0 replaced by a fresh drive and rebuilding (at the default rate limit) while measured.
    Rebuilding,
}

impl BenchState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            BenchState::Optimal => "optimal",
            BenchState::Degraded => "degraded",
            BenchState::Rebuilding => "rebuilding",
        }
    }
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Directory for the scratch drive files; a tmpfs measures the software's own cost.
    /// Created if missing; the files are removed afterwards.
    #[arg(long, default_value = "/dev/shm/stria-bench")]
    dir: PathBuf,
    /// Drives per array.
    #[arg(long, default_value_t = 6)]
    drives: usize,
    /// Size of each scratch drive file.
    #[arg(long, value_name = "SIZE", default_value = "512M", value_parser = parse_size)]
    drive_size: u64,
    /// RAID levels to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,10,5,6", value_parser = parse_level)]
    levels: Vec<Level>,
    /// Array states to measure, comma-separated (raid0 has only optimal).
    #[arg(long, value_delimiter = ',', default_value = "optimal,degraded,rebuilding")]
    states: Vec<BenchState>,
    /// Stripe unit of the arrays.
    #[arg(long, value_name = "SIZE", default_value = "64K", value_parser = parse_size)]
    stripe_unit: u64,
    /// Length of each measurement in seconds (fractions allowed).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Queue depths (threads) of the sequential runs, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,32")]
    queue_depths: Vec<usize>,
    /// Threads issuing the 4 KiB random I/O.
    #[arg(long, default_value_t = 32)]
    random_depth: usize,
    /// Bytes at the start of the array that are prefilled and measured (capped at the capacity).
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size)]
    working_set: u64,
    /// Also write every number to this file as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn parse_level(text: &str) -> Result<Level, String> {
    text.parse()
}

fn validate(args: &BenchArgs) -> Result<()> {
    if !(2..=ARRAY_DRIVES_MAX).contains(&args.drives) {
        return Err(usage(format!("--drives {} is outside 2..={ARRAY_DRIVES_MAX}", args.drives)));
    }
    if !(args.seconds > 0.0 && args.seconds <= SECONDS_MAX) {
        return Err(usage(format!("--seconds {} is outside (0, {SECONDS_MAX}]", args.seconds)));
    }
    for &qd in args.queue_depths.iter().chain(std::iter::once(&args.random_depth)) {
        if !(1..=THREADS_MAX).contains(&qd) {
            return Err(usage(format!("queue depth {qd} is outside 1..={THREADS_MAX}")));
        }
    }
    if args.levels.is_empty() || args.states.is_empty() || args.queue_depths.is_empty() {
        return Err(usage("--levels, --states and --queue-depths need at least one value each"));
    }
    if u32::try_from(args.stripe_unit).is_err() {
        return Err(usage(format!(
            "--stripe-unit {} is too large: use a power of two from 4K to 1M",
            args.stripe_unit
        )));
    }
    Ok(())
}

/// Whether `dir` is on a tmpfs (O_DIRECT is refused there and would only log a warning).
fn is_tmpfs(dir: &Path) -> bool {
    let Ok(c_path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes one struct statfs into the zeroed value it is given; the path is a
    // valid NUL-terminated string that outlives the call.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c_path.as_ptr(), &mut st) == 0 && st.f_type as i64 == TMPFS_MAGIC
    }
}

/// Bytes available to unprivileged users in the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    let c_path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: as in is_tmpfs, for statvfs.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(c_path.as_ptr(), &mut st) == 0)
            .then(|| st.f_bavail as u64 * st.f_frsize as u64)
    }
}

/// Scratch files of one cell, removed when dropped (also on errors and interrupts).
struct ScratchFiles {
    paths: Vec<PathBuf>,
}

impl ScratchFiles {
    fn create(&mut self, path: PathBuf, size: u64) -> Result<()> {
        create_drive_file(&path, size)?;
        self.paths.push(path);
        Ok(())
    }
}

impl Drop for ScratchFiles {
    fn drop(&mut self) {
        for path in &self.paths {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Everything one cell needs besides the level and state.
struct Plan<'a> {
    args: &'a BenchArgs,
    options: DriveOptions,
    bar: &'a ProgressBar,
}

pub fn run(args: BenchArgs) -> Result<()> {
    validate(&args)?;
    let created_dir = !args.dir.exists();
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let result = run_in_dir(&args);
    if created_dir {
        let _ = std::fs::remove_dir(&args.dir);
    }
    result
}

fn run_in_dir(args: &BenchArgs) -> Result<()> {
    // A rebuilding cell holds one extra drive file while a replacement is written.
    let needed = (args.drives as u64 + 1) * args.drive_size;
    if let Some(free) = free_bytes(&args.dir)
        && free < needed
    {
        return Err(usage(format!(
            "{} has {} free but the benchmark needs {} ({} drives of {} plus one replacement): use a smaller --drive-size or another --dir",
            args.dir.display(),
            format_bytes(free),
            format_bytes(needed),
            args.drives,
            format_bytes(args.drive_size)
        )));
    }
    let direct_io = !is_tmpfs(&args.dir);
    let mut cells_todo = Vec::new();
    let mut skipped = Vec::new();
    for &level in &args.levels {
        for &state in &args.states {
            if level == Level::Raid0 && state != BenchState::Optimal {
                skipped.push(format!("raid0 {}: raid0 has no redundancy", state.name()));
            } else {
                cells_todo.push((level, state));
            }
        }
    }
    let per_cell = RANDOM_READ_PERCENTS.len() + 2 * args.queue_depths.len();
    let bar = ProgressBar::new((cells_todo.len() * per_cell) as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:<18} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let plan =
        Plan { args, options: DriveOptions { direct_io, ..DriveOptions::default() }, bar: &bar };
    let mut cells = Vec::new();
    for (level, state) in cells_todo {
        if interrupt::requested() {
            bar.abandon();
            return Err(anyhow!("interrupted; scratch files removed"));
        }
        bar.set_prefix(format!("{level} {}", state.name()));
        match run_cell(&plan, level, state) {
            Ok(cell) => cells.push(cell),
            Err(e) => {
                bar.abandon();
                return Err(e.context(format!("{level} {}", state.name())));
            }
        }
    }
    bar.finish_and_clear();
    let ratios = ratios(&cells, &args.queue_depths);
    let working_set_bytes = cells.first().map(|c| c.working_set_bytes).unwrap_or(0);
    let report = BenchReport {
        config: BenchConfig {
            dir: args.dir.display().to_string(),
            drives: args.drives,
            drive_size_bytes: args.drive_size,
            stripe_unit_bytes: args.stripe_unit,
            seconds: args.seconds,
            queue_depths: args.queue_depths.clone(),
            random_depth: args.random_depth,
            working_set_bytes,
            direct_io,
            backend: cells.first().map(|c| c.backend.clone()).unwrap_or_default(),
            parity_kernel: Kernel::best().name().to_string(),
        },
        cells,
        skipped,
        ratios,
    };
    print_report(&report);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}

/// Bytes per sequential request: 1 MiB, or on parity levels the whole number of stripes
/// nearest to it, so every request is a full-stripe write (no read-modify-write).
fn seq_io_bytes(g: &Geometry) -> u64 {
    if !g.level.is_parity() {
        return SEQ_IO_BYTES;
    }
    let stripe = g.stripe_data_bytes();
    ((SEQ_IO_BYTES + stripe / 2) / stripe).max(1) * stripe
}

fn run_cell(plan: &Plan, level: Level, state: BenchState) -> Result<CellResult> {
    let args = plan.args;
    let mut scratch = ScratchFiles { paths: Vec::new() };
    let stem = format!("stria-bench-{}-{level}", std::process::id());
    let mut devs: Vec<Arc<dyn BlockDevice>> = Vec::new();
    for i in 0..args.drives {
        let path = args.dir.join(format!("{stem}-{i}"));
        scratch.create(path.clone(), args.drive_size)?;
        devs.push(open_drive(&path, &plan.options)?);
    }
    let backend = devs[0].backend().to_string();
    let config = ArrayConfig {
        level,
        stripe_unit_bytes: args.stripe_unit as u32,
        rated_tbw: 0,
        journal_bytes: None,
    };
    let array = Array::create(devs, &config, &CreateOptions::default())?;
    let result = measure_cell(plan, &array, &mut scratch, &stem, state);
    let closed = array.close();
    let cell = result?;
    closed?;
    Ok(CellResult { backend, ..cell })
}

fn measure_cell(
    plan: &Plan,
    array: &Array,
    scratch: &mut ScratchFiles,
    stem: &str,
    state: BenchState,
) -> Result<CellResult> {
    let args = plan.args;
    let g = array.geometry();
    let io = seq_io_bytes(&g);
    let qd_max = args.queue_depths.iter().copied().max().unwrap_or(1) as u64;
    let working_set = args.working_set.min(array.capacity_bytes()) / io * io;
    if working_set < qd_max * io {
        return Err(usage(format!(
            "the working set ({}) cannot give {qd_max} threads {} each: raise --drive-size or --working-set, or lower --queue-depths",
            format_bytes(working_set),
            format_bytes(io)
        )));
    }
    plan.bar.set_message("prefill");
    prefill(array, working_set, io)?;
    let mut replacements = 0u32;
    let mut slot0_path = scratch.paths[0].clone();
    // Puts the array into the cell's state before each measurement: a rebuild that ended, or
    // would end before the measurement does, is started over on a fresh drive.
    let mut prepare = |array: &Array| -> Result<()> {
        match state {
            BenchState::Optimal => Ok(()),
            BenchState::Degraded => {
                if array.status().members[0].state == "active" {
                    array.fail_drive(0)?;
                }
                Ok(())
            }
            BenchState::Rebuilding => {
                if rebuild_left_s(array) < args.seconds {
                    if array.status().members[0].state != "failed" {
                        array.fail_drive(0)?;
                    }
                    let path = args.dir.join(format!("{stem}-0-r{replacements}"));
                    scratch.create(path.clone(), args.drive_size)?;
                    array.replace(0, open_drive(&path, &plan.options)?)?;
                    // The drive that left is unlinked at once (the array may still hold it
                    // open), so a long run holds one spare drive's worth of space at most.
                    let old = std::mem::replace(&mut slot0_path, path);
                    scratch.paths.retain(|p| *p != old);
                    let _ = std::fs::remove_file(old);
                    replacements += 1;
                }
                Ok(())
            }
        }
    };
    // Whether the rebuild started by `prepare` is still running at the end of a measurement.
    let rebuild_still_running = |array: &Array| {
        (state == BenchState::Rebuilding).then(|| array.rebuild_progress().is_some())
    };
    let mut random = Vec::new();
    for read_percent in RANDOM_READ_PERCENTS {
        check_interrupt()?;
        plan.bar.set_message(format!("random {read_percent}/{}", 100 - read_percent));
        prepare(array)?;
        let (iops, mean_latency_us) = measure_random(
            array,
            working_set / BLOCK,
            args.random_depth,
            read_percent,
            args.seconds,
        )?;
        let rebuild_active = rebuild_still_running(array);
        random.push(RandomResult { read_percent, iops, mean_latency_us, rebuild_active });
        plan.bar.inc(1);
    }
    let mut seq = |write: bool| -> Result<Vec<SeqResult>> {
        let mut out = Vec::new();
        for &qd in &args.queue_depths {
            check_interrupt()?;
            plan.bar.set_message(format!("seq{} qd{qd}", if write { "W" } else { "R" }));
            prepare(array)?;
            let mb_per_s = measure_seq(array, working_set, io, qd, write, args.seconds)?;
            let rebuild_active = rebuild_still_running(array);
            out.push(SeqResult { queue_depth: qd, mb_per_s, rebuild_active });
            plan.bar.inc(1);
        }
        Ok(out)
    };
    let seq_write = seq(true)?;
    let seq_read = seq(false)?;
    let rebuild_active_whole_time = (state == BenchState::Rebuilding).then(|| {
        random
            .iter()
            .map(|r| r.rebuild_active)
            .chain(seq_write.iter().chain(&seq_read).map(|s| s.rebuild_active))
            .all(|a| a == Some(true))
    });
    Ok(CellResult {
        level: g.level.to_string(),
        state,
        capacity_bytes: array.capacity_bytes(),
        working_set_bytes: working_set,
        seq_io_bytes: io,
        random,
        seq_write,
        seq_read,
        rebuild_active_whole_time,
        rebuild_replacements: replacements,
        backend: String::new(),
    })
}

fn check_interrupt() -> Result<()> {
    if interrupt::requested() { Err(anyhow!("interrupted; scratch files removed")) } else { Ok(()) }
}

/// Seconds the running rebuild still needs (0 when none runs), at the rate it has kept so far,
/// or at its limit before it has a rate: a rebuild slows down while foreground I/O runs, so
/// the limit alone would end rebuilds early and restart them more often than needed.
fn rebuild_left_s(array: &Array) -> f64 {
    let Some((done, total, measured)) = array.rebuild_progress() else { return 0.0 };
    let status = array.status();
    let limit = status.rebuild.map(|r| r.rate_limit_bytes_s).unwrap_or(0).max(1);
    let rate = if measured > 0 { measured.min(limit) } else { limit };
    (total.saturating_sub(done) * array.geometry().unit()) as f64 / rate as f64
}

/// Writes the working set once, so reads return real, checksummed data.
fn prefill(array: &Array, working_set: u64, io: u64) -> Result<()> {
    let next = AtomicU64::new(0);
    let failed = Mutex::new(None);
    std::thread::scope(|s| {
        for t in 0..PREFILL_THREADS {
            let (next, failed) = (&next, &failed);
            s.spawn(move || {
                let mut buf = vec![0u8; io as usize];
                SplitMix64::new(t as u64).fill(&mut buf);
                loop {
                    let offset = next.fetch_add(io, Relaxed);
                    if offset >= working_set || interrupt::requested() {
                        return;
                    }
                    if let Err(e) = array.write(offset, &buf) {
                        *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(anyhow::Error::from(e).context("prefill"));
    }
    array.flush().context("prefill flush")
}

/// Runs `threads` workers until `seconds` pass, each calling `op(thread, rng, buffer)` in a
/// loop; returns (ops, summed latency in ns, elapsed seconds). All stop at the first error,
/// which is returned.
fn run_workers(
    threads: usize,
    seconds: f64,
    op: impl Fn(usize, &mut SplitMix64, &mut Vec<u8>) -> Result<(), stria_raid::RaidError> + Sync,
    buf_bytes: usize,
) -> Result<(u64, u64, f64)> {
    let ops = AtomicU64::new(0);
    let latency_ns = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let failed = Mutex::new(None);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (ops, latency_ns, stop, failed, op) = (&ops, &latency_ns, &stop, &failed, &op);
            s.spawn(move || {
                let mut rng = SplitMix64::from_parts(&[t as u64, 0xbe4c]);
                let mut buf = vec![0u8; buf_bytes];
                rng.fill(&mut buf);
                let (mut n, mut ns) = (0u64, 0u64);
                while !stop.load(Relaxed) && !interrupt::requested() {
                    let t0 = Instant::now();
                    if t0 >= deadline {
                        break;
                    }
                    if let Err(e) = op(t, &mut rng, &mut buf) {
                        stop.store(true, Relaxed);
                        *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                        break;
                    }
                    ns += t0.elapsed().as_nanos() as u64;
                    n += 1;
                }
                ops.fetch_add(n, Relaxed);
                latency_ns.fetch_add(ns, Relaxed);
            });
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e.into());
    }
    check_interrupt()?;
    Ok((ops.into_inner(), latency_ns.into_inner(), elapsed))
}

/// 4 KiB random I/O over the working set: (IOPS, mean latency in microseconds).
fn measure_random(
    array: &Array,
    blocks: u64,
    threads: usize,
    read_percent: u32,
    seconds: f64,
) -> Result<(f64, f64)> {
    let op = |_t: usize, rng: &mut SplitMix64, buf: &mut Vec<u8>| {
        let offset = rng.below(blocks) * BLOCK;
        if rng.below(100) < read_percent as u64 {
            array.read(offset, buf)
        } else {
            array.write(offset, buf)
        }
    };
    let (ops, latency_ns, elapsed) = run_workers(threads, seconds, op, BLOCK_BYTES)?;
    let iops = ops as f64 / elapsed;
    let mean_us = if ops == 0 { 0.0 } else { latency_ns as f64 / ops as f64 / 1000.0 };
    Ok((iops, mean_us))
}

/// Sequential I/O of `io` bytes per request, `qd` threads each walking its own region: MB/s.
fn measure_seq(
    array: &Array,
    working_set: u64,
    io: u64,
    qd: usize,
    write: bool,
    seconds: f64,
) -> Result<f64> {
    let region = working_set / qd as u64 / io * io;
    assert!(region >= io, "validated against the largest queue depth");
    let positions: Vec<AtomicU64> = (0..qd).map(|_| AtomicU64::new(0)).collect();
    let op = |t: usize, _rng: &mut SplitMix64, buf: &mut Vec<u8>| {
        let pos = positions[t].load(Relaxed);
        positions[t].store((pos + io) % region, Relaxed);
        let offset = t as u64 * region + pos;
        if write { array.write(offset, buf) } else { array.read(offset, buf) }
    };
    let (ops, _, elapsed) = run_workers(qd, seconds, op, io as usize)?;
    Ok((ops * io) as f64 / elapsed / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_requests_cover_whole_stripes_on_parity_levels() {
        let g =
            |level, drives| Geometry::new(level, drives, 64 * 1024, 64 << 20).expect("geometry");
        assert_eq!(seq_io_bytes(&g(Level::Raid0, 6)), 1 << 20);
        assert_eq!(seq_io_bytes(&g(Level::Raid6, 6)), 1 << 20);
        // 5 data chunks of 64 KiB: 3 stripes are the nearest to 1 MiB.
        assert_eq!(seq_io_bytes(&g(Level::Raid5, 6)), 3 * 5 * 64 * 1024);
        for drives in 3..=12 {
            let geometry = g(Level::Raid5, drives);
            assert_eq!(seq_io_bytes(&geometry) % geometry.stripe_data_bytes(), 0);
        }
    }
}
