//! `decide` with human approvals: a gated call stays planned (never
//! dispatched) until its approval is decided, each decision is applied
//! once to its own call, and a rejection is the call's result or the
//! Run's end, per the agent's policy.

use super::*;
use crate::approval::{Approval, ApprovalPolicy, ApprovalState, Decider, OnReject, Verdict};
use crate::chat::{TokenUsage, ToolCall};
use crate::run::{test_run, RunEvent};
use crate::skills::Risk;

/// An agent with an inline high-risk skill `wire` and the sandbox's
/// `shell_exec`.
fn agent(on_reject: OnReject) -> AgentDefinition {
    let mut a = AgentDefinition::from_json(
        "a",
        &json!({
            "model": {"provider": "scripted", "model_id": "m", "context_window": 4096},
            "system_prompt": "You help.",
            "skills": ["current_time", "shell_exec", "wire"],
            "approvals": {"approvers": ["ops@example.com"], "on_reject": match on_reject {
                OnReject::TellModel => "tell_model", OnReject::Fail => "fail" }}
        }),
    )
    .unwrap();
    let mut wire = skills::builtin(skills::HTTP_REQUEST).unwrap();
    wire.name = "wire".into();
    wire.risk = Risk::High;
    a.manifests.insert("wire".into(), wire);
    a
}

fn reply(calls: &[(&str, &str, Value)]) -> ModelReply {
    ModelReply {
        content: "on it".into(),
        tool_calls: calls
            .iter()
            .map(|(id, name, args)| ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                args: args.clone(),
            })
            .collect(),
        usage: TokenUsage::default(),
    }
}

fn kinds(d: &Decision) -> Vec<&str> {
    d.events.iter().map(|e| e.kind().as_str()).collect()
}

/// The approval the harness creates for `call_id`, decided.
fn decided(
    run: &Run,
    call_id: &str,
    verdict: Option<Verdict>,
    policy: &ApprovalPolicy,
) -> Approval {
    let rec = &run.ledger[call_id];
    let c = rec.approval.clone().unwrap();
    let req = crate::approval::ApprovalRequest {
        kind: Default::default(),
        call_id: call_id.into(),
        tool: rec.skill.clone(),
        args: rec.args.clone(),
        risk: c.risk,
        reasons: c.reasons,
    };
    let mut a = Approval::new(
        &run.tenant,
        &run.run_id,
        &run.agent,
        run.step,
        None,
        policy,
        req,
        10,
    );
    match verdict {
        Some(v) => a
            .decide(
                v,
                &Decider::Key {
                    key_id: "key_boss".into(),
                },
                None,
                Some("why".into()),
                20,
            )
            .unwrap(),
        None => a.expire(a.expires_at_ms).unwrap(),
    }
    a
}

#[test]
fn a_gated_call_waits_undispatched_and_runs_once_approved() {
    let a = agent(OnReject::TellModel);
    let mut run = test_run();
    let r = reply(&[
        ("c1", "current_time", json!({})),
        ("c2", "wire", json!({"url": "https://bank"})),
    ]);
    let d = decide(&mut run, &a, StepInput::Replied(&r), 5).unwrap();
    // The ungated inline call runs; the gated one stays planned.
    let Next::RunInline(inline) = &d.next else {
        panic!("{:?}", d.next)
    };
    assert_eq!(
        inline
            .iter()
            .map(|c| c.call_id.as_str())
            .collect::<Vec<_>>(),
        ["c1"]
    );
    assert_eq!(run.ledger["c2"].state(), ToolCallState::Planned);
    assert!(run.ledger["c2"].awaits_approval());
    let ran = vec![InlineAnswer {
        call_id: "c1".into(),
        ok: true,
        result: json!("noon"),
        progress: vec![],
    }];
    let d = decide(&mut run, &a, StepInput::InlineRan(ran), 6).unwrap();
    let Next::AwaitApproval(requests) = &d.next else {
        panic!("{:?}", d.next)
    };
    assert_eq!(requests.len(), 1);
    assert_eq!(
        (requests[0].call_id.as_str(), requests[0].risk),
        ("c2", Risk::High)
    );
    assert_eq!(kinds(&d), ["tool_result", "approval_requested"]);
    assert_eq!(
        run.ledger["c2"].state(),
        ToolCallState::Planned,
        "not dispatched before approval"
    );

    let approval = decided(
        &run,
        "c2",
        Some(Verdict::Approve),
        &a.approvals.clone().unwrap(),
    );
    let d = decide(
        &mut run,
        &a,
        StepInput::ApprovalsDecided(std::slice::from_ref(&approval)),
        30,
    )
    .unwrap();
    assert_eq!(kinds(&d), ["approval_decided"]);
    assert_eq!(d.events[0].fields()["by"], "key_boss");
    assert_eq!(d.events[0].fields()["how"], "key");
    assert!(d.checkpoint, "dispatched before it runs");
    let Next::RunInline(inline) = &d.next else {
        panic!("{:?}", d.next)
    };
    assert_eq!(inline[0].call_id, "c2");
    assert_eq!(run.ledger["c2"].state(), ToolCallState::Dispatched);

    // The same decision again: no second effect.
    let d = decide(
        &mut run,
        &a,
        StepInput::ApprovalsDecided(std::slice::from_ref(&approval)),
        31,
    )
    .unwrap();
    assert!(d.events.is_empty());
    assert_eq!(run.ledger["c2"].state(), ToolCallState::Dispatched);
}

