//! `io500`: the IO500 phases at a small scale, with IO500's scoring formula. This is not an
//! official IO500 submission (no stonewalling, no 300-second phases, one node, our own
//! implementations of ior, mdtest and find), and every output says so.
//!
//! Phases, in IO500's order: ior-easy-write, mdtest-easy-write, ior-hard-write,
//! mdtest-hard-write, find, ior-easy-read, mdtest-easy-stat, ior-hard-read, mdtest-hard-stat,
//! mdtest-easy-delete, mdtest-hard-read, mdtest-hard-delete.
//!
//! - ior-easy: each thread its own file, 1 MiB transfers.
//! - ior-hard: one shared file, 47,008-byte transfers interleaved between threads.
//! - mdtest-easy: empty files, each thread its own directory.
//! - mdtest-hard: 3,901-byte files, all threads in one directory.
//! - find: walks the whole tree and matches files by name and size, one thread.
//!
//! Score: the bandwidth score is the geometric mean of the four ior phases in GiB/s, the
//! metadata score the geometric mean of the eight others in kIOPS; the total is the square
//! root of their product.

use std::io;
use std::time::Instant;

use serde::Serialize;

use crate::common::{RunResult, WorkDir};
use crate::data::{Access, DataPhase, Op};
use crate::meta::{MetaConfig, MetaTree};
use crate::meter::{PhaseResult, PhaseSpec, RunContext, Unit, run_phase};
use crate::target::{OpenMode, Target, join};

/// IO500's ior-hard transfer size.
pub const IOR_HARD_TRANSFER_BYTES: usize = 47_008;
/// IO500's mdtest-hard file size.
pub const MDTEST_HARD_FILE_BYTES: usize = 3_901;
const IOR_EASY_TRANSFER_BYTES: usize = 1 << 20;

pub const NOT_OFFICIAL: &str =
    "IO500-style run at a small scale: NOT an official IO500 submission or score";

#[derive(Clone, Debug, Serialize)]
pub struct Io500Config {
    pub threads: usize,
    /// ior-easy bytes per thread.
    pub easy_bytes_per_thread: u64,
    /// ior-hard transfers per thread.
    pub hard_transfers_per_thread: u64,
    /// mdtest-easy files per thread.
    pub easy_files_per_thread: usize,
    /// mdtest-hard files per thread.
    pub hard_files_per_thread: usize,
    pub verify: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Io500Score {
    pub note: &'static str,
    pub bandwidth_gib_per_s: f64,
    pub metadata_kiops: f64,
    pub score: f64,
}

fn geometric_mean(values: &[f64]) -> f64 {
    if values.is_empty() || values.iter().any(|v| *v <= 0.0) {
        return 0.0;
    }
    (values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp()
}

/// IO500's formula over the phases of a run.
pub fn score(phases: &[PhaseResult]) -> Io500Score {
    let bw: Vec<f64> =
        phases.iter().filter(|p| p.phase.starts_with("ior-")).map(|p| p.rate / 1024.0).collect();
    let md: Vec<f64> =
        phases.iter().filter(|p| !p.phase.starts_with("ior-")).map(|p| p.rate / 1000.0).collect();
    let bandwidth = geometric_mean(&bw);
    let metadata = geometric_mean(&md);
    Io500Score {
        note: NOT_OFFICIAL,
        bandwidth_gib_per_s: bandwidth,
        metadata_kiops: metadata,
        score: (bandwidth * metadata).sqrt(),
    }
}

pub fn io500(ctx: &RunContext, target: &dyn Target, c: &Io500Config) -> io::Result<RunResult> {
    if !target.has_namespace() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{}: io500 needs a file system, not a block device", target.label()),
        ));
    }
    let mut result = RunResult::new("io500", c.threads);
    let dir = WorkDir::create(target)?;
    let outcome = run(ctx, target, &dir, c, &mut result);
    let left = dir.remove(target);
    outcome?;
    result.checks.files_left = left?;
    result.checks.verified = c.verify;
    if !result.interrupted {
        result.extra = Some(serde_json::to_value(score(&result.phases)).unwrap_or_default());
    }
    Ok(result)
}

