//! The event log: what happened to the node, newest last, in a bounded in-memory ring.
//!
//! Two sources feed it: the management service records every change it makes (volume created,
//! export removed, initiator allowed, ...), and the sampler records state changes it observes
//! in the hardware (a drive failed, a rebuild started or finished, an initiator was refused),
//! whoever caused them. The ring is lost at a restart; the log file keeps the history.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use utoipa::ToSchema;

/// Events kept in memory; older ones are dropped first.
pub const EVENTS_MAX: usize = 1000;

/// How much an event matters to an operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

/// What happened. Stable names: dashboards and alert rules match on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    NodeStarted,
    VolumeCreated,
    VolumeResized,
    VolumeDeleted,
    ExportAdded,
    ExportRemoved,
    InitiatorAllowed,
    InitiatorDenied,
    InitiatorRefused,
    DriveFailed,
    DriveStateChanged,
    TargetStateChanged,
    RebuildStarted,
    RebuildFinished,
    RebuildRateChanged,
    ScrubStarted,
    ScrubFinished,
    ScrubFoundErrors,
    DriveReplaced,
    SpareAdded,
    SnapshotCreated,
    VolumeCloned,
    VolumeRolledBack,
}

#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct Event {
    /// Increases by one per event from 1 at node start; poll with `?since=` the last one seen.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    pub kind: EventKind,
    pub severity: Severity,
    /// What it is about: `volume/vm1`, `export/vm1`, `target/1`, `drive/<uuid>`.
    pub subject: String,
    /// One sentence for the operator.
    pub message: String,
}

/// The ring of recent events. All methods take `&self`.
#[derive(Debug)]
pub struct EventLog {
    inner: Mutex<Ring>,
}

#[derive(Debug)]
struct Ring {
    events: VecDeque<Event>,
    next_seq: u64,
}

pub(crate) fn now_unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog::new()
    }
}

impl EventLog {
    pub fn new() -> EventLog {
        EventLog {
            inner: Mutex::new(Ring { events: VecDeque::with_capacity(EVENTS_MAX), next_seq: 1 }),
        }
    }

    /// Records an event (and logs it); returns its sequence number.
    pub fn record(
        &self,
        kind: EventKind,
        severity: Severity,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> u64 {
        let subject = subject.into();
        let message = message.into();
        match severity {
            Severity::Info => tracing::info!(?kind, %subject, "event: {message}"),
            Severity::Warning => tracing::warn!(?kind, %subject, "event: {message}"),
            Severity::Error => tracing::error!(?kind, %subject, "event: {message}"),
        }
        let mut ring = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let seq = ring.next_seq;
        ring.next_seq += 1;
        if ring.events.len() == EVENTS_MAX {
            ring.events.pop_front();
        }
        ring.events.push_back(Event {
            seq,
            time_unix_ms: now_unix_ms(),
            kind,
            severity,
            subject,
            message,
        });
        seq
    }

    /// Events with a sequence number above `since`, oldest first, at most the newest `limit`.
    pub fn since(&self, since: u64, limit: usize) -> Vec<Event> {
        let ring = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let newer: Vec<&Event> = ring.events.iter().filter(|e| e.seq > since).collect();
        let skip = newer.len().saturating_sub(limit);
        newer.into_iter().skip(skip).cloned().collect()
    }

    /// The sequence number of the newest event (0 before the first).
    pub fn last_seq(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).next_seq - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_events_in_order() {
        let log = EventLog::new();
        for i in 0..EVENTS_MAX + 5 {
            log.record(EventKind::VolumeCreated, Severity::Info, format!("volume/v{i}"), "made");
        }
        assert_eq!(log.last_seq(), (EVENTS_MAX + 5) as u64);
        let all = log.since(0, usize::MAX);
        assert_eq!(all.len(), EVENTS_MAX, "older events are dropped");
        assert_eq!(all[0].seq, 6);
        assert!(all.windows(2).all(|w| w[0].seq + 1 == w[1].seq));
        let tail = log.since(EVENTS_MAX as u64, 3);
        assert_eq!(tail.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1003, 1004, 1005]);
        assert!(log.since(log.last_seq(), 10).is_empty());
    }
}
