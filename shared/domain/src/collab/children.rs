//! The children a parent Run waits for. The parent's record holds one slot
//! per child it ever had (rounds accumulate: the trace reads them) and, for
//! the current waiting point, the outstanding counter. Every change of it
//! is made here, on the parent as read, and written back by the caller
//! conditional on that version: two children ending together cannot both
//! take the counter from 2 to 1, and a child's end recorded twice is seen
//! as a duplicate by its slot, so the round settles exactly once.

use serde_json::{json, Value};

use super::{child_run_id, codes, descendants, Lineage, RunKind};
use crate::agent::AgentDefinition;
use crate::ledger::ToolCallEvent;
use crate::machine::Machine;
use crate::run::ResumedFrom;
use crate::run::{
    clip, event_result, ChildFinished, EndNote, IllegalTransition, LogEvent, NewRun, Run,
    RunAction, RunError, RunEvent, RunEventRecord, RunState,
};
use crate::skills;
use crate::team::{FailurePolicy, Strategy};

pub use super::round::{judge, round_message, round_message_at};
pub use crate::run::family::{
    ChildEnd, ChildOutcome, ChildSlot, Children, SlotAction, SlotEvent, SlotRefused, SlotState,
};

/// A child's output as its `child_finished` event (and so a tool result
/// or a round-2 message) keeps it.
pub const CHILD_OUTPUT_BYTES: usize = 16 * 1024;

/// Opens a new waiting point on `run` with these children (queued).
pub fn open_round(run: &mut Run, mut slots: Vec<ChildSlot>, max_parallel: u32) {
    let children = run.children.get_or_insert_with(|| Children {
        round: 0,
        outstanding: 0,
        max_parallel,
        slots: vec![],
    });
    children.round += 1;
    children.max_parallel = max_parallel.max(1);
    children.outstanding = slots.len() as u32;
    for s in &mut slots {
        let opened = SlotEvent::Open {
            round: children.round,
        };
        // Planned slots are made queued: opening one is never refused.
        let _ = s.apply(opened, 0);
    }
    children.slots.extend(slots);
}

/// Marks as many queued children of the current round as `max_parallel`
/// leaves room for as started, in order: the caller sends their starts
/// (before it commits, since a start is harmless to repeat) and commits.
pub fn start_queued(run: &mut Run, now: i64) -> (Vec<String>, Vec<RunEventRecord>) {
    let Some(children) = run.children.as_mut() else {
        return (vec![], vec![]);
    };
    let room = (children.max_parallel as usize).saturating_sub(children.running());
    let round = children.round;
    let mut started = Vec::new();
    for s in children.slots.iter_mut() {
        if started.len() >= room {
            break;
        }
        if s.round == round
            && s.state() == SlotState::Queued
            && s.apply(SlotEvent::Start, now).is_ok()
        {
            started.push((s.run_id.clone(), s.agent.clone(), s.kind));
        }
    }
    let events = started
        .iter()
        .map(|(id, agent, kind)| {
            let event = LogEvent::ChildStarted {
                run_id: id.clone(),
                agent: agent.clone(),
                kind: *kind,
            };
            run.push_event(event, now)
        })
        .collect();
    (started.into_iter().map(|(id, ..)| id).collect(), events)
}

/// A team Run that cannot expand as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpandRefused {
    #[error("the run is not a fan-out team's run")]
    NotFanOut,
    /// Its members are more Runs than its tree may have below it.
    #[error("team '{team}' has {members} members: more runs than one root may start below it ({max}, this deployment's limit)")]
    TooManyDescendants {
        team: String,
        members: usize,
        max: u32,
    },
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
}

impl ExpandRefused {
    /// The stable code of the error the team's Run fails with, if it does.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            ExpandRefused::TooManyDescendants { .. } => Some(codes::TOO_MANY_DESCENDANTS),
            ExpandRefused::NotFanOut | ExpandRefused::Illegal(_) => None,
        }
    }
}

