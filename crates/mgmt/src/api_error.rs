//! Errors of the REST API, and the extractors that turn bad input into them.
//!
//! Every error is `{"error": {"code", "message", "field"}}` with a status that says what the
//! client can do; the management service's statuses are mapped here, in one place.

use std::collections::HashMap;

use axum::extract::{FromRequest, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use stria_proto::mgmt::{MgmtError, MgmtStatus};
use utoipa::ToSchema;

/// Largest request body.
pub const BODY_BYTES_MAX: usize = 64 << 10;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable: `invalid`, `invalid_json`, `not_found`, `exists`,
    /// `conflict`, `no_space`, `internal`, `unauthorized`, `rate_limited`, `too_large`,
    /// `unsupported_media_type`, `method_not_allowed`, `busy`.
    pub code: String,
    /// One sentence for a person.
    pub message: String,
    /// The request field at fault (a JSON path like `size_bytes`, a query parameter or a path
    /// segment), when one is.
    pub field: Option<String>,
}

/// The body of every error response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
    /// Seconds, for `Retry-After` on 429.
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), field: None, retry_after_s: None }
    }

    /// A 400 naming the field at fault.
    pub fn invalid(field: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            field: Some(field.to_string()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid", message)
        }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// Attaches the field a management error is about (its message names it too).
    pub fn with_field(mut self, field: &str) -> ApiError {
        if self.status == StatusCode::BAD_REQUEST {
            self.field = Some(field.to_string());
        }
        self
    }
}

impl From<MgmtError> for ApiError {
    fn from(e: MgmtError) -> ApiError {
        let (status, code) = match e.status {
            MgmtStatus::Invalid => (StatusCode::BAD_REQUEST, "invalid"),
            MgmtStatus::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            MgmtStatus::Exists => (StatusCode::CONFLICT, "exists"),
            MgmtStatus::Conflict => (StatusCode::CONFLICT, "conflict"),
            MgmtStatus::NoSpace => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
            MgmtStatus::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError::new(status, code, e.message)
    }
}

impl From<crate::service::DriveChangeRefusal> for ApiError {
    fn from(r: crate::service::DriveChangeRefusal) -> ApiError {
        let error = ApiError::from(r.error);
        match r.field {
            Some(field) => error.with_field(field),
            None => error,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = %self.status, "REST request failed: {}", self.message);
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
                field: self.field,
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after_s
            && let Ok(value) = HeaderValue::from_str(&s.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"stria\""),
            );
        }
        response
    }
}

/// The field a serde error names: the path to the value, or the missing/unknown field
/// inside it.
fn field_of(path: &str, inner: &str) -> Option<String> {
    let named = ["missing field `", "unknown field `", "duplicate field `"]
        .iter()
        .find_map(|p| inner.find(p).map(|at| &inner[at + p.len()..]))
        .and_then(|rest| rest.split('`').next())
        .map(str::to_string);
    let path = (path != "." && !path.is_empty()).then(|| path.to_string());
    match (path, named) {
        // An unknown field is in the path already.
        (Some(p), Some(n)) if p == n || p.ends_with(&format!(".{n}")) => Some(p),
        (Some(p), Some(n)) => Some(format!("{p}.{n}")),
        (p, n) => n.or(p),
    }
}

/// Decodes a JSON body, naming the field at fault in a 400.
pub fn decode_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let field = field_of(&path, &inner.to_string());
        let code = if inner.is_syntax() || inner.is_eof() { "invalid_json" } else { "invalid" };
        let message = match &field {
            Some(f) => format!("field '{f}': {inner}"),
            None => format!("the body is not valid JSON for this request: {inner}"),
        };
        ApiError { field, ..ApiError::new(StatusCode::BAD_REQUEST, code, message) }
    })?;
    de.end().map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", format!("trailing data: {e}"))
    })?;
    Ok(value)
}

/// A JSON request body: at most [`BODY_BYTES_MAX`], `Content-Type: application/json` (or
/// none), every problem a 400/413/415 in the API's error format.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_content_type(&req)?;
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            let status = e.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    status,
                    "too_large",
                    format!("request bodies are at most {BODY_BYTES_MAX} bytes"),
                )
            } else {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid", e.body_text())
            }
        })?;
        decode_json(&bytes).map(ApiJson)
    }
}

fn check_content_type(req: &Request) -> Result<(), ApiError> {
    let Some(value) = req.headers().get(header::CONTENT_TYPE) else { return Ok(()) };
    let mime = value.to_str().unwrap_or("").split(';').next().unwrap_or("").trim();
    if mime.eq_ignore_ascii_case("application/json") || mime.ends_with("+json") {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("send the body as application/json, not '{mime}'"),
        ))
    }
}

