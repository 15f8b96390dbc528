//! The benchmark's results: what one measurement, one cell and the whole run recorded (also
//! the JSON format of `--json`), the comparisons between cells, and the printed table.

use serde::Serialize;

use crate::raid_bench::{BenchState, RANDOM_READ_PERCENTS, SEQ_IO_BYTES};
use crate::units::format_bytes;

#[derive(Serialize, Debug)]
pub(crate) struct RandomResult {
    pub(crate) read_percent: u32,
    pub(crate) iops: f64,
    pub(crate) mean_latency_us: f64,
    /// Rebuilding cells: whether the rebuild ran for the whole measurement.
    pub(crate) rebuild_active: Option<bool>,
}

#[derive(Serialize, Debug)]
pub(crate) struct SeqResult {
    pub(crate) queue_depth: usize,
    pub(crate) mb_per_s: f64,
    pub(crate) rebuild_active: Option<bool>,
}

#[derive(Serialize, Debug)]
pub(crate) struct CellResult {
    pub(crate) level: String,
    pub(crate) state: BenchState,
    pub(crate) capacity_bytes: u64,
    pub(crate) working_set_bytes: u64,
    /// Bytes per sequential request: 1 MiB, rounded to whole stripes on parity levels.
    pub(crate) seq_io_bytes: u64,
    pub(crate) random: Vec<RandomResult>,
    pub(crate) seq_write: Vec<SeqResult>,
    pub(crate) seq_read: Vec<SeqResult>,
    /// Rebuilding cells: whether a rebuild ran through every measurement.
    pub(crate) rebuild_active_whole_time: Option<bool>,
    /// Rebuilding cells: how often slot 0 was failed and replaced with a fresh drive (the first
    /// time included) to keep a rebuild running through every measurement.
    pub(crate) rebuild_replacements: u32,
    /// How requests reached the scratch drives (`io_uring+O_DIRECT`, ...).
    pub(crate) backend: String,
}

#[derive(Serialize, Debug)]
pub(crate) struct Ratio {
    /// `seq_write_vs_raid0`, `degraded_seq_read_vs_optimal`, `rebuilding_vs_optimal_*`.
    pub(crate) what: String,
    pub(crate) level: String,
    pub(crate) queue_depth: Option<usize>,
    pub(crate) ratio: f64,
}

#[derive(Serialize, Debug)]
pub(crate) struct BenchConfig {
    pub(crate) dir: String,
    pub(crate) drives: usize,
    pub(crate) drive_size_bytes: u64,
    pub(crate) stripe_unit_bytes: u64,
    pub(crate) seconds: f64,
    pub(crate) queue_depths: Vec<usize>,
    pub(crate) random_depth: usize,
    pub(crate) working_set_bytes: u64,
    pub(crate) direct_io: bool,
    pub(crate) backend: String,
    pub(crate) parity_kernel: String,
}

#[derive(Serialize, Debug)]
pub(crate) struct BenchReport {
    pub(crate) config: BenchConfig,
    pub(crate) cells: Vec<CellResult>,
    pub(crate) skipped: Vec<String>,
    pub(crate) ratios: Vec<Ratio>,
}

fn find<'a>(cells: &'a [CellResult], level: &str, state: BenchState) -> Option<&'a CellResult> {
    cells.iter().find(|c| c.level == level && c.state == state)
}

