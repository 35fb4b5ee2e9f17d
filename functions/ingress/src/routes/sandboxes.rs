//! `/v1/sandboxes`: a tenant's sandboxes, and their destruction (admin).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;

use armada_api::sandboxes::{SandboxList, SandboxQuery, SandboxView};
use armada_api::server::{Path, Query};
use armada_api::{ApiError, ErrorBody};
use armada_core::services::auth::{AdminKey, Principal};
use armada_core::services::sandboxing;
use armada_core::Services;
use armada_domain::names::valid_tenant;

use armada_api::error::KeyRefusals;

/// Whose sandboxes: a tenant key sees its own; the admin names a tenant.
fn sandbox_tenant(who: &Principal, q: SandboxQuery) -> Result<String, ApiError> {
    // Malformed is refused whoever asks (a tenant key's is then ignored).
    if q.tenant.as_deref().is_some_and(|t| !valid_tenant(t)) {
        return Err(ApiError::new(
            400,
            "INVALID_QUERY",
            "tenant: must be 1-64 characters of a-z, 0-9 or '-'",
        ));
    }
    match who {
        Principal::Tenant(k) => Ok(k.tenant.clone()),
        Principal::Admin => q.tenant.ok_or_else(|| {
            ApiError::new(
                400,
                "INVALID_FIELD",
                "tenant: the admin key names the tenant (?tenant=)",
            )
        }),
    }
}

/// The tenant's sandboxes, one per agent that has one.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", params(SandboxQuery),
    responses(
        (status = 200, description = "The sandboxes.", body = SandboxList,
            links(("GetSandbox" = (operation_id = "get_sandbox", parameters(("agent" = "$response.body#/sandboxes/0/agent")))))),
        (status = 400, description = "`INVALID_FIELD`: the admin key names no tenant; `INVALID_QUERY`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = []), ("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn list_sandboxes(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Query(q): Query<SandboxQuery>,
) -> Result<Json<SandboxList>, ApiError> {
    let tenant = sandbox_tenant(&who, q)?;
    let list = svc.sandboxes.list(&tenant).await?;
    Ok(Json(SandboxList {
        sandboxes: list.iter().map(sandboxing::view).collect(),
    }))
}

/// One agent's sandbox in the tenant.
#[utoipa::path(get, path = "/v1/sandboxes/{agent}", tag = "sandboxes",
    params(("agent" = String, Path, description = "The agent whose sandbox.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"), SandboxQuery),
    responses(
        (status = 200, description = "The sandbox.", body = SandboxView),
        (status = 400, description = "`INVALID_FIELD`: the admin key names no tenant; `INVALID_QUERY`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = []), ("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn get_sandbox(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(agent): Path<String>,
    Query(q): Query<SandboxQuery>,
) -> Result<Json<SandboxView>, ApiError> {
    let tenant = sandbox_tenant(&who, q)?;
    match svc.sandboxes.get(&tenant, &agent).await? {
        Some(rec) => Ok(Json(sandboxing::view(&rec))),
        None => Err(ApiError::not_found(&format!("sandbox of agent '{agent}'"))),
    }
}

/// Destroys a tenant's sandbox of an agent: its task is stopped and its
/// files removed; the next call starts a new one.
#[utoipa::path(delete, path = "/v1/sandboxes/{agent}", tag = "sandboxes",
    params(("agent" = String, Path, description = "The agent whose sandbox.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"), SandboxQuery),
    responses(
        (status = 200, description = "Destroyed.", body = SandboxView),
        (status = 400, description = "`INVALID_FIELD`: no tenant named; `INVALID_QUERY`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = [])))]
pub(crate) async fn destroy_sandbox(
    State(svc): State<Arc<Services>>,
    _: AdminKey,
    Path(agent): Path<String>,
    Query(q): Query<SandboxQuery>,
) -> Result<Json<SandboxView>, ApiError> {
    let tenant = sandbox_tenant(&Principal::Admin, q)?;
    match sandboxing::destroy(&svc, &tenant, &agent, "destroyed by an administrator").await? {
        Some(rec) => Ok(Json(sandboxing::view(&rec))),
        None => Err(ApiError::not_found(&format!("sandbox of agent '{agent}'"))),
    }
}