/// Round 1 of a fan-out team: one member child each, the team's Run
/// waiting for all of them (an event from outside the harness, fencing
/// it). The members are paid for out of the Run's allowance: `max` is the
/// deployment's bound on the descendants of one root.
pub fn expand_team(
    run: &mut Run,
    max: u32,
    now: i64,
) -> Result<Vec<RunEventRecord>, ExpandRefused> {
    let Some(team) = run.team.clone().filter(|t| t.strategy == Strategy::FanOut) else {
        return Err(ExpandRefused::NotFanOut);
    };
    let mut slots: Vec<ChildSlot> = team
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let id = child_run_id(&run.run_id, "member", i);
            ChildSlot::queued(id, m.clone(), RunKind::Member, None, None)
        })
        .collect();
    // On an error the caller writes nothing of `run`.
    if !descendants::hand_out(run, &mut slots, max) {
        return Err(ExpandRefused::TooManyDescendants {
            team: team.name.clone(),
            members: team.members.len(),
            max,
        });
    }
    run.apply_from_outside(RunEvent::Expanded, now)?;
    open_round(run, slots, team.max_parallel);
    let round = LogEvent::RoundStarted {
        round: 1,
        after_round: None,
        team: Some(team.name.clone()),
        members: team.members.clone(),
    };
    let ev = run.push_event(round, now);
    Ok(vec![ev])
}

/// The child Run of `slot`: the parent's tenant and metadata, its own
/// agent's limits within the parent's deadline (a child never outlives its
/// root), its lineage one deeper; never the parent's sandbox (the agent
/// decides which sandbox, and an agent's sandbox is its own). `agent`:
/// `None` when it was deleted since (the child then fails at its start).
pub fn new_child(parent: &Run, slot: &ChildSlot, agent: Option<&AgentDefinition>, now: i64) -> Run {
    let input = match &slot.task {
        Some(t) => crate::run::Payload::Inline { text: t.clone() },
        None => parent.input.clone(),
    };
    let prewarm_sandbox = prewarms(agent);
    let mut run = Run::new(
        NewRun {
            run_id: slot.run_id.clone(),
            tenant: parent.tenant.clone(),
            agent: slot.agent.clone(),
            input,
            session: None,
            parent_run_id: Some(parent.run_id.clone()),
            callback_url: None,
            metadata: parent.metadata.clone(),
            limits: agent.map(|a| a.limits).unwrap_or_default(),
            prewarm_sandbox,
        },
        now,
    );
    run.budgets.deadline_ms = run.budgets.deadline_ms.min(parent.budgets.deadline_ms);
    run.lineage = Some(Lineage {
        descendants_left: slot.descendants,
        ..parent.lineage().child(&slot.agent, slot.kind)
    });
    run.started_by = parent.started_by.clone();
    run.started_by_address = parent.started_by_address.clone();
    if let Some(plan) = &slot.resume {
        // Who it runs as is its source's: same persona, the same model.
        run.identity = Some(plan.identity.clone());
        run.resumed = Some(ResumedFrom {
            source_run_id: plan.source_run_id.clone(),
            transcript_key: plan.transcript_key.clone(),
        });
    }
    run
}

/// A resident agent's sandbox is warmed as its Run starts.
pub(crate) fn prewarms(agent: Option<&AgentDefinition>) -> bool {
    agent.is_some_and(|a| {
        a.sandbox.resident
            && a.skills
                .iter()
                .any(|s| skills::builtin(s).is_some_and(|m| m.in_sandbox()))
    })
}

/// What a child's end did to its parent.
#[derive(Debug, Clone, PartialEq)]
pub enum Noted {
    /// The parent had already taken note of it.
    Duplicate,
    /// Recorded: the events to commit with the parent, children to start
    /// (already marked started), and what to do once committed (the next
    /// step when the waiting point settled, or the end when the team's
    /// failure policy ended the parent).
    Recorded {
        events: Vec<RunEventRecord>,
        start: Vec<String>,
        actions: Vec<RunAction>,
    },
}

/// A child's end that the parent cannot take now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndRefused {
    #[error("run {0} is not a child of this run")]
    UnknownChild(String),
    /// The parent is not waiting (a step holds it, or it ended).
    #[error("the parent is {0}, not waiting for its children")]
    NotWaiting(RunState),
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
}