fn seq_at(list: &[SeqResult], qd: usize) -> Option<f64> {
    list.iter().find(|s| s.queue_depth == qd).map(|s| s.mb_per_s)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// The comparisons the benchmark exists for.
pub(crate) fn ratios(cells: &[CellResult], queue_depths: &[usize]) -> Vec<Ratio> {
    let mut out = Vec::new();
    let mut push = |what: &str, level: &str, queue_depth: Option<usize>, value: Option<f64>| {
        if let Some(ratio) = value {
            out.push(Ratio {
                what: what.to_string(),
                level: level.to_string(),
                queue_depth,
                ratio,
            });
        }
    };
    let raid0 = find(cells, "raid0", BenchState::Optimal);
    for level in ["raid5", "raid6"] {
        if let (Some(parity), Some(raid0)) = (find(cells, level, BenchState::Optimal), raid0) {
            for &qd in queue_depths {
                push(
                    "seq_write_vs_raid0",
                    level,
                    Some(qd),
                    ratio(seq_at(&parity.seq_write, qd), seq_at(&raid0.seq_write, qd)),
                );
            }
        }
    }
    let mut levels: Vec<&str> = cells.iter().map(|c| c.level.as_str()).collect();
    levels.dedup();
    for level in levels {
        let Some(optimal) = find(cells, level, BenchState::Optimal) else { continue };
        if let Some(degraded) = find(cells, level, BenchState::Degraded) {
            for &qd in queue_depths {
                push(
                    "degraded_seq_read_vs_optimal",
                    level,
                    Some(qd),
                    ratio(seq_at(&degraded.seq_read, qd), seq_at(&optimal.seq_read, qd)),
                );
            }
        }
        if let Some(rebuilding) = find(cells, level, BenchState::Rebuilding) {
            let random: Vec<f64> = rebuilding
                .random
                .iter()
                .zip(&optimal.random)
                .filter_map(|(r, o)| ratio(Some(r.iops), Some(o.iops)))
                .collect();
            let mean =
                (!random.is_empty()).then(|| random.iter().sum::<f64>() / random.len() as f64);
            push("rebuilding_vs_optimal_random_iops", level, None, mean);
            for &qd in queue_depths {
                push(
                    "rebuilding_vs_optimal_seq_write",
                    level,
                    Some(qd),
                    ratio(seq_at(&rebuilding.seq_write, qd), seq_at(&optimal.seq_write, qd)),
                );
                push(
                    "rebuilding_vs_optimal_seq_read",
                    level,
                    Some(qd),
                    ratio(seq_at(&rebuilding.seq_read, qd), seq_at(&optimal.seq_read, qd)),
                );
            }
        }
    }
    out
}

pub(crate) fn print_report(report: &BenchReport) {
    let c = &report.config;
    println!(
        "stria raid bench: {} drives of {} in {}{}, I/O by {}, stripe unit {}, parity kernel {}",
        c.drives,
        format_bytes(c.drive_size_bytes),
        c.dir,
        if c.direct_io { "" } else { " (tmpfs)" },
        c.backend,
        format_bytes(c.stripe_unit_bytes),
        c.parity_kernel
    );
    println!(
        "{} s per measurement; random: 4 KiB, {} threads; sequential: QD threads each on its own region; working set {}",
        c.seconds,
        c.random_depth,
        format_bytes(c.working_set_bytes)
    );
    println!();
    let mut header = format!("{:<6} {:<11}", "level", "state");
    for p in RANDOM_READ_PERCENTS {
        header += &format!(" {:>9}", format!("rnd{p}/{}", 100 - p));
    }
    header += " (kIOPS) |";
    for qd in &c.queue_depths {
        header += &format!(" {:>9}", format!("seqW qd{qd}"));
    }
    header += " |";
    for qd in &c.queue_depths {
        header += &format!(" {:>9}", format!("seqR qd{qd}"));
    }
    header += " (MB/s)  rebuild";
    println!("{header}");
    for cell in &report.cells {
        let mut line = format!("{:<6} {:<11}", cell.level, cell.state.name());
        for r in &cell.random {
            line += &format!(" {:>9.1}", r.iops / 1000.0);
        }
        line += "         |";
        for s in &cell.seq_write {
            line += &format!(" {:>9.0}", s.mb_per_s);
        }
        line += " |";
        for s in &cell.seq_read {
            line += &format!(" {:>9.0}", s.mb_per_s);
        }
        let rebuild = match cell.rebuild_active_whole_time {
            None => "-".to_string(),
            Some(true) => format!("active throughout ({} replacements)", cell.rebuild_replacements),
            Some(false) => {
                format!("ended during some runs ({} replacements)", cell.rebuild_replacements)
            }
        };
        line += &format!("         {rebuild}");
        println!("{line}");
    }
    println!();
    println!("mean latency of the random runs (us):");
    for cell in &report.cells {
        let mut line = format!("{:<6} {:<11}", cell.level, cell.state.name());
        for r in &cell.random {
            line += &format!(" {:>9.0}", r.mean_latency_us);
        }
        println!("{line}");
    }
    for cell in report
        .cells
        .iter()
        .filter(|c| c.seq_io_bytes != SEQ_IO_BYTES && c.state == BenchState::Optimal)
    {
        println!(
            "note: {} sequential requests are {} (whole stripes nearest 1 MiB), so every write is a full-stripe write",
            cell.level,
            format_bytes(cell.seq_io_bytes)
        );
    }
    for s in &report.skipped {
        println!("skipped: {s}");
    }
    if report.ratios.is_empty() {
        return;
    }
    println!();
    println!("ratios:");
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for r in &report.ratios {
        if !keys.contains(&(r.what.as_str(), r.level.as_str())) {
            keys.push((r.what.as_str(), r.level.as_str()));
        }
    }
    for (what, level) in keys {
        let label = match what {
            "seq_write_vs_raid0" => format!("{level} seq write (full stripes) / raid0 seq write"),
            "degraded_seq_read_vs_optimal" => format!("{level} degraded seq read / optimal"),
            "rebuilding_vs_optimal_random_iops" => {
                format!("{level} rebuilding random IOPS / optimal (mean of mixes)")
            }
            "rebuilding_vs_optimal_seq_write" => format!("{level} rebuilding seq write / optimal"),
            "rebuilding_vs_optimal_seq_read" => format!("{level} rebuilding seq read / optimal"),
            other => format!("{level} {other}"),
        };
        let values: Vec<String> = report
            .ratios
            .iter()
            .filter(|r| r.what == what && r.level == level)
            .map(|r| match r.queue_depth {
                Some(qd) => format!("qd{qd} {:.2}", r.ratio),
                None => format!("{:.2}", r.ratio),
            })
            .collect();
        println!("  {label:<58} {}", values.join("  "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(level: &str, state: BenchState, seq_mb_s: f64) -> CellResult {
        let seq = |v| vec![SeqResult { queue_depth: 1, mb_per_s: v, rebuild_active: None }];
        CellResult {
            level: level.into(),
            state,
            capacity_bytes: 0,
            working_set_bytes: 0,
            seq_io_bytes: SEQ_IO_BYTES,
            random: vec![RandomResult {
                read_percent: 100,
                iops: seq_mb_s,
                mean_latency_us: 1.0,
                rebuild_active: None,
            }],
            seq_write: seq(seq_mb_s),
            seq_read: seq(seq_mb_s),
            rebuild_active_whole_time: None,
            rebuild_replacements: 0,
            backend: String::new(),
        }
    }

    #[test]
    fn ratios_compare_the_right_cells() {
        let cells = vec![
            cell("raid0", BenchState::Optimal, 1000.0),
            cell("raid5", BenchState::Optimal, 500.0),
            cell("raid5", BenchState::Degraded, 250.0),
            cell("raid5", BenchState::Rebuilding, 400.0),
        ];
        let r = ratios(&cells, &[1]);
        let get =
            |what: &str| r.iter().find(|x| x.what == what && x.level == "raid5").map(|x| x.ratio);
        assert_eq!(get("seq_write_vs_raid0"), Some(0.5));
        assert_eq!(get("degraded_seq_read_vs_optimal"), Some(0.5));
        assert_eq!(get("rebuilding_vs_optimal_seq_write"), Some(0.8));
        assert_eq!(get("rebuilding_vs_optimal_random_iops"), Some(0.8));
        assert!(r.iter().all(|x| x.level != "raid0"), "raid0 is only the baseline");
    }
}
