//! One harness step, decided. The harness claims a step, then asks
//! [`decide`] what to do with what it has (the claim, the model's reply,
//! the inline calls' answers, a sandbox's answer); the answer names the
//! next thing to do ([`Next`]) and the events to record, and has already
//! moved the Run's ledger and usage. The harness carries it out and comes
//! back with the result, and ends the step with one fenced commit.
//!
//! Everything here is pure: budgets, the deadline, which tools run where
//! (inline or in the sandbox), what the ledger says about a redelivered
//! call, when a human must approve. No IO, no clock.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::agent::{AgentDefinition, Provisioning};
use crate::approval::{Approval, ApprovalRequest};
use crate::chat::{ModelReply, ToolCall};
use crate::collab::resume::ResumePlan;
use crate::collab::CallError;
use crate::collab::ChildLimits;
use crate::fields;
use crate::ledger::ToolCallState;
use crate::ledger::{self, IllegalToolTransition, Recovery, ToolCallEvent, ToolCallRecord};
use crate::machine::Machine;
use crate::run::{clip, event_result, LogEvent, Run, RunError, RunEvent, RunEventRecord};
use crate::sandbox::hand::CallOutcome;
use crate::sandbox::lifecycle::sandbox_key;
use crate::skills;

/// Event payloads are previews: the full text is on the Run (or in S3).
pub const EVENT_PREVIEW_BYTES: usize = 8 * 1024;
/// What a call's arguments are recorded as when they nest too deeply.
pub const TOO_DEEP_ARGS: &str = "[arguments nested too deeply]";
/// A call whose arguments nest deeper than [`fields::MAX_JSON_DEPTH`].
pub const INVALID_ARGUMENTS: &str = "INVALID_ARGUMENTS";
/// A tool result nested deeper than [`fields::MAX_JSON_DEPTH`].
pub const RESULT_TOO_DEEP: &str = "RESULT_TOO_DEEP";

/// Attempts of a call whose sandbox died before it started.
pub const MAX_SANDBOX_ATTEMPTS: u32 = 3;

/// What the harness brings to [`decide`].
#[derive(Debug, Clone)]
pub enum StepInput<'a> {
    /// The step was just claimed (first delivery or a redelivery).
    Claimed,
    /// The model answered the step's request.
    Replied(&'a ModelReply),
    /// The inline calls the last decision asked for ran.
    InlineRan(Vec<InlineAnswer>),
    /// A sandbox answered (or the watchdog answered for it) a dispatched call.
    SandboxAnswered {
        call_id: &'a str,
        outcome: CallOutcome,
    },
    /// The agents the planned `delegate`/`plan` calls name were looked up:
    /// `known` are the registered ones.
    Delegations {
        known: &'a BTreeSet<String>,
        limits: ChildLimits,
        /// Verdicts on the calls that resume a finished Run, by call id.
        resumes: &'a BTreeMap<String, Result<ResumePlan, CallError>>,
    },
    /// Approvals of the step's calls were decided (approved, rejected,
    /// expired): each is applied to its call once.
    ApprovalsDecided(&'a [Approval]),
}

/// An inline call's answer: `ok` is false when it failed (`result` is then
/// its error object).
#[derive(Debug, Clone, PartialEq)]
pub struct InlineAnswer {
    pub call_id: String,
    pub ok: bool,
    pub result: Value,
    /// What the tool said of its progress as it ran, oldest first.
    pub progress: Vec<ProgressNote>,
}

/// A tool's word on how far it got (an MCP progress notification).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressNote {
    pub progress: f64,
    pub total: Option<f64>,
    pub message: Option<String>,
}

/// How many progress notes one call records (the last are kept: a
/// chatty tool costs its Run a bounded log).
pub const MAX_PROGRESS_NOTES: usize = 20;

