//! The `stria` binary: the command line for every Stria role.
//!
//! This crate owns argument parsing, logging setup, progress display and the mapping of errors to
//! one-line messages and exit codes (2: the command line was wrong; 1: the operation failed). It
//! holds no storage logic of its own: arrays, drives and parity live in `stria-raid` and
//! `stria-io`, and every command here is a thin, careful driver of their public API.

mod bench_cmd;
mod chaos;
mod epochs;
mod fs_cmd;
mod fsck;
mod gateway;
mod interrupt;
mod mount_cmd;
mod node;
mod raid_bench;
mod raid_bench_report;
mod raid_cmd;
mod raid_io;
mod raid_status;
mod rest_role;
mod rng;
mod roles;
mod torture;
mod units;
mod up;
mod volume_cmd;

use std::fmt;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{ArgAction, Parser, Subcommand};

/// Stria: a flash storage system. `stria up` runs a whole node (file system, mount); `stria raid`
/// manages software RAID arrays over drives or files.
#[derive(Parser, Debug)]
#[command(name = "stria", version, propagate_version = true)]
struct Cli {
    /// More log output on stderr: -v warnings, -vv progress of background work, -vvv debug.
    /// RUST_LOG, when set, takes precedence (e.g. RUST_LOG=stria_raid=debug).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run an all-in-one node: drive files, RAID targets, the file system and its FUSE mount.
    /// The first run creates everything under --data; later runs reassemble it.
    Up(up::UpArgs),
    /// Mount the file system of a running node as one more client (on this machine or
    /// another), in the foreground until Ctrl-C, SIGTERM or umount.
    Mount(mount_cmd::MountArgs),
    /// Capacity and use per target and pool of a running node.
    Df(fs_cmd::NodeArgs),
    /// Show the layout of files (stripe count, stripe size, pool, targets) or the default
    /// layout of directories, as Lustre's `lfs getstripe`.
    Getstripe(fs_cmd::GetStripeArgs),
    /// Set the default layout of a directory, or the layout of a new or empty file, as
    /// Lustre's `lfs setstripe`.
    Setstripe(fs_cmd::SetStripeArgs),
    /// Check a stopped node: namespace, chunks and RAID redundancy.
    Fsck(fsck::FsckArgs),
    /// Administer the targets of a running node.
    #[command(subcommand)]
    Target(fs_cmd::TargetCommand),
    /// Software RAID 0, 1, 10, 5 and 6 over block devices or drive files: create, inspect,
    /// fail, replace, rebuild, scrub, raw read/write and benchmark.
    Raid(raid_cmd::RaidArgs),
    /// Block volumes: create, list, show, resize, delete, snapshot, clone.
    #[command(subcommand)]
    Volume(volume_cmd::VolumeCommand),
    /// NBD exports of volumes: add, list, remove.
    #[command(subcommand)]
    Export(volume_cmd::ExportCommand),
    /// Who may use an export: allow, deny, list.
    #[command(subcommand)]
    Initiator(volume_cmd::InitiatorCommand),
    Bench(bench_cmd::BenchArgs),
    /// Fault campaigns: drive faults on every RAID level, kill -9 of a running node or of one
    /// of its roles, a full file system; seeded, with a line per cycle and a summary of any
    /// data lost.
    Chaos(chaos::ChaosArgs),
    /// Run one server role of a node (storage or meta) in this process; `stria up
    /// --separate-roles` starts these and restarts them after a crash.
    Role(roles::RoleArgs),
}

/// The command line asked for something impossible (exit code 2). Every other error is a
/// failure of the operation itself (exit code 1).
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Shorthand for returning a [`UsageError`] through `anyhow`.
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(message.into()))
}

