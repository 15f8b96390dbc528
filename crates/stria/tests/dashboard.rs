//! The web dashboard in real headless Chromium against a real `stria up`: the page is served
//! without a token, takes the token from the URL fragment or its form (a wrong one brings the
//! form back with the 401), and every page shows the live node: drive rows per `--drives`, the
//! target optimal, then degraded with the failed drive after `stria target fail-drive`, a
//! volume made by the CLI and its snapshot (shown with its origin), the drive failure among the
//! events. The Storage page's forms create
//! a volume, show the API's refusal naming the field, and edit an access list. Screenshots of
//! every page go to `target/test-artifacts/dashboard/`.
//!
//! Pages are read with `chromium --dump-dom` (the DOM after the scripts ran, with virtual time
//! so the 2 s refresh timers fire); the forms are driven over the DevTools protocol on a pipe
//! (`--remote-debugging-pipe`), so no extra crate or open port is needed.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::http::{Api, request};
use support::node::{Node, pattern, require_fuse, scratch};

const MIB: u64 = 1 << 20;
const DRIVES: usize = 4;
/// How long a page may take to show what a check waits for (the monitor samples every second).
const PAGE_DEADLINE: Duration = Duration::from_secs(45);
/// One browser run; a hung Chromium fails the test instead of hanging it.
const BROWSER_RUN_MAX: Duration = Duration::from_secs(90);
/// A screenshot of a rendered 1280×900 page; a blank one compresses to a few KiB.
const SCREENSHOT_BYTES_MIN: u64 = 15_000;
const WINDOW: (u32, u32) = (1280, 900);

/// The dashboard's address for `query` (`page=drives&drive=...`), with the token or not.
fn dashboard_url(api: &Api, query: &str, token: Option<&str>) -> String {
    match token {
        Some(token) => format!("http://{}/#token={token}&{query}", api.addr),
        None => format!("http://{}/#{query}", api.addr),
    }
}

fn chromium() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|dir| dir.join("chromium")).find(|p| p.is_file()).expect(
        "the dashboard test drives a real browser: `chromium` is not on PATH \
         (scripts/test installs it: apt-get install chromium)",
    )
}

/// Flags every run shares: headless, no sandbox (the tests run as root), a fresh profile.
fn browser_command(bin: &Path, profile: &Path) -> Command {
    let mut command = Command::new(bin);
    command.args([
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--lang=en-US",
        &format!("--window-size={},{}", WINDOW.0, WINDOW.1),
        &format!("--user-data-dir={}", profile.display()),
    ]);
    command.stdin(Stdio::null());
    command
}

