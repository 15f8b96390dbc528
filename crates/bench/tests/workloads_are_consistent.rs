//! Every workload at a tiny scale against a temporary directory: what was written is what was
//! read (every byte verified), the operations counted are the operations asked for, and
//! nothing is left behind. Also: a corrupting file system is caught, Ctrl-C stops a run with
//! partial results and a clean directory, and a comparison gives ratios and charts.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use stria_bench::{
    CacheMode, CornersConfig, DataFile, Entry, FramesConfig, Io500Config, MetaConfig, MixConfig,
    OpenMode, Plan, PosixTarget, RandomConfig, RunContext, RunResult, SeqConfig, SharedConfig,
    Target, TargetKind, Workload,
};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let path =
            std::env::temp_dir().join(format!("stria-bench-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn target(dir: &TempDir, cache: CacheMode) -> PosixTarget {
    PosixTarget::new(dir.0.clone(), cache).unwrap()
}

/// The checks every run must pass.
fn assert_clean(result: &RunResult, dir: &TempDir) {
    let c = &result.checks;
    assert_eq!(c.files_left, 0, "{c:?}");
    assert_eq!(c.files_created, c.files_removed, "{c:?}");
    assert!(c.files_created > 0, "{c:?}");
    assert!(c.verified, "{c:?}");
    assert!(!result.interrupted);
    assert!(entries(&dir.0).is_empty(), "left behind: {:?}", entries(&dir.0));
    for p in &result.phases {
        assert!(p.rate > 0.0 && p.seconds > 0.0, "{p:?}");
        assert!(p.peak_rate >= p.rate, "{p:?}");
    }
}

#[test]
fn seq_reads_back_every_byte_it_wrote() {
    let dir = TempDir::new("seq");
    for cache in [CacheMode::Direct, CacheMode::Drop] {
        let c = SeqConfig {
            threads: 3,
            file_bytes: 4 << 20,
            transfer_bytes: 256 << 10,
            fsync: true,
            verify: true,
        };
        let r = Workload::Seq(c).run(&RunContext::quiet(), &target(&dir, cache)).unwrap();
        assert_clean(&r, &dir);
        let (w, rd) = (r.phase("write").unwrap(), r.phase("read").unwrap());
        assert_eq!(w.write.bytes, 3 * (4 << 20));
        assert_eq!(w.write.ops, 3 * 16);
        assert_eq!(rd.read.bytes, w.write.bytes);
        assert_eq!(rd.read.ops, w.write.ops);
        assert_eq!(r.checks.bytes_written, r.checks.bytes_read);
        assert_eq!(r.checks.files_created, 3);
        let expected = if cache == CacheMode::Direct { "O_DIRECT" } else { "POSIX_FADV_DONTNEED" };
        assert!(w.cache.contains(expected), "{}", w.cache);
    }
}

#[test]
fn shared_file_segmented_and_strided() {
    let dir = TempDir::new("shared");
    for strided in [false, true] {
        let c = SharedConfig {
            threads: 4,
            bytes_per_thread: 1 << 20,
            transfer_bytes: 64 << 10,
            strided,
            fsync: false,
            verify: true,
        };
        let r = Workload::Shared(c)
            .run(&RunContext::quiet(), &target(&dir, CacheMode::Direct))
            .unwrap();
        assert_clean(&r, &dir);
        assert_eq!(r.checks.files_created, 1);
        assert_eq!(r.phase("write").unwrap().write.ops, 4 * 16);
        assert_eq!(r.checks.bytes_written, 4 << 20);
        assert_eq!(r.checks.bytes_read, 4 << 20);
    }
}

#[test]
fn random_counts_exactly_the_requests_asked_for() {
    let dir = TempDir::new("random");
    let c = RandomConfig {
        threads: 2,
        file_bytes: 2 << 20,
        block_bytes: 4096,
        queue_depth: 3,
        seconds: None,
        ops_per_worker: Some(100),
        verify: true,
        seed: 7,
    };
    let r =
        Workload::Random(c).run(&RunContext::quiet(), &target(&dir, CacheMode::Direct)).unwrap();
    assert_clean(&r, &dir);
    assert_eq!(r.phase("prepare").unwrap().write.bytes, 2 * (2 << 20));
    for (phase, ch) in [("randwrite", "write"), ("randread", "read")] {
        let p = r.phase(phase).unwrap();
        assert_eq!(p.workers, 6, "2 threads x depth 3");
        assert_eq!(p.threads, 2);
        let counts = if ch == "write" { &p.write } else { &p.read };
        assert_eq!(counts.ops, 600, "{p:?}");
        assert_eq!(counts.bytes, 600 * 4096);
        assert_eq!(p.ops, 600);
    }
}

#[test]
fn timed_random_phases_stop_on_time() {
    let dir = TempDir::new("timed");
    let c = RandomConfig {
        threads: 1,
        file_bytes: 1 << 20,
        block_bytes: 4096,
        queue_depth: 1,
        seconds: Some(0.3),
        ops_per_worker: None,
        verify: true,
        seed: 1,
    };
    let r =
        Workload::Random(c).run(&RunContext::quiet(), &target(&dir, CacheMode::Direct)).unwrap();
    assert_clean(&r, &dir);
    let p = r.phase("randread").unwrap();
    assert!(p.seconds >= 0.3 && p.seconds < 10.0, "{p:?}");
    assert!(p.read.ops > 0);
}

#[test]
fn meta_counts_every_file_in_every_phase() {
    let dir = TempDir::new("meta");
    for shared_dirs in [false, true] {
        let config = MetaConfig {
            threads: 3,
            files_per_dir: 20,
            dirs_per_thread: 2,
            file_bytes: 3 << 10,
            shared_dirs,
            verify: true,
        };
        let w = Workload::Meta { config, total_files: None };
        let r = w.run(&RunContext::quiet(), &target(&dir, CacheMode::Direct)).unwrap();
        assert_clean(&r, &dir);
        let names: Vec<&str> = r.phases.iter().map(|p| p.phase.as_str()).collect();
        assert_eq!(names, ["create", "stat", "read", "remove"]);
        for p in &r.phases {
            assert_eq!(p.ops, 120, "{p:?}");
        }
        assert_eq!(r.checks.files_created, 120);
        assert_eq!(r.checks.bytes_written, 120 * 3072);
        assert_eq!(r.checks.bytes_read, 120 * 3072);
    }
}

#[test]
fn meta_keeps_the_total_across_a_sweep() {
    let config = MetaConfig {
        threads: 1,
        files_per_dir: 10,
        dirs_per_thread: 1,
        file_bytes: 0,
        shared_dirs: false,
        verify: true,
    };
    let w = Workload::Meta { config, total_files: Some(80) };
    for threads in [1, 2, 4, 8] {
        let Workload::Meta { config, .. } = w.with_threads(threads) else { unreachable!() };
        assert_eq!(config.files(), 80, "{threads} threads");
    }
}

#[test]
fn mix_and_corners_run_every_point() {
    let dir = TempDir::new("mix");
    let c = MixConfig {
        threads: 2,
        file_bytes: 1 << 20,
        block_bytes: 4096,
        queue_depth: 2,
        read_percents: vec![100, 50, 0],
        seconds: None,
        ops_per_worker: Some(50),
        verify: true,
        seed: 3,
    };
    let r = Workload::Mix(c).run(&RunContext::quiet(), &target(&dir, CacheMode::Direct)).unwrap();
    assert_clean(&r, &dir);
    let all_read = r.phase("read100").unwrap();
    assert_eq!((all_read.read.ops, all_read.write.ops), (200, 0));
    let all_write = r.phase("read0").unwrap();
    assert_eq!((all_write.read.ops, all_write.write.ops), (0, 200));
    let half = r.phase("read50").unwrap();
    assert_eq!(half.read.ops + half.write.ops, 200);
    assert!(half.read.ops > 50 && half.write.ops > 50, "{half:?}");

    let c = CornersConfig {
        threads: 2,
        file_bytes: 1 << 20,
        queue_depth: 2,
        seconds: None,
        ops_per_worker: Some(20),
        verify: true,
        seed: 3,
    };
    let r =
        Workload::Corners(c).run(&RunContext::quiet(), &target(&dir, CacheMode::Direct)).unwrap();
    assert_clean(&r, &dir);
    // Sequential corners make one pass per file; random ones the requests asked for.
    assert_eq!(r.phase("seqwrite-64k").unwrap().write.bytes, 2 << 20);
    assert_eq!(r.phase("seqread-64k").unwrap().read.bytes, 2 << 20);
    assert_eq!(r.phase("randwrite-4k").unwrap().write.ops, 80);
    assert_eq!(r.phase("randread-4k").unwrap().read.ops, 80);
}

#[test]
fn frames_count_frames_and_drops() {
    let dir = TempDir::new("frames");
    let c = FramesConfig {
        streams: 2,
        frame_bytes: 300_000,
        frames_per_stream: 6,
        fps: Some(1000.0),
        transfer_bytes: 64 << 10,
        verify: true,
    };
    let r =
        Workload::Frames(c).run(&RunContext::quiet(), &target(&dir, CacheMode::Direct)).unwrap();
    assert_clean(&r, &dir);
    assert_eq!(r.checks.files_created, 12);
    assert_eq!(r.checks.bytes_written, 12 * 300_000);
    assert_eq!(r.checks.bytes_read, 12 * 300_000);
    let stats = r.extra.as_ref().unwrap()["frames"].as_array().unwrap().clone();
    assert_eq!(stats.len(), 2);
    for s in stats {
        assert_eq!(s["frames"], 12);
        assert!(s["dropped"].as_u64().unwrap() <= 12);
    }
}

#[test]
fn io500_runs_its_twelve_phases_and_scores() {
    let dir = TempDir::new("io500");
    let c = Io500Config {
        threads: 2,
        easy_bytes_per_thread: 2 << 20,
        hard_transfers_per_thread: 20,
        easy_files_per_thread: 30,
        hard_files_per_thread: 20,
        verify: true,
    };
    let r = Workload::Io500(c).run(&RunContext::quiet(), &target(&dir, CacheMode::Direct)).unwrap();
    assert_clean(&r, &dir);
    let names: Vec<&str> = r.phases.iter().map(|p| p.phase.as_str()).collect();
    assert_eq!(
        names,
        [
            "ior-easy-write",
            "mdtest-easy-write",
            "ior-hard-write",
            "mdtest-hard-write",
            "find",
            "ior-easy-read",
            "mdtest-easy-stat",
            "ior-hard-read",
            "mdtest-hard-stat",
            "mdtest-easy-delete",
            "mdtest-hard-read",
            "mdtest-hard-delete"
        ]
    );
    assert_eq!(r.phase("ior-hard-write").unwrap().write.bytes, 2 * 20 * 47_008);
    assert_eq!(r.phase("mdtest-hard-read").unwrap().read.bytes, 40 * 3_901);
    // find sees every file: 60 easy + 40 hard + 2 ior-easy + 1 ior-hard; of the hard files
    // (t0.f0 .. t1.f19) 31 have a "1" in their name.
    let find = r.phase("find").unwrap();
    assert_eq!(find.ops, 103);
    assert_eq!(find.read.ops, 31);
    let score = r.extra.as_ref().unwrap();
    assert!(score["score"].as_f64().unwrap() > 0.0);
    assert!(score["note"].as_str().unwrap().contains("NOT an official"));
}

/// A file system that flips one byte of every read of a chosen file.
struct Corrupting {
    inner: PosixTarget,
    reads: AtomicU64,
}

struct CorruptFile(Box<dyn DataFile>);

impl DataFile for CorruptFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_at(offset, data)
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_at(offset, buf)?;
        buf[buf.len() / 2] ^= 0x40;
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        self.0.sync()
    }
    fn close(self: Box<Self>) -> io::Result<()> {
        self.0.close()
    }
}

