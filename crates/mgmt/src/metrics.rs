//! The Prometheus exposition at `/metrics` (OpenMetrics text, prometheus-client).
//!
//! Everything is read fresh at each scrape from the node view, the registry and the file
//! system, then encoded by a one-shot collector: no second copy of the counters to keep in
//! step. Names are `stria_*` with the unit last (`_bytes`, `_seconds`, `_ratio`); counters end
//! in `_total`. The list with labels is in `docs/internals/mgmt.md`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::registry::{Registry, Unit};
use stria_proto::mgmt::{ExportInfo, VolumeInfo};

use crate::node_view::{DriveStatus, LATENCY_BUCKETS, ScrubState, TargetState, TargetStatus};

type Labels = Vec<(&'static str, String)>;
/// A metric read from one object: name, help, unit and how to get its value.
type Spec<T, V> = (&'static str, &'static str, Option<Unit>, fn(&T) -> V);

#[derive(Debug)]
enum Value {
    Counter(u64),
    Gauge(f64),
    /// Per-bucket (not cumulative) counts with upper bounds, sum and count.
    Histogram {
        sum: f64,
        count: u64,
        buckets: Vec<(f64, u64)>,
    },
}

#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    kind: MetricType,
    samples: Vec<(Labels, Value)>,
}

/// What one scrape reports.
#[derive(Debug, Default)]
pub struct Scrape {
    pub version: String,
    pub started_unix_s: u64,
    pub targets: Vec<TargetStatus>,
    pub volumes: Vec<VolumeInfo>,
    pub exports: Vec<ExportInfo>,
    /// (bytes total, bytes free, inodes total, inodes used) of the file system, if it answered.
    pub statfs: Option<(u64, u64, u64, u64)>,
    /// Metadata requests served, by operation.
    pub metadata_ops: Vec<(String, u64)>,
    /// FUSE requests the node's mount answered, by operation.
    pub mount_requests: Vec<(String, u64)>,
    pub auth_failures: u64,
    pub auth_rate_limited: u64,
    pub events: u64,
}

#[derive(Debug, Default)]
struct Families(Vec<Family>);

impl Families {
    fn add(
        &mut self,
        name: &'static str,
        help: &'static str,
        unit: Option<Unit>,
        kind: MetricType,
    ) -> &mut Vec<(Labels, Value)> {
        self.0.push(Family { name, help, unit, kind, samples: Vec::new() });
        &mut self.0.last_mut().expect("just pushed").samples
    }

    fn counter(&mut self, name: &'static str, help: &'static str, unit: Option<Unit>) -> Sink<'_> {
        Sink { samples: self.add(name, help, unit, MetricType::Counter), counter: true }
    }

    fn gauge(&mut self, name: &'static str, help: &'static str, unit: Option<Unit>) -> Sink<'_> {
        Sink { samples: self.add(name, help, unit, MetricType::Gauge), counter: false }
    }
}

struct Sink<'a> {
    samples: &'a mut Vec<(Labels, Value)>,
    counter: bool,
}

impl Sink<'_> {
    fn put(&mut self, labels: &Labels, value: f64) {
        let value =
            if self.counter { Value::Counter(value.max(0.0) as u64) } else { Value::Gauge(value) };
        self.samples.push((labels.clone(), value));
    }
}

fn latency_histogram(buckets: &[u64], latency_us_total: u64) -> Value {
    let mut out: Vec<(f64, u64)> = Vec::with_capacity(LATENCY_BUCKETS);
    for (i, count) in buckets.iter().enumerate() {
        let upper =
            if i + 1 == buckets.len() { f64::INFINITY } else { (1u64 << i) as f64 / 1_000_000.0 };
        out.push((upper, *count));
    }
    if out.is_empty() {
        out.push((f64::INFINITY, 0));
    }
    Value::Histogram {
        sum: latency_us_total as f64 / 1_000_000.0,
        count: buckets.iter().sum(),
        buckets: out,
    }
}

