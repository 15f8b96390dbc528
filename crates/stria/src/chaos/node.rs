//! A node under test: `stria up` run from this same binary as a child process, on a scratch
//! data directory, with its FUSE mount; killed, stopped and restarted on command. Campaigns use
//! it only through the mount and the public CLI, like an operator would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::epochs::Role;

/// How long a node may take to assemble its targets and mount.
const START_LIMIT: Duration = Duration::from_secs(120);
/// How long a node may take to stop after SIGTERM.
const STOP_LIMIT: Duration = Duration::from_secs(60);

/// Where a node campaign keeps its node.
#[derive(Args, Debug, Clone)]
pub struct ScratchArgs {
    /// Scratch directory for the node's data and mount; it must not exist yet [default:
    /// /var/tmp/stria-chaos-CAMPAIGN-PID]. Removed at the end unless the campaign failed or
    /// --keep is given.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the scratch directory (the node stopped) even when the campaign passed.
    #[arg(long)]
    pub keep: bool,
}

impl ScratchArgs {
    pub fn make(&self, campaign: &str) -> Result<PathBuf> {
        let dir = self.dir.clone().unwrap_or_else(|| {
            PathBuf::from(format!("/var/tmp/stria-chaos-{campaign}-{}", std::process::id()))
        });
        if dir.exists() {
            bail!("{} exists already; give a new --dir", dir.display());
        }
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the scratch directory {}", dir.display()))?;
        Ok(dir)
    }

    /// Removes the scratch directory after a passed campaign (unless --keep), or says where it
    /// was left.
    pub fn finish(&self, dir: &Path, passed: bool) {
        if passed && !self.keep {
            let _ = std::fs::remove_dir_all(dir);
        } else {
            println!("node data kept in {} (the node is stopped)", dir.display());
        }
    }
}

/// Checks what a node campaign needs before it starts anything.
pub fn require_fuse() -> Result<()> {
    if !Path::new("/dev/fuse").exists() {
        bail!("this campaign mounts the file system: /dev/fuse is missing (modprobe fuse)");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("this campaign mounts the file system: run it as root");
    }
    Ok(())
}

pub struct Node {
    exe: PathBuf,
    child: Option<Child>,
    pub data: PathBuf,
    pub mount: PathBuf,
    args: Vec<String>,
}

impl Node {
    /// Creates and starts a node in `dir/data` with free loopback ports and the given shape
    /// options (`--drives`, `--raid`, `--drive-size`, ...).
    pub fn start(dir: &Path, shape: &[String]) -> Result<Node> {
        let exe = std::env::current_exe().context("cannot find this stria binary")?;
        let data = dir.join("data");
        let mount = dir.join("mnt");
        let mut args: Vec<String> = vec!["up".into(), "--data".into(), data.display().to_string()];
        args.extend(["--mount".into(), mount.display().to_string()]);
        // Separate roles serve no REST API.
        let rest = !shape.iter().any(|a| a == "--separate-roles");
        for flag in ["--meta-listen", "--storage-listen", "--mgmt-listen", "--api-listen"] {
            if flag != "--api-listen" || rest {
                args.extend([flag.to_string(), "127.0.0.1:0".to_string()]);
            }
        }
        args.push("--no-nbd".into());
        args.extend(shape.iter().cloned());
        let mut node = Node { exe, child: None, data, mount, args };
        node.spawn()?;
        Ok(node)
    }

