//! Bearer-token authentication of the REST API and `/metrics`.
//!
//! The token is 32 random bytes (64 hex digits) made at the node's first start and kept in
//! `DATA/mgmt/api-token` with mode 0600: whoever can read that file (root, the node's owner)
//! may use the API. It is printed once, when it is made. Requests carry it as
//! `Authorization: Bearer <token>`; it is compared in constant time.
//!
//! Failures are logged and counted per peer address: past [`AUTH_FAILURES_MAX`] in a
//! [`AUTH_WINDOW`], that peer's failing requests get 429 and are no longer logged one by one.
//! A request with the right token always passes, so a scanner on the same address cannot lock
//! the operator out.

use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use axum::http::StatusCode;

use crate::api_error::ApiError;

/// Random bytes in a token.
pub const TOKEN_BYTES: usize = 32;
/// Failed attempts one peer may make per window before it gets 429.
pub const AUTH_FAILURES_MAX: u32 = 10;
pub const AUTH_WINDOW: Duration = Duration::from_secs(60);
/// Peers whose failures are tracked at once; past that the stalest are forgotten.
pub const AUTH_PEERS_MAX: usize = 4096;

/// The file holding the token, under the node's mgmt directory.
pub fn token_path(mgmt_dir: &Path) -> PathBuf {
    mgmt_dir.join("api-token")
}

/// The API token.
#[derive(Clone)]
pub struct ApiToken(String);

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiToken(..)")
    }
}

impl ApiToken {
    /// Wraps a known token (tests).
    pub fn from_string(token: String) -> ApiToken {
        ApiToken(token)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Reads the token at `path`, or makes one there (mode 0600) if there is none. The bool
    /// says whether it was made now, so the caller shows it this once.
    pub fn load_or_create(path: &Path) -> std::io::Result<(ApiToken, bool)> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let token = text.trim().to_string();
                if token.len() < 32 || !token.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "{} does not hold a usable API token (32 or more printable \
                             characters); delete it and a new one is made at the next start",
                            path.display()
                        ),
                    ));
                }
                let mode = std::fs::metadata(path)?.permissions().mode();
                if mode & 0o077 != 0 {
                    tracing::warn!(
                        path = %path.display(),
                        "the API token file is readable by others (mode {:o}): chmod 600 it",
                        mode & 0o777
                    );
                }
                Ok((ApiToken(token), false))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let token = ApiToken(random_hex(TOKEN_BYTES)?);
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)?;
                file.write_all(format!("{}\n", token.0).as_bytes())?;
                file.sync_all()?;
                Ok((token, true))
            }
            Err(e) => Err(e),
        }
    }

    /// Constant-time comparison with what a request presented.
    fn matches(&self, presented: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), presented.as_bytes());
        let mut diff = u8::from(a.len() != b.len());
        for (i, x) in a.iter().enumerate() {
            diff |= x ^ b.get(i).copied().unwrap_or(0);
        }
        diff == 0
    }
}

