//! The REST routes that change a running target's drives: a new drive into a failed slot, a
//! new hot spare. Both go through the storage RPC that `stria target replace-drive` and
//! `stria target add-spare` use, so the API and the CLI make the same checks and the node
//! records the change in `DATA/node.json` either way. The rebuild runs in the background; the
//! reply shows the target as it is right after the change.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use stria_proto::wire::check_drive_path;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::{ApiState, blocking, find_target, parse_target};
use crate::api_error::{ApiError, ApiJson, ErrorBody};
use crate::api_types::NewDrive;
use crate::node_view::TargetStatus;

/// The routes of this module, for the API's router.
pub(crate) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(replace_drive)).routes(routes!(add_spare))
}

/// Refuses a path the storage service would refuse anyway, before any work, naming the field.
fn check_body(body: &NewDrive) -> Result<(), ApiError> {
    check_drive_path(&body.path).map_err(|message| ApiError::invalid("path", message))?;
    if body.create_bytes == Some(0) {
        return Err(ApiError::invalid("create_bytes", "create_bytes must be above 0"));
    }
    Ok(())
}

/// Puts a drive into a failed (or missing) slot of the target and starts rebuilding it in the
/// background, as `stria target replace-drive` does. The drive is a new one (created sparse
/// with `create_bytes`, or an existing file or block device), or the slot's own drive
/// returning (then only what changed while it was out is resynced). The node records it in
/// `DATA/node.json`, so a restart assembles it.
#[utoipa::path(post, path = "/api/v1/targets/{id}/drives/{slot}/replace", tag = "hardware",
    params(("id" = u32, Path, description = "Target id"),
        ("slot" = u32, Path, description = "The failed slot, 0-based")),
    request_body = NewDrive,
    responses((status = 202, description = "The drive is in; it rebuilds in the background",
            body = TargetStatus),
        (status = 400, description = "A bad path, size or slot; a drive already in use by a \
            target; a drive too small", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The slot is in service, the file exists already (with \
            `create_bytes`), the drive is in use or carries another array's label, or the \
            target is raid0", body = ErrorBody)))]
async fn replace_drive(
    State(state): State<ApiState>,
    Path((id, slot)): Path<(String, String)>,
    ApiJson(body): ApiJson<NewDrive>,
) -> Result<(StatusCode, Json<TargetStatus>), ApiError> {
    let id = parse_target(&id)?;
    let slot: u32 = slot
        .parse()
        .map_err(|_| ApiError::invalid("slot", format!("slot '{slot}' is not a number")))?;
    check_body(&body)?;
    blocking(move || {
        find_target(state.view().as_ref(), id)?;
        state.mgmt.replace_drive(id, slot, &body.path, body.create_bytes)?;
        state.monitor().observe_now();
        Ok((StatusCode::ACCEPTED, Json(find_target(state.view().as_ref(), id)?)))
    })
    .await
}

/// Labels a drive as a hot spare of the target, as `stria target add-spare` does: when a drive
/// fails, the spare takes its slot and rebuilds. If a slot is out already, it takes that slot
/// at once. The node records it in `DATA/node.json`.
#[utoipa::path(post, path = "/api/v1/targets/{id}/spares", tag = "hardware",
    params(("id" = u32, Path, description = "Target id")),
    request_body = NewDrive,
    responses((status = 201, description = "The spare is labelled", body = TargetStatus),
        (status = 400, description = "A bad path or size; a drive already in use by a target; \
            a drive too small", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The file exists already (with `create_bytes`), the drive \
            is in use or carries another array's label, the target has the most spares it \
            records, or it is raid0", body = ErrorBody)))]
async fn add_spare(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<NewDrive>,
) -> Result<(StatusCode, Json<TargetStatus>), ApiError> {
    let id = parse_target(&id)?;
    check_body(&body)?;
    blocking(move || {
        find_target(state.view().as_ref(), id)?;
        state.mgmt.add_spare(id, &body.path, body.create_bytes)?;
        state.monitor().observe_now();
        Ok((StatusCode::CREATED, Json(find_target(state.view().as_ref(), id)?)))
    })
    .await
}
