//! The Run record and its state machine.
//!
//! A transition takes the current state, an event and the current time and
//! returns the next state plus the actions the caller must carry out. Nothing
//! here does IO or reads a clock: the harness, dispatcher and ingress do the
//! writes that the actions name, fenced on the Run's epoch.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ledger::ToolCallRecord;

/// Every state a Run can be in, by the names the API reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunState {
    Pending,
    Executing,
    AwaitingTool,
    AwaitingHitl,
    AwaitingChildren,
    Completed,
    Failed,
    Cancelled,
    TimedOut,
    ClosedCompleted,
    ClosedFailed,
    ClosedCancelled,
    ClosedTimedOut,
}

impl RunState {
    pub const ALL: [RunState; 13] = [
        RunState::Pending,
        RunState::Executing,
        RunState::AwaitingTool,
        RunState::AwaitingHitl,
        RunState::AwaitingChildren,
        RunState::Completed,
        RunState::Failed,
        RunState::Cancelled,
        RunState::TimedOut,
        RunState::ClosedCompleted,
        RunState::ClosedFailed,
        RunState::ClosedCancelled,
        RunState::ClosedTimedOut,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Pending => "PENDING",
            RunState::Executing => "EXECUTING",
            RunState::AwaitingTool => "AWAITING_TOOL",
            RunState::AwaitingHitl => "AWAITING_HITL",
            RunState::AwaitingChildren => "AWAITING_CHILDREN",
            RunState::Completed => "COMPLETED",
            RunState::Failed => "FAILED",
            RunState::Cancelled => "CANCELLED",
            RunState::TimedOut => "TIMED_OUT",
            RunState::ClosedCompleted => "CLOSED_COMPLETED",
            RunState::ClosedFailed => "CLOSED_FAILED",
            RunState::ClosedCancelled => "CLOSED_CANCELLED",
            RunState::ClosedTimedOut => "CLOSED_TIMED_OUT",
        }
    }

    pub fn parse(s: &str) -> Option<RunState> {
        RunState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Terminal: the Run's outcome is decided (closed or not).
    pub fn is_terminal(self) -> bool {
        !self.is_active()
    }

    /// Active: the Run can still make progress.
    pub fn is_active(self) -> bool {
        match self {
            RunState::Pending
            | RunState::Executing
            | RunState::AwaitingTool
            | RunState::AwaitingHitl
            | RunState::AwaitingChildren => true,
            RunState::Completed
            | RunState::Failed
            | RunState::Cancelled
            | RunState::TimedOut
            | RunState::ClosedCompleted
            | RunState::ClosedFailed
            | RunState::ClosedCancelled
            | RunState::ClosedTimedOut => false,
        }
    }

    /// Closed: post-terminal duties (session, parent, callback) are settled.
    pub fn is_closed(self) -> bool {
        matches!(
            self,
            RunState::ClosedCompleted
                | RunState::ClosedFailed
                | RunState::ClosedCancelled
                | RunState::ClosedTimedOut
        )
    }

    /// The closed state that follows a terminal one.
    fn closed(self) -> Option<RunState> {
        match self {
            RunState::Completed => Some(RunState::ClosedCompleted),
            RunState::Failed => Some(RunState::ClosedFailed),
            RunState::Cancelled => Some(RunState::ClosedCancelled),
            RunState::TimedOut => Some(RunState::ClosedTimedOut),
            RunState::Pending
            | RunState::Executing
            | RunState::AwaitingTool
            | RunState::AwaitingHitl
            | RunState::AwaitingChildren
            | RunState::ClosedCompleted
            | RunState::ClosedFailed
            | RunState::ClosedCancelled
            | RunState::ClosedTimedOut => None,
        }
    }

    /// The terminal outcome, with closed states mapped back to it.
    pub fn outcome(self) -> RunState {
        match self {
            RunState::ClosedCompleted => RunState::Completed,
            RunState::ClosedFailed => RunState::Failed,
            RunState::ClosedCancelled => RunState::Cancelled,
            RunState::ClosedTimedOut => RunState::TimedOut,
            other => other,
        }
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened to a Run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEvent {
    /// A harness worker claimed the next step.
    Claimed,
    /// The step requested tools whose results are in; the next step is queued.
    StepContinues,
    /// The step dispatched sandbox calls (or queued for the sandbox) and
    /// waits for their answers.
    AwaitTool,
    /// The step needs a human's approval before it can go on.
    AwaitApproval,
    /// The model gave its final answer.
    Answered,
    /// The step failed for good (budget, model, dead letter, indeterminate tool).
    Failed,
    /// A caller cancelled the Run.
    CancelRequested,
    /// The wall-clock budget ran out.
    DeadlineExceeded,
    /// Post-terminal duties are settled.
    Closed,
}

impl fmt::Display for RunEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            RunEvent::Claimed => "claimed",
            RunEvent::StepContinues => "step_continues",
            RunEvent::AwaitTool => "await_tool",
            RunEvent::AwaitApproval => "await_approval",
            RunEvent::Answered => "answered",
            RunEvent::Failed => "failed",
            RunEvent::CancelRequested => "cancel_requested",
            RunEvent::DeadlineExceeded => "deadline_exceeded",
            RunEvent::Closed => "closed",
        };
        f.write_str(s)
    }
}

