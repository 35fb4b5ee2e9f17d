//! What a Run's event log records: [`LogEvent`], one variant per kind of
//! event with the fields that kind carries, named as the API reports it
//! (`type`). [`EventKind`] is the variant's name alone (for filters and
//! the store's `type` attribute); [`LogEvent::kind`] derives it, so a kind
//! cannot be recorded without its fields.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::approval::ApprovalKind;
use crate::chat::ToolCall;
use crate::ledger::ToolCallState;
use crate::run::RunKind;
use crate::run::{clip, RunError, RunState, Trigger};
use crate::skills::Risk;

/// A tool result as its event (and so the model) keeps it: whole up to
/// 64 KiB of JSON, else the start of it, marked truncated. Events are items
/// of at most 400 KB, and a model's context is smaller still.
pub const EVENT_RESULT_BYTES: usize = 64 * 1024;

/// A tool result as its event keeps it.
pub fn event_result(result: &Value) -> Value {
    let text = result.to_string();
    if text.len() <= EVENT_RESULT_BYTES {
        return result.clone();
    }
    let (preview, _) = clip(&text, EVENT_RESULT_BYTES);
    json!({"truncated": true, "bytes": text.len(), "preview": preview})
}

/// One event of a Run's log, with its fields. Written to the store and
/// the API as `{"type": "<kind>", ...fields}`; a field with nothing to say
/// is left out.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LogEvent {
    /// Accepted: by the API, as a team's or a delegation's child, or as a
    /// relay chain's next step.
    RunCreated(Created),
    /// The model answered: its text (clipped) and the tools it asked for.
    ModelReply {
        content: String,
        truncated: bool,
        tool_calls: Vec<ToolCall>,
    },
    /// The model's answer took more than one attempt.
    ModelRetried { attempts: u32 },
    /// The model asked for a tool.
    ToolCall {
        call_id: String,
        name: String,
        args: Value,
    },
    /// Sent to `generation` of the agent's sandbox.
    ToolDispatched {
        call_id: String,
        name: String,
        attempt: u32,
        sandbox: String,
        generation: u64,
    },
    /// A tool answered (or was refused): the call's state and its result.
    ToolResult {
        call_id: String,
        name: String,
        state: ToolCallState,
        result: Value,
    },
    /// A call's effect is unknown: its answer was lost. `asking`: a person
    /// is asked whether it happened.
    ToolIndeterminate {
        call_id: String,
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        asking: bool,
    },
    /// A tool said how far it got (an MCP server's progress
    /// notification), noted with its result.
    ToolProgress {
        call_id: String,
        progress: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// A lost call that is safe to repeat is sent again.
    ToolRetried {
        call_id: String,
        name: String,
        reason: String,
        attempt: u32,
    },
    /// Another Run of the agent holds its sandbox; this one waits at
    /// `position`.
    SandboxWait {
        position: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holder_run_id: Option<String>,
    },
    /// The sandbox refused a call as a violation of its confinement.
    SecurityViolation { call_id: String, message: String },
    /// Older turns were dropped to fit the context window.
    HistoryCompacted { dropped_turns: u64, kept_turns: u64 },
    /// A call waits for a person.
    ApprovalRequested {
        approval_id: String,
        kind: ApprovalKind,
        call_id: String,
        name: String,
        args: Value,
        risk: Risk,
        reasons: Vec<String>,
    },
    /// A person decided.
    ApprovalDecided(ApprovalSettled),
    /// Nobody decided in time: it counts as a rejection.
    ApprovalExpired(ApprovalSettled),
    /// A child Run was started.
    ChildStarted {
        run_id: String,
        agent: String,
        kind: RunKind,
    },
    /// A child Run ended and the parent took note.
    ChildFinished(ChildFinished),
    /// A team's next waiting point began (`after_round`: the round whose
    /// answers it aggregates; `members`: the team's agents, or in round 2
    /// the members' Runs in the team's order).
    RoundStarted {
        round: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after_round: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        team: Option<String>,
        members: Vec<String>,
    },
    /// The Run took over a finished Run's conversation (and keeps its
    /// model: `model_ignored` names a model asked for instead).
    ResumedFrom {
        source_run_id: String,
        messages: u64,
        tokens: u64,
        model: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model_ignored: Option<String>,
    },
    /// A relay chain's next step began.
    ChainStepStarted {
        chain_id: String,
        index: u32,
        agent: String,
        run_id: String,
    },
    /// A relay chain stopped at step `index`, which ended in `state`; the
    /// `skipped` steps never run.
    ChainBroken {
        chain_id: String,
        // Written as `at` before the log was typed; the API showed the
        // event's time under that name instead.
        #[serde(alias = "at")]
        index: u32,
        state: RunState,
        skipped: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
    /// Ended: completed, with its answer (clipped).
    RunCompleted { output: String, truncated: bool },
    /// Ended: failed. `receives`: how often its message was delivered, when
    /// it failed because none of them could be handled.
    RunFailed {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<RunError>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        receives: Option<u32>,
    },
    /// Ended: cancelled, by whom (a key, or its `parent`).
    RunCancelled {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<RunError>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_run_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
    /// Ended: out of wall-clock time.
    RunTimedOut {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<RunError>,
    },
    /// The callback was delivered.
    CallbackDelivered(CallbackReport),
    /// The callback could not be delivered.
    CallbackFailed(CallbackReport),
    /// Its post-terminal duties are done.
    RunClosed { outcome: RunState },
}

/// How a Run came to be (`run_created`): only what applies is present.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Created {
    pub agent: String,
    /// What started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_seq: Option<u64>,
    /// A child's parent, its kind and how deep it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<RunKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// A relay chain's step: the chain, the step's place, the step before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_run_id: Option<String>,
}

/// An approval's end (`approval_decided`, `approval_expired`): who decided,
/// how, from where and when (absent when it expired), and the comment.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalSettled {
    pub approval_id: String,
    pub call_id: String,
    pub name: String,
    pub state: crate::approval::ApprovalState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub how: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// A child's end as its parent recorded it (`child_finished`): what the
/// parent's round 2 and its transcript are rebuilt from.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildFinished {
    pub run_id: String,
    pub agent: String,
    pub kind: RunKind,
    pub round: u32,
    /// The parent's tool call the child answers (a delegation's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    pub state: RunState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
}

