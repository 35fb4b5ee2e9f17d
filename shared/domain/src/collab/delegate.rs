//! The `delegate` and `plan` tool calls, checked and turned into children.
//! A call that cannot be carried out is answered with an error object, as
//! any tool's failure is: the Run that asked carries on and nothing loops.
//!
//! - `delegate {"agent", "task", "resume_from"?}`: one child of any
//!   registered agent that is not already on the path (a cycle), within the
//!   deployment's depth limit.
//! - `plan {"tasks": [{"agent", "task"}, ...]}`: the tool of a lead team's
//!   Run; one executor child per task, each a member of the team.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::resume::{self, ResumePlan};
use super::{child_run_id, codes, CallError, Lineage, RunKind, MAX_PLAN_TASKS, MAX_TASK_BYTES};
use crate::fields::{FieldError, Fields};
use crate::names::valid_name;
use crate::run::family::ChildSlot;
use crate::run::Run;
use crate::skills::{DELEGATE, PLAN};
use crate::team::Strategy;

/// What a `delegate` call asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegateArgs {
    pub agent: String,
    pub task: String,
    pub resume_from: Option<String>,
    /// A model asked for: only with `resume_from`, where it is ignored (the
    /// model is the source's) and recorded.
    pub model: Option<String>,
}

fn task_text(f: &Fields<'_>, key: &str) -> Result<String, FieldError> {
    let task = f.req_str(key)?;
    if task.trim().is_empty() {
        return Err(FieldError::new(key, "must not be empty"));
    }
    if task.len() > MAX_TASK_BYTES {
        return Err(FieldError::new(
            key,
            &format!(
                "must be at most {MAX_TASK_BYTES} bytes (share more through files or resume_from)"
            ),
        ));
    }
    Ok(task.to_string())
}

fn agent_name(f: &Fields<'_>, key: &str) -> Result<String, FieldError> {
    let a = f.req_str(key)?;
    if !valid_name(a) {
        return Err(FieldError::new(key, "is not a valid agent name"));
    }
    Ok(a.to_string())
}

pub fn parse_delegate(args: &Value) -> Result<DelegateArgs, FieldError> {
    let f = Fields::new(args)?;
    f.only(&["agent", "task", "resume_from", "model"])?;
    let a = DelegateArgs {
        agent: agent_name(&f, "agent")?,
        task: task_text(&f, "task")?,
        resume_from: f.opt_str("resume_from")?.map(str::to_string),
        model: f.opt_str("model")?.map(str::to_string),
    };
    if a.model.is_some() && a.resume_from.is_none() {
        return Err(FieldError::new(
            "model",
            "is only taken with resume_from (and then ignored: a resumed child keeps its source's model); a new child runs its agent's model",
        ));
    }
    Ok(a)
}

