//! The REST API (`/api/v1`, JSON) and `/metrics`, served by axum; the OpenAPI document is
//! generated from the handlers (utoipa) and served at `/api/v1/openapi.json`.
//!
//! Every change goes through [`Mgmt::handle`], the code path the CLI's RPC takes, so the API and
//! the CLI cannot disagree. Hardware state comes from the [`NodeView`]; charts from the
//! [`Monitor`]. Handlers do their blocking work on tokio's blocking pool.
//!
//! Auth: every route but `GET /api/v1/health` and `GET /api/v1/openapi.json` needs the bearer
//! token (`api_auth`); `/metrics` needs it too (Prometheus sends it with `authorization:
//! { credentials_file: ... }`). The dashboard's static files (`/` and `/ui/*`, see
//! [`crate::dashboard`]) hold no data and need no token; the page sends it with every API call.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use stria_proto::fs::TargetId;
use stria_proto::mgmt::{MgmtReply, MgmtRequest};
use tokio::sync::Semaphore;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api_auth::{ApiToken, Auth};
use crate::api_error::{ApiError, ApiJson, BODY_BYTES_MAX, ErrorBody, Params, decode_json};
use crate::api_types::*;
use crate::events::{EVENTS_MAX, EventKind, Severity};
use crate::metrics::{self, Scrape};
use crate::monitor::{Monitor, Performance, SERIES_POINTS};
use crate::node_view::{DriveStatus, NodeIdentity, NodeView, TargetState, TargetStatus};
use crate::service::Mgmt;

/// Requests served at once; more get 503 (the handlers hold blocking threads).
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;
/// Rebuild rates the API accepts.
pub const REBUILD_RATE_MIN_BYTES_S: u64 = 1 << 20;
pub const REBUILD_RATE_MAX_BYTES_S: u64 = 100 << 30;
/// Slowest scrub rate the API accepts (a slower one would take weeks on a real drive).
pub const SCRUB_RATE_MIN_BYTES_S: u64 = 1 << 20;
/// Default window of `/api/v1/performance`.
pub const PERFORMANCE_SECONDS_DEFAULT: u64 = 300;
/// Default page of `/api/v1/events`.
pub const EVENTS_LIMIT_DEFAULT: u64 = 100;

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    pub(crate) mgmt: Mgmt,
    monitor: Arc<Monitor>,
    identity: Arc<NodeIdentity>,
    auth: Arc<Auth>,
    openapi_json: Arc<String>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState").field("identity", &self.identity).finish_non_exhaustive()
    }
}

impl ApiState {
    pub fn new(
        mgmt: Mgmt,
        monitor: Arc<Monitor>,
        identity: NodeIdentity,
        token: ApiToken,
    ) -> ApiState {
        let openapi_json =
            openapi().to_pretty_json().unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
        ApiState {
            mgmt,
            monitor,
            identity: Arc::new(identity),
            auth: Arc::new(Auth::new(token)),
            openapi_json: Arc::new(openapi_json),
        }
    }

    pub(crate) fn view(&self) -> &Arc<dyn NodeView> {
        self.monitor.view()
    }

    pub(crate) fn monitor(&self) -> &Monitor {
        &self.monitor
    }
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The token in DATA/mgmt/api-token on the node (made at its first start).",
                    ))
                    .build(),
            ),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Stria management API",
        description = "Volumes, exports, drives, targets, events, performance and file-system \
            analytics of a Stria node. \
            Every route but health and this document needs `Authorization: Bearer <token>`; \
            errors are `{\"error\": {\"code\", \"message\", \"field\"}}`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "node", description = "The cluster, its nodes and their health"),
        (name = "hardware", description = "Drives, targets (RAID arrays) and pools"),
        (name = "volumes", description = "Block volumes, their NBD exports and access lists"),
        (name = "monitoring", description = "Events, performance series and metrics"),
    ),
)]
struct ApiDoc;

