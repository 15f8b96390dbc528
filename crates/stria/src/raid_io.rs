//! `stria raid read` and `stria raid write`: raw byte access to an array, like dd on an md
//! device.
//!
//! The array reads and writes whole 4 KiB blocks. Any byte offset and length is served by
//! widening each piece to the blocks around it: reads drop the extra bytes, writes first read
//! the partial edge blocks and merge the new bytes in (read-modify-write). That is safe here
//! because the drives are locked to this process, so nothing else writes the edge blocks
//! between the read and the write.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};
use clap::Args;
use stria_proto::BLOCK_BYTES;
use stria_raid::Array;

use crate::raid_cmd::{Drives, with_array};
use crate::units::{format_bytes, parse_size};
use crate::{interrupt, usage};

const BLOCK: u64 = BLOCK_BYTES as u64;
/// Bytes moved per array request: large enough to reach every drive at once, small enough
/// that a transfer's memory stays bounded.
const PIECE_BYTES: u64 = 4 * 1024 * 1024;
const _: () = assert!(PIECE_BYTES.is_multiple_of(BLOCK));

#[derive(Args, Debug)]
pub struct ReadArgs {
    /// Array byte offset to start at (any value; suffixes such as 1M accepted).
    #[arg(long, value_parser = parse_size)]
    offset: u64,
    /// Bytes to read (suffixes such as 64K accepted).
    #[arg(long, value_parser = parse_size)]
    length: u64,
    /// Write the bytes to this file (created or truncated) instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    drives: Drives,
}

#[derive(Args, Debug)]
pub struct WriteArgs {
    /// Array byte offset to start at (any value; suffixes such as 1M accepted).
    #[arg(long, value_parser = parse_size)]
    offset: u64,
    /// Bytes to write; the input must hold at least this many. Default: all of the input.
    #[arg(long, value_parser = parse_size)]
    length: Option<u64>,
    /// Read the bytes from this file instead of stdin.
    #[arg(long = "in", value_name = "FILE")]
    input: Option<PathBuf>,
    #[command(flatten)]
    drives: Drives,
}

fn align_down(x: u64) -> u64 {
    x / BLOCK * BLOCK
}

fn align_up(x: u64) -> u64 {
    x.div_ceil(BLOCK) * BLOCK
}

/// Refuses a range that does not fit in the array, saying where the array ends.
fn check_range(array: &Array, offset: u64, length: u64) -> Result<()> {
    let capacity = array.capacity_bytes();
    match offset.checked_add(length) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(usage(format!(
            "--offset {offset} + --length {length} ends past the end of the array ({capacity} bytes, {})",
            format_bytes(capacity)
        ))),
    }
}

pub fn read(args: ReadArgs) -> Result<()> {
    let mut out: Box<dyn Write> = match &args.out {
        Some(path) => Box::new(
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
        ),
        None => Box::new(io::stdout().lock()),
    };
    with_array(&args.drives.paths, |array| {
        check_range(array, args.offset, args.length)?;
        copy_out(array, out.as_mut(), args.offset, args.length)
    })?;
    if let Some(path) = &args.out {
        eprintln!("read {} bytes at offset {} into {}", args.length, args.offset, path.display());
    }
    Ok(())
}

