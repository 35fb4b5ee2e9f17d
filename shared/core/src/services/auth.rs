//! Who is calling the HTTP API: the bearer key checked (the admin key by
//! its hash, tenant keys by their stored hash, in constant time). Shared
//! by the functions that serve the API (ingress, hitl).

use armada_api::ApiError;
use armada_domain::api::{ApiKey, KeyRole};
use armada_domain::crypto::{digest_eq, sha256_hex};

use crate::error::StoreError;
use crate::Services;

/// A tenant key that authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantKey {
    pub tenant: String,
    pub key_id: String,
    pub role: KeyRole,
    /// Whose key it is (an address), when the admin said so.
    pub owner: Option<String>,
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    Tenant(TenantKey),
}

impl Principal {
    /// The tenant a tenant key acts for; the admin key has none.
    pub fn tenant(&self) -> Result<&str, ApiError> {
        self.tenant_key().map(|k| k.tenant.as_str())
    }

    pub fn tenant_key(&self) -> Result<&TenantKey, ApiError> {
        match self {
            Principal::Tenant(k) => Ok(k),
            Principal::Admin => Err(ApiError::forbidden(
                "the admin key manages agents and keys; use a tenant key for runs, sessions and approvals",
            )),
        }
    }

    pub fn admin(&self) -> Result<(), ApiError> {
        match self {
            Principal::Admin => Ok(()),
            Principal::Tenant(_) => Err(ApiError::forbidden("this operation needs the admin key")),
        }
    }
}

/// Authenticates the value of an `Authorization` header.
pub async fn authenticate(
    svc: &Services,
    authorization: Option<&str>,
) -> Result<Principal, ApiError> {
    let header = authorization.ok_or_else(ApiError::unauthorized)?;
    let token = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
        .ok_or_else(ApiError::unauthorized)?
        .trim();
    if digest_eq(&sha256_hex(token.as_bytes()), &svc.cfg.admin_key_sha256) {
        return Ok(Principal::Admin);
    }
    let key = ApiKey::parse(token).ok_or_else(ApiError::unauthorized)?;
    let stored = svc
        .registry
        .key(&key.key_id)
        .await
        .map_err(store_err)?
        .ok_or_else(ApiError::unauthorized)?;
    if stored.revoked || !digest_eq(&stored.secret_sha256, &key.secret_hash()) {
        return Err(ApiError::unauthorized());
    }
    Ok(Principal::Tenant(TenantKey {
        tenant: stored.tenant,
        key_id: stored.key_id,
        role: stored.role,
        owner: stored.owner,
    }))
}

/// A store error as the API shows it (see `From<StoreError> for ApiError`).
pub fn store_err(e: StoreError) -> ApiError {
    ApiError::from(e)
}

/// The caller of a route that takes a key: its `Authorization` header
/// authenticated (`401` without a valid one).
impl axum::extract::FromRequestParts<std::sync::Arc<Services>> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        svc: &std::sync::Arc<Services>,
    ) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        authenticate(svc, header).await
    }
}

/// A caller with the admin key (`401` without a valid key, `403` with a
/// tenant's), checked before the request's body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminKey;

impl axum::extract::FromRequestParts<std::sync::Arc<Services>> for AdminKey {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        svc: &std::sync::Arc<Services>,
    ) -> Result<Self, ApiError> {
        Principal::from_request_parts(parts, svc).await?.admin()?;
        Ok(AdminKey)
    }
}
