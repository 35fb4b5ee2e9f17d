//! `/v1/runs/{run_id}/artifacts/{artifact_id}`: what a Run's tool calls
//! answered that is not text (an MCP tool's image, audio, a binary
//! resource), as the tool result references it.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use axum::response::IntoResponse;

use armada_api::error::KeyRefusals;
use armada_api::server::Path;
use armada_api::{ApiError, ErrorBody};
use armada_core::error::StoreError;
use armada_core::services::auth::Principal;
use armada_core::Services;
use armada_domain::mcp::{artifact_call, artifact_key, MAX_ARTIFACT_BYTES};

use super::owned::load_run;
use super::tenant;

/// An artifact's bytes. They are a remote tool's, so they are served as
/// an attachment of no type a browser would render (its MIME type is in
/// the tool result that names it).
#[utoipa::path(get, path = "/v1/runs/{run_id}/artifacts/{artifact_id}", tag = "runs",
    params(
        ("run_id" = String, Path, description = "The Run's id."),
        ("artifact_id" = String, Path, description = "As a tool result names it: `<call id>-<n>`."),
    ),
    responses(
        (status = 200, description = "The artifact's bytes.", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404, description = "`NOT_FOUND`: no such Run in the caller's tenant, or no such artifact of it.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn get_artifact(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path((run_id, artifact_id)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let run = load_run(&svc, tenant(&who)?, &run_id).await?;
    let missing = || ApiError::not_found(&format!("artifact '{artifact_id}' of run '{run_id}'"));
    // Only a call of this Run names an artifact of it.
    let Some((call_id, _)) = artifact_call(&artifact_id) else {
        return Err(missing());
    };
    if !run.ledger.contains_key(call_id) {
        return Err(missing());
    }
    let key = artifact_key(&run.run_id, &artifact_id);
    let bytes = match svc
        .payloads
        .get_bytes_bounded(&key, MAX_ARTIFACT_BYTES as u64)
        .await
    {
        Ok(Ok(bytes)) => bytes,
        // Not kept (too large, or never stored): nothing to serve.
        Ok(Err(_)) | Err(StoreError::Terminal(_)) => return Err(missing()),
        Err(e) => return Err(e.into()),
    };
    Ok((
        [
            (CONTENT_TYPE, "application/octet-stream".to_string()),
            (X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
            (
                CONTENT_DISPOSITION,
                format!("attachment; filename=\"{artifact_id}\""),
            ),
        ],
        bytes,
    ))
}