/// `n` bytes from the kernel's random source, as hex.
fn random_hex(n: usize) -> std::io::Result<String> {
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom").and_then(|mut f| {
        use std::io::Read;
        f.read_exact(&mut bytes)
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[derive(Debug)]
struct Failures {
    window_start: Instant,
    count: u32,
}

/// Checks tokens and limits the failures of each peer.
#[derive(Debug)]
pub struct Auth {
    token: ApiToken,
    failures: Mutex<HashMap<IpAddr, Failures>>,
    failed_total: AtomicU64,
    limited_total: AtomicU64,
}

impl Auth {
    pub fn new(token: ApiToken) -> Auth {
        Auth {
            token,
            failures: Mutex::new(HashMap::new()),
            failed_total: AtomicU64::new(0),
            limited_total: AtomicU64::new(0),
        }
    }

    /// Requests refused for a missing or wrong token (rate-limited ones included).
    pub fn failed_total(&self) -> u64 {
        self.failed_total.load(Relaxed)
    }

    /// Requests answered 429.
    pub fn limited_total(&self) -> u64 {
        self.limited_total.load(Relaxed)
    }

    /// Checks the `Authorization` header of a request from `peer` at `now`.
    pub fn check(
        &self,
        peer: IpAddr,
        authorization: Option<&str>,
        now: Instant,
    ) -> Result<(), ApiError> {
        let presented = authorization.and_then(|h| {
            let (scheme, rest) = h.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
        if let Some(token) = presented
            && self.token.matches(token)
        {
            return Ok(());
        }
        self.failed_total.fetch_add(1, Relaxed);
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= AUTH_PEERS_MAX && !failures.contains_key(&peer) {
            failures.retain(|_, f| now.duration_since(f.window_start) < AUTH_WINDOW);
            if failures.len() >= AUTH_PEERS_MAX
                && let Some(stalest) =
                    failures.iter().min_by_key(|(_, f)| f.window_start).map(|(ip, _)| *ip)
            {
                failures.remove(&stalest);
            }
        }
        let entry = failures.entry(peer).or_insert(Failures { window_start: now, count: 0 });
        if now.duration_since(entry.window_start) >= AUTH_WINDOW {
            *entry = Failures { window_start: now, count: 0 };
        }
        entry.count += 1;
        if entry.count > AUTH_FAILURES_MAX {
            self.limited_total.fetch_add(1, Relaxed);
            if entry.count == AUTH_FAILURES_MAX + 1 {
                tracing::warn!(
                    %peer,
                    "{AUTH_FAILURES_MAX} failed API authentications within {}s: further failures \
                     from this address get 429 and are not logged until the window ends",
                    AUTH_WINDOW.as_secs()
                );
            }
            let left = AUTH_WINDOW.saturating_sub(now.duration_since(entry.window_start));
            return Err(ApiError {
                retry_after_s: Some(left.as_secs().max(1)),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    "too many failed authentications from this address; wait and retry with the \
                     token from DATA/mgmt/api-token",
                )
            });
        }
        let (code, message) = match (authorization, presented) {
            (None, _) => (
                "unauthorized",
                "this route needs 'Authorization: Bearer <token>'; the token is in \
                 DATA/mgmt/api-token on the node",
            ),
            (Some(_), None) => {
                ("unauthorized", "the Authorization header must be 'Bearer <token>'")
            }
            (Some(_), Some(_)) => ("unauthorized", "the API token is wrong"),
        };
        if presented.is_some() {
            tracing::warn!(%peer, "REST request with a wrong API token refused");
        } else {
            tracing::debug!(%peer, "REST request without an API token refused");
        }
        Err(ApiError::new(StatusCode::UNAUTHORIZED, code, message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn auth() -> Auth {
        Auth::new(ApiToken::from_string("a".repeat(64)))
    }

    #[test]
    fn only_the_right_bearer_token_passes() {
        let auth = auth();
        let now = Instant::now();
        let good = format!("Bearer {}", "a".repeat(64));
        assert!(auth.check(PEER, Some(&good), now).is_ok());
        assert!(auth.check(PEER, Some(&format!("bearer  {} ", "a".repeat(64))), now).is_ok());
        for bad in [
            None,
            Some("Bearer"),
            Some("Basic YWxhZGRpbjpvcGVu"),
            Some(&*format!("Bearer {}", "a".repeat(63))),
            Some(&*format!("Bearer {}b", "a".repeat(64))),
            Some(&*format!("Bearer {}", "b".repeat(64))),
        ] {
            let e = auth.check(PEER, bad, now).expect_err("refused");
            assert_eq!(e.status, StatusCode::UNAUTHORIZED, "{bad:?}");
        }
        assert_eq!(auth.failed_total(), 6);
    }

    #[test]
    fn a_peer_past_the_failure_limit_gets_429_but_the_token_still_works() {
        let auth = auth();
        let t0 = Instant::now();
        for _ in 0..AUTH_FAILURES_MAX {
            let e = auth.check(PEER, Some("Bearer nope"), t0).expect_err("wrong");
            assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        }
        let e = auth.check(PEER, Some("Bearer nope"), t0).expect_err("limited");
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.retry_after_s, Some(AUTH_WINDOW.as_secs()));
        let other: IpAddr = "10.0.0.7".parse().expect("ip");
        assert_eq!(
            auth.check(other, None, t0).expect_err("wrong").status,
            StatusCode::UNAUTHORIZED,
            "other peers are not limited"
        );
        let good = format!("Bearer {}", "a".repeat(64));
        assert!(auth.check(PEER, Some(&good), t0).is_ok(), "the right token always passes");
        let later = t0 + AUTH_WINDOW;
        assert_eq!(
            auth.check(PEER, Some("Bearer nope"), later).expect_err("wrong").status,
            StatusCode::UNAUTHORIZED,
            "a new window starts afresh"
        );
        assert_eq!(auth.limited_total(), 1);
    }

    #[test]
    fn the_token_is_made_once_with_mode_0600() {
        let dir = std::env::temp_dir().join(format!("stria-token-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = token_path(&dir);
        let (made, created) = ApiToken::load_or_create(&path).expect("made");
        assert!(created);
        assert_eq!(made.as_str().len(), 2 * TOKEN_BYTES);
        assert!(made.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (again, created) = ApiToken::load_or_create(&path).expect("read");
        assert!(!created);
        assert_eq!(again.as_str(), made.as_str());
        std::fs::write(&path, "short\n").expect("write");
        assert!(ApiToken::load_or_create(&path).is_err(), "a damaged token file is refused");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
