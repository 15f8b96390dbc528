//! `stria bench`: the standard HPC measurements against any mounted file system, Stria's
//! client library, a Stria volume or any NBD export, side by side. The workloads live in
//! `stria-bench`; this module parses the command line, opens the targets and prints or saves
//! the report.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use stria_bench::{
    BlockTarget, CacheMode, CornersConfig, FramesConfig, Io500Config, MetaConfig, MixConfig,
    NativeTarget, NbdDevice, Plan, PosixTarget, RandomConfig, RunContext, SeqConfig, SharedConfig,
    Target, VolumeDevice, Workload,
};
use stria_nbd::client::NbdUri;
use stria_proto::fs::{FileLayout, ObjectId};
use stria_proto::mgmt::{MgmtReply, MgmtRequest};

use crate::fs_cmd::{NodeArgs, NodeClient};
use crate::units::parse_size;
use crate::{interrupt, usage};

#[derive(Args, Debug)]
#[command(
    about = "Benchmarks: IOR/IOzone N-N and N-1, 4 KiB random, mdtest, fio mixes, the four \
             corners, video frames and IO500 phases, against any file system or Stria itself",
    long_about = "Benchmarks: IOR/IOzone N-N and N-1, 4 KiB random, mdtest, fio mixes, the four \
corners, video frames and IO500 phases, against any file system or Stria itself.\n\n\
Targets: --path DIR (any mounted file system, plain POSIX calls; repeat it or use --compare \
to measure several side by side), --native (Stria's client library, bypassing FUSE), --volume \
NAME (a Stria volume through the client library) and --nbd nbd://HOST[:PORT]/EXPORT (any NBD \
export). Several targets run interleaved, run by run, and the first is the baseline of the \
ratios. Block targets (--volume, --nbd) are overwritten: they need --overwrite.\n\n\
Caches: by default data files use O_DIRECT where the transfers allow it; otherwise each \
file is fsynced and its cached pages dropped before it is read back. The report says what \
was done for each target and phase.\n\n\
Examples:\n  stria bench seq --path /mnt/stria --threads 4 --file-size 1G\n  \
stria bench sweep random --threads 16 --path /mnt/stria --compare /mnt/ext4 --charts out/\n  \
stria bench meta --native --data stria-data --files 65536 --file-size 4K\n  \
stria bench io500 --path /mnt/stria --threads 4"
)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    #[command(flatten)]
    Workload(WorkloadCommand),
    /// Run a workload at 1, 2, 4 … --threads threads and report peak and sustained values,
    /// with a chart per phase (--charts DIR).
    Sweep {
        #[command(subcommand)]
        workload: WorkloadCommand,
    },
}

#[derive(Subcommand, Debug, Clone)]
enum WorkloadCommand {
    /// N threads each write then read their own file (IOzone/IOR N-N sequential).
    Seq(SeqArgs),
    /// N threads write then read disjoint blocks of one shared file (IOR N-1).
    Shared(SharedArgs),
    /// Small random writes then reads, each thread its own file (IOzone random).
    Random(RandomArgs),
    /// mdtest: create, stat, read and remove many small files.
    Meta(MetaArgs),
    /// fio-style read/write ratio sweep of random I/O (100/0 .. 0/100).
    Mix(MixArgs),
    /// The four corners: 64 KiB sequential write/read, 4 KiB random write/read.
    Corners(CornersArgs),
    /// frametest: video frames written and read in N streams, frames per second and drops.
    Frames(FramesArgs),
    /// The IO500 phases at a small scale with IO500's score (not an official submission).
    Io500(Io500Args),
}