/// Whether taking note of this child's end needs the ends before it: it is
/// the last of a call with several children (a `plan`) or of a round of
/// team members. The caller then reads them from the parent's
/// `child_finished` events (one query, only for the last child).
pub fn needs_earlier(run: &Run, child_run_id: &str) -> bool {
    let Some(c) = run.children.as_ref() else {
        return false;
    };
    let Some(slot) = c
        .slot(child_run_id)
        .filter(|s| s.state() != SlotState::Ended)
    else {
        return false;
    };
    let open_siblings = |same: &dyn Fn(&ChildSlot) -> bool| {
        let all: Vec<&ChildSlot> = c.slots.iter().filter(|s| same(s)).collect();
        let open = all.iter().filter(|s| s.state() != SlotState::Ended).count();
        (all.len(), open)
    };
    if let Some(call) = &slot.call_id {
        let (all, open) = open_siblings(&|s| s.call_id.as_ref() == Some(call));
        if all > 1 && open == 1 {
            return true;
        }
    }
    slot.kind == RunKind::Member && c.outstanding == 1
}

/// Takes note of a child's end on its parent (as read): its slot ends, the
/// counter goes down, the call it answers is answered once all of that
/// call's children ended, a queued sibling takes its place, and at 0 the
/// parent goes on (round 2 for a fan-out team, the next step otherwise) or
/// ends by its team's failure policy. `earlier`: the ends already noted on
/// this parent, when [`needs_earlier`] says they are needed.
pub fn child_ended(
    run: &mut Run,
    end: ChildEnd,
    earlier: &[ChildEnd],
    now: i64,
) -> Result<Noted, EndRefused> {
    let slot = run
        .children
        .as_ref()
        .and_then(|c| c.slot(&end.run_id))
        .cloned()
        .ok_or_else(|| EndRefused::UnknownChild(end.run_id.clone()))?;
    if slot.state() == SlotState::Ended {
        return Ok(Noted::Duplicate);
    }
    if run.state() != RunState::AwaitingChildren {
        return Err(EndRefused::NotWaiting(run.state()));
    }
    let mut end = end;
    if let Some(out) = end.output.take() {
        end.output = Some(clip(&out, CHILD_OUTPUT_BYTES).0.to_string());
    }
    if let Some(c) = run.children.as_mut() {
        if let Some(s) = c.slots.iter_mut().find(|s| s.run_id == end.run_id) {
            let outcome = ChildOutcome {
                state: end.state,
                error: end.error.clone(),
            };
            // Not ended before (checked above): never refused.
            let _ = s.apply(SlotEvent::End { outcome }, now);
        }
        c.outstanding = c.outstanding.saturating_sub(1);
    }
    let finished = LogEvent::ChildFinished(ChildFinished {
        run_id: end.run_id.clone(),
        agent: end.agent.clone(),
        kind: slot.kind,
        round: slot.round,
        call_id: slot.call_id.clone(),
        state: end.state,
        output: end.output.clone(),
        error: end.error.clone(),
    });
    let mut events = vec![run.push_event(finished, now)];
    // Every end of this parent known so far, this one included.
    let mut known: Vec<ChildEnd> = earlier
        .iter()
        .filter(|e| e.run_id != end.run_id)
        .cloned()
        .collect();
    known.push(end);
    let mut failed_by_policy = None;
    if let Some(call_id) = &slot.call_id {
        failed_by_policy = answer_call_if_complete(run, call_id, &known, &mut events, now);
    }
    let (start, mut started) = start_queued(run, now);
    events.append(&mut started);
    let settled = run.outstanding_children() == 0;
    if failed_by_policy.is_none() && settled && slot.kind == RunKind::Member {
        let members = round_ends(run, slot.round, &known);
        let policy = run
            .team
            .as_ref()
            .map_or(FailurePolicy::All, |t| t.failure_policy);
        match judge(policy, &members) {
            Err(error) => failed_by_policy = Some(error),
            Ok(()) => {
                let members = members.iter().map(|e| e.run_id.clone()).collect();
                let round = LogEvent::RoundStarted {
                    round: slot.round + 1,
                    after_round: Some(slot.round),
                    team: None,
                    members,
                };
                events.push(run.push_event(round, now))
            }
        }
    }
    let actions = if let Some(error) = failed_by_policy {
        let actions = run.apply_from_outside(RunEvent::Failed { error }, now)?;
        events.extend(run.push_end_event(EndNote::default(), now));
        actions
    } else if settled {
        run.apply_from_outside(RunEvent::ChildrenSettled, now)?
    } else {
        vec![]
    };
    Ok(Noted::Recorded {
        events,
        start,
        actions,
    })
}

