//! `/v1/runs`: starting a Run, reading it, its events, cancelling it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use armada_domain::collab::RunKind;
use armada_domain::run::callback::CallbackState;
use armada_domain::run::{EventKind, LogEvent, RunError, RunState, Trigger, Usage};

/// `POST /v1/runs`: exactly one of `agent`, `team` and `chain`, or none
/// when `input` begins with a mention (`@agent …`, `@team:name …`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"agent": "assistant", "input": "What is Armada?"}))]
pub struct CreateRunBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    pub team: Option<String>,
    /// A sequential relay: each agent is given the previous one's output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1, max_items = 16)]
    pub chain: Option<Vec<String>>,
    #[schema(min_length = 1)]
    pub input: String,
    /// Continue this session (agent Runs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Called with the Run's outcome, signed with the tenant's secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// Kept with the Run as given (at most 8 KiB of JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// `202` to a start: the Run is recorded and queued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunAccepted {
    pub run_id: String,
    pub state: RunState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The message's number in its session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// This `Idempotency-Key` was seen before: this is that Run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed: Option<bool>,
}

/// A Run. When its record cannot be read, only what its item says beside
/// it (id, agent, state, times, step, epoch) and an `error` of code
/// `CORRUPT_RECORD`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunView {
    pub run_id: String,
    pub agent: String,
    pub state: RunState,
    /// Absent when the record, or the stored input, cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    pub step: u32,
    pub epoch: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<RunKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outstanding_children: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain_index: Option<u64>,
    /// The agents of the chain's steps after this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain_remaining: Option<Vec<String>>,
    /// What started it: `api`, `session`, `hook` (with the hook, event and
    /// delivery), `child` or `chain`. Absent when its record cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    /// Its callback, when it was started with a `callback_url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackView>,
}

/// How a Run's callback stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CallbackView {
    pub state: CallbackState,
    pub attempts: u32,
    /// The last HTTP status the receiver answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    /// When it is tried next (RFC 3339), while `retrying`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
}

/// `202` to a redelivery: the callback is queued again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CallbackRequeued {
    pub run_id: String,
    pub callback: CallbackView,
}

/// `GET /v1/runs/{run_id}/events`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events after this sequence number (`next` of the last page).
    #[serde(default)]
    #[param(minimum = 0)]
    pub after: Option<i64>,
    /// Seconds to wait for an event when there is none yet (at most 20).
    #[serde(default)]
    #[param(maximum = 20)]
    pub wait: Option<u64>,
}

/// A page of a Run's events, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventsPage {
    pub events: Vec<EventView>,
    /// Ask with `after=next` for the events after this page.
    pub next: u64,
}

/// One event: its number, type and time, and the fields of its type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventView {
    pub seq: u64,
    pub at: String,
    /// Its `type` and the fields of that type.
    #[serde(flatten)]
    pub event: LogEvent,
}

impl EventView {
    pub fn kind(&self) -> EventKind {
        self.event.kind()
    }
}

/// `200` to a cancel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunCancelled {
    pub run_id: String,
    pub state: RunState,
}
