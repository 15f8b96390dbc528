//! Flush and membership: checkpoints, labels, failing, replacing and adding drives.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use stria_io::{AlignedBuf, BlockDevice, IoOp};
use stria_proto::{ARRAY_SPARES_MAX, Uuid};

use crate::RaidError;
use crate::array::{Array, BLOCK, Member, Spare, random_u64, wait_all};
use crate::checksum::CrcTable;
use crate::geometry::Level;
use crate::superblock::{LEFT_OUT_OF_SYNC, SUPERBLOCK_BYTES, SlotEntry, SlotState, Superblock};

/// Which write-intent bits a flush of the optimal array clears.
#[derive(Clone, Copy)]
enum BitmapClear {
    /// Those of regions not written since the flush before.
    Idle,
    /// All of them.
    All,
}

impl Array {
    // ----------------------------------------------------------------------------------------
    // Flush and membership
    // ----------------------------------------------------------------------------------------

    /// Makes every write that returned before this call durable: checksum tables, then a flush
    /// of every drive, then a journal checkpoint. When the array is optimal, the write-intent
    /// bits of regions not written since the flush before are cleared (a region still being
    /// written keeps its bit, so its next write costs no bitmap write).
    pub fn flush(&self) -> Result<(), RaidError> {
        let _barrier = self.inner.barrier.write().unwrap_or_else(|e| e.into_inner());
        self.flush_locked(BitmapClear::Idle)
    }

    /// Whether a flush now would clear write-intent bits: the array is optimal and some region
    /// marked in the bitmap was not written since the last flush. A periodic flusher that
    /// found nothing else to do flushes then, so the bits a burst of writes left go one
    /// interval after it (md clears idle bits on a timer too).
    pub fn write_intent_idle(&self) -> bool {
        self.inner.bitmap.any_idle() && self.members().iter().all(|m| m.state == SlotState::Active)
    }

    /// As [`Array::flush`], clearing every write-intent bit when optimal (a clean stop).
    pub(crate) fn flush_clearing_bitmap(&self) -> Result<(), RaidError> {
        let _barrier = self.inner.barrier.write().unwrap_or_else(|e| e.into_inner());
        self.flush_locked(BitmapClear::All)
    }

    fn flush_locked(&self, clear: BitmapClear) -> Result<(), RaidError> {
        self.persist_tables_and_flush()?;
        let journal_used = self.inner.rings.iter().any(|r| r.used() > 0);
        if journal_used {
            self.inner.journal_epoch.store(random_u64(), Relaxed);
            self.inner.journal_seq.store(1, Relaxed);
            self.write_superblocks(false)?;
            for ring in &self.inner.rings {
                ring.reset();
            }
            self.inner.journaled_stripes.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
        let members = self.members();
        let optimal = members.iter().all(|m| m.state == SlotState::Active);
        if optimal && self.inner.bitmap.any_set() {
            let bitmap = &self.inner.bitmap;
            let _guard = bitmap.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
            let cleared = match clear {
                BitmapClear::Idle => bitmap.clear_idle(),
                BitmapClear::All => bitmap.clear_all(),
            };
            if cleared {
                self.persist_bitmap()?;
            }
        }
        Ok(())
    }

    /// Writes the changed checksum-table pages of every writable member, then flushes every
    /// writable member: afterwards every completed write and its checksum are durable. The
    /// caller holds the barrier exclusively, or is alone with the array (assembly).
    pub(crate) fn persist_tables_and_flush(&self) -> Result<(), RaidError> {
        let members = self.members();
        let layout = self.inner.layout;
        let mut failures = Vec::new();
        for (d, m) in members.iter().enumerate().filter(|(_, m)| m.writable()) {
            if let (Some(dev), Some(crc)) = (m.dev.as_ref(), m.crc.as_ref())
                && let Err(e) = crc.persist(dev.as_ref(), &layout)
            {
                failures.push((d, e));
            }
        }
        self.handle_write_failures(&members, failures)?;
        self.flush_devices()
    }

    pub(crate) fn flush_devices(&self) -> Result<(), RaidError> {
        let members = self.members();
        let tickets = members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.writable())
            .filter_map(|(d, m)| Some((d, m.dev.as_ref()?.submit(IoOp::Flush))))
            .collect();
        let failures = wait_all(tickets);
        self.handle_write_failures(&members, failures)
    }