fn run(
    ctx: &RunContext,
    target: &dyn Target,
    dir: &WorkDir,
    c: &Io500Config,
    result: &mut RunResult,
) -> io::Result<()> {
    let easy_md = MetaConfig {
        threads: c.threads,
        files_per_dir: c.easy_files_per_thread.max(1),
        dirs_per_thread: 1,
        file_bytes: 0,
        shared_dirs: false,
        verify: false,
    };
    let hard_md = MetaConfig {
        threads: c.threads,
        files_per_dir: c.hard_files_per_thread.max(1),
        dirs_per_thread: 1,
        file_bytes: MDTEST_HARD_FILE_BYTES,
        shared_dirs: true,
        verify: c.verify,
    };
    let easy_tree = MetaTree::new(dir.path("mdtest-easy"), &easy_md);
    let hard_tree = MetaTree::new(dir.path("mdtest-hard"), &hard_md);
    easy_tree.make(target)?;
    hard_tree.make(target)?;
    target.mkdir(&dir.path("ior-easy"))?;
    target.mkdir(&dir.path("ior-hard"))?;

    let easy_bytes = (c.easy_bytes_per_thread / IOR_EASY_TRANSFER_BYTES as u64).max(1)
        * IOR_EASY_TRANSFER_BYTES as u64;
    let easy_files: Vec<String> =
        (0..c.threads).map(|t| dir.path(&format!("ior-easy/t{t}"))).collect();
    let hard_files = vec![dir.path("ior-hard/shared")];
    let hard_bytes =
        c.hard_transfers_per_thread.max(1) * c.threads as u64 * IOR_HARD_TRANSFER_BYTES as u64;
    for (files, bytes) in [(&easy_files, easy_bytes), (&hard_files, hard_bytes)] {
        for f in files.iter() {
            let mode = OpenMode { write: true, create: true, size_hint: bytes, aligned: true };
            target.open(f, mode)?.close()?;
        }
    }
    let ior = |name: &str, hard: bool, op: Op| {
        let pass = if hard {
            DataPhase::pass(
                name,
                &hard_files,
                hard_bytes,
                IOR_HARD_TRANSFER_BYTES,
                c.threads,
                Access::Strided,
            )
        } else {
            DataPhase::pass(
                name,
                &easy_files,
                easy_bytes,
                IOR_EASY_TRANSFER_BYTES,
                c.threads,
                Access::Sequential,
            )
        };
        DataPhase { op, fsync: true, verify: c.verify, ..pass }
    };
    let drop_all = |files: &[String]| files.iter().try_for_each(|f| target.drop_cache(f));

    // Each phase runs unless the user interrupted; removal phases always run (the tree's
    // `remove` phase ignores Ctrl-C itself).
    let mut run = |name: &str, phase: &dyn Fn(&str) -> io::Result<PhaseResult>| {
        if !ctx.interrupted() || name.ends_with("-delete") {
            result.push(phase(name)?);
        }
        io::Result::Ok(())
    };
    let ior_easy = |op: Op| move |name: &str| ior(name, false, op).run(ctx, target);
    let ior_hard = |op: Op| move |name: &str| ior(name, true, op).run(ctx, target);
    run("ior-easy-write", &ior_easy(Op::Write))?;
    run("mdtest-easy-write", &|name| easy_tree.phase(ctx, target, "create", name))?;
    run("ior-hard-write", &ior_hard(Op::Write))?;
    run("mdtest-hard-write", &|name| hard_tree.phase(ctx, target, "create", name))?;
    run("find", &|_| find(ctx, target, &dir.root))?;
    run("ior-easy-read", &|name| {
        drop_all(&easy_files)?;
        ior_easy(Op::Read)(name)
    })?;
    run("mdtest-easy-stat", &|name| easy_tree.phase(ctx, target, "stat", name))?;
    run("ior-hard-read", &|name| {
        drop_all(&hard_files)?;
        ior_hard(Op::Read)(name)
    })?;
    run("mdtest-hard-stat", &|name| hard_tree.phase(ctx, target, "stat", name))?;
    run("mdtest-easy-delete", &|name| easy_tree.phase(ctx, target, "remove", name))?;
    run("mdtest-hard-read", &|name| hard_tree.phase(ctx, target, "read", name))?;
    run("mdtest-hard-delete", &|name| hard_tree.phase(ctx, target, "remove", name))?;
    result.checks.files_created =
        easy_tree.created() + hard_tree.created() + easy_files.len() as u64 + 1;
    let mut removed = 0;
    for f in easy_files.iter().chain(&hard_files) {
        target.unlink(f)?;
        removed += 1;
    }
    result.checks.files_removed = removed
        + result.phase("mdtest-easy-delete").map_or(0, |p| p.other.ops)
        + result.phase("mdtest-hard-delete").map_or(0, |p| p.other.ops);
    easy_tree.unmake(target)?;
    hard_tree.unmake(target)?;
    target.rmdir(&dir.path("ior-easy"))?;
    target.rmdir(&dir.path("ior-hard"))?;
    Ok(())
}

/// Walks the tree under `root`, stats every file and counts those whose name contains "1"
/// and whose size is mdtest-hard's (as IO500's find matches by name, size and time).
fn find(ctx: &RunContext, target: &dyn Target, root: &str) -> io::Result<PhaseResult> {
    let spec = PhaseSpec {
        name: "find".into(),
        unit: Unit::Ops,
        workers: 1,
        threads: 1,
        duration: None,
        expected: None,
        cache: "metadata: no cache control".into(),
    };
    run_phase(ctx, &spec, |_, meter| {
        let mut stack = vec![root.to_string()];
        while let Some(dir) = stack.pop() {
            for entry in target.list(&dir)? {
                if meter.should_stop() {
                    return Ok(());
                }
                let path = join(&dir, &entry.name);
                let started = Instant::now();
                if entry.is_dir {
                    stack.push(path);
                } else {
                    let size = target.stat(&path)?;
                    let matched = entry.name.contains('1') && size == MDTEST_HARD_FILE_BYTES as u64;
                    // Matches are counted as reads, the rest as other operations.
                    if matched {
                        meter.read.record(0, started.elapsed());
                    } else {
                        meter.other.record(0, started.elapsed());
                    }
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_geometric_mean_of_equal_values_is_that_value() {
        assert!((geometric_mean(&[2.0, 2.0, 2.0]) - 2.0).abs() < 1e-12);
        assert!((geometric_mean(&[1.0, 4.0]) - 2.0).abs() < 1e-12);
        assert_eq!(geometric_mean(&[1.0, 0.0]), 0.0);
    }
}
