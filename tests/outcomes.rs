//! How Runs end and who hears of it, against the real emulator: the agent
//! and team registry, model errors retried then failing the Run, the
//! wall-clock budget, and results posted signed to a callback URL.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use reqwest::Method;
use serde_json::json;

use armada_api::runs::{CallbackRequeued, CallbackView};
use armada_domain::run::callback::CallbackState;
use armada_tests::{
    callback_receiver, error_code, error_message, outcome, params, wait, CallbackReport, EventKind,
    LogEvent, RunState, TestStack,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn teams_are_stored_listed_and_deleted_in_the_registry_table() {
    let t = TestStack::start().await;
    let team = json!({"members": ["researcher", "assistant"], "strategy": "relay"});
    let put = t
        .admin
        .call(Method::PUT, "/v1/teams/pair", Some(&team), true)
        .await
        .unwrap();
    assert_eq!(put["strategy"], "relay");
    let got = t.client.get("/v1/teams/pair").await.unwrap();
    assert_eq!(got["members"], json!(["researcher", "assistant"]));
    assert_eq!(got["max_parallel"], 16);
    let list = t.client.get("/v1/teams").await.unwrap();
    let names: Vec<&str> = list["teams"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    // Beside the default teams from config/teams.
    assert!(
        names.contains(&"pair") && names.contains(&"review"),
        "{list}"
    );
    let gone = t
        .admin
        .call(Method::DELETE, "/v1/teams/pair", None, true)
        .await
        .unwrap();
    assert_eq!(gone["deleted"], true);
    let (status, _) = t
        .raw(
            Method::GET,
            "/v1/teams/pair",
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 404);
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agents_are_registered_updated_and_listed() {
    let t = TestStack::start().await;
    let def = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 2048},
        "system_prompt": "Be terse.",
        "skills": ["current_time"],
        "limits": {"max_model_turns": 1}
    });
    let v = t
        .admin
        .call(Method::PUT, "/v1/agents/terse", Some(&def), true)
        .await
        .unwrap();
    assert_eq!(v["version"], 1);
    let v = t
        .admin
        .call(Method::PUT, "/v1/agents/terse", Some(&def), true)
        .await
        .unwrap();
    assert_eq!(v["version"], 2);
    let got = t.client.get("/v1/agents/terse").await.unwrap();
    assert_eq!(got["system_prompt"], "Be terse.");
    let list = t.client.get("/v1/agents").await.unwrap();
    let names: Vec<&str> = list["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert!(
        names.contains(&"terse") && names.contains(&"assistant"),
        "{names:?}"
    );
    let (s, v) = t
        .raw(
            Method::PUT,
            "/v1/agents/terse",
            Some(&t.stack.admin_key),
            Some(r#"{"model": {"provider": "gpt"}, "system_prompt": "x"}"#),
            &[],
        )
        .await;
    assert_eq!(s, 400);
    assert!(error_message(&v).contains("model.provider"), "{v}");
    // The budget of one model turn stops a tool round.
    let (_, run) = t.ask("terse", "/tool current_time {}").await;
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "BUDGET_EXCEEDED"
    );
    // So does a tool-call budget smaller than one turn's calls.
    let stingy = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 2048},
        "system_prompt": "One call only.",
        "skills": ["current_time"],
        "limits": {"max_tool_calls": 1}
    });
    t.admin
        .call(Method::PUT, "/v1/agents/stingy", Some(&stingy), true)
        .await
        .unwrap();
    let (_, run) = t
        .ask(
            "stingy",
            r#"/tools [{"name":"current_time"},{"name":"current_time"}]"#,
        )
        .await;
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "BUDGET_EXCEEDED"
    );
    assert!(
        run.error
            .as_ref()
            .map_or("", |e| e.message.as_str())
            .contains("tool calls"),
        "{run:?}"
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn model_errors_are_retried_then_fail_the_run() {
    let t = TestStack::start().await;
    let (run_id, run) = t.ask("assistant", "/fail upstream exploded").await;
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "MODEL_ERROR"
    );
    assert!(run
        .error
        .as_ref()
        .map_or("", |e| e.message.as_str())
        .contains("upstream exploded"));
    // Three attempts (the configured default), then the failure is recorded.
    assert_eq!(
        t.stack
            .model_stats
            .requests
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    assert_eq!(t.wait_closed(&run_id).await.state, RunState::ClosedFailed);
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wall_clock_budget_times_the_run_out() {
    let t = TestStack::start().await;
    let def = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 2048},
        "system_prompt": "Quick.",
        "skills": ["current_time"],
        "limits": {"timeout_s": 1}
    });
    t.admin
        .call(Method::PUT, "/v1/agents/quick", Some(&def), true)
        .await
        .unwrap();
    let (run_id, run) = t.ask("quick", "/sleep 1500 /tool current_time {}").await;
    assert_eq!(outcome(&run), "TIMED_OUT", "{run:?}");
    assert_eq!(t.wait_closed(&run_id).await.state, RunState::ClosedTimedOut);
    t.stack.stop().await;
}