    pub(crate) fn superblock_for(
        &self,
        members: &[Member],
        slot: usize,
        clean: bool,
    ) -> Option<Superblock> {
        let m = &members[slot];
        let dev = m.dev.as_ref()?;
        let stats = dev.stats().snapshot();
        let spares = self.inner.spares.lock().unwrap_or_else(|e| e.into_inner());
        let mut slots: Vec<SlotEntry> = members
            .iter()
            .map(|m| SlotEntry {
                drive_uuid: m.drive_uuid,
                state: m.state,
                events_left: m.events_left,
                rebuild_cursor: if m.state == SlotState::Rebuilding {
                    m.cursor.load(Relaxed)
                } else {
                    0
                },
            })
            .collect();
        slots.extend(spares.iter().take(ARRAY_SPARES_MAX).map(|s| SlotEntry {
            drive_uuid: s.drive_uuid,
            state: SlotState::Spare,
            events_left: 0,
            rebuild_cursor: 0,
        }));
        let g = self.inner.geometry;
        Some(Superblock {
            array_uuid: self.inner.uuid,
            drive_uuid: m.drive_uuid,
            slot: slot as u16,
            level: g.level,
            drives: g.drives as u16,
            stripe_unit_bytes: g.stripe_unit_bytes,
            clean,
            events: self.inner.events.load(Relaxed),
            created_unix_s: self.inner.created_unix_s,
            layout: self.inner.layout,
            rated_endurance_bytes: self.inner.rated_endurance_bytes,
            lifetime_bytes_written: m.lifetime_written_base + stats.write_bytes,
            lifetime_bytes_read: m.lifetime_read_base + stats.read_bytes,
            journal_epoch: self.inner.journal_epoch.load(Relaxed),
            lifetime_errors: m.lifetime_errors_base + stats.errors,
            rebuild_rate_bytes_s: self.inner.rebuild.rate_measured(),
            slots,
        })
    }

    /// Writes the current superblock to every writable member and every spare, with FUA.
    pub(crate) fn write_superblocks(&self, clean: bool) -> Result<(), RaidError> {
        let _guard = self.inner.superblock_lock.lock().unwrap_or_else(|e| e.into_inner());
        let members = self.members();
        let mut tickets = Vec::new();
        for (slot, m) in members.iter().enumerate().filter(|(_, m)| m.writable()) {
            if let Some(sb) = self.superblock_for(&members, slot, clean) {
                let dev = m.dev.as_ref().expect("checked");
                tickets.push((
                    slot,
                    dev.submit(IoOp::Write {
                        offset: 0,
                        data: AlignedBuf::from_slice(&sb.encode()),
                        fua: true,
                    }),
                ));
            }
        }
        let spare_labels: Vec<(Arc<dyn BlockDevice>, Superblock)> = {
            let template = members
                .iter()
                .position(|m| m.writable())
                .and_then(|s| self.superblock_for(&members, s, clean));
            let spares = self.inner.spares.lock().unwrap_or_else(|e| e.into_inner());
            spares
                .iter()
                .filter_map(|s| {
                    let mut sb = template.clone()?;
                    sb.drive_uuid = s.drive_uuid;
                    sb.slot = u16::MAX;
                    Some((s.dev.clone(), sb))
                })
                .collect()
        };
        let failures = wait_all(tickets);
        for (dev, sb) in spare_labels {
            if let Err(e) = dev
                .submit(IoOp::Write {
                    offset: 0,
                    data: AlignedBuf::from_slice(&sb.encode()),
                    fua: true,
                })
                .wait()
            {
                tracing::warn!("spare {}: label write failed: {e}", dev.name());
            }
        }
        drop(_guard);
        self.handle_write_failures(&members, failures)
    }

    /// Takes a member out of service (operator request or I/O failure): the remaining drives
    /// record it as failed, and a hot spare, if any, starts rebuilding in its place.
    pub fn fail_drive(&self, slot: usize) -> Result<(), RaidError> {
        if slot >= self.inner.geometry.drives {
            return Err(RaidError::InvalidConfig(format!(
                "slot {slot} does not exist; the array has slots 0..{}",
                self.inner.geometry.drives - 1
            )));
        }
        if !self.members()[slot].writable() {
            return Err(RaidError::Refused(format!("slot {slot} is already out of service")));
        }
        {
            // Exclusive: no write may leave the drive out, and no flush vouch for such a
            // write, before the labels that record the failure are on the other drives. (A
            // drive failed by an I/O error is taken out inside the failing request, which
            // holds the barrier shared, so flushes wait for those labels anyway.)
            let _barrier = self.inner.barrier.write().unwrap_or_else(|e| e.into_inner());
            self.take_out(slot, None, "failed by the operator", true)?;
        }
        self.check_alive()
    }

