//! `frames`: video-frame streaming as frametest measures it. N streams each write a sequence
//! of frame files (one file per frame, as DPX/EXR sequences are stored), then read them back.
//! With a target rate, frame k of a stream is due (k+1)/fps seconds after the stream started;
//! a frame finished later is counted as dropped (the stream does not wait to catch up).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::common::{AlignedBuf, RunResult, WorkDir, fill, verify};
use crate::meter::{PhaseSpec, RunContext, Unit, run_phase};
use crate::target::{OpenMode, Target};

#[derive(Clone, Debug, Serialize)]
pub struct FramesConfig {
    pub streams: usize,
    pub frame_bytes: usize,
    pub frames_per_stream: usize,
    /// Frames per second each stream must sustain; None runs as fast as possible.
    pub fps: Option<f64>,
    /// Bytes per write or read request within a frame.
    pub transfer_bytes: usize,
    pub verify: bool,
}

/// Per-phase frame figures, in the run's `extra`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FrameStats {
    pub phase: String,
    pub frames: u64,
    pub dropped: u64,
    pub frames_per_s: f64,
    pub frames_per_s_per_stream: f64,
}

pub fn frames(ctx: &RunContext, target: &dyn Target, c: &FramesConfig) -> io::Result<RunResult> {
    let mut result = RunResult::new("frames", c.streams);
    let dir = WorkDir::create(target)?;
    let mut stats = Vec::new();
    let outcome = run_streams(ctx, target, &dir, c, &mut result, &mut stats);
    let left = dir.remove(target);
    outcome?;
    result.checks.files_left = left?;
    result.checks.verified = c.verify;
    result.extra = Some(serde_json::json!({ "frames": stats }));
    Ok(result)
}

fn frame_path(dir: &WorkDir, stream: usize, frame: usize) -> String {
    dir.path(&format!("s{stream}/f{frame:07}.dpx"))
}

fn run_streams(
    ctx: &RunContext,
    target: &dyn Target,
    dir: &WorkDir,
    c: &FramesConfig,
    result: &mut RunResult,
    stats: &mut Vec<FrameStats>,
) -> io::Result<()> {
    for s in 0..c.streams {
        target.mkdir(&dir.path(&format!("s{s}")))?;
    }
    let transfer = c.transfer_bytes.min(c.frame_bytes).max(1);
    let aligned = transfer.is_multiple_of(crate::common::ALIGN_BYTES)
        && c.frame_bytes.is_multiple_of(crate::common::ALIGN_BYTES);
    // How many frames each stream wrote (all unless interrupted); reads and removal use it.
    let written: Vec<AtomicU64> = (0..c.streams).map(|_| AtomicU64::new(0)).collect();
    for (phase, write) in [("write", true), ("read", false)] {
        if ctx.interrupted() {
            break;
        }
        if !write {
            for (s, n) in written.iter().enumerate() {
                for k in 0..n.load(Relaxed) as usize {
                    target.drop_cache(&frame_path(dir, s, k))?;
                }
            }
        }
        let dropped = AtomicU64::new(0);
        let spec = PhaseSpec {
            name: phase.into(),
            unit: Unit::Bytes,
            workers: c.streams,
            threads: c.streams,
            duration: None,
            expected: Some((c.streams * c.frames_per_stream * c.frame_bytes) as u64),
            cache: target.cache_policy(aligned),
        };
        let mut measured = run_phase(ctx, &spec, |s, meter| {
            let mut buf = AlignedBuf::new(transfer);
            if !c.verify {
                fill(buf.as_mut(), s as u64, 0);
            }
            let count = if write { c.frames_per_stream } else { written[s].load(Relaxed) as usize };
            let start = Instant::now();
            for k in 0..count {
                if meter.should_stop() {
                    break;
                }
                if let Some(fps) = c.fps {
                    // Start no earlier than the frame's slot; never wait to catch up.
                    let slot = start + Duration::from_secs_f64(k as f64 / fps);
                    if let Some(wait) = slot.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                }
                let path = frame_path(dir, s, k);
                let id = ((s as u64) << 32) | k as u64;
                let began = Instant::now();
                let mode =
                    OpenMode { write, create: write, size_hint: c.frame_bytes as u64, aligned };
                let mut f = target.open(&path, mode)?;
                let mut at = 0usize;
                while at < c.frame_bytes {
                    let len = transfer.min(c.frame_bytes - at);
                    let data = &mut buf.as_mut()[..len];
                    if write {
                        if c.verify {
                            fill(data, id, at as u64);
                        }
                        f.write_at(at as u64, data)?;
                    } else {
                        f.read_at(at as u64, data)?;
                        if c.verify {
                            verify(data, id, at as u64, &path)?;
                        }
                    }
                    at += len;
                }
                f.close()?;
                let took = began.elapsed();
                if write {
                    meter.write.record(c.frame_bytes as u64, took);
                    written[s].store(k as u64 + 1, Relaxed);
                } else {
                    meter.read.record(c.frame_bytes as u64, took);
                }
                if let Some(fps) = c.fps {
                    let due = start + Duration::from_secs_f64((k + 1) as f64 / fps);
                    if Instant::now() > due {
                        dropped.fetch_add(1, Relaxed);
                    }
                }
            }
            Ok(())
        })?;
        measured.cache = target.cache_policy(aligned);
        let frames = measured.ops;
        let fps = if measured.seconds > 0.0 { frames as f64 / measured.seconds } else { 0.0 };
        stats.push(FrameStats {
            phase: phase.into(),
            frames,
            dropped: dropped.load(Relaxed),
            frames_per_s: fps,
            frames_per_s_per_stream: fps / c.streams.max(1) as f64,
        });
        result.push(measured);
    }
    let mut removed = 0;
    for (s, n) in written.iter().enumerate() {
        for k in 0..n.load(Relaxed) as usize {
            target.unlink(&frame_path(dir, s, k))?;
            removed += 1;
        }
        target.rmdir(&dir.path(&format!("s{s}")))?;
    }
    result.checks.files_created = written.iter().map(|n| n.load(Relaxed)).sum();
    result.checks.files_removed = removed;
    Ok(())
}
