//! The REST routes of block volumes, their NBD exports and their access lists. Each calls
//! [`Mgmt::handle`](crate::Mgmt::handle) with the request the CLI sends over RPC, after checking
//! the fields itself so a 400 can name the one at fault.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use stria_proto::mgmt::{MgmtReply, MgmtRequest, check_name};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::{ApiState, blocking};
use crate::api_error::{ApiError, ApiJson, ErrorBody, Params, decode_json};
use crate::api_types::*;
use crate::service::{check_size, parse_rule};

/// The routes of this module, for the API's router.
pub(crate) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(list_volumes, create_volume))
        .routes(routes!(get_volume, delete_volume))
        .routes(routes!(resize_volume))
        .routes(routes!(snapshot_volume))
        .routes(routes!(clone_volume))
        .routes(routes!(rollback_volume))
        .routes(routes!(list_exports, create_export))
        .routes(routes!(get_export, delete_export))
        .routes(routes!(allow_initiator, deny_initiator))
}

fn name_field(what: &str, field: &str, name: &str) -> Result<(), ApiError> {
    check_name(what, name).map_err(|e| ApiError::from(e).with_field(field))
}

fn volume_reply(reply: MgmtReply) -> Result<Volume, ApiError> {
    match reply {
        MgmtReply::Volume(v) => Ok(v.into()),
        other => Err(ApiError::internal(format!("unexpected management reply {other:?}"))),
    }
}

fn export_reply(reply: MgmtReply) -> Result<Export, ApiError> {
    match reply {
        MgmtReply::Export(e) => Ok(e.into()),
        other => Err(ApiError::internal(format!("unexpected management reply {other:?}"))),
    }
}

/// Every volume.
#[utoipa::path(get, path = "/api/v1/volumes", tag = "volumes",
    responses((status = 200, body = Vec<Volume>), (status = 401, body = ErrorBody)))]
async fn list_volumes(State(state): State<ApiState>) -> Result<Json<Vec<Volume>>, ApiError> {
    blocking(move || match state.mgmt.handle(MgmtRequest::VolumeList)? {
        MgmtReply::Volumes(all) => Ok(Json(all.into_iter().map(Volume::from).collect())),
        other => Err(ApiError::internal(format!("unexpected management reply {other:?}"))),
    })
    .await
}

/// Creates a thin volume: nothing is written until its first write.
#[utoipa::path(post, path = "/api/v1/volumes", tag = "volumes",
    request_body = CreateVolume,
    responses((status = 201, body = Volume), (status = 400, body = ErrorBody),
        (status = 404, description = "No such pool", body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody)))]
async fn create_volume(
    State(state): State<ApiState>,
    ApiJson(body): ApiJson<CreateVolume>,
) -> Result<(StatusCode, Json<Volume>), ApiError> {
    name_field("volume", "name", &body.name)?;
    check_size(body.size_bytes).map_err(|e| ApiError::from(e).with_field("size_bytes"))?;
    if let Some(pool) = &body.pool {
        name_field("pool", "pool", pool)?;
    }
    blocking(move || {
        let request = MgmtRequest::VolumeCreate {
            name: body.name,
            size_bytes: body.size_bytes,
            pool: body.pool.unwrap_or_default(),
            stripe_count: body.stripe_count.unwrap_or(0),
            stripe_bytes: body.stripe_bytes.unwrap_or(0),
        };
        let reply = state.mgmt.handle(request).map_err(|e| {
            let field =
                if e.message.contains("stripe size") { "stripe_bytes" } else { "stripe_count" };
            ApiError::from(e).with_field(field)
        })?;
        Ok((StatusCode::CREATED, Json(volume_reply(reply)?)))
    })
    .await
}

/// One volume.
#[utoipa::path(get, path = "/api/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path, description = "Volume name")),
    responses((status = 200, body = Volume), (status = 404, body = ErrorBody)))]
async fn get_volume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Volume>, ApiError> {
    blocking(move || volume_reply(state.mgmt.handle(MgmtRequest::VolumeShow { name })?).map(Json))
        .await
}

