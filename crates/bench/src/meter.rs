//! Measuring one phase: workers count what they do in a shared [`Meter`]; a sampler looks at
//! the counters every 100 ms (for the progress bar and the peak rate), and the phase ends with a
//! [`PhaseResult`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Sub-buckets per power of two: latencies are kept to within 12.5%.
const SUB_BUCKETS: usize = 8;
const BUCKETS: usize = 64 * SUB_BUCKETS;

/// A lock-free latency histogram in nanoseconds, log-linear.
#[derive(Debug)]
pub struct Histogram {
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    if ns < SUB_BUCKETS as u64 {
        return ns as usize;
    }
    let msb = 63 - ns.leading_zeros() as usize;
    let sub = ((ns >> (msb - 3)) & (SUB_BUCKETS as u64 - 1)) as usize;
    (msb - 2) * SUB_BUCKETS + sub
}

/// The largest value in a bucket.
fn bucket_high(index: usize) -> u64 {
    if index < SUB_BUCKETS {
        return index as u64;
    }
    let msb = index / SUB_BUCKETS + 2;
    let sub = (index % SUB_BUCKETS) as u64;
    ((SUB_BUCKETS as u64 + sub + 1) << (msb - 3)) - 1
}

impl Histogram {
    pub fn record(&self, ns: u64) {
        self.counts[bucket_of(ns).min(BUCKETS - 1)].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
        self.max_ns.fetch_max(ns, Relaxed);
    }

    pub fn summary(&self) -> Latency {
        let counts: Vec<u64> = self.counts.iter().map(|c| c.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        let quantile = |q: f64| {
            if total == 0 {
                return 0.0;
            }
            let rank = ((total as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return bucket_high(i) as f64 / 1000.0;
                }
            }
            0.0
        };
        Latency {
            mean_us: if total == 0 {
                0.0
            } else {
                self.sum_ns.load(Relaxed) as f64 / total as f64 / 1000.0
            },
            p50_us: quantile(0.50),
            p99_us: quantile(0.99),
            max_us: self.max_ns.load(Relaxed) as f64 / 1000.0,
        }
    }
}

/// Latency of one kind of operation, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Latency {
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// Counters of one kind of operation (reads, or writes, or creates…).
#[derive(Debug, Default)]
pub struct Channel {
    ops: AtomicU64,
    bytes: AtomicU64,
    latency: Histogram,
}

impl Channel {
    pub fn record(&self, bytes: u64, took: Duration) {
        self.ops.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
        self.latency.record(took.as_nanos() as u64);
    }

    pub fn ops(&self) -> u64 {
        self.ops.load(Relaxed)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }
}

/// What a phase's workers share: counters, and when to stop.
#[derive(Debug)]
pub struct Meter {
    pub read: Channel,
    pub write: Channel,
    /// Operations without data (create, stat, remove…), counted in `write` or `read` when
    /// they move bytes.
    pub other: Channel,
    stop: &'static AtomicBool,
    deadline: Option<Instant>,
    /// The first error a worker met; the others stop.
    failed: Mutex<Option<std::io::Error>>,
    failed_flag: AtomicBool,
}

impl Meter {
    /// Whether workers should stop now: interrupted, past the deadline, or another failed.
    pub fn should_stop(&self) -> bool {
        self.stop.load(Relaxed)
            || self.failed_flag.load(Relaxed)
            || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Whether the user interrupted (as opposed to a deadline ending the phase).
    pub fn interrupted(&self) -> bool {
        self.stop.load(Relaxed)
    }

    fn fail(&self, e: std::io::Error) {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if failed.is_none() {
            *failed = Some(e);
        }
        self.failed_flag.store(true, Relaxed);
    }

    fn done(&self) -> (u64, u64) {
        let ops = self.read.ops() + self.write.ops() + self.other.ops();
        let bytes = self.read.bytes() + self.write.bytes();
        (ops, bytes)
    }
}

/// What a phase measures: bytes per second or operations per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Reported in MiB/s.
    Bytes,
    /// Reported in operations per second.
    Ops,
}

impl Unit {
    pub fn name(self) -> &'static str {
        match self {
            Unit::Bytes => "MiB/s",
            Unit::Ops => "ops/s",
        }
    }
}

/// How one phase is run.
#[derive(Debug, Clone)]
pub struct PhaseSpec {
    /// e.g. `write`, `read`, `create`, `randread`.
    pub name: String,
    pub unit: Unit,
    /// Worker threads.
    pub workers: usize,
    /// Threads as the user counts them (workers / queue depth).
    pub threads: usize,
    /// End the phase after this long, if it has not ended by itself.
    pub duration: Option<Duration>,
    /// What the progress bar counts to (bytes or ops), when known.
    pub expected: Option<u64>,
    /// How caches were kept out of this phase, in words.
    pub cache: String,
}