/// Query parameters, checked one by one so a bad one is named; unknown ones are refused
/// (a typo should not be silently ignored).
#[derive(Debug)]
pub struct Params(HashMap<String, String>);

impl Params {
    pub fn parse(query: Option<&str>, known: &[&str]) -> Result<Params, ApiError> {
        let mut map = HashMap::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(key)?;
            if !known.contains(&key.as_str()) {
                return Err(ApiError::invalid(
                    &key,
                    format!("unknown query parameter '{key}'; this route takes {}", list(known)),
                ));
            }
            map.insert(key, percent_decode(value)?);
        }
        Ok(Params(map))
    }

    pub fn string(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// An unsigned number within `range`, or `default` when absent.
    pub fn number(
        &self,
        key: &str,
        default: u64,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<u64, ApiError> {
        let Some(text) = self.0.get(key) else { return Ok(default) };
        let value: u64 = text
            .parse()
            .map_err(|_| ApiError::invalid(key, format!("'{text}' is not a whole number")))?;
        if !range.contains(&value) {
            return Err(ApiError::invalid(
                key,
                format!("{key} must be between {} and {}", range.start(), range.end()),
            ));
        }
        Ok(value)
    }
}

fn list(known: &[&str]) -> String {
    if known.is_empty() { "none".into() } else { known.join(", ") }
}

fn percent_decode(text: &str) -> Result<String, ApiError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                let byte = hex.and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or_else(|| {
                    ApiError::new(StatusCode::BAD_REQUEST, "invalid", "bad %-escape in the query")
                })?;
                out.push(byte);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid", "the query is not valid UTF-8")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        name: String,
        size_bytes: u64,
        inner: Option<Inner>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        depth: u32,
    }

    fn field(json: &str) -> (String, Option<String>) {
        let e = decode_json::<Body>(json.as_bytes()).expect_err("refused");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        (e.code.to_string(), e.field)
    }

    #[test]
    fn bad_bodies_name_the_field() {
        assert_eq!(field(r#"{"name":"a"}"#), ("invalid".into(), Some("size_bytes".into())));
        assert_eq!(
            field(r#"{"name":"a","size_bytes":"big"}"#),
            ("invalid".into(), Some("size_bytes".into()))
        );
        assert_eq!(
            field(r#"{"name":"a","size_bytes":-1}"#),
            ("invalid".into(), Some("size_bytes".into()))
        );
        assert_eq!(
            field(r#"{"name":"a","size_bytes":1,"colour":2}"#),
            ("invalid".into(), Some("colour".into()))
        );
        assert_eq!(
            field(r#"{"name":"a","size_bytes":1,"inner":{"depth":"x"}}"#),
            ("invalid".into(), Some("inner.depth".into()))
        );
        assert_eq!(
            field(r#"{"name":"a","size_bytes":1,"inner":{}}"#),
            ("invalid".into(), Some("inner.depth".into()))
        );
        assert_eq!(field(r#"{"name":"a", "#).0, "invalid_json");
        assert_eq!(field(r#"[1,2]"#).0, "invalid");
        assert!(decode_json::<Body>(br#"{"name":"a","size_bytes":1} x"#).is_err());
        assert!(decode_json::<Body>(br#"{"name":"a","size_bytes":1}"#).is_ok());
    }

    #[test]
    fn management_statuses_map_to_http_statuses() {
        let cases = [
            (MgmtStatus::Invalid, 400, "invalid"),
            (MgmtStatus::NotFound, 404, "not_found"),
            (MgmtStatus::Exists, 409, "exists"),
            (MgmtStatus::Conflict, 409, "conflict"),
            (MgmtStatus::NoSpace, 507, "no_space"),
            (MgmtStatus::Internal, 500, "internal"),
        ];
        for (status, http, code) in cases {
            let e = ApiError::from(MgmtError::new(status, "m"));
            assert_eq!((e.status.as_u16(), e.code), (http, code), "{status:?}");
        }
    }

    #[test]
    fn query_parameters_are_checked_by_name() {
        let p = Params::parse(Some("seconds=60&since=a%20b"), &["seconds", "since"]).expect("ok");
        assert_eq!(p.number("seconds", 300, 1..=3600).expect("ok"), 60);
        assert_eq!(p.string("since"), Some("a b"));
        let e = p.number("since", 0, 0..=10).expect_err("not a number");
        assert_eq!(e.field.as_deref(), Some("since"));
        let p = Params::parse(Some("seconds=0"), &["seconds"]).expect("ok");
        assert_eq!(
            p.number("seconds", 1, 1..=3600).expect_err("range").field.as_deref(),
            Some("seconds")
        );
        let e = Params::parse(Some("secnds=5"), &["seconds"]).expect_err("unknown");
        assert_eq!(e.field.as_deref(), Some("secnds"));
    }
}