#[test]
fn a_rejection_is_the_calls_result_or_the_runs_end() {
    for on_reject in [OnReject::TellModel, OnReject::Fail] {
        let a = agent(on_reject);
        let policy = a.approvals.clone().unwrap();
        let mut run = test_run();
        let r = reply(&[("c1", "wire", json!({"url": "https://bank"}))]);
        let d = decide(&mut run, &a, StepInput::Replied(&r), 5).unwrap();
        assert!(matches!(d.next, Next::AwaitApproval(_)), "{:?}", d.next);
        for verdict in [Some(Verdict::Reject), None] {
            let mut run = run.clone();
            let approval = decided(&run, "c1", verdict.clone(), &policy);
            let d = decide(&mut run, &a, StepInput::ApprovalsDecided(&[approval]), 30).unwrap();
            let code = if verdict.is_some() {
                "APPROVAL_REJECTED"
            } else {
                "APPROVAL_EXPIRED"
            };
            assert_eq!(run.ledger["c1"].state(), ToolCallState::Failed);
            assert_eq!(
                run.ledger["c1"].result.as_ref().unwrap()["error"]["code"],
                code
            );
            let first = if verdict.is_some() {
                "approval_decided"
            } else {
                "approval_expired"
            };
            assert_eq!(kinds(&d), [first, "tool_result"]);
            match on_reject {
                OnReject::TellModel => assert_eq!(d.next, Next::Continue),
                OnReject::Fail => {
                    let Next::End(RunEvent::Failed { error }) = &d.next else {
                        panic!("{:?}", d.next)
                    };
                    assert_eq!(error.code, code);
                }
            }
        }
    }
}

#[test]
fn two_approvals_in_one_turn_are_decided_independently_in_either_order() {
    let a = agent(OnReject::TellModel);
    let policy = a.approvals.clone().unwrap();
    let mut base = test_run();
    let r = reply(&[
        ("c1", "wire", json!({"url": "https://a"})),
        ("c2", "wire", json!({"url": "https://b"})),
    ]);
    let d = decide(&mut base, &a, StepInput::Replied(&r), 5).unwrap();
    let Next::AwaitApproval(requests) = &d.next else {
        panic!("{:?}", d.next)
    };
    assert_eq!(requests.len(), 2);
    for (first, second) in [("c1", "c2"), ("c2", "c1")] {
        let mut run = base.clone();
        let one = decided(&run, first, Some(Verdict::Approve), &policy);
        let d = decide(&mut run, &a, StepInput::ApprovalsDecided(&[one]), 30).unwrap();
        // Still waiting for the other: nothing new to request, nothing runs.
        assert_eq!(d.next, Next::AwaitApproval(vec![]));
        assert_eq!(run.ledger[first].state(), ToolCallState::Planned);
        let two = decided(&run, second, Some(Verdict::Reject), &policy);
        let d = decide(&mut run, &a, StepInput::ApprovalsDecided(&[two]), 31).unwrap();
        let Next::RunInline(inline) = &d.next else {
            panic!("{:?}", d.next)
        };
        assert_eq!(
            inline
                .iter()
                .map(|c| c.call_id.as_str())
                .collect::<Vec<_>>(),
            [first]
        );
        assert_eq!(run.ledger[second].state(), ToolCallState::Failed);
    }
}

