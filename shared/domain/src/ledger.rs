//! The tool-call ledger: every tool call a Run makes is recorded
//! `PLANNED → DISPATCHED → DONE | FAILED | INDETERMINATE`, so that a call
//! whose result was lost is never re-sent silently. A record changes only
//! through [`ToolCallRecord::apply`], whose events carry their data.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::approval::{ApprovalKind, ApprovalState};
use crate::skills::Risk;

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
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
    /// Changed only by its machine ([`ToolCallRecord::apply`]).
    state: ToolCallState,
    /// Whether the skill declares that repeating it is harmless.
    pub idempotent: bool,
    /// The call's answer as the ledger keeps it (see [`ledger_copy`]).
    pub result: Option<serde_json::Value>,
    /// Runs in the agent's sandbox (answered through the harness queue).
    #[serde(default)]
    pub sandbox: bool,
    /// Attempt number: a lost idempotent sandbox call is tried again.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// The sandbox generation a sandbox call was dispatched to: the
    /// watchdog asks that generation's record whether the call started.
    #[serde(default)]
    pub generation: Option<u64>,
    /// Answered by child Runs (`delegate`, `plan`): dispatched means its
    /// children were planned, and their ends answer it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub children: bool,
    /// The human approval the call needs before it may be dispatched
    /// (it stays PLANNED until then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<CallApproval>,
}

/// A gated call's approval as its ledger record keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallApproval {
    pub approval_id: String,
    #[serde(default)]
    pub kind: ApprovalKind,
    pub risk: Risk,
    pub reasons: Vec<String>,
    /// The approval record exists (it was created with the commit that
    /// parked the Run).
    #[serde(default)]
    pub requested: bool,
    /// Pending until its decision is applied to the call.
    pub state: ApprovalState,
}

impl ToolCallRecord {
    /// Where the call is: planned, dispatched, or settled.
    pub fn state(&self) -> ToolCallState {
        self.state
    }

    /// Whether the call still waits for a human.
    pub fn awaits_approval(&self) -> bool {
        self.approval
            .as_ref()
            .is_some_and(|a| a.state == ApprovalState::Pending)
    }

    /// Whether the call may be dispatched: it needs no approval, or has it.
    pub fn cleared(&self) -> bool {
        self.approval
            .as_ref()
            .is_none_or(|a| a.state == ApprovalState::Approved)
    }
}

fn first_attempt() -> u32 {
    1
}

/// What names a call's effect outside Armada, for good: its Run and its
/// call id. An inline request sends it as `Idempotency-Key`, so a
/// receiver that deduplicates on it applies a repeat once.
pub fn effect_key(run_id: &str, call_id: &str) -> String {
    format!("{run_id}:{call_id}")
}

/// A tool result kept whole in the ledger (the Run's item); larger ones are
/// whole in their `tool_result` event only.
pub const LEDGER_RESULT_BYTES: usize = 4 * 1024;

/// The ledger keeps small results whole and a note for large ones.
pub fn ledger_copy(result: &Value) -> Value {
    let text = result.to_string();
    if text.len() <= LEDGER_RESULT_BYTES {
        result.clone()
    } else {
        json!({"bytes": text.len(), "note": "the whole result is in the run's tool_result event"})
    }
}

/// What happened to a tool call.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolCallEvent {
    /// Sent to its executor: inline (`generation: None`) or to a sandbox.
    Dispatched { generation: Option<u64> },
    /// The executor answered; `ok` is false when the answer is an error.
    Answered { ok: bool, result: Value },
    /// It could not run at all (it never started): it fails with `result`.
    Refused { result: Value },
    /// It was dispatched and its answer is lost: its effect is unknown.
    Lost,
    /// It is to be sent again as a new attempt (it never started, or it is
    /// idempotent): planned once more, for no particular sandbox.
    Retried,
}

