//! What a Run's event log records: every kind of event, by the name the
//! API reports it under (`type`). A kind not listed here cannot be
//! recorded: `Run::push_event` takes one of these.

use serde::{Deserialize, Serialize};

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
pub const ALL_EVENTS: [EventKind; 27] = [
    EventKind::RunCreated,
    EventKind::ModelReply,
    EventKind::ModelRetried,
    EventKind::ToolCall,
    EventKind::ToolDispatched,
    EventKind::ToolResult,
    EventKind::ToolIndeterminate,
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
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_named_as_it_is_written() {
        for kind in ALL_EVENTS {
            let written = serde_json::to_value(kind).unwrap();
            assert_eq!(written, kind.as_str());
            assert_eq!(kind.as_str().parse::<EventKind>(), Ok(kind));
        }
        assert_eq!(EventKind::ChainStepStarted.as_str(), "chain_step_started");
        assert_eq!(
            serde_json::to_value(EventKind::ChainStepStarted).unwrap(),
            "chain_step_started"
        );
        assert!("nothing".parse::<EventKind>().is_err());
    }
}