#[test]
fn destructive_sandbox_work_waits_and_is_dispatched_once_approved() {
    let a = agent(OnReject::TellModel);
    let mut run = test_run();
    let r = reply(&[
        ("c1", "shell_exec", json!({"command": "ls"})),
        ("c2", "shell_exec", json!({"command": "rm -rf build"})),
    ]);
    let d = decide(&mut run, &a, StepInput::Replied(&r), 5).unwrap();
    let Next::AwaitApproval(requests) = &d.next else {
        panic!("{:?}", d.next)
    };
    assert_eq!(
        requests
            .iter()
            .map(|r| r.call_id.as_str())
            .collect::<Vec<_>>(),
        ["c2"]
    );
    assert!(
        run.ledger
            .values()
            .all(|c| c.state() == ToolCallState::Planned),
        "the turn's sandbox work waits"
    );
    let approval = decided(
        &run,
        "c2",
        Some(Verdict::Approve),
        &ApprovalPolicy::default(),
    );
    let d = decide(&mut run, &a, StepInput::ApprovalsDecided(&[approval]), 30).unwrap();
    let Next::Dispatch(planned) = &d.next else {
        panic!("{:?}", d.next)
    };
    assert_eq!(planned.len(), 2);
}

#[test]
fn a_redelivered_step_never_runs_a_call_that_waits_for_approval() {
    let a = agent(OnReject::TellModel);
    let mut run = test_run();
    let r = reply(&[("c1", "wire", json!({"url": "https://bank"}))]);
    let d = decide(&mut run, &a, StepInput::Replied(&r), 5).unwrap();
    assert!(
        !d.checkpoint,
        "the wait's commit creates the approvals with the record"
    );
    // The wait was committed and its follow-up lost: the redelivery waits
    // again and asks for nothing twice.
    let d = decide(&mut run, &a, StepInput::Claimed, 6).unwrap();
    assert_eq!(d.next, Next::AwaitApproval(vec![]));
    assert_eq!(run.ledger["c1"].state(), ToolCallState::Planned);
    assert_eq!(
        run.ledger["c1"].approval.as_ref().unwrap().state,
        ApprovalState::Pending
    );
}

#[test]
fn human_time_is_given_back_to_the_budget() {
    let mut run = test_run();
    run.apply(RunEvent::Claimed { lease_until_ms: 10 }, 0)
        .unwrap();
    let deadline = run.budgets.deadline_ms;
    run.apply(RunEvent::AwaitApproval, 1_000).unwrap();
    assert!(
        !run.past_deadline(deadline + 50_000),
        "no deadline while a human decides"
    );
    run.apply(RunEvent::Claimed { lease_until_ms: 0 }, 61_000)
        .unwrap();
    assert_eq!(run.budgets.deadline_ms, deadline + 60_000);
    assert_eq!(run.awaiting_human_since_ms, None);
}

#[test]
fn a_write_the_sandbox_finds_destructive_waits_for_approval_then_may_overwrite() {
    use crate::sandbox::hand::{codes, CallOutcome};
    let a = agent(OnReject::TellModel);
    let mut a = a;
    a.skills.push("file_write".into());
    let mut run = test_run();
    let r = reply(&[(
        "c1",
        "file_write",
        json!({"path": "a.txt", "content": "new"}),
    )]);
    let d = decide(&mut run, &a, StepInput::Replied(&r), 5).unwrap();
    let Next::Dispatch(planned) = &d.next else {
        panic!("{:?}", d.next)
    };
    let inv = super::invocation(&run, &a, &planned[0], 1);
    assert!(!inv.approved);
    assert!(
        !inv.judge_effects,
        "destructive: words judges by the words alone"
    );
    let mut by_effect = a.clone();
    let mut policy = by_effect.approvals.clone().unwrap_or_default();
    policy.destructive = crate::approval::policy::Destructive::Effect;
    by_effect.approvals = Some(policy);
    assert!(super::invocation(&run, &by_effect, &planned[0], 1).judge_effects);
    super::record_dispatch(&mut run, "c1", 1, "t#a", 6).unwrap();
    let refused = CallOutcome::NotRun {
        code: codes::APPROVAL_REQUIRED.into(),
        // The sandbox's message names the file; the path is the tenant's.
        message: "file_write would overwrite a.txt\nBcc: evil@example.com".into(),
    };
    let d = decide(
        &mut run,
        &a,
        StepInput::SandboxAnswered {
            call_id: "c1",
            outcome: refused,
        },
        7,
    )
    .unwrap();
    let Next::AwaitApproval(requests) = &d.next else {
        panic!("{:?}", d.next)
    };
    assert_eq!((requests.len(), requests[0].risk), (1, Risk::High));
    // What a human reads is the sandbox's account, said to be its own, on
    // one line: a path cannot start a header.
    let reason = &requests[0].reasons[0];
    assert!(
        reason.starts_with("the sandbox found the call destructive: ")
            && reason.contains("overwrite a.txt")
            && !reason.contains('\n'),
        "{reason:?}"
    );
    assert_eq!(requests[0].args["path"], "a.txt");
    assert_eq!(
        (run.ledger["c1"].state(), run.ledger["c1"].attempt),
        (ToolCallState::Planned, 2)
    );
    let approval = decided(
        &run,
        "c1",
        Some(Verdict::Approve),
        &ApprovalPolicy::default(),
    );
    let d = decide(&mut run, &a, StepInput::ApprovalsDecided(&[approval]), 30).unwrap();
    let Next::Dispatch(planned) = &d.next else {
        panic!("{:?}", d.next)
    };
    let inv = super::invocation(&run, &a, &planned[0], 1);
    assert!(inv.approved, "it may overwrite now");
    assert!(!inv.judge_effects, "an approved call is not judged again");
}

