//! `stria chaos kill`: kill -9 of the whole node, or of one of its roles, at random moments,
//! many times in a row.
//!
//! A workload thread writes, overwrites, renames, truncates and unlinks files through the
//! mount, and fsyncs each change (and the directories it touches) before starting the next. It
//! keeps a journal: the content of every file as of its last completed change, plus the one
//! change in flight. Some cycles first fail a drive and start a rebuild onto a new one. At a
//! seeded moment the node is killed with SIGKILL; then `stria fsck` must find the stopped node
//! clean, and after a restart every file must hold exactly its journaled content, except the
//! change in flight, which may have landed, not landed, or (for a write) partly landed with
//! each byte old or new. What the in-flight change left is fsynced and becomes the journal's.
//!
//! With `--role storage`, `--role meta` or `--role any`, the node runs with `--separate-roles`
//! and only that role's process is killed: the mount stays up and the workload's change in
//! flight fails (or completes, if it finished before the kill reached it). Once the supervisor
//! has recovered and restarted the roles, the files are verified through the same mount; then
//! the node is stopped cleanly, `stria fsck` must find it clean, and it starts again.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Args;
use stria_raid::Level;

use super::node::{Node, ScratchArgs, require_fuse};
use super::{CampaignArgs, Tally};
use crate::epochs::Role;
use crate::rng::SplitMix64;
use crate::up::NodeRecord;
use crate::usage;

/// File names per directory the workload uses; bounds the data a verification reads.
const NAMES_PER_DIR: u64 = 12;
const DIRS: [&str; 2] = ["a", "b"];
/// The workload's directory under the mount.
const WORK_DIR: &str = "chaos";
/// Size of each drive file of the node.
const DRIVE_SIZE: &str = "256M";
/// How long the workload may take to notice the node is gone.
const WORKER_EXIT_LIMIT: Duration = Duration::from_secs(60);
/// A little more than the mount's short attribute timeout (1 s), and than its watcher's pause
/// before it asks the restarted metadata service again and, told it missed changes, drops
/// every attribute the kernel cached.
const ATTR_TTL: Duration = Duration::from_millis(1200);
/// Most bytes one write or overwrite adds.
const WRITE_BYTES_MAX: u64 = 2 << 20;

#[derive(Args, Debug)]
pub struct KillArgs {
    /// RAID level of the node's target: 1, 10, 5 or 6 (a redundant level, so rebuild cycles
    /// can fail a drive).
    #[arg(long, default_value = "5")]
    raid: String,
    /// Percentage of cycles that fail a drive and rebuild onto a new one while the workload
    /// runs, so the kill can land during the rebuild.
    #[arg(long, default_value_t = 30)]
    rebuild_percent: u64,
    /// The kill comes at a seeded moment up to this many milliseconds into the workload.
    #[arg(long, default_value_t = 2500)]
    kill_within_ms: u64,
    /// What is killed: the whole node, or one role process of a node run with
    /// --separate-roles (storage, meta, or any: a seeded pick per cycle).
    #[arg(long, default_value = "node", value_parser = ["node", "storage", "meta", "any"])]
    role: String,
    #[command(flatten)]
    campaign: CampaignArgs,
    #[command(flatten)]
    scratch: ScratchArgs,
}

/// The change in flight when the node died: what it may have left.
#[derive(Clone, Debug)]
enum Doubt {
    Write { name: String, before: Option<Vec<u8>>, after: Vec<u8>, truncating: bool },
    Rename { from: String, to: String, moved: Vec<u8>, replaced: Option<Vec<u8>> },
    Truncate { name: String, before: Vec<u8>, after: Vec<u8> },
    Unlink { name: String, before: Vec<u8> },
}

impl Doubt {
    fn names(&self) -> Vec<&str> {
        match self {
            Doubt::Write { name, .. }
            | Doubt::Truncate { name, .. }
            | Doubt::Unlink { name, .. } => {
                vec![name]
            }
            Doubt::Rename { from, to, .. } => vec![from, to],
        }
    }

