//! Running a campaign of `stria chaos` and checking its summary.

use std::process::Command;

pub const STRIA: &str = env!("CARGO_BIN_EXE_stria");

/// The cycles to run: `short` unless STRIA_CHAOS_CYCLES asks for more.
pub fn cycles(short: u64) -> u64 {
    match std::env::var("STRIA_CHAOS_CYCLES") {
        Ok(text) => text.parse().unwrap_or_else(|_| panic!("STRIA_CHAOS_CYCLES={text:?}")),
        Err(_) => short,
    }
}

/// Whether STRIA_CHAOS_SEED replaced the tests' fixed seeds (what a seed draws is then unknown).
pub fn seed_replaced() -> bool {
    std::env::var_os("STRIA_CHAOS_SEED").is_some()
}

/// The node campaigns mount FUSE: say exactly what is missing instead of skipping.
pub fn require_fuse() {
    assert!(
        std::path::Path::new("/dev/fuse").exists(),
        "the node campaigns mount a real FUSE file system: /dev/fuse is missing"
    );
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the node campaigns mount FUSE: run as root");
}

/// Runs `stria chaos ARGS --cycles N --seed S` and requires a passing summary line; returns
/// the campaign's output.
pub fn run_campaign(args: &[&str], cycles: u64, seed: u64) -> String {
    let seed = match std::env::var("STRIA_CHAOS_SEED") {
        Ok(text) => text,
        Err(_) => format!("{seed:#x}"),
    };
    let out = Command::new(STRIA)
        .arg("chaos")
        .args(args)
        .args(["--cycles", &cycles.to_string(), "--seed", &seed])
        .output()
        .expect("run stria chaos");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let name = args[0];
    assert!(
        out.status.success(),
        "stria chaos {} failed ({}):\n{stdout}\n{stderr}",
        args.join(" "),
        out.status
    );
    let summary = stdout
        .lines()
        .find(|l| l.starts_with(&format!("campaign {name}: ")) && l.contains("data lost"))
        .unwrap_or_else(|| panic!("no summary line:\n{stdout}"));
    assert!(summary.contains("data lost: 0, failures: 0"), "{summary}\n{stdout}\n{stderr}");
    assert!(summary.contains(&format!("{cycles} cycles")) || name == "drives", "{summary}");
    stdout
}