/// Routes that need the token, and routes that do not.
fn parts() -> (OpenApiRouter<ApiState>, OpenApiRouter<ApiState>) {
    let protected = OpenApiRouter::new()
        .routes(routes!(get_cluster))
        .routes(routes!(list_nodes))
        .routes(routes!(list_drives))
        .routes(routes!(get_drive))
        .routes(routes!(fail_drive))
        .routes(routes!(list_targets))
        .routes(routes!(get_target))
        .routes(routes!(set_rebuild_rate))
        .merge(crate::api_drives::routes())
        .routes(routes!(start_scrub, stop_scrub))
        .routes(routes!(list_pools))
        .routes(routes!(list_filesystems))
        .routes(routes!(list_clients))
        .merge(crate::api_volumes::routes())
        .merge(crate::api_analytics::routes())
        .routes(routes!(list_events))
        .routes(routes!(get_performance))
        .routes(routes!(get_metrics));
    let public = OpenApiRouter::new().routes(routes!(health)).routes(routes!(get_openapi));
    (protected, public)
}

/// The OpenAPI document of this API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (protected, public) = parts();
    let mut doc = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(protected)
        .merge(public)
        .into_openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    complete_responses(&mut doc);
    doc
}

fn status_description(status: &str) -> &'static str {
    match status {
        "200" => "Success",
        "201" => "Created",
        "202" => "Accepted: the work runs in the background",
        "400" => "Invalid request: `error.field` names the field, parameter or path segment",
        "401" => "Missing or wrong bearer token",
        "404" => "No such resource",
        "409" => "Conflicts with the current state",
        "413" => "The body is larger than 64 KiB",
        "415" => "The body is not application/json",
        "429" => "Too many failed authentications from this address (see Retry-After)",
        "500" => "The node failed to do it (see the log)",
        "507" => "Not enough space",
        _ => "See the error body",
    }
}

/// Fills what the handler annotations leave out, the same for every route: a description on
/// each response (OpenAPI requires one), 401 and 429 on routes that need the token, 413 and
/// 415 on routes that take a body.
fn complete_responses(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    let error = |status: &str| {
        RefOr::T(
            ResponseBuilder::new()
                .description(status_description(status))
                .content(
                    "application/json",
                    ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build(),
                )
                .build(),
        )
    };
    for item in doc.paths.paths.values_mut() {
        for op in [&mut item.get, &mut item.post, &mut item.delete, &mut item.put, &mut item.patch]
            .into_iter()
            .flatten()
        {
            let responses = &mut op.responses.responses;
            if op.security.is_none() {
                for status in ["401", "429"] {
                    responses.entry(status.to_string()).or_insert_with(|| error(status));
                }
            }
            if op.request_body.is_some() {
                for status in ["413", "415"] {
                    responses.entry(status.to_string()).or_insert_with(|| error(status));
                }
            }
            for (status, response) in responses.iter_mut() {
                if let RefOr::T(r) = response
                    && r.description.is_empty()
                {
                    r.description = status_description(status).to_string();
                }
            }
        }
    }
}

/// The whole HTTP service.
pub fn router(state: ApiState) -> axum::Router {
    let (protected, public) = parts();
    let (protected, _) = protected.split_for_parts();
    let (public, _) = public.split_for_parts();
    let limit = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX));
    protected
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .merge(public)
        .merge(crate::dashboard::routes())
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .layer(middleware::from_fn_with_state(limit, limit_in_flight))
        .with_state(state)
}

async fn no_route() -> ApiError {
    ApiError::not_found("no such route; the API is under /api/v1 (see /api/v1/openapi.json)")
}

async fn wrong_method() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method (see /api/v1/openapi.json)",
    )
}

async fn limit_in_flight(
    State(limit): State<Arc<Semaphore>>,
    request: Request,
    next: Next,
) -> Response {
    match limit.try_acquire() {
        Ok(_permit) => next.run(request).await,
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            format!("{REQUESTS_IN_FLIGHT_MAX} requests are in flight already; retry shortly"),
        )
        .into_response(),
    }
}

