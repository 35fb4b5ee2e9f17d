//! The step's human approvals: which planned calls wait for one (judged
//! when the model asks for them, [`gated`]), the wait that creates their
//! approvals ([`await_approvals`]), and the decisions applied to their
//! calls, each once ([`approvals_decided`]). A gated call stays PLANNED —
//! never dispatched, inline or to a sandbox — until it is approved.

use crate::agent::AgentDefinition;
use crate::approval::policy::{gate, CallFacts, Gate};
use crate::approval::{Approval, ApprovalKind, ApprovalRequest, ApprovalState, OnReject, Verdict};
use crate::ledger::CallApproval;
use crate::ledger::ToolCallEvent;
use crate::ledger::ToolCallRecord;
use crate::ledger::ToolCallState;
use crate::machine::Machine;
use crate::run::Run;
use crate::run::RunError;
use crate::run::RunEventRecord;
use crate::run::{ApprovalSettled, LogEvent};
use crate::sandbox::hand::error_json;
use crate::skills;
use crate::step::after_tools;
use crate::step::answered;
use crate::step::apply_to;
use crate::step::end;
use crate::step::push_result;
use crate::step::Decision;
use crate::step::Next;
use crate::step::StepRefused;
use serde_json::Value;

/// The approval a call the model asked for needs, if any.
pub(super) fn gated(
    run: &Run,
    agent: &AgentDefinition,
    manifest: &skills::SkillManifest,
    call_id: &str,
    args: &Value,
) -> Option<CallApproval> {
    let policy = agent.approvals.clone().unwrap_or_default();
    let facts = CallFacts {
        in_sandbox: manifest.in_sandbox(),
        destructive_mount: agent.destructive(),
    };
    match gate(&policy, manifest, args, facts) {
        Gate::Execute => None,
        Gate::Approve { risk, reasons } => Some(CallApproval {
            approval_id: crate::approval::approval_id(&run.run_id, call_id),
            kind: ApprovalKind::Gate,
            risk,
            reasons,
            requested: false,
            state: ApprovalState::Pending,
        }),
    }
}

/// A call the sandbox found destructive when it came to run it (a
/// `file_write` over an existing file): it is planned again, at high risk,
/// to wait for an approval like any gated call.
pub(super) fn gate_after_the_fact(run: &mut Run, call_id: &str, why: String) {
    ask(run, call_id, ApprovalKind::Gate, why);
}

/// A call whose sandbox was lost after it was sent, of an agent that asks
/// a human rather than fail (`approvals.indeterminate: ask`): it stays
/// dispatched while a human says whether it happened.
pub(super) fn ask_indeterminate(run: &mut Run, call_id: &str, why: String) {
    ask(run, call_id, ApprovalKind::Indeterminate, why);
}

fn ask(run: &mut Run, call_id: &str, kind: ApprovalKind, why: String) {
    // An approved call whose sandbox is then lost asks a second question.
    let approval_id = match kind {
        ApprovalKind::Gate => crate::approval::approval_id(&run.run_id, call_id),
        ApprovalKind::Indeterminate => {
            crate::approval::approval_id(&run.run_id, &format!("{call_id}#lost"))
        }
    };
    if let Some(rec) = run.ledger.get_mut(call_id) {
        rec.approval = Some(CallApproval {
            approval_id,
            kind,
            risk: crate::skills::Risk::High,
            reasons: vec![why],
            requested: false,
            state: ApprovalState::Pending,
        });
    }
}

/// Calls of the step still waiting for a human: the Run waits, and the
/// approvals not yet requested are created with the commit that parks it.
pub(super) fn await_approvals(
    run: &mut Run,
    events: &mut Vec<RunEventRecord>,
    now: i64,
) -> Option<Next> {
    let step = run.step;
    let mut waiting = false;
    let mut new = Vec::new();
    for rec in run
        .ledger
        .values_mut()
        .filter(|r| r.step == step && !r.state().is_settled() && r.awaits_approval())
    {
        waiting = true;
        let Some(a) = rec.approval.as_mut().filter(|a| !a.requested) else {
            continue;
        };
        a.requested = true;
        new.push(ApprovalRequest {
            kind: a.kind,
            call_id: rec.call_id.clone(),
            tool: rec.skill.clone(),
            args: rec.args.clone(),
            risk: a.risk,
            reasons: a.reasons.clone(),
        });
    }
    if !waiting {
        return None;
    }
    for r in &new {
        let approval_id = run
            .ledger
            .get(&r.call_id)
            .and_then(|c| c.approval.as_ref())
            .map(|a| a.approval_id.clone())
            .unwrap_or_default();
        let requested = LogEvent::ApprovalRequested {
            approval_id,
            kind: r.kind,
            call_id: r.call_id.clone(),
            name: r.tool.clone(),
            args: r.args.clone(),
            risk: r.risk,
            reasons: r.reasons.clone(),
        };
        events.push(run.push_event(requested, now));
    }
    Some(Next::AwaitApproval(new))
}

