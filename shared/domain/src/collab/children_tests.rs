use serde_json::json;

use super::*;
use crate::collab::DEFAULT_MAX_DESCENDANTS;
use crate::ledger::{ToolCallRecord, ToolCallState};
use crate::machine::Machine;
use crate::run::{test_run, EventKind, Payload, RunEvent};
use crate::team::TeamDefinition;

fn waiting_parent(slots: Vec<ChildSlot>, max_parallel: u32) -> Run {
    let mut run = test_run();
    run.apply(RunEvent::Claimed { lease_until_ms: 9 }, 1)
        .unwrap();
    for s in &slots {
        if let Some(call) = &s.call_id {
            if !run.ledger.contains_key(call) {
                let skill = if s.kind == RunKind::Executor {
                    skills::PLAN
                } else {
                    skills::DELEGATE
                };
                let mut rec = ToolCallRecord::planned(call, skill, json!({}), 0, false, false);
                rec.children = true;
                rec.apply(ToolCallEvent::Dispatched { generation: None }, 0)
                    .unwrap();
                run.ledger.insert(call.clone(), rec);
            }
        }
    }
    open_round(&mut run, slots, max_parallel);
    run.apply(RunEvent::AwaitChildren, 2).unwrap();
    run
}

fn slot(id: &str, agent: &str, kind: RunKind, call: Option<&str>) -> ChildSlot {
    let task = Some(format!("task of {agent}"));
    ChildSlot::queued(
        id.into(),
        agent.into(),
        kind,
        call.map(str::to_string),
        task,
    )
}

fn done(id: &str, agent: &str, out: &str) -> ChildEnd {
    ChildEnd {
        run_id: id.into(),
        agent: agent.into(),
        state: RunState::Completed,
        output: Some(out.into()),
        error: None,
    }
}

fn failed(id: &str, agent: &str) -> ChildEnd {
    ChildEnd {
        run_id: id.into(),
        agent: agent.into(),
        state: RunState::Failed,
        output: None,
        error: Some(RunError::new("MODEL_ERROR", "boom")),
    }
}

fn recorded(n: Noted) -> (Vec<RunEventRecord>, Vec<String>, Vec<RunAction>) {
    match n {
        Noted::Recorded {
            events,
            start,
            actions,
        } => (events, start, actions),
        Noted::Duplicate => panic!("expected a recorded end"),
    }
}

fn kinds(events: &[RunEventRecord]) -> Vec<&str> {
    events.iter().map(|e| e.kind().as_str()).collect()
}

#[test]
fn children_start_within_max_parallel_and_a_free_place_goes_to_the_next() {
    let slots = (0..5)
        .map(|i| {
            slot(
                &format!("c{i}"),
                "b",
                RunKind::Delegation,
                Some(&format!("k{i}")),
            )
        })
        .collect();
    let mut run = waiting_parent(slots, 2);
    let (started, events) = start_queued(&mut run, 3);
    assert_eq!(started, ["c0", "c1"]);
    assert_eq!(kinds(&events), ["child_started", "child_started"]);
    assert!(start_queued(&mut run, 3).0.is_empty(), "no room left");
    let (_, start, actions) =
        recorded(child_ended(&mut run, done("c0", "b", "x"), &[], 4).unwrap());
    assert_eq!(start, ["c2"]);
    assert!(actions.is_empty());
    assert_eq!(run.outstanding_children(), 4);
}