impl Target for Corrupting {
    fn label(&self) -> String {
        "corrupting".into()
    }
    fn kind(&self) -> TargetKind {
        TargetKind::Posix
    }
    fn mkdir(&self, path: &str) -> io::Result<()> {
        self.inner.mkdir(path)
    }
    fn rmdir(&self, path: &str) -> io::Result<()> {
        self.inner.rmdir(path)
    }
    fn open(&self, path: &str, mode: OpenMode) -> io::Result<Box<dyn DataFile>> {
        let file = self.inner.open(path, mode)?;
        if mode.write {
            return Ok(file);
        }
        self.reads.fetch_add(1, Relaxed);
        Ok(Box::new(CorruptFile(file)))
    }
    fn stat(&self, path: &str) -> io::Result<u64> {
        self.inner.stat(path)
    }
    fn unlink(&self, path: &str) -> io::Result<()> {
        self.inner.unlink(path)
    }
    fn list(&self, path: &str) -> io::Result<Vec<Entry>> {
        self.inner.list(path)
    }
    fn drop_cache(&self, path: &str) -> io::Result<()> {
        self.inner.drop_cache(path)
    }
    fn cache_policy(&self, aligned: bool) -> String {
        self.inner.cache_policy(aligned)
    }
}

#[test]
fn verification_catches_a_file_system_that_returns_wrong_data() {
    let dir = TempDir::new("corrupt");
    let t = Corrupting { inner: target(&dir, CacheMode::Direct), reads: AtomicU64::new(0) };
    let c = SeqConfig {
        threads: 1,
        file_bytes: 1 << 20,
        transfer_bytes: 1 << 20,
        fsync: false,
        verify: true,
    };
    let err = Workload::Seq(c).run(&RunContext::quiet(), &t).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("differs from what was written"), "{err}");
    assert!(t.reads.load(Relaxed) > 0);
    // Even a failed run removes its files.
    assert!(entries(&dir.0).is_empty(), "left behind: {:?}", entries(&dir.0));
}

