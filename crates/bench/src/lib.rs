//! `stria bench`: the standard HPC measurements (IOR/IOzone N-N and N-1 sequential, 4 KiB
//! random, mdtest, fio mixes, the four corners, frametest's video frames and IO500's phases),
//! run against any mounted file system, Stria's client library or a block device, with the
//! reference tables' peak and sustained figures, JSON, and charts of sweeps.
//!
//! A [`Plan`] runs one [`Workload`] at one or more thread counts, a number of times, on one or
//! more [`Target`]s. Targets are interleaved run by run (target A, target B, target A, …) so a
//! noisy machine hurts them alike, and the first target is the baseline of the ratios.
//!
//! Every run works in its own directory under the target's root and removes it; the checks of
//! each run (bytes written and read, files created, removed and left) are in the report.

mod block;
pub mod chart;
mod common;
mod data;
mod frames;
mod io500;
mod meta;
mod meter;
mod native;
mod posix;
pub mod report;
mod target;

use std::io;

pub use block::{BlockConnection, BlockDevice, BlockTarget, NbdDevice, VolumeDevice};
pub use common::{Checks, RunResult};
pub use data::{CornersConfig, MixConfig, RandomConfig, SeqConfig, SharedConfig};
pub use frames::{FrameStats, FramesConfig};
pub use io500::{
    IOR_HARD_TRANSFER_BYTES, Io500Config, Io500Score, MDTEST_HARD_FILE_BYTES, NOT_OFFICIAL,
};
pub use meta::{META_PHASES, MetaConfig};
pub use meter::{ChannelResult, Latency, PhaseResult, RunContext, Unit};
pub use native::NativeTarget;
pub use posix::{CacheMode, PosixTarget};
pub use report::Report;
pub use target::{DataFile, Entry, OpenMode, Target, TargetKind};

/// One workload with its parameters.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(tag = "workload", rename_all = "snake_case")]
pub enum Workload {
    Seq(SeqConfig),
    Shared(SharedConfig),
    Random(RandomConfig),
    Meta {
        #[serde(flatten)]
        config: MetaConfig,
        /// Keep the total number of files constant across thread counts (mdtest's
        /// directories per thread = total / threads / files per directory).
        total_files: Option<u64>,
    },
    Mix(MixConfig),
    Corners(CornersConfig),
    Frames(FramesConfig),
    Io500(Io500Config),
}

impl Workload {
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Seq(_) => "seq",
            Workload::Shared(_) => "shared",
            Workload::Random(_) => "random",
            Workload::Meta { .. } => "meta",
            Workload::Mix(_) => "mix",
            Workload::Corners(_) => "corners",
            Workload::Frames(_) => "frames",
            Workload::Io500(_) => "io500",
        }
    }

    pub fn threads(&self) -> usize {
        match self {
            Workload::Seq(c) => c.threads,
            Workload::Shared(c) => c.threads,
            Workload::Random(c) => c.threads,
            Workload::Meta { config, .. } => config.threads,
            Workload::Mix(c) => c.threads,
            Workload::Corners(c) => c.threads,
            Workload::Frames(c) => c.streams,
            Workload::Io500(c) => c.threads,
        }
    }

    /// The same workload at another thread (or stream) count.
    pub fn with_threads(&self, threads: usize) -> Workload {
        let mut w = self.clone();
        match &mut w {
            Workload::Seq(c) => c.threads = threads,
            Workload::Shared(c) => c.threads = threads,
            Workload::Random(c) => c.threads = threads,
            Workload::Meta { config, total_files } => {
                config.threads = threads;
                if let Some(total) = total_files {
                    let per_dir = config.files_per_dir.max(1) as u64;
                    config.dirs_per_thread = (*total / threads as u64 / per_dir).max(1) as usize;
                }
            }
            Workload::Mix(c) => c.threads = threads,
            Workload::Corners(c) => c.threads = threads,
            Workload::Frames(c) => c.streams = threads,
            Workload::Io500(c) => c.threads = threads,
        }
        w
    }

    /// Whether the workload can run on a block device.
    pub fn needs_namespace(&self) -> bool {
        matches!(self, Workload::Meta { .. } | Workload::Io500(_))
    }

    pub fn run(&self, ctx: &RunContext, target: &dyn Target) -> io::Result<RunResult> {
        match self {
            Workload::Seq(c) => data::seq(ctx, target, c),
            Workload::Shared(c) => data::shared(ctx, target, c),
            Workload::Random(c) => data::random(ctx, target, c),
            Workload::Meta { config, .. } => meta::meta(ctx, target, config),
            Workload::Mix(c) => data::mix(ctx, target, c),
            Workload::Corners(c) => data::corners(ctx, target, c),
            Workload::Frames(c) => frames::frames(ctx, target, c),
            Workload::Io500(c) => io500::io500(ctx, target, c),
        }
    }
}

/// Thread counts of a sweep: 1, 2, 4 … up to `max`, and `max` itself.
pub fn sweep_counts(max: usize) -> Vec<usize> {
    let mut counts = Vec::new();
    let mut n = 1;
    while n < max {
        counts.push(n);
        n *= 2;
    }
    counts.push(max.max(1));
    counts
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub workload: Workload,
    /// One entry, or a sweep's counts.
    pub thread_counts: Vec<usize>,
    /// Repetitions of each (thread count, target) cell, interleaved across targets.
    pub runs: usize,
    pub sweep: bool,
}

/// Runs the plan; `on_run` sees each run as it ends (for a progress log). A run that fails
/// stops the plan with its error, naming the target; Ctrl-C (the context's stop flag) ends
/// it after the current phase with the results so far.
pub fn execute(
    ctx: &RunContext,
    plan: &Plan,
    targets: &[Box<dyn Target>],
    mut on_run: impl FnMut(&str, &RunResult),
) -> io::Result<Report> {
    if plan.workload.needs_namespace()
        && let Some(t) = targets.iter().find(|t| !t.has_namespace())
    {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{}: the {} workload needs a file system, not a block device",
                t.label(),
                plan.workload.name()
            ),
        ));
    }
    let infos =
        targets.iter().map(|t| report::TargetInfo { label: t.label(), kind: t.kind() }).collect();
    let config = serde_json::to_value(&plan.workload).unwrap_or_default();
    let mut report = Report::new(plan.workload.name(), plan.sweep, plan.runs, config, infos);
    if matches!(plan.workload, Workload::Io500(_)) {
        report.notes.push(NOT_OFFICIAL.into());
    }
    'all: for &threads in &plan.thread_counts {
        let workload = plan.workload.with_threads(threads);
        for run in 1..=plan.runs.max(1) {
            for (index, target) in targets.iter().enumerate() {
                if ctx.interrupted() {
                    break 'all;
                }
                let result = workload.run(ctx, target.as_ref()).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "{} on {} ({threads} threads): {e}",
                            workload.name(),
                            target.label()
                        ),
                    )
                })?;
                on_run(&target.label(), &result);
                report.records.push(report::Record { target: index, run, result });
            }
        }
    }
    report.finish();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_double_up_to_the_maximum() {
        assert_eq!(sweep_counts(1), vec![1]);
        assert_eq!(sweep_counts(8), vec![1, 2, 4, 8]);
        assert_eq!(sweep_counts(6), vec![1, 2, 4, 6]);
    }
}