#[test]
fn a_delegation_is_answered_with_its_childs_outcome_and_the_parent_goes_on_once() {
    let slots = vec![
        slot("c0", "b", RunKind::Delegation, Some("k0")),
        slot("c1", "c", RunKind::Delegation, Some("k1")),
    ];
    let mut run = waiting_parent(slots, 16);
    start_queued(&mut run, 3);
    let epoch = run.epoch;
    let (events, _, actions) = recorded(child_ended(&mut run, failed("c1", "c"), &[], 4).unwrap());
    assert_eq!(kinds(&events), ["child_finished", "tool_result"]);
    assert!(actions.is_empty(), "one child is still out");
    assert_eq!(run.ledger["k1"].state(), ToolCallState::Failed);
    let err = &events[1].fields()["result"]["error"];
    assert_eq!(err["code"], codes::CHILD_FAILED);
    assert_eq!(err["cause"]["code"], "MODEL_ERROR");
    assert_eq!(err["run_id"], "c1");
    // The same end again (a duplicate message) changes nothing.
    let before = run.clone();
    assert_eq!(
        child_ended(&mut run, failed("c1", "c"), &[], 5).unwrap(),
        Noted::Duplicate
    );
    assert_eq!(run, before);
    let (events, _, actions) =
        recorded(child_ended(&mut run, done("c0", "b", "fine"), &[], 6).unwrap());
    assert_eq!(events[1].fields()["result"]["output"], "fine");
    assert_eq!(events[1].fields()["result"]["state"], "COMPLETED");
    assert_eq!(actions, vec![RunAction::EnqueueNextStep]);
    assert_eq!(
        (run.state(), run.step, run.epoch, run.outstanding_children()),
        (RunState::Executing, 1, epoch + 1, 0)
    );
    // Once settled, a late duplicate is still only a duplicate.
    assert_eq!(
        child_ended(&mut run, done("c0", "b", "fine"), &[], 7).unwrap(),
        Noted::Duplicate
    );
}

#[test]
fn an_end_waits_while_a_step_holds_the_parent_and_strangers_are_refused() {
    let mut run = waiting_parent(vec![slot("c0", "b", RunKind::Delegation, Some("k0"))], 16);
    assert!(matches!(
        child_ended(&mut run, done("zz", "b", ""), &[], 3),
        Err(EndRefused::UnknownChild(_))
    ));
    run.apply(RunEvent::Claimed { lease_until_ms: 99 }, 3)
        .unwrap();
    assert_eq!(
        child_ended(&mut run, done("c0", "b", "x"), &[], 4),
        Err(EndRefused::NotWaiting(RunState::Executing))
    );
    assert_eq!(run.outstanding_children(), 1, "nothing was taken");
}

fn fan_out_run(policy: serde_json::Value, members: &[&str]) -> Run {
    let mut run = test_run();
    let mut body = json!({"members": members, "strategy": "fan_out", "failure_policy": policy});
    if policy.is_null() {
        body.as_object_mut().unwrap().remove("failure_policy");
    }
    run.team = Some(TeamDefinition::from_json("soc", &body).unwrap());
    let events = expand_team(&mut run, DEFAULT_MAX_DESCENDANTS, 1).unwrap();
    assert_eq!(kinds(&events), ["round_started"]);
    run
}

/// A team's members are paid for out of its Run's allowance: each member
/// gets a share of what remains; a team larger than the bound does not
/// expand and says why, its Run unchanged.
#[test]
fn a_fan_out_pays_for_its_members_or_does_not_expand() {
    let mut run = test_run();
    let body = json!({"members": ["a", "b", "c"], "strategy": "fan_out"});
    run.team = Some(TeamDefinition::from_json("soc", &body).unwrap());
    let before = run.clone();
    let e = expand_team(&mut run, 2, 1).unwrap_err();
    assert_eq!(e.code(), Some(codes::TOO_MANY_DESCENDANTS));
    assert_eq!(run.state(), RunState::Pending);
    assert!(run.children.is_none());
    run = before;
    expand_team(&mut run, 10, 1).unwrap();
    // 10 - 3 = 7 left; each member 7 / 4 = 1; the team's Run keeps 4.
    let c = run.children.clone().unwrap();
    assert!(c.slots.iter().all(|s| s.descendants == Some(1)), "{c:?}");
    assert_eq!(run.lineage().descendants_left, Some(4));
    let member = new_child(&run, &c.slots[0], None, 2);
    assert_eq!(member.lineage().descendants_left, Some(1));
    assert_eq!(member.lineage().depth, 1);
}

fn member_ids(run: &Run) -> Vec<String> {
    run.children
        .as_ref()
        .unwrap()
        .slots
        .iter()
        .map(|s| s.run_id.clone())
        .collect()
}