/// The `(agent, task)` pairs of a `plan` call.
pub fn parse_plan(args: &Value) -> Result<Vec<(String, String)>, FieldError> {
    let f = Fields::new(args)?;
    f.only(&["tasks"])?;
    let tasks = f
        .opt_array("tasks")?
        .ok_or_else(|| FieldError::new("tasks", "is required"))?;
    if tasks.is_empty() || tasks.len() > MAX_PLAN_TASKS {
        return Err(FieldError::new(
            "tasks",
            &format!("must hold between 1 and {MAX_PLAN_TASKS} tasks"),
        ));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for (i, t) in tasks.iter().enumerate() {
        let Value::Object(obj) = t else {
            return Err(FieldError::new(
                &format!("tasks[{i}]"),
                "must be {\"agent\": str, \"task\": str}",
            ));
        };
        let f = Fields::nested(obj, &format!("tasks[{i}]"))?;
        f.only(&["agent", "task"])?;
        out.push((agent_name(&f, "agent")?, task_text(&f, "task")?));
    }
    Ok(out)
}

/// The agents a children call names (to look them up before deciding);
/// arguments that do not parse name none.
pub fn agents_named(skill: &str, args: &Value) -> Vec<String> {
    match skill {
        DELEGATE => parse_delegate(args)
            .map(|a| vec![a.agent])
            .unwrap_or_default(),
        PLAN => parse_plan(args)
            .map(|t| t.into_iter().map(|(a, _)| a).collect())
            .unwrap_or_default(),
        _ => vec![],
    }
}

/// Refuses a child of `agent` below `lineage`: an agent that is not
/// registered, one already on the path (`check_cycle`), or a depth beyond
/// `max_depth`.
fn check_target(
    lineage: &Lineage,
    agent: &str,
    known: &BTreeSet<String>,
    max_depth: u32,
    check_cycle: bool,
) -> Result<(), CallError> {
    if !known.contains(agent) {
        return Err(CallError::new(
            codes::AGENT_NOT_FOUND,
            format!("agent '{agent}' not found"),
        ));
    }
    if check_cycle && lineage.path.iter().any(|a| a == agent) {
        return Err(CallError::new(
            codes::DELEGATION_CYCLE,
            format!(
                "'{agent}' is already on this run's path ({}): the delegation would loop",
                lineage.path_text(Some(agent))
            ),
        ));
    }
    if lineage.depth + 1 > max_depth {
        return Err(CallError::new(
            codes::DELEGATION_DEPTH,
            format!(
                "a child of this run would be at depth {}, beyond this deployment's limit of {max_depth} ({})",
                lineage.depth + 1,
                lineage.path_text(Some(agent))
            ),
        ));
    }
    Ok(())
}

/// The child a `delegate` call asks for, or why not. `resumes`: the
/// verdicts on the calls that resume a finished Run, by call id.
pub fn delegate_slots(
    run: &Run,
    call_id: &str,
    args: &Value,
    known: &BTreeSet<String>,
    max_depth: u32,
    resumes: &BTreeMap<String, Result<ResumePlan, CallError>>,
) -> Result<Vec<ChildSlot>, CallError> {
    let a = parse_delegate(args)?;
    check_target(&run.lineage(), &a.agent, known, max_depth, true)?;
    let mut s = slot(run, call_id, 0, a.agent, a.task, RunKind::Delegation);
    if a.resume_from.is_some() {
        let verdict = resumes.get(call_id).cloned().unwrap_or_else(|| {
            Err(CallError::new(
                resume::RESUME_UNREADABLE,
                "the run to resume from was not read",
            ))
        });
        s.resume = Some(verdict?);
    }
    Ok(vec![s])
}

/// The executors a `plan` call asks for, or why not: only a lead team's Run
/// plans, and only for the team's members.
pub fn plan_slots(
    run: &Run,
    call_id: &str,
    args: &Value,
    known: &BTreeSet<String>,
    max_depth: u32,
) -> Result<Vec<ChildSlot>, CallError> {
    let Some(team) = run.team.as_ref().filter(|t| t.strategy == Strategy::Lead) else {
        return Err(CallError::new(
            codes::PLAN_NOT_ALLOWED,
            "plan is the tool of a lead team's run; use delegate to ask another agent",
        ));
    };
    let tasks = parse_plan(args)?;
    let lineage = run.lineage();
    let mut slots = Vec::with_capacity(tasks.len());
    for (i, (agent, task)) in tasks.into_iter().enumerate() {
        if !team.members.contains(&agent) {
            return Err(CallError::new(
                codes::NOT_A_MEMBER,
                format!(
                    "tasks[{i}].agent: '{agent}' is not a member of team '{}' ({})",
                    team.name,
                    team.members.join(", ")
                ),
            ));
        }
        check_target(&lineage, &agent, known, max_depth, false).map_err(|e| CallError {
            message: format!("tasks[{i}]: {}", e.message),
            ..e
        })?;
        slots.push(slot(run, call_id, i, agent, task, RunKind::Executor));
    }
    Ok(slots)
}

fn slot(
    run: &Run,
    call_id: &str,
    index: usize,
    agent: String,
    task: String,
    kind: RunKind,
) -> ChildSlot {
    ChildSlot::queued(
        child_run_id(&run.run_id, call_id, index),
        agent,
        kind,
        Some(call_id.to_string()),
        Some(task),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::test_run;
    use crate::team::TeamDefinition;
    use serde_json::json;

    fn none() -> BTreeMap<String, Result<ResumePlan, CallError>> {
        BTreeMap::new()
    }

    fn known(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_delegation_names_a_registered_agent_not_on_the_path() {
        let run = test_run(); // agent "a", depth 0
        let k = known(&["a", "b"]);
        let slots = delegate_slots(
            &run,
            "c1",
            &json!({"agent": "b", "task": "go"}),
            &k,
            4,
            &none(),
        )
        .unwrap();
        assert_eq!(slots.len(), 1);
        assert_eq!(
            (
                slots[0].agent.as_str(),
                slots[0].kind,
                slots[0].task.as_deref()
            ),
            ("b", RunKind::Delegation, Some("go"))
        );
        assert_eq!(slots[0].run_id, child_run_id(&run.run_id, "c1", 0));
        let cases = [
            (
                json!({"agent": "zed", "task": "go"}),
                codes::AGENT_NOT_FOUND,
            ),
            (json!({"agent": "a", "task": "go"}), codes::DELEGATION_CYCLE),
            (json!({"agent": "b"}), codes::INVALID_ARGS),
            (json!({"agent": "b", "task": " "}), codes::INVALID_ARGS),
            (
                json!({"agent": "b", "task": "x", "extra": 1}),
                codes::INVALID_ARGS,
            ),
            (
                json!({"agent": "b", "task": "x".repeat(MAX_TASK_BYTES + 1)}),
                codes::INVALID_ARGS,
            ),
        ];
        for (args, code) in cases {
            let e = delegate_slots(&run, "c1", &args, &k, 4, &none()).unwrap_err();
            assert_eq!(e.code, code, "{args}");
        }
    }

    #[test]
    fn a_cycle_names_the_path_and_depth_is_bounded() {
        let mut run = test_run();
        run.lineage = Some(
            Lineage::root("r0", "x")
                .child("y", RunKind::Delegation)
                .child("a", RunKind::Delegation),
        );
        let k = known(&["a", "b", "x", "y"]);
        let e = delegate_slots(
            &run,
            "c",
            &json!({"agent": "x", "task": "t"}),
            &k,
            4,
            &none(),
        )
        .unwrap_err();
        assert_eq!(e.code, codes::DELEGATION_CYCLE);
        assert!(e.message.contains("x → y → a → x"), "{}", e.message);
        assert!(delegate_slots(
            &run,
            "c",
            &json!({"agent": "b", "task": "t"}),
            &k,
            3,
            &none()
        )
        .is_ok());
        let e = delegate_slots(
            &run,
            "c",
            &json!({"agent": "b", "task": "t"}),
            &k,
            2,
            &none(),
        )
        .unwrap_err();
        assert_eq!(e.code, codes::DELEGATION_DEPTH);
    }

    #[test]
    fn only_a_lead_plans_and_only_for_its_members() {
        let mut run = test_run();
        let k = known(&["a", "m1", "m2", "out"]);
        let args = json!({"tasks": [{"agent": "m1", "task": "x"}, {"agent": "m2", "task": "y"}]});
        assert_eq!(
            plan_slots(&run, "p", &args, &k, 4).unwrap_err().code,
            codes::PLAN_NOT_ALLOWED
        );
        run.team = Some(
            TeamDefinition::from_json(
                "eng",
                &json!({"members": ["m1", "m2"], "strategy": "lead", "lead": "a"}),
            )
            .unwrap(),
        );
        let slots = plan_slots(&run, "p", &args, &k, 4).unwrap();
        assert_eq!(slots.len(), 2);
        assert!(slots.iter().all(|s| s.kind == RunKind::Executor));
        assert_ne!(slots[0].run_id, slots[1].run_id);
        let outsider = json!({"tasks": [{"agent": "out", "task": "x"}]});
        assert_eq!(
            plan_slots(&run, "p", &outsider, &k, 4).unwrap_err().code,
            codes::NOT_A_MEMBER
        );
        let e = plan_slots(&run, "p", &json!({"tasks": []}), &k, 4).unwrap_err();
        assert_eq!(e.code, codes::INVALID_ARGS);
        let e = plan_slots(&run, "p", &json!({"tasks": [{"agent": "m1"}]}), &k, 4).unwrap_err();
        assert!(e.message.contains("tasks[0].task"), "{}", e.message);
        assert_eq!(agents_named(PLAN, &args), ["m1", "m2"]);
    }
}