async fn require_token(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
    let header = request.headers().get(header::AUTHORIZATION).and_then(|h| h.to_str().ok());
    match state.auth.check(peer, header, Instant::now()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// Runs blocking work (registry, RPCs, locks) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|_| Err(ApiError::internal("the request's handler panicked (see the log)")))
}

fn unix_now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn worst(targets: &[TargetStatus]) -> TargetState {
    targets.iter().map(|t| t.state).min().unwrap_or(TargetState::Optimal)
}

pub(crate) fn parse_target(id: &str) -> Result<TargetId, ApiError> {
    id.parse::<u32>()
        .map(TargetId)
        .map_err(|_| ApiError::invalid("id", format!("target id '{id}' is not a number")))
}

pub(crate) fn find_target(view: &dyn NodeView, id: TargetId) -> Result<TargetStatus, ApiError> {
    view.targets()
        .into_iter()
        .find(|t| t.id == id)
        .ok_or_else(|| ApiError::not_found(format!("no target {id} on this node")))
}

fn find_drive(view: &dyn NodeView, id: &str) -> Result<DriveStatus, ApiError> {
    view.targets()
        .into_iter()
        .flat_map(|t| t.drives)
        .find(|d| d.id == id)
        .ok_or_else(|| ApiError::not_found(format!("no drive '{id}' on this node")))
}

fn node_of(state: &ApiState, targets: &[TargetStatus]) -> Node {
    Node {
        identity: (*state.identity).clone(),
        uptime_s: unix_now_s().saturating_sub(state.identity.started_unix_s),
        state: worst(targets),
        targets: targets.len() as u32,
        drives: targets.iter().map(|t| t.drives.len() as u32).sum(),
    }
}

/// Liveness, without a token.
#[utoipa::path(get, path = "/api/v1/health", tag = "node", security(()),
    responses((status = 200, description = "The API answers", body = Health)))]
async fn health() -> Json<Health> {
    Json(Health { status: "ok".into(), version: env!("CARGO_PKG_VERSION").into() })
}

/// This document, without a token (it describes routes, not data).
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "node", security(()),
    responses((status = 200, description = "OpenAPI 3.1 document", content_type = "application/json")))]
async fn get_openapi(State(state): State<ApiState>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], state.openapi_json.as_str().to_string())
        .into_response()
}

/// The cluster: state, capacity and its nodes.
#[utoipa::path(get, path = "/api/v1/cluster", tag = "node",
    responses((status = 200, body = Cluster), (status = 401, body = ErrorBody)))]
async fn get_cluster(State(state): State<ApiState>) -> Result<Json<Cluster>, ApiError> {
    blocking(move || {
        let targets = state.view().targets();
        let volumes = state.mgmt.registry().volumes()?.len() as u32;
        let exports = state.mgmt.registry().exports()?.len() as u32;
        let sum = |get: fn(&TargetStatus) -> u64| targets.iter().map(get).sum::<u64>();
        Ok(Json(Cluster {
            version: env!("CARGO_PKG_VERSION").into(),
            state: worst(&targets),
            capacity_bytes: sum(|t| t.space.total_bytes),
            used_bytes: sum(|t| t.space.used_bytes),
            free_bytes: sum(|t| t.space.free_bytes + t.space.reclaimable_bytes),
            volumes,
            exports,
            nodes: vec![node_of(&state, &targets)],
        }))
    })
    .await
}

/// The nodes of the cluster (one per `stria up` today).
#[utoipa::path(get, path = "/api/v1/nodes", tag = "node",
    responses((status = 200, body = Vec<Node>), (status = 401, body = ErrorBody)))]
async fn list_nodes(State(state): State<ApiState>) -> Result<Json<Vec<Node>>, ApiError> {
    blocking(move || {
        let targets = state.view().targets();
        Ok(Json(vec![node_of(&state, &targets)]))
    })
    .await
}

/// Every drive: members of each target in slot order, then spares.
#[utoipa::path(get, path = "/api/v1/drives", tag = "hardware",
    responses((status = 200, body = Vec<DriveStatus>), (status = 401, body = ErrorBody)))]
async fn list_drives(State(state): State<ApiState>) -> Result<Json<Vec<DriveStatus>>, ApiError> {
    blocking(move || Ok(Json(state.view().targets().into_iter().flat_map(|t| t.drives).collect())))
        .await
}