const DRIVE_STATES: [&str; 6] = ["active", "rebuilding", "failed", "missing", "empty", "spare"];

fn families(s: &Scrape) -> Families {
    let mut f = Families::default();
    let none: Labels = Vec::new();
    f.gauge("stria_build_info", "Version of the running stria (value 1).", None)
        .put(&vec![("version", s.version.clone())], 1.0);
    f.gauge(
        "stria_start_time",
        "When the node started, seconds since the Unix epoch.",
        Some(Unit::Seconds),
    )
    .put(&none, s.started_unix_s as f64);

    let target_labels = |t: &TargetStatus| -> Labels {
        vec![
            ("target", t.id.0.to_string()),
            ("pool", t.pool.clone()),
            ("level", t.geometry.level.clone()),
        ]
    };
    let drive_rows: Vec<(Labels, &DriveStatus)> = s
        .targets
        .iter()
        .flat_map(|t| {
            t.drives.iter().map(move |d| {
                let slot = d.slot.map_or_else(|| "spare".to_string(), |s| s.to_string());
                let labels: Labels = vec![
                    ("drive", d.id.clone()),
                    ("device", d.device.clone()),
                    ("target", t.id.0.to_string()),
                    ("slot", slot),
                ];
                (labels, d)
            })
        })
        .collect();

    // Drives.
    let drive_counters: [Spec<DriveStatus, u64>; 6] = [
        (
            "stria_drive_read",
            "Bytes read from the drive since the node started.",
            Some(Unit::Bytes),
            |d| d.read_bytes,
        ),
        (
            "stria_drive_written",
            "Bytes written to the drive since the node started (parity and mirror copies included).",
            Some(Unit::Bytes),
            |d| d.written_bytes,
        ),
        (
            "stria_drive_read_ops",
            "Read requests the drive completed since the node started.",
            None,
            |d| d.read_ops,
        ),
        (
            "stria_drive_write_ops",
            "Write requests the drive completed since the node started.",
            None,
            |d| d.write_ops,
        ),
        ("stria_drive_errors", "I/O errors of the drive over its life.", None, |d| d.errors),
        (
            "stria_drive_lifetime_written",
            "Bytes written to the drive over its life (wear).",
            Some(Unit::Bytes),
            |d| d.lifetime_written_bytes,
        ),
    ];
    for (name, help, unit, get) in drive_counters {
        let mut sink = f.counter(name, help, unit);
        for (labels, d) in &drive_rows {
            sink.put(labels, get(d) as f64);
        }
    }
    let mut sink = f.gauge("stria_drive_capacity", "Size of the drive.", Some(Unit::Bytes));
    for (labels, d) in &drive_rows {
        if let Some(c) = d.capacity_bytes {
            sink.put(labels, c as f64);
        }
    }
    let mut sink = f.gauge(
        "stria_drive_wear",
        "Share of the drive's rated endurance used (only for drives with a rating).",
        Some(Unit::Other("ratio".into())),
    );
    for (labels, d) in &drive_rows {
        if let Some(w) = d.wear_percent {
            sink.put(labels, w / 100.0);
        }
    }
    let mut sink = f.gauge(
        "stria_drive_state",
        "1 for the drive's current state (active, rebuilding, failed, missing, empty, spare), 0 for the others.",
        None,
    );
    for (labels, d) in &drive_rows {
        for state in DRIVE_STATES {
            let mut l = labels.clone();
            l.push(("state", state.to_string()));
            sink.put(&l, if d.state == state { 1.0 } else { 0.0 });
        }
    }
    let mut sink = f.gauge(
        "stria_drive_read_latency_p99",
        "99th percentile read latency of the drive since the node started (power-of-two bucket bound).",
        Some(Unit::Seconds),
    );
    for (labels, d) in &drive_rows {
        sink.put(labels, d.read_latency_p99_us as f64 / 1e6);
    }
    let mut sink = f.gauge(
        "stria_drive_write_latency_p99",
        "99th percentile write latency of the drive since the node started (power-of-two bucket bound).",
        Some(Unit::Seconds),
    );
    for (labels, d) in &drive_rows {
        sink.put(labels, d.write_latency_p99_us as f64 / 1e6);
    }

    // Targets.
    let target_gauges: [Spec<TargetStatus, f64>; 6] = [
        (
            "stria_target_capacity",
            "Bytes the target's chunk engine can hold.",
            Some(Unit::Bytes),
            |t| t.space.total_bytes as f64,
        ),
        ("stria_target_used", "Bytes held by chunks on the target.", Some(Unit::Bytes), |t| {
            t.space.used_bytes as f64
        }),
        (
            "stria_target_free",
            "Bytes allocatable on the target now (reclaimable ones included).",
            Some(Unit::Bytes),
            |t| (t.space.free_bytes + t.space.reclaimable_bytes) as f64,
        ),
        ("stria_target_chunks", "Chunks stored on the target.", None, |t| t.space.chunks as f64),
        ("stria_target_drives", "Drive slots of the target's array.", None, |t| {
            t.geometry.drives as f64
        }),
        (
            "stria_target_rebuild_rate_limit_bytes_per_second",
            "What a rebuild of the target may move per second.",
            None,
            |t| t.rebuild_rate_limit_bytes_per_s as f64,
        ),
    ];
    for (name, help, unit, get) in target_gauges {
        let mut sink = f.gauge(name, help, unit);
        for t in &s.targets {
            sink.put(&target_labels(t), get(t));
        }
    }
    let mut sink = f.gauge(
        "stria_target_state",
        "1 for the target's current RAID state (optimal, degraded, rebuilding, failed), 0 for the others.",
        None,
    );
    for t in &s.targets {
        for state in TargetState::ALL {
            let mut l = target_labels(t);
            l.push(("state", state.name().to_string()));
            sink.put(&l, if t.state == state { 1.0 } else { 0.0 });
        }
    }
    let mut sink = f.gauge(
        "stria_target_rebuild_progress",
        "Progress of the target's rebuild, 0 to 1 (only while a rebuild is recorded).",
        Some(Unit::Other("ratio".into())),
    );
    for t in &s.targets {
        if let Some(r) = &t.rebuild {
            sink.put(&target_labels(t), r.progress_ratio);
        }
    }
    let mut sink = f.gauge(
        "stria_target_rebuild_rate_bytes_per_second",
        "Average rate of the target's running rebuild (only while a rebuild is recorded).",
        None,
    );
    for t in &s.targets {
        if let Some(r) = &t.rebuild {
            sink.put(&target_labels(t), r.rate_bytes_per_s as f64);
        }
    }
    let mut sink =
        f.gauge("stria_target_scrub_running", "1 while a scrub of the target runs.", None);
    for t in &s.targets {
        sink.put(&target_labels(t), if t.scrub.state == ScrubState::Running { 1.0 } else { 0.0 });
    }
    let mut sink = f.gauge(
        "stria_target_scrub_progress",
        "Progress of the target's running or last scrub, 0 to 1.",
        Some(Unit::Other("ratio".into())),
    );
    for t in &s.targets {
        sink.put(&target_labels(t), t.scrub.progress_ratio);
    }
    let cache_gauges: [Spec<TargetStatus, f64>; 2] = [
        (
            "stria_target_read_cache_capacity",
            "Memory the target's read cache of small-I/O blocks may hold.",
            Some(Unit::Bytes),
            |t| t.read_cache.capacity_bytes as f64,
        ),
        (
            "stria_target_read_cache_held",
            "Memory the target's read cache holds now.",
            Some(Unit::Bytes),
            |t| t.read_cache.held_bytes as f64,
        ),
    ];
    for (name, help, unit, get) in cache_gauges {
        let mut sink = f.gauge(name, help, unit);
        for t in &s.targets {
            sink.put(&target_labels(t), get(t));
        }
    }
    let target_counters: [Spec<TargetStatus, u64>; 10] = [
        (
            "stria_target_read_cache_hits",
            "Blocks the target served from its read cache.",
            None,
            |t| t.read_cache.hits,
        ),
        (
            "stria_target_read_cache_misses",
            "Blocks looked up in the read cache and read from the array instead.",
            None,
            |t| t.read_cache.misses,
        ),
        ("stria_target_read", "Bytes of chunk reads the target served.", Some(Unit::Bytes), |t| {
            t.io.read_bytes
        }),
        (
            "stria_target_written",
            "Bytes of chunk writes the target served (before RAID redundancy).",
            Some(Unit::Bytes),
            |t| t.io.written_bytes,
        ),
        ("stria_target_read_ops", "Chunk reads the target served.", None, |t| t.io.read_ops),
        ("stria_target_write_ops", "Chunk writes the target served.", None, |t| t.io.write_ops),
        (
            "stria_target_checksum_errors",
            "Blocks that failed their CRC32C on read since the node started.",
            None,
            |t| t.checksum_errors,
        ),
        (
            "stria_target_repaired_blocks",
            "Blocks rewritten from redundancy since the node started.",
            None,
            |t| t.repaired_blocks,
        ),
        (
            "stria_target_unrecoverable_blocks",
            "Blocks that could not be recovered since the node started.",
            None,
            |t| t.unrecoverable_blocks,
        ),
        (
            "stria_target_scrubs",
            "Scrubs of the target that ended since the node started.",
            None,
            |t| t.scrub.runs,
        ),
    ];
    for (name, help, unit, get) in target_counters {
        let mut sink = f.counter(name, help, unit);
        for t in &s.targets {
            sink.put(&target_labels(t), get(t) as f64);
        }
    }
    for (name, help, pick) in [
        ("stria_target_read_latency", "Latency of chunk reads inside the storage service.", true),
        (
            "stria_target_write_latency",
            "Latency of chunk writes inside the storage service.",
            false,
        ),
    ] {
        let samples = f.add(name, help, Some(Unit::Seconds), MetricType::Histogram);
        for t in &s.targets {
            let value = if pick {
                latency_histogram(&t.io.read_latency_buckets, t.io.read_latency_us_total)
            } else {
                latency_histogram(&t.io.write_latency_buckets, t.io.write_latency_us_total)
            };
            samples.push((target_labels(t), value));
        }
    }

    // Pools.
    let mut pools: Vec<&str> = s.targets.iter().map(|t| t.pool.as_str()).collect();
    pools.sort_unstable();
    pools.dedup();
    let pool_sum = |pool: &str, get: fn(&TargetStatus) -> u64| -> f64 {
        s.targets.iter().filter(|t| t.pool == pool).map(get).sum::<u64>() as f64
    };
    let mut sink =
        f.gauge("stria_pool_capacity", "Bytes the pool's targets can hold.", Some(Unit::Bytes));
    for p in &pools {
        sink.put(&vec![("pool", p.to_string())], pool_sum(p, |t| t.space.total_bytes));
    }
    let mut sink =
        f.gauge("stria_pool_used", "Bytes held by chunks in the pool.", Some(Unit::Bytes));
    for p in &pools {
        sink.put(&vec![("pool", p.to_string())], pool_sum(p, |t| t.space.used_bytes));
    }
    let mut sink = f.gauge("stria_pool_targets", "Targets in the pool.", None);
    for p in &pools {
        sink.put(&vec![("pool", p.to_string())], pool_sum(p, |_| 1));
    }

    // File system.
    if let Some((total, free, inodes_total, inodes_used)) = s.statfs {
        f.gauge("stria_fs_capacity", "Bytes of the file system.", Some(Unit::Bytes))
            .put(&none, total as f64);
        f.gauge("stria_fs_free", "Free bytes of the file system.", Some(Unit::Bytes))
            .put(&none, free as f64);
        f.gauge("stria_fs_inodes", "Inodes the file system may hold.", None)
            .put(&none, inodes_total as f64);
        f.gauge("stria_fs_inodes_used", "Inodes in use.", None).put(&none, inodes_used as f64);
    }

    // Requests by operation: of the metadata service, of the FUSE mount.
    for (name, help, counts) in [
        (
            "stria_metadata_ops",
            "Metadata requests served since the node started, by operation.",
            &s.metadata_ops,
        ),
        (
            "stria_mount_requests",
            "Kernel requests the node's FUSE mount answered since it was mounted, by operation.",
            &s.mount_requests,
        ),
    ] {
        let mut sink = f.counter(name, help, None);
        for (op, count) in counts {
            sink.put(&vec![("op", op.clone())], *count as f64);
        }
    }

    // Volumes and exports.
    let volume_labels =
        |v: &VolumeInfo| -> Labels { vec![("volume", v.name.clone()), ("pool", v.pool.clone())] };
    let mut sink = f.gauge(
        "stria_volume_provisioned",
        "Size of the volume (thin: promised, not taken).",
        Some(Unit::Bytes),
    );
    for v in &s.volumes {
        sink.put(&volume_labels(v), v.size_bytes as f64);
    }
    let mut sink = f.gauge(
        "stria_volume_allocated",
        "Bytes of the volume written and not trimmed.",
        Some(Unit::Bytes),
    );
    for v in &s.volumes {
        if let Some(a) = v.allocated_bytes {
            sink.put(&volume_labels(v), a as f64);
        }
    }
    let io_counters: [(&'static str, &'static str, Option<Unit>, fn(&VolumeInfo) -> u64); 4] = [
        ("stria_volume_read", "Bytes read from the volume through NBD.", Some(Unit::Bytes), |v| {
            v.io.read_bytes
        }),
        (
            "stria_volume_written",
            "Bytes written to the volume through NBD.",
            Some(Unit::Bytes),
            |v| v.io.written_bytes,
        ),
        ("stria_volume_read_ops", "Read requests the volume served through NBD.", None, |v| {
            v.io.read_ops
        }),
        ("stria_volume_write_ops", "Write requests the volume served through NBD.", None, |v| {
            v.io.write_ops
        }),
    ];
    for (name, help, unit, value) in io_counters {
        let mut sink = f.counter(name, help, unit);
        for v in &s.volumes {
            sink.put(&volume_labels(v), value(v) as f64);
        }
    }
    let export_labels = |e: &ExportInfo| -> Labels {
        vec![("export", e.name.clone()), ("volume", e.volume.clone())]
    };
    let mut sink = f.counter(
        "stria_export_connections",
        "NBD connections that opened the export since the node started.",
        None,
    );
    for e in &s.exports {
        sink.put(&export_labels(e), e.connections as f64);
    }
    let mut sink = f.counter(
        "stria_export_refusals",
        "Initiator attempts the export's access list refused since the node started.",
        None,
    );
    for e in &s.exports {
        sink.put(&export_labels(e), e.refused as f64);
    }
    let mut sink = f.gauge("stria_export_acl_rules", "Rules on the export's access list.", None);
    for e in &s.exports {
        sink.put(&export_labels(e), e.acl.len() as f64);
    }

    // The API itself.
    f.counter(
        "stria_api_auth_failures",
        "REST and metrics requests refused for a missing or wrong token.",
        None,
    )
    .put(&none, s.auth_failures as f64);
    f.counter(
        "stria_api_auth_rate_limited",
        "Requests answered 429 after too many failed authentications.",
        None,
    )
    .put(&none, s.auth_rate_limited as f64);
    f.counter("stria_events", "Events recorded since the node started.", None)
        .put(&none, s.events as f64);
    f
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in &self.0 {
            let mut metric = encoder.encode_descriptor(
                family.name,
                family.help,
                family.unit.as_ref(),
                family.kind,
            )?;
            for (labels, value) in &family.samples {
                if labels.is_empty() {
                    encode_value(&mut metric, value)?;
                } else {
                    encode_value(&mut metric.encode_family(labels)?, value)?;
                }
            }
        }
        Ok(())
    }
}