/// Where to run and how to report: every workload takes these.
#[derive(Args, Debug, Clone)]
struct CommonArgs {
    /// A directory on the file system to measure (repeat for several, side by side).
    #[arg(long = "path", value_name = "DIR")]
    paths: Vec<PathBuf>,
    /// More directories to measure side by side with the first --path.
    #[arg(long, value_name = "DIR", num_args = 1..)]
    compare: Vec<PathBuf>,
    /// Stria's client library on the node at --data, bypassing FUSE.
    #[arg(long)]
    native: bool,
    /// A Stria volume of the node at --data, through the client library (overwritten).
    #[arg(long, value_name = "NAME")]
    volume: Option<String>,
    /// An NBD export, nbd://HOST[:PORT]/EXPORT (overwritten); repeat for several.
    #[arg(long, value_name = "URI")]
    nbd: Vec<String>,
    /// Allow block targets (--volume, --nbd) to be overwritten.
    #[arg(long)]
    overwrite: bool,
    #[command(flatten)]
    node: NodeArgs,
    /// Threads (frames: streams); a sweep's largest count.
    #[arg(short, long, default_value_t = 1)]
    threads: usize,
    /// Repetitions of each measurement, interleaved across targets; the median is reported.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// How page caches are kept out: direct (O_DIRECT where aligned, else drop), drop
    /// (buffered; fsync + drop each file's pages before reading), keep (measure the cache).
    #[arg(long, default_value = "direct", value_parser = CacheMode::parse)]
    cache: CacheMode,
    /// Also write the report as JSON to FILE (`-`: standard output, instead of the table).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write charts (SVG and PNG) of a sweep into DIR.
    #[arg(long, value_name = "DIR")]
    charts: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    no_progress: bool,
}

fn size(text: &str) -> Result<u64, String> {
    parse_size(text)
}

fn bytes(text: &str) -> Result<usize, String> {
    let n = parse_size(text)?;
    if n == 0 {
        return Err(format!("'{text}' must be above zero"));
    }
    usize::try_from(n).map_err(|_| format!("'{text}' is too large"))
}

#[derive(Args, Debug, Clone)]
struct SeqArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Bytes each thread writes and reads.
    #[arg(long, default_value = "1G", value_parser = size)]
    file_size: u64,
    /// Bytes per request.
    #[arg(long, default_value = "8M", value_parser = bytes)]
    transfer: usize,
    /// fsync each file before closing it.
    #[arg(long)]
    fsync: bool,
    /// Check every byte read against what was written.
    #[arg(long)]
    verify: bool,
}

#[derive(Args, Debug, Clone)]
struct SharedArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Bytes each thread writes into the shared file (IOR's -b).
    #[arg(long, default_value = "1G", value_parser = size)]
    block_size: u64,
    /// Bytes per request (IOR's -t).
    #[arg(long, default_value = "8M", value_parser = bytes)]
    transfer: usize,
    /// Interleave the threads' transfers instead of giving each a contiguous segment.
    #[arg(long)]
    strided: bool,
    /// fsync each file before closing it.
    #[arg(long)]
    fsync: bool,
    /// Check every byte read against what was written.
    #[arg(long)]
    verify: bool,
}

/// How long a timed phase runs: --seconds or --ops per worker.
#[derive(Args, Debug, Clone)]
struct Timing {
    /// Seconds each timed phase runs.
    #[arg(long, default_value_t = 10.0, conflicts_with = "ops")]
    seconds: f64,
    /// Requests per worker instead of a time limit.
    #[arg(long)]
    ops: Option<u64>,
}

impl Timing {
    fn split(&self) -> (Option<f64>, Option<u64>) {
        match self.ops {
            Some(ops) => (None, Some(ops)),
            None => (Some(self.seconds), None),
        }
    }
}

/// What the random-access workloads (`random`, `mix`, `corners`) share.
#[derive(Args, Debug, Clone)]
struct RandomIoArgs {
    /// Size of each thread's file.
    #[arg(long, default_value = "1G", value_parser = size)]
    file_size: u64,
    /// Requests in flight per thread (each from its own worker with its own open file).
    #[arg(long, default_value_t = 1)]
    iodepth: usize,
    #[command(flatten)]
    duration: Timing,
    /// Check every byte read against what was written.
    #[arg(long)]
    verify: bool,
    /// Seed of the random offsets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args, Debug, Clone)]
struct RandomArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    io: RandomIoArgs,
    /// Bytes per request.
    #[arg(long = "bs", default_value = "4K", value_parser = bytes)]
    block_size: usize,
}