    /// Takes `dev`, the member in `slot`, out after an I/O failure (logged as an error); nothing
    /// happens if `dev` already left the slot. A failure is charged to the drive that failed,
    /// not to its slot: a late report must not fail the spare that took its place.
    pub(crate) fn fail_member(
        &self,
        slot: usize,
        dev: &Arc<dyn BlockDevice>,
        reason: &str,
    ) -> Result<(), RaidError> {
        self.take_out(slot, Some(dev), reason, false)
    }

    /// Takes `slot`'s drive out of service; with `only`, only if that device is still there.
    fn take_out(
        &self,
        slot: usize,
        only: Option<&Arc<dyn BlockDevice>>,
        reason: &str,
        by_operator: bool,
    ) -> Result<(), RaidError> {
        {
            let mut members = self.members_mut();
            if by_operator {
                // Checked under the membership lock, before anything is recorded: an operator
                // may not take out a drive the array still needs. (A drive that really fails is
                // taken out whatever this says.)
                let mut after = (*members).clone();
                after[slot].state = SlotState::Failed;
                if !self.can_serve(&after) {
                    let g = self.inner.geometry;
                    return Err(RaidError::Refused(format!(
                        "failing slot {slot} would leave the {} array without a complete copy of \
                         the data ({} of {} drives out or rebuilding; it tolerates {}); refused",
                        g.level,
                        Self::failed_count(&after),
                        g.drives,
                        g.tolerated_failures()
                    )));
                }
            }
            let m = &mut members[slot];
            let elsewhere = only.is_some_and(|dev| !m.holds(dev));
            if !m.writable() || elsewhere {
                return Ok(());
            }
            let drive = m.dev.as_ref().map(|d| d.name()).unwrap_or("?");
            if by_operator {
                tracing::warn!(slot, drive, "drive taken out of service: {reason}");
            } else {
                tracing::error!(slot, drive, "drive failed: {reason}");
            }
            m.events_left = match m.state {
                SlotState::Active => self.inner.events.load(Relaxed),
                _ => LEFT_OUT_OF_SYNC,
            };
            m.state = SlotState::Failed;
            self.inner.events.fetch_add(1, Relaxed);
        }
        self.inner.rebuild.stop_slot(slot);
        self.write_superblocks(false)?;
        if self.inner.geometry.level != Level::Raid0 {
            let spare = self.inner.spares.lock().unwrap_or_else(|e| e.into_inner()).pop();
            if let Some(spare) = spare {
                tracing::info!(
                    slot,
                    spare = spare.dev.name(),
                    "hot spare takes the failed drive's place"
                );
                self.install(slot, spare.dev, spare.drive_uuid, false)?;
            }
        }
        Ok(())
    }

    /// The drive attached to `slot`, if any. A failed drive stays attached (and open) until
    /// the slot is replaced, so re-adding it means handing this device back to [`Array::replace`].
    pub fn member_device(&self, slot: usize) -> Option<Arc<dyn BlockDevice>> {
        self.members().get(slot)?.dev.clone()
    }

    /// Puts `dev` into `slot` as a rebuilding member and starts the rebuild. If `dev` is the
    /// slot's own drive returning unchanged since it left, only the bitmap's regions are resynced.
    pub fn replace(&self, slot: usize, dev: Arc<dyn BlockDevice>) -> Result<(), RaidError> {
        let g = self.inner.geometry;
        if slot >= g.drives {
            return Err(RaidError::InvalidConfig(format!(
                "slot {slot} does not exist; the array has slots 0..{}",
                g.drives - 1
            )));
        }
        if g.level == Level::Raid0 {
            return Err(RaidError::Refused(
                "raid0 has no redundancy: a failed member's data is lost and cannot be rebuilt"
                    .into(),
            ));
        }
        let members = self.members();
        if members[slot].writable() {
            return Err(RaidError::Refused(format!(
                "slot {slot} is in service; fail it first with `stria raid fail`"
            )));
        }
        self.check_new_drive_capacity(dev.as_ref())?;
        if members
            .iter()
            .enumerate()
            .any(|(i, m)| i != slot && m.dev.as_ref().is_some_and(|d| d.name() == dev.name()))
        {
            return Err(RaidError::Refused(format!(
                "{} is already a member of this array",
                dev.name()
            )));
        }
        // Is this the slot's own drive coming back?
        let label =
            dev.read_at(0, SUPERBLOCK_BYTES).ok().and_then(|raw| Superblock::decode(&raw).ok());
        if let Some(sb) = &label
            && sb.array_uuid == self.inner.uuid
            && sb.drive_uuid == members[slot].drive_uuid
            && sb.events == members[slot].events_left
        {
            return self.install(slot, dev, sb.drive_uuid, true);
        }
        self.install(slot, dev, Uuid::random(), false)
    }