/// Applies decided approvals to their calls: an approved call may now be
/// dispatched; a rejected or expired one is answered with the refusal (or
/// the Run fails, per the agent's policy). An approval already applied, or
/// still pending, changes nothing.
pub(super) fn approvals_decided(
    run: &mut Run,
    decided: &[Approval],
    now: i64,
) -> Result<Decision, StepRefused> {
    let mut events = Vec::new();
    let mut fail = None;
    for a in decided {
        if a.state() == ApprovalState::Pending || a.run_id != run.run_id {
            continue;
        }
        let Some(rec) = run.ledger.get(&a.call_id) else {
            return Err(StepRefused::UnknownCall(a.call_id.clone()));
        };
        let open = rec
            .approval
            .as_ref()
            .is_some_and(|c| c.approval_id == a.approval_id && c.state == ApprovalState::Pending);
        if !open || rec.state().is_settled() {
            continue;
        }
        let rec = rec.clone();
        if let Some(c) = run
            .ledger
            .get_mut(&a.call_id)
            .and_then(|r| r.approval.as_mut())
        {
            c.state = a.state();
        }
        let d = a.decision.clone();
        let settled = ApprovalSettled {
            approval_id: a.approval_id.clone(),
            call_id: a.call_id.clone(),
            name: a.tool.clone(),
            state: a.state(),
            by: d.as_ref().map(|d| d.by.clone()),
            how: d.as_ref().map(|d| d.how.clone()),
            from: d.as_ref().and_then(|d| d.from.clone()),
            at_ms: d.as_ref().map(|d| d.at_ms),
            comment: d.and_then(|d| d.comment),
        };
        let event = if a.state() == ApprovalState::Expired {
            LogEvent::ApprovalExpired(settled)
        } else {
            LogEvent::ApprovalDecided(settled)
        };
        events.push(run.push_event(event, now));
        if a.kind == ApprovalKind::Indeterminate {
            match (&a.verdict, a.refusal()) {
                (_, Some((code, message))) => {
                    apply_to(run, &a.call_id, ToolCallEvent::Lost, now)?;
                    fail = fail.or(Some(RunError::new(code, message)));
                }
                (Some(Verdict::Happened { result }), None) => {
                    answered(run, &a.call_id, true, result.clone(), &mut events, now)?;
                }
                (Some(Verdict::Retry), None) => {
                    super::retried(
                        run,
                        &rec,
                        "a human asked to send it again",
                        &mut events,
                        now,
                    )?;
                }
                (_, None) => {}
            }
            continue;
        }
        if let Some((code, message)) = a.refusal() {
            let result = error_json(code, message.clone());
            apply_to(
                run,
                &a.call_id,
                ToolCallEvent::Refused {
                    result: result.clone(),
                },
                now,
            )?;
            push_result(run, &rec, result, &mut events, now);
            if a.on_reject == OnReject::Fail && fail.is_none() {
                fail = Some(RunError::new(code, message));
            }
        }
    }
    if let Some(error) = fail {
        return Ok(end(events, error));
    }
    Ok(after_tools(run, events, now))
}

/// Approved inline calls of the step, now dispatched (they run in it).
pub(super) fn approved_inline(run: &mut Run, now: i64) -> Vec<ToolCallRecord> {
    let step = run.step;
    let mut out = Vec::new();
    for r in run.ledger.values_mut().filter(|r| {
        r.step == step
            && r.state() == ToolCallState::Planned
            && !r.sandbox
            && !r.children
            && r.approval.is_some()
            && r.cleared()
    }) {
        if r.apply(ToolCallEvent::Dispatched { generation: None }, now)
            .is_ok()
        {
            out.push(r.clone());
        }
    }
    out
}
