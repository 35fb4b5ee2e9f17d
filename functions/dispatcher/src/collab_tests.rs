//! Collaboration end to end on the in-memory ports: the harness and the
//! dispatcher handed each other's messages until nothing is left (the
//! watchdog's delayed checks set aside). Delegation, fan-out with round 2,
//! a lead's plan, the failure policies, cancelling a parent, duplicated and
//! simultaneous ends. No emulator; `tests/collaboration.rs` is the same on it.

use armada_core::memory::fixtures::{accepted_run, agent, sqs_event};
use armada_domain::collab::RunKind;
use armada_domain::run::Payload;
use armada_domain::team::TeamDefinition;

use super::test_stack::{Stack, TENANT};
use super::*;

async fn stack() -> Stack {
    let s = Stack::new();
    let svc = &s.svc;
    agent(svc, "boss", &["delegate", "current_time"]).await;
    for name in ["a", "b", "c"] {
        agent(svc, name, &["current_time"]).await;
    }
    s
}

/// Asserts that `text` holds every one of `needles`.
fn assert_holds(text: &str, needles: &[&str]) {
    for n in needles {
        assert!(text.contains(n), "{n} in {text}");
    }
}

fn team(body: serde_json::Value) -> Option<TeamDefinition> {
    Some(TeamDefinition::from_json("soc", &body).expect("team"))
}

