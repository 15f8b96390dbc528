//! The data workloads: `seq` (IOzone/IOR N-N), `shared` (IOR N-1, segmented or strided),
//! `random` (4 KiB random, IOzone), `mix` (fio read/write ratio sweeps) and `corners` (the four
//! corners). They share one engine, [`DataPhase`], which runs reads and writes over a set of
//! files with a chosen access pattern.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::common::{ALIGN_BYTES, AlignedBuf, Rng, RunResult, WorkDir, fill, verify};
use crate::meter::{Meter, PhaseResult, PhaseSpec, RunContext, Unit, run_phase};
use crate::target::{OpenMode, Target};

/// What a phase does to each block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    /// Reads `read_percent`% of the blocks, writes the others.
    Mix {
        read_percent: u32,
    },
}

/// Which blocks a phase touches, in what order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Each file front to back once (or, with a duration, round and round), its workers taking
    /// the next block in turn, so `queue_depth` requests are in flight on it.
    Sequential,
    /// Uniformly random blocks, until the duration ends or each worker did `ops`.
    Random { ops: Option<u64>, seed: u64 },
    /// One shared file: worker i covers the i-th contiguous segment (IOR N-1 segmented).
    Segmented,
    /// One shared file: worker i takes blocks i, i+N, i+2N… (IOR N-1 strided).
    Strided,
}

/// One measured pass over files.
#[derive(Debug, Clone)]
pub struct DataPhase<'a> {
    pub name: String,
    pub files: &'a [String],
    pub file_bytes: u64,
    pub block: usize,
    /// Workers per file for `Sequential` and `Random`; 1 for the shared-file patterns.
    pub queue_depth: usize,
    pub threads: usize,
    pub op: Op,
    pub access: Access,
    pub unit: Unit,
    pub duration: Option<Duration>,
    /// Each worker that wrote fsyncs before closing.
    pub fsync: bool,
    pub verify: bool,
}

impl<'a> DataPhase<'a> {
    /// One sequential pass writing `files` front to back (IOR/IOzone style, MiB/s, one
    /// request in flight per thread, no fsync, no verification): the fields a streaming phase
    /// shares, for the others to be set with struct update syntax.
    pub fn pass(
        name: &str,
        files: &'a [String],
        file_bytes: u64,
        block: usize,
        threads: usize,
        access: Access,
    ) -> DataPhase<'a> {
        DataPhase {
            name: name.into(),
            files,
            file_bytes,
            block,
            queue_depth: 1,
            threads,
            op: Op::Write,
            access,
            unit: Unit::Bytes,
            duration: None,
            fsync: false,
            verify: false,
        }
    }
}

