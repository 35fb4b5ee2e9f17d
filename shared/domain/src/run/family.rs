//! A Run's family: the plain data of collaboration it carries (its
//! place in its tree, its children and their slots, its chain link, who
//! it ran as and what it resumed). The logic that uses them with the Run
//! is `crate::collab`'s; this module imports none of it, so the Run and
//! collaboration do not depend on each other in a circle.

use serde::{Deserialize, Serialize};

use crate::agent::{AgentDefinition, ModelSpec};
use crate::crypto::sha256_hex;
use crate::run::{ChildFinished, LogEvent, Run, RunError, RunEventRecord, RunState};

/// What a Run is to the tree it belongs to.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// Started by a caller (API, session, trigger).
    Root,
    /// Asked for by its parent's `delegate` call.
    Delegation,
    /// One member of a fan-out team's round 1.
    Member,
    /// One task of a lead's `plan`.
    Executor,
    /// One step of a sequential relay chain.
    ChainStep,
}

impl RunKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Root => "root",
            RunKind::Delegation => "delegation",
            RunKind::Member => "member",
            RunKind::Executor => "executor",
            RunKind::ChainStep => "chain_step",
        }
    }
}

/// A Run's place in its tree (the DelegationTrace): the root it descends
/// from, how deep it is, the agents on the way down (its own last), why it
/// exists, and how many Runs it may still start below it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    pub root_run_id: String,
    pub depth: u32,
    pub path: Vec<String>,
    pub kind: RunKind,
    /// The Runs it may still start below it, itself and through the
    /// shares it gives its children ([`descendants`]). `None`: never
    /// decided, which reads as the deployment's whole bound: a root that
    /// has not started any, or a record written before the bound existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descendants_left: Option<u32>,
}

impl Lineage {
    /// A Run nobody asked for: the root of its own tree.
    pub fn root(run_id: &str, agent: &str) -> Lineage {
        Lineage {
            root_run_id: run_id.to_string(),
            depth: 0,
            path: vec![agent.to_string()],
            kind: RunKind::Root,
            descendants_left: None,
        }
    }

    /// The lineage of a child of this Run, run by `agent`: it may start no
    /// Run below it until it is given a share of its parent's allowance.
    pub fn child(&self, agent: &str, kind: RunKind) -> Lineage {
        let mut path = self.path.clone();
        path.push(agent.to_string());
        Lineage {
            root_run_id: self.root_run_id.clone(),
            depth: self.depth + 1,
            path,
            kind,
            descendants_left: Some(0),
        }
    }

    /// The path as people read it: `a → b → c`.
    pub fn path_text(&self, then: Option<&str>) -> String {
        let mut all: Vec<&str> = self.path.iter().map(String::as_str).collect();
        all.extend(then);
        all.join(" → ")
    }
}

/// Who a Run ran as: its persona (the SHA-256 of its agent's system
/// prompt) and the model it answers with, fixed at its first model call
/// (or, for a resumed child, taken from its source).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunIdentity {
    pub persona_sha256: String,
    pub model: ModelSpec,
}

impl RunIdentity {
    pub fn of(agent: &AgentDefinition) -> RunIdentity {
        RunIdentity {
            persona_sha256: persona_of(agent),
            model: agent.model.clone(),
        }
    }
}

pub fn persona_of(agent: &AgentDefinition) -> String {
    sha256_hex(agent.system_prompt.as_bytes())
}

/// Where a resumed child's copied transcript is, and what it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumedFrom {
    pub source_run_id: String,
    /// The copy, as JSON chat messages, in the payload bucket.
    pub transcript_key: String,
}

/// A resume that passed every check: what the child starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumePlan {
    pub source_run_id: String,
    pub identity: RunIdentity,
    pub messages: usize,
    pub tokens: u64,
    /// A model the call or the agent's definition asked for instead,
    /// ignored (the model is the source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_ignored: Option<String>,
    #[serde(default)]
    pub transcript_key: String,
}

/// A chain step's place in its chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainLink {
    pub chain_id: String,
    /// This step, from 0.
    pub index: u32,
    /// Every step's agent, in order.
    pub steps: Vec<String>,
    /// Hears the chain's end, once (its steps have no callback of their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// The relay team the chain runs for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

impl ChainLink {
    /// The agents of the steps after this one (`chain_remaining`).
    pub fn remaining(&self) -> &[String] {
        self.steps.get(self.index as usize + 1..).unwrap_or(&[])
    }

    pub fn is_last(&self) -> bool {
        self.remaining().is_empty()
    }

    /// The link of the next step.
    pub fn next(&self) -> ChainLink {
        ChainLink {
            index: self.index + 1,
            ..self.clone()
        }
    }
}

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ChainState {
    Running,
    Completed,
    Failed,
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SlotState {
    /// Planned (its Run may already exist, PENDING): waits for a place
    /// within `max_parallel`.
    Queued,
    /// Its start was sent.
    Started,
    /// It reached a terminal state and the parent has taken note.
    Ended,
}

/// What happens to a child's slot in its parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotEvent {
    /// Planned at waiting point `round`: it waits for a place.
    Open { round: u32 },
    /// Given a place within `max_parallel`.
    Start,
    /// Its Run ended, and the parent takes note.
    End { outcome: ChildOutcome },
}

/// What the handler does once a slot's change is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotAction {
    /// Send the start of the child's Run (harmless to repeat: it is sent
    /// before the commit that says so).
    StartRun { run_id: String },
}