/// One drive, by id.
#[utoipa::path(get, path = "/api/v1/drives/{id}", tag = "hardware",
    params(("id" = String, Path, description = "The drive's id (uuid)")),
    responses((status = 200, body = DriveStatus), (status = 404, body = ErrorBody)))]
async fn get_drive(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<DriveStatus>, ApiError> {
    blocking(move || find_drive(state.view().as_ref(), &id).map(Json)).await
}

/// Takes a drive out of service, as `stria target fail-drive` does; a hot spare, if any, starts
/// rebuilding in its place (the failed drive is then no longer listed among the target's
/// drives). Refused (409) when the array would lose data or the drive is out already.
#[utoipa::path(post, path = "/api/v1/drives/{id}/fail", tag = "hardware",
    params(("id" = String, Path, description = "The drive's id (uuid)")),
    responses((status = 200, description = "The drive after the change", body = DriveStatus),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn fail_drive(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<DriveStatus>, ApiError> {
    blocking(move || {
        let drive = find_drive(state.view().as_ref(), &id)?;
        let Some(slot) = drive.slot else {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("drive '{id}' is a spare, not in service; there is nothing to fail"),
            ));
        };
        state.mgmt.fail_drive(drive.target, slot)?;
        state.monitor.observe_now();
        // A hot spare that took the slot at once leaves the failed drive unlisted: the reply
        // is then its last view, failed.
        Ok(Json(
            find_drive(state.view().as_ref(), &id)
                .unwrap_or(DriveStatus { state: "failed".into(), ..drive }),
        ))
    })
    .await
}

/// Every target (RAID array) with its geometry, state, rebuild, scrub and space.
#[utoipa::path(get, path = "/api/v1/targets", tag = "hardware",
    responses((status = 200, body = Vec<TargetStatus>), (status = 401, body = ErrorBody)))]
async fn list_targets(State(state): State<ApiState>) -> Result<Json<Vec<TargetStatus>>, ApiError> {
    blocking(move || Ok(Json(state.view().targets()))).await
}

/// One target.
#[utoipa::path(get, path = "/api/v1/targets/{id}", tag = "hardware",
    params(("id" = u32, Path, description = "Target id")),
    responses((status = 200, body = TargetStatus), (status = 404, body = ErrorBody)))]
async fn get_target(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<TargetStatus>, ApiError> {
    let id = parse_target(&id)?;
    blocking(move || find_target(state.view().as_ref(), id).map(Json)).await
}

/// Sets what a rebuild of the target may move per second; a running rebuild follows at once.
#[utoipa::path(post, path = "/api/v1/targets/{id}/rebuild-rate", tag = "hardware",
    params(("id" = u32, Path, description = "Target id")),
    request_body = RebuildRate,
    responses((status = 200, body = TargetStatus), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn set_rebuild_rate(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<RebuildRate>,
) -> Result<Json<TargetStatus>, ApiError> {
    let id = parse_target(&id)?;
    if !(REBUILD_RATE_MIN_BYTES_S..=REBUILD_RATE_MAX_BYTES_S).contains(&body.rate_bytes_per_s) {
        return Err(ApiError::invalid(
            "rate_bytes_per_s",
            format!(
                "a rebuild rate must be between {REBUILD_RATE_MIN_BYTES_S} (1 MiB/s) and \
                 {REBUILD_RATE_MAX_BYTES_S} (100 GiB/s) bytes per second"
            ),
        ));
    }
    blocking(move || {
        find_target(state.view().as_ref(), id)?;
        state.view().set_rebuild_rate(id, body.rate_bytes_per_s)?;
        state.mgmt.events().record(
            EventKind::RebuildRateChanged,
            Severity::Info,
            format!("target/{}", id.0),
            format!("rebuild rate of target {id} set to {} bytes/s", body.rate_bytes_per_s),
        );
        find_target(state.view().as_ref(), id).map(Json)
    })
    .await
}

/// Starts a scrub of the target in the background: every block's checksum and every stripe's
/// parity is checked; with `repair` (the default) bad blocks are rewritten from redundancy.
#[utoipa::path(post, path = "/api/v1/targets/{id}/scrub", tag = "hardware",
    params(("id" = u32, Path, description = "Target id")),
    request_body = StartScrub,
    responses((status = 202, description = "Started", body = TargetStatus),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "A scrub runs already, or the array has failed", body = ErrorBody)))]
