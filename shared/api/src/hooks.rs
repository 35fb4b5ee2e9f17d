//! Inbound webhooks: a tenant's hooks (created, read, changed, rotated,
//! deleted with a key) and the deliveries senders make to them (no key:
//! each proves itself with the hook's secret).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use armada_domain::hook::inbound::Outcome;
use armada_domain::hook::{HookKind, OnResolved};

/// `POST /v1/hooks`: exactly one of `agent`, `team` and `chain`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"kind": "github", "agent": "reviewer", "events": ["push"]}))]
pub struct CreateHookBody {
    pub kind: HookKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    pub team: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1, max_items = 16)]
    pub chain: Option<Vec<String>>,
    /// MiniJinja over `{event, payload, hook}`; names that are not there
    /// are errors. Without one, the event, its subject and the payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 16384)]
    pub input_template: Option<String>,
    /// Called with each Run's outcome, signed with the tenant's secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// `github` only: the events that start a Run (`*` for all; the
    /// default is every event but `ping`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1, max_items = 64)]
    pub events: Option<Vec<String>>,
    /// `cloudwatch` only: the alarms that start a Run (default: every
    /// alarm whose actions name the hook's topic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1, max_items = 64)]
    pub alarm_names: Option<Vec<String>>,
    /// `alertmanager` and `cloudwatch`: what a resolved notification (an
    /// alarm back to `OK`) does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_resolved: Option<OnResolved>,
    /// Default 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 3600)]
    pub max_runs_per_hour: Option<u32>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `PATCH /v1/hooks/{hook_id}`: any field but `kind`; `null` clears
/// `input_template`, `callback_url` or `events`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchHookBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable)]
    pub input_template: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable)]
    pub callback_url: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable)]
    pub events: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable)]
    pub alarm_names: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_resolved: Option<OnResolved>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runs_per_hour: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// A hook, as its tenant reads it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HookView {
    pub hook_id: String,
    pub kind: HookKind,
    /// Where its sender posts: `POST` with no key.
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarm_names: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_resolved: Option<OnResolved>,
    /// `cloudwatch`: the SNS topic its alarms' actions name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_arn: Option<String>,
    pub max_runs_per_hour: u32,
    pub enabled: bool,
    pub created_at: String,
    pub updated_at: String,
    pub version: u64,
}

/// `201`: the hook, and its secret, shown in this answer only (a
/// cloudwatch hook has none: its topic instead).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HookCreated {
    pub hook_id: String,
    pub url: String,
    /// `github`: paste into GitHub's "Secret" field. `standard`: the
    /// `whsec_…` signing secret. `alertmanager`: the receiver's bearer
    /// token. Not stored; not shown again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// `cloudwatch`: the SNS topic to name in alarms' actions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_arn: Option<String>,
    pub hook: HookView,
}

/// `200` to a rotation: the new secret (the old one no longer verifies).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HookSecret {
    pub hook_id: String,
    pub secret: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HooksPage {
    pub hooks: Vec<HookView>,
}

/// `GET /v1/hooks` and `GET /v1/hooks/{hook_id}/deliveries`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// At most this many, newest first (default 50, at most 200).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

/// A verified delivery and how it was answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryView {
    pub delivery_id: String,
    pub received_at: String,
    pub event: String,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveriesPage {
    pub deliveries: Vec<DeliveryView>,
}

/// The answer to a sender: `202` with the Run it started; `200` for a
/// repeat (the first Run, `duplicate`), a `ping` or a filtered event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryAnswer {
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<bool>,
}
