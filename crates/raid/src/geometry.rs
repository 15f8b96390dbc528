//! Where each byte lives: RAID levels and the mapping from array offsets to drives.
//!
//! Pure arithmetic, no I/O, so it can be checked exhaustively in unit tests. Parity placement
//! follows Linux md's default left-symmetric layout: the P chunk rotates backwards one drive per
//! stripe, Q (RAID 6) sits right after P, and data chunks follow the parity.

use std::fmt;

use stria_proto::{
    ARRAY_DRIVES_MAX, ARRAY_DRIVES_MIN, STRIPE_UNIT_BYTES_MAX, STRIPE_UNIT_BYTES_MIN,
};

use crate::RaidError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    Raid0,
    Raid1,
    Raid10,
    Raid5,
    Raid6,
}

impl Level {
    pub fn code(self) -> u8 {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid10 => 10,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
        }
    }

    pub fn from_code(code: u8) -> Option<Level> {
        Some(match code {
            0 => Level::Raid0,
            1 => Level::Raid1,
            10 => Level::Raid10,
            5 => Level::Raid5,
            6 => Level::Raid6,
            _ => return None,
        })
    }

    /// Parity chunks per stripe (RAID 5: P; RAID 6: P and Q).
    pub fn parity_chunks(self) -> usize {
        match self {
            Level::Raid5 => 1,
            Level::Raid6 => 2,
            _ => 0,
        }
    }

    pub fn is_parity(self) -> bool {
        self.parity_chunks() > 0
    }

    pub fn is_mirror(self) -> bool {
        matches!(self, Level::Raid1 | Level::Raid10)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raid{}", self.code())
    }
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Level, String> {
        let digits = s.trim().trim_start_matches("raid").trim_start_matches("RAID");
        digits
            .parse::<u8>()
            .ok()
            .and_then(Level::from_code)
            .ok_or_else(|| format!("unknown RAID level '{s}': use one of 0, 1, 10, 5, 6"))
    }
}

/// The shape of an array: level, member count, stripe unit and per-drive data size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub level: Level,
    pub drives: usize,
    pub stripe_unit_bytes: u32,
    /// Bytes of each drive's data area that hold stripes (a multiple of the stripe unit).
    pub data_bytes_per_drive: u64,
}

/// One data chunk's place in a stripe: the drives holding it (one, or the mirror copies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copies {
    drives: [u8; 2],
    count: u8,
    all_drives: bool,
}

impl Geometry {
    pub fn new(
        level: Level,
        drives: usize,
        stripe_unit_bytes: u32,
        data_bytes_per_drive: u64,
    ) -> Result<Geometry, RaidError> {
        let invalid = |msg: String| Err(RaidError::InvalidConfig(msg));
        if !(ARRAY_DRIVES_MIN..=ARRAY_DRIVES_MAX).contains(&drives) {
            return invalid(format!(
                "{drives} drives: an array takes {ARRAY_DRIVES_MIN} to {ARRAY_DRIVES_MAX}"
            ));
        }
        let min_drives = match level {
            Level::Raid0 | Level::Raid1 => 2,
            Level::Raid5 => 3,
            Level::Raid6 | Level::Raid10 => 4,
        };
        if drives < min_drives {
            return invalid(format!("{level} needs at least {min_drives} drives, got {drives}"));
        }
        if level == Level::Raid10 && drives % 2 != 0 {
            return invalid(format!("raid10 needs an even number of drives, got {drives}"));
        }
        if !(STRIPE_UNIT_BYTES_MIN..=STRIPE_UNIT_BYTES_MAX).contains(&stripe_unit_bytes)
            || !stripe_unit_bytes.is_power_of_two()
        {
            return invalid(format!(
                "stripe unit {stripe_unit_bytes} bytes: use a power of two from 4K to 1M"
            ));
        }
        if data_bytes_per_drive < stripe_unit_bytes as u64 {
            return invalid("drives are too small to hold one stripe".to_string());
        }
        Ok(Geometry {
            level,
            drives,
            stripe_unit_bytes,
            data_bytes_per_drive: data_bytes_per_drive / stripe_unit_bytes as u64
                * stripe_unit_bytes as u64,
        })
    }

    pub fn unit(&self) -> u64 {
        self.stripe_unit_bytes as u64
    }

    /// Data chunks per stripe.
    pub fn data_chunks(&self) -> usize {
        match self.level {
            Level::Raid0 => self.drives,
            Level::Raid1 => 1,
            Level::Raid10 => self.drives / 2,
            Level::Raid5 => self.drives - 1,
            Level::Raid6 => self.drives - 2,
        }
    }

    pub fn stripes(&self) -> u64 {
        self.data_bytes_per_drive / self.unit()
    }

    pub fn stripe_data_bytes(&self) -> u64 {
        self.unit() * self.data_chunks() as u64
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.stripes() * self.stripe_data_bytes()
    }

    /// How many drives may be lost without losing data.
    pub fn tolerated_failures(&self) -> usize {
        match self.level {
            Level::Raid0 => 0,
            Level::Raid1 => self.drives - 1,
            Level::Raid10 => 1, // at least one; more if the losses hit different pairs
            Level::Raid5 => 1,
            Level::Raid6 => 2,
        }
    }

    /// The drive holding P of `stripe` (parity levels only).
    pub fn p_drive(&self, stripe: u64) -> usize {
        debug_assert!(self.level.is_parity());
        self.drives - 1 - (stripe % self.drives as u64) as usize
    }