    fn describe(&self) -> String {
        match self {
            Doubt::Write { name, after, truncating, .. } => {
                let what = if *truncating { "overwrite" } else { "write" };
                format!("{what} {name} ({} bytes)", after.len())
            }
            Doubt::Rename { from, to, .. } => format!("rename {from} -> {to}"),
            Doubt::Truncate { name, after, .. } => format!("truncate {name} to {}", after.len()),
            Doubt::Unlink { name, .. } => format!("unlink {name}"),
        }
    }

    /// Whether `found` (each name's content, None if absent) is a state the change may have
    /// left, and if so which.
    fn judge(&self, found: &BTreeMap<String, Option<Vec<u8>>>) -> Result<&'static str, String> {
        let get = |name: &str| found.get(name).cloned().flatten();
        match self {
            Doubt::Write { name, before, after, truncating } => {
                let Some(got) = get(name) else {
                    return if before.is_none() {
                        Ok("not landed")
                    } else {
                        Err(format!("{name} is gone"))
                    };
                };
                let old = before.as_deref().unwrap_or(&[]);
                if got == *after {
                    return Ok("landed");
                }
                if before.as_deref() == Some(&got[..]) {
                    return Ok("not landed");
                }
                let longest = old.len().max(after.len());
                let shortest = if *truncating { 0 } else { old.len() };
                if !(shortest..=longest).contains(&got.len()) {
                    return Err(format!(
                        "{name} has {} bytes; before {} and after {}",
                        got.len(),
                        old.len(),
                        after.len()
                    ));
                }
                let bad = got
                    .iter()
                    .enumerate()
                    .position(|(i, b)| old.get(i) != Some(b) && after.get(i) != Some(b) && *b != 0);
                match bad {
                    None => Ok("partly landed"),
                    Some(at) => Err(format!("{name} byte {at} is neither old nor new")),
                }
            }
            Doubt::Rename { from, to, moved, replaced } => match (get(from), get(to)) {
                (Some(f), t) if f == *moved && t == *replaced => Ok("not landed"),
                (None, Some(t)) if t == *moved => Ok("landed"),
                (f, t) => Err(format!(
                    "after rename {from} -> {to}: {from} {}, {to} {}",
                    describe_content(f.as_deref(), moved),
                    describe_content(t.as_deref(), moved)
                )),
            },
            Doubt::Truncate { name, before, after } => match get(name) {
                Some(got) if got == *after => Ok("landed"),
                Some(got) if got == *before => Ok("not landed"),
                Some(got) => Err(format!(
                    "{name} has {} bytes, neither the {} before nor the {} after the truncate \
                     (or differs inside)",
                    got.len(),
                    before.len(),
                    after.len()
                )),
                None => Err(format!("{name} is gone after a truncate")),
            },
            Doubt::Unlink { name, before } => match get(name) {
                None => Ok("landed"),
                Some(got) if got == *before => Ok("not landed"),
                Some(_) => Err(format!("{name} changed although only an unlink was in flight")),
            },
        }
    }
}

fn describe_content(got: Option<&[u8]>, moved: &[u8]) -> String {
    match got {
        None => "absent".into(),
        Some(g) if g == moved => "holds the moved file".into(),
        Some(g) => format!("holds {} other bytes", g.len()),
    }
}

/// What the workload knows is durable: each file's content after its last completed change.
#[derive(Debug, Default)]
struct Journal {
    files: BTreeMap<String, Vec<u8>>,
    doubt: Option<Doubt>,
    /// Changes completed (fsynced) over the whole campaign.
    done: u64,
    /// The contents the last changes left (change number, name, content), newest last: a
    /// wrong read is compared with them to say which older state it shows.
    past: std::collections::VecDeque<(u64, String, Vec<u8>)>,
}

/// Changes whose results [`Journal::past`] keeps.
const PAST_KEPT: usize = 48;

/// What the workload thread hands back when it stops.
struct WorkerEnd {
    journal: Journal,
    ops: u64,
    /// An error the workload met before the node was killed: a real failure.
    early_error: Option<String>,
    /// Reads of completed files that differed from the journal while the node ran.
    live_mismatches: Vec<String>,
}

