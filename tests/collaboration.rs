//! Agents working together on the real emulator (issue 8): delegation (C),
//! fan-out teams with round 2 and their failure policies (D), lead-driven
//! teams (G), cancelling a parent, cycles, depth, a child that times out,
//! duplicated child ends and a 25-member team.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use armada_api::collab::{ChildView, ChildrenView, TraceEntry, TraceView};
use armada_domain::collab::RunKind;
use armada_domain::messages::DispatchMessage;
use armada_tests::wait::eventually;
use armada_tests::{
    error_code, error_message, outcome, params, EventKind, LogEvent, RunState, RunView, TestStack,
};

/// Registers a scripted agent with these skills and limits.
async fn put_agent(t: &TestStack, name: &str, skills: &[&str], timeout_s: u32) {
    let def = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 16384},
        "system_prompt": format!("You are {name}."),
        "skills": skills,
        "limits": {"max_model_turns": 6, "max_tool_calls": 12, "timeout_s": timeout_s}
    });
    t.admin
        .call(Method::PUT, &format!("/v1/agents/{name}"), Some(&def), true)
        .await
        .unwrap();
}

/// An agent whose model endpoint refuses connections: its Runs fail with
/// MODEL_ERROR after the model's retries.
async fn put_broken_agent(t: &TestStack, name: &str) {
    let def = json!({
        "model": {"provider": "openai", "model_id": "x", "context_window": 4096,
                  "base_url": "http://127.0.0.1:9/v1"},
        "system_prompt": "unreachable",
    });
    t.admin
        .call(Method::PUT, &format!("/v1/agents/{name}"), Some(&def), true)
        .await
        .unwrap();
}

async fn put_team(t: &TestStack, name: &str, body: Value) {
    t.admin
        .call(Method::PUT, &format!("/v1/teams/{name}"), Some(&body), true)
        .await
        .unwrap();
}

