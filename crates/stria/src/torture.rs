//! `stria raid torture`: the crash test's writer and verifier.
//!
//! The writer runs a deterministic sequence of ops (op `seq` = 1, 2, 3, ...), each writing a run
//! of self-describing blocks, flushes every `--flush-every` ops and then prints `ack N`: every op
//! up to N is durable. It runs until killed. The verifier regenerates the same sequence and checks
//! that every block holds either zeros (never written by an acknowledged op) or exactly the
//! content some op of the sequence wrote there, no older than the last acknowledged op that
//! wrote it. A lost, torn, misdirected or corrupted write therefore fails the check.
//!
//! Block format (4096 bytes): `"STRTORT1"`, block index (u64 LE), version = op seq (u64 LE),
//! CRC32C of bytes 32..4096 (u32 LE), 4 zero bytes, then 4064 bytes from a generator seeded by
//! (seed, block, version).

use std::io::Write;

use anyhow::{Context, Result, anyhow};
use clap::Args;
use stria_proto::BLOCK_BYTES;
use stria_raid::Array;

use crate::raid_cmd::{Drives, with_array};
use crate::rng::SplitMix64;
use crate::usage;

const BLOCK: u64 = BLOCK_BYTES as u64;
const MAGIC: [u8; 8] = *b"STRTORT1";
const HEADER_BYTES: usize = 32;
const CRC_AT: usize = 24;
/// The longest run one op may write: bounds the writer's buffer to 4 MiB.
const RUN_BLOCKS_MAX: u64 = 1024;
/// Blocks read per array request by the verifier.
const VERIFY_BATCH_BLOCKS: u64 = 256;
/// Most bad blocks described individually; the rest are counted.
const BAD_REPORTED_MAX: usize = 10;
/// Separates the op stream from the per-block content streams of the same seed.
const OP_STREAM_TAG: u64 = 0x4f50_5354_5245_414d; // "OPSTREAM"

const _: () =
    assert!(HEADER_BYTES <= BLOCK_BYTES && (BLOCK_BYTES - HEADER_BYTES).is_multiple_of(8));

#[derive(Args, Debug)]
pub struct TortureArgs {
    /// Seed of the op sequence and of the block contents.
    #[arg(long)]
    seed: u64,
    /// Number of 4 KiB blocks, from the start of the array, that the ops write.
    #[arg(long)]
    blocks: u64,
    /// Longest run of blocks one op writes.
    #[arg(long, default_value_t = 16)]
    max_run: u64,
    /// Ops between flushes; `ack N` is printed after each flush.
    #[arg(long, default_value_t = 8)]
    flush_every: u64,
    /// Verify the blocks instead of writing them.
    #[arg(long)]
    verify: bool,
    /// With --verify: the last `ack N` the writer printed (0 if none).
    #[arg(long, required_if_eq("verify", "true"))]
    acked: Option<u64>,
    /// With --verify: how many ops past --acked the writer may have issued before it died.
    #[arg(long, default_value_t = 100_000)]
    lookahead: u64,
    /// With --verify, on RAID 5/6 recovered with a drive missing: the data blocks of one stripe.
    /// A full-stripe write in flight at the crash is not journaled, so the missing drive's part
    /// of such a stripe may rebuild to bytes that are neither old nor new (docs/internals/raid.md
    /// §9). Blocks of whole stripes that an op after --acked wrote whole are then not judged; the
    /// ops in flight are the 2 x --flush-every after the ack.
    #[arg(long)]
    torn_stripe_blocks: Option<u64>,
    #[command(flatten)]
    drives: Drives,
}

/// One op: write blocks `start..start + len` with version `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Op {
    seq: u64,
    start: u64,
    len: u64,
}

/// The op sequence of a seed: endless, the same on every run.
struct OpStream {
    rng: SplitMix64,
    blocks: u64,
    max_run: u64,
    seq: u64,
}

