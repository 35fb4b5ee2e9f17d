//! `/v1/sessions`: multi-turn conversations with one agent.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use armada_domain::context::HistoryTurn;
use armada_domain::session::OnBusy;

/// `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"agent": "assistant"}))]
pub struct CreateSessionBody {
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    pub agent: String,
    /// What a message posted while the previous one is being answered
    /// does: waits its turn (`queue`, the default) or is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_busy: Option<OnBusy>,
}

/// `201` to a new session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionCreated {
    pub session_id: String,
    pub agent: String,
    pub on_busy: OnBusy,
}

/// `POST /v1/sessions/{session_id}/messages`: the next message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"input": "And what does it run on?"}))]
pub struct MessageBody {
    #[schema(min_length = 1)]
    pub input: String,
}

/// `GET /v1/sessions/{session_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionView {
    pub session_id: String,
    pub agent: String,
    pub on_busy: OnBusy,
    /// Messages posted.
    pub messages: u64,
    /// Messages answered.
    pub answered: u64,
    pub turns: Vec<HistoryTurn>,
}