#[tokio::test]
async fn a_delegation_answers_the_parents_call_and_the_parent_carries_on() {
    let s = stack().await;
    let parent = s
        .start(
            "boss",
            r#"/tool delegate {"agent": "a", "task": "say hi"}"#,
            None,
        )
        .await;
    s.pump().await;
    let done = s.run(&parent.run_id);
    assert_eq!(done.state(), RunState::ClosedCompleted, "{:?}", done.error);
    let out = s.output(&parent.run_id);
    assert!(out.starts_with("tool delegate returned: "), "{out}");
    assert!(out.contains(r#""output":"echo: say hi""#), "{out}");
    let kids = s.children(&parent.run_id);
    assert_eq!(kids.len(), 1);
    let child = &kids[0];
    assert_eq!(child.state(), RunState::ClosedCompleted);
    assert_eq!(child.parent_run_id.as_deref(), Some(parent.run_id.as_str()));
    let l = child.lineage();
    assert_eq!(
        (l.kind, l.depth, l.root_run_id.as_str()),
        (RunKind::Delegation, 1, parent.run_id.as_str())
    );
    assert_eq!(child.sandbox_key, None, "never the parent's sandbox");
    let kinds = s.kinds(&parent.run_id);
    for k in [
        "child_started",
        "child_finished",
        "tool_result",
        "run_completed",
    ] {
        assert!(kinds.contains(&k.to_string()), "{k} in {kinds:?}");
    }
    assert_eq!(done.outstanding_children(), 0);
}

#[tokio::test]
async fn delegations_in_one_turn_run_together_and_refusals_do_not_stop_the_run() {
    let s = stack().await;
    let input = r#"/tools [{"name":"delegate","args":{"agent":"a","task":"one"}},{"name":"delegate","args":{"agent":"b","task":"two"}},{"name":"delegate","args":{"agent":"boss","task":"loop"}},{"name":"delegate","args":{"agent":"nobody","task":"x"}}]"#;
    let parent = s.start("boss", input, None).await;
    // One pass of each: the parent waits, both children are started at once.
    s.harness_pass().await;
    assert_eq!(s.run(&parent.run_id).state(), RunState::AwaitingChildren);
    assert_eq!(s.run(&parent.run_id).outstanding_children(), 2);
    s.pump().await;
    let out = s.output(&parent.run_id);
    assert_holds(
        &out,
        &[
            "echo: one",
            "echo: two",
            "DELEGATION_CYCLE",
            "AGENT_NOT_FOUND",
        ],
    );
    assert_eq!(s.children(&parent.run_id).len(), 2);
}

#[tokio::test]
async fn a_fan_out_runs_every_member_then_round_two_over_all_of_them() {
    let s = stack().await;
    let t = team(
        serde_json::json!({"members": ["a", "b", "c"], "strategy": "fan_out", "max_parallel": 2}),
    );
    let parent = s.start("a", "assess alert 7", t).await;
    let waiting = s.run(&parent.run_id);
    assert_eq!(waiting.state(), RunState::AwaitingChildren);
    assert_eq!(waiting.outstanding_children(), 3);
    let started: Vec<_> = s.children(&parent.run_id);
    assert_eq!(started.len(), 3, "all created");
    s.pump().await;
    let done = s.run(&parent.run_id);
    assert_eq!(done.state(), RunState::ClosedCompleted, "{:?}", done.error);
    let out = s.output(&parent.run_id);
    assert_holds(
        &out,
        &[
            "### a — COMPLETED",
            "### b — COMPLETED",
            "### c — COMPLETED",
            "echo: assess alert 7",
        ],
    );
    assert_eq!(done.usage.model_turns, 1, "one model call: round 2");
    let rounds = s
        .kinds(&parent.run_id)
        .iter()
        .filter(|k| *k == "round_started")
        .count();
    assert_eq!(rounds, 2);
    for kid in s.children(&parent.run_id) {
        assert_eq!(kid.lineage().kind, RunKind::Member);
    }
}

/// A fan-out of three (two at a time) whose functions die once at
/// `point`: it still completes, each child created and started once and
/// round 2 run once.
async fn fan_out_dying_once_at(point: armada_core::faults::FaultPoint) {
    let s = Stack::dying_at(point);
    for name in ["a", "b", "c"] {
        agent(&s.svc, name, &["current_time"]).await;
    }
    let t = team(
        serde_json::json!({"members": ["a", "b", "c"], "strategy": "fan_out", "max_parallel": 2}),
    );
    let parent = s.queue_start("a", "assess alert 8", t).await;
    let died = s.pump_redelivering().await;
    assert_eq!(died, 1, "died once at {}", point.as_str());
    let done = s.run(&parent.run_id);
    assert_eq!(done.state(), RunState::ClosedCompleted, "{:?}", done.error);
    let kinds = s.kinds(&parent.run_id);
    let n = |k: &str| kinds.iter().filter(|x| *x == k).count();
    assert_eq!(
        (n("round_started"), n("child_started"), n("child_finished")),
        (2, 3, 3),
        "{kinds:?}"
    );
    for kid in s.children(&parent.run_id) {
        assert_eq!(kid.state(), RunState::ClosedCompleted);
        let kinds = s.kinds(&kid.run_id);
        assert_eq!(kinds.iter().filter(|k| *k == "model_reply").count(), 1);
    }
}

#[tokio::test]
async fn a_dispatcher_killed_after_starting_children_leaves_their_record_to_the_redelivery() {
    fan_out_dying_once_at(armada_core::faults::FaultPoint::AfterChildSpawn).await;
}

#[tokio::test]
async fn a_harness_killed_after_noting_childrens_ends_leaves_round_two_to_the_redelivery() {
    fan_out_dying_once_at(armada_core::faults::FaultPoint::AfterChildEnds).await;
}

#[tokio::test]
async fn a_failing_member_fails_the_team_under_all_and_is_listed_under_best_effort() {
    for (policy, ends) in [
        ("all", RunState::ClosedFailed),
        ("best_effort", RunState::ClosedCompleted),
    ] {
        let s = stack().await;
        let t = team(
            serde_json::json!({"members": ["a", "b"], "strategy": "fan_out", "failure_policy": policy}),
        );
        // Each member answers the team's input: "/fail" makes them all fail
        // ... so fail only b, by making its model fail.
        let parent = s.start("a", "look", t).await;
        let b_child = s.children(&parent.run_id)[1].run_id.clone();
        if let Some(r) = s.mem.state().runs.get_mut(&b_child) {
            r.input = Payload::Inline {
                text: "/fail down".into(),
            };
        }
        s.pump().await;
        let done = s.run(&parent.run_id);
        assert_eq!(done.state(), ends, "{policy}: {:?}", done.error);
        if policy == "all" {
            let e = done.error.expect("an error");
            assert_eq!(e.code, "MEMBERS_FAILED");
            assert!(e.message.contains("b FAILED (MODEL_ERROR"), "{}", e.message);
        } else {
            let out = s.output(&parent.run_id);
            assert!(
                out.contains("### b — FAILED") && out.contains("(no answer: FAILED (MODEL_ERROR"),
                "{out}"
            );
        }
    }
}

#[tokio::test]
async fn a_lead_plans_executors_run_in_parallel_and_the_lead_consolidates() {
    let s = stack().await;
    let t = team(serde_json::json!({"members": ["a", "b"], "strategy": "lead", "lead": "boss"}));
    let input = r#"/tool plan {"tasks": [{"agent": "a", "task": "part one"}, {"agent": "b", "task": "part two"}]}"#;
    let parent = s.start("boss", input, t).await;
    s.harness_pass().await;
    for m in s.mem.take_dispatch() {
        s.to_dispatcher(&m).await;
    }
    // Both executors were started before either ended.
    let kids = s.children(&parent.run_id);
    assert_eq!(kids.len(), 2);
    let starts: Vec<_> = s
        .mem
        .take_dispatch()
        .into_iter()
        .filter(|m| matches!(m, DispatchMessage::StartRun { .. }))
        .collect();
    assert_eq!(starts.len(), 2);
    for m in starts {
        s.to_dispatcher(&m).await;
    }
    s.pump().await;
    let out = s.output(&parent.run_id);
    assert!(out.starts_with("tool plan returned: "), "{out}");
    assert!(
        out.contains("echo: part one") && out.contains("echo: part two"),
        "{out}"
    );
    assert_eq!(
        s.run(&parent.run_id).usage.model_turns,
        2,
        "planned, then consolidated"
    );
    assert!(s
        .children(&parent.run_id)
        .iter()
        .all(|k| k.lineage().kind == RunKind::Executor));
}

#[tokio::test]
async fn cancelling_a_parent_cancels_its_children_and_theirs() {
    let s = stack().await;
    let t = team(serde_json::json!({"members": ["a", "b", "c"], "strategy": "fan_out"}));
    let parent = s.start("a", "/sleep 1 slow", t).await;
    // The members exist and were started; cancel before any of them runs.
    let mut p = s.run(&parent.run_id);
    let prev = p.stamp();
    p.apply_from_outside(RunEvent::CancelRequested, 5)
        .expect("cancellable");
    s.svc.runs.save(prev, &p, &[], vec![]).await.expect("saved");
    s.to_dispatcher(&DispatchMessage::RunTerminal {
        run_id: parent.run_id.clone(),
        tenant: TENANT.into(),
    })
    .await;
    s.pump().await;
    assert_eq!(s.run(&parent.run_id).state(), RunState::ClosedCancelled);
    let kids = s.children(&parent.run_id);
    assert_eq!(kids.len(), 3);
    for k in kids {
        assert_eq!(k.state(), RunState::ClosedCancelled, "{}", k.run_id);
        assert_eq!(
            k.usage.model_turns, 0,
            "no child ran after its parent ended"
        );
    }
}

#[tokio::test]
async fn duplicated_and_simultaneous_ends_settle_the_round_exactly_once() {
    let s = stack().await;
    let t = team(serde_json::json!({"members": ["a", "b", "c"], "strategy": "fan_out"}));
    let parent = s.start("a", "hello", t).await;
    // Run every member to its end without settling any of them.
    let ids: Vec<String> = s
        .children(&parent.run_id)
        .into_iter()
        .map(|k| k.run_id)
        .collect();
    for _ in 0..10 {
        s.harness_pass().await;
        let starts: Vec<_> = s
            .mem
            .take_dispatch()
            .into_iter()
            .filter(|m| matches!(m, DispatchMessage::StartRun { .. }))
            .collect();
        for m in starts {
            s.to_dispatcher(&m).await;
        }
    }
    assert!(ids
        .iter()
        .all(|id| s.run(id).state() == RunState::Completed));
    let terminal = |id: &String| DispatchMessage::RunTerminal {
        run_id: id.clone(),
        tenant: TENANT.into(),
    };
    // All three at once, twice each, in no particular order.
    let msgs: Vec<DispatchMessage> = [2, 0, 1, 0, 2, 1]
        .iter()
        .map(|i| terminal(&ids[*i]))
        .collect();
    let deliveries = msgs.iter().map(|m| s.to_dispatcher(m));
    futures::future::join_all(deliveries).await;
    // Each end went to the parent's group: all of them, each twice and out
    // of order, arrive in one batch.
    let mut notes = s.mem.take_harness();
    assert_eq!(notes.len(), 3, "one note per child: {notes:?}");
    notes.extend(notes.clone());
    notes.reverse();
    let bodies: Vec<String> = notes
        .iter()
        .map(|m| serde_json::to_string(m).unwrap_or_default())
        .collect();
    let event = sqs_event(&s.svc.cfg.harness_queue, &bodies);
    s.harness.handle_event(event).await.expect("handled");
    let p = s.run(&parent.run_id);
    assert_eq!(
        (p.state(), p.outstanding_children(), p.step),
        (RunState::Executing, 0, 1)
    );
    let steps = s.mem.take_harness();
    assert_eq!(steps.len(), 1, "round 2 triggered once: {steps:?}");
    let kinds = s.kinds(&parent.run_id);
    let count = |k: &str| kinds.iter().filter(|x| *x == k).count();
    assert_eq!((count("child_finished"), count("round_started")), (3, 2));
    // A late duplicate, on its own, notes nothing more.
    s.to_harness(&notes[0]).await;
    assert_eq!(s.kinds(&parent.run_id).len(), kinds.len());
}

impl Stack {
    /// Starts a relay chain of `steps` as ingress would.
    async fn start_chain(&self, steps: &[&str], input: &str) -> Run {
        let first = self.start_prepared(steps[0], input, |run| {
            let chain_id = armada_core::clock::new_id("chain");
            run.run_id = chain::step_run_id(&chain_id, 0);
            run.chain = Some(chain::ChainLink {
                chain_id,
                index: 0,
                steps: steps.iter().map(|s| s.to_string()).collect(),
                callback_url: None,
                team: None,
            });
        });
        first.await
    }

    async fn start_prepared(&self, agent_name: &str, input: &str, f: impl FnOnce(&mut Run)) -> Run {
        let def = self.svc.registry.agent(agent_name).await.ok().flatten();
        let accepted = accepted_run(&self.svc, TENANT, &def.expect("agent"), input).await;
        let mut run = accepted.clone();
        f(&mut run);
        self.mem.state().runs.remove(&accepted.run_id);
        // Its marker among the tenant's active Runs follows its new id.
        {
            let mut st = self.mem.state();
            let key = (TENANT.to_string(), accepted.run_id.clone());
            if let Some(until) = st.active_runs.remove(&key) {
                st.active_runs
                    .insert((TENANT.to_string(), run.run_id.clone()), until);
            }
        }
        self.mem
            .state()
            .runs
            .insert(run.run_id.clone(), run.clone());
        self.to_dispatcher(&DispatchMessage::StartRun {
            run_id: run.run_id.clone(),
            tenant: TENANT.into(),
        })
        .await;
        run
    }

    fn chain_view(&self, first: &Run) -> (chain::ChainState, Vec<String>) {
        let link = first.chain.clone().expect("a chain step");
        let runs: Vec<Option<Run>> = (0..link.steps.len())
            .map(|i| {
                self.mem
                    .state()
                    .runs
                    .get(&chain::step_run_id(&link.chain_id, i))
                    .cloned()
            })
            .collect();
        let refs: Vec<Option<&Run>> = runs.iter().map(Option::as_ref).collect();
        let (state, steps) = chain::view(&link.steps, &refs);
        (state, steps.into_iter().map(|s| s.state).collect())
    }
}

use armada_domain::collab::chain;
use armada_domain::run::EventKind;
use armada_domain::run::RunState;

#[tokio::test]
async fn a_relay_chain_hands_each_output_to_the_next_step() {
    let s = stack().await;
    let first = s.start_chain(&["a", "b", "c"], "draft it").await;
    s.pump().await;
    let (state, steps) = s.chain_view(&first);
    assert_eq!(state, chain::ChainState::Completed);
    assert_eq!(steps, ["COMPLETED", "COMPLETED", "COMPLETED"]);
    let link = first.chain.clone().expect("link");
    let last = chain::step_run_id(&link.chain_id, 2);
    assert_eq!(s.output(&last), "echo: echo: echo: draft it");
    let third = s.run(&last);
    assert_eq!(third.parent_run_id, None, "peers, no parent");
    assert_eq!(third.chain.as_ref().map(|c| c.remaining().len()), Some(0));
    assert_eq!(third.lineage().kind, RunKind::ChainStep);
    assert!(s
        .kinds(&first.run_id)
        .contains(&"chain_step_started".to_string()));
}

/// A relay chain holds one place among its tenant's active Runs while any
/// of its steps runs: each step, settled, gives its marker back and the
/// step it starts writes its own.
#[tokio::test]
async fn a_relay_chain_counts_as_one_active_run_from_step_to_step() {
    let s = stack().await;
    let first = s.start_chain(&["a", "b", "c"], "draft it").await;
    let held = || {
        s.mem
            .state()
            .active_runs
            .keys()
            .map(|(_, run)| run.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(held(), std::slice::from_ref(&first.run_id));
    s.harness_pass().await;
    for m in s.mem.take_dispatch() {
        s.to_dispatcher(&m).await;
    }
    let link = first.chain.clone().expect("link");
    assert_eq!(s.run(&first.run_id).state(), RunState::ClosedCompleted);
    assert_eq!(held(), [chain::step_run_id(&link.chain_id, 1)]);
    s.pump().await;
    assert!(held().is_empty(), "{:?}", held());
}

#[tokio::test]
async fn a_failed_step_breaks_the_chain_and_the_rest_is_skipped() {
    let s = stack().await;
    let first = s.start_chain(&["a", "b", "c"], "/fail nope").await;
    s.pump().await;
    let (state, steps) = s.chain_view(&first);
    assert_eq!(state, chain::ChainState::Failed);
    assert_eq!(steps, ["FAILED", "SKIPPED", "SKIPPED"]);
    let broken = s.mem.state().events[&first.run_id]
        .values()
        .find(|e| e.kind() == EventKind::ChainBroken)
        .cloned()
        .expect("chain_broken");
    assert_eq!(broken.fields()["skipped"], serde_json::json!(["b", "c"]));
}

#[tokio::test]
async fn a_child_resumes_a_finished_peer_or_is_refused_closed() {
    let s = stack().await;
    let source = s.start("a", "remember: blue", None).await;
    let big = s.start("a", &"word ".repeat(6_000), None).await;
    s.pump().await;
    assert_eq!(s.run(&source.run_id).state(), RunState::ClosedCompleted);
    let resume = |agent: &str, from: &str| serde_json::json!({"name": "delegate", "args": {"agent": agent, "task": "/recall", "resume_from": from}});
    let calls = serde_json::json!([
        resume("a", &source.run_id),
        resume("b", &source.run_id),
        resume("a", &big.run_id),
        resume("a", "run_nope"),
    ]);
    let parent = s.start("boss", &format!("/tools {calls}"), None).await;
    s.pump().await;
    let out = s.output(&parent.run_id);
    // The resumed child recalls its source's conversation.
    assert!(out.contains(r#""output":"remember: blue""#), "{out}");
    assert_holds(
        &out,
        &[
            "RESUME_IDENTITY_MISMATCH",
            "RESUME_TOO_LARGE",
            "RESUME_NOT_FOUND",
        ],
    );
    let kids = s.children(&parent.run_id);
    assert_eq!(kids.len(), 1, "refused resumes start nothing");
    let child = &kids[0];
    assert_eq!(
        child.identity,
        s.run(&source.run_id).identity,
        "the source's persona and model"
    );
    assert!(s.kinds(&child.run_id).contains(&"resumed_from".to_string()));

    // A source whose events are gone cannot be read: it fails closed.
    s.mem.state().events.remove(&source.run_id);
    let parent = s
        .start(
            "boss",
            &format!(
                "/tools {}",
                serde_json::json!([resume("a", &source.run_id)])
            ),
            None,
        )
        .await;
    s.pump().await;
    assert!(s.output(&parent.run_id).contains("RESUME_UNREADABLE"));
    assert!(s.children(&parent.run_id).is_empty());
}

#[tokio::test]
async fn a_start_retried_after_the_expansion_committed_still_starts_the_members() {
    let s = stack().await;
    let def = s
        .svc
        .registry
        .agent("a")
        .await
        .ok()
        .flatten()
        .expect("agent");
    let mut run = accepted_run(&s.svc, TENANT, &def, "hi").await;
    run.team = team(serde_json::json!({"members": ["a", "b"], "strategy": "fan_out"}));
    // The expansion committed, then the handler died before any child.
    let prev = run.stamp();
    let events = armada_domain::collab::children::expand_team(
        &mut run,
        s.svc.cfg.max_descendants_per_root,
        1,
    )
    .expect("expands");
    s.svc
        .runs
        .save(prev, &run, &events, vec![])
        .await
        .expect("saved");
    assert_eq!(s.mem.state().runs.len(), 1, "no child exists yet");
    s.to_dispatcher(&DispatchMessage::StartRun {
        run_id: run.run_id.clone(),
        tenant: TENANT.into(),
    })
    .await;
    assert_eq!(s.children(&run.run_id).len(), 2, "created");
    s.pump().await;
    assert_eq!(s.run(&run.run_id).state(), RunState::ClosedCompleted);
}

/// The Runs below one root are bounded as a whole: with a bound of 3 a
/// root's two children take 2 and leave each a share of 0, so the child
/// that delegates further is refused `TOO_MANY_DESCENDANTS` (a tool result
/// its model reads, passed up to the root), and a fan-out team of more
/// members than the bound fails with that code instead of expanding.
#[tokio::test]
async fn a_root_tree_holds_no_more_runs_than_the_bound() {
    let s = Stack::with(|c| c.max_descendants_per_root = 3);
    agent(&s.svc, "boss", &["delegate", "current_time"]).await;
    agent(&s.svc, "helper", &["delegate"]).await;
    for name in ["a", "b", "c"] {
        agent(&s.svc, name, &["current_time"]).await;
    }
    let inner = serde_json::json!([
        {"name": "delegate", "args": {"agent": "a", "task": "x"}},
        {"name": "delegate", "args": {"agent": "b", "task": "y"}},
    ]);
    let outer = serde_json::json!([
        {"name": "delegate", "args": {"agent": "helper", "task": format!("/tools {inner}")}},
        {"name": "delegate", "args": {"agent": "c", "task": "z"}},
    ]);
    let root = s.start("boss", &format!("/tools {outer}"), None).await;
    s.pump().await;
    let done = s.run(&root.run_id);
    assert_eq!(done.state(), RunState::ClosedCompleted, "{:?}", done.error);
    assert_holds(
        &s.output(&root.run_id),
        &["TOO_MANY_DESCENDANTS", "echo: z"],
    );
    let kids = s.children(&root.run_id);
    assert_eq!(kids.len(), 2);
    let helper = kids.iter().find(|k| k.agent == "helper").expect("helper");
    assert!(s.children(&helper.run_id).is_empty(), "helper started none");
    assert_eq!(s.mem.state().runs.len(), 3, "the root and its two children");

    let team_run = s
        .start(
            "a",
            "hi",
            team(serde_json::json!({"members": ["a", "b", "c", "boss"], "strategy": "fan_out"})),
        )
        .await;
    s.pump().await;
    let failed = s.run(&team_run.run_id);
    assert_eq!(failed.state(), RunState::ClosedFailed);
    let error = failed.error.expect("an error");
    assert_eq!(error.code, "TOO_MANY_DESCENDANTS", "{}", error.message);
    assert!(s.children(&team_run.run_id).is_empty());
}