impl DataPhase<'_> {
    fn workers(&self) -> usize {
        match self.access {
            Access::Segmented | Access::Strided => self.threads,
            _ => self.files.len() * self.queue_depth,
        }
    }

    fn aligned(&self) -> bool {
        self.block.is_multiple_of(ALIGN_BYTES) && self.file_bytes.is_multiple_of(ALIGN_BYTES as u64)
    }

    fn expected(&self) -> Option<u64> {
        match (self.access, self.unit) {
            (Access::Sequential, Unit::Bytes) if self.duration.is_none() => {
                Some(self.file_bytes * self.files.len() as u64)
            }
            (Access::Segmented | Access::Strided, Unit::Bytes) => Some(self.file_bytes),
            (Access::Random { ops: Some(ops), .. }, Unit::Ops) if self.duration.is_none() => {
                Some(ops * self.workers() as u64)
            }
            _ => None,
        }
    }

    pub fn run(&self, ctx: &RunContext, target: &dyn Target) -> io::Result<PhaseResult> {
        let workers = self.workers();
        let spec = PhaseSpec {
            name: self.name.clone(),
            unit: self.unit,
            workers,
            threads: self.threads,
            duration: self.duration,
            expected: self.expected(),
            cache: target.cache_policy(self.aligned()),
        };
        let cursors: Vec<AtomicU64> = self.files.iter().map(|_| AtomicU64::new(0)).collect();
        let mut result =
            run_phase(ctx, &spec, |worker, meter| self.work(target, worker, meter, &cursors))?;
        // Asked again: a file system may have refused O_DIRECT during the phase.
        result.cache = target.cache_policy(self.aligned());
        Ok(result)
    }

    fn work(
        &self,
        target: &dyn Target,
        worker: usize,
        meter: &Meter,
        cursors: &[AtomicU64],
    ) -> io::Result<()> {
        let shared = matches!(self.access, Access::Segmented | Access::Strided);
        let file_index = if shared { 0 } else { worker / self.queue_depth };
        let path = &self.files[file_index];
        let writes = self.op != Op::Read;
        let mode = OpenMode {
            write: writes,
            create: false,
            size_hint: self.file_bytes,
            aligned: self.aligned(),
        };
        let mut file = target.open(path, mode)?;
        let mut buf = AlignedBuf::new(self.block);
        if !self.verify {
            fill(buf.as_mut(), worker as u64 + 1_000_000, 0);
        }
        let mut rng = match self.access {
            Access::Random { seed, .. } => Rng::new(seed ^ (worker as u64) << 32),
            _ => Rng::new(worker as u64),
        };
        let blocks = self.file_bytes.div_ceil(self.block as u64).max(1);
        let segment = self.file_bytes / self.threads.max(1) as u64;
        let mut k: u64 = 0;
        let mut wrote = false;
        while !meter.should_stop() {
            let offset = match self.access {
                Access::Sequential => {
                    let at = cursors[file_index].fetch_add(self.block as u64, Relaxed);
                    match (at < self.file_bytes, self.duration) {
                        (true, _) => at,
                        (false, Some(_)) => at % (blocks * self.block as u64),
                        (false, None) => break,
                    }
                }
                Access::Random { ops, .. } => {
                    if ops.is_some_and(|ops| k >= ops) {
                        break;
                    }
                    rng.below(blocks) * self.block as u64
                }
                Access::Segmented => {
                    let within = k * self.block as u64;
                    if within >= segment {
                        break;
                    }
                    worker as u64 * segment + within
                }
                Access::Strided => {
                    let at = (k * self.threads as u64 + worker as u64) * self.block as u64;
                    if at >= self.file_bytes {
                        break;
                    }
                    at
                }
            };
            k += 1;
            let len = (self.file_bytes - offset).min(self.block as u64) as usize;
            let read = match self.op {
                Op::Read => true,
                Op::Write => false,
                Op::Mix { read_percent } => rng.below(100) < read_percent as u64,
            };
            let data = &mut buf.as_mut()[..len];
            if read {
                let started = Instant::now();
                file.read_at(offset, data)?;
                meter.read.record(len as u64, started.elapsed());
                if self.verify {
                    verify(data, file_index as u64, offset, path)?;
                }
            } else {
                if self.verify {
                    fill(data, file_index as u64, offset);
                }
                let started = Instant::now();
                file.write_at(offset, data)?;
                meter.write.record(len as u64, started.elapsed());
                wrote = true;
            }
        }
        if wrote && self.fsync {
            file.sync()?;
        }
        file.close()
    }
}

/// Creates (empty) files, each reserved for `bytes`.
fn create_files(target: &dyn Target, files: &[String], bytes: u64) -> io::Result<()> {
    for path in files {
        let mode = OpenMode { write: true, create: true, size_hint: bytes, aligned: true };
        target.open(path, mode)?.close()?;
    }
    Ok(())
}

fn drop_caches(target: &dyn Target, files: &[String]) -> io::Result<()> {
    files.iter().try_for_each(|f| target.drop_cache(f))
}

/// Runs `body` in a fresh working directory, then removes the files it names and the directory,
/// whatever `body` returned, and fills in the file checks.
fn in_workdir(
    target: &dyn Target,
    result: &mut RunResult,
    body: impl FnOnce(&WorkDir, &mut RunResult, &mut Vec<String>) -> io::Result<()>,
) -> io::Result<()> {
    let dir = WorkDir::create(target)?;
    let mut files = Vec::new();
    let outcome = body(&dir, result, &mut files);
    result.checks.files_created += files.len() as u64;
    let mut removed = 0;
    for f in &files {
        if target.unlink(f).is_ok() {
            removed += 1;
        }
    }
    result.checks.files_removed += removed;
    let left = dir.remove(target);
    outcome?;
    result.checks.files_left = left?;
    Ok(())
}

fn round_to_block(bytes: u64, block: usize) -> u64 {
    (bytes / block as u64).max(1) * block as u64
}

/// Runs `write` (a write phase), then the same pass reading, with caches dropped between
/// (IOR's and IOzone's order); Ctrl-C after the write skips the read.
fn write_then_read(
    ctx: &RunContext,
    target: &dyn Target,
    mut phase: DataPhase<'_>,
    result: &mut RunResult,
) -> io::Result<()> {
    result.push(phase.run(ctx, target)?);
    if ctx.interrupted() {
        return Ok(());
    }
    drop_caches(target, phase.files)?;
    phase.name = "read".into();
    phase.op = Op::Read;
    result.push(phase.run(ctx, target)?);
    Ok(())
}

