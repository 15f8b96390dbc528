//! What an array reports about itself: state, geometry, each drive's counters and wear, and the
//! same picture read from superblocks alone (for `stria raid status` while another process runs
//! the array).

use std::sync::atomic::Ordering::Relaxed;

use serde::Serialize;
use stria_io::LatencyHistogram;

use crate::array::Array;
use crate::superblock::{SlotState, Superblock};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ArrayState {
    Optimal,
    Degraded,
    Rebuilding,
    Failed,
}

#[derive(Clone, Debug, Serialize)]
pub struct RebuildStatus {
    pub slot: usize,
    pub percent: f64,
    /// Whether a rebuild thread is walking the slot now. False when it stopped (see `error`) or
    /// when the picture comes from labels alone.
    pub running: bool,
    /// Why the rebuild stopped before finishing, if it did.
    pub error: Option<String>,
    pub rate_bytes_s: u64,
    pub rate_limit_bytes_s: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemberStatus {
    pub slot: Option<usize>,
    pub device: String,
    pub drive_uuid: String,
    pub state: &'static str,
    pub backend: String,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    pub errors: u64,
    pub lifetime_written_bytes: u64,
    pub rated_endurance_bytes: u64,
    /// Share of rated endurance used, in percent; None when the rating is unknown.
    pub wear_percent: Option<f64>,
    pub read_latency_p99_us: u64,
    pub write_latency_p99_us: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ArrayStatus {
    pub uuid: String,
    pub level: String,
    pub drives: usize,
    pub stripe_unit_bytes: u32,
    pub capacity_bytes: u64,
    pub state: ArrayState,
    pub rebuild: Option<RebuildStatus>,
    pub members: Vec<MemberStatus>,
    pub spares: Vec<MemberStatus>,
    pub checksum_errors: u64,
    pub repaired_blocks: u64,
    /// Partial-stripe updates journaled since assembly (RAID 5/6 only).
    pub journal_records: u64,
    pub unrecoverable_blocks: u64,
    pub parity_kernel: &'static str,
    pub events: u64,
    /// Data-area bytes of each drive one write-intent bit covers.
    pub bitmap_region_bytes: u64,
    /// Write-intent regions marked now: what a crash would resync. None when read from the
    /// labels alone (`stria raid status` then counts those of the on-disk bitmaps).
    pub bitmap_marked_regions: Option<u64>,
    /// Bitmap writes (FUA, to every writable member) since assembly; None from labels alone.
    pub bitmap_writes: Option<u64>,
    pub warnings: Vec<String>,
}

fn wear(written: u64, rated: u64) -> Option<f64> {
    (rated > 0).then(|| written as f64 * 100.0 / rated as f64)
}

impl Array {
    pub fn status(&self) -> ArrayStatus {
        let g = self.geometry();
        let members = self.members();
        let rated = self.inner.rated_endurance_bytes;
        let member_status = members
            .iter()
            .enumerate()
            .map(|(slot, m)| {
                let stats = m.dev.as_ref().map(|d| d.stats().snapshot()).unwrap_or_default();
                let written = m.lifetime_written_base + stats.write_bytes;
                MemberStatus {
                    slot: Some(slot),
                    device: m
                        .dev
                        .as_ref()
                        .map(|d| d.name().to_string())
                        .unwrap_or_else(|| "-".into()),
                    drive_uuid: m.drive_uuid.to_string(),
                    state: m.state.name(),
                    backend: m.dev.as_ref().map(|d| d.backend().to_string()).unwrap_or_default(),
                    read_bytes: stats.read_bytes,
                    written_bytes: stats.write_bytes,
                    read_ops: stats.read_ops,
                    write_ops: stats.write_ops,
                    errors: m.lifetime_errors_base + stats.errors,
                    lifetime_written_bytes: written,
                    rated_endurance_bytes: rated,
                    wear_percent: wear(written, rated),
                    read_latency_p99_us: LatencyHistogram::quantile_us(&stats.read_latency, 0.99),
                    write_latency_p99_us: LatencyHistogram::quantile_us(&stats.write_latency, 0.99),
                }
            })
            .collect::<Vec<_>>();
        let spares = self
            .inner
            .spares
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|s| MemberStatus {
                slot: None,
                device: s.dev.name().to_string(),
                drive_uuid: s.drive_uuid.to_string(),
                state: "spare",
                backend: s.dev.backend().to_string(),
                read_bytes: 0,
                written_bytes: 0,
                read_ops: 0,
                write_ops: 0,
                errors: 0,
                lifetime_written_bytes: 0,
                rated_endurance_bytes: rated,
                wear_percent: wear(0, rated),
                read_latency_p99_us: 0,
                write_latency_p99_us: 0,
            })
            .collect();
        let rebuilding = members.iter().position(|m| m.state == SlotState::Rebuilding);
        let rebuild = rebuilding.map(|slot| {
            let progress = self.inner.rebuild.progress(slot);
            let percent = progress
                .as_ref()
                .map(|p| {
                    let total = p.stripes_total.load(Relaxed).max(1);
                    p.stripes_done.load(Relaxed) as f64 * 100.0 / total as f64
                })
                .unwrap_or(0.0);
            let running = progress.as_ref().is_some_and(|p| !p.finished.load(Relaxed));
            let error = progress
                .as_ref()
                .and_then(|p| p.error.lock().unwrap_or_else(|e| e.into_inner()).clone());
            RebuildStatus {
                slot,
                percent,
                running,
                error,
                rate_bytes_s: progress.map(|p| p.rate_bytes_s()).unwrap_or(0),
                rate_limit_bytes_s: self.inner.rebuild.rate_limit(),
            }
        });
        let state = if self.check_alive().is_err() {
            ArrayState::Failed
        } else if rebuild.is_some() {
            ArrayState::Rebuilding
        } else if members.iter().all(|m| m.state == SlotState::Active) {
            ArrayState::Optimal
        } else {
            ArrayState::Degraded
        };
        let c = &self.inner.counters;
        ArrayStatus {
            uuid: self.uuid().to_string(),
            level: g.level.to_string(),
            drives: g.drives,
            stripe_unit_bytes: g.stripe_unit_bytes,
            capacity_bytes: g.capacity_bytes(),
            state,
            rebuild,
            members: member_status,
            spares,
            checksum_errors: c.checksum_errors.load(Relaxed),
            repaired_blocks: c.repaired_blocks.load(Relaxed),
            journal_records: c.journal_records.load(Relaxed),
            unrecoverable_blocks: c.unrecoverable_blocks.load(Relaxed),
            parity_kernel: self.kernel().name(),
            events: self.inner.events.load(Relaxed),
            bitmap_region_bytes: self.inner.layout.bitmap_region_bytes,
            bitmap_marked_regions: Some(self.inner.bitmap.dirty_regions().len() as u64),
            bitmap_writes: Some(c.bitmap_writes.load(Relaxed)),
            warnings: self.warnings(),
        }
    }

    /// Blocks until every running rebuild has finished; the first rebuild error is returned.
    pub fn wait_rebuild(&self) -> Result<(), crate::RaidError> {
        crate::rebuild::wait_idle(self)
    }

    /// (done, total, bytes/s) of the running rebuild, if one is running; a rebuild that stopped
    /// on an error reports nothing here (its reason is in `status().rebuild`).
    pub fn rebuild_progress(&self) -> Option<(u64, u64, u64)> {
        let members = self.members();
        let p = members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.state == SlotState::Rebuilding)
            .filter_map(|(slot, _)| self.inner.rebuild.progress(slot))
            .find(|p| !p.finished.load(Relaxed))?;
        Some((p.stripes_done.load(Relaxed), p.stripes_total.load(Relaxed), p.rate_bytes_s()))
    }
}

