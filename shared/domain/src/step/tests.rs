//! `decide` on its own: every branch a step can take, with the ledger
//! and usage it leaves behind.

use super::*;
use crate::chat::{TokenUsage, ToolCall};
use crate::run::{test_run, EventKind, RunEvent};
use crate::sandbox::hand::{codes, SANDBOX_LOST};

fn agent() -> AgentDefinition {
    AgentDefinition::from_json(
        "a",
        &json!({
            "model": {"provider": "scripted", "model_id": "m", "context_window": 4096},
            "system_prompt": "You help.",
            "skills": ["current_time", "shell_exec"]
        }),
    )
    .unwrap()
}

fn reply(calls: &[(&str, &str)]) -> ModelReply {
    ModelReply {
        content: "thinking".into(),
        tool_calls: calls
            .iter()
            .map(|(id, name)| ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                args: json!({"command": "ls"}),
            })
            .collect(),
        usage: TokenUsage {
            input_tokens: 10,
            output_tokens: 2,
        },
    }
}

fn failure(d: &Decision) -> &str {
    match &d.next {
        Next::End(RunEvent::Failed { error }) => &error.code,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn kinds(d: &Decision) -> Vec<&str> {
    d.events.iter().map(|e| e.kind().as_str()).collect()
}

#[test]
fn a_claim_past_the_deadline_or_the_turn_budget_ends_the_run() {
    let mut run = test_run();
    let late = run.budgets.deadline_ms;
    let d = decide(&mut run, &agent(), StepInput::Claimed, late).unwrap();
    assert!(matches!(
        d.next,
        Next::End(RunEvent::DeadlineExceeded { .. })
    ));
    run.usage.model_turns = run.budgets.max_model_turns;
    let d = decide(&mut run, &agent(), StepInput::Claimed, 1).unwrap();
    assert_eq!(failure(&d), "BUDGET_EXCEEDED");
    run.usage.model_turns = 0;
    let d = decide(&mut run, &agent(), StepInput::Claimed, 1).unwrap();
    assert_eq!(
        d.next,
        Next::CallModel {
            hold_sandbox_first: false
        }
    );
    assert!(!d.checkpoint);
}

#[test]
fn an_eager_agent_names_its_sandbox_and_commits_before_the_model_call() {
    let mut a = agent();
    a.sandbox.provisioning = Provisioning::Eager;
    let mut run = test_run();
    let d = decide(&mut run, &a, StepInput::Claimed, 1).unwrap();
    assert_eq!(
        d.next,
        Next::CallModel {
            hold_sandbox_first: true
        }
    );
    assert!(d.checkpoint);
    assert_eq!(run.sandbox_key.as_deref(), Some("t#a"));
}

#[test]
fn an_answer_without_tools_is_the_output() {
    let mut run = test_run();
    let d = decide(&mut run, &agent(), StepInput::Replied(&reply(&[])), 5).unwrap();
    assert_eq!(d.next, Next::Answer);
    assert_eq!(kinds(&d), ["model_reply"]);
    assert_eq!((run.usage.model_turns, run.usage.input_tokens), (1, 10));
}

#[test]
fn calls_are_recorded_before_any_runs_and_go_where_their_skill_says() {
    let (a, mut run) = (agent(), test_run());
    let r = reply(&[("c1", "current_time"), ("c2", "shell_exec")]);
    let d = decide(&mut run, &a, StepInput::Replied(&r), 5).unwrap();
    assert!(d.checkpoint, "calls are committed before they run");
    assert_eq!(kinds(&d), ["model_reply", "tool_call", "tool_call"]);
    let Next::RunInline(inline) = &d.next else {
        panic!("{:?}", d.next)
    };
    assert_eq!(inline.len(), 1);
    assert_eq!(run.ledger["c1"].state(), ToolCallState::Dispatched);
    assert_eq!(run.ledger["c2"].state(), ToolCallState::Planned);
    assert_eq!(run.sandbox_key.as_deref(), Some("t#a"));
    assert_eq!(run.usage.tool_calls, 2);

    // A chatty tool's notes: the last MAX_PROGRESS_NOTES, before its result.
    let progress = (0..MAX_PROGRESS_NOTES + 3)
        .map(|i| ProgressNote {
            progress: i as f64,
            total: None,
            message: None,
        })
        .collect();
    let ran = vec![InlineAnswer {
        call_id: "c1".into(),
        ok: true,
        result: json!("noon"),
        progress,
    }];
    let d = decide(&mut run, &a, StepInput::InlineRan(ran), 6).unwrap();
    let mut expected = vec!["tool_progress"; MAX_PROGRESS_NOTES];
    expected.push("tool_result");
    assert_eq!(kinds(&d), expected);
    assert!(matches!(
        &d.events[0].event,
        LogEvent::ToolProgress { progress, .. } if *progress == 3.0
    ));
    let Next::Dispatch(planned) = &d.next else {
        panic!("{:?}", d.next)
    };
    assert_eq!(planned[0].call_id, "c2");
    let inv = invocation(&run, &a, &planned[0], 7);
    assert_eq!(
        (inv.skill.as_str(), inv.generation, inv.attempt),
        ("shell_exec", 7, 1)
    );
    let ev = record_dispatch(&mut run, "c2", 7, "t#a", 7).unwrap();
    assert_eq!(ev.kind(), EventKind::ToolDispatched);
    assert_eq!(run.ledger["c2"].generation, Some(7));
    assert_eq!(
        decide(&mut run, &a, StepInput::Claimed, 8).unwrap().next,
        Next::Wait
    );

    let outcome = CallOutcome::Finished {
        result: json!({"stdout": "x"}),
    };
    let input = StepInput::SandboxAnswered {
        call_id: "c2",
        outcome,
    };
    let d = decide(&mut run, &a, input, 9).unwrap();
    assert_eq!(d.next, Next::Continue);
    assert_eq!(run.ledger["c2"].state(), ToolCallState::Done);
}

#[test]
fn the_tool_call_budget_is_checked_before_anything_is_recorded() {
    let mut run = test_run();
    run.budgets.max_tool_calls = 1;
    let r = reply(&[("c1", "current_time"), ("c2", "current_time")]);
    let d = decide(&mut run, &agent(), StepInput::Replied(&r), 5).unwrap();
    assert_eq!(failure(&d), "BUDGET_EXCEEDED");
    assert!(run.ledger.is_empty());
}

#[test]
fn a_redelivered_step_repeats_only_what_is_safe_to_repeat() {
    let a = agent();
    let mut run = test_run();
    let r = reply(&[("c1", "current_time")]);
    decide(&mut run, &a, StepInput::Replied(&r), 5).unwrap();
    run.ledger.get_mut("c1").unwrap().idempotent = true;
    let d = decide(&mut run, &a, StepInput::Claimed, 6).unwrap();
    assert!(matches!(&d.next, Next::RunInline(calls) if calls[0].call_id == "c1"));

    run.ledger.get_mut("c1").unwrap().idempotent = false;
    let d = decide(&mut run, &a, StepInput::Claimed, 6).unwrap();
    assert_eq!(failure(&d), "TOOL_INDETERMINATE");
    assert_eq!(kinds(&d), ["tool_indeterminate"]);
    assert_eq!(run.ledger["c1"].state(), ToolCallState::Indeterminate);
}

fn dispatched_shell_call(run: &mut Run, a: &AgentDefinition) {
    let r = reply(&[("c2", "shell_exec")]);
    decide(run, a, StepInput::Replied(&r), 5).unwrap();
    record_dispatch(run, "c2", 1, "t#a", 5).unwrap();
}

#[test]
fn a_call_that_never_started_is_sent_again_a_bounded_number_of_times() {
    let (a, mut run) = (agent(), test_run());
    dispatched_shell_call(&mut run, &a);
    for attempt in 1..MAX_SANDBOX_ATTEMPTS {
        let outcome = CallOutcome::NotRun {
            code: SANDBOX_LOST.into(),
            message: "gone".into(),
        };
        let input = StepInput::SandboxAnswered {
            call_id: "c2",
            outcome,
        };
        let d = decide(&mut run, &a, input, 6).unwrap();
        assert_eq!(kinds(&d), ["tool_retried"]);
        assert!(matches!(d.next, Next::Dispatch(_)));
        assert_eq!(run.ledger["c2"].attempt, attempt + 1);
        record_dispatch(&mut run, "c2", 2, "t#a", 6).unwrap();
    }
    let outcome = CallOutcome::NotRun {
        code: SANDBOX_LOST.into(),
        message: "gone".into(),
    };
    let input = StepInput::SandboxAnswered {
        call_id: "c2",
        outcome,
    };
    let d = decide(&mut run, &a, input, 7).unwrap();
    assert_eq!(failure(&d), codes::SANDBOX_UNAVAILABLE);
    assert_eq!(run.ledger["c2"].state(), ToolCallState::Failed);
}

#[test]
fn a_lost_call_with_effects_is_never_repeated() {
    let (a, mut run) = (agent(), test_run());
    dispatched_shell_call(&mut run, &a);
    run.ledger.get_mut("c2").unwrap().idempotent = false;
    let outcome = CallOutcome::Lost {
        reason: "died".into(),
    };
    let input = StepInput::SandboxAnswered {
        call_id: "c2",
        outcome,
    };
    let d = decide(&mut run, &a, input, 6).unwrap();
    assert_eq!(failure(&d), "TOOL_INDETERMINATE");
    assert_eq!(run.ledger["c2"].state(), ToolCallState::Indeterminate);
}

#[test]
fn answers_that_do_not_fit_the_ledger_are_refused_by_name() {
    let (a, mut run) = (agent(), test_run());
    let outcome = CallOutcome::Finished { result: json!(1) };
    let input = StepInput::SandboxAnswered {
        call_id: "nope",
        outcome: outcome.clone(),
    };
    assert_eq!(
        decide(&mut run, &a, input, 6).unwrap_err(),
        StepRefused::UnknownCall("nope".into())
    );
    dispatched_shell_call(&mut run, &a);
    let input = StepInput::SandboxAnswered {
        call_id: "c2",
        outcome: outcome.clone(),
    };
    decide(&mut run, &a, input, 6).unwrap();
    let input = StepInput::SandboxAnswered {
        call_id: "c2",
        outcome,
    };
    assert!(matches!(
        decide(&mut run, &a, input, 7),
        Err(StepRefused::Tool { .. })
    ));
}

fn delegating_agent() -> AgentDefinition {
    AgentDefinition::from_json(
        "a",
        &json!({
            "model": {"provider": "scripted", "model_id": "m", "context_window": 4096},
            "system_prompt": "You help.",
            "skills": ["current_time", "shell_exec", "delegate"]
        }),
    )
    .unwrap()
}

fn delegations(targets: &[(&str, &str)]) -> ModelReply {
    let mut r = reply(&[]);
    r.tool_calls = targets
        .iter()
        .enumerate()
        .map(|(i, (agent, task))| ToolCall {
            id: format!("d{i}"),
            name: "delegate".into(),
            args: json!({"agent": agent, "task": task}),
        })
        .collect();
    r
}

#[test]
fn delegate_calls_become_children_of_one_waiting_point() {
    let a = delegating_agent();
    let mut run = test_run();
    run.apply(RunEvent::Claimed { lease_until_ms: 9 }, 1)
        .unwrap();
    let d = decide(
        &mut run,
        &a,
        StepInput::Replied(&delegations(&[("b", "x"), ("c", "y")])),
        1,
    )
    .unwrap();
    assert!(d.checkpoint, "the calls are recorded before anything runs");
    let Next::Delegate(calls) = &d.next else {
        panic!("expected the agents to be looked up, got {:?}", d.next)
    };
    assert_eq!(calls.len(), 2);
    assert!(run
        .ledger
        .values()
        .all(|r| r.children && r.state() == ToolCallState::Planned));
    let known = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let none = BTreeMap::new();
    let input = StepInput::Delegations {
        known: &known,
        limits: ChildLimits::default(),
        resumes: &none,
    };
    let d = decide(&mut run, &a, input, 2).unwrap();
    assert_eq!(d.next, Next::AwaitChildren);
    assert!(run
        .ledger
        .values()
        .all(|r| r.state() == ToolCallState::Dispatched));
    let children = run.children.clone().unwrap();
    assert_eq!((children.round, children.outstanding), (1, 2));
    assert_eq!(children.slots[1].agent, "c");

    // Redelivered while the children run: wait again, nothing is lost or
    // taken for indeterminate.
    run.apply(RunEvent::AwaitChildren, 3).unwrap();
    run.apply(RunEvent::Claimed { lease_until_ms: 9 }, 4)
        .unwrap();
    let d = decide(&mut run, &a, StepInput::Claimed, 5).unwrap();
    assert_eq!(d.next, Next::AwaitChildren);
    assert!(d.events.is_empty());
}

#[test]
fn a_refused_delegation_is_the_calls_error_and_the_run_carries_on() {
    let a = delegating_agent();
    let mut run = test_run();
    decide(
        &mut run,
        &a,
        StepInput::Replied(&delegations(&[("zed", "x"), ("a", "y")])),
        1,
    )
    .unwrap();
    let known = ["a"].iter().map(|s| s.to_string()).collect();
    let none = BTreeMap::new();
    let input = StepInput::Delegations {
        known: &known,
        limits: ChildLimits::default(),
        resumes: &none,
    };
    let d = decide(&mut run, &a, input, 2).unwrap();
    assert_eq!(d.next, Next::Continue);
    assert_eq!(kinds(&d), ["tool_result", "tool_result"]);
    let codes: Vec<String> = d
        .events
        .iter()
        .map(|e| {
            e.fields()["result"]["error"]["code"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(codes, ["AGENT_NOT_FOUND", "DELEGATION_CYCLE"]);
    assert!(run.children.is_none());
}

#[test]
fn only_an_agent_with_the_skill_delegates_and_only_a_lead_plans() {
    let mut run = test_run();
    let mut r = delegations(&[("b", "x")]);
    r.tool_calls.push(ToolCall {
        id: "p".into(),
        name: "plan".into(),
        args: json!({"tasks": []}),
    });
    // Without the skill, both are unknown inline tools (answered DENIED).
    let d = decide(&mut run, &agent(), StepInput::Replied(&r), 1).unwrap();
    assert!(matches!(d.next, Next::RunInline(ref c) if c.len() == 2));
    let mut lead = test_run();
    lead.team = Some(
        crate::team::TeamDefinition::from_json(
            "eng",
            &json!({"members": ["b"], "strategy": "lead", "lead": "a"}),
        )
        .unwrap(),
    );
    assert!(manifest_for(&lead, &agent(), "plan").is_some());
    assert!(manifest_for(&run, &agent(), "plan").is_none());
}

/// The poison Run of issue 19: arguments nested 125 levels deep (within
/// serde_json's 128) sat three levels deeper in the ledger, and the
/// record no longer parsed. They never enter it now, nor do results
/// nested as deeply; the Run goes on and the model reads why.
#[test]
fn json_nested_too_deeply_never_enters_the_record() {
    let deep = (0..125).fold(json!(1), |v, _| json!([v]));
    let mut run = test_run();
    let mut r = reply(&[("c1", "current_time"), ("c2", "current_time")]);
    r.tool_calls[0].args = json!({ "x": deep.clone() });
    let d = decide(&mut run, &agent(), StepInput::Replied(&r), 1).unwrap();
    let refused = &run.ledger["c1"];
    assert_eq!(refused.state(), ToolCallState::Failed);
    assert_eq!(refused.args, json!(TOO_DEEP_ARGS));
    assert_eq!(
        refused.result.as_ref().unwrap()["error"]["code"],
        INVALID_ARGUMENTS
    );
    // The other call runs as it would have.
    assert!(
        matches!(&d.next, Next::RunInline(calls) if calls.len() == 1 && calls[0].call_id == "c2")
    );
    // A result as deep is refused too.
    decide(
        &mut run,
        &agent(),
        StepInput::InlineRan(vec![InlineAnswer {
            call_id: "c2".into(),
            ok: true,
            result: deep,
            progress: vec![],
        }]),
        2,
    )
    .unwrap();
    let answered = &run.ledger["c2"];
    assert_eq!(answered.state(), ToolCallState::Failed);
    assert_eq!(
        answered.result.as_ref().unwrap()["error"]["code"],
        RESULT_TOO_DEEP
    );
    // Everything the record and its events hold reads back.
    let text = serde_json::to_string(&run).unwrap();
    let back: Run = serde_json::from_str(&text).unwrap();
    assert!(crate::fields::json_depth(&serde_json::to_value(&back).unwrap()) <= 40);
    for e in &d.events {
        assert!(crate::fields::json_depth(&e.fields()) <= crate::fields::MAX_JSON_DEPTH + 4);
    }
}

/// The children of one step's calls, offered in order: `limits` decides.
fn delegated(run: &mut Run, a: &AgentDefinition, r: &ModelReply, limits: ChildLimits) -> Decision {
    run.apply(RunEvent::Claimed { lease_until_ms: 9 }, 1)
        .unwrap();
    let d = decide(run, a, StepInput::Replied(r), 1).unwrap();
    assert!(matches!(d.next, Next::Delegate(_)), "{:?}", d.next);
    let known = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let none = BTreeMap::new();
    let input = StepInput::Delegations {
        known: &known,
        limits,
        resumes: &none,
    };
    decide(run, a, input, 2).unwrap()
}

fn refused_codes(d: &Decision) -> Vec<(String, String)> {
    d.events
        .iter()
        .filter(|e| e.kind() == EventKind::ToolResult)
        .map(|e| {
            (
                e.fields()["call_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                e.fields()["result"]["error"]["code"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// 16 `plan` calls of 64 tasks in one turn would be 1,024 children of one
/// POST: the waiting point takes 64 (one full plan) and every call past
/// that is refused whole, as an error the lead reads.
#[test]
fn one_waiting_point_holds_at_most_its_limit_of_children() {
    let mut lead = test_run();
    lead.team = Some(
        crate::team::TeamDefinition::from_json(
            "eng",
            &json!({"members": ["b", "c"], "strategy": "lead", "lead": "a"}),
        )
        .unwrap(),
    );
    let tasks = |n: usize| -> Value {
        let t: Vec<Value> = (0..n)
            .map(|i| json!({"agent": if i % 2 == 0 { "b" } else { "c" }, "task": format!("part {i}")}))
            .collect();
        json!({ "tasks": t })
    };
    let mut r = reply(&[]);
    r.tool_calls = [("p0", 64), ("p1", 64), ("p2", 1)]
        .iter()
        .map(|(id, n)| ToolCall {
            id: (*id).into(),
            name: "plan".into(),
            args: tasks(*n),
        })
        .collect();
    let d = delegated(&mut lead, &agent(), &r, ChildLimits::default());
    assert_eq!(d.next, Next::AwaitChildren);
    let children = lead.children.clone().unwrap();
    assert_eq!((children.slots.len(), children.outstanding), (64, 64));
    assert!(children
        .slots
        .iter()
        .all(|s| s.call_id.as_deref() == Some("p0")));
    assert_eq!(
        refused_codes(&d),
        [
            ("p1".to_string(), "TOO_MANY_CHILDREN".to_string()),
            ("p2".to_string(), "TOO_MANY_CHILDREN".to_string())
        ]
    );
    assert_eq!(lead.ledger["p0"].state(), ToolCallState::Dispatched);
    assert!(lead.ledger["p1"].state().is_settled());

    // The deployment's limit, not the plan's, decides: with 2, a third
    // delegate of the same step is refused and the first two go.
    let mut run = test_run();
    let limits = ChildLimits {
        max_children_per_wait: 2,
        ..ChildLimits::default()
    };
    let r = delegations(&[("b", "x"), ("c", "y"), ("b", "z")]);
    let d = delegated(&mut run, &delegating_agent(), &r, limits);
    assert_eq!(d.next, Next::AwaitChildren);
    assert_eq!(run.children.clone().unwrap().outstanding, 2);
    assert_eq!(
        refused_codes(&d),
        [("d2".to_string(), "TOO_MANY_CHILDREN".to_string())]
    );
}

/// The Runs one root's tree may have below it are bounded across steps
/// and levels: a root of a deployment whose bound is 3 starts three
/// children in one step and the fourth call is refused with
/// `TOO_MANY_DESCENDANTS`; a child given a share of 1 starts one child,
/// and its second call is refused, as an error its model reads.
#[test]
fn a_tree_holds_no_more_runs_than_its_roots_bound() {
    let limits = ChildLimits {
        max_descendants: 3,
        ..ChildLimits::default()
    };
    let mut root = test_run();
    let r = delegations(&[("b", "w"), ("c", "x"), ("b", "y"), ("c", "z")]);
    let d = delegated(&mut root, &delegating_agent(), &r, limits);
    assert_eq!(d.next, Next::AwaitChildren);
    let children = root.children.clone().unwrap();
    assert_eq!(children.outstanding, 3);
    assert!(children.slots.iter().all(|s| s.descendants == Some(0)));
    assert_eq!(root.lineage().descendants_left, Some(0));
    assert_eq!(
        refused_codes(&d),
        [("d3".to_string(), "TOO_MANY_DESCENDANTS".to_string())]
    );

    let mut child = test_run();
    child.lineage = Some(crate::collab::Lineage {
        descendants_left: Some(1),
        ..crate::collab::Lineage::root("r0", "x").child("a", crate::collab::RunKind::Delegation)
    });
    let r = delegations(&[("b", "y"), ("c", "z")]);
    let d = delegated(&mut child, &delegating_agent(), &r, limits);
    assert_eq!(child.children.clone().unwrap().outstanding, 1);
    assert_eq!(child.lineage().descendants_left, Some(0));
    assert_eq!(
        refused_codes(&d),
        [("d1".to_string(), "TOO_MANY_DESCENDANTS".to_string())]
    );
}
