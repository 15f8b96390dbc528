//! Runs `stria up` as a child process for end-to-end tests: a real node, a real FUSE mount.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const STRIA: &str = env!("CARGO_BIN_EXE_stria");

/// A fresh directory under /var/tmp (a disk file system, where O_DIRECT and io_uring do real
/// I/O), removed when the test passes; a failing test leaves it for a look.
pub fn scratch(name: &str) -> Scratch {
    let dir = Path::new("/var/tmp").join(format!("stria-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    Scratch(dir)
}

/// A test's scratch directory; see [`scratch`].
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for a look", self.0.display());
            return;
        }
        if is_mounted(&self.0.join("mnt")) {
            let _ = Command::new("umount").arg("-l").arg(self.0.join("mnt")).status();
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The tests need FUSE: say exactly what is missing instead of skipping.
pub fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "these tests mount a real FUSE file system: /dev/fuse is missing (load the fuse module)"
    );
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "these tests mount FUSE and switch users: run as root"
    );
}

pub struct Node {
    child: Option<Child>,
    pub data: PathBuf,
    pub mount: PathBuf,
    pub args: Vec<String>,
    /// Environment variables of the next start (`restart`).
    pub env: Vec<(String, String)>,
}

impl Node {
    /// Starts `stria up` on `data` with free ports and small drives, plus `extra` arguments,
    /// and waits until the mount answers.
    pub fn start(data: &Path, extra: &[&str]) -> Node {
        let mount = data.join("mnt");
        let mut args: Vec<String> = vec![
            "up".into(),
            "--data".into(),
            data.display().to_string(),
            "--meta-listen".into(),
            "127.0.0.1:0".into(),
            "--storage-listen".into(),
            "127.0.0.1:0".into(),
            "--mgmt-listen".into(),
            "127.0.0.1:0".into(),
            "--nbd-listen".into(),
            "127.0.0.1:0".into(),
        ];
        // Separate roles serve no REST API.
        if !extra.contains(&"--separate-roles") {
            args.extend(["--api-listen".into(), "127.0.0.1:0".into()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut node = Node { child: None, data: data.to_path_buf(), mount, args, env: Vec::new() };
        node.spawn();
        node
    }

    /// Starts `stria up`. A run record a killed node left stays, as after a real crash (the
    /// node then frees what the crash left behind); readiness waits for the new node's own.
    fn spawn(&mut self) {
        std::fs::create_dir_all(&self.data).expect("data dir");
        let out = std::fs::File::create(self.data.join("up.stdout")).expect("stdout file");
        let err = std::fs::File::create(self.data.join("up.stderr")).expect("stderr file");
        let child = Command::new(STRIA)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn stria up");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("stria up exited early with {status}: {}", self.stderr());
            }
            let pid = self.child.as_ref().map(Child::id);
            if pid.is_some() && self.record_pid() == pid && is_mounted(&self.mount) {
                return;
            }
            assert!(Instant::now() < deadline, "stria up not ready after 120 s: {}", self.stderr());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The pid in `DATA/run.json`, if there is a readable one.
    fn record_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data.join("run.json")).ok()?;
        let run: serde_json::Value = serde_json::from_str(&text).ok()?;
        run["pid"].as_u64().map(|pid| pid as u32)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.data.join("up.stderr")).unwrap_or_default()
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.data.join("up.stdout")).unwrap_or_default()
    }

    /// Stops the node with SIGTERM and checks it unmounted and exited cleanly.
    pub fn stop(&mut self) {
        let mut child = self.child.take().expect("node running");
        // SAFETY: kill with a valid pid and signal.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = wait_timeout(&mut child, Duration::from_secs(60));
        assert!(status.success(), "stria up exited with {status} after SIGTERM: {}", self.stderr());
        assert!(!is_mounted(&self.mount), "the mount is still there after a clean stop");
        assert!(self.stderr().contains("stopped cleanly"), "no clean stop: {}", self.stderr());
    }

    /// Kills the node with SIGKILL (a crash); the mount is left dead.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("node running");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }

    /// Waits for the node to exit on its own (an abort, say) within `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("node running");
        wait_timeout(&mut child, limit)
    }

    /// Starts the node again on the same data directory.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop or kill the node first");
        self.spawn();
    }

    /// Runs a `stria` subcommand against this node's data directory.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(STRIA).args(args).arg("--data").arg(&self.data).output().expect("run stria")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if is_mounted(&self.mount) {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
    }
}