/// IO that a transition asks its caller to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunAction {
    /// Send the harness the message for the next step.
    EnqueueNextStep,
    /// Tell the dispatcher the Run reached a terminal state.
    AnnounceTerminal,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal run transition: {event} in state {from}")]
pub struct IllegalTransition {
    pub from: RunState,
    pub event: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub to: RunState,
    pub actions: Vec<RunAction>,
}

fn illegal(from: RunState, event: &RunEvent) -> IllegalTransition {
    IllegalTransition {
        from,
        event: event.to_string(),
    }
}

/// The Run state machine.
pub fn transition(from: RunState, event: &RunEvent) -> Result<Transition, IllegalTransition> {
    use RunAction::*;
    use RunState::*;
    let go = |to: RunState, actions: Vec<RunAction>| Ok(Transition { to, actions });
    match event {
        RunEvent::Claimed => match from {
            Pending | Executing | AwaitingTool | AwaitingHitl | AwaitingChildren => {
                go(Executing, vec![])
            }
            Completed | Failed | Cancelled | TimedOut | ClosedCompleted | ClosedFailed
            | ClosedCancelled | ClosedTimedOut => Err(illegal(from, event)),
        },
        RunEvent::StepContinues => match from {
            Executing => go(Executing, vec![EnqueueNextStep]),
            Pending | AwaitingTool | AwaitingHitl | AwaitingChildren | Completed | Failed
            | Cancelled | TimedOut | ClosedCompleted | ClosedFailed | ClosedCancelled
            | ClosedTimedOut => Err(illegal(from, event)),
        },
        RunEvent::AwaitTool => match from {
            Executing => go(AwaitingTool, vec![]),
            Pending | AwaitingTool | AwaitingHitl | AwaitingChildren | Completed | Failed
            | Cancelled | TimedOut | ClosedCompleted | ClosedFailed | ClosedCancelled
            | ClosedTimedOut => Err(illegal(from, event)),
        },
        RunEvent::AwaitApproval => match from {
            Executing => go(AwaitingHitl, vec![]),
            Pending | AwaitingTool | AwaitingHitl | AwaitingChildren | Completed | Failed
            | Cancelled | TimedOut | ClosedCompleted | ClosedFailed | ClosedCancelled
            | ClosedTimedOut => Err(illegal(from, event)),
        },
        RunEvent::Answered => match from {
            Executing => go(Completed, vec![AnnounceTerminal]),
            Pending | AwaitingTool | AwaitingHitl | AwaitingChildren | Completed | Failed
            | Cancelled | TimedOut | ClosedCompleted | ClosedFailed | ClosedCancelled
            | ClosedTimedOut => Err(illegal(from, event)),
        },
        RunEvent::Failed => match from {
            Pending | Executing | AwaitingTool | AwaitingHitl | AwaitingChildren => {
                go(Failed, vec![AnnounceTerminal])
            }
            Completed | Failed | Cancelled | TimedOut | ClosedCompleted | ClosedFailed
            | ClosedCancelled | ClosedTimedOut => Err(illegal(from, event)),
        },
        RunEvent::CancelRequested => match from {
            Pending | Executing | AwaitingTool | AwaitingHitl | AwaitingChildren => {
                go(Cancelled, vec![AnnounceTerminal])
            }
            Completed | Failed | Cancelled | TimedOut | ClosedCompleted | ClosedFailed
            | ClosedCancelled | ClosedTimedOut => Err(illegal(from, event)),
        },
        RunEvent::DeadlineExceeded => match from {
            Pending | Executing | AwaitingTool | AwaitingHitl | AwaitingChildren => {
                go(TimedOut, vec![AnnounceTerminal])
            }
            Completed | Failed | Cancelled | TimedOut | ClosedCompleted | ClosedFailed
            | ClosedCancelled | ClosedTimedOut => Err(illegal(from, event)),
        },
        RunEvent::Closed => match from.closed() {
            Some(to) => go(to, vec![]),
            None => Err(illegal(from, event)),
        },
    }
}