#[test]
fn a_fan_out_expands_one_member_each_and_round_two_follows_the_last() {
    let mut run = fan_out_run(serde_json::Value::Null, &["a", "b", "c"]);
    assert_eq!((run.state(), run.epoch), (RunState::AwaitingChildren, 1));
    let ids = member_ids(&run);
    assert_eq!(ids.len(), 3);
    assert!(
        expand_team(&mut run, DEFAULT_MAX_DESCENDANTS, 2).is_err(),
        "expands once"
    );
    let (started, _) = start_queued(&mut run, 2);
    assert_eq!(started.len(), 3);
    // Out of order, the last one sees the others through `earlier`.
    let ends = [
        done(&ids[2], "c", "C"),
        done(&ids[0], "a", "A"),
        done(&ids[1], "b", "B"),
    ];
    let mut earlier = Vec::new();
    let mut all = Vec::new();
    for (i, e) in ends.iter().enumerate() {
        assert_eq!(needs_earlier(&run, &e.run_id), i == 2);
        let (events, _, actions) = recorded(child_ended(&mut run, e.clone(), &earlier, 3).unwrap());
        earlier.push(e.clone());
        all.extend(events.clone());
        if i < 2 {
            assert!(actions.is_empty());
        } else {
            assert_eq!(kinds(&events), ["child_finished", "round_started"]);
            assert_eq!(actions, vec![RunAction::EnqueueNextStep]);
        }
    }
    assert_eq!(run.state(), RunState::Executing);
    let round2 = all
        .iter()
        .find(|e| e.kind() == EventKind::RoundStarted)
        .unwrap();
    let message = round_message_at(&all, round2).unwrap();
    let (a, b, c) = (
        message.find("### a").unwrap(),
        message.find("### b").unwrap(),
        message.find("### c").unwrap(),
    );
    assert!(a < b && b < c, "in the team's order: {message}");
    assert!(message.contains("A\n") && message.contains("COMPLETED"));
}

#[test]
fn the_failure_policy_decides_what_a_failed_member_means() {
    // all: the parent fails, naming the member.
    let mut run = fan_out_run(serde_json::Value::Null, &["a", "b"]);
    let ids = member_ids(&run);
    child_ended(&mut run, done(&ids[0], "a", "A"), &[], 2).unwrap();
    let (events, _, actions) = recorded(
        child_ended(
            &mut run,
            failed(&ids[1], "b"),
            &[done(&ids[0], "a", "A")],
            3,
        )
        .unwrap(),
    );
    assert_eq!(actions, vec![RunAction::AnnounceTerminal]);
    assert_eq!(run.state(), RunState::Failed);
    let error = run.error.clone().unwrap();
    assert_eq!(error.code, codes::MEMBERS_FAILED);
    assert!(
        error.message.contains("b FAILED (MODEL_ERROR"),
        "{}",
        error.message
    );
    assert_eq!(kinds(&events), ["child_finished", "run_failed"]);

    // best effort: round 2 lists the failed one.
    let mut run = fan_out_run(json!("best_effort"), &["a", "b"]);
    let ids = member_ids(&run);
    child_ended(&mut run, failed(&ids[0], "a"), &[], 2).unwrap();
    let (events, _, actions) = recorded(
        child_ended(
            &mut run,
            done(&ids[1], "b", "B"),
            &[failed(&ids[0], "a")],
            3,
        )
        .unwrap(),
    );
    assert_eq!(actions, vec![RunAction::EnqueueNextStep]);
    assert_eq!(kinds(&events), ["child_finished", "round_started"]);

    // quorum 2 of 3: one failure is fine, two are not.
    for (fails, ok) in [(1, true), (2, false)] {
        let mut run = fan_out_run(json!({"quorum": 2}), &["a", "b", "c"]);
        let ids = member_ids(&run);
        let mut earlier = Vec::new();
        let mut last = vec![];
        for (i, id) in ids.iter().enumerate() {
            let e = if i < fails {
                failed(id, "m")
            } else {
                done(id, "m", "ok")
            };
            last = recorded(child_ended(&mut run, e.clone(), &earlier, 2).unwrap()).2;
            earlier.push(e);
        }
        assert_eq!(run.state() == RunState::Executing, ok, "{fails} failed");
        if !ok {
            assert_eq!(last, vec![RunAction::AnnounceTerminal]);
            assert_eq!(run.error.clone().unwrap().code, codes::QUORUM_NOT_MET);
        }
    }
}

