//! The report of a benchmark: every run's results, the peak/sustained summary as the reference
//! tables give it, ratios between targets, the printed tables and the JSON document.
//!
//! - **Sustained**: a phase's whole-run rate (total done / total time). With several runs the
//!   median of the runs; over a sweep, the best thread count's.
//! - **Peak**: the best one-second rate seen in any run at any thread count.
//! - **Ratio**: a target's sustained rate over the first target's, per phase and thread count.

use std::fmt::Write as _;

use serde::Serialize;

use crate::common::RunResult;
use crate::meter::Unit;
use crate::target::TargetKind;

#[derive(Clone, Debug, Serialize)]
pub struct TargetInfo {
    pub label: String,
    pub kind: TargetKind,
}

/// One run of the workload on one target at one thread count.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// Index into [`Report::targets`].
    pub target: usize,
    /// 1-based repetition.
    pub run: usize,
    pub result: RunResult,
}

#[derive(Clone, Debug, Serialize)]
pub struct SummaryRow {
    pub target: String,
    pub phase: String,
    pub unit: Unit,
    pub peak: f64,
    pub sustained: f64,
    /// The thread count of the sustained value.
    pub threads: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct RatioRow {
    pub phase: String,
    pub threads: usize,
    pub target: String,
    pub baseline: String,
    /// target's sustained rate / baseline's.
    pub ratio: f64,
}

/// A sweep point: the median rate of a phase at one thread count on one target.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub target: String,
    pub phase: String,
    pub unit: Unit,
    pub threads: usize,
    pub rate: f64,
    pub peak: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CacheNote {
    pub target: String,
    pub policy: String,
    pub phases: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub tool: String,
    pub version: String,
    pub workload: String,
    pub sweep: bool,
    pub runs: usize,
    pub config: serde_json::Value,
    pub targets: Vec<TargetInfo>,
    pub records: Vec<Record>,
    pub points: Vec<Point>,
    pub summary: Vec<SummaryRow>,
    pub ratios: Vec<RatioRow>,
    /// How caches were kept out: per target, each policy with the phases it applied to.
    pub cache: Vec<CacheNote>,
    pub notes: Vec<String>,
    /// Stopped by Ctrl-C: the figures cover what ran.
    pub interrupted: bool,
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

impl Report {
    pub fn new(
        workload: &str,
        sweep: bool,
        runs: usize,
        config: serde_json::Value,
        targets: Vec<TargetInfo>,
    ) -> Report {
        Report {
            tool: "stria bench".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            workload: workload.into(),
            sweep,
            runs,
            config,
            targets,
            records: Vec::new(),
            points: Vec::new(),
            summary: Vec::new(),
            ratios: Vec::new(),
            cache: Vec::new(),
            notes: Vec::new(),
            interrupted: false,
        }
    }

    /// Phase names in the order they first ran.
    fn phases(&self) -> Vec<String> {
        let mut phases: Vec<String> = Vec::new();
        for r in &self.records {
            for p in &r.result.phases {
                if !phases.contains(&p.phase) {
                    phases.push(p.phase.clone());
                }
            }
        }
        phases
    }

    fn thread_counts(&self) -> Vec<usize> {
        let mut counts: Vec<usize> = self.records.iter().map(|r| r.result.threads).collect();
        counts.sort_unstable();
        counts.dedup();
        counts
    }

    /// Computes points, summary, ratios and cache notes from the records.
    pub fn finish(&mut self) {
        self.interrupted = self.records.iter().any(|r| r.result.interrupted);
        let phases = self.phases();
        let counts = self.thread_counts();
        self.points.clear();
        for (t, target) in self.targets.iter().enumerate() {
            for phase in &phases {
                for &threads in &counts {
                    let runs: Vec<_> = self
                        .records
                        .iter()
                        .filter(|r| r.target == t && r.result.threads == threads)
                        .filter_map(|r| r.result.phase(phase))
                        .collect();
                    let Some(first) = runs.first() else { continue };
                    let mut rates: Vec<f64> = runs.iter().map(|p| p.rate).collect();
                    self.points.push(Point {
                        target: target.label.clone(),
                        phase: phase.clone(),
                        unit: first.unit,
                        threads,
                        rate: median(&mut rates),
                        peak: runs.iter().map(|p| p.peak_rate).fold(0.0, f64::max),
                    });
                    for p in &runs {
                        let found = self
                            .cache
                            .iter_mut()
                            .find(|n| n.target == target.label && n.policy == p.cache);
                        match found {
                            Some(note) if note.phases.contains(phase) => {}
                            Some(note) => note.phases.push(phase.clone()),
                            None => self.cache.push(CacheNote {
                                target: target.label.clone(),
                                policy: p.cache.clone(),
                                phases: vec![phase.clone()],
                            }),
                        }
                    }
                }
            }
        }
        self.summary.clear();
        for target in &self.targets {
            for phase in &phases {
                let points: Vec<&Point> = self
                    .points
                    .iter()
                    .filter(|p| p.target == target.label && &p.phase == phase)
                    .collect();
                let Some(best) = points.iter().max_by(|a, b| a.rate.total_cmp(&b.rate)) else {
                    continue;
                };
                self.summary.push(SummaryRow {
                    target: target.label.clone(),
                    phase: phase.clone(),
                    unit: best.unit,
                    peak: points.iter().map(|p| p.peak).fold(0.0, f64::max),
                    sustained: best.rate,
                    threads: best.threads,
                });
            }
        }
        self.ratios.clear();
        if let Some(baseline) = self.targets.first() {
            for target in self.targets.iter().skip(1) {
                for phase in &phases {
                    for &threads in &counts {
                        let rate = |label: &str| {
                            self.points
                                .iter()
                                .find(|p| {
                                    p.target == label && &p.phase == phase && p.threads == threads
                                })
                                .map(|p| p.rate)
                        };
                        if let (Some(a), Some(b)) = (rate(&target.label), rate(&baseline.label))
                            && b > 0.0
                        {
                            self.ratios.push(RatioRow {
                                phase: phase.clone(),
                                threads,
                                target: target.label.clone(),
                                baseline: baseline.label.clone(),
                                ratio: a / b,
                            });
                        }
                    }
                }
            }
        }
    }

    /// The tables printed at the end of a run.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "stria bench {}{}",
            self.workload,
            if self.sweep { " (sweep)" } else { "" }
        );
        if self.interrupted {
            let _ = writeln!(out, "INTERRUPTED: the figures cover the phases that ran");
        }
        for note in &self.notes {
            let _ = writeln!(out, "note: {note}");
        }
        // Targets are T1, T2… in the tables; T1 is the baseline of the ratios.
        let _ = writeln!(out, "targets:");
        for (i, t) in self.targets.iter().enumerate() {
            let _ = writeln!(out, "  T{} = {} ({:?})", i + 1, t.label, t.kind);
            for note in self.cache.iter().filter(|n| n.target == t.label) {
                let _ = writeln!(out, "       {} [{}]", note.policy, note.phases.join(", "));
            }
        }
        // Per thread count and phase, a column per target.
        let _ = writeln!(out);
        let mut header = format!("{:<20} {:>7} {:>6}", "PHASE", "THREADS", "UNIT");
        for i in 0..self.targets.len() {
            let _ = write!(header, " {:>10}", format!("T{}", i + 1));
        }
        for i in 1..self.targets.len() {
            let _ = write!(header, " {:>8}", format!("T{}/T1", i + 1));
        }
        let _ = writeln!(out, "{header}");
        for phase in self.phases() {
            for threads in self.thread_counts() {
                let point = |label: &str| {
                    self.points
                        .iter()
                        .find(|p| p.target == label && p.phase == phase && p.threads == threads)
                };
                let Some(unit) = self.targets.iter().find_map(|t| point(&t.label)).map(|p| p.unit)
                else {
                    continue;
                };
                let mut line = format!("{:<20} {:>7} {:>6}", phase, threads, unit.name());
                for t in &self.targets {
                    let cell = point(&t.label).map_or("-".to_string(), |p| format_rate(p.rate));
                    let _ = write!(line, " {cell:>10}");
                }
                for t in self.targets.iter().skip(1) {
                    let ratio = self
                        .ratios
                        .iter()
                        .find(|r| r.target == t.label && r.phase == phase && r.threads == threads)
                        .map_or("-".to_string(), |r| format!("{:.2}", r.ratio));
                    let _ = write!(line, " {ratio:>8}");
                }
                let _ = writeln!(out, "{line}");
            }
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<6} {:<20} {:>6} {:>12} {:>12} {:>8}",
            "TARGET", "PHASE", "UNIT", "PEAK", "SUSTAINED", "THREADS"
        );
        for row in &self.summary {
            let index = self.targets.iter().position(|t| t.label == row.target).unwrap_or(0);
            let _ = writeln!(
                out,
                "{:<6} {:<20} {:>6} {:>12} {:>12} {:>8}",
                format!("T{}", index + 1),
                row.phase,
                row.unit.name(),
                format_rate(row.peak),
                format_rate(row.sustained),
                row.threads
            );
        }
        for r in &self.records {
            if let Some(extra) = &r.result.extra {
                let who = format!(
                    "{} threads={} run={}",
                    self.targets[r.target].label, r.result.threads, r.run
                );
                let _ = write!(out, "{}", render_extra(&who, extra));
            }
        }
        let _ = writeln!(out);
        let _ =
            writeln!(out, "checks (per run): bytes written / read, files created / removed / left");
        for r in &self.records {
            let c = &r.result.checks;
            let _ = writeln!(
                out,
                "  T{} threads={} run={}: {} / {} bytes, {} / {} / {} files{}",
                r.target + 1,
                r.result.threads,
                r.run,
                c.bytes_written,
                c.bytes_read,
                c.files_created,
                c.files_removed,
                c.files_left,
                if c.verified { ", every read verified" } else { "" }
            );
        }
        out
    }
}

