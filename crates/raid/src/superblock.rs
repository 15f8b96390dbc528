//! The drive superblock: the first 4 KiB of every member and spare, so an array reassembles
//! from its drives alone, with no config file.
//!
//! Little-endian fields at fixed offsets, a CRC32C over everything before the last four bytes.
//! See docs/internals/raid.md for the byte map. Version 1 is the only format; a reader refuses
//! any other version with a clear message instead of guessing.

use stria_proto::{ARRAY_DRIVES_MAX, ARRAY_SPARES_MAX, Uuid};

use crate::geometry::Level;

pub const SUPERBLOCK_BYTES: usize = 4096;
pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"STRIARD\x01";
pub const FORMAT_VERSION: u32 = 1;
/// Slot table entries: members then spares.
pub const SLOTS_MAX: usize = ARRAY_DRIVES_MAX + ARRAY_SPARES_MAX;
const SLOT_TABLE_OFFSET: usize = 256;
const SLOT_ENTRY_BYTES: usize = 32;
const CRC_OFFSET: usize = SUPERBLOCK_BYTES - 4;
const _: () = assert!(SLOT_TABLE_OFFSET + SLOTS_MAX * SLOT_ENTRY_BYTES <= CRC_OFFSET);

/// What the array believes about one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    Empty,
    Active,
    /// Failed by an I/O error or by the operator. `events_left` is the drive's own event count
    /// when it left, so a returning drive can be recognised and resynced from the bitmap; a
    /// drive that left before it was in sync (while rebuilding) gets [`LEFT_OUT_OF_SYNC`]
    /// instead, so it only ever comes back through a full rebuild.
    Failed,
    /// Not found at the last assembly.
    Missing,
    /// Being written from redundancy; valid below the rebuild cursor.
    Rebuilding,
    Spare,
}

/// The `events_left` of a slot whose drive left while it was being rebuilt: its data is
/// complete only below its rebuild cursor, so the bitmap's regions are not all it lacks. No
/// label's event count reaches it, so such a drive is never taken back as returning.
pub(crate) const LEFT_OUT_OF_SYNC: u64 = u64::MAX;

impl SlotState {
    fn code(self) -> u8 {
        match self {
            SlotState::Empty => 0,
            SlotState::Active => 1,
            SlotState::Failed => 2,
            SlotState::Missing => 3,
            SlotState::Rebuilding => 4,
            SlotState::Spare => 5,
        }
    }