/// What the harness does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// The Run ends: commit with this event.
    End(RunEvent),
    /// Ask the model; with `hold_sandbox_first`, the agent's sandbox is
    /// held (or waited for) before the call.
    CallModel { hold_sandbox_first: bool },
    /// The model gave its final answer: it becomes the Run's output.
    Answer,
    /// Run these inline calls (already recorded as dispatched).
    RunInline(Vec<ToolCallRecord>),
    /// Calls of the step wait for a human: park the Run in AWAITING_HITL,
    /// creating these approvals with the commit.
    AwaitApproval(Vec<ApprovalRequest>),
    /// Hold the agent's sandbox and dispatch these planned calls, then wait.
    Dispatch(Vec<ToolCallRecord>),
    /// Sandbox calls are out and nothing is to be sent: wait for answers.
    Wait,
    /// These planned calls are answered by child Runs: look up the agents
    /// they name and come back with [`StepInput::Delegations`].
    Delegate(Vec<ToolCallRecord>),
    /// Children are planned (or still running): wait for them, holding
    /// nothing but the record, and have the dispatcher start them.
    AwaitChildren,
    /// Every call of the step is settled: the next step.
    Continue,
}

/// A decision: what to record, and what to do next.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub events: Vec<RunEventRecord>,
    pub next: Next,
    /// The Run must be committed before `next` is carried out (calls are
    /// recorded before any of them runs, a sandbox is named before it is
    /// asked for), so that a worker that dies leaves them in the ledger.
    pub checkpoint: bool,
}

impl Decision {
    fn new(events: Vec<RunEventRecord>, next: Next) -> Decision {
        Decision {
            events,
            next,
            checkpoint: false,
        }
    }
}

/// A decision the ledger refuses: the input does not fit the calls it
/// names. Retrying cannot help; the harness logs it with the Run, counts it
/// and drops the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepRefused {
    #[error("tool call {call_id}: {source}")]
    Tool {
        call_id: String,
        source: IllegalToolTransition,
    },
    #[error("tool call {0} is not in the run's ledger")]
    UnknownCall(String),
}

/// Decides the next move of a claimed step. Moves the Run's ledger, usage
/// and sandbox claim as it decides; the Run's state is moved by the caller
/// applying `Next::End`'s event (or the wait it chooses).
pub fn decide(
    run: &mut Run,
    agent: &AgentDefinition,
    input: StepInput<'_>,
    now_ms: i64,
) -> Result<Decision, StepRefused> {
    match input {
        StepInput::Claimed => claimed(run, agent, now_ms),
        StepInput::Replied(reply) => replied(run, agent, reply, now_ms),
        StepInput::InlineRan(answers) => {
            let mut events = Vec::new();
            for a in answers {
                let skip = a.progress.len().saturating_sub(MAX_PROGRESS_NOTES);
                for note in a.progress.into_iter().skip(skip) {
                    let noted = LogEvent::ToolProgress {
                        call_id: a.call_id.clone(),
                        progress: note.progress,
                        total: note.total,
                        message: note.message,
                    };
                    events.push(run.push_event(noted, now_ms));
                }
                answered(run, &a.call_id, a.ok, a.result, &mut events, now_ms)?;
            }
            Ok(after_tools(run, events, now_ms))
        }
        StepInput::SandboxAnswered { call_id, outcome } => {
            sandbox_answered(run, agent, call_id, outcome, now_ms)
        }
        StepInput::Delegations {
            known,
            limits,
            resumes,
        } => children::delegations(run, agent, known, limits, resumes, now_ms),
        StepInput::ApprovalsDecided(decided) => approvals::approvals_decided(run, decided, now_ms),
    }
}

fn end(events: Vec<RunEventRecord>, error: RunError) -> Decision {
    Decision::new(events, Next::End(RunEvent::Failed { error }))
}

