//! The step's sandbox calls: what a sandbox's answer (or the watchdog's,
//! for a sandbox that died) means for the call and the Run, a dispatch
//! recorded, and the message a dispatched call travels as.

use crate::agent::AgentDefinition;
use crate::approval::policy::OnIndeterminate;
use crate::approval::ApprovalKind;
use crate::ledger;
use crate::ledger::Recovery;
use crate::ledger::ToolCallEvent;
use crate::ledger::ToolCallRecord;
use crate::run::LogEvent;
use crate::run::Run;
use crate::run::RunError;
use crate::run::RunEventRecord;
use crate::sandbox::hand::codes;
use crate::sandbox::hand::error_json;
use crate::sandbox::hand::CallOutcome;
use crate::sandbox::hand::Invocation;
use crate::sandbox::hand::SANDBOX_LOST;
use crate::sandbox::hand::SECURITY_VIOLATION;
use crate::step::after_tools;
use crate::step::answered;
use crate::step::apply_to;
use crate::step::call;
use crate::step::end;
use crate::step::push_result;
use crate::step::retried;
use crate::step::Decision;
use crate::step::StepRefused;
use crate::step::MAX_SANDBOX_ATTEMPTS;

/// Longest account of a call's changes an approval carries from its sandbox.
const MAX_REPORTED_CHARS: usize = 2_000;

/// Why a call the sandbox answered `APPROVAL_REQUIRED` needs approval: what
/// the sandbox found it would change (paths and sizes: the sandbox judged
/// the call by its effect), said to be the sandbox's account. The paths
/// are the tenant's code's own choice: control characters are dropped here
/// and every notice writes reasons on one line.
fn approval_reason(message: &str) -> String {
    let mut said: String = message
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_REPORTED_CHARS)
        .collect();
    if message.chars().count() > MAX_REPORTED_CHARS {
        said.push('…');
    }
    format!("the sandbox found the call destructive: {said}")
}

pub(super) fn sandbox_answered(
    run: &mut Run,
    agent: &AgentDefinition,
    call_id: &str,
    outcome: CallOutcome,
    now: i64,
) -> Result<Decision, StepRefused> {
    let rec = call(run, call_id)?.clone();
    let mut events = Vec::new();
    match outcome {
        CallOutcome::Finished { result } => {
            let ok = result.get("error").is_none();
            answered(run, call_id, ok, result, &mut events, now)?;
        }
        CallOutcome::NotRun { code, message } => {
            if code == codes::APPROVAL_REQUIRED && rec.approval.is_none() {
                // Destructive after all (the sandbox saw what it would
                // delete or change): the workspace is as it was, and the
                // call waits for a human, who reads what would change.
                retried(run, &rec, &message, &mut events, now)?;
                super::approvals::gate_after_the_fact(run, &rec.call_id, approval_reason(&message));
                return Ok(after_tools(run, events, now));
            }
            if code == SANDBOX_LOST && rec.attempt < MAX_SANDBOX_ATTEMPTS {
                // It never ran: safe to send again, to a new sandbox.
                retried(run, &rec, &message, &mut events, now)?;
                return Ok(after_tools(run, events, now));
            }
            let ends = match code.as_str() {
                SANDBOX_LOST | codes::SANDBOX_UNAVAILABLE => Some(RunError::new(
                    codes::SANDBOX_UNAVAILABLE,
                    format!("tool call {call_id} could not run: {message}"),
                )),
                SECURITY_VIOLATION => {
                    let violation = LogEvent::SecurityViolation {
                        call_id: call_id.to_string(),
                        message: message.clone(),
                    };
                    events.push(run.push_event(violation, now));
                    Some(RunError::new(SECURITY_VIOLATION, message.clone()))
                }
                _ => None,
            };
            let result = error_json(&code, message);
            apply_to(
                run,
                call_id,
                ToolCallEvent::Refused {
                    result: result.clone(),
                },
                now,
            )?;
            push_result(run, &rec, result, &mut events, now);
            if let Some(error) = ends {
                return Ok(end(events, error));
            }
        }
        CallOutcome::Lost { reason } => {
            if ledger::recover(&rec) == Some(Recovery::Redo) {
                retried(run, &rec, &reason, &mut events, now)?;
                return Ok(after_tools(run, events, now));
            }
            let ask = agent
                .approvals
                .as_ref()
                .is_some_and(|p| p.indeterminate == OnIndeterminate::Ask);
            if ask
                && rec
                    .approval
                    .as_ref()
                    .is_none_or(|a| a.kind == ApprovalKind::Gate)
            {
                // A human settles it: it happened, send it again, or fail.
                let lost = LogEvent::ToolIndeterminate {
                    call_id: call_id.to_string(),
                    name: rec.skill.clone(),
                    reason: Some(reason.to_string()),
                    asking: true,
                };
                events.push(run.push_event(lost, now));
                let why = format!(
                    "its sandbox was lost after it was sent ({reason}): did it take effect?"
                );
                super::approvals::ask_indeterminate(run, call_id, why);
                return Ok(after_tools(run, events, now));
            }
            apply_to(run, call_id, ToolCallEvent::Lost, now)?;
            let lost = LogEvent::ToolIndeterminate {
                call_id: call_id.to_string(),
                name: rec.skill.clone(),
                reason: Some(reason.to_string()),
                asking: false,
            };
            events.push(run.push_event(lost, now));
            let error = RunError::new(
                "TOOL_INDETERMINATE",
                format!(
                    "tool call {call_id} was dispatched but its sandbox was lost ({reason}); it is not idempotent, so it was not repeated"
                ),
            );
            return Ok(end(events, error));
        }
    }
    Ok(after_tools(run, events, now))
}