    fn from_code(code: u8) -> Option<SlotState> {
        Some(match code {
            0 => SlotState::Empty,
            1 => SlotState::Active,
            2 => SlotState::Failed,
            3 => SlotState::Missing,
            4 => SlotState::Rebuilding,
            5 => SlotState::Spare,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SlotState::Empty => "empty",
            SlotState::Active => "active",
            SlotState::Failed => "failed",
            SlotState::Missing => "missing",
            SlotState::Rebuilding => "rebuilding",
            SlotState::Spare => "spare",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotEntry {
    pub drive_uuid: Uuid,
    pub state: SlotState,
    /// For failed/missing slots: the drive's event count when it left the array.
    pub events_left: u64,
    /// For rebuilding slots: stripes rebuilt so far (persisted now and then to resume).
    pub rebuild_cursor: u64,
}

impl SlotEntry {
    pub const EMPTY: SlotEntry = SlotEntry {
        drive_uuid: Uuid::NIL,
        state: SlotState::Empty,
        events_left: 0,
        rebuild_cursor: 0,
    };
}

/// Where each region lives on a member drive, identical on all members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub bitmap_offset: u64,
    pub bitmap_bytes: u64,
    /// Bytes of each drive's data area covered by one write-intent bit.
    pub bitmap_region_bytes: u64,
    pub journal_offset: u64,
    pub journal_bytes: u64,
    pub crc_offset: u64,
    pub crc_bytes: u64,
    pub data_offset: u64,
    pub data_bytes: u64,
}

pub const BITMAP_BYTES: u64 = 4096;
const BITMAP_BITS: u64 = BITMAP_BYTES * 8;
const DATA_ALIGN_BYTES: u64 = 1024 * 1024;
/// The least data-area bytes one write-intent bit covers (md's default bitmap chunk). The first
/// write into a clear region waits for a FUA bitmap write on every member, so small regions make
/// a sequential writer pay that every few MiB; on large drives the 32768 bits set the size.
pub const BITMAP_REGION_MIN_BYTES: u64 = 64 << 20;

impl Layout {
    /// Lays out a drive of `capacity` bytes: superblock, bitmap, journal (parity levels), the
    /// checksum table (4 bytes per 4 KiB data block) and the data area, aligned to 1 MiB. A
    /// write-intent bit covers at least `region_min_bytes` of the data area (rounded up to whole
    /// units), more where 32768 bits would not cover it.
    pub fn compute(
        capacity: u64,
        unit: u64,
        journal_bytes: u64,
        region_min_bytes: u64,
    ) -> Option<Layout> {
        let block = stria_proto::BLOCK_BYTES as u64;
        let bitmap_offset = SUPERBLOCK_BYTES as u64;
        let journal_offset = bitmap_offset + BITMAP_BYTES;
        let crc_offset = journal_offset + journal_bytes;
        let room = capacity.checked_sub(crc_offset + DATA_ALIGN_BYTES)?;
        // Each data block costs its 4 KiB plus 4 bytes of checksum.
        let mut data_bytes = room / (block + 4) * block / unit * unit;
        loop {
            let crc_bytes = (data_bytes / block * 4).div_ceil(block) * block;
            let data_offset =
                (crc_offset + crc_bytes).div_ceil(DATA_ALIGN_BYTES) * DATA_ALIGN_BYTES;
            if data_offset + data_bytes <= capacity {
                if data_bytes == 0 {
                    return None;
                }
                let region = (data_bytes.div_ceil(BITMAP_BITS)).div_ceil(unit).max(1) * unit;
                return Some(Layout {
                    bitmap_offset,
                    bitmap_bytes: BITMAP_BYTES,
                    bitmap_region_bytes: region.max(region_min_bytes.div_ceil(unit) * unit),
                    journal_offset,
                    journal_bytes,
                    crc_offset,
                    crc_bytes,
                    data_offset,
                    data_bytes,
                });
            }
            data_bytes = data_bytes.checked_sub(unit)?;
        }
    }

    /// The smallest drive that can hold this layout (for checking replacement drives).
    pub fn min_capacity(&self) -> u64 {
        self.data_offset + self.data_bytes
    }

    /// Whether this layout could have come from [`Layout::compute`]: the regions follow the
    /// label in order without overlapping or overflowing, the data area is not empty, and the
    /// bitmap (at most [`BITMAP_BYTES`]) has a bit for every region of it. Assembly sizes
    /// buffers from these fields and adds them up, so a label that fails this is refused.
    pub fn is_consistent(&self) -> bool {
        let regions = [
            (self.bitmap_offset, self.bitmap_bytes),
            (self.journal_offset, self.journal_bytes),
            (self.crc_offset, self.crc_bytes),
            (self.data_offset, self.data_bytes),
        ];
        let mut end = SUPERBLOCK_BYTES as u64;
        for (offset, bytes) in regions {
            match offset.checked_add(bytes) {
                Some(region_end) if offset >= end => end = region_end,
                _ => return false,
            }
        }
        self.data_bytes > 0
            && self.bitmap_region_bytes > 0
            && self.bitmap_bytes <= BITMAP_BYTES
            && self.data_bytes.div_ceil(self.bitmap_region_bytes) <= self.bitmap_bytes * 8
    }
}

/// The decoded superblock of one drive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub array_uuid: Uuid,
    pub drive_uuid: Uuid,
    pub slot: u16,
    pub level: Level,
    pub drives: u16,
    pub stripe_unit_bytes: u32,
    /// Bit 0: the array was closed cleanly (no resync needed).
    pub clean: bool,
    /// Bumped on every change of array membership or state; the highest count wins.
    pub events: u64,
    pub created_unix_s: u64,
    pub layout: Layout,
    /// Rated endurance of this drive in bytes written (TBW x 10^12); 0 = unknown.
    pub rated_endurance_bytes: u64,
    pub lifetime_bytes_written: u64,
    pub lifetime_bytes_read: u64,
    /// Epoch of the journal ring at the last checkpoint; records of other epochs are stale.
    pub journal_epoch: u64,
    /// I/O errors this drive has returned over its life in the array.
    pub lifetime_errors: u64,
    /// The last measured rebuild rate onto this drive (bytes/s), for status from another process.
    pub rebuild_rate_bytes_s: u64,
    pub slots: Vec<SlotEntry>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SuperblockError {
    #[error("no Stria superblock (wrong magic): not a Stria drive, or not created yet")]
    NotStria,
    #[error(
        "superblock checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the label is damaged"
    )]
    Checksum { stored: u32, computed: u32 },
    #[error(
        "superblock format version {0} is not supported by this build (it reads version {FORMAT_VERSION})"
    )]
    Version(u32),
    #[error("superblock field {0} holds an invalid value")]
    Field(&'static str),
}

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
fn get_uuid(b: &[u8], at: usize) -> Uuid {
    let mut a = [0; 16];
    a.copy_from_slice(&b[at..at + 16]);
    Uuid(a)
}