    pub fn q_drive(&self, stripe: u64) -> Option<usize> {
        (self.level == Level::Raid6).then(|| (self.p_drive(stripe) + 1) % self.drives)
    }

    /// The drives holding data chunk `index` of `stripe`.
    pub fn data_drives(&self, stripe: u64, index: usize) -> Copies {
        debug_assert!(index < self.data_chunks());
        let one = |d: usize| Copies { drives: [d as u8, 0], count: 1, all_drives: false };
        match self.level {
            Level::Raid0 => one(index),
            Level::Raid1 => Copies { drives: [0, 0], count: self.drives as u8, all_drives: true },
            Level::Raid10 => Copies {
                drives: [2 * index as u8, 2 * index as u8 + 1],
                count: 2,
                all_drives: false,
            },
            Level::Raid5 => one((self.p_drive(stripe) + 1 + index) % self.drives),
            Level::Raid6 => one((self.p_drive(stripe) + 2 + index) % self.drives),
        }
    }

    /// For parity levels: the drive of every stripe member, data chunks first, then P, then Q.
    /// This is the order the parity kernels take.
    pub fn members(&self, stripe: u64) -> Vec<usize> {
        debug_assert!(self.level.is_parity());
        let mut members: Vec<usize> =
            (0..self.data_chunks()).map(|i| self.data_drives(stripe, i).first()).collect();
        members.push(self.p_drive(stripe));
        members.extend(self.q_drive(stripe));
        members
    }

    /// Splits an array byte range into pieces that each lie in one data chunk.
    pub fn split(&self, offset: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        let unit = self.unit();
        let k = self.data_chunks() as u64;
        let mut pos = offset;
        let end = offset + len;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let chunk_no = pos / unit;
            let in_chunk = pos % unit;
            let take = (unit - in_chunk).min(end - pos);
            let piece = Piece {
                stripe: chunk_no / k,
                index: (chunk_no % k) as usize,
                offset_in_chunk: in_chunk,
                len: take,
                array_offset: pos,
            };
            pos += take;
            Some(piece)
        })
    }

    /// The byte offset inside a drive's data area where `stripe` begins.
    pub fn drive_offset(&self, stripe: u64) -> u64 {
        stripe * self.unit()
    }
}

impl Copies {
    pub fn first(&self) -> usize {
        self.drives[0] as usize
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let all = self.all_drives;
        (0..self.count as usize).map(move |i| if all { i } else { self.drives[i] as usize })
    }
}

/// A run of bytes inside one data chunk of one stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub stripe: u64,
    pub index: usize,
    pub offset_in_chunk: u64,
    pub len: u64,
    pub array_offset: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(level: Level, drives: usize) -> Geometry {
        Geometry::new(level, drives, 64 * 1024, 64 * 1024 * 100).unwrap()
    }

    #[test]
    fn every_stripe_places_each_member_on_a_distinct_drive() {
        for (level, n) in
            [(Level::Raid5, 3), (Level::Raid5, 7), (Level::Raid6, 4), (Level::Raid6, 24)]
        {
            let g = geometry(level, n);
            for stripe in 0..(3 * n as u64) {
                let mut members = g.members(stripe);
                assert_eq!(members.len(), n);
                members.sort();
                members.dedup();
                assert_eq!(members.len(), n, "{level} stripe {stripe}");
            }
        }
    }

    #[test]
    fn raid5_parity_rotates_left_symmetric_like_md() {
        let g = geometry(Level::Raid5, 4);
        // md left-symmetric: P on the last drive first, then moving left; data starts after P.
        assert_eq!(g.members(0), vec![0, 1, 2, 3]);
        assert_eq!(g.members(1), vec![3, 0, 1, 2]);
        assert_eq!(g.members(2), vec![2, 3, 0, 1]);
    }

    #[test]
    fn split_covers_the_range_exactly_once() {
        let g = geometry(Level::Raid6, 6);
        let pieces: Vec<Piece> = g.split(60 * 1024, 300 * 1024).collect();
        assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), 300 * 1024);
        assert_eq!(pieces[0].offset_in_chunk, 60 * 1024);
        assert_eq!(pieces[1].index, 1);
        assert_eq!(pieces.last().unwrap().stripe, 1);
        let mut pos = 60 * 1024;
        for p in &pieces {
            assert_eq!(p.array_offset, pos);
            pos += p.len;
        }
    }

    #[test]
    fn bad_shapes_are_refused_with_a_reason() {
        assert!(Geometry::new(Level::Raid6, 3, 65536, 1 << 30).is_err());
        assert!(Geometry::new(Level::Raid10, 5, 65536, 1 << 30).is_err());
        assert!(Geometry::new(Level::Raid0, 25, 65536, 1 << 30).is_err());
        assert!(Geometry::new(Level::Raid5, 4, 3000, 1 << 30).is_err());
        assert!(Geometry::new(Level::Raid5, 4, 2 << 20, 1 << 30).is_err());
        assert_eq!("raid6".parse::<Level>(), Ok(Level::Raid6));
        assert!("7".parse::<Level>().is_err());
    }

    #[test]
    fn capacity_counts_only_data_chunks() {
        assert_eq!(geometry(Level::Raid6, 6).capacity_bytes(), 4 * 64 * 1024 * 100);
        assert_eq!(geometry(Level::Raid10, 4).capacity_bytes(), 2 * 64 * 1024 * 100);
        assert_eq!(geometry(Level::Raid1, 3).capacity_bytes(), 64 * 1024 * 100);
    }
}
