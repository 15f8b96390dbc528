//! `meta`: mdtest's create / stat / read / remove of many small files.
//!
//! Each thread owns `dirs_per_thread` directories of `files_per_dir` files (unique mode), or
//! all threads share the directories and name their files apart (shared mode, as mdtest
//! without `-u`). The tree is made before and removed after the measured phases.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use serde::Serialize;

use crate::common::{RunResult, WorkDir, fill, verify};
use crate::meter::{PhaseResult, PhaseSpec, RunContext, Unit, run_phase};
use crate::target::{OpenMode, Target, join};

#[derive(Clone, Debug, Serialize)]
pub struct MetaConfig {
    pub threads: usize,
    pub files_per_dir: usize,
    pub dirs_per_thread: usize,
    /// Bytes written into each file at create and read back (0, 3 KiB, 4 KiB…).
    pub file_bytes: usize,
    /// All threads work in the same directories.
    pub shared_dirs: bool,
    pub verify: bool,
}

impl MetaConfig {
    pub fn files(&self) -> u64 {
        (self.threads * self.dirs_per_thread * self.files_per_dir) as u64
    }
}

/// The four measured phases, in order.
pub const META_PHASES: [&str; 4] = ["create", "stat", "read", "remove"];

/// A tree of files under a directory, run phase by phase (IO500 interleaves the phases of
/// two trees).
pub(crate) struct MetaTree<'a> {
    /// The tree's directory (made by [`MetaTree::make`]).
    root: String,
    c: &'a MetaConfig,
    /// Files thread t got to in the create phase (all of them unless interrupted).
    created: Vec<AtomicUsize>,
}

impl<'a> MetaTree<'a> {
    pub(crate) fn new(root: String, c: &'a MetaConfig) -> MetaTree<'a> {
        MetaTree { root, c, created: (0..c.threads).map(|_| AtomicUsize::new(0)).collect() }
    }

    fn dirs(&self) -> Vec<String> {
        let mut dirs = vec![self.root.clone()];
        if self.c.shared_dirs {
            dirs.extend((0..self.c.dirs_per_thread).map(|d| join(&self.root, &format!("d{d}"))));
        } else {
            for t in 0..self.c.threads {
                dirs.push(join(&self.root, &format!("t{t}")));
                for d in 0..self.c.dirs_per_thread {
                    dirs.push(join(&self.root, &format!("t{t}/d{d}")));
                }
            }
        }
        dirs
    }

    /// The `i`-th file of thread `t`.
    fn file(&self, t: usize, i: usize) -> String {
        let d = i / self.c.files_per_dir;
        let f = i % self.c.files_per_dir;
        if self.c.shared_dirs {
            join(&self.root, &format!("d{d}/t{t}.f{f}"))
        } else {
            join(&self.root, &format!("t{t}/d{d}/f{f}"))
        }
    }

    /// A stable id of a file for its data pattern.
    fn file_id(&self, t: usize, i: usize) -> u64 {
        ((t as u64) << 32) | i as u64
    }

    pub(crate) fn make(&self, target: &dyn Target) -> io::Result<()> {
        self.dirs().iter().try_for_each(|d| target.mkdir(d))
    }

    /// Removes the (emptied) directories.
    pub(crate) fn unmake(&self, target: &dyn Target) -> io::Result<()> {
        self.dirs().iter().rev().try_for_each(|d| target.rmdir(d))
    }

    pub(crate) fn created(&self) -> u64 {
        self.created.iter().map(|n| n.load(Relaxed) as u64).sum()
    }

    /// Runs one of [`META_PHASES`] over every file, measured as `name`. The remove phase
    /// runs to its end even after Ctrl-C, so nothing is left behind.
    pub(crate) fn phase(
        &self,
        ctx: &RunContext,
        target: &dyn Target,
        which: &str,
        name: &str,
    ) -> io::Result<PhaseResult> {
        let c = self.c;
        let per_thread = c.dirs_per_thread * c.files_per_dir;
        let spec = PhaseSpec {
            name: name.into(),
            unit: Unit::Ops,
            workers: c.threads,
            threads: c.threads,
            duration: None,
            expected: Some(if which == "create" { c.files() } else { self.created() }),
            cache: "metadata: no cache control (as mdtest)".into(),
        };
        let phase_ctx = if which == "remove" {
            RunContext { progress: ctx.progress, ..RunContext::quiet() }
        } else {
            ctx.clone()
        };
        run_phase(&phase_ctx, &spec, |t, meter| {
            let mut buf = vec![0u8; c.file_bytes];
            let count = if which == "create" { per_thread } else { self.created[t].load(Relaxed) };
            for i in 0..count {
                if meter.should_stop() {
                    break;
                }
                let path = self.file(t, i);
                let started = Instant::now();
                match which {
                    "create" => {
                        let mode = OpenMode {
                            write: true,
                            create: true,
                            size_hint: c.file_bytes as u64,
                            aligned: false,
                        };
                        let mut f = target.open(&path, mode)?;
                        if c.file_bytes > 0 {
                            fill(&mut buf, self.file_id(t, i), 0);
                            f.write_at(0, &buf)?;
                        }
                        f.close()?;
                        self.created[t].store(i + 1, Relaxed);
                        meter.write.record(c.file_bytes as u64, started.elapsed());
                    }
                    "stat" => {
                        let size = target.stat(&path)?;
                        if size != c.file_bytes as u64 {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!(
                                    "{path}: stat says {size} bytes, {} were written",
                                    c.file_bytes
                                ),
                            ));
                        }
                        meter.other.record(0, started.elapsed());
                    }
                    "read" => {
                        let mode =
                            OpenMode { write: false, create: false, size_hint: 0, aligned: false };
                        let mut f = target.open(&path, mode)?;
                        if c.file_bytes > 0 {
                            f.read_at(0, &mut buf)?;
                        }
                        f.close()?;
                        meter.read.record(c.file_bytes as u64, started.elapsed());
                        if c.verify && c.file_bytes > 0 {
                            verify(&buf, self.file_id(t, i), 0, &path)?;
                        }
                    }
                    _ => {
                        target.unlink(&path)?;
                        meter.other.record(0, started.elapsed());
                    }
                }
            }
            Ok(())
        })
    }
}

pub fn meta(ctx: &RunContext, target: &dyn Target, c: &MetaConfig) -> io::Result<RunResult> {
    if !target.has_namespace() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{}: the metadata workload needs a file system, not a block device",
                target.label()
            ),
        ));
    }
    let mut result = RunResult::new("meta", c.threads);
    let dir = WorkDir::create(target)?;
    let tree = MetaTree::new(dir.path("tree"), c);
    let outcome = run_tree(ctx, target, &tree, &mut result);
    // Whatever happened, remove what is left (a failed run leaves files).
    let left = dir.remove(target);
    outcome?;
    result.checks.files_left = left?;
    result.checks.verified = c.verify;
    Ok(result)
}

fn run_tree(
    ctx: &RunContext,
    target: &dyn Target,
    tree: &MetaTree<'_>,
    result: &mut RunResult,
) -> io::Result<()> {
    tree.make(target)?;
    for phase in META_PHASES {
        if ctx.interrupted() && phase != "remove" {
            continue;
        }
        let measured = tree.phase(ctx, target, phase, phase)?;
        if phase == "remove" {
            result.checks.files_removed = measured.other.ops;
        }
        result.push(measured);
    }
    result.checks.files_created = tree.created();
    tree.unmake(target)
}
