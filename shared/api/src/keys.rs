//! API keys (admin) and a tenant's callback signing secret.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/tenants/{tenant}/keys` (the body is optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MintKeyBody {
    /// `member` (the default) or `approver`: an approver key also decides
    /// the tenant's approvals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<KeyRoleName>,
    /// The address of the person the key is for: a Run it starts is not
    /// let go on through that address's approval link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeyRoleName {
    Member,
    Approver,
}

/// `201`: the key, shown in this answer only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KeyMinted {
    /// `Authorization: Bearer <key>`. Not stored; not shown again.
    pub key: String,
    pub key_id: String,
    pub tenant: String,
    pub role: KeyRoleName,
    pub owner: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KeyRevoked {
    pub key_id: String,
    pub revoked: bool,
}

/// `201`: the tenant's new callback signing secret, shown in this answer
/// only (it is derived, never stored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CallbackSecret {
    pub tenant: String,
    pub secret: String,
    pub rotated_at: String,
}