impl OpStream {
    fn new(seed: u64, blocks: u64, max_run: u64) -> OpStream {
        assert!(blocks > 0 && max_run > 0, "validated by the caller");
        OpStream { rng: SplitMix64::from_parts(&[seed, OP_STREAM_TAG]), blocks, max_run, seq: 0 }
    }
}

impl Iterator for OpStream {
    type Item = Op;
    fn next(&mut self) -> Option<Op> {
        self.seq += 1;
        let start = self.rng.below(self.blocks);
        let run = 1 + self.rng.below(self.max_run);
        Some(Op { seq: self.seq, start, len: run.min(self.blocks - start) })
    }
}

/// The content op `version` writes to `block`.
fn fill_block(seed: u64, block: u64, version: u64, out: &mut [u8]) {
    assert_eq!(out.len(), BLOCK_BYTES);
    SplitMix64::from_parts(&[seed, block, version]).fill(&mut out[HEADER_BYTES..]);
    out[..8].copy_from_slice(&MAGIC);
    out[8..16].copy_from_slice(&block.to_le_bytes());
    out[16..24].copy_from_slice(&version.to_le_bytes());
    let crc = stria_proto::crc32c(&out[HEADER_BYTES..]);
    out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    out[CRC_AT + 4..HEADER_BYTES].fill(0);
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// What a correct block may hold.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Zeros, and no acknowledged op wrote the block.
    NeverWritten,
    /// The content of the last acknowledged op that wrote it.
    Current,
    /// The content of a later op (issued but not yet acknowledged when the writer died).
    Newer,
    /// Neither old nor new, in a stripe that a full-stripe write in flight was replacing whole
    /// (allowed only with --torn-stripe-blocks).
    TornInFlight,
}

/// What the verifier knows: the ops the writer may have issued and, per block, the last
/// acknowledged op that wrote it.
struct Expectations {
    seed: u64,
    acked: u64,
    /// `ops[seq - 1]`, for seq up to acked + lookahead.
    ops: Vec<Op>,
    /// Per block: the last op <= acked that wrote it (0: none).
    last_acked_writer: Vec<u64>,
    /// Per block: whether a torn full-stripe write in flight may have left any bytes there.
    torn_in_flight: Vec<bool>,
}

impl Expectations {
    fn new(seed: u64, blocks: u64, max_run: u64, acked: u64, lookahead: u64) -> Expectations {
        let horizon = acked.saturating_add(lookahead);
        let ops: Vec<Op> = OpStream::new(seed, blocks, max_run).take(horizon as usize).collect();
        let mut last_acked_writer = vec![0u64; blocks as usize];
        for op in ops.iter().take(acked as usize) {
            for b in op.start..op.start + op.len {
                last_acked_writer[b as usize] = op.seq;
            }
        }
        let torn_in_flight = vec![false; blocks as usize];
        Expectations { seed, acked, ops, last_acked_writer, torn_in_flight }
    }

    /// Marks the blocks of every whole stripe of `stripe_blocks` that one of the ops after the
    /// ack, up to `in_flight` of them, wrote whole.
    fn allow_torn_full_stripes(&mut self, stripe_blocks: u64, in_flight: u64) {
        let from = self.acked as usize;
        let to = (self.acked.saturating_add(in_flight) as usize).min(self.ops.len());
        for op in &self.ops[from.min(to)..to] {
            let first_stripe = op.start.div_ceil(stripe_blocks);
            let end_stripe = (op.start + op.len) / stripe_blocks;
            for stripe in first_stripe..end_stripe {
                let blocks = stripe * stripe_blocks..(stripe + 1) * stripe_blocks;
                for b in blocks {
                    self.torn_in_flight[b as usize] = true;
                }
            }
        }
    }

    /// Judges the 4096 bytes read from `block`; the error describes what is wrong.
    fn classify(&self, block: u64, data: &[u8]) -> Result<Verdict, String> {
        let verdict = self.judge(block, data);
        if verdict.is_err() && self.torn_in_flight[block as usize] {
            return Ok(Verdict::TornInFlight);
        }
        verdict
    }

