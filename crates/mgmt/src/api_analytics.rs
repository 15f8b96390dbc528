//! `GET /api/v1/analytics`: who and what uses the file system, from the metadata service's
//! usage counters (one RPC; the counters are kept current by every change, so nothing walks
//! the tree). Owner and group names come from this node's `/etc/passwd` and `/etc/group`.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{RawQuery, State};
use stria_proto::wire::{self, ANALYTICS_TOP_MAX};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::{ApiState, blocking};
use crate::api_error::{ApiError, ErrorBody, Params};
use crate::api_types::*;

/// Entries per ranking when `top` is not given.
pub const ANALYTICS_TOP_DEFAULT: u64 = 10;
/// Largest account database read for names; a bigger one is ignored (ids only).
const ACCOUNT_FILE_BYTES_MAX: u64 = 4 << 20;

pub(crate) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(get_analytics))
}

/// Used capacity and file counts by owner, group, top-level directory (fileset) and file
/// extension, the top `top` of each by bytes; a five-class file-size histogram; the total.
#[utoipa::path(get, path = "/api/v1/analytics", tag = "monitoring",
    params(("top" = Option<u64>, Query, description = "Entries per ranking, 1 to 100 (default 10)")),
    responses((status = 200, body = Analytics), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 500, description = "The metadata service did not answer", body = ErrorBody)))]
async fn get_analytics(
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Analytics>, ApiError> {
    let params = Params::parse(query.as_deref(), &["top"])?;
    let top = params.number("top", ANALYTICS_TOP_DEFAULT, 1..=ANALYTICS_TOP_MAX as u64)? as u32;
    blocking(move || {
        let a = state.mgmt.client().analytics(top).map_err(|e| {
            ApiError::internal(format!("the metadata service did not answer analytics: {e}"))
        })?;
        let users = account_names("/etc/passwd");
        let groups = account_names("/etc/group");
        Ok(Json(analytics_body(top, a, &users, &groups)))
    })
    .await
}

fn analytics_body(
    top: u32,
    a: wire::Analytics,
    users: &HashMap<u32, String>,
    groups: &HashMap<u32, String>,
) -> Analytics {
    let mut bounds = a.size_class_bounds_bytes.iter().copied();
    let mut size_min_bytes = 0;
    let size_histogram = a
        .size_histogram
        .iter()
        .map(|usage| {
            let size_max_bytes = bounds.next();
            let label = match size_max_bytes {
                Some(max) if size_min_bytes == 0 => format!("< {}", size_label(max)),
                Some(max) => format!("{} – {}", size_label(size_min_bytes), size_label(max)),
                None => format!(">= {}", size_label(size_min_bytes)),
            };
            let class = SizeClass {
                label,
                size_min_bytes,
                size_max_bytes,
                files: usage.files,
                bytes: usage.bytes,
            };
            size_min_bytes = size_max_bytes.unwrap_or(size_min_bytes);
            class
        })
        .collect();
    Analytics {
        top,
        total: UsageCount { files: a.total.files, bytes: a.total.bytes },
        users: a
            .users
            .iter()
            .map(|u| UserUsage {
                uid: u.id,
                name: users.get(&u.id).cloned(),
                files: u.usage.files,
                bytes: u.usage.bytes,
            })
            .collect(),
        groups: a
            .groups
            .iter()
            .map(|g| GroupUsage {
                gid: g.id,
                name: groups.get(&g.id).cloned(),
                files: g.usage.files,
                bytes: g.usage.bytes,
            })
            .collect(),
        filesets: a
            .filesets
            .into_iter()
            .map(|f| FilesetUsage {
                name: f.name,
                ino: f.ino,
                files: f.usage.files,
                bytes: f.usage.bytes,
            })
            .collect(),
        extensions: a
            .extensions
            .into_iter()
            .map(|e| ExtensionUsage {
                extension: e.extension,
                files: e.usage.files,
                bytes: e.usage.bytes,
            })
            .collect(),
        size_histogram,
    }
}

/// "4 KiB", "64 MiB": the class bounds are powers of two.
fn size_label(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024 && value.is_multiple_of(1024) && unit + 1 < UNITS.len() {
        value /= 1024;
        unit += 1;
    }
    format!("{value} {}", UNITS[unit])
}

/// id → name from a `name:password:id:...` file (`/etc/passwd`, `/etc/group`); empty when it
/// cannot be read, so the API still answers with ids.
fn account_names(path: &str) -> HashMap<u32, String> {
    use std::io::Read;
    let mut text = String::new();
    let read = std::fs::File::open(path)
        .and_then(|f| f.take(ACCOUNT_FILE_BYTES_MAX).read_to_string(&mut text));
    if read.is_err() {
        return HashMap::new();
    }
    parse_accounts(&text)
}

fn parse_accounts(text: &str) -> HashMap<u32, String> {
    let mut names = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut fields = line.split(':');
        let (Some(name), Some(_), Some(id)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if let Ok(id) = id.parse::<u32>() {
            // The first entry for an id wins, as getpwuid(3) does.
            names.entry(id).or_insert_with(|| name.to_string());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_labelled_with_units() {
        let a = wire::Analytics {
            total: wire::UsageCount { files: 2, bytes: 70 << 20 },
            users: vec![wire::IdUsage { id: 0, usage: wire::UsageCount { files: 2, bytes: 9 } }],
            groups: Vec::new(),
            filesets: Vec::new(),
            extensions: Vec::new(),
            size_histogram: vec![
                wire::UsageCount { files: 1, bytes: 10 },
                wire::UsageCount::default(),
                wire::UsageCount::default(),
                wire::UsageCount::default(),
                wire::UsageCount { files: 1, bytes: 70 << 20 },
            ],
            size_class_bounds_bytes: vec![4 << 10, 64 << 10, 1 << 20, 64 << 20],
        };
        let users = parse_accounts("root:x:0:0:root:/root:/bin/sh\n#c:x:1:\nbad\ntwin:x:0:0::/:\n");
        let body = analytics_body(10, a, &users, &HashMap::new());
        let labels: Vec<_> = body.size_histogram.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(
            labels,
            ["< 4 KiB", "4 KiB – 64 KiB", "64 KiB – 1 MiB", "1 MiB – 64 MiB", ">= 64 MiB"]
        );
        let last = &body.size_histogram[4];
        assert_eq!((last.size_min_bytes, last.size_max_bytes, last.files), (64 << 20, None, 1));
        assert_eq!(body.size_histogram[1].size_min_bytes, 4 << 10);
        assert_eq!(body.users[0].name.as_deref(), Some("root"));
    }
}