fn claimed(run: &mut Run, agent: &AgentDefinition, now: i64) -> Result<Decision, StepRefused> {
    if run.past_deadline(now) {
        let error = RunError::new("TIMED_OUT", "the run exceeded its wall-clock budget");
        return Ok(Decision::new(
            vec![],
            Next::End(RunEvent::DeadlineExceeded { error }),
        ));
    }
    let open: Vec<ToolCallRecord> = open_calls(run).cloned().collect();
    if open.is_empty() {
        if run.usage.model_turns >= run.budgets.max_model_turns {
            let error = RunError::new(
                "BUDGET_EXCEEDED",
                format!(
                    "the run used its {} model turns",
                    run.budgets.max_model_turns
                ),
            );
            return Ok(end(vec![], error));
        }
        // `eager`: the sandbox is there before the first model call.
        let eager = agent.sandbox.provisioning == Provisioning::Eager && agent.uses_sandbox();
        let named = eager && run.sandbox_key.is_none();
        if named {
            run.sandbox_key = Some(sandbox_key(&run.tenant, &run.agent));
        }
        let mut d = Decision::new(
            vec![],
            Next::CallModel {
                hold_sandbox_first: eager,
            },
        );
        d.checkpoint = named;
        return Ok(d);
    }
    // A redelivered step: an inline call left DISPATCHED means a previous
    // worker died before committing its answer.
    let mut events = Vec::new();
    let mut lost = Vec::new();
    let mut redo = Vec::new();
    // A gated call still planned was never sent: its approval decides it.
    let gated_planned =
        |r: &ToolCallRecord| r.approval.is_some() && r.state() == ToolCallState::Planned;
    for rec in open
        .iter()
        .filter(|r| !r.sandbox && !r.children && !gated_planned(r))
    {
        match ledger::recover(rec) {
            Some(Recovery::Indeterminate) => lost.push(rec.call_id.clone()),
            Some(Recovery::Redo) => redo.push(rec.clone()),
            None => {}
        }
    }
    if !lost.is_empty() {
        for call_id in &lost {
            let skill = call(run, call_id)?.skill.clone();
            apply_to(run, call_id, ToolCallEvent::Lost, now)?;
            let lost = LogEvent::ToolIndeterminate {
                call_id: call_id.clone(),
                name: skill.clone(),
                reason: None,
                asking: false,
            };
            events.push(run.push_event(lost, now));
        }
        let error = RunError::new(
            "TOOL_INDETERMINATE",
            format!(
                "tool calls {} were dispatched but their results were lost; they are not idempotent, so they were not repeated",
                lost.join(", ")
            ),
        );
        return Ok(end(events, error));
    }
    if !redo.is_empty() {
        return Ok(Decision::new(events, Next::RunInline(redo)));
    }
    Ok(after_tools(run, events, now))
}