/// How a callback's delivery went.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallbackReport {
    /// The delivery's id (the receiver deduplicates on it).
    pub delivery: String,
    pub attempts: u32,
    /// The receiver's last HTTP status, if it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl LogEvent {
    /// The event's kind (its `type`).
    pub fn kind(&self) -> EventKind {
        use LogEvent as E;
        match self {
            E::RunCreated(_) => EventKind::RunCreated,
            E::ModelReply { .. } => EventKind::ModelReply,
            E::ModelRetried { .. } => EventKind::ModelRetried,
            E::ToolCall { .. } => EventKind::ToolCall,
            E::ToolDispatched { .. } => EventKind::ToolDispatched,
            E::ToolResult { .. } => EventKind::ToolResult,
            E::ToolIndeterminate { .. } => EventKind::ToolIndeterminate,
            E::ToolProgress { .. } => EventKind::ToolProgress,
            E::ToolRetried { .. } => EventKind::ToolRetried,
            E::SandboxWait { .. } => EventKind::SandboxWait,
            E::SecurityViolation { .. } => EventKind::SecurityViolation,
            E::HistoryCompacted { .. } => EventKind::HistoryCompacted,
            E::ApprovalRequested { .. } => EventKind::ApprovalRequested,
            E::ApprovalDecided(_) => EventKind::ApprovalDecided,
            E::ApprovalExpired(_) => EventKind::ApprovalExpired,
            E::ChildStarted { .. } => EventKind::ChildStarted,
            E::ChildFinished(_) => EventKind::ChildFinished,
            E::RoundStarted { .. } => EventKind::RoundStarted,
            E::ResumedFrom { .. } => EventKind::ResumedFrom,
            E::ChainStepStarted { .. } => EventKind::ChainStepStarted,
            E::ChainBroken { .. } => EventKind::ChainBroken,
            E::RunCompleted { .. } => EventKind::RunCompleted,
            E::RunFailed { .. } => EventKind::RunFailed,
            E::RunCancelled { .. } => EventKind::RunCancelled,
            E::RunTimedOut { .. } => EventKind::RunTimedOut,
            E::CallbackDelivered(_) => EventKind::CallbackDelivered,
            E::CallbackFailed(_) => EventKind::CallbackFailed,
            E::RunClosed { .. } => EventKind::RunClosed,
        }
    }

    /// The event's fields without its `type` (what the store keeps beside
    /// the kind).
    pub fn fields(&self) -> Value {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut m)) => {
                m.remove("type");
                Value::Object(m)
            }
            // Every variant is a map of fields.
            _ => Value::Object(Default::default()),
        }
    }

    /// An event read back from its kind and its fields; `Err` names what
    /// does not fit.
    pub fn from_parts(kind: &str, fields: Value) -> Result<LogEvent, String> {
        let mut m = match fields {
            Value::Object(m) => m,
            Value::Null => Default::default(),
            other => return Err(format!("the fields of a {kind} event are {other}")),
        };
        m.insert("type".into(), Value::String(kind.to_string()));
        serde_json::from_value(Value::Object(m)).map_err(|e| format!("a {kind} event: {e}"))
    }
}

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Accepted (`agent`, `session_id`, `session_seq`, `team`; a child's
    /// `parent_run_id`, `kind`, `depth`).
    RunCreated,
    /// The model answered (`content`, `tool_calls`, `truncated`).
    ModelReply,
    /// A model call failed and is tried again (`attempt`, `message`).
    ModelRetried,
    /// The model asked for a tool (`call_id`, `name`, `args`).
    ToolCall,
    /// Sent to the agent's sandbox (`call_id`, `generation`).
    ToolDispatched,
    /// A tool answered (`call_id`, `name`, `state`, `result`).
    ToolResult,
    /// A call's effect is unknown: its answer was lost (`call_id`).
    ToolIndeterminate,
    /// A tool said how far it got (`call_id`, `progress`, `total`, `message`).
    ToolProgress,
    /// A lost call that is safe to repeat is sent again (`call_id`, `attempt`).
    ToolRetried,
    /// Another Run of the agent holds its sandbox (`holder_run_id`, `position`).
    SandboxWait,
    /// The sandbox refused a call as a violation of its confinement.
    SecurityViolation,
    /// Older turns were dropped to fit the context window.
    HistoryCompacted,
    /// A call waits for a person (`approval_id`, `call_id`, ...).
    ApprovalRequested,
    /// A person decided (who, how, from where, when, the comment).
    ApprovalDecided,
    /// Nobody decided in time: it counts as a rejection.
    ApprovalExpired,
    /// A child Run was started (`run_id`, `agent`, `kind`).
    ChildStarted,
    /// A child Run ended and the parent took note (`run_id`, `state`, ...).
    ChildFinished,
    /// A team's next waiting point began (`round`, `members`).
    RoundStarted,
    /// The Run took over a finished Run's conversation.
    ResumedFrom,
    /// A relay chain's next step began (`chain_id`, `index`, `run_id`).
    ChainStepStarted,
    /// A relay chain stopped at a step that did not complete.
    ChainBroken,
    /// Ended: completed (`output`, `truncated`).
    RunCompleted,
    /// Ended: failed (`error`).
    RunFailed,
    /// Ended: cancelled (`by`).
    RunCancelled,
    /// Ended: out of wall-clock time (`error`).
    RunTimedOut,
    /// The callback was delivered.
    CallbackDelivered,
    /// The callback could not be delivered (`error`).
    CallbackFailed,
    /// Its post-terminal duties are done (`outcome`).
    RunClosed,
}

