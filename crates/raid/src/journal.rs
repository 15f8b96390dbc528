//! The stripe journal that closes the RAID 5/6 write hole.
//!
//! Before a partial-stripe write touches a drive in place, the new contents of every chunk range
//! it will write (data and parity) go as one record, with FUA, into the journal rings of
//! `parity + 1` members, so the record survives any loss the level tolerates. After a crash the
//! valid records are replayed in sequence order, which makes each interrupted stripe consistent
//! with its new contents whatever was torn, and a missing drive's chunks then reconstruct
//! correctly. Full-stripe writes skip the journal: all of their data was in flight, so a torn
//! full stripe can only damage data that was being written. A flush retires every record (the
//! in-place writes are durable) by moving the array to a new random journal epoch.
//!
//! Records are found at recovery by scanning every 4 KiB block of each ring: a record header must
//! carry the array uuid and the current epoch (neither is visible to users of the array) and
//! pass two checksums, so neither stale records nor user data can pass for a record.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use stria_io::AlignedBuf;
use stria_proto::{BLOCK_BYTES, Uuid};

const RECORD_MAGIC: [u8; 8] = *b"STRIAJR\x01";
const HEADER_BYTES: usize = BLOCK_BYTES;
/// Most chunk ranges in one record: every member of the widest stripe.
pub const RECORD_ENTRIES_MAX: usize = stria_proto::ARRAY_DRIVES_MAX;
const ENTRY_BYTES: usize = 16;
const ENTRIES_OFFSET: usize = 64;
const _: () = assert!(ENTRIES_OFFSET + RECORD_ENTRIES_MAX * ENTRY_BYTES + 8 <= HEADER_BYTES);

/// One chunk range of a record: rows `[row, row + rows)` of `drive`'s chunk in `stripe`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub drive: u16,
    pub row: u32,
    pub rows: u32,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub stripe: u64,
    pub entries: Vec<Entry>,
    /// The entries' new contents, concatenated in entry order.
    pub payload: Vec<u8>,
}

pub fn record_bytes(payload_bytes: usize) -> usize {
    HEADER_BYTES + payload_bytes
}