#[derive(Args, Debug, Clone)]
struct MetaArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Files in all, kept constant across a sweep (mdtest: 2^21 with 1024 per directory).
    #[arg(long, default_value_t = 65536, conflicts_with = "dirs_per_thread")]
    files: u64,
    /// Directories per thread, instead of --files.
    #[arg(long)]
    dirs_per_thread: Option<usize>,
    /// Files per directory.
    #[arg(long, default_value_t = 1024)]
    files_per_dir: usize,
    /// Bytes written into each file and read back (0, 3K, 4K…).
    #[arg(long, default_value = "0", value_parser = size)]
    file_size: u64,
    /// All threads work in the same directories (mdtest without -u).
    #[arg(long)]
    shared_dirs: bool,
    /// Check every byte read against what was written.
    #[arg(long)]
    verify: bool,
}

#[derive(Args, Debug, Clone)]
struct MixArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    io: RandomIoArgs,
    /// Bytes per request.
    #[arg(long = "bs", default_value = "4K", value_parser = bytes)]
    block_size: usize,
    /// Read shares to measure, in percent.
    #[arg(long, value_delimiter = ',', default_value = "100,75,50,25,0")]
    read_percents: Vec<u32>,
}

#[derive(Args, Debug, Clone)]
struct CornersArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    io: RandomIoArgs,
}

#[derive(Args, Debug, Clone)]
struct FramesArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Bytes per frame (4K DCI 10-bit RGB is about 50MB).
    #[arg(long, default_value = "50MB", value_parser = bytes)]
    frame_size: usize,
    /// Frames per stream.
    #[arg(long, default_value_t = 100)]
    frames: usize,
    /// Frames per second each stream must sustain (late frames count as dropped); unset: as
    /// fast as possible.
    #[arg(long)]
    fps: Option<f64>,
    /// Bytes per request within a frame.
    #[arg(long, default_value = "8M", value_parser = bytes)]
    transfer: usize,
    /// Check every byte read against what was written.
    #[arg(long)]
    verify: bool,
}

#[derive(Args, Debug, Clone)]
struct Io500Args {
    #[command(flatten)]
    common: CommonArgs,
    /// ior-easy bytes per thread.
    #[arg(long, default_value = "256M", value_parser = size)]
    easy_size: u64,
    /// ior-hard 47,008-byte transfers per thread.
    #[arg(long, default_value_t = 2000)]
    hard_transfers: u64,
    /// mdtest-easy files per thread.
    #[arg(long, default_value_t = 2000)]
    easy_files: usize,
    /// mdtest-hard files per thread.
    #[arg(long, default_value_t = 1000)]
    hard_files: usize,
    /// Check every byte read against what was written.
    #[arg(long)]
    verify: bool,
}

impl WorkloadCommand {
    fn common(&self) -> &CommonArgs {
        match self {
            WorkloadCommand::Seq(a) => &a.common,
            WorkloadCommand::Shared(a) => &a.common,
            WorkloadCommand::Random(a) => &a.common,
            WorkloadCommand::Meta(a) => &a.common,
            WorkloadCommand::Mix(a) => &a.common,
            WorkloadCommand::Corners(a) => &a.common,
            WorkloadCommand::Frames(a) => &a.common,
            WorkloadCommand::Io500(a) => &a.common,
        }
    }