/// Counters of one channel at the end of a phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ChannelResult {
    pub ops: u64,
    pub bytes: u64,
    pub latency: Latency,
}

/// The result of one phase.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseResult {
    pub phase: String,
    pub unit: Unit,
    pub threads: usize,
    pub workers: usize,
    pub seconds: f64,
    /// Operations done (reads + writes + others).
    pub ops: u64,
    /// Bytes moved (read + written).
    pub bytes: u64,
    /// The whole phase's rate in `unit` (the sustained value).
    pub rate: f64,
    /// The best one-second rate seen during the phase (equal to `rate` for phases shorter
    /// than two seconds).
    pub peak_rate: f64,
    pub read: ChannelResult,
    pub write: ChannelResult,
    pub other: ChannelResult,
    pub cache: String,
    /// Stopped by Ctrl-C before its end: the figures cover what was done.
    pub interrupted: bool,
}

impl PhaseResult {
    /// The rate in the phase's unit for `ops` operations or `bytes` bytes in `seconds`.
    fn rate_of(unit: Unit, ops: u64, bytes: u64, seconds: f64) -> f64 {
        if seconds <= 0.0 {
            return 0.0;
        }
        match unit {
            Unit::Bytes => bytes as f64 / seconds / (1 << 20) as f64,
            Unit::Ops => ops as f64 / seconds,
        }
    }
}

/// What every phase of a run shares.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// Set by Ctrl-C: phases stop and report what they did.
    pub stop: &'static AtomicBool,
    /// Draw progress bars on stderr.
    pub progress: bool,
}

impl RunContext {
    /// No progress bars, never interrupted.
    pub fn quiet() -> RunContext {
        static NEVER: AtomicBool = AtomicBool::new(false);
        RunContext { stop: &NEVER, progress: false }
    }

    pub fn interrupted(&self) -> bool {
        self.stop.load(Relaxed)
    }
}

const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Runs `work(worker, meter)` on `spec.workers` threads and measures it. The first error
/// stops the others and is returned.
pub fn run_phase<F>(ctx: &RunContext, spec: &PhaseSpec, work: F) -> std::io::Result<PhaseResult>
where
    F: Fn(usize, &Meter) -> std::io::Result<()> + Sync,
{
    let meter = Meter {
        read: Channel::default(),
        write: Channel::default(),
        other: Channel::default(),
        stop: ctx.stop,
        deadline: spec.duration.map(|d| Instant::now() + d),
        failed: Mutex::new(None),
        failed_flag: AtomicBool::new(false),
    };
    let bar = progress_bar(ctx, spec);
    let started = Instant::now();
    // (seconds since start, units done) every SAMPLE_EVERY.
    let mut samples: Vec<(f64, f64)> = vec![(0.0, 0.0)];
    let units = |m: &Meter| {
        let (ops, bytes) = m.done();
        match spec.unit {
            Unit::Bytes => bytes as f64,
            Unit::Ops => ops as f64,
        }
    };
    // Each worker reports when it ends, so the phase's time is the last worker's end, not
    // the sampler's next tick.
    let (ended_tx, ended_rx) = std::sync::mpsc::channel::<Instant>();
    let mut last_end = started;
    std::thread::scope(|scope| {
        for worker in 0..spec.workers {
            let (meter, work, ended_tx) = (&meter, &work, ended_tx.clone());
            scope.spawn(move || {
                if let Err(e) = work(worker, meter) {
                    meter.fail(e);
                }
                let _ = ended_tx.send(Instant::now());
            });
        }
        let mut ended = 0;
        let mut next_sample = started + SAMPLE_EVERY;
        while ended < spec.workers {
            match ended_rx.recv_timeout(next_sample.saturating_duration_since(Instant::now())) {
                Ok(at) => {
                    ended += 1;
                    last_end = last_end.max(at);
                }
                Err(_) => {
                    let done = units(&meter);
                    samples.push((started.elapsed().as_secs_f64(), done));
                    if let Some(bar) = &bar {
                        bar.set_position(done as u64);
                    }
                    next_sample += SAMPLE_EVERY;
                }
            }
        }
    });
    let seconds = last_end.duration_since(started).as_secs_f64();
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if let Some(e) = meter.failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    let (ops, bytes) = meter.done();
    let rate = PhaseResult::rate_of(spec.unit, ops, bytes, seconds);
    samples.push((seconds, units(&meter)));
    let peak_rate = peak_rate(&samples, spec.unit).unwrap_or(rate).max(rate);
    let channel = |c: &Channel| ChannelResult {
        ops: c.ops(),
        bytes: c.bytes(),
        latency: c.latency.summary(),
    };
    Ok(PhaseResult {
        phase: spec.name.clone(),
        unit: spec.unit,
        threads: spec.threads,
        workers: spec.workers,
        seconds,
        ops,
        bytes,
        rate,
        peak_rate,
        read: channel(&meter.read),
        write: channel(&meter.write),
        other: channel(&meter.other),
        cache: spec.cache.clone(),
        interrupted: meter.interrupted(),
    })
}

