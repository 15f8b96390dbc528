//! The array: assembly from superblocks, the read and write paths, flush and membership changes.
//!
//! Locking, outermost first: `barrier` (shared by every data-path operation, exclusive for a
//! flush/checkpoint), then the stripe locks of the stripes an operation touches (taken in
//! ascending index order; shared for reads, exclusive for writes, rebuild and scrub), then
//! `membership` for short snapshots only. No lock is held while waiting for another lock
//! of an earlier rank, so there is no deadlock.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use stria_io::{AlignedBuf, BlockDevice, IoError, IoOp, IoTicket};
use stria_parity::Kernel;
use stria_proto::{ARRAY_SPARES_MAX, BLOCK_BYTES, Uuid};

use crate::RaidError;
use crate::bitmap::WriteIntent;
use crate::checksum::{CrcTable, crc_block};
use crate::geometry::{Geometry, Level, Piece};
use crate::journal::{self, Entry, Ring};
use crate::rebuild::RebuildControl;
use crate::superblock::{Layout, SUPERBLOCK_BYTES, SlotEntry, SlotState, Superblock};

const BLOCK: u64 = BLOCK_BYTES as u64;
/// Hashed stripe locks; a power of two well above any useful queue depth.
const STRIPE_LOCKS: usize = 4096;
/// Journal ring per drive for parity levels, unless the drive is small.
const JOURNAL_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Default rebuild and resync rate limit, per rebuilding drive.
pub const REBUILD_RATE_BYTES_S_DEFAULT: u64 = 200 * 1024 * 1024;

/// The shape of a new array.
#[derive(Clone, Debug)]
pub struct ArrayConfig {
    pub level: Level,
    pub stripe_unit_bytes: u32,
    /// Rated endurance per drive, in terabytes written (the vendor's TBW figure); 0 = unknown.
    pub rated_tbw: u64,
    /// Journal ring size per drive (parity levels); None picks a default from the drive size.
    pub journal_bytes: Option<u64>,
}

/// Options for [`Array::create`].
#[derive(Clone, Debug, Default)]
pub struct CreateOptions {
    /// Discard the data area of every drive at creation (punches holes in files, so freshly
    /// created arrays read as zeros). Off only for tests on memory devices that start zeroed.
    pub skip_discard: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct Member {
    pub dev: Option<Arc<dyn BlockDevice>>,
    pub drive_uuid: Uuid,
    pub state: SlotState,
    pub events_left: u64,
    pub crc: Option<Arc<CrcTable>>,
    /// Rebuilding members are valid for stripes below this.
    pub cursor: Arc<AtomicU64>,
    pub lifetime_written_base: u64,
    pub lifetime_read_base: u64,
    pub lifetime_errors_base: u64,
}

impl Member {
    fn empty(state: SlotState) -> Member {
        Member {
            dev: None,
            drive_uuid: Uuid::NIL,
            state,
            events_left: 0,
            crc: None,
            cursor: Arc::new(AtomicU64::new(0)),
            lifetime_written_base: 0,
            lifetime_read_base: 0,
            lifetime_errors_base: 0,
        }
    }

    fn with_device(
        dev: Arc<dyn BlockDevice>,
        sb: &Superblock,
        state: SlotState,
        crc: CrcTable,
    ) -> Member {
        Member {
            dev: Some(dev),
            drive_uuid: sb.drive_uuid,
            state,
            events_left: 0,
            crc: Some(Arc::new(crc)),
            cursor: Arc::new(AtomicU64::new(0)),
            lifetime_written_base: sb.lifetime_bytes_written,
            lifetime_read_base: sb.lifetime_bytes_read,
            lifetime_errors_base: sb.lifetime_errors,
        }
    }

    pub fn readable(&self, stripe: u64) -> bool {
        match self.state {
            SlotState::Active => self.dev.is_some(),
            SlotState::Rebuilding => self.dev.is_some() && stripe < self.cursor.load(Relaxed),
            _ => false,
        }
    }

    pub fn writable(&self) -> bool {
        matches!(self.state, SlotState::Active | SlotState::Rebuilding) && self.dev.is_some()
    }
}

#[derive(Debug)]
pub(crate) struct Spare {
    pub dev: Arc<dyn BlockDevice>,
    pub drive_uuid: Uuid,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub checksum_errors: AtomicU64,
    pub repaired_blocks: AtomicU64,
    pub unrecoverable_blocks: AtomicU64,
    pub degraded_reads: AtomicU64,
    pub journal_records: AtomicU64,
    pub journal_replayed: AtomicU64,
    pub resynced_regions: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub uuid: Uuid,
    pub geometry: Geometry,
    pub layout: Layout,
    pub created_unix_s: u64,
    pub rated_endurance_bytes: u64,
    pub kernel: Kernel,
    pub membership: RwLock<Vec<Member>>,
    pub spares: Mutex<Vec<Spare>>,
    pub events: AtomicU64,
    pub journal_epoch: AtomicU64,
    pub journal_seq: AtomicU64,
    pub rings: Vec<Ring>,
    pub stripe_locks: Vec<RwLock<()>>,
    pub barrier: RwLock<()>,
    pub bitmap: WriteIntent,
    pub counters: Counters,
    pub superblock_lock: Mutex<()>,
    pub rebuild: RebuildControl,
    pub warnings: Mutex<Vec<String>>,
    pub closed: AtomicBool,
}

/// An assembled, running array. Dropping it stops background work and closes it cleanly.
#[derive(Debug)]
pub struct Array {
    pub(crate) inner: Arc<Inner>,
    /// Only the handle returned to the user closes the array on drop; background workers hold
    /// non-owning handles.
    pub(crate) owner: bool,
}

/// The bytes of a write's buffer (starting at array offset `offset`) that fall in `p`.
fn piece_bytes<'a>(data: &'a [u8], offset: u64, p: &Piece) -> &'a [u8] {
    let start = (p.array_offset - offset) as usize;
    &data[start..start + p.len as usize]
}