    fn judge(&self, block: u64, data: &[u8]) -> Result<Verdict, String> {
        let acked_writer = self.last_acked_writer[block as usize];
        if data.iter().all(|&b| b == 0) {
            return if acked_writer == 0 {
                Ok(Verdict::NeverWritten)
            } else {
                Err(format!(
                    "block {block} reads as zeros, but op {acked_writer} wrote it and was acknowledged (ack {})",
                    self.acked
                ))
            };
        }
        if data[..8] != MAGIC {
            return Err(format!(
                "block {block} is not a torture block (first bytes {:02x?})",
                &data[..8]
            ));
        }
        let stored_block = le_u64(&data[8..16]);
        let version = le_u64(&data[16..24]);
        if stored_block != block {
            return Err(format!(
                "block {block} holds block {stored_block}'s content (version {version}): a misdirected write"
            ));
        }
        let stored_crc = u32::from_le_bytes([
            data[CRC_AT],
            data[CRC_AT + 1],
            data[CRC_AT + 2],
            data[CRC_AT + 3],
        ]);
        let crc = stria_proto::crc32c(&data[HEADER_BYTES..]);
        if stored_crc != crc {
            return Err(format!(
                "block {block} (version {version}) is torn or corrupt: body CRC32C {crc:#010x}, header says {stored_crc:#010x}"
            ));
        }
        let op = match version.checked_sub(1).and_then(|i| self.ops.get(i as usize)) {
            Some(op) => op,
            None => {
                return Err(format!(
                    "block {block} has version {version}, which is not an op of the sequence (ops 1..={})",
                    self.ops.len()
                ));
            }
        };
        if !(op.start..op.start + op.len).contains(&block) {
            return Err(format!(
                "block {block} has version {version}, but op {version} wrote blocks {}..{}",
                op.start,
                op.start + op.len
            ));
        }
        if version < acked_writer {
            return Err(format!(
                "block {block} holds op {version}'s content, but op {acked_writer} wrote it later and was acknowledged (ack {}): a lost write",
                self.acked
            ));
        }
        let mut expected = vec![0u8; BLOCK_BYTES];
        fill_block(self.seed, block, version, &mut expected);
        if data != &expected[..] {
            let at = data.iter().zip(&expected).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "block {block} (version {version}) differs from op {version}'s content at byte {at}"
            ));
        }
        Ok(if version == acked_writer { Verdict::Current } else { Verdict::Newer })
    }
}

pub fn run(args: TortureArgs) -> Result<()> {
    if args.blocks == 0 {
        return Err(usage("--blocks must be at least 1"));
    }
    if !(1..=RUN_BLOCKS_MAX).contains(&args.max_run) {
        return Err(usage(format!("--max-run {} is outside 1..={RUN_BLOCKS_MAX}", args.max_run)));
    }
    if args.flush_every == 0 {
        return Err(usage("--flush-every must be at least 1"));
    }
    with_array(&args.drives.paths, |array| {
        let capacity_blocks = array.capacity_bytes() / BLOCK;
        if args.blocks > capacity_blocks {
            return Err(usage(format!(
                "--blocks {} exceeds the array's {capacity_blocks} blocks",
                args.blocks
            )));
        }
        match (args.verify, args.acked) {
            (true, Some(acked)) => verify(array, &args, acked),
            (true, None) => {
                Err(usage("--verify needs --acked N (the last `ack N` the writer printed)"))
            }
            (false, _) => write_forever(array, &args),
        }
    })
}

fn write_forever(array: &Array, args: &TortureArgs) -> Result<()> {
    let mut buf = vec![0u8; (args.max_run * BLOCK) as usize];
    let mut stdout = std::io::stdout().lock();
    for op in OpStream::new(args.seed, args.blocks, args.max_run) {
        let bytes = (op.len * BLOCK) as usize;
        for (i, block) in buf[..bytes].chunks_mut(BLOCK_BYTES).enumerate() {
            fill_block(args.seed, op.start + i as u64, op.seq, block);
        }
        array.write(op.start * BLOCK, &buf[..bytes]).with_context(|| format!("op {}", op.seq))?;
        if op.seq % args.flush_every == 0 {
            array.flush().with_context(|| format!("flush after op {}", op.seq))?;
            writeln!(stdout, "ack {}", op.seq).context("writing to stdout")?;
            stdout.flush().context("writing to stdout")?;
        }
    }
    unreachable!("the op stream never ends")
}

