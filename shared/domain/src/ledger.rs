//! The tool-call ledger: every tool call a Run makes is recorded
//! `PLANNED → DISPATCHED → DONE | FAILED | INDETERMINATE`, so that a call
//! whose result was lost is never re-sent silently.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ToolCallState {
    Planned,
    Dispatched,
    Done,
    Failed,
    Indeterminate,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    pub call_id: String,
    pub skill: String,
    pub args: serde_json::Value,
    /// The step that planned the call.
    pub step: u32,
    pub state: ToolCallState,
    /// Whether the skill declares that repeating it is harmless.
    pub idempotent: bool,
    pub result: Option<serde_json::Value>,
    /// Runs in the agent's sandbox (answered through the harness queue).
    #[serde(default)]
    pub sandbox: bool,
    /// Attempt number: a lost idempotent sandbox call is tried again.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
}

fn first_attempt() -> u32 {
    1
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal tool-call transition {from:?} -> {to:?}")]
pub struct IllegalToolTransition {
    pub from: ToolCallState,
    pub to: ToolCallState,
}

impl ToolCallState {
    pub fn advance(self, to: ToolCallState) -> Result<ToolCallState, IllegalToolTransition> {
        use ToolCallState::*;
        let ok = match (self, to) {
            (Planned, Dispatched) | (Planned, Failed) => true,
            (Dispatched, Done) | (Dispatched, Failed) | (Dispatched, Indeterminate) => true,
            (Planned, Planned | Done | Indeterminate)
            | (Dispatched, Planned | Dispatched)
            | (Done | Failed | Indeterminate, _) => false,
        };
        if ok {
            Ok(to)
        } else {
            Err(IllegalToolTransition { from: self, to })
        }
    }

    pub fn is_settled(self) -> bool {
        matches!(
            self,
            ToolCallState::Done | ToolCallState::Failed | ToolCallState::Indeterminate
        )
    }
}

/// What to do, on a redelivered step, with a call the previous worker had
/// already dispatched and whose result never got committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Safe to run again.
    Redo,
    /// Its effect is unknown: surface it, never guess.
    Indeterminate,
}

pub fn recover(record: &ToolCallRecord) -> Option<Recovery> {
    match record.state {
        ToolCallState::Planned => Some(Recovery::Redo),
        ToolCallState::Dispatched if record.idempotent => Some(Recovery::Redo),
        ToolCallState::Dispatched => Some(Recovery::Indeterminate),
        ToolCallState::Done | ToolCallState::Failed | ToolCallState::Indeterminate => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(state: ToolCallState, idempotent: bool) -> ToolCallRecord {
        ToolCallRecord {
            call_id: "c1".into(),
            skill: "http_request".into(),
            args: serde_json::json!({}),
            step: 0,
            state,
            idempotent,
            result: None,
            sandbox: false,
            attempt: 1,
        }
    }

    #[test]
    fn lifecycle_is_one_way() {
        use ToolCallState::*;
        assert_eq!(Planned.advance(Dispatched), Ok(Dispatched));
        assert_eq!(Dispatched.advance(Done), Ok(Done));
        assert!(Done.advance(Dispatched).is_err());
        assert!(Planned.advance(Done).is_err());
        assert!(Indeterminate.advance(Done).is_err());
    }

    #[test]
    fn dispatched_non_idempotent_call_is_never_replayed() {
        assert_eq!(
            recover(&rec(ToolCallState::Dispatched, false)),
            Some(Recovery::Indeterminate)
        );
        assert_eq!(
            recover(&rec(ToolCallState::Dispatched, true)),
            Some(Recovery::Redo)
        );
        assert_eq!(
            recover(&rec(ToolCallState::Planned, false)),
            Some(Recovery::Redo)
        );
        assert_eq!(recover(&rec(ToolCallState::Done, false)), None);
    }
}