fn now_unix_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(crate) fn random_u64() -> u64 {
    let id = Uuid::random();
    u64::from_le_bytes(id.0[..8].try_into().unwrap_or([1; 8])) | 1
}

/// Waits for every ticket, returning the index and error of each one that failed.
pub(crate) fn wait_all(tickets: Vec<(usize, IoTicket)>) -> Vec<(usize, IoError)> {
    tickets.into_iter().filter_map(|(who, t)| t.wait().err().map(|e| (who, e))).collect()
}

impl Array {
    /// Writes fresh superblocks, checksum tables and bitmaps on `devs` and returns the array.
    pub fn create(
        devs: Vec<Arc<dyn BlockDevice>>,
        config: &ArrayConfig,
        options: &CreateOptions,
    ) -> Result<Array, RaidError> {
        let unit = config.stripe_unit_bytes as u64;
        let capacity = devs.iter().map(|d| d.capacity_bytes()).min().unwrap_or(0);
        // Validate the shape before sizing the journal from it.
        Geometry::new(config.level, devs.len(), config.stripe_unit_bytes, capacity)?;
        let data_chunks =
            Geometry::new(config.level, devs.len(), config.stripe_unit_bytes, capacity)?
                .data_chunks() as u64;
        let journal_bytes = if config.level.is_parity() {
            let largest_record = BLOCK + (data_chunks + 2) * unit;
            let wanted = config.journal_bytes.unwrap_or(JOURNAL_BYTES_DEFAULT.min(capacity / 32));
            wanted.max(2 * largest_record).div_ceil(BLOCK) * BLOCK
        } else {
            0
        };
        let layout = Layout::compute(capacity, unit, journal_bytes).ok_or_else(|| {
            RaidError::InvalidConfig(format!(
                "drives of {capacity} bytes are too small for this array; use drives of at least {} MiB",
                (journal_bytes + (2 << 20) + 8 * unit) >> 20
            ))
        })?;
        let geometry =
            Geometry::new(config.level, devs.len(), config.stripe_unit_bytes, layout.data_bytes)?;
        let mut seen = BTreeSet::new();
        for dev in &devs {
            if !seen.insert(dev.name().to_string()) {
                return Err(RaidError::InvalidConfig(format!(
                    "{} is listed twice; give each drive once",
                    dev.name()
                )));
            }
        }
        let uuid = Uuid::random();
        let blocks = layout.data_bytes / BLOCK;
        let members: Vec<Member> = devs
            .into_iter()
            .map(|dev| Member {
                dev: Some(dev),
                drive_uuid: Uuid::random(),
                state: SlotState::Active,
                events_left: 0,
                crc: Some(Arc::new(CrcTable::zeroed(blocks))),
                cursor: Arc::new(AtomicU64::new(0)),
                lifetime_written_base: 0,
                lifetime_read_base: 0,
                lifetime_errors_base: 0,
            })
            .collect();
        if !options.skip_discard {
            let tickets = members
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    let dev = m.dev.as_ref()?;
                    Some((
                        i,
                        dev.submit(IoOp::Discard {
                            offset: layout.data_offset,
                            len: layout.data_bytes as usize,
                        }),
                    ))
                })
                .collect();
            if let Some((_, e)) = wait_all(tickets).into_iter().next() {
                return Err(e.into());
            }
        }
        let array = Array::from_parts(
            uuid,
            geometry,
            layout,
            now_unix_s(),
            config.rated_tbw.saturating_mul(1_000_000_000_000),
            members,
            Vec::new(),
            1,
            random_u64(),
        );
        // The zeroed journal region must not hold records of a previous array on these drives;
        // the random epoch makes any leftover bytes invalid, and the bitmap starts clear.
        for (slot, m) in array.members().iter().enumerate() {
            let dev = m.dev.as_ref().expect("new members have devices");
            let crc = m.crc.as_ref().expect("new members have tables");
            crc.persist(dev.as_ref(), &layout)?;
            dev.write_at(
                layout.bitmap_offset,
                array.inner.bitmap.encode(layout.bitmap_bytes as usize),
            )?;
            let _ = slot;
        }
        array.write_superblocks(false)?;
        array.flush_devices()?;
        Ok(array)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        uuid: Uuid,
        geometry: Geometry,
        layout: Layout,
        created_unix_s: u64,
        rated_endurance_bytes: u64,
        members: Vec<Member>,
        spares: Vec<Spare>,
        events: u64,
        journal_epoch: u64,
    ) -> Array {
        let rings = (0..geometry.drives).map(|_| Ring::default()).collect();
        Array {
            owner: true,
            inner: Arc::new(Inner {
                uuid,
                geometry,
                layout,
                created_unix_s,
                rated_endurance_bytes,
                kernel: Kernel::best(),
                membership: RwLock::new(members),
                spares: Mutex::new(spares),
                events: AtomicU64::new(events),
                journal_epoch: AtomicU64::new(journal_epoch),
                journal_seq: AtomicU64::new(1),
                rings,
                stripe_locks: (0..STRIPE_LOCKS).map(|_| RwLock::new(())).collect(),
                barrier: RwLock::new(()),
                bitmap: WriteIntent::new(
                    layout.bitmap_region_bytes,
                    layout.data_bytes,
                    layout.bitmap_bytes,
                ),
                counters: Counters::default(),
                superblock_lock: Mutex::new(()),
                rebuild: RebuildControl::new(REBUILD_RATE_BYTES_S_DEFAULT),
                warnings: Mutex::new(Vec::new()),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// Reassembles an array from its drives' superblocks: refuses foreign and duplicated drives,
    /// leaves stale ones out (with a warning), re-adds a drive that returns after a short absence
    /// (resyncing only the regions marked in the bitmap), replays the journal and resyncs after
    /// an unclean stop, and resumes an interrupted rebuild.
    pub fn assemble(devs: Vec<Arc<dyn BlockDevice>>) -> Result<Array, RaidError> {
        if devs.is_empty() {
            return Err(RaidError::InvalidConfig("no drives given".into()));
        }
        let mut labelled = Vec::new();
        for dev in devs {
            let raw = dev.read_at(0, SUPERBLOCK_BYTES)?;
            let sb = Superblock::decode(&raw).map_err(|source| RaidError::Superblock {
                device: dev.name().to_string(),
                source,
            })?;
            labelled.push((dev, sb));
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
        let mut warnings = Vec::new();
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
                m.events_left = if matches!(entry.state, SlotState::Active | SlotState::Rebuilding)
                {
                    newly_missing = true;
                    auth.events
                } else {
                    entry.events_left
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
            match entry.state {
                SlotState::Active | SlotState::Rebuilding => {
                    let crc = CrcTable::load(dev.as_ref(), &layout)?;
                    let m = Member::with_device(dev.clone(), sb, entry.state, crc);
                    m.cursor.store(entry.rebuild_cursor, Relaxed);
                    members.push(m);
                }
                SlotState::Failed | SlotState::Missing if sb.events == entry.events_left => {
                    // The drive left at this event and nothing was written to it since: it
                    // only lacks what the bitmap marks. Re-add it with a partial resync.
                    let crc = CrcTable::load(dev.as_ref(), &layout)?;
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

    pub fn uuid(&self) -> Uuid {
        self.inner.uuid
    }

    pub fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    pub fn layout(&self) -> Layout {
        self.inner.layout
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.inner.geometry.capacity_bytes()
    }

    pub fn warnings(&self) -> Vec<String> {
        self.inner.warnings.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn members(&self) -> Vec<Member> {
        self.inner.membership.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn members_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Member>> {
        self.inner.membership.write().unwrap_or_else(|e| e.into_inner())
    }

    /// How many members are out of service (failed, missing, or not yet rebuilt).
    fn failed_count(members: &[Member]) -> usize {
        members.iter().filter(|m| m.state != SlotState::Active).count()
    }

    /// Whether the data is still complete given which members can serve reads.
    pub(crate) fn redundancy_ok(geometry: &Geometry, members: &[Member]) -> bool {
        let out = |d: usize| {
            !matches!(members[d].state, SlotState::Active | SlotState::Rebuilding)
                || members[d].dev.is_none()
        };
        match geometry.level {
            Level::Raid0 => (0..geometry.drives).all(|d| !out(d)),
            Level::Raid1 => (0..geometry.drives).any(|d| !out(d)),
            Level::Raid10 => (0..geometry.drives / 2).all(|p| !out(2 * p) || !out(2 * p + 1)),
            Level::Raid5 | Level::Raid6 => {
                (0..geometry.drives).filter(|&d| out(d)).count() <= geometry.level.parity_chunks()
            }
        }
    }

    /// Errors with [`RaidError::ArrayFailed`] once more drives are out than the level tolerates.
    pub(crate) fn check_alive(&self) -> Result<(), RaidError> {
        let members = self.members();
        let g = &self.inner.geometry;
        // A rebuilding member is not yet a full source: count it as out for the data check,
        // except that it still receives writes.
        let sources: Vec<Member> = members
            .iter()
            .map(|m| {
                let mut m = m.clone();
                if m.state == SlotState::Rebuilding {
                    m.state = SlotState::Failed;
                }
                m
            })
            .collect();
        if Self::redundancy_ok(g, &sources)
            || Self::redundancy_ok(g, &members) && self.rebuilding_is_partial()
        {
            Ok(())
        } else {
            Err(RaidError::ArrayFailed {
                level: g.level,
                drives: g.drives,
                failed: Self::failed_count(&members),
                tolerated: g.tolerated_failures(),
            })
        }
    }

    fn rebuilding_is_partial(&self) -> bool {
        // A member re-added for a bitmap resync holds valid data outside the marked regions, but
        // we cannot serve reads from it per region yet, so treat it as out: conservative.
        false
    }

    fn stripe_lock_indices(&self, stripes: impl Iterator<Item = u64>) -> Vec<usize> {
        let set: BTreeSet<usize> = stripes.map(|s| (s as usize) & (STRIPE_LOCKS - 1)).collect();
        set.into_iter().collect()
    }

    pub(crate) fn lock_stripes_shared(
        &self,
        stripes: impl Iterator<Item = u64>,
    ) -> Vec<RwLockReadGuard<'_, ()>> {
        self.stripe_lock_indices(stripes)
            .into_iter()
            .map(|i| self.inner.stripe_locks[i].read().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }

    pub(crate) fn lock_stripes(
        &self,
        stripes: impl Iterator<Item = u64>,
    ) -> Vec<RwLockWriteGuard<'_, ()>> {
        self.stripe_lock_indices(stripes)
            .into_iter()
            .map(|i| self.inner.stripe_locks[i].write().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), RaidError> {
        if offset % BLOCK != 0 || len % BLOCK != 0 {
            return Err(RaidError::Misaligned { offset, len });
        }
        let capacity = self.capacity_bytes();
        if offset.checked_add(len).is_none_or(|end| end > capacity) {
            return Err(RaidError::OutOfRange { offset, len, capacity });
        }
        Ok(())
    }

    /// The device byte offset of `row` (a 4 KiB block index) in `stripe`'s chunk.
    pub(crate) fn device_offset(&self, stripe: u64, row: u64) -> u64 {
        self.inner.layout.data_offset + self.inner.geometry.drive_offset(stripe) + row * BLOCK
    }

    /// The checksum-table block number of `row` in `stripe`'s chunk on any drive.
    pub(crate) fn table_block(&self, stripe: u64, row: u64) -> u64 {
        self.inner.geometry.drive_offset(stripe) / BLOCK + row
    }

    pub(crate) fn rows_per_chunk(&self) -> u64 {
        self.inner.geometry.unit() / BLOCK
    }

    // ----------------------------------------------------------------------------------------
    // Reads
    // ----------------------------------------------------------------------------------------

    /// Reads `buf.len()` bytes at array offset `offset` (both multiples of 4096). Every block is
    /// checked against its CRC32C; a bad or unreadable block is rebuilt from redundancy and
    /// rewritten in place, or the read fails. Wrong data is never returned.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), RaidError> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.check_alive()?;
        let g = self.inner.geometry;
        let _barrier = self.inner.barrier.read().unwrap_or_else(|e| e.into_inner());
        let pieces: Vec<Piece> = g.split(offset, buf.len() as u64).collect();
        let _locks = self.lock_stripes_shared(pieces.iter().map(|p| p.stripe));
        let members = self.members();
        // Fast path: read each piece from one good copy, all drives at once.
        let mut tickets = Vec::with_capacity(pieces.len());
        for (i, p) in pieces.iter().enumerate() {
            let drive =
                g.data_drives(p.stripe, p.index).iter().find(|&d| members[d].readable(p.stripe));
            if let Some(d) = drive {
                let dev = members[d].dev.as_ref().expect("readable members have devices");
                let dev_offset = self.device_offset(p.stripe, p.offset_in_chunk / BLOCK);
                tickets.push((
                    i,
                    d,
                    Some(dev.submit(IoOp::Read { offset: dev_offset, len: p.len as usize })),
                ));
            } else {
                tickets.push((i, usize::MAX, None));
            }
        }
        let mut slow = Vec::new();
        for (i, d, ticket) in tickets {
            let p = &pieces[i];
            let out = &mut buf
                [(p.array_offset - offset) as usize..(p.array_offset - offset + p.len) as usize];
            let good = match ticket.map(|t| t.wait()) {
                Some(Ok(stria_io::IoDone::Read(data))) => {
                    let first = self.table_block(p.stripe, p.offset_in_chunk / BLOCK);
                    let crc = members[d].crc.as_ref().expect("readable members have tables");
                    let ok = data
                        .chunks_exact(BLOCK_BYTES)
                        .enumerate()
                        .all(|(j, b)| crc_block(b) == crc.get(first + j as u64));
                    if ok {
                        out.copy_from_slice(&data);
                    }
                    ok
                }
                Some(Err(e)) => {
                    self.read_failed(d, &e);
                    false
                }
                _ => false,
            };
            if !good {
                slow.push(i);
            }
        }
        for i in slow {
            let p = pieces[i];
            let row = p.offset_in_chunk / BLOCK;
            let rows = p.len / BLOCK;
            let data = self.read_chunk_verified(&members, p.stripe, p.index, row, rows)?;
            buf[(p.array_offset - offset) as usize..(p.array_offset - offset + p.len) as usize]
                .copy_from_slice(&data);
        }
        Ok(())
    }

    /// Reads rows of one data chunk through redundancy: every copy or the parity math, repairing
    /// bad blocks it finds. The caller holds the stripe lock.
    pub(crate) fn read_chunk_verified(
        &self,
        members: &[Member],
        stripe: u64,
        index: usize,
        row: u64,
        rows: u64,
    ) -> Result<Vec<u8>, RaidError> {
        let g = self.inner.geometry;
        self.inner.counters.degraded_reads.fetch_add(1, Relaxed);
        if g.level.is_parity() {
            let all = self.stripe_rows(members, stripe, row, row + rows, None, true)?;
            return Ok(all[index].to_vec());
        }
        // Mirrors (and RAID 0, which has a single copy): assemble block by block from whichever
        // copy verifies, then repair the copies that did not.
        let copies: Vec<usize> = g.data_drives(stripe, index).iter().collect();
        let mut reads: Vec<Option<(Vec<bool>, AlignedBuf)>> = Vec::new();
        for &d in &copies {
            reads.push(self.read_rows_checked(members, d, stripe, row, rows));
        }
        let mut out = vec![0u8; (rows * BLOCK) as usize];
        for r in 0..rows as usize {
            let range = r * BLOCK_BYTES..(r + 1) * BLOCK_BYTES;
            let good = reads.iter().flatten().find(|(bad, _)| !bad[r]);
            let Some((_, data)) = good else {
                self.inner.counters.unrecoverable_blocks.fetch_add(1, Relaxed);
                return Err(RaidError::Unrecoverable {
                    offset: stripe * g.stripe_data_bytes()
                        + index as u64 * g.unit()
                        + (row + r as u64) * BLOCK,
                    reason: format!(
                        "no copy of this block passes its checksum ({} copies)",
                        copies.len()
                    ),
                });
            };
            out[range.clone()].copy_from_slice(&data[range.clone()]);
            for (c, read) in copies.iter().zip(&reads) {
                if let Some((bad, _)) = read
                    && bad[r]
                {
                    self.repair_block(&members[*c], stripe, row + r as u64, &out[range.clone()]);
                }
            }
        }
        Ok(out)
    }

    /// Reads rows of one member's chunk and checks each block: returns per-row "bad" flags and
    /// the data, or None if the member cannot be read at this stripe at all.
    pub(crate) fn read_rows_checked(
        &self,
        members: &[Member],
        slot: usize,
        stripe: u64,
        row: u64,
        rows: u64,
    ) -> Option<(Vec<bool>, AlignedBuf)> {
        let m = &members[slot];
        if !m.readable(stripe) {
            return None;
        }
        let dev = m.dev.as_ref()?;
        let crc = m.crc.as_ref()?;
        match dev.read_at(self.device_offset(stripe, row), (rows * BLOCK) as usize) {
            Ok(data) => {
                let first = self.table_block(stripe, row);
                let bad: Vec<bool> = data
                    .chunks_exact(BLOCK_BYTES)
                    .enumerate()
                    .map(|(j, b)| crc_block(b) != crc.get(first + j as u64))
                    .collect();
                let errors = bad.iter().filter(|&&b| b).count() as u64;
                if errors > 0 {
                    self.inner.counters.checksum_errors.fetch_add(errors, Relaxed);
                    tracing::warn!(
                        drive = dev.name(),
                        stripe,
                        row,
                        errors,
                        "checksum mismatch; repairing from redundancy"
                    );
                }
                Some((bad, data))
            }
            Err(e) => {
                // A drive that cannot read is taken out of service (the array goes degraded)
                // rather than retried on every request; the data comes from redundancy.
                self.read_failed(slot, &e);
                Some((vec![true; rows as usize], AlignedBuf::zeroed((rows * BLOCK) as usize)))
            }
        }
    }

    fn read_failed(&self, slot: usize, e: &IoError) {
        if self.inner.geometry.level == Level::Raid0 {
            tracing::error!("{e}");
            return;
        }
        if let Err(fail) = self.fail_member(slot, &format!("read failed: {e}")) {
            tracing::error!("{fail}");
        }
    }

    /// Rewrites one block that failed its checksum with the value rebuilt from redundancy.
    pub(crate) fn repair_block(&self, m: &Member, stripe: u64, row: u64, data: &[u8]) {
        let (Some(dev), Some(crc)) = (m.dev.as_ref(), m.crc.as_ref()) else { return };
        if !m.writable() {
            return;
        }
        match dev.write_at(self.device_offset(stripe, row), AlignedBuf::from_slice(data)) {
            Ok(()) => {
                crc.set(self.table_block(stripe, row), crc_block(data));
                self.inner.counters.repaired_blocks.fetch_add(1, Relaxed);
            }
            Err(e) => tracing::warn!("repair write failed: {e}"),
        }
    }

    /// For parity levels: rows `[a, b)` of every member of `stripe` (data first, then P, Q),
    /// correct: blocks that are unreadable, fail their checksum, or belong to `exclude` are
    /// rebuilt from the others. With `repair`, rebuilt blocks of readable members are rewritten.
    pub(crate) fn stripe_rows(
        &self,
        members: &[Member],
        stripe: u64,
        a: u64,
        b: u64,
        exclude: Option<usize>,
        repair: bool,
    ) -> Result<Vec<AlignedBuf>, RaidError> {
        let g = self.inner.geometry;
        let drives = g.members(stripe);
        let rows = (b - a) as usize;
        let mut bufs = Vec::with_capacity(drives.len());
        let mut bad: Vec<Vec<bool>> = Vec::with_capacity(drives.len());
        let mut unreadable = vec![false; drives.len()];
        for (i, &d) in drives.iter().enumerate() {
            let read = if Some(d) == exclude {
                None
            } else {
                self.read_rows_checked(members, d, stripe, a, b - a)
            };
            match read {
                Some((flags, data)) => {
                    bad.push(flags);
                    bufs.push(data);
                }
                None => {
                    unreadable[i] = true;
                    bad.push(vec![true; rows]);
                    bufs.push(AlignedBuf::zeroed(rows * BLOCK_BYTES));
                }
            }
        }
        let data_count = g.data_chunks();
        let parity = g.level.parity_chunks();
        let mut r = 0;
        while r < rows {
            let missing: Vec<usize> = (0..drives.len()).filter(|&i| bad[i][r]).collect();
            let mut end = r + 1;
            while end < rows
                && (0..drives.len()).filter(|&i| bad[i][end]).eq(missing.iter().copied())
            {
                end += 1;
            }
            if !missing.is_empty() {
                if missing.len() > parity {
                    self.inner.counters.unrecoverable_blocks.fetch_add(1, Relaxed);
                    return Err(RaidError::Unrecoverable {
                        offset: stripe * g.stripe_data_bytes(),
                        reason: format!(
                            "{} members of stripe {stripe} are unreadable or fail their checksums at row {}, {} tolerates {parity}",
                            missing.len(),
                            a + r as u64,
                            g.level
                        ),
                    });
                }
                let range = r * BLOCK_BYTES..end * BLOCK_BYTES;
                let mut slices: Vec<&mut [u8]> =
                    bufs.iter_mut().map(|b| &mut b[range.clone()]).collect();
                self.inner.kernel.reconstruct(&mut slices, data_count, &missing).map_err(|e| {
                    RaidError::Unrecoverable {
                        offset: stripe * g.stripe_data_bytes(),
                        reason: e.to_string(),
                    }
                })?;
                if repair {
                    for &i in &missing {
                        if unreadable[i] {
                            continue;
                        }
                        for row in r..end {
                            let block = &bufs[i][row * BLOCK_BYTES..(row + 1) * BLOCK_BYTES];
                            self.repair_block(&members[drives[i]], stripe, a + row as u64, block);
                        }
                    }
                }
            }
            r = end;
        }
        Ok(bufs)
    }

    // ----------------------------------------------------------------------------------------
    // Writes
    // ----------------------------------------------------------------------------------------

    /// Writes `data` at array offset `offset` (both multiples of 4096). Returns once every
    /// surviving copy is written (not yet flushed: call [`Array::flush`] for durability). A drive
    /// whose write fails is marked failed; the write still succeeds while redundancy remains.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), RaidError> {
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        self.check_alive()?;
        let g = self.inner.geometry;
        loop {
            let _barrier = self.inner.barrier.read().unwrap_or_else(|e| e.into_inner());
            let pieces: Vec<Piece> = g.split(offset, data.len() as u64).collect();
            let stripes: BTreeSet<u64> = pieces.iter().map(|p| p.stripe).collect();
            self.mark_intent(stripes.iter().copied())?;
            let _locks = self.lock_stripes(stripes.iter().copied());
            let members = self.members();
            let mut tickets = Vec::new();
            let mut crc_updates = Vec::new();
            let mut journal_full = false;
            for &stripe in &stripes {
                let in_stripe: Vec<&Piece> = pieces.iter().filter(|p| p.stripe == stripe).collect();
                let bytes_of = |p: &Piece| piece_bytes(data, offset, p);
                if g.level.is_parity() {
                    match self.plan_parity_stripe(&members, stripe, &in_stripe, data, offset)? {
                        Some(writes) => {
                            for (d, row, buf) in writes {
                                self.push_write(
                                    &members,
                                    d,
                                    stripe,
                                    row,
                                    buf,
                                    &mut tickets,
                                    &mut crc_updates,
                                );
                            }
                        }
                        None => {
                            journal_full = true;
                            break;
                        }
                    }
                } else {
                    for p in in_stripe {
                        let buf = AlignedBuf::from_slice(bytes_of(p));
                        for d in g.data_drives(stripe, p.index).iter() {
                            if members[d].writable() {
                                self.push_write(
                                    &members,
                                    d,
                                    stripe,
                                    p.offset_in_chunk / BLOCK,
                                    buf.clone(),
                                    &mut tickets,
                                    &mut crc_updates,
                                );
                            }
                        }
                    }
                }
            }
            // Writes already submitted complete (and get their checksums) even when the
            // journal filled up part way: the retry after the checkpoint reads those stripes.
            let failures = wait_all(tickets);
            let failed_drives: BTreeSet<usize> = failures.iter().map(|(d, _)| *d).collect();
            for (d, table_block, crc) in crc_updates {
                if !failed_drives.contains(&d)
                    && let Some(t) = members[d].crc.as_ref()
                {
                    t.set(table_block, crc);
                }
            }
            self.handle_write_failures(&members, failures)?;
            if journal_full {
                drop(_locks);
                drop(_barrier);
                self.flush()?;
                continue;
            }
            return Ok(());
        }
    }

    /// Makes a range read as zeros. Redundancy and checksums are kept as for any write.
    pub fn trim(&self, offset: u64, len: u64) -> Result<(), RaidError> {
        self.check_range(offset, len)?;
        let step = self.inner.geometry.stripe_data_bytes().max(1 << 20);
        let zeros = vec![0u8; step.min(len.max(1)) as usize];
        let mut at = offset;
        while at < offset + len {
            let n = step.min(offset + len - at);
            self.write(at, &zeros[..n as usize])?;
            at += n;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn push_write(
        &self,
        members: &[Member],
        d: usize,
        stripe: u64,
        row: u64,
        buf: AlignedBuf,
        tickets: &mut Vec<(usize, IoTicket)>,
        crc_updates: &mut Vec<(usize, u64, u32)>,
    ) {
        let Some(dev) = members[d].dev.as_ref() else { return };
        let first = self.table_block(stripe, row);
        for (j, block) in buf.chunks_exact(BLOCK_BYTES).enumerate() {
            crc_updates.push((d, first + j as u64, crc_block(block)));
        }
        let offset = self.device_offset(stripe, row);
        tickets.push((d, dev.submit(IoOp::Write { offset, data: buf, fua: false })));
    }

    /// Works out every drive write for one stripe of a parity array, journaling partial-stripe
    /// writes first. Returns None when the journal is full (the caller checkpoints and retries).
    #[allow(clippy::type_complexity)]
    fn plan_parity_stripe(
        &self,
        members: &[Member],
        stripe: u64,
        pieces: &[&Piece],
        data: &[u8],
        offset: u64,
    ) -> Result<Option<Vec<(usize, u64, AlignedBuf)>>, RaidError> {
        let bytes_of = |p: &Piece| piece_bytes(data, offset, p);
        let g = self.inner.geometry;
        let unit = g.unit();
        let k = g.data_chunks();
        let drives = g.members(stripe);
        let full = pieces.len() == k && pieces.iter().all(|p| p.len == unit);
        if full {
            let mut chunks: Vec<AlignedBuf> =
                pieces.iter().map(|p| AlignedBuf::from_slice(bytes_of(p))).collect();
            self.append_parity(&mut chunks, 0, unit as usize);
            let writes = chunks
                .into_iter()
                .enumerate()
                .filter(|(i, _)| members[drives[*i]].writable())
                .map(|(i, buf)| (drives[i], 0, buf))
                .collect();
            return Ok(Some(writes));
        }
        // Partial stripe: reconstruct-write over the touched rows. Reading through
        // `stripe_rows` verifies (and if needed rebuilds) every block the new parity depends on.
        let a = pieces.iter().map(|p| p.offset_in_chunk / BLOCK).min().expect("non-empty");
        let b =
            pieces.iter().map(|p| (p.offset_in_chunk + p.len) / BLOCK).max().expect("non-empty");
        let mut rows = self.stripe_rows(members, stripe, a, b, None, true)?;
        rows.truncate(k);
        for p in pieces {
            let at = (p.offset_in_chunk - a * BLOCK) as usize;
            rows[p.index][at..at + p.len as usize].copy_from_slice(bytes_of(p));
        }
        self.append_parity(&mut rows, 0, ((b - a) * BLOCK) as usize);
        let mut writes: Vec<(usize, u64, AlignedBuf)> = Vec::new();
        for p in pieces {
            if members[drives[p.index]].writable() {
                let at = (p.offset_in_chunk - a * BLOCK) as usize;
                writes.push((
                    drives[p.index],
                    p.offset_in_chunk / BLOCK,
                    AlignedBuf::from_slice(&rows[p.index][at..at + p.len as usize]),
                ));
            }
        }
        for (i, buf) in rows.into_iter().enumerate().skip(k) {
            if members[drives[i]].writable() {
                writes.push((drives[i], a, buf));
            }
        }
        if !self.journal(members, stripe, &writes)? {
            return Ok(None);
        }
        Ok(Some(writes))
    }

    /// Appends P (and Q) computed over `chunks[..k]` bytes `[from, from + len)`.
    fn append_parity(&self, chunks: &mut Vec<AlignedBuf>, from: usize, len: usize) {
        let parity = self.inner.geometry.level.parity_chunks();
        let mut p = AlignedBuf::zeroed(len);
        let sources: Vec<&[u8]> = chunks.iter().map(|c| &c[from..from + len]).collect();
        if parity == 2 {
            let mut q = AlignedBuf::zeroed(len);
            self.inner.kernel.pq_gen(&sources, &mut p, &mut q);
            chunks.push(p);
            chunks.push(q);
        } else {
            self.inner.kernel.xor_gen(&sources, &mut p);
            chunks.push(p);
        }
    }

    /// Writes one journal record for a partial-stripe update to `parity + 1` members, with FUA.
    /// Returns false if a ring is full.
    fn journal(
        &self,
        members: &[Member],
        stripe: u64,
        writes: &[(usize, u64, AlignedBuf)],
    ) -> Result<bool, RaidError> {
        let g = self.inner.geometry;
        let layout = &self.inner.layout;
        let entries: Vec<Entry> = writes
            .iter()
            .map(|(d, row, buf)| Entry {
                drive: *d as u16,
                row: *row as u32,
                rows: (buf.len() / BLOCK_BYTES) as u32,
            })
            .collect();
        let payload: Vec<&[u8]> = writes.iter().map(|(_, _, buf)| &buf[..]).collect();
        let seq = self.inner.journal_seq.fetch_add(1, Relaxed);
        let record = journal::encode(
            self.inner.uuid,
            self.inner.journal_epoch.load(Relaxed),
            seq,
            stripe,
            &entries,
            &payload,
        );
        let copies = g.level.parity_chunks() + 1;
        let targets: Vec<usize> = (0..g.drives)
            .map(|i| (stripe as usize + i) % g.drives)
            .filter(|&d| members[d].writable())
            .take(copies)
            .collect();
        // Reserve on every ring before writing to any, so a full ring never leaves a stray
        // record write behind that could land after the checkpoint.
        let mut positions = Vec::with_capacity(targets.len());
        for &d in &targets {
            match self.inner.rings[d].reserve(record.len() as u64, layout.journal_bytes) {
                Some(pos) => positions.push(pos),
                None => return Ok(false),
            }
        }
        let mut tickets = Vec::new();
        for (&d, pos) in targets.iter().zip(positions) {
            let dev = members[d].dev.as_ref().expect("writable members have devices");
            tickets.push((
                d,
                dev.submit(IoOp::Write {
                    offset: layout.journal_offset + pos,
                    data: record.clone(),
                    fua: true,
                }),
            ));
        }
        let failures = wait_all(tickets);
        let all_failed = failures.len() == targets.len();
        self.handle_write_failures(members, failures)?;
        if all_failed {
            return Err(RaidError::Unrecoverable {
                offset: stripe * g.stripe_data_bytes(),
                reason: "no journal copy could be written".into(),
            });
        }
        self.inner.counters.journal_records.fetch_add(1, Relaxed);
        Ok(true)
    }

    /// Sets the write-intent bits of the stripes' regions, persisting the bitmap first if any bit
    /// is new, so a crash mid-write is always followed by a resync of that region.
    pub(crate) fn mark_intent(&self, stripes: impl Iterator<Item = u64>) -> Result<(), RaidError> {
        let g = self.inner.geometry;
        let bitmap = &self.inner.bitmap;
        let regions: Vec<u64> = stripes.map(|s| bitmap.region_of(g.drive_offset(s))).collect();
        if regions.iter().all(|&r| bitmap.is_set(r)) {
            return Ok(());
        }
        let _guard = bitmap.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
        if bitmap.set(regions) {
            self.persist_bitmap()?;
        }
        Ok(())
    }

    pub(crate) fn persist_bitmap(&self) -> Result<(), RaidError> {
        let layout = &self.inner.layout;
        let image = self.inner.bitmap.encode(layout.bitmap_bytes as usize);
        let members = self.members();
        let tickets = members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.writable())
            .filter_map(|(d, m)| {
                Some((
                    d,
                    m.dev.as_ref()?.submit(IoOp::Write {
                        offset: layout.bitmap_offset,
                        data: image.clone(),
                        fua: true,
                    }),
                ))
            })
            .collect();
        let failures = wait_all(tickets);
        self.handle_write_failures(&members, failures)
    }

    /// Marks every drive whose write failed as failed, then checks the array is still whole.
    pub(crate) fn handle_write_failures(
        &self,
        members: &[Member],
        failures: Vec<(usize, IoError)>,
    ) -> Result<(), RaidError> {
        if failures.is_empty() {
            return Ok(());
        }
        for (d, e) in failures {
            if members[d].writable() {
                self.fail_member(d, &format!("write failed: {e}"))?;
            }
        }
        self.check_alive()
    }

    // ----------------------------------------------------------------------------------------
    // Flush and membership
    // ----------------------------------------------------------------------------------------

    /// Makes every write that returned before this call durable: checksum tables, then a flush
    /// of every drive, then a journal checkpoint; clears the write-intent bitmap when optimal.
    pub fn flush(&self) -> Result<(), RaidError> {
        let _barrier = self.inner.barrier.write().unwrap_or_else(|e| e.into_inner());
        self.flush_locked()
    }

    fn flush_locked(&self) -> Result<(), RaidError> {
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
        self.flush_devices()?;
        let journal_used = self.inner.rings.iter().any(|r| r.used() > 0);
        if journal_used {
            self.inner.journal_epoch.store(random_u64(), Relaxed);
            self.inner.journal_seq.store(1, Relaxed);
            self.write_superblocks(false)?;
            for ring in &self.inner.rings {
                ring.reset();
            }
        }
        let members = self.members();
        let optimal = members.iter().all(|m| m.state == SlotState::Active);
        if optimal && self.inner.bitmap.any_set() {
            let _guard = self.inner.bitmap.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.inner.bitmap.clear_all();
            self.persist_bitmap()?;
        }
        Ok(())
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
        self.fail_member(slot, "failed by the operator")?;
        self.check_alive()
    }

    pub(crate) fn fail_member(&self, slot: usize, reason: &str) -> Result<(), RaidError> {
        {
            let mut members = self.members_mut();
            let m = &mut members[slot];
            if !m.writable() {
                return Ok(());
            }
            tracing::error!(
                slot,
                drive = m.dev.as_ref().map(|d| d.name()).unwrap_or("?"),
                "drive failed: {reason}"
            );
            m.events_left = self.inner.events.load(Relaxed);
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
                self.install(slot, spare.dev, spare.drive_uuid, None)?;
            }
        }
        Ok(())
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
        if dev.capacity_bytes() < self.inner.layout.min_capacity() {
            return Err(RaidError::Refused(format!(
                "{} holds {} bytes; the array needs at least {} per drive",
                dev.name(),
                dev.capacity_bytes(),
                self.inner.layout.min_capacity()
            )));
        }
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
            let regions = self.inner.bitmap.dirty_regions();
            tracing::info!(
                slot,
                regions = regions.len(),
                "drive returned: resyncing only regions written meanwhile"
            );
            return self.install(slot, dev, sb.drive_uuid, Some(regions));
        }
        self.install(slot, dev, Uuid::random(), None)
    }

    fn install(
        &self,
        slot: usize,
        dev: Arc<dyn BlockDevice>,
        drive_uuid: Uuid,
        regions: Option<Vec<u64>>,
    ) -> Result<(), RaidError> {
        let layout = self.inner.layout;
        let crc = if regions.is_some() {
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
        self.write_superblocks(false)?;
        // The newcomer carries the current write-intent bits from the start.
        {
            let _guard = self.inner.bitmap.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.persist_bitmap()?;
        }
        crate::rebuild::start(self, slot, regions);
        Ok(())
    }

    /// Labels `dev` as a hot spare of this array.
    pub fn add_spare(&self, dev: Arc<dyn BlockDevice>) -> Result<(), RaidError> {
        if dev.capacity_bytes() < self.inner.layout.min_capacity() {
            return Err(RaidError::Refused(format!(
                "{} holds {} bytes; a spare needs at least {}",
                dev.name(),
                dev.capacity_bytes(),
                self.inner.layout.min_capacity()
            )));
        }
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
                self.install(slot, spare.dev, spare.drive_uuid, None)?;
            }
        }
        Ok(())
    }

    /// Stops background work, flushes and marks the array clean.
    pub fn close(self) -> Result<(), RaidError> {
        self.shutdown()
    }

    fn shutdown(&self) -> Result<(), RaidError> {
        if self.inner.closed.swap(true, Relaxed) {
            return Ok(());
        }
        crate::rebuild::stop_all(self);
        if self.check_alive().is_err() {
            return Ok(());
        }
        self.flush()?;
        self.write_superblocks(true)?;
        self.flush_devices()
    }

    pub fn set_rebuild_rate(&self, bytes_per_s: u64) {
        self.inner.rebuild.set_rate(bytes_per_s);
    }

    pub fn kernel(&self) -> Kernel {
        self.inner.kernel
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        if let Err(e) = self.shutdown() {
            tracing::error!("closing array {}: {e}", self.inner.uuid);
        }
    }
}