/// The best rate over any one-second window of samples; None for phases under two seconds,
/// whose single window is the whole phase.
fn peak_rate(samples: &[(f64, f64)], unit: Unit) -> Option<f64> {
    let last = samples.last()?.0;
    if last < 2.0 {
        return None;
    }
    let scale = match unit {
        Unit::Bytes => 1.0 / (1 << 20) as f64,
        Unit::Ops => 1.0,
    };
    let mut best: f64 = 0.0;
    let mut start = 0;
    for end in 1..samples.len() {
        while samples[end].0 - samples[start].0 > 1.0 + 1e-9 && start + 1 < end {
            start += 1;
        }
        let span = samples[end].0 - samples[start].0;
        if span >= 0.95 {
            best = best.max((samples[end].1 - samples[start].1) / span * scale);
        }
    }
    Some(best)
}

fn progress_bar(ctx: &RunContext, spec: &PhaseSpec) -> Option<indicatif::ProgressBar> {
    if !ctx.progress {
        return None;
    }
    let (bar, template) = match (spec.expected, spec.duration) {
        (Some(total), _) => (
            indicatif::ProgressBar::new(total),
            "{prefix:>12} [{bar:30}] {percent:>3}% {elapsed_precise} {msg}",
        ),
        _ => (
            indicatif::ProgressBar::new_spinner(),
            "{prefix:>12} {spinner} {elapsed_precise} {msg}",
        ),
    };
    let style = indicatif::ProgressStyle::with_template(template)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(spec.name.clone());
    bar.set_message(format!("{} threads", spec.threads));
    bar.enable_steady_tick(Duration::from_millis(200));
    Some(bar)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_their_values() {
        for ns in [0u64, 1, 7, 8, 9, 15, 16, 100, 1000, 123_456, 10_000_000_000] {
            let b = bucket_of(ns);
            assert!(bucket_high(b) >= ns, "{ns} in bucket {b} up to {}", bucket_high(b));
            if b > 0 {
                assert!(bucket_high(b - 1) < ns, "{ns} also fits bucket {}", b - 1);
            }
        }
    }

    #[test]
    fn quantiles_are_within_an_eighth() {
        let h = Histogram::default();
        for us in 1..=1000u64 {
            h.record(us * 1000);
        }
        let s = h.summary();
        assert!((s.p50_us - 500.0).abs() <= 500.0 / 8.0 + 1.0, "{s:?}");
        assert!((s.p99_us - 990.0).abs() <= 990.0 / 8.0 + 1.0, "{s:?}");
        assert!((s.mean_us - 500.5).abs() < 0.01, "{s:?}");
        assert_eq!(s.max_us, 1000.0);
    }

    #[test]
    fn the_peak_is_the_best_second() {
        // 1 unit per 100 ms, except 10 units per 100 ms during [1 s, 2 s).
        let mut samples = vec![(0.0, 0.0)];
        let mut total = 0.0;
        for i in 1..=30 {
            let t = i as f64 / 10.0;
            total += if (11..=20).contains(&i) { 10.0 } else { 1.0 };
            samples.push((t, total));
        }
        let peak = peak_rate(&samples, Unit::Ops).unwrap();
        assert!((peak - 100.0).abs() < 1e-6, "{peak}");
        assert_eq!(peak_rate(&samples[..10], Unit::Ops), None);
    }

    #[test]
    fn a_failing_worker_stops_the_phase_with_its_error() {
        let ctx = RunContext::quiet();
        let spec = PhaseSpec {
            name: "t".into(),
            unit: Unit::Ops,
            workers: 3,
            threads: 3,
            duration: None,
            expected: None,
            cache: String::new(),
        };
        let result = run_phase(&ctx, &spec, |worker, meter| {
            if worker == 1 {
                return Err(std::io::Error::other("boom"));
            }
            while !meter.should_stop() {
                meter.other.record(0, Duration::from_micros(1));
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        });
        assert_eq!(result.unwrap_err().to_string(), "boom");
    }
}