/// Deletes a volume and its data. Refused (409) while it is exported.
#[utoipa::path(delete, path = "/api/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path, description = "Volume name")),
    responses((status = 200, description = "The volume as it was, state `deleted`", body = Volume),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn delete_volume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Volume>, ApiError> {
    blocking(move || volume_reply(state.mgmt.handle(MgmtRequest::VolumeDelete { name })?).map(Json))
        .await
}

/// Grows a volume, or shrinks it with `force` (the data past the new end is lost).
#[utoipa::path(post, path = "/api/v1/volumes/{name}/resize", tag = "volumes",
    params(("name" = String, Path, description = "Volume name")),
    request_body = ResizeVolume,
    responses((status = 200, body = Volume), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A shrink without force", body = ErrorBody)))]
async fn resize_volume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<ResizeVolume>,
) -> Result<Json<Volume>, ApiError> {
    check_size(body.size_bytes).map_err(|e| ApiError::from(e).with_field("size_bytes"))?;
    blocking(move || {
        let request =
            MgmtRequest::VolumeResize { name, size_bytes: body.size_bytes, force: body.force };
        volume_reply(state.mgmt.handle(request)?).map(Json)
    })
    .await
}

/// Makes a read-only copy of a volume as it is now (copy-on-write: no data is copied). Writes
/// to the volume pause while the targets copy its chunk map.
#[utoipa::path(post, path = "/api/v1/volumes/{name}/snapshot", tag = "volumes",
    params(("name" = String, Path, description = "The volume to copy")),
    request_body = CopyVolume,
    responses((status = 200, description = "The snapshot", body = Volume),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody)))]
async fn snapshot_volume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<CopyVolume>,
) -> Result<Json<Volume>, ApiError> {
    copy_volume(state, name, body, true).await
}

/// Makes a writable copy of a volume or snapshot (copy-on-write, as a snapshot).
#[utoipa::path(post, path = "/api/v1/volumes/{name}/clone", tag = "volumes",
    params(("name" = String, Path, description = "The volume or snapshot to copy")),
    request_body = CopyVolume,
    responses((status = 200, description = "The clone", body = Volume),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody)))]
async fn clone_volume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<CopyVolume>,
) -> Result<Json<Volume>, ApiError> {
    copy_volume(state, name, body, false).await
}

/// Gives a volume the data and size of one of its own snapshots; what was written since the
/// snapshot is dropped (the snapshot stays). The volume's exports pause while it runs, and it
/// is refused while an NBD client is connected to the volume.
#[utoipa::path(post, path = "/api/v1/volumes/{name}/rollback", tag = "volumes",
    params(("name" = String, Path, description = "The volume to roll back")),
    request_body = RollbackVolume,
    responses((status = 200, description = "The volume after the rollback", body = Volume),
        (status = 400, description = "Not a snapshot of this volume", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Clients are connected, or a volume is busy",
            body = ErrorBody)))]
async fn rollback_volume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<RollbackVolume>,
) -> Result<Json<Volume>, ApiError> {
    name_field("volume", "snapshot", &body.snapshot)?;
    blocking(move || {
        let request = MgmtRequest::VolumeRollback { name, snapshot: body.snapshot };
        volume_reply(state.mgmt.handle(request)?).map(Json)
    })
    .await
}

async fn copy_volume(
    state: ApiState,
    source: String,
    body: CopyVolume,
    snapshot: bool,
) -> Result<Json<Volume>, ApiError> {
    name_field("volume", "name", &body.name)?;
    blocking(move || {
        let request = MgmtRequest::VolumeCopy { source, name: body.name, snapshot };
        volume_reply(state.mgmt.handle(request)?).map(Json)
    })
    .await
}

fn find_export(state: &ApiState, name: &str) -> Result<Export, ApiError> {
    match state.mgmt.handle(MgmtRequest::ExportList)? {
        MgmtReply::Exports(all) => all
            .into_iter()
            .find(|e| e.name == name)
            .map(Export::from)
            .ok_or_else(|| ApiError::not_found(format!("no export named '{name}'"))),
        other => Err(ApiError::internal(format!("unexpected management reply {other:?}"))),
    }
}

/// Every export with its access list and counters.
#[utoipa::path(get, path = "/api/v1/exports", tag = "volumes",
    responses((status = 200, body = Vec<Export>), (status = 401, body = ErrorBody)))]
async fn list_exports(State(state): State<ApiState>) -> Result<Json<Vec<Export>>, ApiError> {
    blocking(move || match state.mgmt.handle(MgmtRequest::ExportList)? {
        MgmtReply::Exports(all) => Ok(Json(all.into_iter().map(Export::from).collect())),
        other => Err(ApiError::internal(format!("unexpected management reply {other:?}"))),
    })
    .await
}

/// Serves a volume over NBD. Nobody may connect until an initiator rule allows it.
#[utoipa::path(post, path = "/api/v1/exports", tag = "volumes",
    request_body = CreateExport,
    responses((status = 201, body = Export), (status = 400, body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody)))]