    fn workload(&self) -> Result<Workload> {
        let threads = self.common().threads;
        if threads == 0 {
            return Err(usage("--threads must be at least 1"));
        }
        let positive = |n: usize, flag: &str| {
            if n == 0 { Err(usage(format!("{flag} must be at least 1"))) } else { Ok(n) }
        };
        Ok(match self {
            WorkloadCommand::Seq(a) => Workload::Seq(SeqConfig {
                threads,
                file_bytes: a.file_size.max(a.transfer as u64),
                transfer_bytes: a.transfer,
                fsync: a.fsync,
                verify: a.verify,
            }),
            WorkloadCommand::Shared(a) => Workload::Shared(SharedConfig {
                threads,
                bytes_per_thread: a.block_size.max(a.transfer as u64),
                transfer_bytes: a.transfer,
                strided: a.strided,
                fsync: a.fsync,
                verify: a.verify,
            }),
            WorkloadCommand::Random(a) => {
                let (seconds, ops_per_worker) = a.io.duration.split();
                Workload::Random(RandomConfig {
                    threads,
                    file_bytes: a.io.file_size,
                    block_bytes: a.block_size,
                    queue_depth: positive(a.io.iodepth, "--iodepth")?,
                    seconds,
                    ops_per_worker,
                    verify: a.io.verify,
                    seed: a.io.seed,
                })
            }
            WorkloadCommand::Meta(a) => {
                let files_per_dir = positive(a.files_per_dir, "--files-per-dir")?;
                let config = MetaConfig {
                    threads,
                    files_per_dir,
                    dirs_per_thread: a.dirs_per_thread.unwrap_or(1),
                    file_bytes: usize::try_from(a.file_size)
                        .map_err(|_| usage("--file-size is too large"))?,
                    shared_dirs: a.shared_dirs,
                    verify: a.verify,
                };
                let total_files = if a.dirs_per_thread.is_some() { None } else { Some(a.files) };
                Workload::Meta { config, total_files }.with_threads(threads)
            }
            WorkloadCommand::Mix(a) => {
                if let Some(p) = a.read_percents.iter().find(|p| **p > 100) {
                    return Err(usage(format!("--read-percents: {p} is over 100")));
                }
                let (seconds, ops_per_worker) = a.io.duration.split();
                Workload::Mix(MixConfig {
                    threads,
                    file_bytes: a.io.file_size,
                    block_bytes: a.block_size,
                    queue_depth: positive(a.io.iodepth, "--iodepth")?,
                    read_percents: a.read_percents.clone(),
                    seconds,
                    ops_per_worker,
                    verify: a.io.verify,
                    seed: a.io.seed,
                })
            }
            WorkloadCommand::Corners(a) => {
                let (seconds, ops_per_worker) = a.io.duration.split();
                Workload::Corners(CornersConfig {
                    threads,
                    file_bytes: a.io.file_size,
                    queue_depth: positive(a.io.iodepth, "--iodepth")?,
                    seconds,
                    ops_per_worker,
                    verify: a.io.verify,
                    seed: a.io.seed,
                })
            }
            WorkloadCommand::Frames(a) => Workload::Frames(FramesConfig {
                streams: threads,
                frame_bytes: a.frame_size,
                frames_per_stream: positive(a.frames, "--frames")?,
                fps: a.fps.filter(|f| *f > 0.0),
                transfer_bytes: a.transfer,
                verify: a.verify,
            }),
            WorkloadCommand::Io500(a) => Workload::Io500(Io500Config {
                threads,
                easy_bytes_per_thread: a.easy_size,
                hard_transfers_per_thread: a.hard_transfers,
                easy_files_per_thread: a.easy_files,
                hard_files_per_thread: a.hard_files,
                verify: a.verify,
            }),
        })
    }
}

/// What keeps the targets' connections alive while they run.
#[derive(Default)]
struct Opened {
    targets: Vec<Box<dyn Target>>,
    _node: Option<NodeClient>,
}