impl Journal {
    /// A change to `name` is durable: it now holds `content`.
    fn record(&mut self, name: String, content: Vec<u8>) {
        if self.past.len() == PAST_KEPT {
            self.past.pop_front();
        }
        self.past.push_back((self.done + 1, name.clone(), content.clone()));
        self.files.insert(name, content);
    }
}

/// With `STRIA_CHAOS_TRACE=FILE`, every change is appended there as one line (for working
/// out what led to a failure).
fn trace(line: impl FnOnce() -> String) {
    static TRACE: std::sync::OnceLock<Option<std::sync::Mutex<File>>> = std::sync::OnceLock::new();
    let file = TRACE.get_or_init(|| {
        let path = std::env::var_os("STRIA_CHAOS_TRACE")?;
        let file = OpenOptions::new().create(true).append(true).open(path).ok()?;
        Some(std::sync::Mutex::new(file))
    });
    if let Some(file) = file {
        let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(file, "{}", line());
    }
}

fn ino_of(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| std::os::unix::fs::MetadataExt::ino(&m))
}

/// Which kept past content shows the bytes `got` holds where it differs from the journal.
fn matching_past(journal: &Journal, got: &[u8], expected: &[u8]) -> String {
    let common = got.len().min(expected.len());
    let Some(first) = (0..common).find(|&i| got[i] != expected[i]) else { return String::new() };
    let last = (0..common).rev().find(|&i| got[i] != expected[i]).unwrap_or(first);
    for (done, name, content) in journal.past.iter().rev() {
        if content.len() > last && content[first..=last] == got[first..=last] {
            return format!(
                "; those bytes are what change #{done} left in {name} ({} changes ago)",
                journal.done - done
            );
        }
    }
    "; no kept past content matches those bytes".into()
}

/// Where two contents differ: the first and last differing offsets, how many bytes differ,
/// and how many of those read back as zero (a hole, an unwritten block).
fn mismatch_detail(got: &[u8], expected: &[u8]) -> String {
    let differing: Vec<usize> =
        (0..got.len().min(expected.len())).filter(|&i| got[i] != expected[i]).collect();
    match (differing.first(), differing.last()) {
        (Some(first), Some(last)) => format!(
            "{} bytes differ in {first}..={last}, {} of them read as zero",
            differing.len(),
            differing.iter().filter(|&&i| got[i] == 0).count()
        ),
        _ => "the common prefix is equal".into(),
    }
}

fn file_size(rng: &mut SplitMix64) -> u64 {
    match rng.below(10) {
        0..=2 => 1 + rng.below(3072),
        3..=5 => 3072 + rng.below(64 << 10),
        6..=8 => (64 << 10) + rng.below(1 << 20),
        _ => (1 << 20) + rng.below(WRITE_BYTES_MAX - (1 << 20)),
    }
}

fn random_bytes(rng: &mut SplitMix64, len: u64) -> Vec<u8> {
    let mut data = vec![0u8; len as usize];
    rng.fill(&mut data);
    data
}

fn sync_dir(path: &Path) -> std::io::Result<()> {
    File::open(path)?.sync_all()
}