#[test]
fn a_plan_is_answered_with_every_task_in_order() {
    let mut run = waiting_parent(
        vec![
            slot("e0", "m1", RunKind::Executor, Some("p")),
            slot("e1", "m2", RunKind::Executor, Some("p")),
        ],
        16,
    );
    run.team = Some(
        TeamDefinition::from_json(
            "eng",
            &json!({"members": ["m1", "m2"], "strategy": "lead", "lead": "a", "failure_policy": "best_effort"}),
        )
        .unwrap(),
    );
    start_queued(&mut run, 3);
    assert!(!needs_earlier(&run, "e1"));
    let (events, ..) = recorded(child_ended(&mut run, done("e1", "m2", "two"), &[], 3).unwrap());
    assert_eq!(kinds(&events), ["child_finished"], "the plan waits for all");
    assert!(needs_earlier(&run, "e0"));
    let (events, _, actions) =
        recorded(child_ended(&mut run, failed("e0", "m1"), &[done("e1", "m2", "two")], 4).unwrap());
    assert_eq!(actions, vec![RunAction::EnqueueNextStep]);
    let tasks = &events[1].fields()["result"]["tasks"];
    assert_eq!(tasks[0]["agent"], "m1");
    assert_eq!(tasks[0]["state"], "FAILED");
    assert_eq!(tasks[0]["error"]["code"], "MODEL_ERROR");
    assert_eq!(tasks[1]["output"], "two");
    assert_eq!(tasks[1]["task"], "task of m2");
}

#[test]
fn a_child_gets_the_parents_tenant_metadata_and_deadline_never_more() {
    let mut parent = test_run();
    parent.metadata = json!({"ticket": 7});
    parent.budgets.deadline_ms = 50_000;
    let agent: AgentDefinition = serde_json::from_value(json!({
        "name": "b",
        "model": {"provider": "scripted", "model_id": "m", "context_window": 100},
        "system_prompt": "p",
        "limits": {"max_model_turns": 3, "max_tool_calls": 3, "timeout_s": 600},
    }))
    .unwrap();
    let s = slot("c0", "b", RunKind::Delegation, Some("k"));
    let child = new_child(&parent, &s, Some(&agent), 1_000);
    assert_eq!(child.tenant, parent.tenant);
    assert_eq!(child.metadata, parent.metadata);
    assert_eq!(child.parent_run_id.as_deref(), Some("run_1"));
    assert_eq!(child.budgets.deadline_ms, 50_000, "capped by the parent's");
    assert_eq!(
        child.input,
        Payload::Inline {
            text: "task of b".into()
        }
    );
    assert_eq!(child.sandbox_key, None);
    let l = child.lineage();
    assert_eq!(
        (l.depth, l.kind, l.path),
        (
            1,
            RunKind::Delegation,
            vec!["a".to_string(), "b".to_string()]
        )
    );
    let mut member_slot = s.clone();
    member_slot.task = None;
    let member = new_child(&parent, &member_slot, Some(&agent), 1_000);
    assert_eq!(
        member.input, parent.input,
        "a member answers the team's input"
    );
}

/// A slot through its machine: queued, started once, ended once; what
/// it refuses changes nothing.
#[test]
fn a_slot_starts_once_and_ends_once() {
    use crate::collab::children::{ChildOutcome, SlotAction, SlotEvent};
    let mut slot = slot("run_c", "coder", RunKind::Delegation, Some("c1"));
    assert_eq!(slot.state(), SlotState::Queued);
    let actions = slot.apply(SlotEvent::Start, 1).unwrap();
    assert_eq!(
        actions,
        vec![SlotAction::StartRun {
            run_id: slot.run_id.clone()
        }]
    );
    let before = slot.clone();
    assert!(slot.apply(SlotEvent::Start, 2).is_err());
    assert!(slot.apply(SlotEvent::Open { round: 9 }, 2).is_err());
    assert_eq!(slot, before);
    let outcome = ChildOutcome {
        state: RunState::Completed,
        error: None,
    };
    slot.apply(
        SlotEvent::End {
            outcome: outcome.clone(),
        },
        3,
    )
    .unwrap();
    assert_eq!(
        (slot.state(), slot.outcome.clone()),
        (SlotState::Ended, Some(outcome.clone()))
    );
    let ended = slot.clone();
    assert!(slot.apply(SlotEvent::End { outcome }, 4).is_err());
    assert_eq!(slot, ended);
}
