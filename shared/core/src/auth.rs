//! Who is calling the HTTP API: the bearer key checked (the admin key by
//! its hash, tenant keys by their stored hash, in constant time). Shared
//! by the functions that serve the API (ingress, hitl).

use armada_domain::api::{ApiError, ApiKey, KeyRole};
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

/// A store error as the API shows it: retry later, or an internal error
/// (the detail goes to the log, never to the caller).
pub fn store_err(e: StoreError) -> ApiError {
    match e {
        StoreError::Retryable(m) => {
            tracing::warn!(error = %m, "store unavailable");
            ApiError::unavailable("the service is briefly unavailable; retry")
        }
        other => {
            tracing::error!(error = %other, "store error");
            ApiError::internal()
        }
    }
}

/// An API error as its answer (status and body), logged: a 5xx as an
/// error (its detail stays in the log), a 4xx as a refusal.
pub fn error_reply(e: &ApiError) -> (u16, serde_json::Value) {
    if e.status >= 500 {
        tracing::error!(code = e.code, message = %e.message, "request failed");
    } else {
        tracing::info!(status = e.status, code = e.code, "request refused");
    }
    (e.status, e.body())
}
