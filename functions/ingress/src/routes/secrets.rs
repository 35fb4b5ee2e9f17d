//! `/v1/secrets` (a member key): the tenant's secrets, put, listed by name
//! and deleted. No route returns a value: it is sealed before it is
//! stored and opened only by the call that sends it.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use armada_api::error::KeyRefusals;
use armada_api::hooks::ListQuery;
use armada_api::secrets::{PutSecretBody, SecretView, SecretsPage};
use armada_api::server::{JsonBody, Path, Query};
use armada_api::{ApiError, ErrorBody};
use armada_core::clock::rfc3339;
use armada_core::services::auth::Principal;
use armada_core::services::secrets::{self, SecretError};
use armada_core::Services;
use armada_domain::secret::{check_name, SecretValue, MAX_PER_TENANT};

use super::{list_limit, member};

fn refused(e: SecretError) -> ApiError {
    match e {
        SecretError::NotFound(name) => ApiError::not_found(&format!("secret '{name}'")),
        e @ SecretError::TooMany => ApiError::conflict("TOO_MANY_SECRETS", e.to_string()),
        e @ SecretError::Busy => ApiError::unavailable(e.to_string()),
        SecretError::Store(e) => e.into(),
    }
}

/// Puts a secret: a new one, or a new value for one the tenant has. Its
/// value is never shown again.
#[utoipa::path(put, path = "/v1/secrets/{name}", tag = "secrets", request_body = PutSecretBody,
    params(("name" = String, Path, description = "The secret's name (`^[a-z0-9][a-z0-9_-]{0,63}$`).")),
    responses(
        (status = 204, description = "Stored, encrypted."),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD` (`name`, `value`).", body = ErrorBody),
        (status = 409, description = "`TOO_MANY_SECRETS`: the tenant holds 200.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn put_secret(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<StatusCode, ApiError> {
    let key = member(&who)?;
    check_name(&name)?;
    let value = SecretValue::parse(&body)?;
    let new = secrets::put(&svc, &key.tenant, &name, &value)
        .await
        .map_err(refused)?;
    tracing::info!(tenant = %key.tenant, name, new, "secret put");
    Ok(StatusCode::NO_CONTENT)
}

/// The tenant's secrets: names and times only, newest first.
#[utoipa::path(get, path = "/v1/secrets", tag = "secrets", params(ListQuery),
    responses(
        (status = 200, description = "The secrets (never their values).", body = SecretsPage),
        (status = 400, description = "`INVALID_QUERY`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn list_secrets(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Query(q): Query<ListQuery>,
) -> Result<Json<SecretsPage>, ApiError> {
    let key = member(&who)?;
    let limit = list_limit(&q)?.min(MAX_PER_TENANT);
    let held = svc.secrets.of_tenant(&key.tenant, limit).await?;
    Ok(Json(SecretsPage {
        secrets: held
            .iter()
            .map(|s| SecretView {
                name: s.name.clone(),
                created_at: rfc3339(s.created_at_ms),
                updated_at: rfc3339(s.updated_at_ms),
            })
            .collect(),
    }))
}

/// Deletes a secret: a call that names it fails with `SECRET_NOT_FOUND`
/// from now on.
#[utoipa::path(delete, path = "/v1/secrets/{name}", tag = "secrets",
    params(("name" = String, Path, description = "The secret's name.")),
    responses(
        (status = 204, description = "Deleted."),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn delete_secret(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let key = member(&who)?;
    secrets::delete(&svc, &key.tenant, &name)
        .await
        .map_err(refused)?;
    tracing::info!(tenant = %key.tenant, name, "secret deleted");
    Ok(StatusCode::NO_CONTENT)
}