/// One change, fsynced. The journal's doubt is set before the first system call and cleared
/// once everything is durable.
fn change(work: &Path, journal: &mut Journal, rng: &mut SplitMix64) -> std::io::Result<()> {
    let name = |rng: &mut SplitMix64| {
        format!("{}/f{}", DIRS[rng.below(DIRS.len() as u64) as usize], rng.below(NAMES_PER_DIR))
    };
    let existing: Vec<String> = journal.files.keys().cloned().collect();
    let pick_existing = |rng: &mut SplitMix64| {
        (!existing.is_empty()).then(|| existing[rng.below(existing.len() as u64) as usize].clone())
    };
    let dir_of = |name: &str| work.join(name.split('/').next().unwrap_or(""));
    let roll = rng.below(100);
    let target = if roll < 45 { None } else { pick_existing(rng) };
    match (roll, target) {
        (45..=54, Some(file)) => {
            // Overwrite: O_TRUNC and new content.
            let len = file_size(rng);
            let after = random_bytes(rng, len);
            let before = journal.files.get(&file).cloned();
            journal.doubt = Some(Doubt::Write {
                name: file.clone(),
                before,
                after: after.clone(),
                truncating: true,
            });
            let mut f = File::create(work.join(&file))?;
            f.write_all(&after)?;
            f.sync_all()?;
            trace(|| {
                format!(
                    "#{} overwrite {file} len {} ino {}",
                    journal.done + 1,
                    after.len(),
                    ino_of(&work.join(&file))
                )
            });
            journal.record(file, after);
        }
        (55..=69, Some(from)) => {
            let mut to = name(rng);
            if to == from {
                to = format!("{to}r");
            }
            let moved = journal.files[&from].clone();
            let replaced = journal.files.get(&to).cloned();
            journal.doubt = Some(Doubt::Rename {
                from: from.clone(),
                to: to.clone(),
                moved: moved.clone(),
                replaced,
            });
            std::fs::rename(work.join(&from), work.join(&to))?;
            sync_dir(&dir_of(&from))?;
            sync_dir(&dir_of(&to))?;
            trace(|| {
                format!(
                    "#{} rename {from} -> {to} ino {}",
                    journal.done + 1,
                    ino_of(&work.join(&to))
                )
            });
            journal.files.remove(&from);
            journal.record(to, moved);
        }
        (70..=84, Some(file)) => {
            let before = journal.files[&file].clone();
            let before_len = before.len();
            let len = rng.below(before.len() as u64 * 3 / 2 + 4096);
            let mut after = before.clone();
            after.resize(len as usize, 0);
            journal.doubt =
                Some(Doubt::Truncate { name: file.clone(), before, after: after.clone() });
            let f = OpenOptions::new().write(true).open(work.join(&file))?;
            f.set_len(len)?;
            f.sync_all()?;
            trace(|| {
                format!(
                    "#{} truncate {file} {} -> {len} ino {}",
                    journal.done + 1,
                    before_len,
                    ino_of(&work.join(&file))
                )
            });
            journal.record(file, after);
        }
        (85..=91, Some(file)) => {
            let before = journal.files[&file].clone();
            journal.doubt = Some(Doubt::Unlink { name: file.clone(), before });
            let ino = ino_of(&work.join(&file));
            std::fs::remove_file(work.join(&file))?;
            sync_dir(&dir_of(&file))?;
            trace(|| format!("#{} unlink {file} ino {ino}", journal.done + 1));
            journal.files.remove(&file);
        }
        _ => {
            // A write at a seeded offset, into an existing file or a new one.
            let file = name(rng);
            let before = journal.files.get(&file).cloned();
            let old_len = before.as_ref().map_or(0, |b| b.len() as u64);
            let offset = if old_len == 0 { 0 } else { rng.below(old_len + (64 << 10)) };
            let len = file_size(rng).min(WRITE_BYTES_MAX);
            let data = random_bytes(rng, len);
            let mut after = before.clone().unwrap_or_default();
            let end = offset as usize + data.len();
            if after.len() < end {
                after.resize(end, 0);
            }
            after[offset as usize..end].copy_from_slice(&data);
            let new = before.is_none();
            journal.doubt = Some(Doubt::Write {
                name: file.clone(),
                before,
                after: after.clone(),
                truncating: false,
            });
            let f = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(work.join(&file))?;
            f.write_all_at(&data, offset)?;
            f.sync_all()?;
            if new {
                sync_dir(&dir_of(&file))?;
            }
            trace(|| {
                format!(
                    "#{} write {file} at {offset} len {} size {} ino {}",
                    journal.done + 1,
                    data.len(),
                    after.len(),
                    ino_of(&work.join(&file))
                )
            });
            journal.record(file, after);
        }
    }
    journal.doubt = None;
    journal.done += 1;
    Ok(())
}