/// Starts a Run from a body and waits for it to end.
async fn run_body(t: &TestStack, body: Value, wait_s: u64) -> (String, RunView) {
    let v = t.client.post("/v1/runs", &body).await.unwrap();
    let run_id = v["run_id"].as_str().unwrap().to_string();
    let run = t
        .client
        .wait_run(&run_id, Duration::from_secs(wait_s))
        .await
        .unwrap();
    (run_id, run)
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// A Run's tree, as `GET /v1/runs/{id}/trace` shows it.
async fn trace_of(t: &TestStack, run_id: &str) -> TraceView {
    let path = format!("/v1/runs/{run_id}/trace");
    t.client.typed(Method::GET, &path, None).await.unwrap()
}

/// A Run's children, as `GET /v1/runs/{id}/children` shows them.
async fn children_of(t: &TestStack, run_id: &str) -> ChildrenView {
    let path = format!("/v1/runs/{run_id}/children");
    t.client.typed(Method::GET, &path, None).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_c_delegation_in_parallel_with_refusals_and_its_trace() {
    let t = TestStack::start().await;
    put_agent(&t, "boss", &["delegate", "current_time"], 120).await;
    let input = json!([
        {"name": "delegate", "args": {"agent": "assistant", "task": "first part"}},
        {"name": "delegate", "args": {"agent": "researcher", "task": "second part"}},
        {"name": "delegate", "args": {"agent": "boss", "task": "loop back"}},
        {"name": "delegate", "args": {"agent": "nobody", "task": "x"}},
    ]);
    let body =
        json!({"agent": "boss", "input": format!("/tools {input}"), "metadata": {"ticket": 42}});
    let (run_id, run) = run_body(&t, body, 60).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let out = run.output.clone().unwrap_or_default();
    for needle in [
        "echo: first part",
        "echo: second part",
        "DELEGATION_CYCLE",
        "boss → boss",
        "AGENT_NOT_FOUND",
    ] {
        assert!(out.contains(needle), "{needle} in {out}");
    }
    assert_eq!(run.outstanding_children, Some(0));
    assert_eq!(run.kind, Some(RunKind::Root));

    let trace = trace_of(&t, &run_id).await;
    assert_eq!(trace.root_run_id, run_id);
    let runs = &trace.runs;
    assert_eq!(runs.len(), 3, "{trace:?}");
    assert_eq!(runs[0].run_id, run_id);
    for (child, agent) in runs[1..].iter().zip(["assistant", "researcher"]) {
        assert_eq!(child.agent, agent);
        assert_eq!(child.kind, RunKind::Delegation);
        assert_eq!(child.depth, 1);
        assert_eq!(child.path, ["boss", agent]);
        assert_eq!(child.parent_run_id.as_deref(), Some(run_id.as_str()));
        assert!(child.ended_at.is_some(), "{child:?}");
        // The child inherits the parent's metadata, and the trace reads
        // the same from the child's side.
        let c = t.client.run(&child.run_id).await.unwrap();
        assert_eq!(c.metadata.unwrap_or_default()["ticket"], 42);
        let from_child = trace_of(&t, &child.run_id).await;
        assert_eq!(from_child.root_run_id, run_id);
    }
    let children = children_of(&t, &run_id).await;
    assert_eq!(children.children.len(), 2);
    let types = t.event_types(&run_id).await;
    for k in ["child_started", "child_finished", "tool_result"] {
        assert!(types.iter().any(|x| x == k), "{k} in {types:?}");
    }
    // Another tenant sees none of it.
    let other = t.admin.post("/v1/tenants/other/keys", &json!({})).await;
    let key = other.map(|v| text(&v["key"])).unwrap_or_default();
    let (status, _) = t
        .raw(
            Method::GET,
            &format!("/v1/runs/{run_id}/trace"),
            Some(&key),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 404);
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delegation_depth_is_bounded_and_a_child_that_times_out_is_an_error_result() {
    let t = TestStack::start_with(params(&[("MaxDelegationDepth", "1")]), None).await;
    put_agent(&t, "boss", &["delegate"], 120).await;
    put_agent(&t, "helper", &["delegate"], 120).await;
    put_agent(&t, "slowpoke", &["current_time"], 2).await;
    // boss → helper → assistant: the second level is beyond depth 1.
    let inner = json!({"agent": "assistant", "task": "hi"}).to_string();
    let outer = json!({"agent": "helper", "task": format!("/tool delegate {inner}")});
    let body = json!({"agent": "boss", "input": format!("/tool delegate {outer}")});
    let (run_id, run) = run_body(&t, body, 60).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let out = run.output.clone().unwrap_or_default();
    assert!(out.contains("DELEGATION_DEPTH"), "{out}");
    let trace = trace_of(&t, &run_id).await;
    assert_eq!(trace.runs.len(), 2, "{trace:?}");

    // A child whose own budget runs out: its parent hears CHILD_TIMED_OUT.
    let task = "/sleep 2500 /tool current_time {}";
    let args = json!({"agent": "slowpoke", "task": task});
    let body = json!({"agent": "boss", "input": format!("/tool delegate {args}")});
    let (_, run) = run_body(&t, body, 60).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let out = run.output.clone().unwrap_or_default();
    assert!(out.contains("CHILD_TIMED_OUT"), "{out}");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_d_fan_out_round_two_and_each_failure_policy() {
    let t = TestStack::start().await;
    put_broken_agent(&t, "broken").await;
    put_team(
        &t,
        "soc",
        json!({"members": ["assistant", "researcher"], "strategy": "fan_out"}),
    )
    .await;
    // By mention: the team's Run is its aggregator's (the first member).
    let (run_id, run) = run_body(&t, json!({"input": "@team:soc triage alert 7"}), 60).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert_eq!(run.agent.as_str(), "assistant");
    assert_eq!(run.team.as_deref(), Some("soc"));
    assert_eq!(run.input.as_deref().unwrap_or_default(), "triage alert 7");
    let out = run.output.clone().unwrap_or_default();
    for m in [
        "### assistant — COMPLETED",
        "### researcher — COMPLETED",
        "echo: triage alert 7",
    ] {
        assert!(out.contains(m), "{m} in {out}");
    }
    assert_eq!(
        run.usage.unwrap_or_default().model_turns,
        1,
        "the aggregator answers once"
    );
    // Duplicate child ends after the fact change nothing.
    let children = children_of(&t, &run_id).await;
    let ids: Vec<String> = children.children.iter().map(|c| c.run_id.clone()).collect();
    assert_eq!(ids.len(), 2);
    t.wait_closed(&run_id).await;
    for id in ids.iter().chain(ids.iter()) {
        let msg = DispatchMessage::RunTerminal {
            run_id: id.clone(),
            tenant: t.stack.tenant.clone(),
        };
        t.stack.svc.queues.send_dispatch(&msg).await.unwrap();
    }
    // Handled, all of them: the duplicates changed nothing.
    armada_tests::wait::drained(&t).await;
    let again = t.client.get(&format!("/v1/runs/{run_id}")).await.unwrap();
    assert_eq!(again["usage"]["model_turns"], 1);
    let rounds = t.event_types(&run_id).await;
    assert_eq!(rounds.iter().filter(|k| *k == "round_started").count(), 2);
    assert_eq!(rounds.iter().filter(|k| *k == "child_finished").count(), 2);

    // One member fails: each policy decides.
    let cases = [
        (json!("all"), "FAILED", Some("MEMBERS_FAILED")),
        (json!("best_effort"), "COMPLETED", None),
        (json!({"quorum": 1}), "COMPLETED", None),
        (json!({"quorum": 2}), "FAILED", Some("QUORUM_NOT_MET")),
    ];
    for (i, (policy, expected, code)) in cases.into_iter().enumerate() {
        let name = format!("mixed{i}");
        let team = json!({"members": ["assistant", "broken"], "strategy": "fan_out", "failure_policy": policy});
        put_team(&t, &name, team).await;
        let (_, run) = run_body(&t, json!({"team": name, "input": "check"}), 90).await;
        assert_eq!(outcome(&run), expected, "{policy:?}: {run:?}");
        match code {
            Some(c) => {
                assert_eq!(
                    run.error.as_ref().map_or("", |e| e.code.as_str()),
                    c,
                    "{run:?}"
                );
                assert!(
                    run.error
                        .as_ref()
                        .map_or("", |e| e.message.as_str())
                        .contains("broken"),
                    "{run:?}"
                );
            }
            None => assert!(
                run.output
                    .clone()
                    .unwrap_or_default()
                    .contains("### broken — FAILED"),
                "{run:?}"
            ),
        }
    }
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_g_a_lead_plans_executors_run_in_parallel_then_it_consolidates() {
    let t = TestStack::start().await;
    put_agent(&t, "planner", &["current_time"], 120).await;
    put_team(
        &t,
        "eng",
        json!({"members": ["assistant", "researcher"], "strategy": "lead", "lead": "planner"}),
    )
    .await;
    let plan = json!({"tasks": [
        {"agent": "assistant", "task": "/sleep 1500 write the intro"},
        {"agent": "researcher", "task": "/sleep 1500 find sources"},
    ]});
    let body = json!({"team": "eng", "input": format!("/tool plan {plan}")});
    let (run_id, run) = run_body(&t, body, 60).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert_eq!(run.agent.as_str(), "planner");
    let out = run.output.clone().unwrap_or_default();
    assert!(out.starts_with("tool plan returned: "), "{out}");
    assert!(
        out.contains("echo: write the intro") && out.contains("echo: find sources"),
        "{out}"
    );
    assert_eq!(
        run.usage.unwrap_or_default().model_turns,
        2,
        "planned, then consolidated"
    );
    let trace = trace_of(&t, &run_id).await;
    let runs = &trace.runs;
    assert_eq!(runs.len(), 3);
    assert!(runs[1..].iter().all(|r| r.kind == RunKind::Executor));
    // In parallel: each executor started before the other ended.
    let (a, b) = (&runs[1], &runs[2]);
    let ended = |r: &TraceEntry| r.ended_at.clone().expect("ended");
    assert!(a.created_at < ended(b), "{trace:?}");
    assert!(b.created_at < ended(a), "{trace:?}");
    // Only a lead's Run plans.
    let body = json!({"agent": "planner", "input": format!("/tool plan {plan}")});
    let (_, run) = run_body(&t, body, 60).await;
    assert!(
        run.output.clone().unwrap_or_default().contains("DENIED"),
        "{run:?}"
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_a_parent_cancels_its_five_running_children() {
    // Enough pollers for the five to be in their steps together.
    let t = TestStack::start_concurrent(6).await;
    let members: Vec<String> = (1..=5).map(|i| format!("m{i}")).collect();
    for m in &members {
        put_agent(&t, m, &[], 120).await;
    }
    put_team(
        &t,
        "five",
        json!({"members": members, "strategy": "fan_out"}),
    )
    .await;
    let v = t
        .client
        .post(
            "/v1/runs",
            &json!({"team": "five", "input": "/sleep 8000 slow"}),
        )
        .await
        .unwrap();
    let run_id = text(&v["run_id"]);
    eventually("every member to be started", || async {
        let c = children_of(&t, &run_id).await;
        let executing = |k: &&ChildView| k.state.as_deref() == Some("EXECUTING");
        c.children.iter().filter(executing).count() == 5
    })
    .await;
    t.client
        .post(&format!("/v1/runs/{run_id}/cancel"), &json!({}))
        .await
        .unwrap();
    assert_eq!(
        t.wait_closed(&run_id).await.state,
        RunState::ClosedCancelled
    );
    let c = children_of(&t, &run_id).await;
    for k in &c.children {
        let child = t.wait_closed(&k.run_id).await;
        assert_eq!(child.state, RunState::ClosedCancelled, "{child:?}");
        assert!(child.output.is_none(), "{child:?}");
    }
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_team_of_25_members_queues_beyond_max_parallel_and_aggregates_all() {
    let t = TestStack::start().await;
    let members: Vec<String> = (0..25).map(|i| format!("member-{i}")).collect();
    for m in &members {
        put_agent(&t, m, &[], 120).await;
    }
    put_team(
        &t,
        "crowd",
        json!({"members": members, "strategy": "fan_out"}),
    )
    .await;
    let (run_id, run) = run_body(&t, json!({"team": "crowd", "input": "count off"}), 180).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let out = run.output.clone().unwrap_or_default();
    for m in &members {
        assert!(out.contains(&format!("### {m} — COMPLETED")), "{m}");
    }
    let kinds = t.event_types(&run_id).await;
    assert_eq!(kinds.iter().filter(|k| *k == "child_started").count(), 25);
    assert_eq!(kinds.iter().filter(|k| *k == "child_finished").count(), 25);
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_collaboration_input_is_refused_naming_what_is_wrong() {
    let t = TestStack::start().await;
    let key = t.stack.tenant_key.clone();
    let post = |body: Value| {
        let t = &t;
        let key = key.clone();
        async move {
            t.raw(
                Method::POST,
                "/v1/runs",
                Some(&key),
                Some(&body.to_string()),
                &[],
            )
            .await
        }
    };
    let (status, body) = post(json!({"team": "ghosts", "input": "x"})).await;
    assert_eq!(
        (status, error_code(&body)),
        (404, Some("NOT_FOUND".to_string()))
    );
    assert!(error_message(&body).contains("ghosts"));
    let (status, body) = post(json!({"input": "@team:ghosts x"})).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = post(json!({"chain": [], "input": "x"})).await;
    assert_eq!(status, 400, "{body}");
    assert!(error_message(&body).starts_with("chain"), "{body}");
    let steps: Vec<&str> = vec!["assistant"; 17];
    let (status, _) = post(json!({"chain": steps, "input": "x"})).await;
    assert_eq!(status, 400);
    // A team whose member was deleted since it was defined.
    put_agent(&t, "temp", &[], 60).await;
    put_team(
        &t,
        "shaky",
        json!({"members": ["assistant", "temp"], "strategy": "fan_out"}),
    )
    .await;
    t.admin
        .call(Method::DELETE, "/v1/agents/temp", None, true)
        .await
        .unwrap();
    let (status, body) = post(json!({"team": "shaky", "input": "x"})).await;
    assert_eq!(status, 404, "{body}");
    assert!(error_message(&body).contains("temp"), "{body}");
    for (team, field) in [
        (json!({"members": [], "strategy": "fan_out"}), "members"),
        (
            json!({"members": ["assistant"], "strategy": "lead"}),
            "lead",
        ),
    ] {
        let (status, body) = t
            .raw(
                Method::PUT,
                "/v1/teams/bad",
                Some(&t.stack.admin_key),
                Some(&team.to_string()),
                &[],
            )
            .await;
        assert_eq!(status, 400, "{body}");
        assert!(error_message(&body).starts_with(field), "{body}");
    }
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resume_takes_over_a_finished_peers_transcript_or_refuses_closed() {
    let t = TestStack::start().await;
    put_agent(&t, "boss", &["delegate"], 120).await;
    put_agent(&t, "scribe", &[], 120).await;
    let (source, _) = t.ask("scribe", "remember: blue").await;
    // 60,000 characters: about 15,000 tokens, over 80% of 16,384.
    let (big, _) = t.ask("scribe", &"word ".repeat(12_000)).await;
    // An input over 32 KiB lives in the payload bucket: lose it.
    let (lost, _) = t.ask("scribe", &"gone ".repeat(7_000)).await;
    t.stack
        .aws
        .s3
        .delete_object()
        .bucket(&t.stack.svc.cfg.payload_bucket)
        .key(format!("inputs/{}/{lost}", t.stack.tenant))
        .send()
        .await
        .unwrap();
    let resume = |agent: &str, from: &str| json!({"name": "delegate", "args": {"agent": agent, "task": "/recall", "resume_from": from}});
    let mut pinned = resume("scribe", &source);
    pinned["args"]["model"] = json!("gpt-9");
    let calls = json!([
        pinned,
        resume("assistant", &source),
        resume("scribe", &big),
        resume("scribe", &lost),
    ]);
    let body = json!({"agent": "boss", "input": format!("/tools {calls}")});
    let (run_id, run) = run_body(&t, body, 60).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let out = run.output.clone().unwrap_or_default();
    assert!(out.contains(r#""output":"remember: blue""#), "{out}");
    for code in [
        "RESUME_IDENTITY_MISMATCH",
        "RESUME_TOO_LARGE",
        "RESUME_UNREADABLE",
    ] {
        assert!(out.contains(code), "{code} in {out}");
    }
    let children = children_of(&t, &run_id).await;
    let kids = &children.children;
    assert_eq!(kids.len(), 1, "{children:?}");
    let resumed = t
        .event(&kids[0].run_id, EventKind::ResumedFrom)
        .await
        .expect("a resumed_from event");
    let LogEvent::ResumedFrom {
        source_run_id,
        model,
        model_ignored,
        ..
    } = resumed
    else {
        unreachable!("an event of the kind asked for")
    };
    assert_eq!(source_run_id, source);
    assert_eq!(model, "scripted-1");
    assert_eq!(model_ignored.as_deref(), Some("gpt-9"));

    // A new persona is another identity: its old Runs cannot be resumed.
    let def = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 16384},
        "system_prompt": "You are someone else now.",
    });
    t.admin
        .call(Method::PUT, "/v1/agents/scribe", Some(&def), true)
        .await
        .unwrap();
    let body =
        json!({"agent": "boss", "input": format!("/tools {}", json!([resume("scribe", &source)]))});
    let (_, run) = run_body(&t, body, 60).await;
    assert!(
        run.output
            .clone()
            .unwrap_or_default()
            .contains("RESUME_IDENTITY_MISMATCH"),
        "{run:?}"
    );
    t.stack.stop().await;
}

/// The Runs below one root are bounded as a whole, across levels: with
/// `MaxDescendantsPerRoot` 3, the root's two children cost 2 of its 3 and
/// are given a share of 0 each, so the child that delegates on is answered
/// `TOO_MANY_DESCENDANTS` (its model reads it, and so does the root's);
/// the tree is the root and its two children. A fan-out team larger than
/// the bound is refused before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_roots_descendants_are_bounded_across_levels() {
    let t = TestStack::start_with(params(&[("MaxDescendantsPerRoot", "3")]), None).await;
    put_agent(&t, "boss", &["delegate"], 120).await;
    put_agent(&t, "helper", &["delegate"], 120).await;
    let inner = json!([
        {"name": "delegate", "args": {"agent": "assistant", "task": "x"}},
        {"name": "delegate", "args": {"agent": "researcher", "task": "y"}},
    ]);
    let outer = json!([
        {"name": "delegate", "args": {"agent": "helper", "task": format!("/tools {inner}")}},
        {"name": "delegate", "args": {"agent": "assistant", "task": "z"}},
    ]);
    let body = json!({"agent": "boss", "input": format!("/tools {outer}")});
    let (run_id, run) = run_body(&t, body, 60).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let out = run.output.clone().unwrap_or_default();
    assert!(out.contains("TOO_MANY_DESCENDANTS"), "{out}");
    assert!(out.contains("echo: z"), "{out}");
    let trace = trace_of(&t, &run_id).await;
    assert_eq!(trace.runs.len(), 3, "{trace:?}");

    put_team(
        &t,
        "crowd",
        json!({"members": ["assistant", "researcher", "helper", "boss"], "strategy": "fan_out"}),
    )
    .await;
    let (status, v) = t
        .raw(
            Method::POST,
            "/v1/runs",
            Some(&t.stack.tenant_key),
            Some(r#"{"team": "crowd", "input": "hi"}"#),
            &[],
        )
        .await;
    assert_eq!(
        (status, error_code(&v).as_deref()),
        (400, Some("TOO_MANY_DESCENDANTS")),
        "{v}"
    );
    t.stack.stop().await;
}