fn wait_child(child: &mut Child, limit: Duration, what: &str, stderr: &Path) {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            assert!(
                status.success(),
                "{what}: chromium exited with {status}: {}",
                std::fs::read_to_string(stderr).unwrap_or_default()
            );
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what}: chromium did not finish within {limit:?}: {}",
                std::fs::read_to_string(stderr).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs headless Chromium once per page load, each time with a fresh profile (so no token is
/// left over in local storage from an earlier load).
#[derive(Debug)]
struct Browser {
    bin: PathBuf,
    work: PathBuf,
    runs: usize,
}

impl Browser {
    fn new(work: PathBuf) -> Browser {
        Browser { bin: chromium(), work, runs: 0 }
    }

    fn run(&mut self, url: &str, extra: &[String], what: &str) -> String {
        self.runs += 1;
        let profile = self.work.join(format!("profile-{}", self.runs));
        let stdout = self.work.join(format!("run-{}.out", self.runs));
        let stderr = self.work.join(format!("run-{}.err", self.runs));
        let mut child = browser_command(&self.bin, &profile)
            // Virtual time runs the page's timers without waiting for them; it pauses while
            // requests to the API are in flight, so each refresh completes.
            .arg("--virtual-time-budget=5000")
            .args(extra)
            .arg(url)
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start chromium");
        wait_child(&mut child, BROWSER_RUN_MAX, what, &stderr);
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::read_to_string(&stdout).expect("chromium's output")
    }

    fn dump_dom(&mut self, url: &str, what: &str) -> Dom {
        Dom(self.run(url, &["--dump-dom".to_string()], what))
    }

    fn screenshot(&mut self, url: &str, path: &Path) {
        self.run(url, &[format!("--screenshot={}", path.display())], "screenshot");
    }

    /// Loads `url` until the page has refreshed from the API (`<body data-state="ready">`) and
    /// `check` holds, or fails with what it saw.
    fn page(&mut self, url: &str, what: &str, check: impl Fn(&Dom) -> bool) -> Dom {
        let deadline = Instant::now() + PAGE_DEADLINE;
        loop {
            let dom = self.dump_dom(url, what);
            if dom.body("data-state").as_deref() == Some("ready") && check(&dom) {
                return dom;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not seen within {PAGE_DEADLINE:?}; body {:?}, page status {:?}, page:\n{}",
                dom.body_tag(),
                dom.text("page-status"),
                dom.excerpt()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// The serialized DOM Chromium printed, with the few lookups the checks need. Elements are
/// found by their `data-testid`; states are read from `data-*` attributes, not styling.
#[derive(Debug)]
struct Dom(String);

impl Dom {
    fn body_tag(&self) -> String {
        let start = self.0.find("<body").expect("a body element");
        let end = self.0[start..].find('>').expect("end of the body tag");
        self.0[start..start + end + 1].to_string()
    }

    fn body(&self, name: &str) -> Option<String> {
        attr(&self.body_tag(), name)
    }

    /// Start offsets of the opening tags that carry `data-testid="{testid}"`.
    fn starts(&self, testid: &str) -> Vec<usize> {
        let needle = format!("data-testid=\"{testid}\"");
        self.0
            .match_indices(&needle)
            .map(|(at, _)| self.0[..at].rfind('<').expect("inside a tag"))
            .collect()
    }

    /// The opening tags with that test id.
    fn tags(&self, testid: &str) -> Vec<String> {
        self.starts(testid)
            .into_iter()
            .map(|start| {
                let end = self.0[start..].find('>').expect("end of tag");
                self.0[start..start + end + 1].to_string()
            })
            .collect()
    }

    fn count(&self, testid: &str) -> usize {
        self.starts(testid).len()
    }

    /// The inner HTML of each element with that test id.
    fn inners(&self, testid: &str) -> Vec<String> {
        self.starts(testid).into_iter().map(|start| inner_html(&self.0[start..])).collect()
    }

    /// The text of the first element with that test id.
    fn text(&self, testid: &str) -> Option<String> {
        self.inners(testid).first().map(|html| strip_tags(html))
    }

    /// The page's main region as text, for failure messages.
    fn excerpt(&self) -> String {
        let main = self.0.find("<main").map_or(&self.0[..], |at| &self.0[at..]);
        let text = strip_tags(main);
        let text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        text.chars().take(3000).collect()
    }
}

fn attr(tag: &str, name: &str) -> Option<String> {
    let needle = format!(" {name}=\"");
    let at = tag.find(&needle)? + needle.len();
    let end = tag[at..].find('"')?;
    Some(decode(&tag[at..at + end]))
}

fn attr_u64(tag: &str, name: &str) -> u64 {
    attr(tag, name)
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or_else(|| panic!("no numeric {name} in {tag}"))
}

/// What lies between an element's opening tag and its matching closing tag.
fn inner_html(from: &str) -> String {
    let name_end = from[1..].find(|c: char| c.is_whitespace() || c == '>').expect("tag name") + 1;
    let name = &from[1..name_end];
    let open_end = from.find('>').expect("end of tag") + 1;
    let (open, close) = (format!("<{name}"), format!("</{name}>"));
    let mut depth = 1;
    let mut at = open_end;
    while at < from.len() {
        let next_open = from[at..].find(&open).map(|i| at + i);
        let next_close = from[at..].find(&close).map(|i| at + i).expect("closing tag");
        match next_open {
            Some(o) if o < next_close => {
                // `<span` opens a span; `<spanx` does not.
                if from[o + open.len()..].starts_with([' ', '>']) {
                    depth += 1;
                }
                at = o + open.len();
            }
            _ => {
                depth -= 1;
                if depth == 0 {
                    return from[open_end..next_close].to_string();
                }
                at = next_close + close.len();
            }
        }
    }
    panic!("unbalanced {name}")
}

fn strip_tags(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                out.push(' ');
            }
            _ if !in_tag => out.push(c),
            _ => {}
        }
    }
    decode(&out.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn decode(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&")
}

/// `data-state` → `data-count` of a state-count list (`drives-by-state`, `targets-by-state`).
fn state_counts(dom: &Dom, testid: &str) -> HashMap<String, u64> {
    let html = dom.inners(testid).into_iter().next().unwrap_or_else(|| panic!("no {testid}"));
    html.match_indices("<li")
        .map(|(at, _)| {
            let tag = &html[at..at + html[at..].find('>').expect("end of li") + 1];
            (attr(tag, "data-state").expect("state"), attr_u64(tag, "data-count"))
        })
        .collect()
}

/// Checks a screenshot is a real PNG of the window, large enough to hold a drawn page.
fn check_png(path: &Path) {
    let bytes = std::fs::read(path)
        .unwrap_or_else(|e| panic!("screenshot {} was not written: {e}", path.display()));
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is not a PNG", path.display());
    let width = u32::from_be_bytes(bytes[16..20].try_into().expect("IHDR width"));
    let height = u32::from_be_bytes(bytes[20..24].try_into().expect("IHDR height"));
    assert_eq!((width, height), WINDOW, "{}: the window's size", path.display());
    assert!(
        bytes.len() as u64 >= SCREENSHOT_BYTES_MIN,
        "{} is {} bytes: a blank page?",
        path.display(),
        bytes.len()
    );
}

fn artifacts_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts/dashboard");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create target/test-artifacts/dashboard");
    dir.canonicalize().expect("artifacts dir")
}

fn ok(what: &str, out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn dashboard_pages_show_the_live_node_in_chromium() {
    require_fuse();
    let browser_bin = chromium(); // fail before starting a node if the browser is missing
    let dir = scratch("dashboard");
    let work = scratch("dashboard-browser");
    let artifacts = artifacts_dir();
    let mut shots: Vec<PathBuf> = Vec::new();
    let drives = DRIVES.to_string();
    let args = ["--drives", &drives, "--raid", "5", "--drive-size", "256M", "--rated-tbw", "1"];
    let mut node = Node::start(&dir, &args);
    let api = Api::of(&node);
    let mut browser = Browser::new(work.to_path_buf());
    assert_eq!(browser.bin, browser_bin);
    let url = |query: &str| dashboard_url(&api, query, Some(&api.token));

    // The page and its files need no token (they hold no data); the API still does.
    let page = request(api.addr, "GET", "/", None, None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.header("content-type").is_some_and(|c| c.starts_with("text/html")));
    assert!(
        page.header("content-security-policy").is_some_and(|c| c.contains("script-src 'self'"))
    );
    assert!(page.body.contains("/ui/app.js"));
    assert_eq!(request(api.addr, "GET", "/ui/app.js", None, None).status, 200);
    assert_eq!(request(api.addr, "GET", "/ui/no-such.js", None, None).status, 404);
    assert_eq!(request(api.addr, "GET", "/api/v1/cluster", None, None).status, 401);

    // Some traffic for the charts.
    std::fs::write(node.mount.join("load.bin"), pattern(7, 0, 16 * MIB as usize)).expect("write");
    // And files for the analytics page: a top-level directory with a file another user owns.
    std::fs::create_dir(node.mount.join("projects")).expect("mkdir");
    std::fs::write(node.mount.join("projects/report.pdf"), pattern(8, 0, MIB as usize))
        .expect("write");
    std::os::unix::fs::chown(node.mount.join("projects/report.pdf"), Some(4242), Some(4242))
        .expect("chown");
    let cluster = api.get("/api/v1/cluster");

    // Without a token the page asks for one; a wrong one brings the form back with the 401.
    // (Each wrong-token load costs about 5 failed requests; 10 a minute from one address
    // would bring 429s, so the test makes only a few.)
    let login_url = dashboard_url(&api, "page=overview", None);
    let dom = browser.dump_dom(&login_url, "the token form");
    assert_eq!(dom.body("data-view").as_deref(), Some("login"), "{}", dom.body_tag());
    assert!(!dom.tags("login")[0].contains(" hidden"), "the token form shows");
    let shot = artifacts.join("login.png");
    browser.screenshot(&login_url, &shot);
    shots.push(shot);
    let wrong = "0".repeat(64);
    let dom =
        browser.dump_dom(&dashboard_url(&api, "page=overview", Some(&wrong)), "a wrong token");
    assert_eq!(dom.body("data-view").as_deref(), Some("login"), "{}", dom.body_tag());
    let message = dom.text("login-message").unwrap_or_default();
    assert!(message.contains("refused the token") && message.contains("401"), "{message}");

    // Overview: state, capacity, hardware by state, live charts.
    let overview_url = url("page=overview");
    let dom = browser.page(&overview_url, "overview with the write in its charts", |d| {
        d.tags("chart-throughput").first().is_some_and(|t| attr_u64(t, "data-peak") > 0)
    });
    assert_eq!(dom.body("data-view").as_deref(), Some("app"));
    assert!(dom.tags("login")[0].contains(" hidden"), "the form is gone once the token works");
    assert!(!dom.0.contains(&api.token), "the token is not written into the page");
    assert_eq!(dom.text("cluster-state").as_deref(), Some("optimal"));
    let capacity = &dom.tags("capacity-bar")[0];
    assert_eq!(
        attr_u64(capacity, "data-capacity-bytes"),
        cluster["capacity_bytes"].as_u64().expect("cap")
    );
    assert!(attr_u64(capacity, "data-used-bytes") > 0, "the written file uses space: {capacity}");
    let by_state = state_counts(&dom, "drives-by-state");
    assert_eq!((by_state["active"], by_state["failed"]), (DRIVES as u64, 0), "{by_state:?}");
    assert_eq!(state_counts(&dom, "targets-by-state")["optimal"], 1);
    for chart in ["chart-throughput", "chart-iops", "chart-latency"] {
        let tag = &dom.tags(chart)[0];
        assert!(attr_u64(tag, "data-points") > 0, "{chart} has samples: {tag}");
    }
    assert!(dom.count("nav-analytics") == 1 && dom.count("nav-events") == 1);
    // Clients: the node's own mount.
    let mount = node.mount.display().to_string();
    let own = dom.tags("client-row").into_iter().find(|row| {
        attr(row, "data-kind").as_deref() == Some("fuse")
            && attr(row, "data-mount").as_deref() == Some(mount.as_str())
    });
    assert!(own.is_some(), "the node's mount is among the clients: {:?}", dom.tags("client-row"));

    // Drives: one row per drive, all active, with the wear of a 1 TBW rating.
    let drives_url = url("page=drives");
    let dom = browser.page(&drives_url, "a row per drive", |d| d.count("drive-row") == DRIVES);
    for (slot, row) in dom.tags("drive-row").iter().enumerate() {
        assert_eq!(attr(row, "data-state").as_deref(), Some("active"), "{row}");
        assert_eq!(attr(row, "data-slot"), Some(slot.to_string()), "{row}");
    }
    for (slot, html) in dom.inners("drive-row").iter().enumerate() {
        assert!(html.contains(&format!("drives/t1-d{slot}.img")), "slot {slot}: {html}");
        let text = strip_tags(html);
        assert!(!text.contains("not rated"), "slot {slot} is rated: {text}");
    }
    for wear in dom.tags("drive-wear") {
        assert_eq!(attr(&wear, "data-rated").as_deref(), Some("true"), "{wear}");
        let percent = attr(&wear, "data-wear-percent").and_then(|p| p.parse::<f64>().ok());
        assert!(percent.is_some_and(|p| p > 0.0 && p < 1.0), "written, barely worn: {wear}");
    }
    assert!(
        dom.text("drive-wear").is_some_and(|t| t.ends_with('%')),
        "{:?}",
        dom.text("drive-wear")
    );
    let first_drive = attr(&dom.tags("drive-row")[0], "data-drive-id").expect("drive id");
    let detail_url = url(&format!("page=drives&drive={first_drive}"));
    let dom = browser.page(&detail_url, "one drive's history", |d| {
        d.tags("chart-drive-throughput").first().is_some_and(|t| attr_u64(t, "data-points") > 0)
    });
    assert_eq!(attr(&dom.tags("drive-detail")[0], "data-drive-id"), Some(first_drive.clone()));
    assert_eq!(dom.text("detail-state").as_deref(), Some("active"));

    // Storage: the target is optimal, RAID 5; no volumes yet.
    let storage_url = url("page=storage");
    let dom = browser.page(&storage_url, "the target card", |d| d.count("target-card") == 1);
    let card = &dom.tags("target-card")[0];
    assert_eq!(attr(card, "data-state").as_deref(), Some("optimal"), "{card}");
    assert_eq!(dom.text("target-level").as_deref(), Some("RAID5"));
    assert_eq!(dom.text("scrub-state").as_deref(), Some("idle"));
    assert_eq!(dom.count("volume-row"), 0);

    // Performance over 15 minutes; Analytics says what it lacks; Events lists node_started.
    let performance_url = url("page=performance&range=900");
    let dom = browser.page(&performance_url, "15 minute charts", |d| {
        d.tags("perf-throughput").first().is_some_and(|t| attr_u64(t, "data-points") > 0)
    });
    assert_eq!(attr_u64(&dom.tags("perf-throughput")[0], "data-window-s"), 900);
    assert_eq!(attr(&dom.tags("perf-controls")[0], "data-range-s").as_deref(), Some("900"));
    assert!(dom.text("perf-summary").is_some_and(|t| t.contains("Throughput · write")));
    let analytics_url = url("page=analytics");
    let dom = browser.page(&analytics_url, "the analytics rankings", |d| {
        d.count("fs-card") == 1 && d.count("size-class") == 5 && d.count("fileset-row") == 2
    });
    assert_eq!(dom.count("analytics-unavailable"), 0, "{}", dom.excerpt());
    assert_eq!(dom.text("analytics-files").as_deref(), Some("2"));
    assert_eq!(dom.text("analytics-bytes").as_deref(), Some("17.0 MiB"));
    // The biggest file type is the 16 MiB .bin in the root, then the 1 MiB .pdf.
    let ext_rows = dom.tags("ext-row");
    assert_eq!(attr(&ext_rows[0], "data-extension").as_deref(), Some("bin"), "{ext_rows:?}");
    assert_eq!(attr_u64(&ext_rows[0], "data-bytes"), 16 * MIB);
    assert_eq!(dom.text("ext-row-name").as_deref(), Some(".bin"));
    assert_eq!(dom.text("ext-row-bytes").as_deref(), Some("16.0 MiB"));
    assert_eq!(attr(&ext_rows[1], "data-extension").as_deref(), Some("pdf"));
    let filesets = dom.tags("fileset-row");
    assert_eq!(attr(&filesets[1], "data-fileset").as_deref(), Some("projects"), "{filesets:?}");
    assert_eq!(strip_tags(&dom.inners("fileset-row-name")[1]), "/projects");
    assert_eq!(strip_tags(&dom.inners("fileset-row-bytes")[1]), "1.00 MiB");
    let users = dom.tags("user-row");
    let uids: Vec<_> = users.iter().map(|u| attr_u64(u, "data-uid")).collect();
    assert_eq!(uids, [0, 4242], "root's 16 MiB first");
    assert_eq!(dom.text("user-row-name").as_deref(), Some("root (0)"));
    // The histogram: both files are in the 1 MiB – 64 MiB class.
    let classes = dom.tags("size-class");
    let files: Vec<_> = classes.iter().map(|c| attr_u64(c, "data-files")).collect();
    assert_eq!(files, [0, 0, 0, 2, 0], "{classes:?}");
    assert_eq!(attr(&classes[3], "data-label").as_deref(), Some("1 MiB – 64 MiB"));
    assert!(dom.inners("size-histogram")[0].contains("<rect"), "bars drawn in SVG");
    assert!(dom.text("inodes-used").is_some_and(|n| n != "0"), "statfs counts the file");
    let events_url = url("page=events");
    let dom = browser.page(&events_url, "the event list", |d| d.count("event-row") >= 1);
    let kinds: Vec<String> =
        dom.tags("event-row").iter().map(|t| attr(t, "data-kind").expect("kind")).collect();
    assert!(kinds.contains(&"node_started".to_string()), "{kinds:?}");

    let before = [
        ("overview", &overview_url),
        ("drives", &drives_url),
        ("drive-detail", &detail_url),
        ("storage", &storage_url),
        ("performance", &performance_url),
        ("analytics", &analytics_url),
        ("events", &events_url),
    ];
    for (name, page_url) in before {
        let shot = artifacts.join(format!("{name}.png"));
        browser.screenshot(page_url, &shot);
        shots.push(shot);
    }

    // Change the node from the CLI: fail a drive, make and export a volume.
    ok("fail-drive", node.cli(&["target", "fail-drive", "--target", "1", "--slot", "1"]));
    ok("volume create", node.cli(&["volume", "create", "web1", "--size", "64M"]));
    ok("export add", node.cli(&["export", "add", "web1"]));
    ok("initiator allow", node.cli(&["initiator", "allow", "web1", "127.0.0.1"]));

    let dom = browser.page(&storage_url, "the degraded target and the new volume", |d| {
        d.tags("target-card").first().is_some_and(|t| t.contains("data-state=\"degraded\""))
            && d.count("volume-row") == 1
            && d.count("export-row") == 1
    });
    assert_eq!(dom.text("target-state").as_deref(), Some("degraded"));
    let slots = &dom.inners("slot-map")[0];
    assert!(slots.contains("data-state=\"failed\""), "the failed slot shows: {slots}");
    assert_eq!(attr(&dom.tags("volume-row")[0], "data-volume").as_deref(), Some("web1"));
    assert_eq!(dom.text("volume-size").as_deref(), Some("64.0 MiB"));
    assert_eq!(attr(&dom.tags("export-row")[0], "data-export").as_deref(), Some("web1"));
    assert_eq!(attr(&dom.tags("acl-rule")[0], "data-net").as_deref(), Some("127.0.0.1/32"));

    let dom = browser.page(&drives_url, "the failed drive", |d| {
        d.tags("drive-row").iter().any(|t| t.contains("data-state=\"failed\""))
    });
    for row in dom.tags("drive-row") {
        let want =
            if attr(&row, "data-slot").as_deref() == Some("1") { "failed" } else { "active" };
        assert_eq!(attr(&row, "data-state").as_deref(), Some(want), "{row}");
    }
    let dom = browser.page(&overview_url, "the degraded overview", |d| {
        d.text("cluster-state").as_deref() == Some("degraded")
    });
    let by_state = state_counts(&dom, "drives-by-state");
    assert_eq!((by_state["active"], by_state["failed"]), (DRIVES as u64 - 1, 1), "{by_state:?}");
    assert_eq!(state_counts(&dom, "targets-by-state")["degraded"], 1);
    assert_eq!(dom.text("volume-count").as_deref(), Some("1"));

    let dom = browser.page(&events_url, "the drive failure event", |d| {
        d.tags("event-row").iter().any(|t| t.contains("data-kind=\"drive_failed\""))
    });
    let rows = dom.tags("event-row");
    let seqs: Vec<u64> = rows.iter().map(|t| attr_u64(t, "data-seq")).collect();
    assert!(seqs.windows(2).all(|w| w[0] > w[1]), "newest first: {seqs:?}");
    let position = |kind: &str| {
        rows.iter()
            .position(|t| attr(t, "data-kind").as_deref() == Some(kind))
            .unwrap_or_else(|| panic!("no {kind} event in {rows:?}"))
    };
    assert!(position("drive_failed") < position("node_started"));
    assert!(position("volume_created") < position("node_started"));
    let failure = &dom.inners("event-row")[position("drive_failed")];
    assert!(strip_tags(failure).contains("t1-d1.img"), "{}", strip_tags(failure));

    // A snapshot is a volume of its own, shown with its origin.
    ok("snapshot", node.cli(&["volume", "snapshot", "web1", "web1-mon"]));
    let dom = browser.page(&storage_url, "the snapshot", |d| d.count("volume-row") == 2);
    assert_eq!(dom.text("volume-origin").as_deref(), Some("read-only snapshot of web1"));

    for (name, page_url) in before {
        let shot = artifacts.join(format!("{name}-after-drive-failure.png"));
        browser.screenshot(page_url, &shot);
        shots.push(shot);
    }

    // The forms, driven like a person would: token form, create volume, refusals, ACL edits.
    let mut tab = DevTools::launch(&browser.bin, &work.join("devtools-profile"));
    forms_work_through_the_api(&mut tab, &api, &artifacts, &mut shots);
    tab.close();

    for shot in &shots {
        check_png(shot);
    }
    write_index(&artifacts, &shots);
    println!("dashboard screenshots ({}):", shots.len());
    for shot in &shots {
        println!("  {}", shot.display());
    }
    println!("  {}", artifacts.join("index.html").display());

    node.stop();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&work);
}

fn forms_work_through_the_api(
    tab: &mut DevTools,
    api: &Api,
    artifacts: &Path,
    shots: &mut Vec<PathBuf>,
) {
    // No token yet in this profile: the form asks; a wrong token is refused; the right one opens
    // the page and stays in local storage.
    tab.navigate(&dashboard_url(&api, "page=storage", None));
    tab.wait("the token form", "document.body.dataset.view === 'login'");
    let wrong = "1".repeat(64);
    tab.run(&format!(
        "document.getElementById('token-input').value = '{wrong}';
         document.getElementById('login-form').requestSubmit();"
    ));
    tab.wait(
        "the 401 message",
        "document.querySelector('[data-testid=login-message]').textContent.includes('401')",
    );
    tab.run(&format!(
        "document.getElementById('token-input').value = '{}';
         document.getElementById('login-form').requestSubmit();",
        api.token
    ));
    tab.wait(
        "the storage page after signing in",
        "document.body.dataset.view === 'app' && document.body.dataset.page === 'storage' \
         && document.body.dataset.state === 'ready'",
    );
    let stored = tab.eval("localStorage.getItem('stria.api-token')");
    assert_eq!(stored, json!(api.token), "the token is kept in local storage");

    // A size the API refuses (not a multiple of 512): its message shows, naming the field.
    tab.run(
        "const f = document.querySelector('[data-testid=volume-create-form]');
         f.elements.name.value = 'ui1'; f.elements.size_bytes.value = '0.001';
         f.elements.unit.value = '1048576'; f.requestSubmit();",
    );
    tab.wait(
        "the refusal",
        "document.querySelector('[data-testid=volume-create-error]').textContent !== ''",
    );
    let error = tab.eval("document.querySelector('[data-testid=volume-create-error]').textContent");
    let error = error.as_str().expect("text");
    assert!(error.starts_with("size_bytes: ") && error.contains("400 invalid"), "{error}");
    let marked = tab.eval(
        "document.querySelector('[data-testid=volume-create-form]')
           .elements.size_bytes.getAttribute('aria-invalid')",
    );
    assert_eq!(marked, json!("true"), "the size input is marked");
    let shot = artifacts.join("storage-form-refused.png");
    tab.screenshot_below("[data-testid=volume-create-form]", &shot);
    shots.push(shot);
    assert_eq!(request(api.addr, "GET", "/api/v1/volumes/ui1", Some(&api.token), None).status, 404);

    // Corrected, it creates the volume: the API has it and the table shows it.
    tab.run(
        "const f = document.querySelector('[data-testid=volume-create-form]');
         f.elements.name.value = 'ui1'; f.elements.size_bytes.value = '32';
         f.elements.unit.value = '1048576'; f.requestSubmit();",
    );
    tab.wait("the new volume's row", "!!document.querySelector('[data-volume=ui1]')");
    assert_eq!(api.get("/api/v1/volumes/ui1")["size_bytes"].as_u64(), Some(32 * MIB));

    // Access lists: a net with host bits is refused naming `net`; a good one is allowed, then
    // denied again with its chip's button.
    let allow = |net: &str| {
        format!(
            "const f = document.querySelector('[data-testid=acl-form]');
             f.elements.export.value = 'web1'; f.elements.net.value = '{net}';
             f.querySelector('[data-testid=acl-allow]').click();"
        )
    };
    tab.run(&allow("10.0.0.1/8"));
    tab.wait(
        "the ACL refusal",
        "document.querySelector('[data-testid=acl-error]').textContent !== ''",
    );
    let error = tab.eval("document.querySelector('[data-testid=acl-error]').textContent");
    assert!(error.as_str().is_some_and(|e| e.starts_with("net: ")), "{error}");
    tab.run(&allow("10.1.0.0/16"));
    tab.wait("the new rule", "!!document.querySelector('[data-net=\"10.1.0.0/16\"]')");
    let acl = api.get("/api/v1/exports/web1")["acl"].clone();
    let mut nets: Vec<&str> =
        acl.as_array().expect("acl").iter().map(|r| r["net"].as_str().expect("net")).collect();
    nets.sort();
    assert_eq!(nets, ["10.1.0.0/16", "127.0.0.1/32"], "the API has the rule the form added");
    let shot = artifacts.join("storage-acl-edited.png");
    tab.screenshot_below("[data-testid=exports]", &shot);
    shots.push(shot);
    tab.run("document.querySelector('[data-net=\"10.1.0.0/16\"] button').click();");
    tab.wait("the rule to go", "!document.querySelector('[data-net=\"10.1.0.0/16\"]')");
    assert_eq!(api.get("/api/v1/exports/web1")["acl"].as_array().map(Vec::len), Some(1));

    // A snapshot of it from its row's button (the name prompt answered), then a clone of the
    // snapshot from the snapshot's row: both show up with their origin, and the API agrees.
    tab.run(
        "window.prompt = () => 'ui1-snap';
         document.querySelector('[data-volume=ui1] [data-testid=volume-snapshot]').click();",
    );
    tab.wait("the snapshot's row", "!!document.querySelector('[data-volume=ui1-snap]')");
    let snap = api.get("/api/v1/volumes/ui1-snap");
    assert_eq!((snap["origin"].as_str(), snap["snapshot"].as_bool()), (Some("ui1"), Some(true)));
    assert_eq!(snap["size_bytes"].as_u64(), Some(32 * MIB));
    tab.run(
        "window.prompt = () => 'ui1-copy';
         document.querySelector('[data-volume=ui1-snap] [data-testid=volume-clone]').click();",
    );
    tab.wait("the clone's row", "!!document.querySelector('[data-volume=ui1-copy]')");
    let copy = api.get("/api/v1/volumes/ui1-copy");
    assert_eq!(
        (copy["origin"].as_str(), copy["snapshot"].as_bool()),
        (Some("ui1-snap"), Some(false))
    );
    tab.wait(
        "the clone's origin shown",
        "document.querySelector('[data-volume=ui1-copy] [data-testid=volume-origin]')
           ?.textContent === 'clone of ui1-snap'",
    );
    // The volume grows; the snapshot's Roll back button gives it the snapshot's size back.
    let grow = r#"{"size_bytes": 67108864}"#;
    let grown =
        request(api.addr, "POST", "/api/v1/volumes/ui1/resize", Some(&api.token), Some(grow));
    assert_eq!(grown.status, 200, "{}", grown.body);
    tab.wait(
        "the grown size shown",
        "document.querySelector('[data-volume=ui1] [data-testid=volume-size]')?.textContent === '64.0 MiB'",
    );
    tab.run(
        "window.confirm = () => true;
         document.querySelector('[data-volume=ui1-snap] [data-testid=volume-rollback]').click();",
    );
    tab.wait(
        "the rolled-back size shown",
        "document.querySelector('[data-volume=ui1] [data-testid=volume-size]')?.textContent === '32.0 MiB'",
    );
    assert_eq!(api.get("/api/v1/volumes/ui1")["size_bytes"].as_u64(), Some(32 * MIB));
    assert_eq!(api.get("/api/v1/volumes/ui1")["state"], "online");
    // A prompt answered with nothing makes no copy.
    tab.run(
        "window.prompt = () => null;
         document.querySelector('[data-volume=ui1] [data-testid=volume-clone]').click();",
    );
    for name in ["ui1-copy", "ui1-snap"] {
        tab.run(&format!(
            "window.confirm = () => true;
             document.querySelector('[data-volume={name}] [data-testid=volume-delete]').click();"
        ));
        tab.wait("a copy's row to go", &format!("!document.querySelector('[data-volume={name}]')"));
    }
    let names: Vec<String> = api
        .get("/api/v1/volumes")
        .as_array()
        .expect("volumes")
        .iter()
        .map(|v| v["name"].as_str().expect("name").to_string())
        .collect();
    assert!(!names.iter().any(|n| n.starts_with("ui1-")), "only the copies asked for: {names:?}");

    // Delete the volume made in the form (the confirmation answered yes).
    tab.run(
        "window.confirm = () => true;
         document.querySelector('[data-volume=ui1] [data-testid=volume-delete]').click();",
    );
    tab.wait("the volume's row to go", "!document.querySelector('[data-volume=ui1]')");
    assert_eq!(request(api.addr, "GET", "/api/v1/volumes/ui1", Some(&api.token), None).status, 404);

    // Replace the failed drive from its target card: a path the API refuses names `path`; a
    // bare file name made a quarter GiB big goes into the failed slot and rebuilds.
    let replace = |path: &str| {
        format!(
            "const f = document.querySelector('[data-testid=replace-drive-form]');
             f.elements.slot.value = '1'; f.elements.path.value = '{path}';
             f.elements.create_bytes.value = '0.25'; f.requestSubmit();"
        )
    };
    tab.wait(
        "the failed slot offered",
        "[...document.querySelector('[data-testid=replace-drive-form]').elements.slot.options]
           .some((o) => o.value === '1')",
    );
    tab.run(&replace("../ui.img"));
    tab.wait(
        "the replace refusal",
        "document.querySelector('[data-testid=replace-drive-error]').textContent !== ''",
    );
    let error = tab.eval("document.querySelector('[data-testid=replace-drive-error]').textContent");
    assert!(error.as_str().is_some_and(|e| e.starts_with("path: ")), "{error}");
    tab.run(&replace("ui-new.img"));
    tab.wait(
        "the target card out of the degraded state",
        "document.querySelector('[data-testid=target-card]').dataset.state !== 'degraded'",
    );
    let t = api.get("/api/v1/targets/1");
    let slot1 = t["drives"][1]["device"].as_str().expect("device");
    assert!(slot1.ends_with("drives/ui-new.img"), "the form's drive is in slot 1: {t}");
    tab.run("document.querySelector('[data-testid=drive-controls]').open = true;");
    let shot = artifacts.join("storage-drive-replaced.png");
    tab.screenshot_below("[data-testid=target-card]", &shot);
    shots.push(shot);
}

fn write_index(dir: &Path, shots: &[PathBuf]) {
    let mut html = String::from(
        "<!doctype html><meta charset=utf-8><title>Stria dashboard screenshots</title>\
         <style>body{font-family:sans-serif;margin:20px}img{width:640px;border:1px solid #ccc}\
         figure{display:inline-block;margin:10px}</style><h1>Stria dashboard screenshots</h1>\n",
    );
    for shot in shots {
        let name = shot.file_name().expect("name").to_string_lossy();
        html.push_str(&format!(
            "<figure><a href=\"{name}\"><img src=\"{name}\" alt=\"{name}\"></a>\
             <figcaption>{name}</figcaption></figure>\n"
        ));
    }
    std::fs::write(dir.join("index.html"), html).expect("index.html");
}

/// One Chromium tab driven over the DevTools protocol on a pipe: Chromium reads commands on its
/// fd 3 and writes replies and events on fd 4, each a JSON message ended by a NUL byte.
#[derive(Debug)]
struct DevTools {
    child: Child,
    commands: std::fs::File,
    replies: Receiver<Value>,
    session: String,
    next_id: u64,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints; O_CLOEXEC keeps our ends out of the child.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: pipe2 just returned these two fds, owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl DevTools {
    fn launch(bin: &Path, profile: &Path) -> DevTools {
        use std::os::fd::AsRawFd;
        let (command_read, command_write) = pipe();
        let (reply_read, reply_write) = pipe();
        let (child_in, child_out) = (command_read.as_raw_fd(), reply_write.as_raw_fd());
        let mut command = browser_command(bin, profile);
        command.args(["--remote-debugging-pipe", "about:blank"]);
        command.stdout(Stdio::null()).stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec. The fds are
        // first copied above 10 so that placing them at 3 and 4 cannot overwrite one another.
        unsafe {
            command.pre_exec(move || {
                let high_in = libc::fcntl(child_in, libc::F_DUPFD, 10);
                let high_out = libc::fcntl(child_out, libc::F_DUPFD, 10);
                if high_in < 0
                    || high_out < 0
                    || libc::dup2(high_in, 3) < 0
                    || libc::dup2(high_out, 4) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("start chromium with --remote-debugging-pipe");
        drop(command_read);
        drop(reply_write);
        let (send, replies) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(std::fs::File::from(reply_read));
            let mut message = Vec::new();
            while reader.read_until(0, &mut message).is_ok_and(|n| n > 0) {
                message.pop();
                if let Ok(value) = serde_json::from_slice::<Value>(&message)
                    && send.send(value).is_err()
                {
                    return;
                }
                message.clear();
            }
        });
        let mut tab = DevTools {
            child,
            commands: std::fs::File::from(command_write),
            replies,
            session: String::new(),
            next_id: 0,
        };
        let target = tab.call("Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().expect("targetId").to_string();
        let attached =
            tab.call("Target.attachToTarget", json!({"targetId": target_id, "flatten": true}));
        tab.session = attached["sessionId"].as_str().expect("sessionId").to_string();
        tab.call("Page.enable", json!({}));
        // The window's size includes what a window frame takes: set the viewport itself.
        let (width, height) = WINDOW;
        let metrics =
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false});
        tab.call("Emulation.setDeviceMetricsOverride", metrics);
        tab
    }

    /// Sends a command (to the tab once attached) and waits for its reply.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.try_call(method, params).unwrap_or_else(|error| panic!("{method}: {error}"))
    }

    /// The same, with the protocol's error (a page between two documents) as `Err`.
    fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).expect("JSON");
        bytes.push(0);
        self.commands.write_all(&bytes).expect("send to chromium");
        let deadline = Instant::now() + BROWSER_RUN_MAX;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.replies.recv_timeout(left) {
                Ok(reply) if reply["id"] == json!(id) => {
                    return match reply.get("error") {
                        Some(error) => Err(error.clone()),
                        None => Ok(reply["result"].clone()),
                    };
                }
                Ok(_event) => {}
                Err(RecvTimeoutError::Timeout) => panic!("{method}: no reply from chromium"),
                Err(RecvTimeoutError::Disconnected) => panic!("{method}: chromium went away"),
            }
        }
    }

    fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
    }

    /// Evaluates `expression` in the page; its value (JSON).
    fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(result.get("exceptionDetails").is_none(), "{expression}: {result}");
        result["result"]["value"].clone()
    }

    /// Runs statements in the page (in a function, so their `const`s do not collide).
    fn run(&mut self, statements: &str) {
        self.eval(&format!("(() => {{ {statements} }})(); true"));
    }

    /// Polls until `condition` is true in the page.
    fn wait(&mut self, what: &str, condition: &str) {
        let deadline = Instant::now() + PAGE_DEADLINE;
        let guarded = format!(
            "(() => {{ try {{ return !!({condition}); }} catch (e) {{ return false; }} }})()"
        );
        let params = json!({"expression": guarded, "returnByValue": true});
        loop {
            // While a page loads there may be no document to ask: that is a "not yet".
            let done = self.try_call("Runtime.evaluate", params.clone());
            if done.is_ok_and(|r| r["result"]["value"] == json!(true)) {
                return;
            }
            if Instant::now() > deadline {
                let text = self.eval("document.body.innerText.slice(0, 3000)");
                panic!("{what}: not seen within {PAGE_DEADLINE:?}:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Scrolls `selector` to the top of the window and saves what the window shows.
    fn screenshot_below(&mut self, selector: &str, path: &Path) {
        self.run(&format!(
            "document.querySelector('{selector}').scrollIntoView({{block: 'start'}});
             window.scrollBy(0, -70);"
        ));
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64_decode(shot["data"].as_str().expect("base64 PNG"));
        std::fs::write(path, png).expect("write screenshot");
    }

    fn close(mut self) {
        // Browser.close gets no reply: the browser exits.
        let mut bytes =
            serde_json::to_vec(&json!({"id": 0, "method": "Browser.close"})).expect("JSON");
        bytes.push(0);
        let _ = self.commands.write_all(&bytes);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.wait();
    }
}

impl Drop for DevTools {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let clean: Vec<u8> = text.bytes().filter(|&c| c != b'=' && !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut bits = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            bits |= value(c) << (18 - 6 * i);
        }
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}