/// An event the slot's state cannot take (it changes nothing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal child-slot transition: {event} in state {from:?}")]
pub struct SlotRefused {
    pub from: SlotState,
    pub event: &'static str,
}

/// A child's slot in the machines' common shape: its own transition
/// table; written with its parent Run, whose stamp is its version.
impl ChildSlot {
    /// A slot for a child not started yet (every slot begins queued).
    /// `call_id`: the parent's call it answers; `task`: its input (none:
    /// the parent's own, a team member's).
    pub fn queued(
        run_id: String,
        agent: String,
        kind: RunKind,
        call_id: Option<String>,
        task: Option<String>,
    ) -> ChildSlot {
        ChildSlot {
            run_id,
            agent,
            kind,
            round: 0,
            call_id,
            task,
            state: SlotState::Queued,
            outcome: None,
            resume: None,
            descendants: None,
        }
    }

    /// Where the child is: queued, started, or ended.
    pub fn state(&self) -> SlotState {
        self.state
    }
}

impl crate::machine::Machine for ChildSlot {
    type Event = SlotEvent;
    type Action = SlotAction;
    type Refusal = SlotRefused;
    type Version = ();

    fn apply(&mut self, event: SlotEvent, _now_ms: i64) -> Result<Vec<SlotAction>, SlotRefused> {
        use SlotState::{Ended, Queued, Started};
        let refused = |event| SlotRefused {
            from: self.state,
            event,
        };
        match (self.state, event) {
            // A slot is opened as it is planned, before it is anything else.
            (Queued, SlotEvent::Open { round }) => {
                self.round = round;
                Ok(vec![])
            }
            (Started | Ended, SlotEvent::Open { .. }) => Err(refused("open")),
            (Queued, SlotEvent::Start) => {
                self.state = Started;
                Ok(vec![SlotAction::StartRun {
                    run_id: self.run_id.clone(),
                }])
            }
            (Started | Ended, SlotEvent::Start) => Err(refused("start")),
            (Queued | Started, SlotEvent::End { outcome }) => {
                self.state = Ended;
                self.outcome = Some(outcome);
                Ok(vec![])
            }
            (Ended, SlotEvent::End { .. }) => Err(refused("end")),
        }
    }

    fn version(&self) {}
}

/// How a child ended, as its parent keeps it (the output is in the
/// parent's `child_finished` event).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildOutcome {
    pub state: RunState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildSlot {
    pub run_id: String,
    pub agent: String,
    pub kind: RunKind,
    /// The waiting point it belongs to.
    pub round: u32,
    /// The parent's tool call it answers (`delegate`, `plan`); none for a
    /// team member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// Its input; none: the parent's own input (a team member).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// Changed only by its machine ([`ChildSlot::apply`]).
    state: SlotState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<ChildOutcome>,
    /// It resumes a finished Run (its checks passed, its copy written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumePlan>,
    /// Its share of its parent's allowance: the Runs it may start below
    /// it ([`super::descendants`]). `None` on slots planned before the
    /// bound existed, which read as the deployment's bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descendants: Option<u32>,
}

/// The parent's waiting point and every child it had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Children {
    /// The current (or last) waiting point, from 1.
    pub round: u32,
    /// Children of the current round not yet ended: the counter that
    /// decides, at 0, that the parent goes on.
    pub outstanding: u32,
    pub max_parallel: u32,
    pub slots: Vec<ChildSlot>,
}

impl Children {
    fn current(&self) -> impl Iterator<Item = &ChildSlot> {
        let round = self.round;
        self.slots.iter().filter(move |s| s.round == round)
    }

    /// Children of the current round whose start was sent and that have
    /// not ended.
    pub fn running(&self) -> usize {
        self.current()
            .filter(|s| s.state == SlotState::Started)
            .count()
    }

    pub fn slot(&self, run_id: &str) -> Option<&ChildSlot> {
        self.slots.iter().find(|s| s.run_id == run_id)
    }
}

impl Run {
    /// Children of the current waiting point not yet ended (0 when none).
    pub fn outstanding_children(&self) -> u32 {
        self.children.as_ref().map_or(0, |c| c.outstanding)
    }
}

/// A child's end as its parent hears it (and its `child_finished` event
/// keeps it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildEnd {
    pub run_id: String,
    pub agent: String,
    pub state: RunState,
    /// Its output (clipped to [`CHILD_OUTPUT_BYTES`](crate::collab::children::CHILD_OUTPUT_BYTES)), when it completed.
    pub output: Option<String>,
    pub error: Option<RunError>,
}

impl ChildEnd {
    pub fn completed(&self) -> bool {
        self.state == RunState::Completed
    }

    /// Read back from a parent's `child_finished` event.
    pub fn from_event(ev: &RunEventRecord) -> Option<ChildEnd> {
        match &ev.event {
            LogEvent::ChildFinished(f) => Some(ChildEnd::of(f)),
            _ => None,
        }
    }

    /// The end a `child_finished` event records.
    pub fn of(f: &ChildFinished) -> ChildEnd {
        ChildEnd {
            run_id: f.run_id.clone(),
            agent: f.agent.clone(),
            state: f.state,
            output: f.output.clone(),
            error: f.error.clone(),
        }
    }

    pub(crate) fn failure_text(&self) -> String {
        match &self.error {
            Some(e) => format!("{} ({}: {})", self.state, e.code, e.message),
            None => self.state.to_string(),
        }
    }
}
