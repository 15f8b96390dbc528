//! `stria chaos enospc`: a node's file system filled through its mount, again and again.
//!
//! Each cycle writes fsynced files of seeded sizes until a write, fsync or close fails. The
//! error must be ENOSPC; every file completed before (in this cycle and earlier ones) must read
//! back intact; the half-written file must be removable. Then a seeded share of the files is
//! deleted, and new files adding up to part of the freed space must be written without an error
//! (space comes back). After the last cycle the node is restarted, everything is read again,
//! and `stria fsck` must be clean.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;

use super::node::{Node, ScratchArgs, require_fuse};
use super::{CampaignArgs, Tally};
use crate::rng::SplitMix64;

/// Small drives, so a cycle fills the file system in seconds.
const DRIVE_SIZE: &str = "48M";
const FILE_BYTES_MIN: u64 = 256 << 10;
const FILE_BYTES_MAX: u64 = 4 << 20;
/// Most files one fill writes: far more than fit, so a fill that never meets ENOSPC is a
/// failure, not an endless loop.
const FILES_PER_FILL_MAX: u64 = 2000;
/// After deletes, the freed space may take a moment (a commit) to become usable.
const SPACE_BACK_LIMIT: Duration = Duration::from_secs(10);

#[derive(Args, Debug)]
pub struct EnospcArgs {
    #[command(flatten)]
    campaign: CampaignArgs,
    #[command(flatten)]
    scratch: ScratchArgs,
}

/// The files the campaign holds: name to (seed, length).
type Kept = BTreeMap<String, (u64, u64)>;

fn content(seed: u64, len: u64) -> Vec<u8> {
    let mut data = vec![0u8; len as usize];
    SplitMix64::from_parts(&[seed, 0x454e_4f53]).fill(&mut data); // "ENOS"
    data
}

fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut file = File::create(path)?;
    file.write_all(data)?;
    file.sync_all()
}

/// Reads every kept file; returns the bytes that differ or are missing, with descriptions.
fn check_kept(dir: &Path, kept: &Kept) -> (u64, Vec<String>) {
    let mut lost = 0;
    let mut problems = Vec::new();
    for (name, &(seed, len)) in kept {
        let want = content(seed, len);
        match std::fs::read(dir.join(name)) {
            Ok(got) if got == want => {}
            Ok(got) => {
                let differing = want.iter().zip(&got).filter(|(a, b)| a != b).count()
                    + want.len().saturating_sub(got.len());
                lost += differing as u64;
                problems.push(format!("{name}: {differing} bytes differ ({} read)", got.len()));
            }
            Err(e) => {
                lost += len;
                problems.push(format!("{name}: {e}"));
            }
        }
    }
    (lost, problems)
}

pub fn run(args: EnospcArgs) -> Result<()> {
    let seed = args.campaign.start()?;
    require_fuse()?;
    let dir = args.scratch.make("enospc")?;
    println!(
        "campaign enospc: seed {seed:#x}, {} cycles, raid5 over 3 drives of {DRIVE_SIZE}, node in {}",
        args.campaign.cycles,
        dir.display()
    );
    let mut tally = Tally::default();
    if let Err(e) = campaign(&args, seed, &dir, &mut tally) {
        tally.fail(tally.cycles, format_args!("campaign stopped: {e:#}"));
    }
    let passed = tally.data_lost == 0 && tally.failures.is_empty();
    args.scratch.finish(&dir, passed);
    tally.finish("enospc", seed, &format!("enospc --cycles {}", args.campaign.cycles))
}

