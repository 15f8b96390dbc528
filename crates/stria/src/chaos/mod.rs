//! `stria chaos`: fault campaigns, run by hand or by the `faults` test target.
//!
//! Each campaign is a loop of seeded cycles that break something (a drive, the node process,
//! the free space), then check that nothing stored was lost: `drives` runs RAID arrays in this
//! process over fault-injecting memory drives; `kill` and `enospc` run a real node (`stria up`
//! as a child process of this same binary) and work through its FUSE mount. A campaign prints
//! its seed first, a line per cycle, and a summary line last; it exits non-zero if any data was
//! lost or anything failed that should not have, and then prints the command that replays it.
//!
//! A seed fixes every choice a campaign makes (operations, sizes, which fault, when it strikes
//! in the op sequence). What it cannot fix is thread and process timing: a fault that strikes
//! "during op 57" meets op 57 at a slightly different point on each run.

mod drives;
mod enospc;
mod kill;
mod node;

use std::fmt;

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::rng::SplitMix64;
use crate::usage;

#[derive(Args, Debug)]
#[command(
    long_about = "Fault campaigns: seeded loops that break drives, kill the node or fill the file \
system, and check after each cycle that no stored byte was lost.\n\n\
Every campaign prints its seed, one line per cycle and a summary line such as\n\
  campaign kill: 40 cycles, seed 0x1234abcd, data lost: 0, failures: 0\n\
and exits with status 1 if data was lost or something failed that must not, printing the \
command that replays the same seed. `kill` and `enospc` need root and /dev/fuse: they run \
`stria up` on a scratch data directory and use its mount.\n\n\
Examples:\n\
  stria chaos drives --cycles 100                  # every RAID level, 100 cycles each\n\
  stria chaos drives --level 6 --cycles 20 --seed 0x2a\n\
  stria chaos kill --cycles 50 --seed 7\n\
  stria chaos enospc --cycles 3"
)]
pub struct ChaosArgs {
    #[command(subcommand)]
    campaign: Campaign,
}

#[derive(Subcommand, Debug)]
enum Campaign {
    /// Drive faults under load on RAID arrays of memory drives, in this process: a drive fails,
    /// returns, is replaced, returns stale, returns with bit rot, turns slow; two fail on
    /// RAID 6; one more fails than the level tolerates (I/O must then be refused). Reads are
    /// checked against an in-memory copy of everything written.
    Drives(drives::DrivesArgs),
    /// kill -9 of a running node at a random moment during fsynced writes, renames, truncates
    /// and (some cycles) a drive rebuild; after each kill `stria fsck` must be clean and every
    /// fsynced byte, rename and truncate must be found after a restart.
    Kill(kill::KillArgs),
    /// Fill a node's file system through its mount until writes fail: the error must be
    /// ENOSPC, files written before must be intact, and deleting files must give space back.
    Enospc(enospc::EnospcArgs),
}

pub fn run(args: ChaosArgs) -> Result<()> {
    match args.campaign {
        Campaign::Drives(args) => drives::run(args),
        Campaign::Kill(args) => kill::run(args),
        Campaign::Enospc(args) => enospc::run(args),
    }
}

/// Seed and cycle count, shared by every campaign.
#[derive(Args, Debug, Clone)]
pub struct CampaignArgs {
    /// Cycles to run.
    #[arg(long, default_value_t = 10)]
    pub cycles: u64,
    /// Seed of every random choice, decimal or 0x-hex [default: from the clock; printed at the
    /// start so the run can be replayed].
    #[arg(long, value_parser = parse_seed)]
    pub seed: Option<u64>,
}

impl CampaignArgs {
    /// The seed to use, after checking the arguments.
    fn start(&self) -> Result<u64> {
        if self.cycles == 0 {
            return Err(usage("--cycles must be at least 1"));
        }
        Ok(self.seed.unwrap_or_else(clock_seed))
    }
}

fn parse_seed(text: &str) -> Result<u64, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| format!("{text:?} is not a number (decimal or 0x-hex)"))
}

fn clock_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    SplitMix64::from_parts(&[nanos, std::process::id() as u64]).next_u64()
}

/// What a campaign found, counted over all its cycles.
#[derive(Debug, Default)]
struct Tally {
    cycles: u64,
    /// Bytes (or, where a campaign says so, blocks or files) that read back wrong or not at all
    /// although they were acknowledged as stored.
    data_lost: u64,
    /// Everything else that must not happen: an I/O error within the level's tolerance, a
    /// rename that did not land, a fsck that is not clean, a wrong error code.
    failures: Vec<String>,
}

/// Failures described one by one; the rest are counted.
const FAILURES_SHOWN_MAX: usize = 20;

impl Tally {
    fn fail(&mut self, cycle: u64, what: impl fmt::Display) {
        let line = format!("cycle {cycle}: {what}");
        println!("  FAILURE {line}");
        self.failures.push(line);
    }

    fn lost(&mut self, cycle: u64, amount: u64, what: impl fmt::Display) {
        self.data_lost += amount;
        self.fail(cycle, format_args!("DATA LOST: {what}"));
    }

    /// Prints the summary line and, when something went wrong, the replay command; the error
    /// makes the process exit with status 1.
    fn finish(&self, name: &str, seed: u64, replay: &str) -> Result<()> {
        println!(
            "campaign {name}: {} cycles, seed {seed:#x}, data lost: {}, failures: {}",
            self.cycles,
            self.data_lost,
            self.failures.len()
        );
        if self.data_lost == 0 && self.failures.is_empty() {
            return Ok(());
        }
        for line in self.failures.iter().take(FAILURES_SHOWN_MAX) {
            eprintln!("  {line}");
        }
        eprintln!("replay: stria chaos {replay} --seed {seed:#x}");
        anyhow::bail!(
            "campaign {name} failed: {} lost, {} failures (seed {seed:#x})",
            self.data_lost,
            self.failures.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_in_decimal_and_hex() {
        assert_eq!(parse_seed("42"), Ok(42));
        assert_eq!(parse_seed("0x2a"), Ok(42));
        assert_eq!(parse_seed("0XFF"), Ok(255));
        assert!(parse_seed("0xzz").is_err());
        assert!(parse_seed("-1").is_err());
    }

    #[test]
    fn a_tally_with_loss_or_failures_is_an_error() {
        let mut tally = Tally { cycles: 3, ..Tally::default() };
        assert!(tally.finish("t", 1, "t").is_ok());
        tally.fail(2, "an unexpected error");
        assert!(tally.finish("t", 1, "t").is_err());
        let mut tally = Tally::default();
        tally.lost(1, 4096, "a block");
        assert_eq!(tally.data_lost, 4096);
        assert!(tally.finish("t", 1, "t").is_err());
    }
}