#[test]
fn an_interrupted_run_reports_what_it_did_and_cleans_up() {
    let dir = TempDir::new("interrupt");
    let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let ctx = RunContext { stop, progress: false };
    let config = MetaConfig {
        threads: 2,
        files_per_dir: 100_000,
        dirs_per_thread: 1,
        file_bytes: 0,
        shared_dirs: false,
        verify: true,
    };
    let t = target(&dir, CacheMode::Direct);
    let result = std::thread::scope(|s| {
        let run = s.spawn(|| Workload::Meta { config, total_files: None }.run(&ctx, &t));
        std::thread::sleep(std::time::Duration::from_millis(300));
        stop.store(true, Relaxed);
        run.join().unwrap()
    })
    .unwrap();
    assert!(result.interrupted);
    let create = result.phase("create").unwrap();
    assert!(create.interrupted);
    assert!(create.ops > 0 && create.ops < 200_000, "{create:?}");
    // stat and read were skipped; remove ran to the end.
    assert!(result.phase("stat").is_none());
    assert_eq!(result.phase("remove").unwrap().ops, create.ops);
    assert_eq!(result.checks.files_left, 0);
    assert!(entries(&dir.0).is_empty(), "left behind: {:?}", entries(&dir.0));
}

#[test]
fn comparisons_interleave_targets_and_chart_the_sweep() {
    let a = TempDir::new("cmp-a");
    let b = TempDir::new("cmp-b");
    let charts = TempDir::new("cmp-charts");
    let targets: Vec<Box<dyn Target>> =
        vec![Box::new(target(&a, CacheMode::Direct)), Box::new(target(&b, CacheMode::Drop))];
    let plan = Plan {
        workload: Workload::Seq(SeqConfig {
            threads: 1,
            file_bytes: 1 << 20,
            transfer_bytes: 256 << 10,
            fsync: false,
            verify: true,
        }),
        thread_counts: stria_bench::sweep_counts(4),
        runs: 2,
        sweep: true,
    };
    let mut order = Vec::new();
    let report = stria_bench::execute(&RunContext::quiet(), &plan, &targets, |label, r| {
        order.push((label.to_string(), r.threads))
    })
    .unwrap();
    // Per thread count, the runs alternate between the targets.
    let la = a.0.display().to_string();
    let lb = b.0.display().to_string();
    let expect: Vec<(String, usize)> = [1, 2, 4]
        .iter()
        .flat_map(|&t| [(la.clone(), t), (lb.clone(), t), (la.clone(), t), (lb.clone(), t)])
        .collect();
    assert_eq!(order, expect);
    assert_eq!(report.records.len(), 12);
    // 2 targets x 2 phases x 3 thread counts.
    assert_eq!(report.points.len(), 12);
    assert_eq!(report.summary.len(), 4);
    assert_eq!(report.ratios.len(), 6);
    for r in &report.ratios {
        assert_eq!(r.baseline, la);
        assert!(r.ratio > 0.0);
    }
    let text = report.render_text();
    assert!(text.contains("SUSTAINED") && text.contains(&lb), "{text}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["records"].as_array().unwrap().len(), 12);

    let (files, fonts) = stria_bench::chart::sweep_charts(&report, &charts.0).unwrap();
    assert!(fonts, "no system fonts for the PNG text: the test command installs fonts-dejavu-core");
    assert_eq!(files.len(), 4, "{files:?}");
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        if f.extension().unwrap() == "png" {
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
            assert!(bytes.len() > 5000, "{} is {} bytes", f.display(), bytes.len());
        } else {
            let svg = String::from_utf8(bytes).unwrap();
            assert_eq!(svg.matches("<polyline").count(), 2);
        }
    }
}