/// Encodes a record as one aligned buffer: header block then payload.
pub fn encode(
    array: Uuid,
    epoch: u64,
    seq: u64,
    stripe: u64,
    entries: &[Entry],
    payload: &[&[u8]],
) -> AlignedBuf {
    assert!(entries.len() <= RECORD_ENTRIES_MAX);
    let payload_bytes: usize = payload.iter().map(|p| p.len()).sum();
    debug_assert_eq!(
        payload_bytes,
        entries.iter().map(|e| e.rows as usize * BLOCK_BYTES).sum::<usize>()
    );
    let mut buf = AlignedBuf::zeroed(record_bytes(payload_bytes));
    let mut at = HEADER_BYTES;
    let mut payload_crc = 0u32;
    for part in payload {
        buf[at..at + part.len()].copy_from_slice(part);
        payload_crc = stria_proto::crc32c_append(payload_crc, part);
        at += part.len();
    }
    let h = &mut buf[..HEADER_BYTES];
    h[0..8].copy_from_slice(&RECORD_MAGIC);
    h[8..24].copy_from_slice(&array.0);
    h[24..32].copy_from_slice(&epoch.to_le_bytes());
    h[32..40].copy_from_slice(&seq.to_le_bytes());
    h[40..48].copy_from_slice(&stripe.to_le_bytes());
    h[48..56].copy_from_slice(&(payload_bytes as u64).to_le_bytes());
    h[56..58].copy_from_slice(&(entries.len() as u16).to_le_bytes());
    h[60..64].copy_from_slice(&payload_crc.to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        let at = ENTRIES_OFFSET + i * ENTRY_BYTES;
        h[at..at + 2].copy_from_slice(&e.drive.to_le_bytes());
        h[at + 4..at + 8].copy_from_slice(&e.row.to_le_bytes());
        h[at + 8..at + 12].copy_from_slice(&e.rows.to_le_bytes());
    }
    let crc = stria_proto::crc32c(&h[..HEADER_BYTES - 4]);
    h[HEADER_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
    buf
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// Finds every valid record of `epoch` in one drive's ring image.
pub fn scan(ring: &[u8], array: Uuid, epoch: u64) -> Vec<Record> {
    let mut records = Vec::new();
    let mut at = 0;
    while at + HEADER_BYTES <= ring.len() {
        let h = &ring[at..at + HEADER_BYTES];
        let parsed = (|| {
            if h[0..8] != RECORD_MAGIC || h[8..24] != array.0 || u64_at(h, 24) != epoch {
                return None;
            }
            if u32_at(h, HEADER_BYTES - 4) != stria_proto::crc32c(&h[..HEADER_BYTES - 4]) {
                return None;
            }
            let payload_bytes = usize::try_from(u64_at(h, 48)).ok()?;
            let count = u16::from_le_bytes([h[56], h[57]]) as usize;
            // The declared length is the disk's word: add it without trusting it not to wrap.
            let end = (at + HEADER_BYTES).checked_add(payload_bytes)?;
            if count > RECORD_ENTRIES_MAX || end > ring.len() {
                return None;
            }
            let entries: Vec<Entry> = (0..count)
                .map(|i| {
                    let e = ENTRIES_OFFSET + i * ENTRY_BYTES;
                    Entry {
                        drive: u16::from_le_bytes([h[e], h[e + 1]]),
                        row: u32_at(h, e + 4),
                        rows: u32_at(h, e + 8),
                    }
                })
                .collect();
            let declared: usize = entries.iter().map(|e| e.rows as usize * BLOCK_BYTES).sum();
            if declared != payload_bytes {
                return None;
            }
            let payload = &ring[at + HEADER_BYTES..at + HEADER_BYTES + payload_bytes];
            if stria_proto::crc32c(payload) != u32_at(h, 60) {
                return None;
            }
            Some(Record {
                seq: u64_at(h, 32),
                stripe: u64_at(h, 40),
                entries,
                payload: payload.to_vec(),
            })
        })();
        match parsed {
            Some(record) => {
                at += record_bytes(record.payload.len());
                records.push(record);
            }
            None => at += BLOCK_BYTES,
        }
    }
    records
}

/// Space reservation in one drive's ring. Positions are handed out without locks; a write that
/// does not fit forces a checkpoint (flush + new epoch), after which the ring starts over.
#[derive(Debug, Default)]
pub struct Ring {
    head: AtomicU64,
}

impl Ring {
    pub fn reserve(&self, bytes: u64, ring_bytes: u64) -> Option<u64> {
        let start = self.head.fetch_add(bytes, Relaxed);
        (start + bytes <= ring_bytes).then_some(start)
    }

    pub fn reset(&self) {
        self.head.store(0, Relaxed);
    }

    pub fn used(&self) -> u64 {
        self.head.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_found_among_garbage_and_stale_epochs() {
        let array = Uuid::random();
        let entries = [Entry { drive: 2, row: 3, rows: 1 }, Entry { drive: 5, row: 3, rows: 2 }];
        let a = vec![0xaa; 4096];
        let b = vec![0xbb; 8192];
        let r1 = encode(array, 77, 1, 10, &entries, &[&a, &b]);
        let stale = encode(array, 76, 2, 11, &entries, &[&a, &b]);
        let foreign = encode(Uuid::random(), 77, 3, 12, &entries, &[&a, &b]);
        let mut ring = vec![0x5a; 4096];
        ring.extend_from_slice(&r1);
        ring.extend_from_slice(&stale);
        ring.extend_from_slice(&foreign);
        let mut torn = encode(array, 77, 4, 13, &entries, &[&a, &b]).to_vec();
        torn[HEADER_BYTES + 10] ^= 1;
        ring.extend_from_slice(&torn);
        let found = scan(&ring, array, 77);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].seq, 1);
        assert_eq!(found[0].stripe, 10);
        assert_eq!(found[0].entries, entries);
        assert_eq!(&found[0].payload[..4096], &a[..]);
    }

    /// Found by the `raid_journal` fuzz target: a header (with a valid CRC) declaring a
    /// payload of nearly 2^64 bytes overflowed the bounds check instead of being skipped.
    #[test]
    fn a_header_declaring_an_enormous_payload_is_skipped() {
        let array = Uuid::random();
        let entries = [Entry { drive: 1, row: 0, rows: 1 }];
        let good = encode(array, 9, 1, 2, &entries, &[&[0x33; 4096]]);
        let mut forged = good.to_vec();
        forged[48..56].copy_from_slice(&(u64::MAX - 255).to_le_bytes());
        let crc = stria_proto::crc32c(&forged[..HEADER_BYTES - 4]);
        forged[HEADER_BYTES - 4..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
        let mut ring = forged;
        ring.extend_from_slice(&good);
        let found = scan(&ring, array, 9);
        assert_eq!(found.len(), 1, "only the honest record is found");
        assert_eq!(found[0].seq, 1);
    }

    #[test]
    fn ring_refuses_what_does_not_fit() {
        let ring = Ring::default();
        assert_eq!(ring.reserve(4096, 10000), Some(0));
        assert_eq!(ring.reserve(4096, 10000), Some(4096));
        assert_eq!(ring.reserve(4096, 10000), None);
        ring.reset();
        assert_eq!(ring.reserve(8192, 10000), Some(0));
    }
}
