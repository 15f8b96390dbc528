//! On-disk records read back: a drive's RAID superblock, the RAID stripe journal, the engine's
//! superblock and chunk records, and the metadata service's inode records. Whatever a damaged
//! or forged disk holds, decoding returns an error or a value that encodes and decodes back to
//! itself and that the code reading it can use without panicking.

use stria_engine::record::{ChunkRecord, blocks_for};
use stria_engine::superblock::Superblock as EngineSuperblock;
use stria_meta::FileKind;
use stria_meta::record::{Body, FileData, Inode, extension_of};
use stria_proto::Uuid;
use stria_raid::journal;
use stria_raid::superblock::{SUPERBLOCK_BYTES, Superblock};

use crate::mode_and_rest;

const BLOCK: usize = stria_proto::BLOCK_BYTES;

/// Input: one mode byte, then the 4 KiB label (shorter input is zero-padded). Mode bit 0:
/// recompute the label's CRC so mutations reach the field checks behind it.
pub fn drive_superblock(data: &[u8]) {
    let (mode, label) = mode_and_rest(data);
    let mut b = label.to_vec();
    if mode & 1 == 1 {
        b.resize(b.len().max(SUPERBLOCK_BYTES), 0);
        let crc = crc32c::crc32c(&b[..SUPERBLOCK_BYTES - 4]);
        b[SUPERBLOCK_BYTES - 4..SUPERBLOCK_BYTES].copy_from_slice(&crc.to_le_bytes());
    }
    let Ok(sb) = Superblock::decode(&b) else { return };
    let again = sb.encode();
    assert_eq!(Superblock::decode(&again).as_ref(), Ok(&sb), "label does not survive a rewrite");
    // Assembly sizes buffers and bitmaps from the layout and adds its fields up; a label that
    // decodes must describe a drive those sums fit.
    let l = &sb.layout;
    let end = |offset: u64, bytes: u64| offset.checked_add(bytes);
    let regions = [
        (l.bitmap_offset, l.bitmap_bytes),
        (l.journal_offset, l.journal_bytes),
        (l.crc_offset, l.crc_bytes),
        (l.data_offset, l.data_bytes),
    ];
    let mut previous_end = SUPERBLOCK_BYTES as u64;
    for (offset, bytes) in regions {
        assert!(offset >= previous_end, "layout regions overlap or precede the label: {l:?}");
        previous_end = end(offset, bytes).unwrap_or_else(|| panic!("layout overflows: {l:?}"));
    }
    assert_eq!(l.min_capacity(), previous_end);
    let regions_needed = l.data_bytes.div_ceil(l.bitmap_region_bytes);
    assert!(
        l.bitmap_bytes.checked_mul(8).is_some_and(|bits| regions_needed <= bits),
        "the bitmap does not cover the data area: {l:?}"
    );
    assert!(l.bitmap_bytes <= stria_raid::superblock::BITMAP_BYTES, "oversized bitmap: {l:?}");
}

/// The array uuid and epoch the journal seeds are written with.
pub const JOURNAL_ARRAY: Uuid = Uuid([0x5a; 16]);
pub const JOURNAL_EPOCH: u64 = 7;

/// Input: one mode byte, then a journal ring image. Mode bit 0: recompute the header and
/// payload CRCs of every block that starts with the record magic.
pub fn raid_journal(data: &[u8]) {
    let (mode, ring) = mode_and_rest(data);
    let mut ring = ring.to_vec();
    if mode & 1 == 1 {
        fix_journal_crcs(&mut ring);
    }
    let records = journal::scan(&ring, JOURNAL_ARRAY, JOURNAL_EPOCH);
    let mut total = 0usize;
    for record in &records {
        assert!(record.entries.len() <= journal::RECORD_ENTRIES_MAX);
        let declared: usize = record.entries.iter().map(|e| e.rows as usize * BLOCK).sum();
        assert_eq!(declared, record.payload.len(), "payload length disagrees with the entries");
        total += journal::record_bytes(record.payload.len());
        let again = journal::encode(
            JOURNAL_ARRAY,
            JOURNAL_EPOCH,
            record.seq,
            record.stripe,
            &record.entries,
            &[&record.payload],
        );
        let back = journal::scan(&again, JOURNAL_ARRAY, JOURNAL_EPOCH);
        assert_eq!(back.as_slice(), std::slice::from_ref(record), "record does not re-encode");
    }
    assert!(total <= ring.len(), "records cover {total} bytes of a {}-byte ring", ring.len());
}

