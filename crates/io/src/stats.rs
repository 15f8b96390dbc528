//! Per-drive counters: bytes and operations, errors, and a latency histogram.
//!
//! Counters are lock-free atomics so the data path pays a few relaxed adds per request. Lifetime
//! totals (for wear) are kept by the layer that owns the drive's superblock, which adds these
//! session counters to the totals it persisted.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::OpKind;

/// Latency buckets are powers of two of microseconds: bucket `i` counts requests that took
/// `[2^(i-1), 2^i)` us (bucket 0: under 1 us); the last bucket also takes everything slower.
pub const LATENCY_BUCKETS: usize = 28;

#[derive(Debug, Default)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
}

impl LatencyHistogram {
    pub fn record(&self, latency: Duration) {
        let us = latency.as_micros() as u64;
        let bucket = (u64::BITS - us.leading_zeros()) as usize;
        self.buckets[bucket.min(LATENCY_BUCKETS - 1)].fetch_add(1, Relaxed);
    }

    pub fn counts(&self) -> [u64; LATENCY_BUCKETS] {
        std::array::from_fn(|i| self.buckets[i].load(Relaxed))
    }

    /// The upper bound in microseconds of the bucket holding quantile `q` (0..=1), or 0 if empty.
    pub fn quantile_us(counts: &[u64; LATENCY_BUCKETS], q: f64) -> u64 {
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return 1u64 << i;
            }
        }
        1u64 << (LATENCY_BUCKETS - 1)
    }
}

#[derive(Debug, Default)]
pub struct DriveStats {
    pub read_ops: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_ops: AtomicU64,
    pub write_bytes: AtomicU64,
    pub flush_ops: AtomicU64,
    pub discard_ops: AtomicU64,
    pub errors: AtomicU64,
    pub read_latency: LatencyHistogram,
    pub write_latency: LatencyHistogram,
}

/// A copy of the counters at one moment, for status output and JSON.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DriveStatsSnapshot {
    pub read_ops: u64,
    pub read_bytes: u64,
    pub write_ops: u64,
    pub write_bytes: u64,
    pub flush_ops: u64,
    pub discard_ops: u64,
    pub errors: u64,
    pub read_latency: [u64; LATENCY_BUCKETS],
    pub write_latency: [u64; LATENCY_BUCKETS],
}

impl DriveStats {
    /// Records one finished request. `bytes` is what moved (0 for a failed request).
    pub fn record(&self, kind: OpKind, bytes: usize, latency: Duration, ok: bool) {
        if !ok {
            self.errors.fetch_add(1, Relaxed);
            return;
        }
        match kind {
            OpKind::Read => {
                self.read_ops.fetch_add(1, Relaxed);
                self.read_bytes.fetch_add(bytes as u64, Relaxed);
                self.read_latency.record(latency);
            }
            OpKind::Write => {
                self.write_ops.fetch_add(1, Relaxed);
                self.write_bytes.fetch_add(bytes as u64, Relaxed);
                self.write_latency.record(latency);
            }
            OpKind::Flush => {
                self.flush_ops.fetch_add(1, Relaxed);
            }
            OpKind::Discard => {
                self.discard_ops.fetch_add(1, Relaxed);
            }
        }
    }

    pub fn snapshot(&self) -> DriveStatsSnapshot {
        DriveStatsSnapshot {
            read_ops: self.read_ops.load(Relaxed),
            read_bytes: self.read_bytes.load(Relaxed),
            write_ops: self.write_ops.load(Relaxed),
            write_bytes: self.write_bytes.load(Relaxed),
            flush_ops: self.flush_ops.load(Relaxed),
            discard_ops: self.discard_ops.load(Relaxed),
            errors: self.errors.load(Relaxed),
            read_latency: self.read_latency.counts(),
            write_latency: self.write_latency.counts(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_places_latencies_in_power_of_two_buckets() {
        let h = LatencyHistogram::default();
        h.record(Duration::from_nanos(500));
        h.record(Duration::from_micros(3));
        h.record(Duration::from_micros(100));
        h.record(Duration::from_secs(10_000));
        let counts = h.counts();
        assert_eq!(counts[0], 1);
        assert_eq!(counts[2], 1);
        assert_eq!(counts[7], 1);
        assert_eq!(counts[LATENCY_BUCKETS - 1], 1);
        assert_eq!(LatencyHistogram::quantile_us(&counts, 0.5), 4);
    }

    #[test]
    fn failed_requests_count_as_errors_not_bytes() {
        let s = DriveStats::default();
        s.record(OpKind::Write, 4096, Duration::from_micros(5), true);
        s.record(OpKind::Write, 0, Duration::from_micros(5), false);
        let snap = s.snapshot();
        assert_eq!((snap.write_ops, snap.write_bytes, snap.errors), (1, 4096, 1));
    }
}