fn replied(
    run: &mut Run,
    agent: &AgentDefinition,
    reply: &ModelReply,
    now: i64,
) -> Result<Decision, StepRefused> {
    run.usage.model_turns += 1;
    run.usage.input_tokens += reply.usage.input_tokens;
    run.usage.output_tokens += reply.usage.output_tokens;
    let (preview, truncated) = clip(&reply.content, EVENT_PREVIEW_BYTES);
    // Arguments nested too deeply never enter the record (it would not
    // parse again): the call is refused with a result the model can read.
    let too_deep: BTreeMap<&str, String> = reply
        .tool_calls
        .iter()
        .filter_map(|c| fields::too_deep(&c.args).map(|why| (c.id.as_str(), why)))
        .collect();
    let args_of = |c: &ToolCall| match too_deep.get(c.id.as_str()) {
        Some(_) => json!(TOO_DEEP_ARGS),
        None => c.args.clone(),
    };
    let tool_calls = reply
        .tool_calls
        .iter()
        .map(|c| ToolCall {
            args: args_of(c),
            ..c.clone()
        })
        .collect();
    let replied = LogEvent::ModelReply {
        content: preview.to_string(),
        truncated,
        tool_calls,
    };
    let mut events = vec![run.push_event(replied, now)];
    if reply.tool_calls.is_empty() {
        return Ok(Decision::new(events, Next::Answer));
    }
    let total = run.usage.tool_calls as usize + reply.tool_calls.len();
    if total > run.budgets.max_tool_calls as usize {
        let error = RunError::new(
            "BUDGET_EXCEEDED",
            format!(
                "the run would exceed its {} tool calls",
                run.budgets.max_tool_calls
            ),
        );
        return Ok(end(events, error));
    }
    // Every call is recorded before any runs: inline calls as dispatched
    // (they run in this step), sandbox calls as planned (dispatched once
    // the sandbox is held).
    let mut inline = Vec::new();
    for c in &reply.tool_calls {
        if let Some(why) = too_deep.get(c.id.as_str()) {
            let mut rec = ToolCallRecord::planned(
                &c.id,
                &c.name,
                json!(TOO_DEEP_ARGS),
                run.step,
                false,
                false,
            );
            let result = json!({"error": {"code": INVALID_ARGUMENTS, "message": format!("the arguments are {why}")}});
            rec.apply(
                ToolCallEvent::Refused {
                    result: result.clone(),
                },
                now,
            )
            .map_err(|source| StepRefused::Tool {
                call_id: c.id.clone(),
                source,
            })?;
            run.ledger.insert(c.id.clone(), rec.clone());
            let asked = LogEvent::ToolCall {
                call_id: c.id.clone(),
                name: c.name.clone(),
                args: json!(TOO_DEEP_ARGS),
            };
            events.push(run.push_event(asked, now));
            push_result(run, &rec, result, &mut events, now);
            continue;
        }
        let manifest = manifest_for(run, agent, &c.name);
        let in_sandbox = manifest.as_ref().is_some_and(|m| m.in_sandbox());
        let by_children = manifest
            .as_ref()
            .is_some_and(|m| skills::answered_by_children(m.executor()));
        let idempotent = manifest
            .as_ref()
            .is_some_and(|m| skills::call_is_idempotent(m, &c.args));
        let mut rec = ToolCallRecord::planned(
            &c.id,
            &c.name,
            c.args.clone(),
            run.step,
            idempotent,
            in_sandbox,
        );
        // A gated call stays planned until a human approves it.
        rec.approval = manifest
            .as_ref()
            .and_then(|m| approvals::gated(run, agent, m, &c.id, &c.args));
        if by_children {
            // Planned here; its children are planned once the agents it
            // names are looked up.
            rec.children = true;
        } else if in_sandbox {
            run.sandbox_key = Some(sandbox_key(&run.tenant, &run.agent));
        } else if rec.approval.is_none() {
            rec.apply(ToolCallEvent::Dispatched { generation: None }, now)
                .map_err(|source| StepRefused::Tool {
                    call_id: c.id.clone(),
                    source,
                })?;
            inline.push(rec.clone());
        }
        run.ledger.insert(c.id.clone(), rec);
        let asked = LogEvent::ToolCall {
            call_id: c.id.clone(),
            name: c.name.clone(),
            args: c.args.clone(),
        };
        events.push(run.push_event(asked, now));
    }
    run.usage.tool_calls += reply.tool_calls.len() as u32;
    let mut d = if inline.is_empty() {
        after_tools(run, events, now)
    } else {
        Decision::new(events, Next::RunInline(inline))
    };
    // A wait for approvals is itself the commit: its approvals are
    // created with it, never after a record that says they were asked for.
    d.checkpoint = !matches!(d.next, Next::AwaitApproval(_));
    Ok(d)
}

/// After the step's inline calls (and any sandbox answer): approval for
/// planned sandbox calls, or their dispatch, or the wait; then the calls
/// answered by children; then the next step.
fn after_tools(run: &mut Run, mut events: Vec<RunEventRecord>, now: i64) -> Decision {
    // Nothing more of the step goes out while a human has to decide.
    if let Some(next) = approvals::await_approvals(run, &mut events, now) {
        return Decision::new(events, next);
    }
    let inline = approvals::approved_inline(run, now);
    if !inline.is_empty() {
        // Recorded as dispatched before any of them runs.
        let mut d = Decision::new(events, Next::RunInline(inline));
        d.checkpoint = true;
        return d;
    }
    let planned: Vec<ToolCallRecord> = open_calls(run)
        .filter(|r| r.sandbox && r.state() == ToolCallState::Planned)
        .cloned()
        .collect();
    if planned.is_empty() {
        if open_calls(run).any(|r| r.sandbox) {
            // Sandbox calls dispatched earlier are still out.
            return Decision::new(events, Next::Wait);
        }
        let by_children: Vec<ToolCallRecord> = open_calls(run)
            .filter(|r| r.children && r.state() == ToolCallState::Planned)
            .cloned()
            .collect();
        if !by_children.is_empty() {
            return Decision::new(events, Next::Delegate(by_children));
        }
        if open_calls(run).any(|r| r.children) {
            // A redelivered step of a Run whose children are out.
            return Decision::new(events, Next::AwaitChildren);
        }
        return Decision::new(events, Next::Continue);
    }
    Decision::new(events, Next::Dispatch(planned))
}