fn fix_journal_crcs(ring: &mut [u8]) {
    let mut at = 0usize;
    while at + BLOCK <= ring.len() {
        if ring[at..at + 8] == *b"STRIAJR\x01" {
            let declared = u64::from_le_bytes(ring[at + 48..at + 56].try_into().expect("8 bytes"));
            let payload_end = usize::try_from(declared)
                .ok()
                .and_then(|p| (at + BLOCK).checked_add(p))
                .filter(|&end| end <= ring.len());
            if let Some(end) = payload_end {
                let crc = crc32c::crc32c(&ring[at + BLOCK..end]);
                ring[at + 60..at + 64].copy_from_slice(&crc.to_le_bytes());
            }
            let crc = crc32c::crc32c(&ring[at..at + BLOCK - 4]);
            ring[at + BLOCK - 4..at + BLOCK].copy_from_slice(&crc.to_le_bytes());
        }
        at += BLOCK;
    }
}

/// Input: one mode byte, then a record. Mode bit 0 clear: an engine chunk record (the
/// chunk map's value); set: the engine superblock (block 0 of the array), with bit 1 asking
/// for its CRC to be recomputed first.
pub fn engine_records(data: &[u8]) {
    let (mode, bytes) = mode_and_rest(data);
    if mode & 1 == 0 {
        chunk_record(bytes);
    } else {
        engine_superblock(bytes, mode & 2 != 0);
    }
}

fn chunk_record(bytes: &[u8]) {
    let Ok(record) = ChunkRecord::decode(bytes) else { return };
    assert_eq!(record.blocks.len(), blocks_for(record.len_bytes as u64) as usize);
    let mapped = record.mapped_blocks();
    let logical: u64 = record.mapped_runs().iter().map(|&(_, n)| n as u64).sum();
    let physical: u64 = record.physical_runs().iter().map(|&(_, n)| n).sum();
    assert_eq!((logical, physical), (mapped, mapped), "runs disagree with the mapped blocks");
    let again = record.encode();
    assert!(
        again.len() <= bytes.len(),
        "record grows from {} to {} bytes",
        bytes.len(),
        again.len()
    );
    assert_eq!(ChunkRecord::decode(&again).as_ref(), Ok(&record), "record does not re-encode");
}

fn engine_superblock(bytes: &[u8], fix_crc: bool) {
    let mut b = bytes.to_vec();
    if fix_crc && b.len() == BLOCK {
        let crc = crc32c::crc32c(&b[..BLOCK - 4]);
        b[BLOCK - 4..].copy_from_slice(&crc.to_le_bytes());
    }
    let Ok(sb) = EngineSuperblock::decode(&b) else { return };
    let again = sb.encode();
    assert_eq!(again[..64], b[..64], "superblock fields re-encode differently");
    assert_eq!(EngineSuperblock::decode(&again), Ok(sb), "superblock does not re-encode");
}

/// Input: one mode byte, then an inode record (the `inodes` table's value). The mode byte is
/// also used as a dentry's kind code, and the record bytes as a name for the extension rule.
pub fn meta_records(data: &[u8]) {
    let (mode, bytes) = mode_and_rest(data);
    if let Some(kind) = FileKind::from_code(mode) {
        assert_eq!(kind.code(), mode, "dentry kind code does not round-trip");
    }
    let ext = extension_of(bytes);
    assert!(ext.len() <= stria_meta::EXTENSION_BYTES_MAX, "extension {ext:?} too long");
    assert!(ext.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()), "extension {ext:?}");

    let ino = u64::from(mode) + 1;
    let Ok(inode) = Inode::decode(ino, bytes) else { return };
    let again = inode.encode().expect("a decoded inode encodes");
    assert!(
        again.len() <= bytes.len(),
        "inode grows from {} to {} bytes",
        bytes.len(),
        again.len()
    );
    assert_eq!(Inode::decode(ino, &again).expect("re-encoded inode decodes"), inode);
    let attr = inode.attr(ino);
    assert_eq!((attr.ino, attr.kind, attr.size), (ino, inode.kind, inode.size));
    let chunked = matches!(inode.body, Body::File(FileData::Chunked(_)));
    assert_eq!(attr.layout.is_some(), chunked, "layout shown iff the file is chunked");
}