    /// Puts `dev` into `slot` as a rebuilding member and starts its rebuild: of the bitmap's
    /// regions only for the slot's own drive `returning`, else of everything.
    ///
    /// May run inside a write that holds the bitmap's `persist_lock` (a failed bitmap write
    /// that brings in a hot spare), so it does not take that lock.
    pub(crate) fn install(
        &self,
        slot: usize,
        dev: Arc<dyn BlockDevice>,
        drive_uuid: Uuid,
        returning: bool,
    ) -> Result<(), RaidError> {
        let layout = self.inner.layout;
        let crc = if returning {
            CrcTable::load(dev.as_ref(), &layout)?
        } else {
            CrcTable::zeroed(layout.data_bytes / BLOCK)
        };
        {
            let mut members = self.members_mut();
            let m = &mut members[slot];
            m.dev = Some(dev);
            m.drive_uuid = drive_uuid;
            m.state = SlotState::Rebuilding;
            m.crc = Some(Arc::new(crc));
            m.cursor = Arc::new(AtomicU64::new(0));
            m.lifetime_errors_base = 0;
            m.lifetime_read_base = 0;
            m.lifetime_written_base = 0;
            self.inner.events.fetch_add(1, Relaxed);
        }
        // Read only now that writes see the newcomer: a write that left it out marked its
        // regions before it looked at the members, so those bits are set by now. (No bit is
        // cleared while a member is out of sync.)
        let regions = returning.then(|| self.inner.bitmap.dirty_regions());
        if let Some(regions) = &regions {
            tracing::info!(
                slot,
                regions = regions.len(),
                "drive returned: resyncing only regions written meanwhile"
            );
        }
        self.write_superblocks(false)?;
        // The newcomer carries the current write-intent bits from the start. Only it is
        // written: any bit set after this image was taken is persisted by the write that set
        // it, to every member including the newcomer.
        self.persist_bitmap_to(slot)?;
        crate::rebuild::start(self, slot, regions);
        Ok(())
    }

    /// Refuses a replacement or spare too small for the array's layout.
    fn check_new_drive_capacity(&self, dev: &dyn BlockDevice) -> Result<(), RaidError> {
        let needed = self.inner.layout.min_capacity();
        if dev.capacity_bytes() < needed {
            return Err(RaidError::Refused(format!(
                "{} holds {} bytes; the array needs at least {needed} per drive",
                dev.name(),
                dev.capacity_bytes()
            )));
        }
        Ok(())
    }

    /// Labels `dev` as a hot spare of this array.
    pub fn add_spare(&self, dev: Arc<dyn BlockDevice>) -> Result<(), RaidError> {
        self.check_new_drive_capacity(dev.as_ref())?;
        let members = self.members();
        {
            let mut spares = self.inner.spares.lock().unwrap_or_else(|e| e.into_inner());
            if spares.len() >= ARRAY_SPARES_MAX {
                return Err(RaidError::Refused(format!(
                    "the array already has {ARRAY_SPARES_MAX} spares, the most it records"
                )));
            }
            let name = dev.name().to_string();
            if spares.iter().any(|s| s.dev.name() == name)
                || members.iter().any(|m| m.dev.as_ref().is_some_and(|d| d.name() == name))
            {
                return Err(RaidError::Refused(format!("{name} is already part of this array")));
            }
            spares.push(Spare { dev, drive_uuid: Uuid::random() });
        }
        self.inner.events.fetch_add(1, Relaxed);
        self.write_superblocks(false)?;
        // A spare arriving while a slot is out starts rebuilding at once.
        if let Some(slot) = members.iter().position(|m| !m.writable())
            && self.inner.geometry.level != Level::Raid0
        {
            let spare = self.inner.spares.lock().unwrap_or_else(|e| e.into_inner()).pop();
            if let Some(spare) = spare {
                self.install(slot, spare.dev, spare.drive_uuid, false)?;
            }
        }
        Ok(())
    }
}