/// Copies `length` bytes at array `offset` to `out`. A reader that goes away (`| head`) ends
/// the copy without an error: what it wanted, it got.
fn copy_out(array: &Array, out: &mut dyn Write, offset: u64, length: u64) -> Result<()> {
    let end = offset + length;
    let mut buf = vec![0u8; (PIECE_BYTES + BLOCK) as usize];
    let mut pos = offset;
    while pos < end {
        if interrupt::requested() {
            return Err(anyhow!("interrupted after {} bytes", pos - offset));
        }
        let start = align_down(pos);
        let piece_end = end.min(start + PIECE_BYTES);
        let len = (align_up(piece_end) - start) as usize;
        array
            .read(start, &mut buf[..len])
            .with_context(|| format!("reading array offset {start}"))?;
        let wanted = &buf[(pos - start) as usize..(piece_end - start) as usize];
        match out.write_all(wanted) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            other => other.context("writing the output")?,
        }
        pos = piece_end;
    }
    match out.flush() {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing the output"),
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(input: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

pub fn write(args: WriteArgs) -> Result<()> {
    let (mut input, input_bytes): (Box<dyn Read>, Option<u64>) = match &args.input {
        Some(path) => {
            let file =
                File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            let size = file.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
            (Box::new(file), size)
        }
        None => (Box::new(io::stdin().lock()), None),
    };
    let written = with_array(&args.drives.paths, |array| {
        let capacity = array.capacity_bytes();
        if args.offset > capacity {
            return Err(usage(format!(
                "--offset {} is past the end of the array ({capacity} bytes)",
                args.offset
            )));
        }
        let limit = match (args.length, input_bytes) {
            (Some(length), _) => length,
            (None, Some(size)) => size,
            (None, None) => capacity - args.offset,
        };
        if let (Some(length), Some(size)) = (args.length, input_bytes)
            && size < length
        {
            return Err(usage(format!(
                "--length {length} is more than the {size} bytes the input file holds"
            )));
        }
        check_range(array, args.offset, limit)?;
        let written = copy_in(array, input.as_mut(), args.offset, limit)?;
        // Flush before judging the input, so whatever was written is durable either way.
        array.flush().context("flushing the array")?;
        if let Some(length) = args.length
            && written < length
        {
            return Err(anyhow!(
                "the input ended after {written} of --length {length} bytes; those {written} bytes were written"
            ));
        }
        if args.length.is_none() && input_bytes.is_none() && written == limit {
            let mut probe = [0u8; 1];
            if read_full(input.as_mut(), &mut probe)? > 0 {
                return Err(anyhow!(
                    "the input is longer than the {limit} bytes from --offset to the end of the array; those {limit} bytes were written, the rest was not"
                ));
            }
        }
        Ok(written)
    })?;
    println!("wrote {written} bytes at offset {} ({})", args.offset, format_bytes(written));
    Ok(())
}

/// Copies up to `limit` bytes from `input` to the array at `offset`; returns the bytes copied
/// (fewer if the input ends first).
fn copy_in(array: &Array, input: &mut dyn Read, offset: u64, limit: u64) -> Result<u64> {
    let end = offset + limit;
    let mut buf = vec![0u8; (PIECE_BYTES + BLOCK) as usize];
    let mut edge = vec![0u8; BLOCK_BYTES];
    let mut pos = offset;
    while pos < end {
        if interrupt::requested() {
            array.flush().context("flushing the array")?;
            return Err(anyhow!(
                "interrupted after {} bytes (those were written and flushed)",
                pos - offset
            ));
        }
        let start = align_down(pos);
        let head = (pos - start) as usize;
        let wanted = (end.min(start + PIECE_BYTES) - pos) as usize;
        let got = read_full(input, &mut buf[head..head + wanted]).context("reading the input")?;
        if got == 0 {
            break;
        }
        let piece_end = pos + got as u64;
        let aligned_end = align_up(piece_end);
        // Merge the untouched bytes of partial edge blocks from what the array holds now.
        let last_block = aligned_end - BLOCK;
        if head != 0 {
            array
                .read(start, &mut edge)
                .with_context(|| format!("reading array offset {start}"))?;
            buf[..head].copy_from_slice(&edge[..head]);
        }
        if !piece_end.is_multiple_of(BLOCK) {
            if head == 0 || last_block != start {
                array
                    .read(last_block, &mut edge)
                    .with_context(|| format!("reading array offset {last_block}"))?;
            }
            let cut = (piece_end - last_block) as usize;
            let base = (last_block - start) as usize;
            buf[base + cut..base + BLOCK_BYTES].copy_from_slice(&edge[cut..]);
        }
        let len = (aligned_end - start) as usize;
        array.write(start, &buf[..len]).with_context(|| format!("writing array offset {start}"))?;
        pos = piece_end;
        if got < wanted {
            break;
        }
    }
    Ok(pos - offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_helpers_round_to_blocks() {
        assert_eq!(align_down(4095), 0);
        assert_eq!(align_down(4096), 4096);
        assert_eq!(align_up(1), 4096);
        assert_eq!(align_up(8192), 8192);
        assert_eq!(align_up(0), 0);
    }

    /// Unaligned writes and reads through a RAID 5 array of memory drives agree byte for byte
    /// with a plain buffer, including runs that cross piece boundaries and share edge blocks.
    #[test]
    fn unaligned_copies_match_a_flat_model() {
        use std::sync::Arc;
        use stria_io::BlockDevice;
        use stria_io::mem::MemDevice;
        use stria_raid::{ArrayConfig, CreateOptions, Level};

        let devs: Vec<Arc<dyn BlockDevice>> = (0..3)
            .map(|i| Arc::new(MemDevice::new(format!("mem{i}"), 32 << 20)) as Arc<dyn BlockDevice>)
            .collect();
        let config = ArrayConfig {
            level: Level::Raid5,
            stripe_unit_bytes: 16 * 1024,
            rated_tbw: 0,
            journal_bytes: None,
        };
        let array = Array::create(
            devs,
            &config,
            &CreateOptions { skip_discard: true, ..CreateOptions::default() },
        )
        .expect("create");
        let capacity = array.capacity_bytes();
        assert!(capacity > PIECE_BYTES * 2 + 3 * BLOCK, "the test needs runs longer than a piece");
        let mut model = vec![0u8; capacity as usize];
        let mut rng = crate::rng::SplitMix64::new(7);
        let cases = [
            (1u64, 10u64),
            (4095, 2),
            (4096, 4096),
            (100, 5000),
            (9000, PIECE_BYTES + 12345),
            (capacity - 7, 7),
        ];
        for (offset, length) in cases {
            let mut data = vec![0u8; length as usize];
            rng.fill(&mut data);
            let written = copy_in(&array, &mut &data[..], offset, length).expect("write");
            assert_eq!(written, length);
            model[offset as usize..(offset + length) as usize].copy_from_slice(&data);
            // A short input stops early without touching bytes past its end.
            let short = copy_in(&array, &mut &data[..3.min(data.len())], offset, length)
                .expect("short write");
            assert_eq!(short, 3.min(length));
        }
        for (offset, length) in
            cases.iter().copied().chain([(0, capacity.min(3 * PIECE_BYTES + 17))])
        {
            let mut out = Vec::new();
            copy_out(&array, &mut out, offset, length).expect("read");
            assert!(
                out == model[offset as usize..(offset + length) as usize],
                "bytes differ at offset {offset} length {length}"
            );
        }
        array.close().expect("close");
    }
}