async fn start_scrub(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<(StatusCode, Json<TargetStatus>), ApiError> {
    let id = parse_target(&id)?;
    // An empty body takes the defaults.
    let body: StartScrub = if body.iter().all(u8::is_ascii_whitespace) {
        StartScrub { repair: true, rate_bytes_per_s: None }
    } else {
        decode_json(&body)?
    };
    if body.rate_bytes_per_s.is_some_and(|r| r < SCRUB_RATE_MIN_BYTES_S) {
        return Err(ApiError::invalid(
            "rate_bytes_per_s",
            format!("a scrub rate must be at least {SCRUB_RATE_MIN_BYTES_S} bytes per second"),
        ));
    }
    blocking(move || {
        find_target(state.view().as_ref(), id)?;
        state.view().start_scrub(id, body.repair, body.rate_bytes_per_s)?;
        let how = if body.repair { "scrub" } else { "check (no repair)" };
        state.mgmt.events().record(
            EventKind::ScrubStarted,
            Severity::Info,
            format!("target/{}", id.0),
            format!("{how} of target {id} started"),
        );
        Ok((StatusCode::ACCEPTED, Json(find_target(state.view().as_ref(), id)?)))
    })
    .await
}

/// Stops the running scrub of the target after the stripe in hand; what it found so far
/// stays in `scrub.findings`.
#[utoipa::path(delete, path = "/api/v1/targets/{id}/scrub", tag = "hardware",
    params(("id" = u32, Path, description = "Target id")),
    responses((status = 200, body = TargetStatus), (status = 404, body = ErrorBody),
        (status = 409, description = "No scrub runs", body = ErrorBody)))]
async fn stop_scrub(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<TargetStatus>, ApiError> {
    let id = parse_target(&id)?;
    blocking(move || {
        find_target(state.view().as_ref(), id)?;
        state.view().stop_scrub(id)?;
        state.monitor.observe_now();
        find_target(state.view().as_ref(), id).map(Json)
    })
    .await
}

/// Pools and what their targets hold.
#[utoipa::path(get, path = "/api/v1/pools", tag = "hardware",
    responses((status = 200, body = Vec<Pool>), (status = 401, body = ErrorBody)))]
async fn list_pools(State(state): State<ApiState>) -> Result<Json<Vec<Pool>>, ApiError> {
    blocking(move || {
        let targets = state.view().targets();
        let volumes = state.mgmt.registry().volumes()?;
        let mut names: Vec<String> = targets.iter().map(|t| t.pool.clone()).collect();
        names.sort();
        names.dedup();
        let pools = names
            .into_iter()
            .map(|name| {
                let members: Vec<TargetStatus> =
                    targets.iter().filter(|t| t.pool == name).cloned().collect();
                let sum = |get: fn(&TargetStatus) -> u64| members.iter().map(get).sum::<u64>();
                let in_pool = volumes.iter().filter(|v| v.layout.pool == name);
                Pool {
                    targets: members.iter().map(|t| t.id).collect(),
                    state: worst(&members),
                    capacity_bytes: sum(|t| t.space.total_bytes),
                    used_bytes: sum(|t| t.space.used_bytes),
                    free_bytes: sum(|t| t.space.free_bytes + t.space.reclaimable_bytes),
                    volumes: in_pool.clone().count() as u32,
                    provisioned_bytes: in_pool.map(|v| v.size_bytes).sum(),
                    name,
                }
            })
            .collect();
        Ok(Json(pools))
    })
    .await
}

/// The file system: capacity and inodes as `statfs` reports them.
#[utoipa::path(get, path = "/api/v1/filesystems", tag = "hardware",
    responses((status = 200, body = Vec<FileSystem>), (status = 401, body = ErrorBody),
        (status = 500, description = "The metadata service did not answer", body = ErrorBody)))]