impl Superblock {
    pub fn encode(&self) -> [u8; SUPERBLOCK_BYTES] {
        assert!(self.slots.len() <= SLOTS_MAX, "slot table overflow");
        let mut b = [0u8; SUPERBLOCK_BYTES];
        b[0..8].copy_from_slice(&SUPERBLOCK_MAGIC);
        put_u32(&mut b, 8, FORMAT_VERSION);
        put_u32(&mut b, 12, SUPERBLOCK_BYTES as u32);
        b[16..32].copy_from_slice(&self.array_uuid.0);
        b[32..48].copy_from_slice(&self.drive_uuid.0);
        put_u16(&mut b, 48, self.slot);
        b[50] = self.level.code();
        b[51] = self.slots.len() as u8;
        put_u16(&mut b, 52, self.drives);
        put_u32(&mut b, 56, self.stripe_unit_bytes);
        put_u32(&mut b, 60, self.clean as u32);
        put_u64(&mut b, 64, self.events);
        put_u64(&mut b, 72, self.created_unix_s);
        let l = &self.layout;
        for (i, v) in [
            l.bitmap_offset,
            l.bitmap_bytes,
            l.bitmap_region_bytes,
            l.journal_offset,
            l.journal_bytes,
            l.crc_offset,
            l.crc_bytes,
            l.data_offset,
            l.data_bytes,
        ]
        .into_iter()
        .enumerate()
        {
            put_u64(&mut b, 80 + 8 * i, v);
        }
        put_u64(&mut b, 152, self.rated_endurance_bytes);
        put_u64(&mut b, 160, self.lifetime_bytes_written);
        put_u64(&mut b, 168, self.lifetime_bytes_read);
        put_u64(&mut b, 176, self.journal_epoch);
        put_u64(&mut b, 184, self.lifetime_errors);
        put_u64(&mut b, 192, self.rebuild_rate_bytes_s);
        for (i, s) in self.slots.iter().enumerate() {
            let at = SLOT_TABLE_OFFSET + i * SLOT_ENTRY_BYTES;
            b[at..at + 16].copy_from_slice(&s.drive_uuid.0);
            b[at + 16] = s.state.code();
            put_u64(&mut b, at + 17, s.events_left);
            // 7 bytes are enough for any cursor (2^56 stripes).
            b[at + 25..at + 32].copy_from_slice(&s.rebuild_cursor.to_le_bytes()[..7]);
        }
        let crc = stria_proto::crc32c(&b[..CRC_OFFSET]);
        put_u32(&mut b, CRC_OFFSET, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, SuperblockError> {
        if b.len() < SUPERBLOCK_BYTES || b[0..8] != SUPERBLOCK_MAGIC {
            return Err(SuperblockError::NotStria);
        }
        let stored = get_u32(b, CRC_OFFSET);
        let computed = stria_proto::crc32c(&b[..CRC_OFFSET]);
        if stored != computed {
            return Err(SuperblockError::Checksum { stored, computed });
        }
        let version = get_u32(b, 8);
        if version != FORMAT_VERSION {
            return Err(SuperblockError::Version(version));
        }
        let level = Level::from_code(b[50]).ok_or(SuperblockError::Field("level"))?;
        let slot_count = b[51] as usize;
        if slot_count > SLOTS_MAX {
            return Err(SuperblockError::Field("slot count"));
        }
        let l = |i: usize| get_u64(b, 80 + 8 * i);
        let layout = Layout {
            bitmap_offset: l(0),
            bitmap_bytes: l(1),
            bitmap_region_bytes: l(2),
            journal_offset: l(3),
            journal_bytes: l(4),
            crc_offset: l(5),
            crc_bytes: l(6),
            data_offset: l(7),
            data_bytes: l(8),
        };
        if !layout.is_consistent() {
            return Err(SuperblockError::Field("layout"));
        }
        let mut slots = Vec::with_capacity(slot_count);
        for i in 0..slot_count {
            let at = SLOT_TABLE_OFFSET + i * SLOT_ENTRY_BYTES;
            let mut cursor = [0u8; 8];
            cursor[..7].copy_from_slice(&b[at + 25..at + 32]);
            slots.push(SlotEntry {
                drive_uuid: get_uuid(b, at),
                state: SlotState::from_code(b[at + 16])
                    .ok_or(SuperblockError::Field("slot state"))?,
                events_left: get_u64(b, at + 17),
                rebuild_cursor: u64::from_le_bytes(cursor),
            });
        }
        Ok(Superblock {
            array_uuid: get_uuid(b, 16),
            drive_uuid: get_uuid(b, 32),
            slot: get_u16(b, 48),
            level,
            drives: get_u16(b, 52),
            stripe_unit_bytes: get_u32(b, 56),
            clean: get_u32(b, 60) & 1 == 1,
            events: get_u64(b, 64),
            created_unix_s: get_u64(b, 72),
            layout,
            rated_endurance_bytes: get_u64(b, 152),
            lifetime_bytes_written: get_u64(b, 160),
            lifetime_bytes_read: get_u64(b, 168),
            journal_epoch: get_u64(b, 176),
            lifetime_errors: get_u64(b, 184),
            rebuild_rate_bytes_s: get_u64(b, 192),
            slots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        let layout = Layout::compute(1 << 30, 65536, 8 << 20, BITMAP_REGION_MIN_BYTES).unwrap();
        Superblock {
            array_uuid: Uuid::random(),
            drive_uuid: Uuid::random(),
            slot: 3,
            level: Level::Raid6,
            drives: 6,
            stripe_unit_bytes: 65536,
            clean: true,
            events: 42,
            created_unix_s: 1_790_000_000,
            layout,
            rated_endurance_bytes: 600_000_000_000_000,
            lifetime_bytes_written: 123,
            lifetime_bytes_read: 456,
            journal_epoch: 7,
            lifetime_errors: 3,
            rebuild_rate_bytes_s: 5,
            slots: vec![
                SlotEntry {
                    drive_uuid: Uuid::random(),
                    state: SlotState::Rebuilding,
                    events_left: 9,
                    rebuild_cursor: 1 << 40,
                };
                8
            ],
        }
    }

    #[test]
    fn superblock_round_trips() {
        let sb = sample();
        assert_eq!(Superblock::decode(&sb.encode()), Ok(sb));
    }

    #[test]
    fn damaged_or_foreign_labels_are_refused() {
        let mut bytes = sample().encode();
        bytes[100] ^= 1;
        assert!(matches!(Superblock::decode(&bytes), Err(SuperblockError::Checksum { .. })));
        assert_eq!(Superblock::decode(&[0u8; 4096]), Err(SuperblockError::NotStria));
        let mut bytes = sample().encode();
        put_u32(&mut bytes, 8, 9);
        let crc = stria_proto::crc32c(&bytes[..CRC_OFFSET]);
        put_u32(&mut bytes, CRC_OFFSET, crc);
        assert_eq!(Superblock::decode(&bytes), Err(SuperblockError::Version(9)));
    }

    /// Found by the `drive_superblock` fuzz target: labels with a valid checksum but a layout
    /// whose sums overflow, whose bitmap cannot cover the data area, or that asks for a huge
    /// bitmap made assembly panic or abort; they are refused as damaged now.
    #[test]
    fn labels_with_impossible_layouts_are_refused() {
        let forgeries: [fn(&mut Layout); 5] = [
            |l| l.data_offset = u64::MAX - 4096,
            |l| l.bitmap_region_bytes = 512,
            |l| l.bitmap_bytes = 1 << 40,
            |l| l.journal_offset = l.bitmap_offset,
            |l| l.crc_bytes = u64::MAX,
        ];
        for forge in forgeries {
            let mut sb = sample();
            forge(&mut sb.layout);
            assert_eq!(Superblock::decode(&sb.encode()), Err(SuperblockError::Field("layout")));
        }
        assert!(sample().layout.is_consistent());
    }

    #[test]
    fn layout_fits_the_drive_and_covers_every_data_block() {
        for capacity in [16u64 << 20, 1 << 30, 3_000_000_000_000] {
            let l = Layout::compute(capacity, 65536, 4 << 20, BITMAP_REGION_MIN_BYTES).unwrap();
            assert!(l.min_capacity() <= capacity);
            assert!(l.crc_bytes * 1024 >= l.data_bytes, "one u32 per 4 KiB block");
            assert!(l.crc_offset + l.crc_bytes <= l.data_offset);
            assert_eq!(l.data_offset % (1 << 20), 0);
            assert_eq!(l.data_bytes % 65536, 0);
            assert!(l.data_bytes.div_ceil(l.bitmap_region_bytes) <= BITMAP_BITS);
            assert!(l.bitmap_region_bytes >= BITMAP_REGION_MIN_BYTES);
            assert_eq!(l.bitmap_region_bytes % 65536, 0, "a bit covers whole stripes");
            assert!(l.is_consistent());
            // Metadata costs about 0.1% plus the fixed regions.
            assert!(l.data_bytes > capacity / 100 * 90 || capacity < 1 << 30);
        }
        assert!(Layout::compute(1 << 20, 65536, 0, BITMAP_REGION_MIN_BYTES).is_none());
        // A smaller minimum is taken as asked (whole units), a larger data area overrides it.
        let small = Layout::compute(1 << 30, 65536, 0, 100_000).unwrap();
        assert_eq!(small.bitmap_region_bytes, 131_072);
        let huge = Layout::compute(3_000_000_000_000, 65536, 0, 4096).unwrap();
        assert!(huge.data_bytes.div_ceil(huge.bitmap_region_bytes) <= BITMAP_BITS);
    }
}
