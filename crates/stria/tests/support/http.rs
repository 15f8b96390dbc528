//! A small HTTP/1.1 client for the REST API tests: one request per connection, no
//! dependencies, enough to send JSON with a bearer token and read the reply.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}), status {}: {}", self.status, self.body))
    }
}

/// Sends one request; `token` goes in `Authorization: Bearer`, `body` as JSON.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Reply {
    let mut stream = TcpStream::connect(addr).expect("connect to the API");
    stream.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() || matches!(method, "POST" | "PUT") {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("send head");
    stream.write_all(body.as_bytes()).expect("send body");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read reply");
    parse(&raw)
}

fn parse(raw: &[u8]) -> Reply {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("end of headers");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status: u16 =
        status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status code");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked =
        headers.iter().any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Reply { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("0").trim(), 16)
            .expect("chunk size");
        data = &data[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// The management API of a test node: its address (from `DATA/run.json`) and token.
#[derive(Debug)]
pub struct Api {
    pub addr: std::net::SocketAddr,
    pub token: String,
}

impl Api {
    pub fn of(node: &super::node::Node) -> Api {
        let run: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(node.data.join("run.json")).expect("run.json"),
        )
        .expect("run.json is JSON");
        let addr = run["api"].as_str().expect("run.json records the API").parse().expect("addr");
        let token = std::fs::read_to_string(node.data.join("mgmt/api-token"))
            .expect("the token file")
            .trim()
            .to_string();
        Api { addr, token }
    }

    /// One request with the token.
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> Reply {
        request(self.addr, method, path, Some(&self.token), body)
    }

    /// A request that must succeed with `status`; its JSON body.
    pub fn ok(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        status: u16,
    ) -> serde_json::Value {
        let reply = self.call(method, path, body);
        assert_eq!(reply.status, status, "{method} {path}: {}", reply.body);
        reply.json()
    }

    pub fn get(&self, path: &str) -> serde_json::Value {
        self.ok("GET", path, None, 200)
    }

    /// The value of one labelled counter at /metrics, e.g.
    /// `counter("stria_metadata_ops_total", "op", "create")`; 0 when the series is absent.
    pub fn counter(&self, name: &str, label: &str, value: &str) -> u64 {
        let text = self.call("GET", "/metrics", None).body;
        let prefix = format!("{name}{{{label}=\"{value}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map_or(0, |v| v.parse::<f64>().expect("a number") as u64)
    }

    /// Waits up to `within` until `check` holds on a fresh GET of `path`; `what` names it in
    /// the failure.
    pub fn eventually(
        &self,
        path: &str,
        what: &str,
        within: std::time::Duration,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + within;
        loop {
            let value = self.get(path);
            if check(&value) {
                return value;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what} not seen within {within:?}: {value}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}
