//! Types shared by every Stria crate: ids, limits and stable status codes.
//!
//! This crate owns no I/O and depends on little (serde, and crc-fast for CRC32C); both sides of
//! every wire and every on-disk format import it, so a number defined here means the same thing
//! everywhere.

use std::fmt;

pub use checksum::{crc32c, crc32c_append};

pub mod checksum;
pub mod fs;
pub mod mgmt;
pub mod net;
pub mod wire;

/// The size of the logical block every Stria device and array exposes. Reads and writes are
/// multiples of it, at multiples of it; checksums cover exactly one block.
pub const BLOCK_BYTES: usize = 4096;

/// Smallest and largest RAID stripe unit (the contiguous bytes placed on one drive per stripe).
pub const STRIPE_UNIT_BYTES_MIN: u32 = 4 * 1024;
pub const STRIPE_UNIT_BYTES_MAX: u32 = 1024 * 1024;
/// Fewest and most drives in one RAID array (spares not counted).
pub const ARRAY_DRIVES_MIN: usize = 2;
pub const ARRAY_DRIVES_MAX: usize = 24;
/// Most hot spares one array records in its superblock.
pub const ARRAY_SPARES_MAX: usize = 8;

const _: () = assert!(STRIPE_UNIT_BYTES_MIN as usize % BLOCK_BYTES == 0);
const _: () = assert!(STRIPE_UNIT_BYTES_MAX.is_power_of_two());

/// A 128-bit identifier for drives and arrays, random at creation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    pub const NIL: Uuid = Uuid([0; 16]);

    /// A fresh random id (version 4 layout) read from the kernel's random source.
    pub fn random() -> Uuid {
        let mut bytes = [0u8; 16];
        // getrandom(2) never fails for 16 bytes once the pool is initialised; a failure here
        // means the machine cannot produce ids at all, which is fatal for creating anything.
        let read = unsafe { libc_getrandom(bytes.as_mut_ptr(), bytes.len()) };
        assert_eq!(read, 16, "getrandom failed: cannot generate a uuid");
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        Uuid(bytes)
    }

    pub fn is_nil(&self) -> bool {
        *self == Uuid::NIL
    }
}

unsafe extern "C" {
    #[link_name = "getrandom"]
    fn getrandom_c(buf: *mut u8, len: usize, flags: u32) -> isize;
}

unsafe fn libc_getrandom(buf: *mut u8, len: usize) -> isize {
    // SAFETY: the caller passes a valid writable buffer of `len` bytes.
    unsafe { getrandom_c(buf, len, 0) }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(
            f,
            "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
            b[0],
            b[1],
            b[2],
            b[3],
            b[4],
            b[5],
            b[6],
            b[7],
            b[8],
            b[9],
            b[10],
            b[11],
            b[12],
            b[13],
            b[14],
            b[15]
        )
    }
}

impl fmt::Debug for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Uuid({self})")
    }
}

/// The position of a drive inside an array (0-based; spares use slots after the members).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct Slot(pub u16);

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_uuids_differ_and_carry_version_bits() {
        let a = Uuid::random();
        let b = Uuid::random();
        assert_ne!(a, b);
        assert_eq!(a.0[6] >> 4, 4);
        assert_eq!(a.to_string().len(), 36);
    }
}