/// Records that a planned sandbox call was sent to `generation` of the
/// sandbox `sandbox`; returns its `tool_dispatched` event.
pub fn record_dispatch(
    run: &mut Run,
    call_id: &str,
    generation: u64,
    sandbox: &str,
    now: i64,
) -> Result<RunEventRecord, StepRefused> {
    let rec = apply_to(
        run,
        call_id,
        ToolCallEvent::Dispatched {
            generation: Some(generation),
        },
        now,
    )?;
    let (skill, attempt) = (rec.skill.clone(), rec.attempt);
    let dispatched = LogEvent::ToolDispatched {
        call_id: call_id.to_string(),
        name: skill,
        attempt,
        sandbox: sandbox.to_string(),
        generation,
    };
    Ok(run.push_event(dispatched, now))
}

/// The message a dispatched sandbox call travels as.
pub fn invocation(
    run: &Run,
    agent: &AgentDefinition,
    rec: &ToolCallRecord,
    generation: u64,
) -> Invocation {
    let manifest = agent.manifest(&rec.skill);
    let limit = agent.sandbox.limits.call_timeout_s;
    let approved = rec
        .approval
        .as_ref()
        .is_some_and(|a| a.state == crate::approval::ApprovalState::Approved);
    let by_effect = agent
        .approvals
        .as_ref()
        .is_some_and(|p| p.destructive == crate::approval::policy::Destructive::Effect);
    Invocation {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
        agent: run.agent.clone(),
        generation,
        step: run.step,
        call_id: rec.call_id.clone(),
        attempt: rec.attempt,
        skill: manifest
            .as_ref()
            .map_or_else(|| rec.skill.clone(), |m| m.executor().to_string()),
        args: rec.args.clone(),
        timeout_s: manifest.as_ref().map_or(limit, |m| m.timeout_s).min(limit),
        approved,
        judge_effects: by_effect && !approved,
        // Its environment is the harness's to open and seal.
        program: manifest.and_then(|m| m.program).map(|p| {
            Box::new(crate::program::ProgramCall {
                command: p.command,
                protocol: p.protocol,
                env: None,
                refused: None,
                // A served tool's program is its skill's (`<skill>__<tool>`
                // is only what the model calls it).
                skill: p
                    .serves
                    .as_ref()
                    .map_or_else(|| rec.skill.clone(), |s| s.skill.clone()),
                files: p.files.map(|f| crate::program::StagedFiles {
                    key: crate::skill_files::staged_key(&run.tenant, &run.agent, &f.sha256),
                    sha256: f.sha256,
                }),
                install: p.install,
                tool: p.serves.map(|s| s.tool),
            })
        }),
    }
}