fn encode_value(sample: &mut MetricEncoder<'_>, value: &Value) -> Result<(), std::fmt::Error> {
    match value {
        Value::Counter(v) => {
            sample.encode_counter::<NoLabelSet, u64, u64>(v, None::<&Exemplar<NoLabelSet, u64>>)?
        }
        // Whole numbers (bytes, counts) print without a fraction.
        Value::Gauge(v) if v.fract() == 0.0 && v.abs() < 9.0e15 => {
            sample.encode_gauge(&(*v as i64))?
        }
        Value::Gauge(v) => sample.encode_gauge(v)?,
        Value::Histogram { sum, count, buckets } => {
            sample.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?
        }
    }
    Ok(())
}

/// The OpenMetrics text of one scrape.
pub fn render(scrape: &Scrape) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(families(scrape)));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        // Writing into a String cannot fail; an error here is a bug in the families above.
        tracing::error!("encoding the metrics failed");
    }
    out
}

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_view::*;
    use stria_proto::fs::TargetId;

    pub(crate) fn sample_target() -> TargetStatus {
        let drive = |slot: u32, state: &str| DriveStatus {
            id: format!("uuid-{slot}"),
            device: format!("/data/t1-d{slot}.img"),
            backend: "io_uring".into(),
            target: TargetId(1),
            slot: Some(slot),
            state: state.into(),
            capacity_bytes: Some(1 << 30),
            read_bytes: 4096,
            written_bytes: 8192,
            read_ops: 1,
            write_ops: 2,
            errors: 0,
            lifetime_written_bytes: 8192,
            rated_endurance_bytes: 1 << 40,
            wear_percent: Some(50.0),
            remaining_life_days: None,
            read_latency_p99_us: 128,
            write_latency_p99_us: 256,
        };
        let mut buckets = vec![0; LATENCY_BUCKETS];
        buckets[3] = 2;
        buckets[LATENCY_BUCKETS - 1] = 1;
        TargetStatus {
            id: TargetId(1),
            pool: "default".into(),
            state: TargetState::Degraded,
            geometry: Geometry {
                level: "raid5".into(),
                drives: 3,
                data_drives: 2,
                stripe_unit_bytes: 65536,
                tolerated_failures: 1,
                array_capacity_bytes: 2 << 30,
            },
            space: Space {
                total_bytes: 100,
                used_bytes: 40,
                free_bytes: 50,
                reclaimable_bytes: 10,
                chunks: 3,
            },
            rebuild: None,
            rebuild_rate_limit_bytes_per_s: 200 << 20,
            scrub: ScrubStatus::idle(),
            checksum_errors: 0,
            repaired_blocks: 0,
            unrecoverable_blocks: 0,
            io: TargetIo {
                read_ops: 3,
                read_bytes: 12288,
                write_ops: 0,
                written_bytes: 0,
                read_latency_us_total: 30,
                write_latency_us_total: 0,
                read_latency_buckets: buckets,
                write_latency_buckets: vec![0; LATENCY_BUCKETS],
            },
            read_cache: ReadCache { capacity_bytes: 1 << 30, held_bytes: 8192, hits: 5, misses: 2 },
            warnings: Vec::new(),
            drives: vec![drive(0, "active"), drive(1, "failed"), drive(2, "active")],
        }
    }

    #[test]
    fn the_exposition_names_units_and_labels() {
        let scrape = Scrape {
            version: "0.1.0".into(),
            targets: vec![sample_target()],
            statfs: Some((100, 60, 1000, 7)),
            ..Scrape::default()
        };
        let text = render(&scrape);
        for line in [
            "stria_drive_read_bytes_total{drive=\"uuid-0\",device=\"/data/t1-d0.img\",target=\"1\",slot=\"0\"} 4096",
            "stria_drive_wear_ratio{drive=\"uuid-1\",device=\"/data/t1-d1.img\",target=\"1\",slot=\"1\"} 0.5",
            "stria_drive_state{drive=\"uuid-1\",device=\"/data/t1-d1.img\",target=\"1\",slot=\"1\",state=\"failed\"} 1",
            "stria_target_state{target=\"1\",pool=\"default\",level=\"raid5\",state=\"degraded\"} 1",
            "stria_target_state{target=\"1\",pool=\"default\",level=\"raid5\",state=\"optimal\"} 0",
            "stria_target_free_bytes{target=\"1\",pool=\"default\",level=\"raid5\"} 60",
            "stria_target_read_latency_seconds_count{target=\"1\",pool=\"default\",level=\"raid5\"} 3",
            "stria_target_read_latency_seconds_bucket{le=\"0.000008\",target=\"1\",pool=\"default\",level=\"raid5\"} 2",
            "stria_target_read_latency_seconds_bucket{le=\"+Inf\",target=\"1\",pool=\"default\",level=\"raid5\"} 3",
            "stria_pool_capacity_bytes{pool=\"default\"} 100",
            "stria_fs_inodes_used 7",
            "# TYPE stria_drive_errors counter",
            "# UNIT stria_target_capacity_bytes bytes",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "missing line {line}\n{text}");
        }
    }

    /// Every metric `deploy/grafana/stria.json` charts is one the node exports.
    #[test]
    fn the_grafana_dashboard_uses_exported_metrics() {
        let volume = stria_proto::mgmt::VolumeInfo {
            name: "v".into(),
            object: 1 << 63 | 1,
            size_bytes: 1 << 20,
            pool: "default".into(),
            chunk_bytes: 1 << 20,
            targets: vec![TargetId(1)],
            allocated_bytes: Some(4096),
            state: "online".into(),
            exports: vec!["v".into()],
            created_unix_s: 0,
            io: Default::default(),
            origin: None,
            snapshot: false,
        };
        let export = stria_proto::mgmt::ExportInfo {
            name: "v".into(),
            volume: "v".into(),
            read_only: false,
            description: String::new(),
            acl: Vec::new(),
            connections: 1,
            refused: 2,
        };
        let scrape = Scrape {
            version: "0.1.0".into(),
            targets: vec![sample_target()],
            volumes: vec![volume],
            exports: vec![export],
            statfs: Some((100, 60, 1000, 7)),
            ..Scrape::default()
        };
        let text = render(&scrape);
        let dashboard = include_str!("../../../deploy/grafana/stria.json");
        let mut names: Vec<&str> = Vec::new();
        let mut rest = dashboard;
        while let Some(at) = rest.find("stria_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(tail.len());
            names.push(&tail[..end]);
            rest = &tail[end..];
        }
        assert!(names.len() >= 20, "the dashboard charts the node's metrics: {names:?}");
        for name in names {
            if name == "stria_" || name.starts_with("stria_node") {
                continue;
            }
            let sample = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|_| name.contains("latency")))
                .map_or(name.to_string(), |base| format!("{base}_bucket"));
            // A sample line, or the family's declaration (some gauges only have samples while
            // something happens, e.g. a rebuild).
            let family = name.strip_suffix("_total").unwrap_or(name);
            assert!(
                text.lines().any(|l| l.starts_with(&format!("{sample}{{"))
                    || l.starts_with(&format!("{sample} "))
                    || l == format!("# TYPE {family} gauge")
                    || l == format!("# TYPE {family} counter")),
                "the Grafana dashboard charts {name}, which the node does not export"
            );
        }
    }
}