/// Frame statistics and IO500 scores, one line each.
fn render_extra(who: &str, extra: &serde_json::Value) -> String {
    let mut out = String::new();
    let num = |v: &serde_json::Value, key: &str| v.get(key).and_then(|x| x.as_f64()).unwrap_or(0.0);
    if let Some(frames) = extra.get("frames").and_then(|f| f.as_array()) {
        for f in frames {
            let _ = writeln!(
                out,
                "{who} frames {}: {} frames, {:.1} frames/s ({:.1} per stream), {} dropped",
                f.get("phase").and_then(|p| p.as_str()).unwrap_or("?"),
                num(f, "frames"),
                num(f, "frames_per_s"),
                num(f, "frames_per_s_per_stream"),
                num(f, "dropped"),
            );
        }
    } else if extra.get("score").is_some() {
        let _ = writeln!(
            out,
            "{who} IO500 score {:.4} (bandwidth {:.4} GiB/s, metadata {:.3} kIOPS) - {}",
            num(extra, "score"),
            num(extra, "bandwidth_gib_per_s"),
            num(extra, "metadata_kiops"),
            extra.get("note").and_then(|n| n.as_str()).unwrap_or(""),
        );
    } else {
        let _ = writeln!(out, "{who}: {extra}");
    }
    out
}

/// Three significant figures, at least.
pub fn format_rate(rate: f64) -> String {
    if rate >= 100.0 {
        format!("{rate:.0}")
    } else if rate >= 10.0 {
        format!("{rate:.1}")
    } else {
        format!("{rate:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }
}