fn campaign(args: &EnospcArgs, seed: u64, dir: &Path, tally: &mut Tally) -> Result<()> {
    let shape: Vec<String> =
        ["--drives", "3", "--raid", "5", "--drive-size", DRIVE_SIZE, "--stripe-unit", "64K"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let mut node = Node::start(dir, &shape)?;
    let files = node.mount.join("fill");
    std::fs::create_dir_all(&files)?;
    let mut rng = SplitMix64::from_parts(&[seed, 0x4e4f_5350]); // "NOSP"
    let mut kept = Kept::new();
    let mut next = 0u64;
    for cycle in 1..=args.campaign.cycles {
        tally.cycles = cycle;
        let started = Instant::now();
        // Fill until the file system refuses.
        let mut written = 0u64;
        let mut refusal = None;
        for _ in 0..FILES_PER_FILL_MAX {
            next += 1;
            let name = format!("c{cycle}-{next}");
            let (file_seed, len) = (rng.next_u64(), FILE_BYTES_MIN + rng.below(FILE_BYTES_MAX));
            match write_file(&files.join(&name), &content(file_seed, len)) {
                Ok(()) => {
                    kept.insert(name, (file_seed, len));
                    written += len;
                }
                Err(e) => {
                    refusal = Some((name, e));
                    break;
                }
            }
        }
        let Some((partial, error)) = refusal else {
            tally
                .fail(cycle, format_args!("{FILES_PER_FILL_MAX} files fit: the fill never failed"));
            continue;
        };
        if error.raw_os_error() != Some(libc::ENOSPC) {
            tally.fail(cycle, format_args!("a full file system answered {error}, not ENOSPC"));
        }
        if let Err(e) = std::fs::remove_file(files.join(&partial))
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tally.fail(cycle, format_args!("removing the half-written {partial}: {e}"));
        }
        let (lost, problems) = check_kept(&files, &kept);
        if lost > 0 || !problems.is_empty() {
            tally.lost(cycle, lost, format_args!("when full: {}", problems.join("; ")));
        }
        // Delete a seeded share, then write part of what was freed.
        let names: Vec<String> = kept.keys().cloned().collect();
        let mut freed = 0u64;
        for name in names {
            if rng.below(100) < 40 {
                let (_, len) = kept[&name];
                match std::fs::remove_file(files.join(&name)) {
                    Ok(()) => {
                        kept.remove(&name);
                        freed += len;
                    }
                    Err(e) => tally.fail(cycle, format_args!("deleting {name} when full: {e}")),
                }
            }
        }
        let refill = freed / 2;
        let (mut refilled, mut waited) = (0u64, Duration::ZERO);
        while refilled < refill {
            next += 1;
            let name = format!("c{cycle}-{next}");
            let (file_seed, len) = (
                rng.next_u64(),
                (FILE_BYTES_MIN + rng.below(FILE_BYTES_MAX)).min(refill - refilled).max(4096),
            );
            let data = content(file_seed, len);
            let began = Instant::now();
            let mut result = write_file(&files.join(&name), &data);
            // Freed blocks may wait for a commit; give the node a moment, but not forever.
            while matches!(&result, Err(e) if e.raw_os_error() == Some(libc::ENOSPC))
                && waited < SPACE_BACK_LIMIT
            {
                std::thread::sleep(Duration::from_millis(200));
                result = write_file(&files.join(&name), &data);
                waited = began.elapsed().max(waited);
            }
            match result {
                Ok(()) => {
                    kept.insert(name, (file_seed, len));
                    refilled += len;
                }
                Err(e) => {
                    tally.fail(
                        cycle,
                        format_args!(
                            "space did not come back: {refilled} of {refill} bytes rewritten \
                             after deleting {freed}, then {e}"
                        ),
                    );
                    let _ = std::fs::remove_file(files.join(&name));
                    break;
                }
            }
        }
        let (lost, problems) = check_kept(&files, &kept);
        if lost > 0 || !problems.is_empty() {
            tally.lost(cycle, lost, format_args!("after deletes: {}", problems.join("; ")));
        }
        println!(
            "cycle {cycle}: {} MiB written until {}, {} MiB deleted, {} MiB written again{}, {} files intact, {:.1} s",
            written >> 20,
            if error.raw_os_error() == Some(libc::ENOSPC) {
                "ENOSPC".to_string()
            } else {
                error.to_string()
            },
            freed >> 20,
            refilled >> 20,
            if waited > Duration::ZERO {
                format!(" (space back after {} ms)", waited.as_millis())
            } else {
                String::new()
            },
            kept.len(),
            started.elapsed().as_secs_f64()
        );
    }
    node.stop()?;
    node.restart()?;
    let (lost, problems) = check_kept(&files, &kept);
    if lost > 0 || !problems.is_empty() {
        tally.lost(tally.cycles, lost, format_args!("after a restart: {}", problems.join("; ")));
    }
    node.stop()?;
    if let Err(e) = node.fsck() {
        tally.fail(tally.cycles, format_args!("at the end: {e}"));
    }
    println!("{} files verified after a restart; fsck done", kept.len());
    Ok(())
}