async fn list_filesystems(
    State(state): State<ApiState>,
) -> Result<Json<Vec<FileSystem>>, ApiError> {
    blocking(move || {
        let s = state.mgmt.client().statfs().map_err(|e| {
            ApiError::internal(format!("the metadata service did not answer statfs: {e}"))
        })?;
        Ok(Json(vec![FileSystem {
            name: "stria".into(),
            pool: "default".into(),
            mount: state.identity.addresses.mount.clone(),
            capacity_bytes: s.bytes_total,
            free_bytes: s.bytes_free,
            used_bytes: s.bytes_total.saturating_sub(s.bytes_free),
            inodes_total: s.files_total,
            inodes_used: s.files_used,
            inodes_free: s.files_total.saturating_sub(s.files_used),
        }]))
    })
    .await
}

/// One client of the node: a FUSE mount (its own, or a `stria mount` elsewhere), or an NBD
/// connection.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Client {
    /// `fuse` or `nbd`.
    pub kind: String,
    /// The mount point, on the mount's machine (`fuse`).
    pub mount: Option<String>,
    /// The machine of a `stria mount` (`fuse`; absent for the node's own mount).
    pub host: Option<String>,
    /// The initiator's address (`nbd`).
    pub peer: Option<String>,
    /// The export it uses (`nbd`).
    pub export: Option<String>,
    /// The connection runs TLS (`nbd`).
    pub tls: Option<bool>,
    /// Connected since, in seconds since the Unix epoch (`nbd`, and `fuse` of a `stria mount`).
    pub since_unix_s: Option<u64>,
}

/// The clients using the node now: its FUSE mount, the `stria mount`s heard from within the
/// last 30 s, and every NBD connection in transmission.
#[utoipa::path(get, path = "/api/v1/clients", tag = "volumes",
    responses((status = 200, body = Vec<Client>), (status = 401, body = ErrorBody)))]
async fn list_clients(State(state): State<ApiState>) -> Result<Json<Vec<Client>>, ApiError> {
    blocking(move || {
        let mut out = Vec::new();
        if let Some(mount) = &state.identity.addresses.mount {
            out.push(Client {
                kind: "fuse".into(),
                mount: Some(mount.clone()),
                host: None,
                peer: None,
                export: None,
                tls: None,
                since_unix_s: None,
            });
        }
        // The metadata service lists the other mounts; without it they are left out.
        match state.mgmt.client().sessions() {
            Ok(sessions) => out.extend(sessions.into_iter().map(|s| Client {
                kind: s.info.kind,
                mount: Some(s.info.mount),
                host: Some(s.info.host),
                peer: None,
                export: None,
                tls: None,
                since_unix_s: Some(s.since_unix_s),
            })),
            Err(e) => tracing::warn!(%e, "listing the mounts of other clients"),
        }
        for c in state.mgmt.gateway_clients() {
            out.push(Client {
                kind: "nbd".into(),
                mount: None,
                host: None,
                peer: Some(c.peer.to_string()),
                export: Some(c.export),
                tls: Some(c.tls),
                since_unix_s: Some(c.since_unix_s),
            });
        }
        Ok(Json(out))
    })
    .await
}

/// Recent events, oldest first (the last 1000 are kept in memory).
#[utoipa::path(get, path = "/api/v1/events", tag = "monitoring",
    params(("since" = Option<u64>, Query, description = "Only events after this sequence number"),
        ("limit" = Option<u64>, Query, description = "At most this many, the newest (1 to 1000, default 100)")),
    responses((status = 200, body = EventPage), (status = 400, body = ErrorBody)))]
async fn list_events(
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
) -> Result<Json<EventPage>, ApiError> {
    let params = Params::parse(query.as_deref(), &["since", "limit"])?;
    let since = params.number("since", 0, 0..=u64::MAX)?;
    let limit = params.number("limit", EVENTS_LIMIT_DEFAULT, 1..=EVENTS_MAX as u64)?;
    let events = state.mgmt.events();
    Ok(Json(EventPage { events: events.since(since, limit as usize), last_seq: events.last_seq() }))
}