/// The manifest of a tool the Run may call: its agent's, and `plan` for
/// a lead team's Run (the team makes its lead a planner).
pub fn manifest_for(
    run: &Run,
    agent: &AgentDefinition,
    name: &str,
) -> Option<skills::SkillManifest> {
    agent.manifest(name).or_else(|| {
        let lead = run
            .team
            .as_ref()
            .is_some_and(|t| t.strategy == crate::team::Strategy::Lead);
        (lead && name == skills::PLAN)
            .then(|| skills::builtin(skills::PLAN))
            .flatten()
    })
}

fn open_calls(run: &Run) -> impl Iterator<Item = &ToolCallRecord> {
    let step = run.step;
    run.ledger
        .values()
        .filter(move |r| r.step == step && !r.state().is_settled())
}

fn call<'r>(run: &'r Run, call_id: &str) -> Result<&'r ToolCallRecord, StepRefused> {
    run.ledger
        .get(call_id)
        .ok_or_else(|| StepRefused::UnknownCall(call_id.to_string()))
}

/// Applies `event` to the ledger's record of `call_id`.
fn apply_to<'r>(
    run: &'r mut Run,
    call_id: &str,
    event: ToolCallEvent,
    now: i64,
) -> Result<&'r mut ToolCallRecord, StepRefused> {
    let rec = run
        .ledger
        .get_mut(call_id)
        .ok_or_else(|| StepRefused::UnknownCall(call_id.to_string()))?;
    rec.apply(event, now).map_err(|source| StepRefused::Tool {
        call_id: call_id.to_string(),
        source,
    })?;
    Ok(rec)
}

fn answered(
    run: &mut Run,
    call_id: &str,
    ok: bool,
    result: Value,
    events: &mut Vec<RunEventRecord>,
    now: i64,
) -> Result<(), StepRefused> {
    // A result nested too deeply never enters the record: the call failed.
    let (ok, result) = match fields::too_deep(&result) {
        Some(why) => (
            false,
            json!({"error": {"code": RESULT_TOO_DEEP, "message": format!("the tool's result is {why}")}}),
        ),
        None => (ok, result),
    };
    let rec = apply_to(
        run,
        call_id,
        ToolCallEvent::Answered {
            ok,
            result: result.clone(),
        },
        now,
    )?
    .clone();
    push_result(run, &rec, result, events, now);
    Ok(())
}

fn push_result(
    run: &mut Run,
    rec: &ToolCallRecord,
    result: Value,
    events: &mut Vec<RunEventRecord>,
    now: i64,
) {
    let state = run
        .ledger
        .get(&rec.call_id)
        .map_or(rec.state(), |r| r.state());
    let answered = LogEvent::ToolResult {
        call_id: rec.call_id.clone(),
        name: rec.skill.clone(),
        state,
        result: event_result(&result),
    };
    events.push(run.push_event(answered, now));
}

/// A sandbox call that may be sent again: its next attempt is planned.
pub(super) fn retried(
    run: &mut Run,
    rec: &ToolCallRecord,
    reason: &str,
    events: &mut Vec<RunEventRecord>,
    now: i64,
) -> Result<(), StepRefused> {
    apply_to(run, &rec.call_id, ToolCallEvent::Retried, now)?;
    let retried = LogEvent::ToolRetried {
        call_id: rec.call_id.clone(),
        name: rec.skill.clone(),
        reason: reason.to_string(),
        attempt: rec.attempt + 1,
    };
    events.push(run.push_event(retried, now));
    Ok(())
}

mod approvals;
mod children;
mod sandbox;

use sandbox::sandbox_answered;
pub use sandbox::{invocation, record_dispatch};

#[cfg(test)]
mod approval_tests;
#[cfg(test)]
mod tests;