/// The array's state as its drives' superblocks record it, without assembling it (no locks
/// taken, nothing written). `labels` pairs each drive's name with its decoded superblock.
pub fn inspect(labels: &[(String, Superblock)]) -> Option<ArrayStatus> {
    let auth = labels.iter().map(|(_, sb)| sb).max_by_key(|sb| sb.events)?;
    let drives = auth.drives as usize;
    let geometry =
        crate::Geometry::new(auth.level, drives, auth.stripe_unit_bytes, auth.layout.data_bytes)
            .ok()?;
    let find = |uuid| {
        labels.iter().find(|(_, sb)| sb.drive_uuid == uuid && sb.array_uuid == auth.array_uuid)
    };
    let describe = |slot: Option<usize>, entry: &crate::superblock::SlotEntry| {
        let found = find(entry.drive_uuid);
        let written = found.map(|(_, sb)| sb.lifetime_bytes_written).unwrap_or(0);
        MemberStatus {
            slot,
            device: found.map(|(n, _)| n.clone()).unwrap_or_else(|| "-".into()),
            drive_uuid: entry.drive_uuid.to_string(),
            state: if found.is_none() && entry.state == SlotState::Active {
                "missing"
            } else {
                entry.state.name()
            },
            backend: String::new(),
            read_bytes: 0,
            written_bytes: 0,
            read_ops: 0,
            write_ops: 0,
            errors: found.map(|(_, sb)| sb.lifetime_errors).unwrap_or(0),
            lifetime_written_bytes: written,
            rated_endurance_bytes: auth.rated_endurance_bytes,
            wear_percent: wear(written, auth.rated_endurance_bytes),
            read_latency_p99_us: 0,
            write_latency_p99_us: 0,
        }
    };
    let members: Vec<MemberStatus> =
        auth.slots.iter().take(drives).enumerate().map(|(i, e)| describe(Some(i), e)).collect();
    let spares = auth
        .slots
        .iter()
        .skip(drives)
        .filter(|e| e.state == SlotState::Spare)
        .map(|e| describe(None, e))
        .collect();
    let out = members.iter().filter(|m| m.state != "active" && m.state != "rebuilding").count();
    let rebuilding = auth.slots.iter().take(drives).position(|e| e.state == SlotState::Rebuilding);
    let tolerated = match auth.level {
        crate::Level::Raid10 => {
            let pair_lost = (0..drives / 2)
                .any(|p| members[2 * p].state != "active" && members[2 * p + 1].state != "active");
            if pair_lost { 0 } else { drives / 2 }
        }
        _ => geometry.tolerated_failures(),
    };
    let state = if out + rebuilding.is_some() as usize > tolerated {
        ArrayState::Failed
    } else if rebuilding.is_some() {
        ArrayState::Rebuilding
    } else if out > 0 {
        ArrayState::Degraded
    } else {
        ArrayState::Optimal
    };
    let rebuild = rebuilding.map(|slot| RebuildStatus {
        slot,
        running: false,
        error: None,
        percent: auth.slots[slot].rebuild_cursor as f64 * 100.0 / geometry.stripes().max(1) as f64,
        rate_bytes_s: auth.rebuild_rate_bytes_s,
        rate_limit_bytes_s: 0,
    });
    Some(ArrayStatus {
        uuid: auth.array_uuid.to_string(),
        level: auth.level.to_string(),
        drives,
        stripe_unit_bytes: auth.stripe_unit_bytes,
        capacity_bytes: geometry.capacity_bytes(),
        state,
        rebuild,
        members,
        spares,
        checksum_errors: 0,
        repaired_blocks: 0,
        journal_records: 0,
        unrecoverable_blocks: 0,
        parity_kernel: stria_parity::Kernel::best().name(),
        events: auth.events,
        bitmap_region_bytes: auth.layout.bitmap_region_bytes,
        bitmap_marked_regions: None,
        bitmap_writes: None,
        warnings: labels
            .iter()
            .filter(|(_, sb)| sb.array_uuid != auth.array_uuid)
            .map(|(n, sb)| format!("{n} belongs to another array ({})", sb.array_uuid))
            .collect(),
    })
}