fn verify(array: &Array, args: &TortureArgs, acked: u64) -> Result<()> {
    let mut expect = Expectations::new(args.seed, args.blocks, args.max_run, acked, args.lookahead);
    if let Some(stripe_blocks) = args.torn_stripe_blocks {
        if stripe_blocks == 0 {
            return Err(usage("--torn-stripe-blocks must be at least 1"));
        }
        expect.allow_torn_full_stripes(stripe_blocks, 2 * args.flush_every);
    }
    let (mut current, mut newer, mut never, mut bad) = (0u64, 0u64, 0u64, Vec::new());
    let mut torn = 0u64;
    let mut bad_count = 0u64;
    let mut buf = vec![0u8; (VERIFY_BATCH_BLOCKS * BLOCK) as usize];
    let mut first = 0;
    while first < args.blocks {
        let count = VERIFY_BATCH_BLOCKS.min(args.blocks - first);
        let bytes = (count * BLOCK) as usize;
        array
            .read(first * BLOCK, &mut buf[..bytes])
            .with_context(|| format!("reading blocks {first}..{}", first + count))?;
        for (i, data) in buf[..bytes].chunks(BLOCK_BYTES).enumerate() {
            match expect.classify(first + i as u64, data) {
                Ok(Verdict::Current) => current += 1,
                Ok(Verdict::Newer) => newer += 1,
                Ok(Verdict::NeverWritten) => never += 1,
                Ok(Verdict::TornInFlight) => torn += 1,
                Err(problem) => {
                    bad_count += 1;
                    if bad.len() < BAD_REPORTED_MAX {
                        bad.push(problem);
                    }
                }
            }
        }
        first += count;
    }
    let torn = if args.torn_stripe_blocks.is_some() {
        format!(", {torn} torn in a full stripe in flight")
    } else {
        String::new()
    };
    let counts = format!(
        "verified {} blocks: {current} current, {newer} newer-than-acked, {never} never written{torn}",
        args.blocks
    );
    if bad_count == 0 {
        println!("{counts}");
        return Ok(());
    }
    println!("{counts}, {bad_count} BAD");
    for problem in bad.iter().skip(1) {
        eprintln!("also: {problem}");
    }
    Err(anyhow!("{bad_count} of {} blocks are wrong; first: {}", args.blocks, bad[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_stream_is_deterministic_and_in_range() {
        let a: Vec<Op> = OpStream::new(9, 100, 16).take(1000).collect();
        let b: Vec<Op> = OpStream::new(9, 100, 16).take(1000).collect();
        assert_eq!(a, b);
        assert_ne!(a, OpStream::new(10, 100, 16).take(1000).collect::<Vec<_>>());
        for (i, op) in a.iter().enumerate() {
            assert_eq!(op.seq, i as u64 + 1);
            assert!(op.len >= 1 && op.len <= 16 && op.start + op.len <= 100, "{op:?}");
        }
    }

    /// Plays ops 1..=written onto a flat model, as a crash after `written` ops would leave it.
    fn model(seed: u64, blocks: u64, written: u64) -> Vec<Vec<u8>> {
        let mut disk = vec![vec![0u8; BLOCK_BYTES]; blocks as usize];
        for op in OpStream::new(seed, blocks, 8).take(written as usize) {
            for b in op.start..op.start + op.len {
                fill_block(seed, b, op.seq, &mut disk[b as usize]);
            }
        }
        disk
    }

    #[test]
    fn a_correct_crash_image_verifies() {
        let (seed, blocks, acked) = (3, 64, 40);
        let expect = Expectations::new(seed, blocks, 8, acked, 1000);
        let disk = model(seed, blocks, acked + 5);
        let verdicts: Vec<Verdict> = (0..blocks)
            .map(|b| expect.classify(b, &disk[b as usize]).expect("correct block"))
            .collect();
        assert!(verdicts.contains(&Verdict::Current));
        assert!(verdicts.contains(&Verdict::Newer), "ops past the ack wrote some blocks");
    }

    #[test]
    fn lost_torn_and_misdirected_writes_are_caught() {
        let (seed, blocks, acked) = (5, 32, 30);
        let expect = Expectations::new(seed, blocks, 8, acked, 100);
        let disk = model(seed, blocks, acked);
        let b = (0..blocks)
            .find(|&b| expect.last_acked_writer[b as usize] > 1)
            .expect("some block written twice or late");
        let writer = expect.last_acked_writer[b as usize];

        // Lost: an older op's content (or zeros) where an acknowledged op wrote.
        let older = (1..writer).rev().find(|&v| {
            let op = expect.ops[(v - 1) as usize];
            (op.start..op.start + op.len).contains(&b)
        });
        if let Some(v) = older {
            let mut stale = vec![0u8; BLOCK_BYTES];
            fill_block(seed, b, v, &mut stale);
            assert!(expect.classify(b, &stale).expect_err("stale").contains("lost write"));
        }
        assert!(expect.classify(b, &vec![0u8; BLOCK_BYTES]).expect_err("zeros").contains("zeros"));

        // Torn: the body changed after the header was written.
        let mut torn = disk[b as usize].clone();
        torn[2000] ^= 1;
        assert!(expect.classify(b, &torn).expect_err("torn").contains("torn"));

        // Misdirected: another block's content.
        let mut misdirected = vec![0u8; BLOCK_BYTES];
        fill_block(seed, (b + 1) % blocks, writer, &mut misdirected);
        assert!(expect.classify(b, &misdirected).expect_err("misdirected").contains("misdirected"));

        // A version from beyond the sequence, or an op that did not touch this block.
        let mut forged = vec![0u8; BLOCK_BYTES];
        fill_block(seed, b, 10_000, &mut forged);
        assert!(
            expect.classify(b, &forged).expect_err("beyond the sequence").contains("not an op")
        );
        let untouched = (1..=expect.ops.len() as u64)
            .find(|&v| {
                let op = expect.ops[(v - 1) as usize];
                !(op.start..op.start + op.len).contains(&b)
            })
            .expect("some op misses the block");
        fill_block(seed, b, untouched, &mut forged);
        assert!(expect.classify(b, &forged).expect_err("untouched block").contains("wrote blocks"));
    }

    #[test]
    fn torn_full_stripes_are_forgiven_only_where_an_op_in_flight_wrote_them_whole() {
        let (seed, blocks, acked, stripe) = (11, 256, 60, 4);
        let mut expect = Expectations::new(seed, blocks, 16, acked, 100);
        // The first op after the ack that covers a whole stripe, and one block it does not.
        let (whole, outside) = (acked..acked + 16)
            .find_map(|i| {
                let op = expect.ops[i as usize];
                let stripe_start = op.start.div_ceil(stripe) * stripe;
                (stripe_start + stripe <= op.start + op.len).then_some((stripe_start, op))
            })
            .map(|(s, op)| (s, if op.start >= 1 { op.start - 1 } else { op.start + op.len }))
            .expect("some op in flight covers a whole stripe");
        let garbage = vec![0x5au8; BLOCK_BYTES];
        assert!(expect.classify(whole, &garbage).is_err(), "strict without the option");
        expect.allow_torn_full_stripes(stripe, 16);
        assert_eq!(expect.classify(whole, &garbage), Ok(Verdict::TornInFlight));
        if !expect.torn_in_flight[outside as usize] {
            assert!(expect.classify(outside, &garbage).is_err(), "block {outside} stays judged");
        }
        // Blocks no op in flight covered whole keep the strict check.
        let strict = (0..blocks).filter(|&b| !expect.torn_in_flight[b as usize]).count();
        assert!(strict > blocks as usize / 2, "only {strict} blocks still judged");
    }
}
