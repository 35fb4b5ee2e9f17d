//! The Run record and its state machine.
//!
//! A transition takes the current state, an event and the current time and
//! returns the next state plus the actions the caller must carry out. Nothing
//! here does IO or reads a clock: the harness, dispatcher and ingress do the
//! writes that the actions name, fenced on the Run's epoch.
//!
//! - [`machine`]: states, events, [`transition`] and [`Run::apply`]
//! - [`callback`]: its callback, retried with backoff for up to a day
//! - this module: the record, [`Run::new`], how a delivery relates to it

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::agent::AgentLimits;
use crate::ledger::ToolCallRecord;
use crate::team::TeamDefinition;

pub mod callback;
mod corrupt;
mod events;
pub mod family;
mod machine;
mod trigger;
pub use corrupt::{RunHead, CORRUPT_RECORD};
pub use events::{
    event_result, ApprovalSettled, CallbackReport, ChildFinished, Created, EventKind, LogEvent,
    ALL_EVENTS, EVENT_RESULT_BYTES, TERMINAL_EVENTS,
};
pub use family::{ChainLink, Children, Lineage, ResumedFrom, RunIdentity, RunKind};

pub use machine::{transition, IllegalTransition, RunAction, RunEvent, RunState, Transition};
pub use trigger::{Artifact, Trigger};

/// A stable error code and a human message, as recorded on a failed Run.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
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
    /// Changed only by the Run's machine ([`Run::apply`]); read with
    /// [`Run::state`].
    state: RunState,
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
    /// When it reached its terminal state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<i64>,
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
    /// Where the Run sits in its tree of Runs (absent on records written
    /// before collaboration: a root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
    /// The team this Run is the team's Run of (fan-out aggregator, lead),
    /// as it was defined when the Run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<TeamDefinition>,
    /// The children it waits for, and every child it had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub children: Option<Children>,
    /// Its place in a sequential relay chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<ChainLink>,
    /// Who it runs as (persona, model), fixed at its first model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<RunIdentity>,
    /// The finished Run it resumes (its transcript copied before its input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<ResumedFrom>,
    /// The API key id that started it (or its root): the key that may not
    /// let its own Run go on past an approval (approve, retry, happened).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by: Option<String>,
    /// The delivery of its outcome to its callback URL (or its chain's),
    /// once one was tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<callback::CallbackRecord>,
    /// What started it, when something outside the stack did (a hook);
    /// otherwise [`Run::trigger`] says it from the Run's place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_from: Option<Trigger>,
    /// The address of the person whose key started it (or whose mail did),
    /// when known: their approval links do not let it go on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by_address: Option<String>,
    /// Since when it waits for a human: that wait does not count against
    /// its wall-clock budget (the approvals' own expiry bounds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting_human_since_ms: Option<i64>,
}

/// What a new Run is made of; everything else starts empty.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub run_id: String,
    pub tenant: String,
    pub agent: String,
    pub input: Payload,
    /// The session and this Run's position in it.
    pub session: Option<(String, u64)>,
    pub parent_run_id: Option<String>,
    pub callback_url: Option<String>,
    pub metadata: serde_json::Value,
    pub limits: AgentLimits,
    pub prewarm_sandbox: bool,
}

impl Run {
    /// A Run as accepted: `PENDING` at step 0, epoch 0, nothing used yet,
    /// its deadline `limits.timeout_s` from `now_ms`.
    pub fn new(new: NewRun, now_ms: i64) -> Run {
        let (session_id, session_seq) = new.session.unzip();
        Run {
            run_id: new.run_id,
            tenant: new.tenant,
            agent: new.agent,
            state: RunState::Pending,
            step: 0,
            epoch: 0,
            lease_until_ms: 0,
            event_seq: 0,
            input: new.input,
            output: None,
            error: None,
            session_id,
            session_seq,
            parent_run_id: new.parent_run_id,
            callback_url: new.callback_url,
            metadata: new.metadata,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            ended_at_ms: None,
            budgets: Budgets {
                max_model_turns: new.limits.max_model_turns,
                max_tool_calls: new.limits.max_tool_calls,
                deadline_ms: now_ms + i64::from(new.limits.timeout_s) * 1000,
            },
            usage: Usage::default(),
            ledger: BTreeMap::new(),
            sandbox_key: None,
            prewarm_sandbox: new.prewarm_sandbox,
            lineage: None,
            team: None,
            children: None,
            chain: None,
            identity: None,
            resumed: None,
            started_by: None,
            started_by_address: None,
            started_from: None,
            callback: None,
            awaiting_human_since_ms: None,
        }
    }

    /// The Run's place in its tree: its own root unless it is a child.
    /// What started it: what it records, or else its place says (a
    /// session's message, a child, a chain's later step, or the API).
    pub fn trigger(&self) -> Trigger {
        if let Some(t) = &self.started_from {
            return t.clone();
        }
        if let Some(session_id) = &self.session_id {
            return Trigger::Session {
                session_id: session_id.clone(),
            };
        }
        if let Some(parent) = &self.parent_run_id {
            return Trigger::Child {
                parent_run_id: parent.clone(),
            };
        }
        match &self.chain {
            Some(link) if link.index > 0 => Trigger::Chain {
                chain_id: link.chain_id.clone(),
            },
            _ => Trigger::Api,
        }
    }