fn wait_timeout(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("stria up did not stop within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid of a role process of `stria up --separate-roles` (`storage`, `meta`), from its
/// record in the data directory.
pub fn role_pid(data: &Path, role: &str) -> Option<u32> {
    let text = std::fs::read_to_string(data.join("roles").join(format!("{role}.json"))).ok()?;
    let record: serde_json::Value = serde_json::from_str(&text).ok()?;
    record["pid"].as_u64().map(|pid| pid as u32)
}

pub fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let want = path.display().to_string();
    mounts.lines().any(|line| line.split_whitespace().nth(1) == Some(want.as_str()))
}

/// Deterministic bytes for (seed, offset): lets a verifier recompute any range.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (seed ^ (offset + i).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .wrapping_mul(0xbf58_476d_1ce4_e5b9);
            (x >> 56) as u8
        })
        .collect()
}

/// A client library connection to `node`'s services (with its cluster secret), beside the
/// mount, and the runtime it runs on.
pub fn native_client(node: &Node) -> (stria_client::Client, tokio::runtime::Runtime) {
    use stria_client::{Client, ClientConfig};
    use stria_proto::fs::TargetId;
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(node.data.join("run.json")).expect("run"))
            .expect("run.json is JSON");
    let addr = |key: &str| -> std::net::SocketAddr {
        run[key].as_str().expect("address").parse().expect("socket address")
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let secret =
        stria_rpc::ClusterSecret::load(&node.data.join("cluster-secret")).expect("cluster secret");
    let probe = Client::new(
        runtime.handle().clone(),
        ClientConfig::new(addr("meta"), vec![(TargetId(0), addr("storage"))])
            .with_secret(secret.clone()),
    );
    let targets = probe.targets().expect("the node lists its targets");
    let routes = targets.iter().map(|t| (t.target, addr("storage"))).collect();
    let config = ClientConfig::new(addr("meta"), routes).with_secret(secret);
    (Client::new(runtime.handle().clone(), config), runtime)
}

/// A `stria mount` process; killed and its mount detached if the test fails.
pub struct SecondMount {
    child: Option<Child>,
    pub path: PathBuf,
    log: PathBuf,
}

impl SecondMount {
    pub fn start(node: &Node, path: &Path) -> SecondMount {
        SecondMount::start_with(node, path, &[])
    }

    /// [`SecondMount::start`] with more arguments for `stria mount`.
    pub fn start_with(node: &Node, path: &Path, extra: &[&str]) -> SecondMount {
        let log = path.with_extension("log");
        let child = Command::new(STRIA)
            .arg("mount")
            .arg(path)
            .arg("--data")
            .arg(&node.data)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut mount = SecondMount { child: Some(child), path: path.to_path_buf(), log };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mounted(path) {
            if let Some(status) = mount.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("stria mount exited with {status}: {}", mount.stderr());
            }
            assert!(Instant::now() < deadline, "stria mount not mounted after 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        mount
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to end by itself; its exit status.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let child = self.child.as_mut().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status;
            }
            assert!(Instant::now() < deadline, "stria mount still running after 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the process with SIGKILL (a crashed client); its mount is left dead.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("stria mount running");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.as_ref().unwrap().id();
        // SAFETY: kill with a valid pid and signal.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        self.wait_exit()
    }
}

impl Drop for SecondMount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if is_mounted(&self.path) {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}