impl ToolCallEvent {
    fn name(&self) -> &'static str {
        match self {
            ToolCallEvent::Dispatched { .. } => "dispatched",
            ToolCallEvent::Answered { .. } => "answered",
            ToolCallEvent::Refused { .. } => "refused",
            ToolCallEvent::Lost => "lost",
            ToolCallEvent::Retried => "retried",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal tool-call transition: {event} in state {from:?}")]
pub struct IllegalToolTransition {
    pub from: ToolCallState,
    pub event: &'static str,
}

impl ToolCallState {
    /// The tool-call state machine: where `event` takes a call in `self`.
    pub fn advance(self, event: &ToolCallEvent) -> Result<ToolCallState, IllegalToolTransition> {
        use ToolCallState::*;
        let to = match (self, event) {
            (Planned, ToolCallEvent::Dispatched { .. }) => Some(Dispatched),
            (Planned, ToolCallEvent::Refused { .. }) => Some(Failed),
            (Planned | Dispatched, ToolCallEvent::Retried) => Some(Planned),
            // A sandbox can answer a call whose dispatch was never
            // committed: the dispatching worker died after sending it.
            (Planned | Dispatched, ToolCallEvent::Answered { ok: true, .. }) => Some(Done),
            (Planned | Dispatched, ToolCallEvent::Answered { ok: false, .. }) => Some(Failed),
            (Dispatched, ToolCallEvent::Refused { .. }) => Some(Failed),
            (Dispatched, ToolCallEvent::Lost) => Some(Indeterminate),
            (Planned, ToolCallEvent::Lost)
            | (Dispatched, ToolCallEvent::Dispatched { .. })
            | (Done | Failed | Indeterminate, _) => None,
        };
        to.ok_or(IllegalToolTransition {
            from: self,
            event: event.name(),
        })
    }

    pub fn is_settled(self) -> bool {
        matches!(
            self,
            ToolCallState::Done | ToolCallState::Failed | ToolCallState::Indeterminate
        )
    }
}

impl ToolCallRecord {
    /// A call the model just asked for, recorded before anything runs.
    pub fn planned(
        call_id: &str,
        skill: &str,
        args: Value,
        step: u32,
        idempotent: bool,
        sandbox: bool,
    ) -> ToolCallRecord {
        ToolCallRecord {
            call_id: call_id.to_string(),
            skill: skill.to_string(),
            args,
            step,
            state: ToolCallState::Planned,
            idempotent,
            result: None,
            sandbox,
            attempt: 1,
            generation: None,
            children: false,
            approval: None,
        }
    }

    /// Applies `event`, keeping the record's data in step with its state.
    fn take(&mut self, event: ToolCallEvent) -> Result<(), IllegalToolTransition> {
        self.state = self.state.advance(&event)?;
        match event {
            ToolCallEvent::Dispatched { generation } => self.generation = generation,
            ToolCallEvent::Answered { result, .. } | ToolCallEvent::Refused { result } => {
                self.result = Some(ledger_copy(&result));
            }
            ToolCallEvent::Lost => {}
            ToolCallEvent::Retried => {
                self.attempt += 1;
                self.generation = None;
            }
        }
        Ok(())
    }
}

/// A tool call in the machines' common shape. It changes only through
/// its events, and decides nothing of its own: what follows an event (the
/// next step, an approval, a retry) is its Run's to decide, and the call
/// is written with its Run, conditional on the Run's stamp.
impl crate::machine::Machine for ToolCallRecord {
    type Event = ToolCallEvent;
    type Action = std::convert::Infallible;
    type Refusal = IllegalToolTransition;
    /// Written inside its Run: the Run's stamp is what a write is
    /// conditional on.
    type Version = ();

    fn apply(
        &mut self,
        event: ToolCallEvent,
        _now_ms: i64,
    ) -> Result<Vec<std::convert::Infallible>, IllegalToolTransition> {
        self.take(event)?;
        Ok(vec![])
    }

    fn version(&self) {}
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
    use crate::machine::Machine;

    fn rec(state: ToolCallState, idempotent: bool) -> ToolCallRecord {
        let mut r = ToolCallRecord::planned("c1", "http_request", json!({}), 0, idempotent, false);
        r.state = state;
        r
    }

    #[test]
    fn lifecycle_is_one_way() {
        use ToolCallState::*;
        let sent = ToolCallEvent::Dispatched { generation: None };
        let ok = ToolCallEvent::Answered {
            ok: true,
            result: json!(1),
        };
        assert_eq!(Planned.advance(&sent), Ok(Dispatched));
        assert_eq!(Dispatched.advance(&ok), Ok(Done));
        assert!(Done.advance(&sent).is_err());
        assert!(Planned.advance(&ToolCallEvent::Lost).is_err());
        assert!(Indeterminate.advance(&ok).is_err());
        assert!(Dispatched.advance(&sent).is_err());
        for settled in [Done, Failed, Indeterminate] {
            assert!(settled.advance(&ToolCallEvent::Retried).is_err());
        }
    }

    #[test]
    fn a_retry_is_a_new_attempt_for_no_sandbox_in_particular() {
        let mut r = rec(ToolCallState::Planned, true);
        r.apply(
            ToolCallEvent::Dispatched {
                generation: Some(3),
            },
            0,
        )
        .unwrap();
        assert_eq!(
            (r.state, r.generation),
            (ToolCallState::Dispatched, Some(3))
        );
        r.apply(ToolCallEvent::Retried, 0).unwrap();
        assert_eq!(
            (r.state, r.attempt, r.generation),
            (ToolCallState::Planned, 2, None)
        );
        r.apply(
            ToolCallEvent::Dispatched {
                generation: Some(4),
            },
            0,
        )
        .unwrap();
        r.apply(
            ToolCallEvent::Answered {
                ok: false,
                result: json!({"error": "x"}),
            },
            0,
        )
        .unwrap();
        assert_eq!(r.state, ToolCallState::Failed);
        assert_eq!(r.result, Some(json!({"error": "x"})));
    }

    #[test]
    fn a_large_answer_is_kept_as_a_note() {
        let mut r = rec(ToolCallState::Dispatched, false);
        let big = json!("x".repeat(LEDGER_RESULT_BYTES + 1));
        r.apply(
            ToolCallEvent::Answered {
                ok: true,
                result: big,
            },
            0,
        )
        .unwrap();
        assert!(r.result.unwrap().get("note").is_some());
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
