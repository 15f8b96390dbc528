//! The monitor: samples the node once a second, keeps the last hour of throughput, IOPS and
//! latency in memory for the dashboard's charts, and turns state changes it sees (a drive
//! failed, a rebuild started, an initiator was refused) into events, whoever caused them.
//!
//! Rates are differences of the node's monotonic counters over the measured interval, so a
//! missed tick widens one interval instead of losing data. A counter that goes backwards (a
//! replaced drive starts from zero) counts as zero for that interval.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use stria_proto::fs::TargetId;
use stria_proto::mgmt::VolumeIoCounts;
use utoipa::ToSchema;

use crate::events::{EventKind, EventLog, Severity, now_unix_ms};
use crate::node_view::{NodeView, ScrubState, TargetState, TargetStatus};
use crate::service::Mgmt;

/// Time between samples.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// Points kept per series: one hour at one per second.
pub const SERIES_POINTS: usize = 3600;
/// Most per-drive series kept (drives replaced within the hour keep theirs until it ages out).
pub const DRIVE_SERIES_MAX: usize = 1024;

/// Rates of one scope (the node, a target) over each sampled second.
#[derive(Clone, Debug, Default, PartialEq, Serialize, ToSchema)]
pub struct IoRates {
    pub read_bytes_per_s: Vec<Option<f64>>,
    pub write_bytes_per_s: Vec<Option<f64>>,
    pub read_ops_per_s: Vec<Option<f64>>,
    pub write_ops_per_s: Vec<Option<f64>>,
    /// Mean latency of the chunk reads (writes) served in that second; null when there were
    /// none.
    pub read_latency_us_mean: Vec<Option<f64>>,
    pub write_latency_us_mean: Vec<Option<f64>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct TargetRates {
    #[schema(value_type = u32)]
    pub target: TargetId,
    pub rates: IoRates,
}

/// A pool's traffic: its targets' together.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct PoolRates {
    pub pool: String,
    pub rates: IoRates,
}

/// A volume's traffic as its NBD clients see it (latency: from request to reply, in the
/// gateway).
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct VolumeRates {
    pub volume: String,
    pub rates: IoRates,
}

/// A drive's own traffic (RAID's parity and mirror writes included).
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct DriveRates {
    pub drive: String,
    #[schema(value_type = u32)]
    pub target: TargetId,
    pub read_bytes_per_s: Vec<Option<f64>>,
    pub write_bytes_per_s: Vec<Option<f64>>,
    pub read_ops_per_s: Vec<Option<f64>>,
    pub write_ops_per_s: Vec<Option<f64>>,
}

/// Time series of the last `seconds`: every array has one value per timestamp; null where
/// nothing was measured (before a target or drive existed, or an idle latency).
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct Performance {
    pub interval_s: u32,
    pub timestamps_unix_s: Vec<u64>,
    /// All targets together: what clients read and wrote.
    pub total: IoRates,
    pub pools: Vec<PoolRates>,
    pub targets: Vec<TargetRates>,
    pub volumes: Vec<VolumeRates>,
    pub drives: Vec<DriveRates>,
}

type Ring = VecDeque<Option<f64>>;

fn push(ring: &mut Ring, value: Option<f64>) {
    if ring.len() == SERIES_POINTS {
        ring.pop_front();
    }
    ring.push_back(value);
}

fn tail(ring: &Ring, n: usize) -> Vec<Option<f64>> {
    ring.iter().skip(ring.len().saturating_sub(n)).copied().collect()
}

/// A new series joining `len` existing points starts with that many nulls.
fn padded(len: usize) -> Ring {
    let mut ring = VecDeque::with_capacity(SERIES_POINTS);
    ring.extend(std::iter::repeat_n(None, len));
    ring
}

#[derive(Debug, Default)]
struct IoRings {
    read_bytes: Ring,
    write_bytes: Ring,
    read_ops: Ring,
    write_ops: Ring,
    read_latency: Ring,
    write_latency: Ring,
}

/// Differences of I/O counters over one interval.
#[derive(Clone, Copy, Debug, Default)]
struct IoDelta {
    read_bytes: u64,
    write_bytes: u64,
    read_ops: u64,
    write_ops: u64,
    read_latency_us: u64,
    write_latency_us: u64,
}

impl IoDelta {
    fn add(&mut self, other: &IoDelta) {
        self.read_bytes += other.read_bytes;
        self.write_bytes += other.write_bytes;
        self.read_ops += other.read_ops;
        self.write_ops += other.write_ops;
        self.read_latency_us += other.read_latency_us;
        self.write_latency_us += other.write_latency_us;
    }
}

