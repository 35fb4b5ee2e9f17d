//! The API's resources, one module each; `crate::api` lists their routes.

pub(crate) mod accept;
pub(crate) mod agents;
pub(crate) mod callbacks;
pub(crate) mod collab;
pub(crate) mod health;
pub(crate) mod hooks;
pub(crate) mod inbound;
pub(crate) mod keys;
pub(crate) mod owned;
pub(crate) mod profiles;
pub(crate) mod runs;
pub(crate) mod sandboxes;
pub(crate) mod sessions;
pub(crate) mod skills;
pub(crate) mod teams;

use armada_api::ApiError;
use armada_core::services::auth::{Principal, TenantKey};

/// The tenant a tenant key acts for (`403` for the admin key).
pub(crate) fn tenant(who: &Principal) -> Result<&str, ApiError> {
    who.tenant()
}

/// The key, if it is a tenant's.
pub(crate) fn tenant_key(who: &Principal) -> Result<&TenantKey, ApiError> {
    who.tenant_key()
}