/// The workload: changes until one fails (the node died) or `stop` is set.
fn work(work: PathBuf, mut journal: Journal, seed: u64, killed: Arc<AtomicBool>) -> WorkerEnd {
    let mut rng = SplitMix64::new(seed);
    let mut ops = 0;
    let mut live_mismatches = Vec::new();
    loop {
        // Now and then, read a finished file back while the node runs.
        if rng.below(8) == 0 && !journal.files.is_empty() {
            let names: Vec<&String> = journal.files.keys().collect();
            let name = names[rng.below(names.len() as u64) as usize].clone();
            match std::fs::read(work.join(&name)) {
                Ok(got) if got == journal.files[&name] => {}
                Ok(got) => live_mismatches.push(
                    format!("ino {}: ", ino_of(&work.join(&name)))
                        + &format!(
                            "{name}: {} bytes read, {} expected; {}",
                            got.len(),
                            journal.files[&name].len(),
                            mismatch_detail(&got, &journal.files[&name])
                        )
                        + &matching_past(&journal, &got, &journal.files[&name]),
                ),
                Err(e) => {
                    let early = (!killed.load(SeqCst)).then(|| format!("reading {name}: {e}"));
                    return WorkerEnd { journal, ops, early_error: early, live_mismatches };
                }
            }
        }
        if let Err(e) = change(&work, &mut journal, &mut rng) {
            let early = (!killed.load(SeqCst)).then(|| {
                let doubt = journal.doubt.as_ref().map_or("?".into(), Doubt::describe);
                format!("{doubt}: {e}")
            });
            return WorkerEnd { journal, ops, early_error: early, live_mismatches };
        }
        ops += 1;
        // A killed role comes back: the workload stops at the first change that ends after
        // the kill, whether it failed or not.
        if killed.load(SeqCst) {
            return WorkerEnd { journal, ops, early_error: None, live_mismatches };
        }
    }
}

/// Reads every file of the work directory: name (relative) to content.
fn read_tree(work: &Path) -> std::io::Result<BTreeMap<String, Vec<u8>>> {
    let mut found = BTreeMap::new();
    for dir in DIRS {
        for entry in std::fs::read_dir(work.join(dir))? {
            let entry = entry?;
            let name = format!("{dir}/{}", entry.file_name().to_string_lossy());
            found.insert(name, std::fs::read(entry.path())?);
        }
    }
    Ok(found)
}

/// What the verification after a restart found.
struct Verdict {
    lost_bytes: u64,
    problems: Vec<String>,
    outcome: String,
    files: usize,
    bytes: u64,
}

/// Compares the restarted node's files with the journal, resolves the change in doubt (fsyncing
/// whatever it left, so the journal stays a record of durable state), and returns what is
/// wrong.
fn verify(work: &Path, journal: &mut Journal) -> Verdict {
    trace(|| format!("-- node killed and restarted after change #{}", journal.done));
    let mut verdict =
        Verdict { lost_bytes: 0, problems: Vec::new(), outcome: "none".into(), files: 0, bytes: 0 };
    let found = match read_tree(work) {
        Ok(found) => found,
        Err(e) => {
            verdict.problems.push(format!("reading the files back: {e}"));
            return verdict;
        }
    };
    verdict.files = found.len();
    verdict.bytes = found.values().map(|v| v.len() as u64).sum();
    let doubt = journal.doubt.take();
    let in_doubt: BTreeSet<&str> =
        doubt.as_ref().map(Doubt::names).unwrap_or_default().into_iter().collect();
    let names: BTreeSet<&String> = journal.files.keys().chain(found.keys()).collect();
    for name in names.into_iter().filter(|n| !in_doubt.contains(n.as_str())) {
        match (journal.files.get(name), found.get(name)) {
            (Some(want), Some(got)) if want == got => {}
            (Some(want), Some(got)) => {
                let differing = want.iter().zip(got).filter(|(a, b)| a != b).count();
                let lost = differing + want.len().saturating_sub(got.len());
                verdict.lost_bytes += lost as u64;
                verdict.problems.push(
                    format!(
                        "{name}: {} bytes, {} expected; {}",
                        got.len(),
                        want.len(),
                        mismatch_detail(got, want)
                    ) + &matching_past(journal, got, want),
                );
            }
            (Some(want), None) => {
                verdict.lost_bytes += want.len() as u64;
                verdict.problems.push(format!("{name} ({} bytes, fsynced) is gone", want.len()));
            }
            (None, Some(got)) => verdict
                .problems
                .push(format!("{name} ({} bytes) exists, but no change left it", got.len())),
            (None, None) => {}
        }
    }
    let Some(doubt) = doubt else {
        return verdict;
    };
    let seen: BTreeMap<String, Option<Vec<u8>>> =
        doubt.names().iter().map(|n| (n.to_string(), found.get(*n).cloned())).collect();
    match doubt.judge(&seen) {
        Ok(outcome) => verdict.outcome = format!("{}: {outcome}", doubt.describe()),
        Err(problem) => {
            verdict.outcome = format!("{}: WRONG", doubt.describe());
            let lost = match &doubt {
                Doubt::Write { before, .. } => before.as_ref().map_or(0, Vec::len),
                Doubt::Rename { moved, .. } => moved.len(),
                Doubt::Truncate { before, after, .. } => before.len().min(after.len()),
                Doubt::Unlink { .. } => 0,
            };
            verdict.lost_bytes += lost as u64;
            verdict.problems.push(problem);
        }
    }
    // Whatever the change left is now the durable state, once synced.
    for (name, content) in seen {
        // A sync reports a loss by a restarted role once (EIO); the second says whether
        // what is there now is durable.
        let sync = || {
            let synced = match &content {
                Some(_) => File::open(work.join(&name)).and_then(|f| f.sync_all()),
                None => Ok(()),
            };
            let dir = work.join(name.split('/').next().unwrap_or(""));
            synced.and_then(|()| sync_dir(&dir))
        };
        if let Err(e) = sync().or_else(|_| sync()) {
            verdict.problems.push(format!("syncing {name} after the restart: {e}"));
        }
        match content {
            Some(c) => journal.files.insert(name, c),
            None => journal.files.remove(&name),
        };
    }
    verdict
}