async fn create_export(
    State(state): State<ApiState>,
    ApiJson(body): ApiJson<CreateExport>,
) -> Result<(StatusCode, Json<Export>), ApiError> {
    name_field("volume", "volume", &body.volume)?;
    if let Some(name) = &body.name {
        name_field("export", "name", name)?;
    }
    if body.description.len() > 1024 {
        return Err(ApiError::invalid(
            "description",
            "an export description is at most 1024 bytes",
        ));
    }
    blocking(move || {
        let request = MgmtRequest::ExportAdd {
            volume: body.volume,
            name: body.name,
            read_only: body.read_only,
            description: body.description,
        };
        Ok((StatusCode::CREATED, Json(export_reply(state.mgmt.handle(request)?)?)))
    })
    .await
}

/// One export.
#[utoipa::path(get, path = "/api/v1/exports/{name}", tag = "volumes",
    params(("name" = String, Path, description = "Export name")),
    responses((status = 200, body = Export), (status = 404, body = ErrorBody)))]
async fn get_export(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Export>, ApiError> {
    blocking(move || find_export(&state, &name).map(Json)).await
}

/// Stops serving an export. Connected clients are cut off once their requests in flight are
/// answered.
#[utoipa::path(delete, path = "/api/v1/exports/{name}", tag = "volumes",
    params(("name" = String, Path, description = "Export name")),
    responses((status = 200, description = "The export as it was", body = Export),
        (status = 404, body = ErrorBody)))]
async fn delete_export(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Export>, ApiError> {
    blocking(move || export_reply(state.mgmt.handle(MgmtRequest::ExportRemove { name })?).map(Json))
        .await
}

fn check_rule(rule: &InitiatorRule) -> Result<(), ApiError> {
    parse_rule(&rule.net, None).map_err(|e| ApiError::from(e).with_field("net"))?;
    parse_rule(&rule.net, rule.tls_identity.clone())
        .map_err(|e| ApiError::from(e).with_field("tls_identity"))?;
    Ok(())
}

/// Allows an initiator (address or CIDR block, optionally a TLS identity) to connect.
#[utoipa::path(post, path = "/api/v1/exports/{name}/initiators", tag = "volumes",
    params(("name" = String, Path, description = "Export name")),
    request_body = InitiatorRule,
    responses((status = 200, description = "The export after the change", body = Export),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn allow_initiator(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(rule): ApiJson<InitiatorRule>,
) -> Result<Json<Export>, ApiError> {
    check_rule(&rule)?;
    blocking(move || {
        let request = MgmtRequest::InitiatorAllow {
            export: name,
            net: rule.net,
            tls_identity: rule.tls_identity,
        };
        export_reply(state.mgmt.handle(request)?).map(Json)
    })
    .await
}

/// Removes an access rule. The rule comes as a JSON body like the allow's, or as query
/// parameters `net` and `tls_identity` (some clients send no body with DELETE).
#[utoipa::path(delete, path = "/api/v1/exports/{name}/initiators", tag = "volumes",
    params(("name" = String, Path, description = "Export name"),
        ("net" = Option<String>, Query, description = "The rule's address or CIDR block (without a body)"),
        ("tls_identity" = Option<String>, Query, description = "The rule's TLS identity (without a body)")),
    request_body(content = Option<InitiatorRule>, description = "The rule to remove (or use the query)"),
    responses((status = 200, description = "The export after the change", body = Export),
        (status = 400, body = ErrorBody), (status = 404, description = "No such export or rule", body = ErrorBody)))]
async fn deny_initiator(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Result<Json<Export>, ApiError> {
    let rule: InitiatorRule = if body.iter().all(u8::is_ascii_whitespace) {
        let params = Params::parse(query.as_deref(), &["net", "tls_identity"])?;
        let net = params.string("net").ok_or_else(|| {
            ApiError::invalid("net", "give the rule to remove: a JSON body or ?net=ADDRESS")
        })?;
        InitiatorRule {
            net: net.to_string(),
            tls_identity: params.string("tls_identity").map(str::to_string),
        }
    } else {
        decode_json(&body)?
    };
    check_rule(&rule)?;
    blocking(move || {
        let request = MgmtRequest::InitiatorDeny {
            export: name,
            net: rule.net,
            tls_identity: rule.tls_identity,
        };
        export_reply(state.mgmt.handle(request)?).map(Json)
    })
    .await
}
