//! `/v1/tenants/{t}/keys` and `/v1/keys/{id}` (admin): API keys, shown
//! once; `/v1/tenants/{t}/callback-secret`: the tenant's callback signing
//! secret, rotated and shown once.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use armada_api::keys::{CallbackSecret, KeyMinted, KeyRevoked, KeyRoleName, MintKeyBody};
use armada_api::server::{Path, RawBody};
use armada_api::{ApiError, ErrorBody};
use armada_core::error::StoreError;
use armada_core::ports::StoredKey;
use armada_core::services::auth::{AdminKey, Principal};
use armada_core::Services;
use armada_domain::api::{ApiKey, KeyRole};
use armada_domain::fields::Fields;
use armada_domain::names::valid_tenant;

use armada_api::error::KeyRefusals;

/// Mints a tenant's API key. The key is in this answer only.
///
/// `{"role"?: "member" | "approver", "owner"?: address}` (the body is
/// optional; `member` by default). An `approver` key also decides the
/// tenant's approvals. `owner`, the address of the person the key is for,
/// holds four eyes across keys and links: a Run the key starts is not let
/// go on through that address's approval link.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/keys", tag = "keys",
    request_body(content = Option<MintKeyBody>, description = "Optional."),
    params(("tenant" = String, Path, description = "The tenant: 1-64 of a-z, 0-9, '-'.", pattern = "^[a-z0-9-]{1,64}$")),
    responses(
        (status = 201, description = "Minted.", body = KeyMinted,
            links(("RevokeKey" = (operation_id = "revoke_key", parameters(("key_id" = "$response.body#/key_id")))))),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = [])))]
pub(crate) async fn mint_key(
    State(svc): State<Arc<Services>>,
    _: AdminKey,
    Path(tenant): Path<String>,
    RawBody(raw): RawBody,
) -> Result<(StatusCode, Json<KeyMinted>), ApiError> {
    let tenant = tenant.as_str();
    if !valid_tenant(tenant) {
        return Err(ApiError::new(
            400,
            "INVALID_FIELD",
            "tenant: must be 1-64 characters of a-z, 0-9 or '-'",
        ));
    }
    let (role, owner) = if raw.is_empty() {
        (KeyRole::Member, None)
    } else {
        let body = ApiError::json_body(&raw)?;
        let f = Fields::new(&body)?;
        f.only(&["role", "owner"])?;
        let role = match f.opt_str("role")? {
            None => KeyRole::Member,
            Some(r) => KeyRole::parse(r).ok_or_else(|| {
                ApiError::new(400, "INVALID_FIELD", "role: must be member or approver")
            })?,
        };
        let owner = match f.opt_str("owner")? {
            None => None,
            Some(o) if armada_domain::approval::policy::valid_email(o) => {
                Some(o.to_ascii_lowercase())
            }
            Some(_) => {
                return Err(ApiError::new(
                    400,
                    "INVALID_FIELD",
                    "owner: must be an email address",
                ))
            }
        };
        (role, owner)
    };
    let key = ApiKey::mint();
    svc.registry
        .put_key(
            &StoredKey {
                key_id: key.key_id.clone(),
                tenant: tenant.to_string(),
                secret_sha256: key.secret_hash(),
                revoked: false,
                role,
                owner: owner.clone(),
            },
            svc.clock.now_ms(),
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(KeyMinted {
            key: key.token(),
            key_id: key.key_id,
            tenant: tenant.to_string(),
            role: match role {
                KeyRole::Member => KeyRoleName::Member,
                KeyRole::Approver => KeyRoleName::Approver,
            },
            owner,
        }),
    ))
}

/// Revokes a key: it authenticates nothing from now on.
#[utoipa::path(delete, path = "/v1/keys/{key_id}", tag = "keys",
    params(("key_id" = String, Path, description = "The key's id (`key_…`).")),
    responses(
        (status = 200, description = "Revoked.", body = KeyRevoked),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = [])))]
pub(crate) async fn revoke_key(
    State(svc): State<Arc<Services>>,
    _: AdminKey,
    Path(key_id): Path<String>,
) -> Result<Json<KeyRevoked>, ApiError> {
    match svc.registry.revoke_key(&key_id, svc.clock.now_ms()).await {
        Ok(()) => Ok(Json(KeyRevoked {
            key_id,
            revoked: true,
        })),
        Err(StoreError::Conflict { .. }) => Err(ApiError::not_found(&format!("key '{key_id}'"))),
        Err(e) => Err(e.into()),
    }
}

/// Rotates the tenant's callback signing secret: a new salt, so a new
/// secret, shown in this answer only (it is derived, never stored). The
/// admin, or a member key of the tenant itself; another tenant's is 404.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/callback-secret", tag = "keys",
    params(("tenant" = String, Path, description = "The tenant.", pattern = "^[a-z0-9-]{1,64}$")),
    responses(
        (status = 201, description = "Rotated: the new secret.", body = CallbackSecret),
        (status = 400, description = "`INVALID_FIELD`: not a tenant name.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: another tenant's.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = []), ("member_key" = [])))]
pub(crate) async fn rotate_callback_secret(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(tenant): Path<String>,
) -> Result<(StatusCode, Json<CallbackSecret>), ApiError> {
    let tenant = tenant.as_str();
    match &who {
        Principal::Admin => {}
        Principal::Tenant(k) if k.tenant == tenant && k.role == KeyRole::Member => {}
        Principal::Tenant(k) if k.tenant == tenant => {
            return Err(ApiError::new(
                403,
                "FORBIDDEN",
                "an approver key cannot rotate secrets",
            ))
        }
        Principal::Tenant(_) => return Err(ApiError::not_found(&format!("tenant '{tenant}'"))),
    }
    if !valid_tenant(tenant) {
        return Err(ApiError::new(
            400,
            "INVALID_FIELD",
            "tenant: must be 1-64 characters of a-z, 0-9 or '-'",
        ));
    }
    let salt = armada_domain::approval::new_token();
    let now = svc.clock.now_ms();
    svc.registry.put_callback_salt(tenant, &salt, now).await?;
    let secret = svc
        .callbacks
        .tenant_secret(svc.registry.as_ref(), tenant)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(CallbackSecret {
            tenant: tenant.to_string(),
            secret,
            rotated_at: armada_core::clock::rfc3339(now),
        }),
    ))
}