fn open_targets(c: &CommonArgs) -> Result<Opened> {
    let mut opened = Opened::default();
    for path in c.paths.iter().chain(&c.compare) {
        let target = PosixTarget::new(path.clone(), c.cache)
            .with_context(|| format!("cannot measure {}", path.display()))?;
        opened.targets.push(Box::new(target));
    }
    if (c.volume.is_some() || !c.nbd.is_empty()) && !c.overwrite {
        return Err(usage(
            "block targets (--volume, --nbd) are overwritten by the benchmark: add --overwrite \
             if their data may be lost",
        ));
    }
    if c.native || c.volume.is_some() {
        let node = NodeClient::connect(&c.node)?;
        if c.native {
            let label = format!("stria-native:{}", c.node.data.display());
            opened.targets.push(Box::new(NativeTarget::new(node.client.clone(), label)));
        }
        if let Some(name) = &c.volume {
            let info = match crate::volume_cmd::call(
                &c.node,
                MgmtRequest::VolumeShow { name: name.clone() },
            )? {
                MgmtReply::Volume(info) => info,
                other => anyhow::bail!("unexpected reply to a volume lookup: {other:?}"),
            };
            let layout = FileLayout {
                pool: info.pool.clone(),
                chunk_bytes: info.chunk_bytes,
                targets: info.targets.clone(),
            };
            let io = node.client.volume(ObjectId(info.object), layout, info.size_bytes);
            let device = VolumeDevice::new(name.clone(), io);
            opened.targets.push(Box::new(BlockTarget::new(Box::new(device))));
        }
        opened._node = Some(node);
    }
    for text in &c.nbd {
        let uri = NbdUri::parse(text).map_err(usage)?;
        let device = NbdDevice::open(uri).with_context(|| format!("cannot open {text}"))?;
        opened.targets.push(Box::new(BlockTarget::new(Box::new(device))));
    }
    if opened.targets.is_empty() {
        return Err(usage(
            "nothing to measure: give --path DIR, --native, --volume NAME or --nbd URI",
        ));
    }
    Ok(opened)
}

pub fn run(args: BenchArgs) -> Result<()> {
    let (command, sweep) = match args.command {
        BenchCommand::Workload(w) => (w, false),
        BenchCommand::Sweep { workload } => (workload, true),
    };
    let c = command.common().clone();
    let workload = command.workload()?;
    let thread_counts = if sweep { stria_bench::sweep_counts(c.threads) } else { vec![c.threads] };
    let plan = Plan { workload, thread_counts, runs: c.runs.max(1), sweep };
    let opened = open_targets(&c)?;
    interrupt::install();
    let json_to_stdout = c.json.as_deref() == Some(std::path::Path::new("-"));
    let ctx = RunContext { stop: interrupt::flag(), progress: !c.no_progress && !json_to_stdout };
    let report = stria_bench::execute(&ctx, &plan, &opened.targets, |label, result| {
        if ctx.progress {
            let rates: Vec<String> = result
                .phases
                .iter()
                .map(|p| {
                    format!(
                        "{} {} {}",
                        p.phase,
                        stria_bench::report::format_rate(p.rate),
                        p.unit.name()
                    )
                })
                .collect();
            eprintln!("{label} threads={}: {}", result.threads, rates.join(", "));
        }
    })?;
    if let Some(dir) = &c.charts {
        if sweep || opened.targets.len() > 1 {
            let (files, fonts) = stria_bench::chart::sweep_charts(&report, dir)
                .with_context(|| format!("cannot write charts into {}", dir.display()))?;
            eprintln!("charts: {} files in {}", files.len(), dir.display());
            if !fonts {
                eprintln!(
                    "warning: no system fonts found, the PNG charts have no text \
                     (apt-get install fonts-dejavu-core); the SVG ones do"
                );
            }
        } else {
            eprintln!("note: charts are drawn for sweeps and comparisons; none written");
        }
    }
    match &c.json {
        Some(_) if json_to_stdout => {
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Some(path) => {
            std::fs::write(path, serde_json::to_string_pretty(&report)?)
                .with_context(|| format!("cannot write {}", path.display()))?;
            print!("{}", report.render_text());
        }
        None => print!("{}", report.render_text()),
    }
    if report.interrupted {
        anyhow::bail!("interrupted: the report covers the phases that ran");
    }
    Ok(())
}
