//! Scenario F: AgentSessions over the real emulator.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use armada_tests::{error_code, outcome, RunView, TestStack};

async fn answer(t: &TestStack, run_id: &str) -> RunView {
    t.client
        .wait_run(run_id, Duration::from_secs(30))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_answers_over_its_whole_history() {
    let t = TestStack::start().await;
    let sid = t.client.create_session("assistant").await.unwrap();
    for (msg, want) in [
        ("one", "echo: one"),
        ("two", "echo: two"),
        ("/recall", "one | two"),
    ] {
        let run_id = t.client.send_message(&sid, msg).await.unwrap();
        let run = answer(&t, &run_id).await;
        assert_eq!(run.output.as_deref().unwrap_or_default(), want);
        assert_eq!(run.session_id.as_deref().unwrap_or_default(), sid.as_str());
    }
    let s = t.client.get(&format!("/v1/sessions/{sid}")).await.unwrap();
    let turns = s["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 6, "{s}");
    let roles: Vec<&str> = turns.iter().map(|t| t["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant"
        ]
    );
    assert_eq!(turns[4]["content"], "/recall");
    assert_eq!(turns[5]["content"], "one | two");
    // POST /v1/runs with a session_id joins the same session.
    let v = t
        .client
        .post(
            "/v1/runs",
            &json!({"agent": "assistant", "input": "/recall", "session_id": sid}),
        )
        .await
        .unwrap();
    let run = answer(&t, v["run_id"].as_str().unwrap()).await;
    assert_eq!(
        run.output.as_deref().unwrap_or_default(),
        "one | two | /recall"
    );
    let (s, e) = t
        .raw(
            Method::POST,
            "/v1/runs",
            Some(&t.stack.tenant_key),
            Some(&json!({"agent": "researcher", "input": "x", "session_id": sid}).to_string()),
            &[],
        )
        .await;
    assert_eq!(s, 400, "{e}");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_sent_while_busy_wait_their_turn() {
    let t = TestStack::start().await;
    let sid = t.client.create_session("assistant").await.unwrap();
    let first = t
        .client
        .send_message(&sid, "/sleep 600 first")
        .await
        .unwrap();
    let second = t.client.send_message(&sid, "second").await.unwrap();
    let third = t.client.send_message(&sid, "/recall").await.unwrap();
    assert_eq!(
        answer(&t, &first)
            .await
            .output
            .as_deref()
            .unwrap_or_default(),
        "echo: first"
    );
    assert_eq!(
        answer(&t, &second)
            .await
            .output
            .as_deref()
            .unwrap_or_default(),
        "echo: second"
    );
    assert_eq!(
        answer(&t, &third)
            .await
            .output
            .as_deref()
            .unwrap_or_default(),
        "/sleep 600 first | second"
    );
    // The second message's Run started only after the first had answered.
    let events = |id: String| {
        let c = t.client.clone();
        async move { c.get(&format!("/v1/runs/{id}/events")).await.unwrap()["events"].clone() }
    };
    let at = |evs: &Value, ty: &str| -> String {
        evs.as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == ty)
            .map(|e| e["at"].as_str().unwrap().to_string())
            .unwrap()
    };
    let e1 = events(first.clone()).await;
    let e2 = events(second.clone()).await;
    assert!(
        at(&e2, "model_reply") >= at(&e1, "run_completed"),
        "{e1} {e2}"
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reject_session_refuses_a_message_while_busy() {
    let t = TestStack::start().await;
    let v = t
        .client
        .post(
            "/v1/sessions",
            &json!({"agent": "assistant", "on_busy": "reject"}),
        )
        .await
        .unwrap();
    let sid = v["session_id"].as_str().unwrap().to_string();
    let first = t
        .client
        .send_message(&sid, "/sleep 1500 first")
        .await
        .unwrap();
    let (s, e) = t
        .raw(
            Method::POST,
            &format!("/v1/sessions/{sid}/messages"),
            Some(&t.stack.tenant_key),
            Some(r#"{"input":"too soon"}"#),
            &[],
        )
        .await;
    assert_eq!(
        (s, error_code(&e).as_deref()),
        (409, Some("SESSION_BUSY")),
        "{e}"
    );
    answer(&t, &first).await;
    // Busy ends when the Run has been settled by the dispatcher.
    t.wait_closed(&first).await;
    let later = t.client.send_message(&sid, "/recall").await.unwrap();
    assert_eq!(
        answer(&t, &later)
            .await
            .output
            .as_deref()
            .unwrap_or_default(),
        "/sleep 1500 first"
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_session_is_compacted_to_the_context_window() {
    let t = TestStack::start().await;
    let def = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 600},
        "system_prompt": "Small window.",
        "skills": []
    });
    t.admin
        .call(Method::PUT, "/v1/agents/small", Some(&def), true)
        .await
        .unwrap();
    let sid = t.client.create_session("small").await.unwrap();
    for i in 0..8 {
        let msg = format!("message {i} {}", "x".repeat(300));
        let run_id = t.client.send_message(&sid, &msg).await.unwrap();
        assert_eq!(outcome(&answer(&t, &run_id).await), "COMPLETED");
    }
    let recall = t.client.send_message(&sid, "/recall").await.unwrap();
    let run = answer(&t, &recall).await;
    let out = run.output.as_deref().unwrap();
    assert!(out.contains("message 7"), "{out}");
    assert!(
        !out.contains("message 0"),
        "the oldest turns should be compacted: {out}"
    );
    let evs = t
        .client
        .get(&format!("/v1/runs/{recall}/events"))
        .await
        .unwrap();
    let compacted = evs["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "history_compacted")
        .cloned()
        .expect("a history_compacted event");
    assert!(compacted["dropped_turns"].as_u64().unwrap() > 0);
    // All history is still stored, one item per turn.
    let s = t.client.get(&format!("/v1/sessions/{sid}")).await.unwrap();
    assert_eq!(s["turns"].as_array().unwrap().len(), 18);
    t.stack.stop().await;
}