/// Throughput, IOPS and latency per second over the last `seconds`: the node's total, each
/// target's (chunk requests) and each drive's (RAID traffic included).
#[utoipa::path(get, path = "/api/v1/performance", tag = "monitoring",
    params(("seconds" = Option<u64>, Query, description = "Window, 1 to 3600 (default 300)")),
    responses((status = 200, body = Performance), (status = 400, body = ErrorBody)))]
async fn get_performance(
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Performance>, ApiError> {
    let params = Params::parse(query.as_deref(), &["seconds"])?;
    let seconds =
        params.number("seconds", PERFORMANCE_SECONDS_DEFAULT, 1..=SERIES_POINTS as u64)?;
    Ok(Json(state.monitor.performance(seconds as usize)))
}

/// Prometheus metrics (OpenMetrics text); needs the token like every data route.
#[utoipa::path(get, path = "/metrics", tag = "monitoring",
    responses((status = 200, description = "OpenMetrics text exposition", body = String,
        content_type = "application/openmetrics-text"), (status = 401, body = ErrorBody)))]
async fn get_metrics(State(state): State<ApiState>) -> Result<Response, ApiError> {
    blocking(move || {
        let volumes = match state.mgmt.handle(MgmtRequest::VolumeList)? {
            MgmtReply::Volumes(v) => v,
            _ => Vec::new(),
        };
        let exports = match state.mgmt.handle(MgmtRequest::ExportList)? {
            MgmtReply::Exports(e) => e,
            _ => Vec::new(),
        };
        let statfs = state
            .mgmt
            .client()
            .statfs()
            .ok()
            .map(|s| (s.bytes_total, s.bytes_free, s.files_total, s.files_used));
        let scrape = Scrape {
            version: env!("CARGO_PKG_VERSION").into(),
            started_unix_s: state.identity.started_unix_s,
            targets: state.view().targets(),
            metadata_ops: state.view().metadata_ops(),
            mount_requests: state.view().mount_requests(),
            volumes,
            exports,
            statfs,
            auth_failures: state.auth.failed_total(),
            auth_rate_limited: state.auth.limited_total(),
            events: state.mgmt.events().last_seq(),
        };
        Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], metrics::render(&scrape))
            .into_response())
    })
    .await
}

/// The running API server.
#[derive(Debug)]
pub struct ApiServer {
    addr: SocketAddr,
    shutdown: Arc<tokio::sync::Notify>,
    server: tokio::task::JoinHandle<()>,
    sampler: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    /// Serves the API on `listener` (bound early by the caller, so a busy port is reported
    /// before anything else starts) and starts the monitor's sampler; call it inside the
    /// runtime. `identity`'s `addresses.api` is filled with the bound address.
    pub fn start(
        listener: std::net::TcpListener,
        mgmt: Mgmt,
        view: Arc<dyn NodeView>,
        mut identity: NodeIdentity,
        token: ApiToken,
    ) -> std::io::Result<ApiServer> {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        identity.addresses.api = Some(addr);
        let monitor = Monitor::new(view, mgmt.clone());
        let sampler = tokio::spawn(monitor.clone().run());
        let app = router(ApiState::new(mgmt, monitor, identity, token));
        let shutdown = Arc::new(tokio::sync::Notify::new());
        let signal = shutdown.clone();
        let server = tokio::spawn(async move {
            let service = app.into_make_service_with_connect_info::<SocketAddr>();
            let served = axum::serve(listener, service)
                .with_graceful_shutdown(async move { signal.notified().await })
                .await;
            if let Err(e) = served {
                tracing::error!(%e, "REST API server stopped");
            }
        });
        tracing::info!(%addr, "REST API listening");
        Ok(ApiServer { addr, shutdown, server, sampler })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets requests in flight finish, stops sampling.
    pub async fn shutdown(self) {
        self.shutdown.notify_one();
        self.sampler.abort();
        let _ = self.server.await;
    }
}