/// A stable error code and a human message, as recorded on a failed Run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunError {
    pub code: String,
    pub message: String,
}

impl RunError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        RunError {
            code: code.to_string(),
            message: message.into(),
        }
    }
}

/// Limits a Run may not exceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budgets {
    pub max_model_turns: u32,
    pub max_tool_calls: u32,
    /// Wall-clock deadline, in milliseconds since the epoch.
    pub deadline_ms: i64,
}

/// What a Run has used so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub model_turns: u32,
    pub tool_calls: u32,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Cuts `text` to at most `max` bytes (on a character boundary) for event
/// previews; says whether it cut.
pub fn clip(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    (&text[..cut], true)
}

/// Where a large body lives: inline, or in the payload bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Payload {
    Inline { text: String },
    Stored { key: String, bytes: usize },
}

/// The durable record of one Run. The fields the claim and fence conditions
/// look at (`state`, `step`, `epoch`, `lease_until_ms`) are kept apart by the
/// store; the rest travels as one document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub run_id: String,
    pub tenant: String,
    pub agent: String,
    pub state: RunState,
    /// The step the next harness message must carry.
    pub step: u32,
    /// Incremented by every claim; every write of a step is fenced on it.
    pub epoch: u64,
    pub lease_until_ms: i64,
    /// Number of events appended so far (the next event's seq).
    pub event_seq: u64,
    pub input: Payload,
    pub output: Option<Payload>,
    pub error: Option<RunError>,
    pub session_id: Option<String>,
    /// This Run's position among its session's messages (1-based).
    pub session_seq: Option<u64>,
    pub parent_run_id: Option<String>,
    pub callback_url: Option<String>,
    pub metadata: serde_json::Value,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub budgets: Budgets,
    pub usage: Usage,
    /// The tool-call ledger, by call id.
    pub ledger: BTreeMap<String, ToolCallRecord>,
    /// The sandbox identity this Run holds or waits for (released when
    /// the Run ends).
    #[serde(default)]
    pub sandbox_key: Option<String>,
    /// The agent is resident: its sandbox is warmed when the Run starts.
    #[serde(default)]
    pub prewarm_sandbox: bool,
}

/// How a harness message relates to the Run it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The message is for the Run's current step and nobody holds it.
    Claimable,
    /// Another worker holds a live lease on this step: retry later.
    LeaseHeld { until_ms: i64 },
    /// The message is a duplicate or was overtaken; drop it.
    Stale { reason: StaleReason },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleReason {
    /// The Run already reached a terminal state.
    Terminal,
    /// The step was already committed (a duplicate, or a redelivery after a
    /// commit whose follow-up message may have been lost).
    StepDone,
    /// The message expects a step the Run has not reached.
    Ahead,
}

impl StaleReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StaleReason::Terminal => "terminal",
            StaleReason::StepDone => "step_done",
            StaleReason::Ahead => "ahead",
        }
    }
}