/// `seq`: N threads each write then read their own file (IOzone/IOR N-N).
#[derive(Clone, Debug, Serialize)]
pub struct SeqConfig {
    pub threads: usize,
    pub file_bytes: u64,
    pub transfer_bytes: usize,
    /// fsync each file before closing it after writing.
    pub fsync: bool,
    pub verify: bool,
}

pub fn seq(ctx: &RunContext, target: &dyn Target, c: &SeqConfig) -> io::Result<RunResult> {
    let mut result = RunResult::new("seq", c.threads);
    let file_bytes = round_to_block(c.file_bytes, c.transfer_bytes);
    in_workdir(target, &mut result, |dir, result, files| {
        files.extend((0..c.threads).map(|t| dir.path(&format!("t{t}"))));
        create_files(target, files, file_bytes)?;
        let pass = DataPhase::pass(
            "write",
            files,
            file_bytes,
            c.transfer_bytes,
            c.threads,
            Access::Sequential,
        );
        let phase = DataPhase { fsync: c.fsync, verify: c.verify, ..pass };
        write_then_read(ctx, target, phase, result)
    })?;
    result.checks.verified = c.verify;
    Ok(result)
}

/// `shared`: N threads write then read disjoint blocks of one file (IOR N-1).
#[derive(Clone, Debug, Serialize)]
pub struct SharedConfig {
    pub threads: usize,
    /// Bytes each thread writes.
    pub bytes_per_thread: u64,
    pub transfer_bytes: usize,
    /// Strided (transfer i of each thread next to the others') instead of segmented.
    pub strided: bool,
    pub fsync: bool,
    pub verify: bool,
}

pub fn shared(ctx: &RunContext, target: &dyn Target, c: &SharedConfig) -> io::Result<RunResult> {
    let mut result = RunResult::new("shared", c.threads);
    let per_thread = round_to_block(c.bytes_per_thread, c.transfer_bytes);
    let file_bytes = per_thread * c.threads as u64;
    in_workdir(target, &mut result, |dir, result, files| {
        files.push(dir.path("shared"));
        create_files(target, files, file_bytes)?;
        let access = if c.strided { Access::Strided } else { Access::Segmented };
        let pass = DataPhase::pass("write", files, file_bytes, c.transfer_bytes, c.threads, access);
        let phase = DataPhase { fsync: c.fsync, verify: c.verify, ..pass };
        write_then_read(ctx, target, phase, result)
    })?;
    result.checks.verified = c.verify;
    Ok(result)
}

/// `random`: small random writes then reads, each thread on its own file, with a queue depth.
#[derive(Clone, Debug, Serialize)]
pub struct RandomConfig {
    pub threads: usize,
    pub file_bytes: u64,
    pub block_bytes: usize,
    /// Requests in flight per thread (each from its own worker with its own open file).
    pub queue_depth: usize,
    /// How long each of the write and read phases runs…
    pub seconds: Option<f64>,
    /// …or how many requests each worker makes.
    pub ops_per_worker: Option<u64>,
    pub verify: bool,
    pub seed: u64,
}

/// Writes the files once, front to back, so reads find data (the `prepare` phase).
fn prepare<'a>(
    files: &'a [String],
    file_bytes: u64,
    threads: usize,
    verify: bool,
) -> DataPhase<'a> {
    let block = (1 << 20).min(file_bytes as usize);
    let pass = DataPhase::pass("prepare", files, file_bytes, block, threads, Access::Sequential);
    DataPhase { verify, ..pass }
}

fn seconds(s: Option<f64>) -> Option<Duration> {
    s.map(Duration::from_secs_f64)
}

pub fn random(ctx: &RunContext, target: &dyn Target, c: &RandomConfig) -> io::Result<RunResult> {
    let mut result = RunResult::new("random", c.threads);
    let file_bytes = round_to_block(c.file_bytes, c.block_bytes.max(1 << 20));
    in_workdir(target, &mut result, |dir, result, files| {
        files.extend((0..c.threads).map(|t| dir.path(&format!("t{t}"))));
        create_files(target, files, file_bytes)?;
        result.push(prepare(files, file_bytes, c.threads, c.verify).run(ctx, target)?);
        let mut phase = DataPhase {
            name: "randwrite".into(),
            files,
            file_bytes,
            block: c.block_bytes,
            queue_depth: c.queue_depth,
            threads: c.threads,
            op: Op::Write,
            access: Access::Random { ops: c.ops_per_worker, seed: c.seed },
            unit: Unit::Ops,
            duration: seconds(c.seconds),
            fsync: false,
            verify: c.verify,
        };
        for (name, op) in [("randwrite", Op::Write), ("randread", Op::Read)] {
            if ctx.interrupted() {
                break;
            }
            if op == Op::Read {
                drop_caches(target, files)?;
            }
            phase.name = name.into();
            phase.op = op;
            result.push(phase.run(ctx, target)?);
        }
        Ok(())
    })?;
    result.checks.verified = c.verify;
    Ok(result)
}