fn drives_for(level: Level) -> usize {
    match level {
        Level::Raid1 => 2,
        Level::Raid10 | Level::Raid5 => 4,
        Level::Raid0 | Level::Raid6 => 5,
    }
}

pub fn run(args: KillArgs) -> Result<()> {
    let seed = args.campaign.start()?;
    let level: Level = args
        .raid
        .trim_start_matches("raid")
        .parse()
        .map_err(|e| usage(format!("--raid {}: {e}", args.raid)))?;
    if level == Level::Raid0 {
        return Err(usage("--raid 0 has no redundancy to rebuild; use 1, 10, 5 or 6"));
    }
    if args.rebuild_percent > 100 || args.kill_within_ms == 0 {
        return Err(usage("--rebuild-percent is 0..=100 and --kill-within-ms at least 1"));
    }
    require_fuse()?;
    let dir = args.scratch.make("kill")?;
    println!(
        "campaign kill: seed {seed:#x}, {} cycles, kill -9 of the {}, {level} over {} drives, node in {}",
        args.campaign.cycles,
        match args.role.as_str() {
            "node" => "node".to_string(),
            "any" => "storage or meta role".to_string(),
            role => format!("{role} role"),
        },
        drives_for(level),
        dir.display()
    );
    let mut tally = Tally::default();
    let result = campaign(&args, seed, level, &dir, &mut tally);
    if let Err(e) = result {
        tally.fail(tally.cycles, format_args!("campaign stopped: {e:#}"));
    }
    let passed = tally.data_lost == 0 && tally.failures.is_empty();
    args.scratch.finish(&dir, passed);
    let replay = format!(
        "kill --raid {} --role {} --cycles {} --rebuild-percent {} --kill-within-ms {}",
        args.raid, args.role, args.campaign.cycles, args.rebuild_percent, args.kill_within_ms
    );
    tally.finish("kill", seed, &replay)
}

