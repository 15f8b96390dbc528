//! The web dashboard: static files from `web/` at the repository root, compiled into the binary
//! and served by the API server at `/` (the page) and `/ui/*` (its scripts, styles and icon).
//!
//! The files hold no data, so they need no token; the page asks for the token (or takes it
//! from the URL fragment `#token=...`, which browsers never send to the server) and reads
//! everything from `/api/v1` with it. There is no build step: plain HTML, CSS and JavaScript
//! modules. The Content-Security-Policy allows scripts, styles and requests to this origin
//! only, so nothing the API returns can run as code.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::api_error::ApiError;

/// One file the dashboard is made of.
#[derive(Debug)]
pub struct Asset {
    /// Path under `web/ui/`.
    pub path: &'static str,
    pub content_type: &'static str,
    pub bytes: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $content_type:expr) => {
        Asset {
            path: $path,
            content_type: $content_type,
            bytes: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../web/ui/", $path)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// The page itself, served at `/`.
pub const INDEX_HTML: &[u8] =
    include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../web/index.html"));

/// Every file under `web/ui/` (a test checks the list against the folder).
pub const ASSETS: &[Asset] = &[
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("chart.js", JS),
    asset!("dom.js", JS),
    asset!("format.js", JS),
    asset!("forms.js", JS),
    asset!("pages/overview.js", JS),
    asset!("pages/drives.js", JS),
    asset!("pages/storage.js", JS),
    asset!("pages/performance.js", JS),
    asset!("pages/analytics.js", JS),
    asset!("pages/events.js", JS),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
];

/// Only this origin's scripts, styles and API; no inline script, no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The dashboard's routes, to merge into the API router (outside the token check).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/", get(index)).route("/ui/{*path}", get(asset))
}

fn file(content_type: &'static str, bytes: &'static [u8]) -> Response {
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Revalidate every time: after an upgrade the browser must not mix old and new modules.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers
        .insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX_HTML)
}

async fn asset(Path(path): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.path == path) {
        Some(a) => file(a.content_type, a.bytes),
        None => ApiError::not_found(format!("the dashboard has no file ui/{path}")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path as FsPath, PathBuf};

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;

    fn web_dir() -> PathBuf {
        FsPath::new(env!("CARGO_MANIFEST_DIR")).join("../../web")
    }

    fn files_under(dir: &FsPath, prefix: &str, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("web/ui is readable") {
            let entry = entry.expect("entry");
            let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
            if entry.file_type().expect("type").is_dir() {
                files_under(&entry.path(), &format!("{name}/"), out);
            } else {
                out.push(name);
            }
        }
    }

    #[test]
    fn every_file_in_web_ui_is_served_and_nothing_else() {
        let mut on_disk = Vec::new();
        files_under(&web_dir().join("ui"), "", &mut on_disk);
        on_disk.sort();
        let mut served: Vec<String> = ASSETS.iter().map(|a| a.path.to_string()).collect();
        served.sort();
        assert_eq!(served, on_disk, "add new files in web/ui to ASSETS (and remove old ones)");
        for a in ASSETS {
            let want = match a.path.rsplit_once('.').map(|(_, ext)| ext) {
                Some("js") => JS,
                Some("css") => "text/css; charset=utf-8",
                Some("svg") => "image/svg+xml",
                other => panic!("no content type for {other:?}"),
            };
            assert_eq!(a.content_type, want, "{}", a.path);
        }
    }

    /// A module that imports a file the server does not have would leave the page blank.
    #[test]
    fn every_import_and_link_points_at_a_served_file() {
        let known = |path: &str| ASSETS.iter().any(|a| a.path == path);
        for a in ASSETS.iter().filter(|a| a.path.ends_with(".js")) {
            let text = std::str::from_utf8(a.bytes).expect("UTF-8");
            let dir = a.path.rsplit_once('/').map_or("", |(d, _)| d);
            for line in text.lines().filter(|l| l.starts_with("import ")) {
                let target = line
                    .split(['\'', '"'])
                    .nth(1)
                    .unwrap_or_else(|| panic!("{}: cannot read {line}", a.path));
                let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
                for part in target.split('/') {
                    match part {
                        "." => {}
                        ".." => {
                            assert!(parts.pop().is_some(), "{}: {target} leaves ui/", a.path);
                        }
                        p => parts.push(p),
                    }
                }
                let resolved = parts.join("/");
                assert!(known(&resolved), "{} imports {target} ({resolved}), not served", a.path);
            }
        }
        let html = std::str::from_utf8(INDEX_HTML).expect("UTF-8");
        let mut links = 0;
        for piece in html.split("\"/ui/").skip(1) {
            let path = piece.split('"').next().expect("closing quote");
            assert!(known(path), "index.html links /ui/{path}, not served");
            links += 1;
        }
        assert!(links >= 3, "index.html loads the script, the style and the icon");
    }

    async fn get_path(path: &str) -> (StatusCode, String, String, Vec<u8>) {
        let app: Router = routes();
        let request = Request::builder().uri(path).body(Body::empty()).expect("request");
        let response = app.oneshot(request).await.expect("response");
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        let (content_type, csp) =
            (header(header::CONTENT_TYPE), header(header::CONTENT_SECURITY_POLICY));
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
        (status, content_type, csp, body.to_vec())
    }

    #[tokio::test]
    async fn the_page_and_its_files_are_served_with_their_types_and_policy() {
        let (status, content_type, csp, body) = get_path("/").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, "text/html; charset=utf-8");
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert_eq!(body, INDEX_HTML);

        let (status, content_type, _, body) = get_path("/ui/pages/drives.js").await;
        assert_eq!((status, content_type.as_str()), (StatusCode::OK, JS));
        assert!(String::from_utf8_lossy(&body).contains("export default"));

        for missing in ["/ui/nope.js", "/ui/../Cargo.toml", "/ui/pages/../../index.html"] {
            let (status, content_type, _, _) = get_path(missing).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");
            assert!(content_type.starts_with("application/json"), "{missing}: {content_type}");
        }
    }
}