/// `mix`: random I/O at read shares from 100% to 0% (fio's rwmixread sweep).
#[derive(Clone, Debug, Serialize)]
pub struct MixConfig {
    pub threads: usize,
    pub file_bytes: u64,
    pub block_bytes: usize,
    pub queue_depth: usize,
    pub read_percents: Vec<u32>,
    pub seconds: Option<f64>,
    pub ops_per_worker: Option<u64>,
    pub verify: bool,
    pub seed: u64,
}

pub fn mix(ctx: &RunContext, target: &dyn Target, c: &MixConfig) -> io::Result<RunResult> {
    let mut result = RunResult::new("mix", c.threads);
    let file_bytes = round_to_block(c.file_bytes, c.block_bytes.max(1 << 20));
    in_workdir(target, &mut result, |dir, result, files| {
        files.extend((0..c.threads).map(|t| dir.path(&format!("t{t}"))));
        create_files(target, files, file_bytes)?;
        result.push(prepare(files, file_bytes, c.threads, c.verify).run(ctx, target)?);
        for &read_percent in &c.read_percents {
            if ctx.interrupted() {
                break;
            }
            drop_caches(target, files)?;
            let phase = DataPhase {
                name: format!("read{read_percent}"),
                files,
                file_bytes,
                block: c.block_bytes,
                queue_depth: c.queue_depth,
                threads: c.threads,
                op: Op::Mix { read_percent },
                access: Access::Random { ops: c.ops_per_worker, seed: c.seed },
                unit: Unit::Ops,
                duration: seconds(c.seconds),
                fsync: false,
                verify: c.verify,
            };
            result.push(phase.run(ctx, target)?);
        }
        Ok(())
    })?;
    result.checks.verified = c.verify;
    Ok(result)
}

/// `corners`: 4 KiB random read and write, 64 KiB sequential read and write.
#[derive(Clone, Debug, Serialize)]
pub struct CornersConfig {
    pub threads: usize,
    pub file_bytes: u64,
    pub queue_depth: usize,
    pub seconds: Option<f64>,
    pub ops_per_worker: Option<u64>,
    pub verify: bool,
    pub seed: u64,
}

pub fn corners(ctx: &RunContext, target: &dyn Target, c: &CornersConfig) -> io::Result<RunResult> {
    let mut result = RunResult::new("corners", c.threads);
    let file_bytes = round_to_block(c.file_bytes, 1 << 20);
    let random = Access::Random { ops: c.ops_per_worker, seed: c.seed };
    let corners = [
        ("seqwrite-64k", Op::Write, Access::Sequential, 64 << 10, Unit::Bytes),
        ("seqread-64k", Op::Read, Access::Sequential, 64 << 10, Unit::Bytes),
        ("randwrite-4k", Op::Write, random, 4 << 10, Unit::Ops),
        ("randread-4k", Op::Read, random, 4 << 10, Unit::Ops),
    ];
    in_workdir(target, &mut result, |dir, result, files| {
        files.extend((0..c.threads).map(|t| dir.path(&format!("t{t}"))));
        create_files(target, files, file_bytes)?;
        result.push(prepare(files, file_bytes, c.threads, c.verify).run(ctx, target)?);
        for (name, op, access, block, unit) in corners {
            if ctx.interrupted() {
                break;
            }
            if op == Op::Read {
                drop_caches(target, files)?;
            }
            let phase = DataPhase {
                name: name.into(),
                files,
                file_bytes,
                block,
                queue_depth: c.queue_depth,
                threads: c.threads,
                op,
                access,
                unit,
                // Sequential corners without a duration make one pass per file.
                duration: seconds(c.seconds),
                fsync: false,
                verify: c.verify,
            };
            result.push(phase.run(ctx, target)?);
        }
        Ok(())
    })?;
    result.checks.verified = c.verify;
    Ok(result)
}