/// Every kind.
pub const ALL_EVENTS: [EventKind; 28] = [
    EventKind::RunCreated,
    EventKind::ModelReply,
    EventKind::ModelRetried,
    EventKind::ToolCall,
    EventKind::ToolDispatched,
    EventKind::ToolResult,
    EventKind::ToolIndeterminate,
    EventKind::ToolProgress,
    EventKind::ToolRetried,
    EventKind::SandboxWait,
    EventKind::SecurityViolation,
    EventKind::HistoryCompacted,
    EventKind::ApprovalRequested,
    EventKind::ApprovalDecided,
    EventKind::ApprovalExpired,
    EventKind::ChildStarted,
    EventKind::ChildFinished,
    EventKind::RoundStarted,
    EventKind::ResumedFrom,
    EventKind::ChainStepStarted,
    EventKind::ChainBroken,
    EventKind::RunCompleted,
    EventKind::RunFailed,
    EventKind::RunCancelled,
    EventKind::RunTimedOut,
    EventKind::CallbackDelivered,
    EventKind::CallbackFailed,
    EventKind::RunClosed,
];

/// Every kind that records a Run's end ([`crate::run::RunState::terminal_event`]).
pub const TERMINAL_EVENTS: [EventKind; 4] = [
    EventKind::RunCompleted,
    EventKind::RunFailed,
    EventKind::RunTimedOut,
    EventKind::RunCancelled,
];

impl EventKind {
    /// Whether the event records the Run's end.
    pub fn is_terminal(self) -> bool {
        TERMINAL_EVENTS.contains(&self)
    }

    /// The name the API and the store use.
    pub fn as_str(self) -> &'static str {
        use EventKind::*;
        match self {
            RunCreated => "run_created",
            ModelReply => "model_reply",
            ModelRetried => "model_retried",
            ToolCall => "tool_call",
            ToolDispatched => "tool_dispatched",
            ToolResult => "tool_result",
            ToolIndeterminate => "tool_indeterminate",
            ToolProgress => "tool_progress",
            ToolRetried => "tool_retried",
            SandboxWait => "sandbox_wait",
            SecurityViolation => "security_violation",
            HistoryCompacted => "history_compacted",
            ApprovalRequested => "approval_requested",
            ApprovalDecided => "approval_decided",
            ApprovalExpired => "approval_expired",
            ChildStarted => "child_started",
            ChildFinished => "child_finished",
            RoundStarted => "round_started",
            ResumedFrom => "resumed_from",
            ChainStepStarted => "chain_step_started",
            ChainBroken => "chain_broken",
            RunCompleted => "run_completed",
            RunFailed => "run_failed",
            RunCancelled => "run_cancelled",
            RunTimedOut => "run_timed_out",
            CallbackDelivered => "callback_delivered",
            CallbackFailed => "callback_failed",
            RunClosed => "run_closed",
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for EventKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        serde_json::from_value(serde_json::Value::String(s.to_string()))
            .map_err(|_| format!("'{s}' is not a kind of run event"))
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