/// Answers the parent's tool call once every child it asked for ended:
/// `delegate` with its one child's outcome, `plan` with all of them (and,
/// on a lead team's Run, the team's failure policy over them).
fn answer_call_if_complete(
    run: &mut Run,
    call_id: &str,
    known: &[ChildEnd],
    events: &mut Vec<RunEventRecord>,
    now: i64,
) -> Option<RunError> {
    let slots: Vec<ChildSlot> = run
        .children
        .as_ref()?
        .slots
        .iter()
        .filter(|s| s.call_id.as_deref() == Some(call_id))
        .cloned()
        .collect();
    if slots.iter().any(|s| s.state() != SlotState::Ended) {
        return None;
    }
    let ends: Vec<ChildEnd> = slots.iter().map(|s| end_of(s, known)).collect();
    let rec = run.ledger.get(call_id)?.clone();
    let (ok, result, policy_error) =
        if rec.skill == skills::PLAN || slots.iter().any(|s| s.kind == RunKind::Executor) {
            let tasks: Vec<Value> = slots
            .iter()
            .zip(&ends)
            .map(|(s, e)| {
                let mut v =
                    json!({"agent": s.agent, "task": s.task, "run_id": s.run_id, "state": e.state});
                if e.completed() {
                    v["output"] = json!(e.output);
                } else {
                    v["error"] = json!(e.error);
                }
                v
            })
            .collect();
            let policy = run
                .team
                .as_ref()
                .filter(|t| t.strategy == Strategy::Lead)
                .map(|t| t.failure_policy);
            let verdict = policy.map(|p| judge(p, &ends)).and_then(Result::err);
            (true, json!({"tasks": tasks}), verdict)
        } else {
            let (s, e) = (&slots[0], &ends[0]);
            let result = if e.completed() {
                json!({"run_id": s.run_id, "agent": s.agent, "state": e.state, "output": e.output})
            } else {
                delegation_error(s, e)
            };
            (e.completed(), result, None)
        };
    let event = ToolCallEvent::Answered {
        ok,
        result: result.clone(),
    };
    let state = run.ledger.get_mut(call_id).and_then(|r| {
        r.apply(event, now).ok()?;
        Some(r.state())
    })?;
    let answered = LogEvent::ToolResult {
        call_id: call_id.to_string(),
        name: rec.skill.clone(),
        state,
        result: event_result(&result),
    };
    events.push(run.push_event(answered, now));
    policy_error
}

/// A delegated child that did not complete, as the parent's tool result.
fn delegation_error(slot: &ChildSlot, end: &ChildEnd) -> Value {
    let state = end.state;
    let code = match state {
        RunState::Cancelled => codes::CHILD_CANCELLED,
        RunState::TimedOut => codes::CHILD_TIMED_OUT,
        _ => codes::CHILD_FAILED,
    };
    let cause = end.error.clone();
    let why = cause
        .as_ref()
        .map(|c| format!(": {}: {}", c.code, c.message))
        .unwrap_or_default();
    json!({"error": {
        "code": code,
        "message": format!("agent '{}' (run {}) ended {state}{why}", slot.agent, slot.run_id),
        "run_id": slot.run_id, "agent": slot.agent, "state": state, "cause": cause,
    }})
}

/// The ends of a round's members, in the team's order.
fn round_ends(run: &Run, round: u32, known: &[ChildEnd]) -> Vec<ChildEnd> {
    let Some(c) = run.children.as_ref() else {
        return vec![];
    };
    c.slots
        .iter()
        .filter(|s| s.round == round && s.kind == RunKind::Member)
        .map(|s| end_of(s, known))
        .collect()
}

/// A slot's end: as heard, else as its slot kept it (without the output,
/// which only the events keep).
fn end_of(slot: &ChildSlot, known: &[ChildEnd]) -> ChildEnd {
    known
        .iter()
        .find(|e| e.run_id == slot.run_id)
        .cloned()
        .unwrap_or_else(|| ChildEnd {
            run_id: slot.run_id.clone(),
            agent: slot.agent.clone(),
            state: slot.outcome.as_ref().map_or(RunState::Failed, |o| o.state),
            output: None,
            error: slot.outcome.as_ref().and_then(|o| o.error.clone()),
        })
}

#[cfg(test)]
#[path = "children_tests.rs"]
mod tests;
