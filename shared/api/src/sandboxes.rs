//! `/v1/sandboxes`: a tenant's per-agent sandboxes.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use armada_domain::sandbox::lifecycle::{SandboxRecord, SandboxState};

/// One agent's sandbox in one tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxView {
    pub agent: String,
    pub tenant: String,
    pub state: SandboxState,
    /// Bumped each time a new task is started for it.
    pub generation: u64,
    pub task_arn: Option<String>,
    #[schema(value_type = Vec<Object>)]
    pub ports: Vec<Value>,
    /// The Run using it now.
    pub holder_run_id: Option<String>,
    /// Runs waiting for it, in order.
    pub waiting_runs: Vec<String>,
    pub last_used_at: String,
    pub created_at: String,
    pub profile: String,
    #[schema(value_type = Option<Object>)]
    pub controls: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Which of its own credentials it signs with (never a secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<SandboxCredentialsView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SandboxCredentialsView {
    pub access_key_id: String,
    pub expires_at: String,
}

impl SandboxView {
    /// The record as the API shows it, times as `rfc3339` writes them.
    pub fn of(rec: &SandboxRecord, rfc3339: impl Fn(i64) -> String) -> Self {
        SandboxView {
            agent: rec.agent.clone(),
            tenant: rec.tenant.clone(),
            state: rec.state(),
            generation: rec.generation,
            task_arn: rec.task_arn.clone(),
            ports: rec
                .ports
                .iter()
                .map(|p| serde_json::to_value(p).unwrap_or(Value::Null))
                .collect(),
            holder_run_id: rec.holder_run_id.clone(),
            waiting_runs: rec.waiters.clone(),
            last_used_at: rfc3339(rec.last_used_at_ms),
            created_at: rfc3339(rec.created_at_ms),
            profile: rec.profile.clone(),
            controls: rec
                .controls
                .as_ref()
                .map(|c| serde_json::to_value(c).unwrap_or(Value::Null)),
            failure: rec.failure.clone(),
            credentials: rec.credentials.as_ref().map(|c| SandboxCredentialsView {
                access_key_id: c.access_key_id.clone(),
                expires_at: rfc3339(c.expires_at_ms),
            }),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxView>,
}

/// Whose sandboxes: a tenant key's own; the admin key names the tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SandboxQuery {
    /// Required with the admin key; ignored with a tenant's.
    #[serde(default)]
    #[param(pattern = "^[a-z0-9-]{1,64}$")]
    pub tenant: Option<String>,
}