/// Rounded to a tenth: charts need no more, and an hour of series stays small.
fn tenths(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

fn mean(total: u64, count: u64) -> Option<f64> {
    (count > 0).then(|| tenths(total as f64 / count as f64))
}

impl IoRings {
    fn padded(len: usize) -> IoRings {
        IoRings {
            read_bytes: padded(len),
            write_bytes: padded(len),
            read_ops: padded(len),
            write_ops: padded(len),
            read_latency: padded(len),
            write_latency: padded(len),
        }
    }

    fn push(&mut self, delta: Option<&IoDelta>, secs: f64) {
        let rate = |v: u64| Some(tenths(v as f64 / secs));
        match delta {
            Some(d) => {
                push(&mut self.read_bytes, rate(d.read_bytes));
                push(&mut self.write_bytes, rate(d.write_bytes));
                push(&mut self.read_ops, rate(d.read_ops));
                push(&mut self.write_ops, rate(d.write_ops));
                push(&mut self.read_latency, mean(d.read_latency_us, d.read_ops));
                push(&mut self.write_latency, mean(d.write_latency_us, d.write_ops));
            }
            None => {
                for ring in [
                    &mut self.read_bytes,
                    &mut self.write_bytes,
                    &mut self.read_ops,
                    &mut self.write_ops,
                    &mut self.read_latency,
                    &mut self.write_latency,
                ] {
                    push(ring, None);
                }
            }
        }
    }

    fn rates(&self, n: usize) -> IoRates {
        IoRates {
            read_bytes_per_s: tail(&self.read_bytes, n),
            write_bytes_per_s: tail(&self.write_bytes, n),
            read_ops_per_s: tail(&self.read_ops, n),
            write_ops_per_s: tail(&self.write_ops, n),
            read_latency_us_mean: tail(&self.read_latency, n),
            write_latency_us_mean: tail(&self.write_latency, n),
        }
    }

    fn all_empty(&self) -> bool {
        self.read_bytes.iter().all(Option::is_none)
    }
}

#[derive(Debug)]
struct DriveRings {
    target: TargetId,
    io: IoRings,
}

/// Counter values at the previous sample, for differences.
#[derive(Debug, Default, Clone)]
struct Counters {
    targets: BTreeMap<TargetId, IoDelta>,
    /// The pool of each target.
    pools: BTreeMap<TargetId, String>,
    volumes: BTreeMap<String, IoDelta>,
    drives: BTreeMap<String, (TargetId, IoDelta)>,
}

fn counters_of(targets: &[TargetStatus], volumes: &[(String, VolumeIoCounts)]) -> Counters {
    let mut out = Counters::default();
    for (name, io) in volumes {
        out.volumes.insert(
            name.clone(),
            IoDelta {
                read_bytes: io.read_bytes,
                write_bytes: io.written_bytes,
                read_ops: io.read_ops,
                write_ops: io.write_ops,
                read_latency_us: io.read_latency_us_total,
                write_latency_us: io.write_latency_us_total,
            },
        );
    }
    for t in targets {
        out.pools.insert(t.id, t.pool.clone());
        out.targets.insert(
            t.id,
            IoDelta {
                read_bytes: t.io.read_bytes,
                write_bytes: t.io.written_bytes,
                read_ops: t.io.read_ops,
                write_ops: t.io.write_ops,
                read_latency_us: t.io.read_latency_us_total,
                write_latency_us: t.io.write_latency_us_total,
            },
        );
        for d in &t.drives {
            let io = IoDelta {
                read_bytes: d.read_bytes,
                write_bytes: d.written_bytes,
                read_ops: d.read_ops,
                write_ops: d.write_ops,
                ..IoDelta::default()
            };
            out.drives.insert(d.id.clone(), (t.id, io));
        }
    }
    out
}

fn delta(now: &IoDelta, before: &IoDelta) -> IoDelta {
    IoDelta {
        read_bytes: now.read_bytes.saturating_sub(before.read_bytes),
        write_bytes: now.write_bytes.saturating_sub(before.write_bytes),
        read_ops: now.read_ops.saturating_sub(before.read_ops),
        write_ops: now.write_ops.saturating_sub(before.write_ops),
        read_latency_us: now.read_latency_us.saturating_sub(before.read_latency_us),
        write_latency_us: now.write_latency_us.saturating_sub(before.write_latency_us),
    }
}

#[derive(Debug, Default)]
struct Series {
    timestamps_unix_s: VecDeque<u64>,
    total: IoRings,
    pools: BTreeMap<String, IoRings>,
    targets: BTreeMap<TargetId, IoRings>,
    volumes: BTreeMap<String, IoRings>,
    drives: BTreeMap<String, DriveRings>,
    last: Option<(Instant, Counters)>,
}

impl Series {
    fn record(&mut self, at: Instant, unix_s: u64, now: Counters) {
        let Some((before_at, before)) = self.last.replace((at, now.clone())) else {
            return;
        };
        let secs = at.duration_since(before_at).as_secs_f64().max(0.001);
        let len = self.timestamps_unix_s.len();
        if len == SERIES_POINTS {
            self.timestamps_unix_s.pop_front();
        }
        self.timestamps_unix_s.push_back(unix_s);

        let mut total = IoDelta::default();
        let mut pools: BTreeMap<&str, IoDelta> = BTreeMap::new();
        for id in now.targets.keys() {
            self.targets.entry(*id).or_insert_with(|| IoRings::padded(len));
        }
        for (id, rings) in &mut self.targets {
            let d = match (now.targets.get(id), before.targets.get(id)) {
                (Some(n), Some(b)) => Some(delta(n, b)),
                _ => None,
            };
            if let Some(d) = &d {
                total.add(d);
                if let Some(pool) = now.pools.get(id) {
                    pools.entry(pool).or_default().add(d);
                }
            }
            rings.push(d.as_ref(), secs);
        }
        self.total.push(Some(&total), secs);
        self.targets.retain(|_, rings| !rings.all_empty());

        for pool in now.pools.values() {
            self.pools.entry(pool.clone()).or_insert_with(|| IoRings::padded(len));
        }
        for (pool, rings) in &mut self.pools {
            rings.push(pools.get(pool.as_str()), secs);
        }
        self.pools.retain(|_, rings| !rings.all_empty());

        for name in now.volumes.keys() {
            self.volumes.entry(name.clone()).or_insert_with(|| IoRings::padded(len));
        }
        for (name, rings) in &mut self.volumes {
            let d = match (now.volumes.get(name), before.volumes.get(name)) {
                (Some(n), Some(b)) => Some(delta(n, b)),
                _ => None,
            };
            rings.push(d.as_ref(), secs);
        }
        self.volumes.retain(|_, rings| !rings.all_empty());

        for (id, (target, _)) in &now.drives {
            if self.drives.len() >= DRIVE_SERIES_MAX {
                break;
            }
            self.drives
                .entry(id.clone())
                .or_insert_with(|| DriveRings { target: *target, io: IoRings::padded(len) });
        }
        for (id, rings) in &mut self.drives {
            let d = match (now.drives.get(id), before.drives.get(id)) {
                (Some((_, n)), Some((_, b))) => Some(delta(n, b)),
                _ => None,
            };
            rings.io.push(d.as_ref(), secs);
        }
        self.drives.retain(|_, rings| !rings.io.all_empty());
    }

    fn report(&self, seconds: usize) -> Performance {
        let n = seconds.min(self.timestamps_unix_s.len());
        let skip = self.timestamps_unix_s.len() - n;
        Performance {
            interval_s: SAMPLE_INTERVAL.as_secs() as u32,
            timestamps_unix_s: self.timestamps_unix_s.iter().skip(skip).copied().collect(),
            total: self.total.rates(n),
            pools: self
                .pools
                .iter()
                .map(|(pool, rings)| PoolRates { pool: pool.clone(), rates: rings.rates(n) })
                .collect(),
            volumes: self
                .volumes
                .iter()
                .map(|(name, rings)| VolumeRates { volume: name.clone(), rates: rings.rates(n) })
                .collect(),
            targets: self
                .targets
                .iter()
                .map(|(id, rings)| TargetRates { target: *id, rates: rings.rates(n) })
                .collect(),
            drives: self
                .drives
                .iter()
                .map(|(id, rings)| {
                    let rates = rings.io.rates(n);
                    DriveRates {
                        drive: id.clone(),
                        target: rings.target,
                        read_bytes_per_s: rates.read_bytes_per_s,
                        write_bytes_per_s: rates.write_bytes_per_s,
                        read_ops_per_s: rates.read_ops_per_s,
                        write_ops_per_s: rates.write_ops_per_s,
                    }
                })
                .collect(),
        }
    }
}

/// What was seen at the previous look, to notice changes.
#[derive(Debug, Default)]
struct Seen {
    started: bool,
    /// Per drive id: target, slot, state and device at the last sample.
    drives: HashMap<String, (TargetId, Option<u32>, String, String)>,
    targets: HashMap<TargetId, (TargetState, bool, u64)>,
    refusals: HashMap<String, u64>,
}

fn target_severity(state: TargetState) -> Severity {
    match state {
        TargetState::Optimal => Severity::Info,
        TargetState::Degraded | TargetState::Rebuilding => Severity::Warning,
        TargetState::Failed => Severity::Error,
    }
}

/// Samples a node and keeps its recent history. Cheap to share (`Arc`).
pub struct Monitor {
    view: Arc<dyn NodeView>,
    mgmt: Mgmt,
    series: Mutex<Series>,
    seen: Mutex<Seen>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

impl Monitor {
    pub fn new(view: Arc<dyn NodeView>, mgmt: Mgmt) -> Arc<Monitor> {
        Arc::new(Monitor {
            view,
            mgmt,
            series: Mutex::new(Series::default()),
            seen: Mutex::new(Seen::default()),
        })
    }

    pub fn view(&self) -> &Arc<dyn NodeView> {
        &self.view
    }

    fn events(&self) -> &EventLog {
        self.mgmt.events()
    }

    /// One sample: counters into the series, state changes into events. Blocking.
    pub fn sample(&self) {
        let targets = self.view.targets();
        let at = Instant::now();
        self.series.lock().unwrap_or_else(|e| e.into_inner()).record(
            at,
            now_unix_ms() / 1000,
            counters_of(&targets, &self.mgmt.volume_counters()),
        );
        self.observe(&targets);
    }

    /// Looks for state changes now (after an action, so its event is there when the reply
    /// goes out). Blocking.
    pub fn observe_now(&self) {
        let targets = self.view.targets();
        self.observe(&targets);
    }

    /// The series of the last `seconds` (at most an hour).
    pub fn performance(&self, seconds: usize) -> Performance {
        self.series.lock().unwrap_or_else(|e| e.into_inner()).report(seconds)
    }

    /// Samples every [`SAMPLE_INTERVAL`] until the task is aborted.
    pub async fn run(self: Arc<Monitor>) {
        let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let monitor = self.clone();
            if tokio::task::spawn_blocking(move || monitor.sample()).await.is_err() {
                tracing::error!("the monitor's sample panicked; sampling goes on");
            }
        }
    }

    fn observe(&self, targets: &[TargetStatus]) {
        let refusals = self.mgmt.export_refusals();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let first = !seen.started;
        seen.started = true;
        let events = self.events();
        if first {
            let drives: usize = targets.iter().map(|t| t.drives.len()).sum();
            events.record(
                EventKind::NodeStarted,
                Severity::Info,
                "node",
                format!("node started with {} targets and {drives} drives", targets.len()),
            );
        }
        for t in targets {
            let subject = format!("target/{}", t.id.0);
            let now = (t.state, t.rebuild.is_some(), t.scrub.runs);
            let before = seen.targets.insert(t.id, now);
            match before {
                None if t.state != TargetState::Optimal => {
                    events.record(
                        EventKind::TargetStateChanged,
                        target_severity(t.state),
                        &subject,
                        format!("target {} is {}", t.id, t.state.name()),
                    );
                }
                Some((state, _, _)) if state != t.state => {
                    events.record(
                        EventKind::TargetStateChanged,
                        target_severity(t.state),
                        &subject,
                        format!("target {} went from {} to {}", t.id, state.name(), t.state.name()),
                    );
                }
                _ => {}
            }
            let was_rebuilding = before.is_some_and(|(_, r, _)| r);
            match (&t.rebuild, was_rebuilding) {
                (Some(r), false) if before.is_some() || r.running => {
                    events.record(
                        EventKind::RebuildStarted,
                        Severity::Warning,
                        &subject,
                        format!("target {} is rebuilding slot {}", t.id, r.slot),
                    );
                }
                (None, true) => {
                    events.record(
                        EventKind::RebuildFinished,
                        target_severity(t.state),
                        &subject,
                        format!("target {} finished rebuilding; it is {}", t.id, t.state.name()),
                    );
                }
                _ => {}
            }
            let runs_before = before.map_or(0, |(_, _, runs)| runs);
            if t.scrub.runs > runs_before {
                let findings = t.scrub.findings.clone().unwrap_or_default();
                let (kind, severity) = if !findings.clean() {
                    (EventKind::ScrubFoundErrors, Severity::Warning)
                } else if t.scrub.state == ScrubState::Failed {
                    (EventKind::ScrubFinished, Severity::Error)
                } else {
                    (EventKind::ScrubFinished, Severity::Info)
                };
                let how = match t.scrub.state {
                    ScrubState::Stopped => "was stopped",
                    ScrubState::Failed => "failed",
                    _ => "finished",
                };
                events.record(
                    kind,
                    severity,
                    &subject,
                    format!(
                        "scrub of target {} {how}: {} bytes checked, {} checksum errors, {} \
                         parity mismatches, {} blocks repaired, {} unrecoverable{}",
                        t.id,
                        findings.bytes_checked,
                        findings.checksum_errors,
                        findings.parity_mismatches,
                        findings.repaired_blocks,
                        findings.unrecoverable_blocks,
                        t.scrub.error.as_ref().map(|e| format!(" ({e})")).unwrap_or_default()
                    ),
                );
            }
            for d in &t.drives {
                let subject = format!("drive/{}", d.id);
                let now = (t.id, d.slot, d.state.clone(), d.device.clone());
                let before = seen.drives.insert(d.id.clone(), now);
                let where_ = match d.slot {
                    Some(slot) => format!("target {} slot {slot}", t.id),
                    None => format!("target {} (spare)", t.id),
                };
                match before {
                    Some((_, _, state, _)) if state != d.state => {
                        let kind = if d.state == "failed" {
                            EventKind::DriveFailed
                        } else {
                            EventKind::DriveStateChanged
                        };
                        let severity = match d.state.as_str() {
                            "failed" | "missing" => Severity::Error,
                            "rebuilding" => Severity::Warning,
                            _ => Severity::Info,
                        };
                        events.record(
                            kind,
                            severity,
                            subject,
                            format!(
                                "drive {} in {where_} went from {state} to {}",
                                d.device, d.state
                            ),
                        );
                    }
                    None if !first => {
                        events.record(
                            EventKind::DriveStateChanged,
                            Severity::Info,
                            subject,
                            format!("drive {} joined {where_} as {}", d.device, d.state),
                        );
                    }
                    None if d.state == "failed" || d.state == "missing" => {
                        events.record(
                            EventKind::DriveStateChanged,
                            Severity::Error,
                            subject,
                            format!("drive {} in {where_} is {}", d.device, d.state),
                        );
                    }
                    _ => {}
                }
            }
        }
        // A drive no target lists any more left its array: a hot spare took its slot the
        // moment it failed (so no sample saw it failed), or a replacement took the place of the
        // failed drive.
        let listed: std::collections::HashSet<&str> =
            targets.iter().flat_map(|t| t.drives.iter().map(|d| d.id.as_str())).collect();
        let gone: Vec<String> =
            seen.drives.keys().filter(|id| !listed.contains(id.as_str())).cloned().collect();
        for id in gone {
            let Some((target, slot, state, device)) = seen.drives.remove(&id) else { continue };
            let where_ = match slot {
                Some(slot) => format!("target {} slot {slot}", target.0),
                None => format!("target {} (spare)", target.0),
            };
            let subject = format!("drive/{id}");
            if matches!(state.as_str(), "failed" | "missing" | "empty") {
                events.record(
                    EventKind::DriveStateChanged,
                    Severity::Info,
                    subject,
                    format!("drive {device} ({state}) left {where_}: another drive took its place"),
                );
            } else {
                events.record(
                    EventKind::DriveFailed,
                    Severity::Error,
                    subject,
                    format!(
                        "drive {device} in {where_} went from {state} to failed and left the \
                         array: a hot spare took its place"
                    ),
                );
            }
        }
        for (export, count) in refusals {
            let before = seen.refusals.insert(export.clone(), count).unwrap_or(0);
            if count > before && !first {
                events.record(
                    EventKind::InitiatorRefused,
                    Severity::Warning,
                    format!("export/{export}"),
                    format!(
                        "export '{export}' refused {} initiator attempt(s) its access list does \
                         not allow (addresses in the log)",
                        count - before
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(read_bytes: u64, read_ops: u64, latency: u64) -> Counters {
        let mut c = Counters::default();
        c.targets.insert(
            TargetId(1),
            IoDelta {
                read_bytes,
                read_ops,
                read_latency_us: latency,
                write_bytes: 0,
                write_ops: 0,
                write_latency_us: 0,
            },
        );
        c.drives.insert("d0".into(), (TargetId(1), IoDelta { read_bytes, ..IoDelta::default() }));
        c
    }

    #[test]
    fn rates_are_differences_over_the_measured_interval() {
        let mut s = Series::default();
        let t0 = Instant::now();
        s.record(t0, 100, counters(0, 0, 0));
        s.record(t0 + Duration::from_secs(1), 101, counters(4096, 2, 300));
        s.record(t0 + Duration::from_secs(3), 103, counters(8192, 2, 300));
        let p = s.report(10);
        assert_eq!(p.timestamps_unix_s, vec![101, 103]);
        assert_eq!(p.total.read_bytes_per_s, vec![Some(4096.0), Some(2048.0)]);
        assert_eq!(p.total.read_ops_per_s, vec![Some(2.0), Some(0.0)]);
        assert_eq!(p.total.read_latency_us_mean, vec![Some(150.0), None], "idle: no latency");
        assert_eq!(p.targets.len(), 1);
        assert_eq!(p.drives[0].read_bytes_per_s, vec![Some(4096.0), Some(2048.0)]);
        assert_eq!(s.report(1).timestamps_unix_s, vec![103]);
    }

    #[test]
    fn pools_sum_their_targets_and_volumes_have_their_own_series() {
        let counters = |a: u64, b: u64, v: u64| {
            let mut c = Counters::default();
            for (id, pool, bytes) in [(1, "fast", a), (2, "fast", b), (3, "slow", a)] {
                c.targets.insert(TargetId(id), IoDelta { read_bytes: bytes, ..IoDelta::default() });
                c.pools.insert(TargetId(id), pool.to_string());
            }
            let write = IoDelta {
                write_bytes: v,
                write_ops: v / 4096,
                write_latency_us: v / 4096 * 10,
                ..IoDelta::default()
            };
            c.volumes.insert("v".into(), write);
            c
        };
        let mut s = Series::default();
        let t0 = Instant::now();
        s.record(t0, 100, counters(0, 0, 0));
        s.record(t0 + Duration::from_secs(1), 101, counters(100, 50, 8192));
        let p = s.report(10);
        let pool = |name: &str| p.pools.iter().find(|x| x.pool == name).unwrap();
        assert_eq!(pool("fast").rates.read_bytes_per_s, vec![Some(150.0)]);
        assert_eq!(pool("slow").rates.read_bytes_per_s, vec![Some(100.0)]);
        assert_eq!(p.volumes.len(), 1);
        assert_eq!(p.volumes[0].volume, "v");
        assert_eq!(p.volumes[0].rates.write_bytes_per_s, vec![Some(8192.0)]);
        assert_eq!(p.volumes[0].rates.write_ops_per_s, vec![Some(2.0)]);
        assert_eq!(p.volumes[0].rates.write_latency_us_mean, vec![Some(10.0)]);
    }

    #[test]
    fn series_keep_one_hour_and_stay_aligned() {
        let mut s = Series::default();
        let t0 = Instant::now();
        for i in 0..SERIES_POINTS as u64 + 10 {
            let mut c = counters(i * 10, i, 0);
            // A second drive appears half way: its series starts with nulls.
            if i >= 2000 {
                c.drives.insert("d1".into(), (TargetId(1), IoDelta::default()));
            }
            s.record(t0 + Duration::from_secs(i), i, c);
        }
        let p = s.report(usize::MAX);
        assert_eq!(p.timestamps_unix_s.len(), SERIES_POINTS);
        assert_eq!(*p.timestamps_unix_s.last().expect("points"), SERIES_POINTS as u64 + 9);
        for d in &p.drives {
            assert_eq!(d.read_bytes_per_s.len(), SERIES_POINTS, "drive {} aligned", d.drive);
        }
        let d1 = p.drives.iter().find(|d| d.drive == "d1").expect("d1 kept");
        assert!(d1.read_bytes_per_s[0].is_none());
        assert_eq!(d1.read_bytes_per_s.last(), Some(&Some(0.0)));
    }

    #[test]
    fn a_counter_that_restarts_counts_as_zero() {
        let mut s = Series::default();
        let t0 = Instant::now();
        s.record(t0, 1, counters(10_000, 5, 0));
        s.record(t0 + Duration::from_secs(1), 2, counters(100, 1, 0));
        assert_eq!(s.report(1).total.read_bytes_per_s, vec![Some(0.0)]);
    }
}