const EXIT_FAILURE: u8 = 1;
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_error(&e),
    };
    // `up` logs to a file under its data directory; every other command logs to stderr.
    if !matches!(cli.command, Command::Up(_) | Command::Role(_)) {
        init_logging(cli.verbose);
    }
    let result = match cli.command {
        Command::Up(args) => up::run(args),
        Command::Mount(args) => mount_cmd::run(args),
        Command::Df(args) => fs_cmd::df(args),
        Command::Getstripe(args) => fs_cmd::getstripe(args),
        Command::Setstripe(args) => fs_cmd::setstripe(args),
        Command::Target(command) => fs_cmd::target(command),
        Command::Fsck(args) => fsck::run(args),
        Command::Raid(args) => raid_cmd::run(args),
        Command::Volume(command) => volume_cmd::volume(command),
        Command::Export(command) => volume_cmd::export(command),
        Command::Initiator(command) => volume_cmd::initiator(command),
        Command::Bench(args) => bench_cmd::run(args),
        Command::Chaos(args) => chaos::run(args),
        Command::Role(args) => roles::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` joins the context chain with ": " into one line.
            let message = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {message}");
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::from(EXIT_FAILURE)
            }
        }
    }
}

/// Help and version go out as clap writes them; every real parse error becomes one line, so
/// scripts and people see the problem without a page of usage text.
fn clap_error(e: &clap::Error) -> ExitCode {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            ExitCode::from(EXIT_USAGE)
        }
        _ => {
            eprintln!("error: {} (see --help)", one_line(&e.render().to_string()));
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// Folds clap's multi-line error text into one line, dropping the usage block and the
/// "for more information" hint (replaced by "see --help").
fn one_line(rendered: &str) -> String {
    rendered
        .lines()
        .map(str::trim)
        .filter(|line| {
            !line.is_empty()
                && !line.starts_with("Usage:")
                && !line.starts_with("For more information")
        })
        .map(|line| line.strip_prefix("error:").unwrap_or(line).trim())
        .collect::<Vec<_>>()
        .join(" ")
}

fn init_logging(verbose: u8) {
    // Only errors by default: the commands print what a user needs (assembly warnings,
    // progress, reports) themselves, and the libraries' warnings would repeat them.
    let default = match verbose {
        0 => "error",
        1 => "warn",
        2 => "info",
        _ => "debug",
    };
    let filter = log_filter(default);
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(verbose >= 3)
        .init();
}

fn log_filter(default: &str) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.is_empty() => {
            EnvFilter::try_new(spec).unwrap_or_else(|_| EnvFilter::new(default))
        }
        _ => EnvFilter::new(default),
    }
}

/// Logging of a long-running node: info and above to `path` (appended), with timestamps.
pub fn init_file_logging(path: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open the log file {}", path.display()))?;
    tracing_subscriber::fmt()
        .with_env_filter(log_filter("info"))
        .with_writer(std::sync::Mutex::new(file))
        .with_ansi(false)
        .init();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_bench_examples_of_the_help_and_readme_parse() {
        let help = Cli::command()
            .find_subcommand("bench")
            .and_then(|c| c.get_long_about().map(|a| a.to_string()))
            .unwrap_or_default();
        let readme = include_str!("../../../README.md");
        let examples: Vec<&str> = help
            .lines()
            .chain(readme.lines())
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| l.starts_with("stria bench ") && !l.contains('|') && !l.contains("..."))
            .collect();
        assert!(examples.len() >= 8, "examples found: {examples:?}");
        for example in examples {
            let args: Vec<&str> = example.split_whitespace().collect();
            if let Err(e) = Cli::try_parse_from(&args) {
                panic!("`{example}` does not parse: {e}");
            }
        }
    }

    #[test]
    fn clap_errors_fold_into_one_line() {
        let rendered = "error: the following required arguments were not provided:\n  --slot <SLOT>\n\nUsage: stria raid fail --slot <SLOT> <DRIVE>...\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line(rendered),
            "the following required arguments were not provided: --slot <SLOT>"
        );
    }

    #[test]
    fn every_argument_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                assert!(arg.get_help().is_some(), "{path} {id} has no help text");
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() == "help" {
                    continue;
                }
                assert!(sub.get_about().is_some(), "{path} {} has no help text", sub.get_name());
                walk(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        walk(&Cli::command(), "stria");
    }
}