fn campaign(args: &KillArgs, seed: u64, level: Level, dir: &Path, tally: &mut Tally) -> Result<()> {
    let shape: Vec<String> = vec![
        "--drives".into(),
        drives_for(level).to_string(),
        "--raid".into(),
        level.to_string(),
        "--drive-size".into(),
        DRIVE_SIZE.into(),
        "--stripe-unit".into(),
        "64K".into(),
    ];
    let roles = args.role != "node";
    let mut shape = shape;
    if roles {
        shape.push("--separate-roles".into());
    }
    let mut node = Node::start(dir, &shape)?;
    let work = node.mount.join(WORK_DIR);
    for d in DIRS {
        std::fs::create_dir_all(work.join(d))?;
        sync_dir(&work.join(d))?;
    }
    sync_dir(&work)?;
    sync_dir(&node.mount)?;
    let mut rng = SplitMix64::from_parts(&[seed, 0x4b49_4c4c]); // "KILL"
    let mut journal = Journal::default();
    for cycle in 1..=args.campaign.cycles {
        tally.cycles = cycle;
        let started = Instant::now();
        let rebuild = rng.below(100) < args.rebuild_percent;
        let mut note = String::new();
        if rebuild {
            match start_rebuild(&node, &mut rng, cycle) {
                Ok(slot) => note = format!("rebuilding slot {slot}, "),
                Err(e) => tally.fail(cycle, format_args!("starting a rebuild: {e:#}")),
            }
        }
        let killed = Arc::new(AtomicBool::new(false));
        let (send, receive) = mpsc::channel();
        let worker = {
            let (work, killed, seed) = (work.clone(), killed.clone(), rng.next_u64());
            let journal = std::mem::take(&mut journal);
            std::thread::spawn(move || {
                let _ = send.send(self::work(work, journal, seed, killed));
            })
        };
        let kill_after = Duration::from_millis(50 + rng.below(args.kill_within_ms));
        std::thread::sleep(kill_after);
        if rebuild {
            let df = node.cli_ok(&["df"]).unwrap_or_default();
            note.push_str(if df.contains("rebuild") {
                "killed during the rebuild, "
            } else {
                "rebuild done before the kill, "
            });
        }
        let victim = match args.role.as_str() {
            "storage" => Some(Role::Storage),
            "meta" => Some(Role::Meta),
            "any" => Some(if rng.below(2) == 0 { Role::Storage } else { Role::Meta }),
            _ => None,
        };
        killed.store(true, SeqCst);
        let killed_pid = match victim {
            Some(role) => {
                note.push_str(&format!("{} role ", role.name()));
                Some(node.kill_role(role)?)
            }
            None => {
                node.kill()?;
                None
            }
        };
        let end = match receive.recv_timeout(WORKER_EXIT_LIMIT) {
            Ok(end) => end,
            Err(_) => {
                bail!("the workload did not notice the dead node within {WORKER_EXIT_LIMIT:?}")
            }
        };
        let _ = worker.join();
        journal = end.journal;
        if let Some(e) = end.early_error {
            tally.fail(cycle, format_args!("the workload failed before the kill: {e}"));
        }
        for m in end.live_mismatches {
            tally.fail(cycle, format_args!("read while running: {m}"));
        }
        let (verdict, fsck) = match killed_pid {
            Some(pid) => {
                // The mount stayed up: verify through it once the roles are back (and the
                // kernel's cached entries and attributes have expired), then check the
                // stopped node.
                node.wait_roles_back(pid)?;
                std::thread::sleep(ATTR_TTL);
                let verdict = verify(&work, &mut journal);
                node.stop()?;
                let fsck = node.fsck();
                node.restart()?;
                (verdict, fsck)
            }
            None => {
                let fsck = node.fsck();
                node.restart()?;
                (verify(&work, &mut journal), fsck)
            }
        };
        if let Err(e) = &fsck {
            tally.fail(cycle, format_args!("after kill -9: {e}"));
        }
        if verdict.lost_bytes > 0 {
            tally.lost(cycle, verdict.lost_bytes, verdict.problems.join("; "));
        } else {
            for p in &verdict.problems {
                tally.fail(cycle, p);
            }
        }
        println!(
            "cycle {cycle}: {note}killed after {} ms and {} changes; in flight: {}; {} files ({} bytes) verified, fsck {}, {:.1} s",
            kill_after.as_millis(),
            end.ops,
            verdict.outcome,
            verdict.files,
            verdict.bytes,
            if fsck.is_ok() { "clean" } else { "NOT CLEAN" },
            started.elapsed().as_secs_f64()
        );
    }
    node.stop()?;
    if let Err(e) = node.fsck() {
        tally.fail(tally.cycles, format_args!("after the last clean stop: {e}"));
    }
    println!("{} changes fsynced over the campaign", journal.done);
    Ok(())
}