/// Callbacks retried within seconds instead of minutes, for up to `max_age_s`.
fn quick_callbacks(max_age_s: u32) -> HashMap<String, String> {
    params(&[
        ("CallbackRetryBaseSeconds", "1"),
        ("CallbackMaxAgeSeconds", &max_age_s.to_string()),
    ])
}

async fn start_with_callback(t: &TestStack, url: &str, input: &str) -> String {
    let v = t
        .client
        .post(
            "/v1/runs",
            &json!({"agent": "assistant", "input": input, "callback_url": url, "metadata": {"ticket": 7}}),
        )
        .await
        .unwrap();
    v["run_id"].as_str().unwrap().to_string()
}

/// Waits until the Run's callback is delivered or failed.
async fn callback_settled(t: &TestStack, run_id: &str) -> CallbackView {
    wait::until("the callback to be settled", wait::PATIENCE, || async {
        let run = t.client.run(run_id).await.unwrap();
        run.callback.filter(|c| c.state.is_final())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn results_are_posted_signed_to_the_callback_url_until_taken() {
    let t = TestStack::start_with(quick_callbacks(10), None).await;
    // The tenant's own secret, shown once on rotation.
    let tenant = t.stack.tenant.clone();
    let rotated = t
        .client
        .post(&format!("/v1/tenants/{tenant}/callback-secret"), &json!({}))
        .await
        .unwrap();
    let secret = rotated["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"), "{rotated}");

    // Three failures, then taken: four attempts of one delivery, the last
    // verified by the Standard Webhooks library with the tenant's secret.
    let (url, mut rx) = callback_receiver(vec![500, 503, 429, 200]).await;
    let run_id = start_with_callback(&t, &url, "call me").await;
    t.wait_closed(&run_id).await;
    let mut heard = Vec::new();
    for _ in 0..4 {
        heard.push(rx.recv().await.unwrap());
    }
    let last = heard.last().unwrap().clone();
    for h in &heard {
        assert_eq!(
            h.header("webhook-id"),
            run_id,
            "one delivery id across retries"
        );
        assert_eq!(h.body, last.body);
    }
    assert!(last.verifies_with(&secret), "{last:?}");
    let payload: serde_json::Value = serde_json::from_str(&last.body).unwrap();
    assert_eq!(payload["state"], "COMPLETED");
    assert_eq!(payload["output"], "echo: call me");
    assert_eq!(payload["metadata"]["ticket"], 7);
    assert_eq!(payload["trigger"]["kind"], "api");
    assert_eq!(
        payload["tenant"], tenant,
        "the signed body names its tenant"
    );
    let cb = callback_settled(&t, &run_id).await;
    assert_eq!(
        (cb.state, cb.attempts, cb.last_status),
        (CallbackState::Delivered, 4, Some(200))
    );
    let delivered = t
        .event_eventually(&run_id, EventKind::CallbackDelivered)
        .await;
    let LogEvent::CallbackDelivered(CallbackReport { attempts, .. }) = delivered else {
        unreachable!("an event of the kind asked for")
    };
    assert_eq!(attempts, 4);

    // 410 Gone stops at once; a redelivery asked for starts a new round.
    let (url, mut rx) = callback_receiver(vec![410, 200]).await;
    let run_id = start_with_callback(&t, &url, "gone").await;
    let cb = callback_settled(&t, &run_id).await;
    assert_eq!(
        (cb.state, cb.attempts, cb.last_status),
        (CallbackState::Failed, 1, Some(410))
    );
    t.event_eventually(&run_id, EventKind::CallbackFailed).await;
    let path = format!("/v1/runs/{run_id}/callback/redeliver");
    let (s, v) = t
        .raw(Method::POST, &path, Some(&t.stack.tenant_key), None, &[])
        .await;
    assert_eq!(s, 202, "{v}");
    let requeued: CallbackRequeued = serde_json::from_value(v).unwrap();
    assert_eq!(requeued.callback.state, CallbackState::Pending);
    let cb = callback_settled(&t, &run_id).await;
    assert_eq!((cb.state, cb.attempts), (CallbackState::Delivered, 2));
    assert_eq!(rx.recv().await.unwrap().header("webhook-id"), run_id);
    let (s, v) = t
        .raw(Method::POST, &path, Some(&t.stack.tenant_key), None, &[])
        .await;
    assert_eq!(
        (s, error_code(&v).as_deref()),
        (409, Some("CALLBACK_NOT_FAILED")),
        "{v}"
    );

    // A receiver that always fails: tried until the policy's age, then
    // failed (and dead-lettered); the Run closed long before.
    let (url, _rx) = callback_receiver(vec![500]).await;
    let run_id = start_with_callback(&t, &url, "nobody home").await;
    assert_eq!(
        t.wait_closed(&run_id).await.state,
        RunState::ClosedCompleted
    );
    let cb = callback_settled(&t, &run_id).await;
    assert_eq!(
        (cb.state, cb.last_status),
        (CallbackState::Failed, Some(500))
    );
    assert!(cb.attempts >= 3, "{cb:?}");
    t.event_eventually(&run_id, EventKind::CallbackFailed).await;
    t.stack.stop().await;
}

/// A callback endpoint that accepts and never answers (a tarpit) holds
/// the delivery queue's consumer, not the settling of Runs: the Run closes
/// first, and the failed delivery is noted on it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_callback_endpoint_does_not_hold_a_runs_settling() {
    let t = TestStack::start_with(quick_callbacks(4), None).await;
    let tarpit = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", tarpit.local_addr().unwrap());
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for conn in tarpit.incoming().flatten() {
            keep.lock().unwrap().push(conn);
        }
    });
    let v = t
        .client
        .post(
            "/v1/runs",
            &json!({"agent": "assistant", "input": "hello", "callback_url": url}),
        )
        .await
        .unwrap();
    let run_id = v["run_id"].as_str().unwrap().to_string();
    assert_eq!(
        t.wait_closed(&run_id).await.state,
        RunState::ClosedCompleted
    );
    // Each of its attempts waits 5 s for an answer that never comes: the
    // Run was closed without waiting for them.
    let types = t.event_types(&run_id).await;
    assert!(
        types.contains(&"run_closed".to_string())
            && !types.iter().any(|k| k.starts_with("callback_")),
        "{types:?}"
    );
    let failed = t.event_eventually(&run_id, EventKind::CallbackFailed).await;
    let LogEvent::CallbackFailed(report) = failed else {
        unreachable!("an event of the kind asked for")
    };
    assert_eq!(
        report.error.as_deref(),
        Some("CONNECT_FAILED"),
        "{report:?}"
    );
    assert!(!held.lock().unwrap().is_empty(), "the endpoint was reached");
    t.stack.stop().await;
}