    pub fn lineage(&self) -> Lineage {
        self.lineage
            .clone()
            .unwrap_or_else(|| Lineage::root(&self.run_id, &self.agent))
    }
}

/// A Run for unit tests: tenant `t`, agent `a`, input `hi`, created at 0.
#[cfg(test)]
pub(crate) fn test_run() -> Run {
    Run::new(
        NewRun {
            run_id: "run_1".into(),
            tenant: "t".into(),
            agent: "a".into(),
            input: Payload::Inline { text: "hi".into() },
            session: None,
            parent_run_id: None,
            callback_url: None,
            metadata: serde_json::json!({}),
            limits: AgentLimits::default(),
            prewarm_sandbox: false,
        },
        0,
    )
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

    /// Whether the wall-clock budget has run out (never while a human is
    /// deciding: that time is given back when the Run resumes).
    pub fn past_deadline(&self, now_ms: i64) -> bool {
        self.state != RunState::AwaitingHitl && now_ms >= self.budgets.deadline_ms
    }

    pub fn input_text(&self) -> Option<&str> {
        match &self.input {
            Payload::Inline { text } => Some(text),
            Payload::Stored { .. } => None,
        }
    }
}

/// One entry of a Run's append-only event log.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEventRecord {
    pub seq: u64,
    pub at_ms: i64,
    pub event: LogEvent,
}

impl Run {
    /// Where the Run is in its life.
    pub fn state(&self) -> RunState {
        self.state
    }

    /// The Run as the store holds it: its document with the state its
    /// item says (a claim writes the item's fields, not the document).
    /// Loading a record is not a transition; nothing else sets a state
    /// outside [`Run::apply`].
    pub fn as_stored(mut self, state: RunState) -> Run {
        self.state = state;
        self
    }
}

impl RunEventRecord {
    pub fn kind(&self) -> EventKind {
        self.event.kind()
    }

    /// The event's fields as JSON (as the API shows them, without `type`).
    pub fn fields(&self) -> serde_json::Value {
        self.event.fields()
    }
}

/// What a Run's end is recorded with beyond its state and its error
/// ([`Run::push_end_event`]); what does not apply to the end is ignored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EndNote {
    /// A completed Run's answer, clipped, and whether it was clipped.
    pub output: Option<(String, bool)>,
    /// Who cancelled it (a key, or `parent`), the parent, and why.
    pub by: Option<String>,
    pub parent_run_id: Option<String>,
    pub code: Option<String>,
    /// How often the message whose failures ended it was delivered.
    pub receives: Option<u32>,
}

impl Run {
    /// Appends an event to the Run's log (in memory; the caller commits it
    /// together with the Run, fenced).
    pub fn push_event(&mut self, event: LogEvent, now_ms: i64) -> RunEventRecord {
        self.event_seq += 1;
        RunEventRecord {
            seq: self.event_seq,
            at_ms: now_ms,
            event,
        }
    }

    /// Records the end the Run has reached: the event its outcome names
    /// ([`RunState::terminal_event`]), with its error and `note`. `None`
    /// while it is still active (no end to record).
    pub fn push_end_event(&mut self, note: EndNote, now_ms: i64) -> Option<RunEventRecord> {
        use RunState::*;
        let error = self.error.clone();
        let event = match self.state {
            Completed | ClosedCompleted => {
                let (output, truncated) = note.output.unwrap_or_default();
                LogEvent::RunCompleted { output, truncated }
            }
            Failed | ClosedFailed => LogEvent::RunFailed {
                error,
                receives: note.receives,
            },
            TimedOut | ClosedTimedOut => LogEvent::RunTimedOut { error },
            Cancelled | ClosedCancelled => LogEvent::RunCancelled {
                error,
                by: note.by,
                parent_run_id: note.parent_run_id,
                code: note.code,
            },
            Pending | Executing | AwaitingTool | AwaitingHitl | AwaitingChildren => return None,
        };
        Some(self.push_event(event, now_ms))
    }
}

/// The version of a Run a writer read: its write is conditional on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub epoch: u64,
    pub event_seq: u64,
}

/// The Run's machine in the common shape ([`crate::machine::Machine`]):
/// its transition table is [`machine`]'s, and it is versioned by its
/// stamp.
impl crate::machine::Machine for Run {
    type Event = RunEvent;
    type Action = RunAction;
    type Refusal = IllegalTransition;
    type Version = Stamp;

    fn apply(&mut self, event: RunEvent, now_ms: i64) -> Result<Vec<RunAction>, IllegalTransition> {
        Run::apply(self, event, now_ms)
    }

    fn version(&self) -> Stamp {
        self.stamp()
    }
}

impl Run {
    pub fn stamp(&self) -> Stamp {
        Stamp {
            epoch: self.epoch,
            event_seq: self.event_seq,
        }
    }
}