    /// Starts `stria up`. The run record of a killed node stays where it is, as after a real
    /// crash (the node then frees what the crash left behind); readiness waits for the new
    /// node's own record.
    fn spawn(&mut self) -> Result<()> {
        std::fs::create_dir_all(&self.data)?;
        let out = std::fs::File::create(self.data.join("up.stdout"))?;
        let err = std::fs::File::create(self.data.join("up.stderr"))?;
        let child = Command::new(&self.exe)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .context("cannot start stria up")?;
        self.child = Some(child);
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                bail!("stria up exited at start with {status}: {}", self.stderr_tail());
            }
            let pid = self.child.as_ref().map(|c| c.id());
            if pid.is_some() && self.record_pid() == pid && is_mounted(&self.mount) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("stria up was not ready after {START_LIMIT:?}: {}", self.stderr_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pid in `DATA/run.json`, if there is a readable one.
    fn record_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data.join("run.json")).ok()?;
        let run: serde_json::Value = serde_json::from_str(&text).ok()?;
        run["pid"].as_u64().map(|pid| pid as u32)
    }

    /// The last lines the node wrote to stderr, for error messages.
    pub fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(self.data.join("up.stderr")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// kill -9: the whole node dies at once, its mount is left dead.
    pub fn kill(&mut self) -> Result<()> {
        let mut child = self.child.take().context("the node is not running")?;
        child.kill().context("SIGKILL")?;
        child.wait().context("reaping the killed node")?;
        Ok(())
    }

    /// kill -9 of one role process of a node started with `--separate-roles`; returns its pid.
    pub fn kill_role(&self, role: Role) -> Result<u32> {
        let pid = crate::roles::serving_pid(&self.data, role)
            .with_context(|| format!("no {} role is serving", role.name()))?;
        // SAFETY: kill with a pid read from the role's record and a valid signal.
        if unsafe { libc::kill(pid as i32, libc::SIGKILL) } != 0 {
            bail!(
                "cannot kill the {} role (pid {pid}): {}",
                role.name(),
                std::io::Error::last_os_error()
            );
        }
        Ok(pid)
    }

    /// Waits until the supervisor has restarted the roles after `killed` died: both serve
    /// under new processes and the node answers the CLI.
    pub fn wait_roles_back(&self, killed: u32) -> Result<()> {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            let pids =
                [Role::Storage, Role::Meta].map(|r| crate::roles::serving_pid(&self.data, r));
            let alive = |pid: u32| Path::new(&format!("/proc/{pid}")).exists();
            let back = pids.iter().all(|p| p.is_some_and(|p| p != killed && alive(p)));
            if back && self.cli(&["df"]).is_ok_and(|out| out.status.success()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the roles were not back {START_LIMIT:?} after the kill: {}",
                    self.stderr_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, and a clean stop within the limit.
    pub fn stop(&mut self) -> Result<()> {
        let mut child = self.child.take().context("the node is not running")?;
        // SAFETY: kill with a valid pid and signal.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_LIMIT;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("stria up did not stop within {STOP_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !status.success() {
            bail!("stria up exited with {status} after SIGTERM: {}", self.stderr_tail());
        }
        Ok(())
    }

    pub fn restart(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("the node is still running");
        }
        self.spawn()
    }

    /// Runs `stria ARGS --data DATA`.
    pub fn cli(&self, args: &[&str]) -> Result<Output> {
        Command::new(&self.exe)
            .args(args)
            .arg("--data")
            .arg(&self.data)
            .output()
            .with_context(|| format!("cannot run stria {}", args.join(" ")))
    }

    /// Runs `stria ARGS --data DATA` and requires success; returns stdout.
    pub fn cli_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.cli(args)?;
        if !out.status.success() {
            bail!(
                "stria {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `stria fsck` on the stopped node: Ok(summary) when clean, Err(what it said) otherwise.
    pub fn fsck(&self) -> Result<String, String> {
        let out = self.cli(&["fsck"]).map_err(|e| format!("{e:#}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && stdout.contains("fsck: clean") {
            return Ok(stdout.lines().next().unwrap_or("").to_string());
        }
        Err(format!(
            "fsck {}: {} {}",
            out.status,
            stdout.replace('\n', " | "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
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

pub fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let want = path.display().to_string();
    mounts.lines().any(|line| line.split_whitespace().nth(1) == Some(want.as_str()))
}