impl Run {
    /// Decides what to do with a harness message for `step`.
    pub fn classify_delivery(&self, step: u32, now_ms: i64) -> Delivery {
        if self.state.is_terminal() {
            return Delivery::Stale {
                reason: StaleReason::Terminal,
            };
        }
        if step < self.step {
            return Delivery::Stale {
                reason: StaleReason::StepDone,
            };
        }
        if step > self.step {
            return Delivery::Stale {
                reason: StaleReason::Ahead,
            };
        }
        if self.lease_until_ms > now_ms {
            return Delivery::LeaseHeld {
                until_ms: self.lease_until_ms,
            };
        }
        Delivery::Claimable
    }

    /// Whether the wall-clock budget has run out.
    pub fn past_deadline(&self, now_ms: i64) -> bool {
        now_ms >= self.budgets.deadline_ms
    }

    pub fn input_text(&self) -> Option<&str> {
        match &self.input {
            Payload::Inline { text } => Some(text),
            Payload::Stored { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_refuse_every_progress_event() {
        for st in [
            RunState::Completed,
            RunState::Failed,
            RunState::Cancelled,
            RunState::TimedOut,
        ] {
            for ev in [
                RunEvent::Claimed,
                RunEvent::StepContinues,
                RunEvent::AwaitTool,
                RunEvent::AwaitApproval,
                RunEvent::Answered,
                RunEvent::Failed,
                RunEvent::CancelRequested,
                RunEvent::DeadlineExceeded,
            ] {
                assert!(transition(st, &ev).is_err(), "{st} {ev}");
            }
            let closed = transition(st, &RunEvent::Closed).unwrap().to;
            assert!(closed.is_closed());
            assert_eq!(closed.outcome(), st);
            assert!(transition(closed, &RunEvent::Closed).is_err());
        }
    }

    #[test]
    fn happy_path_announces_terminal_once() {
        let t = transition(RunState::Pending, &RunEvent::Claimed).unwrap();
        assert_eq!(t.to, RunState::Executing);
        let t = transition(t.to, &RunEvent::StepContinues).unwrap();
        assert_eq!(t.actions, vec![RunAction::EnqueueNextStep]);
        let t = transition(t.to, &RunEvent::Answered).unwrap();
        assert_eq!(t.to, RunState::Completed);
        assert_eq!(t.actions, vec![RunAction::AnnounceTerminal]);
        assert!(transition(RunState::Pending, &RunEvent::Answered).is_err());
    }

    #[test]
    fn names_round_trip() {
        for st in RunState::ALL {
            assert_eq!(RunState::parse(st.as_str()), Some(st));
            let json = serde_json::to_string(&st).unwrap();
            assert_eq!(json, format!("\"{}\"", st.as_str()));
        }
    }
}

/// One entry of a Run's append-only event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEventRecord {
    pub seq: u64,
    #[serde(rename = "type")]
    pub kind: String,
    pub at_ms: i64,
    pub data: serde_json::Value,
}

impl Run {
    /// Appends an event to the Run's log (in memory; the caller commits it
    /// together with the Run, fenced).
    pub fn push_event(
        &mut self,
        kind: &str,
        data: serde_json::Value,
        now_ms: i64,
    ) -> RunEventRecord {
        self.event_seq += 1;
        RunEventRecord {
            seq: self.event_seq,
            kind: kind.to_string(),
            at_ms: now_ms,
            data,
        }
    }

    /// Applies an event to the state machine, keeping the record's state in step.
    pub fn apply(
        &mut self,
        event: &RunEvent,
        now_ms: i64,
    ) -> Result<Vec<RunAction>, IllegalTransition> {
        let t = transition(self.state, event)?;
        self.state = t.to;
        self.updated_at_ms = now_ms;
        Ok(t.actions)
    }
}

/// The version of a Run a writer read: its write is conditional on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub epoch: u64,
    pub event_seq: u64,
}

impl Run {
    pub fn stamp(&self) -> Stamp {
        Stamp {
            epoch: self.epoch,
            event_seq: self.event_seq,
        }
    }
}