/// Fails a seeded drive of target 1 and rebuilds onto a new drive file, through the CLI; the
/// old file is removed. Returns the slot.
fn start_rebuild(node: &Node, rng: &mut SplitMix64, cycle: u64) -> Result<usize> {
    let record = NodeRecord::load(&node.data)?;
    let target = record.targets.first().ok_or_else(|| anyhow::anyhow!("the node has no target"))?;
    let slot = rng.below(target.drives.len() as u64) as usize;
    let old = node.data.join(&target.drives[slot]);
    let (t, s) = (target.id.to_string(), slot.to_string());
    node.cli_ok(&["target", "fail-drive", "--target", &t, "--slot", &s])?;
    let new = format!("c{cycle}.img");
    node.cli_ok(&[
        "target",
        "replace-drive",
        "--target",
        &t,
        "--slot",
        &s,
        "--with",
        &new,
        "--size",
        DRIVE_SIZE,
    ])?;
    let _ = std::fs::remove_file(old);
    Ok(slot)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(entries: &[(&str, Option<&[u8]>)]) -> BTreeMap<String, Option<Vec<u8>>> {
        entries.iter().map(|(n, c)| (n.to_string(), c.map(<[u8]>::to_vec))).collect()
    }

    #[test]
    fn a_write_in_doubt_allows_old_new_or_a_mix_but_nothing_else() {
        let doubt = Doubt::Write {
            name: "a/f1".into(),
            before: Some(vec![1, 1, 1, 1]),
            after: vec![1, 2, 2, 1, 5, 5],
            truncating: false,
        };
        assert_eq!(doubt.judge(&found(&[("a/f1", Some(&[1, 1, 1, 1]))])), Ok("not landed"));
        assert_eq!(doubt.judge(&found(&[("a/f1", Some(&[1, 2, 2, 1, 5, 5]))])), Ok("landed"));
        assert_eq!(doubt.judge(&found(&[("a/f1", Some(&[1, 2, 1, 1, 0]))])), Ok("partly landed"));
        assert!(doubt.judge(&found(&[("a/f1", Some(&[1, 9, 1, 1]))])).is_err());
        assert!(doubt.judge(&found(&[("a/f1", Some(&[1, 1]))])).is_err(), "shorter than before");
        assert!(doubt.judge(&found(&[("a/f1", None)])).is_err(), "an existing file vanished");
    }

    #[test]
    fn a_rename_in_doubt_is_all_or_nothing() {
        let doubt = Doubt::Rename {
            from: "a/f1".into(),
            to: "b/f2".into(),
            moved: vec![7; 3],
            replaced: Some(vec![8; 2]),
        };
        let moved: &[u8] = &[7, 7, 7];
        let replaced: &[u8] = &[8, 8];
        assert!(doubt.judge(&found(&[("a/f1", Some(moved)), ("b/f2", Some(replaced))])).is_ok());
        assert!(doubt.judge(&found(&[("a/f1", None), ("b/f2", Some(moved))])).is_ok());
        assert!(doubt.judge(&found(&[("a/f1", None), ("b/f2", None)])).is_err(), "both gone");
        assert!(doubt.judge(&found(&[("a/f1", None), ("b/f2", Some(replaced))])).is_err());
    }

    #[test]
    fn a_truncate_in_doubt_is_old_or_new_size_only() {
        let doubt = Doubt::Truncate { name: "a/f1".into(), before: vec![3; 4], after: vec![3; 2] };
        assert!(doubt.judge(&found(&[("a/f1", Some(&[3, 3, 3, 3]))])).is_ok());
        assert!(doubt.judge(&found(&[("a/f1", Some(&[3, 3]))])).is_ok());
        assert!(doubt.judge(&found(&[("a/f1", Some(&[3, 3, 0, 0]))])).is_err());
        assert!(doubt.judge(&found(&[("a/f1", Some(&[3, 3, 3]))])).is_err());
    }
}
