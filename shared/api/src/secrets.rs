//! `/v1/secrets`: a tenant's secrets, written and listed, never read
//! back. A header, token or environment variable names one as
//! `{"secret": "<name>"}`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `PUT /v1/secrets/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutSecretBody {
    /// The value, 4 to 8192 bytes: stored encrypted, never shown again.
    #[schema(min_length = 4, max_length = 8192)]
    pub value: String,
}

/// A secret as listed: its name and when its value last changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SecretView {
    pub name: String,
    pub created_at: String,
    pub updated_at: String,
}

/// `GET /v1/secrets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SecretsPage {
    pub secrets: Vec<SecretView>,
}
