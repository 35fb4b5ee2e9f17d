//! The step's calls answered by child Runs (`delegate`, `plan`): checked
//! against the registry's agents, the Run's path, the depth limit, the
//! children one waiting point may have and the Runs the Run may still
//! start below it. A refused call is answered with its error at once (the
//! Run carries on); the others become the children of a new waiting point,
//! paid for out of the Run's allowance, which the dispatcher creates and
//! starts once the step has committed it.

use crate::agent::AgentDefinition;
use crate::collab::children::open_round;
use crate::collab::resume::ResumePlan;
use crate::collab::CallError;
use crate::collab::ChildLimits;
use crate::collab::{codes, delegate, descendants, ChildSlot, DEFAULT_MAX_PARALLEL};
use crate::ledger::ToolCallEvent;
use crate::ledger::ToolCallRecord;
use crate::ledger::ToolCallState;
use crate::run::Run;
use crate::skills;
use crate::step::after_tools;
use crate::step::apply_to;
use crate::step::manifest_for;
use crate::step::open_calls;
use crate::step::push_result;
use crate::step::Decision;
use crate::step::Next;
use crate::step::StepRefused;
use std::collections::BTreeMap;
use std::collections::BTreeSet;

pub(super) fn delegations(
    run: &mut Run,
    agent: &AgentDefinition,
    known: &BTreeSet<String>,
    limits: ChildLimits,
    resumes: &BTreeMap<String, Result<ResumePlan, CallError>>,
    now: i64,
) -> Result<Decision, StepRefused> {
    let planned: Vec<ToolCallRecord> = open_calls(run)
        .filter(|r| r.children && r.state() == ToolCallState::Planned)
        .cloned()
        .collect();
    let mut events = Vec::new();
    let mut slots = Vec::new();
    for rec in &planned {
        let executor = manifest_for(run, agent, &rec.skill)
            .map(|m| m.executor().to_string())
            .unwrap_or_default();
        let max_depth = limits.max_depth;
        let asked = if executor == skills::PLAN {
            delegate::plan_slots(run, &rec.call_id, &rec.args, known, max_depth)
        } else {
            delegate::delegate_slots(run, &rec.call_id, &rec.args, known, max_depth, resumes)
        }
        .and_then(|s| within_wait(s, slots.len(), limits.max_children_per_wait))
        .and_then(|s| descendants::within(run, s, slots.len(), limits.max_descendants));
        match asked {
            Ok(mut s) => {
                apply_to(
                    run,
                    &rec.call_id,
                    ToolCallEvent::Dispatched { generation: None },
                    now,
                )?;
                slots.append(&mut s);
            }
            Err(e) => {
                let result = e.to_json();
                apply_to(
                    run,
                    &rec.call_id,
                    ToolCallEvent::Refused {
                        result: result.clone(),
                    },
                    now,
                )?;
                push_result(run, rec, result, &mut events, now);
            }
        }
    }
    if slots.is_empty() {
        return Ok(after_tools(run, events, now));
    }
    let max_parallel = run
        .team
        .as_ref()
        .map_or(DEFAULT_MAX_PARALLEL, |t| t.max_parallel);
    // Each call was let through only if it fit with the ones before it.
    let paid = descendants::hand_out(run, &mut slots, limits.max_descendants);
    debug_assert!(
        paid,
        "the calls' children were checked against the allowance"
    );
    open_round(run, slots, max_parallel);
    Ok(Decision::new(events, Next::AwaitChildren))
}

/// The call's children, unless with those the step's earlier calls asked
/// for they pass the waiting point's limit: then the call is refused whole
/// (a call's children are all or none), and the calls before it keep theirs.
fn within_wait(
    slots: Vec<ChildSlot>,
    earlier: usize,
    max: u32,
) -> Result<Vec<ChildSlot>, CallError> {
    let max = max as usize;
    if earlier + slots.len() <= max {
        return Ok(slots);
    }
    Err(CallError::new(
        codes::TOO_MANY_CHILDREN,
        format!(
            "this call asks for {} child runs and this step's earlier calls for {earlier}: one step may start at most {max} (this deployment's limit); ask for fewer, or wait for these to end and ask again",
            slots.len()
        ),
    ))
}
