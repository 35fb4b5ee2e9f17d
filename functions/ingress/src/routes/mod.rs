//! The API's resources, one module each; `crate::api` lists their routes.

pub(crate) mod accept;
pub(crate) mod agents;
pub(crate) mod artifacts;
pub(crate) mod callbacks;
pub(crate) mod collab;
pub(crate) mod health;
pub(crate) mod hooks;
pub(crate) mod inbound;
pub(crate) mod keys;
pub(crate) mod mailboxes;
pub(crate) mod owned;
pub(crate) mod profiles;
pub(crate) mod runs;
pub(crate) mod sandboxes;
pub(crate) mod schedules;
pub(crate) mod secrets;
pub(crate) mod sessions;
pub(crate) mod skills;
pub(crate) mod teams;

use armada_api::ApiError;
use armada_core::services::auth::{Principal, TenantKey};
use armada_domain::api::KeyRole;

/// The tenant a tenant key acts for (`403` for the admin key).
pub(crate) fn tenant(who: &Principal) -> Result<&str, ApiError> {
    who.tenant()
}

/// The key, if it is a tenant's.
pub(crate) fn tenant_key(who: &Principal) -> Result<&TenantKey, ApiError> {
    who.tenant_key()
}

/// A member key of a tenant: only those change hooks and schedules (an
/// approver key reads them).
pub(crate) fn member(who: &Principal) -> Result<&TenantKey, ApiError> {
    let key = tenant_key(who)?;
    if key.role != KeyRole::Member {
        return Err(ApiError::forbidden("an approver key cannot change this"));
    }
    Ok(key)
}

/// How many records a list shows unless asked for fewer, and the most.
const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 200;

/// A list's `limit` (default 50, at most 200; `400 INVALID_QUERY` beyond).
pub(crate) fn list_limit(q: &armada_api::hooks::ListQuery) -> Result<usize, ApiError> {
    match q.limit.unwrap_or(DEFAULT_LIMIT) {
        n @ 1..=MAX_LIMIT => Ok(n as usize),
        _ => Err(ApiError::new(
            400,
            "INVALID_QUERY",
            format!("limit: must be between 1 and {MAX_LIMIT}"),
        )),
    }
}
