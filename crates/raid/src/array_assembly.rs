//! Assembly: an array put back together from its drives' superblocks alone.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use stria_io::BlockDevice;
use stria_proto::Uuid;

use crate::RaidError;
use crate::array::{Array, BLOCK, Member, Spare};
use crate::checksum::CrcTable;
use crate::geometry::Geometry;
use crate::superblock::{LEFT_OUT_OF_SYNC, SUPERBLOCK_BYTES, SlotState, Superblock};

impl Array {
    /// Reassembles an array from its drives' superblocks: refuses foreign and duplicated drives,
    /// leaves stale ones out (with a warning), re-adds a drive that returns after a short absence
    /// (resyncing only the regions marked in the bitmap), replays the journal and resyncs after
    /// an unclean stop, and resumes an interrupted rebuild.
    pub fn assemble(devs: Vec<Arc<dyn BlockDevice>>) -> Result<Array, RaidError> {
        if devs.is_empty() {
            return Err(RaidError::InvalidConfig("no drives given".into()));
        }
        // A drive whose label cannot be read or decoded is left out (its slot then counts as
        // missing); assembly fails only if nothing readable is left or redundancy falls short.
        let mut labelled = Vec::new();
        let mut unlabelled = Vec::new();
        let mut first_error = None;
        for dev in devs {
            let sb = match dev.read_at(0, SUPERBLOCK_BYTES) {
                Ok(raw) => Superblock::decode(&raw).map_err(|source| RaidError::Superblock {
                    device: dev.name().to_string(),
                    source,
                }),
                Err(e) => Err(RaidError::Io(e)),
            };
            match sb {
                Ok(sb) => labelled.push((dev, sb)),
                Err(e) => {
                    unlabelled.push(format!("{e}; the drive was left out"));
                    first_error.get_or_insert(e);
                }
            }
        }
        if labelled.is_empty() {
            return Err(first_error.expect("at least one drive was given"));
        }
        // The array is the one most of the drives belong to; any other uuid is foreign.
        let mut votes: Vec<(Uuid, usize)> = Vec::new();
        for (_, sb) in &labelled {
            match votes.iter_mut().find(|(u, _)| *u == sb.array_uuid) {
                Some((_, n)) => *n += 1,
                None => votes.push((sb.array_uuid, 1)),
            }
        }
        votes.sort_by(|a, b| b.1.cmp(&a.1));
        let expected = votes[0].0;
        if let Some((dev, sb)) = labelled.iter().find(|(_, sb)| sb.array_uuid != expected) {
            return Err(RaidError::Foreign {
                device: dev.name().to_string(),
                expected,
                found: sb.array_uuid,
            });
        }
        for (i, (a, sa)) in labelled.iter().enumerate() {
            if let Some((b, _)) =
                labelled[i + 1..].iter().find(|(_, sb)| sb.drive_uuid == sa.drive_uuid)
            {
                return Err(RaidError::Duplicate {
                    first: a.name().to_string(),
                    second: b.name().to_string(),
                    uuid: sa.drive_uuid,
                });
            }
        }
        let auth = labelled
            .iter()
            .map(|(_, sb)| sb)
            .max_by_key(|sb| sb.events)
            .cloned()
            .expect("non-empty");
        let drives = auth.drives as usize;
        let geometry =
            Geometry::new(auth.level, drives, auth.stripe_unit_bytes, auth.layout.data_bytes)?;
        let layout = auth.layout;
        let blocks = layout.data_bytes / BLOCK;
        let mut warnings = unlabelled;
        let mut members = Vec::with_capacity(drives);
        let mut readds = Vec::new();
        let mut used = vec![false; labelled.len()];
        let mut newly_missing = false;
        for (slot, entry) in auth.slots.iter().take(drives).enumerate() {
            let found = labelled.iter().position(|(_, sb)| sb.drive_uuid == entry.drive_uuid);
            let Some(index) = found else {
                let mut m = Member::empty(match entry.state {
                    SlotState::Failed => SlotState::Failed,
                    _ => SlotState::Missing,
                });
                m.drive_uuid = entry.drive_uuid;
                m.events_left = match entry.state {
                    SlotState::Active => {
                        newly_missing = true;
                        auth.events
                    }
                    // Valid only below its rebuild cursor: it comes back only through a full
                    // rebuild.
                    SlotState::Rebuilding => {
                        newly_missing = true;
                        LEFT_OUT_OF_SYNC
                    }
                    _ => entry.events_left,
                };
                if entry.state != SlotState::Failed {
                    warnings.push(format!("slot {slot}: drive {} is missing", entry.drive_uuid));
                }
                members.push(m);
                continue;
            };
            used[index] = true;
            let (dev, sb) = &labelled[index];
            if dev.capacity_bytes() < layout.min_capacity() {
                return Err(RaidError::Refused(format!(
                    "{} is smaller ({} bytes) than the array's layout needs ({} bytes)",
                    dev.name(),
                    dev.capacity_bytes(),
                    layout.min_capacity()
                )));
            }
            // A drive that answers its label but cannot read its checksum table is failing: it
            // is left out (as a drive failing in service would be) rather than refusing the
            // whole array; whether the rest can serve is checked below.
            let unreadable = |e: stria_io::IoError, warnings: &mut Vec<String>| {
                warnings.push(format!(
                    "slot {slot}: {} cannot be read ({e}) and was failed; replace it with \
                     `stria raid replace`",
                    dev.name()
                ));
                let mut m = Member::empty(SlotState::Failed);
                m.drive_uuid = entry.drive_uuid;
                m.events_left = LEFT_OUT_OF_SYNC;
                m
            };
            match entry.state {
                SlotState::Active | SlotState::Rebuilding => {
                    match CrcTable::load(dev.as_ref(), &layout) {
                        Ok(crc) => {
                            let m = Member::with_device(dev.clone(), sb, entry.state, crc);
                            m.cursor.store(entry.rebuild_cursor, Relaxed);
                            members.push(m);
                        }
                        Err(e) => {
                            newly_missing = true;
                            members.push(unreadable(e, &mut warnings));
                        }
                    }
                }
                SlotState::Failed => {
                    // A failed drive may be sick: only an operator brings it back (`replace`).
                    warnings.push(format!(
                        "slot {slot}: {} was failed and stays out; use `stria raid replace` to \
                         re-add it",
                        dev.name()
                    ));
                    let mut m = Member::empty(SlotState::Failed);
                    m.drive_uuid = entry.drive_uuid;
                    m.events_left = entry.events_left;
                    members.push(m);
                }
                SlotState::Missing if sb.events == entry.events_left => {
                    // The drive left at this event and nothing was written to it since: it
                    // only lacks what the bitmap marks. Re-add it with a partial resync.
                    let crc = match CrcTable::load(dev.as_ref(), &layout) {
                        Ok(crc) => crc,
                        Err(e) => {
                            members.push(unreadable(e, &mut warnings));
                            continue;
                        }
                    };
                    let m = Member::with_device(dev.clone(), sb, SlotState::Rebuilding, crc);
                    warnings.push(format!(
                        "slot {slot}: {} returned; resyncing the regions written while it was away",
                        dev.name()
                    ));
                    readds.push(slot);
                    members.push(m);
                }
                _ => {
                    warnings.push(format!(
                        "slot {slot}: {} is stale (its label is at event {}, the array at {}) and was left out; \
                         use `stria raid replace` to rebuild onto it",
                        dev.name(),
                        sb.events,
                        auth.events
                    ));
                    let mut m = Member::empty(entry.state);
                    m.drive_uuid = entry.drive_uuid;
                    m.events_left = entry.events_left;
                    members.push(m);
                }
            }
        }
        let mut spares = Vec::new();
        for entry in auth.slots.iter().skip(drives).filter(|e| e.state == SlotState::Spare) {
            if let Some(index) =
                labelled.iter().position(|(_, sb)| sb.drive_uuid == entry.drive_uuid)
            {
                used[index] = true;
                spares.push(Spare { dev: labelled[index].0.clone(), drive_uuid: entry.drive_uuid });
            }
        }
        for (index, (dev, _)) in labelled.iter().enumerate() {
            if !used[index] {
                warnings.push(format!(
                    "{} carries this array's label but is no longer one of its drives; it was left out",
                    dev.name()
                ));
            }
        }
        let _ = blocks;
        let array = Array::from_parts(
            auth.array_uuid,
            geometry,
            layout,
            auth.created_unix_s,
            auth.rated_endurance_bytes,
            members,
            spares,
            auth.events,
            auth.journal_epoch,
        );
        if newly_missing {
            // Membership changed: the labels written below must outrank the missing drive's own,
            // so it is recognised as stale (and resynced) when it comes back.
            array.inner.events.fetch_add(1, Relaxed);
        }
        array.inner.warnings.lock().unwrap_or_else(|e| e.into_inner()).extend(warnings);
        for w in array.warnings() {
            tracing::warn!(array = %array.inner.uuid, "{w}");
        }
        array.check_alive()?;
        // The bitmap is the union of every in-sync member's copy: a member that joined after a
        // bit was set may not carry it, and a lost bit would skip a needed resync.
        let mut union = vec![0u8; layout.bitmap_bytes as usize];
        for m in array.members().into_iter().filter(|m| m.state == SlotState::Active) {
            if let Some(dev) = m.dev {
                let raw = dev.read_at(layout.bitmap_offset, layout.bitmap_bytes as usize)?;
                union.iter_mut().zip(raw.iter()).for_each(|(u, r)| *u |= r);
            }
        }
        array.inner.bitmap.load(&union);
        if !auth.clean {
            crate::rebuild::recover_unclean(&array)?;
        }
        // From here on the array is open: a crash must be detected at the next assembly.
        array.write_superblocks(false)?;
        let members = array.members();
        for (slot, m) in members.iter().enumerate() {
            if m.state == SlotState::Rebuilding {
                let regions = readds.contains(&slot).then(|| array.inner.bitmap.dirty_regions());
                crate::rebuild::start(&array, slot, regions);
            }
        }
        Ok(array)
    }
}
