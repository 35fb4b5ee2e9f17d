//! How Runs end and who hears of it, against the real emulator: the agent
//! and team registry, model errors retried then failing the Run, the
//! wall-clock budget, and results posted signed to a callback URL.

#![allow(clippy::unwrap_used)]

use reqwest::Method;
use serde_json::json;

use armada_tests::{
    callback_receiver, error_message, outcome, CallbackReport, EventKind, LogEvent, RunState,
    TestStack,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn results_are_posted_signed_to_the_callback_url() {
    let t = TestStack::start().await;
    // The tenant's own secret, shown once on rotation.
    let tenant = t.stack.tenant.clone();
    let rotated = t
        .client
        .post(&format!("/v1/tenants/{tenant}/callback-secret"), &json!({}))
        .await
        .unwrap();
    let secret = rotated["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"), "{rotated}");
    let (url, mut rx) = callback_receiver(vec![503, 200]).await;
    let v = t
        .client
        .post("/v1/runs", &json!({"agent": "assistant", "input": "call me", "callback_url": url, "metadata": {"ticket": 7}}))
        .await
        .unwrap();
    let run_id = v["run_id"].as_str().unwrap().to_string();
    t.wait_closed(&run_id).await;
    // The first attempt got a 503, the second was accepted.
    let (_, _, first) = rx.recv().await.unwrap();
    let (sig, delivery, body) = rx.recv().await.unwrap();
    assert_eq!(first, body);
    assert_eq!(delivery, run_id);
    let payload: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(payload["state"], "COMPLETED");
    assert_eq!(payload["output"], "echo: call me");
    assert_eq!(payload["metadata"]["ticket"], 7);
    let (ts, mac) = sig.strip_prefix("t=").unwrap().split_once(",v1=").unwrap();
    let mac_with = |secret: &str| {
        armada_domain::crypto::hmac_sha256_hex(secret.as_bytes(), format!("{ts}.{body}").as_bytes())
    };
    assert_eq!(mac, mac_with(&secret));
    assert_eq!(
        payload["tenant"], tenant,
        "the signed body names its tenant"
    );
    // Delivered from the delivery queue once the Run closed, then noted
    // on the Run.
    let delivered = t
        .event_eventually(&run_id, EventKind::CallbackDelivered)
        .await;
    let LogEvent::CallbackDelivered(CallbackReport { attempts, .. }) = delivered else {
        unreachable!("an event of the kind asked for")
    };
    assert_eq!(attempts, 2);

    // A receiver that always fails: bounded attempts, recorded, the Run still closes.
    let (url, _rx) = callback_receiver(vec![500]).await;
    let v = t
        .client
        .post(
            "/v1/runs",
            &json!({"agent": "assistant", "input": "nobody home", "callback_url": url}),
        )
        .await
        .unwrap();
    let run_id = v["run_id"].as_str().unwrap().to_string();
    assert_eq!(
        t.wait_closed(&run_id).await.state,
        RunState::ClosedCompleted
    );
    t.event_eventually(&run_id, EventKind::CallbackFailed).await;
    t.stack.stop().await;
}

/// A callback endpoint that accepts and never answers (a tarpit) holds
/// the delivery queue's consumer, not the settling of Runs: the Run closes
/// first, and the failed delivery is noted on it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_callback_endpoint_does_not_hold_a_runs_settling() {
    let t = TestStack::start().await;
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