#[test]
fn an_uncertain_call_is_settled_by_a_human_when_the_agent_asks() {
    use crate::approval::{ApprovalKind, ApprovalRequest};
    use crate::sandbox::hand::CallOutcome;
    let mut a = agent(OnReject::TellModel);
    let policy = ApprovalPolicy {
        indeterminate: crate::approval::policy::OnIndeterminate::Ask,
        ..ApprovalPolicy::default()
    };
    a.approvals = Some(policy.clone());
    let mut base = test_run();
    let r = reply(&[("c1", "shell_exec", json!({"command": "make deploy"}))]);
    decide(&mut base, &a, StepInput::Replied(&r), 5).unwrap();
    super::record_dispatch(&mut base, "c1", 1, "t#a", 6).unwrap();
    let lost = CallOutcome::Lost {
        reason: "the sandbox stopped answering".into(),
    };
    let d = decide(
        &mut base,
        &a,
        StepInput::SandboxAnswered {
            call_id: "c1",
            outcome: lost,
        },
        7,
    )
    .unwrap();
    let Next::AwaitApproval(requests) = &d.next else {
        panic!("{:?}", d.next)
    };
    assert_eq!(requests[0].kind, ApprovalKind::Indeterminate);
    assert_eq!(
        base.ledger["c1"].state(),
        ToolCallState::Dispatched,
        "its effect is still unknown"
    );
    let settle = |run: &Run, verdict: Verdict| {
        let req = ApprovalRequest {
            kind: ApprovalKind::Indeterminate,
            call_id: "c1".into(),
            tool: "shell_exec".into(),
            args: json!({}),
            risk: Risk::High,
            reasons: vec![],
        };
        let mut ap = Approval::new(
            &run.tenant,
            &run.run_id,
            &run.agent,
            run.step,
            None,
            &policy,
            req,
            10,
        );
        assert_eq!(
            Some(&ap.approval_id),
            run.ledger["c1"].approval.as_ref().map(|c| &c.approval_id)
        );
        assert!(ap
            .clone()
            .decide(
                Verdict::Approve,
                &Decider::Key { key_id: "k".into() },
                None,
                None,
                20
            )
            .is_err());
        ap.decide(
            verdict,
            &Decider::Key { key_id: "k".into() },
            None,
            None,
            20,
        )
        .unwrap();
        ap
    };
    // It happened: the human's result is the call's.
    let mut run = base.clone();
    let ap = settle(
        &run,
        Verdict::Happened {
            result: json!({"stdout": "deployed"}),
        },
    );
    let d = decide(&mut run, &a, StepInput::ApprovalsDecided(&[ap]), 30).unwrap();
    assert_eq!(d.next, Next::Continue);
    assert_eq!(run.ledger["c1"].state(), ToolCallState::Done);
    assert_eq!(run.ledger["c1"].result, Some(json!({"stdout": "deployed"})));
    // Run it again: a new attempt, dispatched.
    let mut run = base.clone();
    let ap = settle(&run, Verdict::Retry);
    let d = decide(&mut run, &a, StepInput::ApprovalsDecided(&[ap]), 30).unwrap();
    assert!(matches!(d.next, Next::Dispatch(_)), "{:?}", d.next);
    assert_eq!(run.ledger["c1"].attempt, 2);
    // Fail: the Run ends with its call indeterminate.
    let mut run = base.clone();
    let ap = settle(&run, Verdict::Fail);
    let d = decide(&mut run, &a, StepInput::ApprovalsDecided(&[ap]), 30).unwrap();
    let Next::End(RunEvent::Failed { error }) = &d.next else {
        panic!("{:?}", d.next)
    };
    assert_eq!(error.code, "TOOL_INDETERMINATE");
    assert_eq!(run.ledger["c1"].state(), ToolCallState::Indeterminate);
}
