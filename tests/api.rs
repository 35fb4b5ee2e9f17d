//! The HTTP API against the real emulator: scenario A, validation, auth,
//! tenancy, idempotency, cancel, large inputs and keys.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use armada_tests::{error_code, error_message, RunState, TestStack};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_a_single_answer_and_an_inline_tool() {
    let t = TestStack::start().await;
    let (status, body) = t
        .raw(
            Method::POST,
            "/v1/runs",
            Some(&t.stack.tenant_key),
            Some(r#"{"agent":"assistant","input":"What is Armada?"}"#),
            &[],
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["state"], "PENDING");
    let run_id = body["run_id"].as_str().unwrap().to_string();
    let run = t
        .client
        .wait_run(&run_id, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        run.output.as_deref().unwrap_or_default(),
        "echo: What is Armada?"
    );
    assert_eq!(run.agent.as_str(), "assistant");
    assert_eq!(run.input.as_deref().unwrap_or_default(), "What is Armada?");
    assert_eq!(run.usage.unwrap_or_default().model_turns, 1);
    let closed = t.wait_closed(&run_id).await;
    assert_eq!(closed.state, RunState::ClosedCompleted);
    assert_eq!(
        t.event_types(&run_id).await,
        ["run_created", "model_reply", "run_completed", "run_closed"]
    );

    let (run_id, run) = t.ask("assistant", "/tool current_time {}").await;
    let out = run.output.as_deref().unwrap();
    assert!(
        out.starts_with("tool current_time returned: {\"now\":\"20"),
        "{out}"
    );
    assert_eq!(run.usage.unwrap_or_default().tool_calls, 1);
    assert_eq!(run.usage.unwrap_or_default().model_turns, 2);
    let types = t.event_types(&run_id).await;
    assert!(types.contains(&"tool_call".to_string()) && types.contains(&"tool_result".to_string()));

    // Arguments nested 125 levels (serde_json parses 128) once made a Run
    // whose record could never be read, cancelled or ended. They never
    // enter it now: the call is refused and the model reads why.
    let deep = (0..125).fold(json!(1), |v, _| json!([v]));
    let (run_id, run) = t
        .ask(
            "assistant",
            &format!("/tool current_time {}", json!({ "x": deep })),
        )
        .await;
    let out = run.output.as_deref().unwrap();
    assert!(out.contains("INVALID_ARGUMENTS"), "{out}");
    let (status, read) = t
        .raw(
            Method::GET,
            &format!("/v1/runs/{run_id}/events"),
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 200, "{read}");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gets_clear_errors() {
    let t = TestStack::start().await;
    let key = t.stack.tenant_key.clone();
    let k = Some(key.as_str());
    // (path, key, body, status, code, text the message must name)
    type Case<'a> = (
        &'a str,
        Option<&'a str>,
        Option<String>,
        u16,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "/v1/runs",
            k,
            Some("{not json".into()),
            400,
            "INVALID_JSON",
            "",
        ),
        (
            "/v1/runs",
            k,
            Some(r#"{"agent": 5, "input": "x"}"#.into()),
            400,
            "INVALID_FIELD",
            "agent",
        ),
        (
            "/v1/runs",
            k,
            Some(r#"{"agent": "assistant"}"#.into()),
            400,
            "INVALID_FIELD",
            "input",
        ),
        (
            "/v1/runs",
            k,
            Some(r#"{"agent": "assistant", "input": "x", "bogus": 1}"#.into()),
            400,
            "INVALID_FIELD",
            "bogus",
        ),
        (
            "/v1/runs",
            k,
            Some(r#"{"agent": "nobody", "input": "x"}"#.into()),
            404,
            "NOT_FOUND",
            "nobody",
        ),
        (
            "/v1/runs",
            None,
            Some(r#"{"agent": "assistant", "input": "x"}"#.into()),
            401,
            "UNAUTHORIZED",
            "",
        ),
        (
            "/v1/runs",
            Some("ak_0011223344556677_00112233445566778899aabbccddeeff0011223344556677"),
            Some(r#"{"agent": "assistant", "input": "x"}"#.into()),
            401,
            "UNAUTHORIZED",
            "",
        ),
        (
            "/v1/runs",
            Some("garbage"),
            Some(r#"{"agent": "assistant", "input": "x"}"#.into()),
            401,
            "UNAUTHORIZED",
            "",
        ),
        (
            "/v1/sessions",
            k,
            Some(r#"{"agent": "assistant", "on_busy": "panic"}"#.into()),
            400,
            "INVALID_FIELD",
            "on_busy",
        ),
    ];
    for (path, key, body, status, code, field) in cases {
        let (s, v) = t.raw(Method::POST, path, key, body.as_deref(), &[]).await;
        assert_eq!(s, status, "{path} {body:?} -> {v}");
        assert_eq!(error_code(&v).as_deref(), Some(code), "{v}");
        assert!(error_message(&v).contains(field), "{v}");
    }
    // Over the body limit.
    let big = format!(
        r#"{{"agent":"assistant","input":"{}"}}"#,
        "x".repeat(1024 * 1024 + 10)
    );
    let (s, v) = t.raw(Method::POST, "/v1/runs", k, Some(&big), &[]).await;
    assert_eq!(
        (s, error_code(&v).as_deref()),
        (413, Some("PAYLOAD_TOO_LARGE"))
    );
    // Unknown run, unknown route, admin-only route with a tenant key.
    let (s, _) = t.raw(Method::GET, "/v1/runs/run_nope", k, None, &[]).await;
    assert_eq!(s, 404);
    let (s, _) = t.raw(Method::GET, "/v1/nothing-here", k, None, &[]).await;
    assert_eq!(s, 404);
    let (s, v) = t.raw(Method::PUT, "/v1/agents/x", k, Some("{}"), &[]).await;
    assert_eq!((s, error_code(&v).as_deref()), (403, Some("FORBIDDEN")));
    let (s, v) = t.raw(Method::GET, "/v1/health", None, None, &[]).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("ok")));
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenants_are_isolated_and_keys_can_be_revoked() {
    let t = TestStack::start().await;
    let run_id = t.client.create_run("assistant", "mine").await.unwrap();
    let sid = t.client.create_session("assistant").await.unwrap();
    let minted = t
        .admin
        .call(
            Method::POST,
            "/v1/tenants/acme/keys",
            Some(&json!({})),
            true,
        )
        .await
        .unwrap();
    let acme_key = minted["key"].as_str().unwrap().to_string();
    assert_eq!(minted["tenant"], "acme");
    for path in [
        format!("/v1/runs/{run_id}"),
        format!("/v1/runs/{run_id}/events"),
        format!("/v1/sessions/{sid}"),
    ] {
        let (s, v) = t.raw(Method::GET, &path, Some(&acme_key), None, &[]).await;
        assert_eq!(s, 404, "{path}: {v}");
    }
    let (s, _) = t
        .raw(
            Method::POST,
            &format!("/v1/runs/{run_id}/cancel"),
            Some(&acme_key),
            Some("{}"),
            &[],
        )
        .await;
    assert_eq!(s, 404);
    let (s, _) = t
        .raw(
            Method::POST,
            &format!("/v1/sessions/{sid}/messages"),
            Some(&acme_key),
            Some(r#"{"input":"x"}"#),
            &[],
        )
        .await;
    assert_eq!(s, 404);
    // acme's own work is fine.
    let (s, v) = t
        .raw(
            Method::POST,
            "/v1/runs",
            Some(&acme_key),
            Some(r#"{"agent":"assistant","input":"acme"}"#),
            &[],
        )
        .await;
    assert_eq!(s, 202, "{v}");
    let key_id = minted["key_id"].as_str().unwrap();
    let (s, _) = t
        .raw(
            Method::DELETE,
            &format!("/v1/keys/{key_id}"),
            Some(&t.stack.admin_key),
            None,
            &[],
        )
        .await;
    assert_eq!(s, 200);
    let (s, _) = t
        .raw(
            Method::GET,
            &format!("/v1/runs/{run_id}"),
            Some(&acme_key),
            None,
            &[],
        )
        .await;
    assert_eq!(s, 401);
    let (s, _) = t
        .raw(
            Method::DELETE,
            "/v1/keys/0000000000000000",
            Some(&t.stack.admin_key),
            None,
            &[],
        )
        .await;
    assert_eq!(s, 404);
    let (s, _) = t
        .raw(
            Method::POST,
            "/v1/tenants/Bad_Tenant/keys",
            Some(&t.stack.admin_key),
            Some("{}"),
            &[],
        )
        .await;
    assert_eq!(s, 400);
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotency_key_gives_one_run() {
    let t = TestStack::start().await;
    let key = t.stack.tenant_key.clone();
    let body = r#"{"agent":"assistant","input":"once"}"#;
    let h = [("Idempotency-Key", "order-42")];
    let (s1, v1) = t
        .raw(Method::POST, "/v1/runs", Some(&key), Some(body), &h)
        .await;
    let (s2, v2) = t
        .raw(Method::POST, "/v1/runs", Some(&key), Some(body), &h)
        .await;
    assert_eq!((s1, s2), (202, 202), "{v1} {v2}");
    assert_eq!(v1["run_id"], v2["run_id"]);
    let (s3, v3) = t
        .raw(
            Method::POST,
            "/v1/runs",
            Some(&key),
            Some(r#"{"agent":"assistant","input":"twice"}"#),
            &h,
        )
        .await;
    assert_eq!(s3, 409);
    assert_eq!(error_code(&v3).as_deref(), Some("IDEMPOTENCY_KEY_REUSED"));
    let run_id = v1["run_id"].as_str().unwrap();
    t.wait_closed(run_id).await;
    // One Run, answered once.
    let types = t.event_types(run_id).await;
    assert_eq!(types.iter().filter(|t| *t == "run_completed").count(), 1);
    assert_eq!(
        t.stack
            .model_stats
            .requests
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_ends_a_run_and_fences_its_worker() {
    let t = TestStack::start().await;
    let run_id = t
        .client
        .create_run("assistant", "/sleep 2500 slow")
        .await
        .unwrap();
    // Wait until a worker is inside the model call.
    let requests = &t.stack.model_stats.requests;
    armada_tests::wait::eventually("a worker is inside the model call", || async {
        requests.load(std::sync::atomic::Ordering::Relaxed) > 0
    })
    .await;
    let reached = t
        .stack
        .model_stats
        .requests
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(reached, 1, "the worker is inside the model call");
    let fenced = &t.stack.svc.counters.fenced_commits;
    assert_eq!(fenced.load(std::sync::atomic::Ordering::Relaxed), 0);
    let v = t
        .client
        .post(&format!("/v1/runs/{run_id}/cancel"), &json!({}))
        .await
        .unwrap();
    assert_eq!(v["state"], "CANCELLED");
    let closed = t.wait_closed(&run_id).await;
    assert_eq!(closed.state, RunState::ClosedCancelled);
    let (s, v) = t
        .raw(
            Method::POST,
            &format!("/v1/runs/{run_id}/cancel"),
            Some(&t.stack.tenant_key),
            Some("{}"),
            &[],
        )
        .await;
    assert_eq!((s, error_code(&v).as_deref()), (409, Some("RUN_TERMINAL")));
    // The worker comes back from the model and its commit is refused.
    armada_tests::wait::eventually("the worker's commit is refused", || async {
        fenced.load(std::sync::atomic::Ordering::Relaxed) > 0
    })
    .await;
    assert_eq!(
        fenced.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the cancelled run's worker was fenced"
    );
    let run = t.client.get(&format!("/v1/runs/{run_id}")).await.unwrap();
    assert_eq!(run["state"], "CLOSED_CANCELLED");
    assert!(run.get("output").is_none(), "{run}");
    assert!(!t
        .event_types(&run_id)
        .await
        .contains(&"run_completed".to_string()));
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn input_larger_than_a_queue_message_is_stored_and_answered() {
    let t = TestStack::start().await;
    let input = "a".repeat(300 * 1024);
    let (_, run) = t.ask("assistant", &input).await;
    assert_eq!(
        run.output.as_deref().map(str::len),
        Some(input.len() + "echo: ".len()),
        "{:?}",
        run.error
    );
    assert_eq!(run.input.as_deref().unwrap_or_default().len(), input.len());
    t.stack.stop().await;
}

/// A tenant's rate of new Runs is held with a conditional counter in the
/// idempotency table: past `TenantRunsPerMinute` a start is answered 429
/// with `Retry-After`, through the stack's HTTP server as API Gateway
/// would pass it on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_past_its_runs_per_minute_is_told_when_to_retry() {
    let t =
        TestStack::start_with(armada_tests::params(&[("TenantRunsPerMinute", "2")]), None).await;
    let start = r#"{"agent":"assistant","input":"hi"}"#;
    let post = || {
        reqwest::Client::new()
            .post(format!("{}/v1/runs", t.stack.api_url))
            .bearer_auth(&t.stack.tenant_key)
            .header("content-type", "application/json")
            .body(start)
            .send()
    };
    // Two within the minute; should the minute turn between them, the
    // third is in a fresh window and is accepted: then try once more.
    let mut refused = None;
    for _ in 0..5 {
        let resp = post().await.unwrap();
        if resp.status().as_u16() == 429 {
            refused = Some(resp);
            break;
        }
        assert_eq!(resp.status().as_u16(), 202);
    }
    let resp = refused.expect("a start past the quota is refused");
    let wait: u32 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(error_code(&body).as_deref(), Some("RATE_LIMITED"), "{body}");
    t.stack.stop().await;
}

/// An agent read with `GET` goes back with `PUT` as it is, and `If-Match`
/// holds on the emulator's conditional write: a write from a stale read is
/// `412`, and the definition stays as the first writer left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_if_match_write_of_a_definition_is_refused() {
    let t = TestStack::start().await;
    let read = t
        .admin
        .call(Method::GET, "/v1/agents/assistant", None, true)
        .await
        .unwrap();
    let version = read["version"].as_u64().unwrap();
    let put = |if_match: String| {
        let url = format!("{}/v1/agents/assistant", t.stack.api_url);
        let body = read.clone();
        let key = t.stack.admin_key.clone();
        async move {
            let resp = reqwest::Client::new()
                .put(url)
                .bearer_auth(key)
                .header("if-match", if_match)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (status, first) = put(format!("\"{version}\"")).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["version"], json!(version + 1));
    let (status, second) = put(format!("\"{version}\"")).await;
    assert_eq!(status, 412, "{second}");
    assert_eq!(error_code(&second).as_deref(), Some("PRECONDITION_FAILED"));
    let now = t
        .admin
        .call(Method::GET, "/v1/agents/assistant", None, true)
        .await
        .unwrap();
    assert_eq!(now["version"], json!(version + 1));
    t.stack.stop().await;
}

/// A tenant's Runs not yet ended are held with a marker each in the
/// quotas table: past `TenantActiveRuns` a start is answered 429
/// `TOO_MANY_ACTIVE_RUNS` with `Retry-After`, and once the dispatcher has
/// settled one of them (here: cancelled while it waits for a person) a
/// start is accepted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_with_its_quota_of_active_runs_is_told_to_wait() {
    use armada_tests::approvals::{put_agent, put_launch, wait_state};
    let t = TestStack::start_with(armada_tests::params(&[("TenantActiveRuns", "2")]), None).await;
    put_launch(&t).await;
    put_agent(&t, "ops", &["launch"], json!({}), json!({})).await;
    let mut parked = Vec::new();
    for _ in 0..2 {
        let id = t.client.create_run("ops", "/tool launch {}").await.unwrap();
        wait_state(&t.client, &id, "AWAITING_HITL").await;
        parked.push(id);
    }
    let start = || {
        reqwest::Client::new()
            .post(format!("{}/v1/runs", t.stack.api_url))
            .bearer_auth(&t.stack.tenant_key)
            .header("content-type", "application/json")
            .body(r#"{"agent":"assistant","input":"hi"}"#)
            .send()
    };
    let resp = start().await.unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"].to_str().unwrap(), "30");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        error_code(&body).as_deref(),
        Some("TOO_MANY_ACTIVE_RUNS"),
        "{body}"
    );

    let v = t
        .client
        .post(&format!("/v1/runs/{}/cancel", parked[0]), &json!({}))
        .await
        .unwrap();
    assert_eq!(v["state"], "CANCELLED");
    t.wait_closed(&parked[0]).await;
    let resp = start().await.unwrap();
    assert_eq!(resp.status().as_u16(), 202, "a settled Run frees its place");
    t.stack.stop().await;
}

/// A long-poll that has to wait holds one of its tenant's slots in the
/// quotas table, whichever instance serves it: with
/// `TenantConcurrentLongPolls` 1, while one poll waits another is answered
/// 429 `TOO_MANY_LONG_POLLS` with `Retry-After` (a poll without wait is
/// still answered), and when the first ends its slot is given back at
/// once, not when its time would run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_with_its_long_polls_all_waiting_is_told_to_retry() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let t = TestStack::start_with(
        armada_tests::params(&[("TenantConcurrentLongPolls", "1")]),
        None,
    )
    .await;
    let run_id = t.client.create_run("assistant", "hi").await.unwrap();
    // Past every event the Run will have: a poll waits its whole time.
    let poll = |wait: u64| {
        reqwest::Client::new()
            .get(format!(
                "{}/v1/runs/{run_id}/events?after=1000&wait={wait}",
                t.stack.api_url
            ))
            .bearer_auth(&t.stack.tenant_key)
            .send()
    };
    let slots_held = || async {
        t.stack
            .aws
            .dynamo
            .query()
            .table_name(&t.stack.svc.cfg.quotas_table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(
                ":pk",
                AttributeValue::S(format!("polls#{}", t.stack.tenant)),
            )
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .count()
    };
    let first = poll(6);
    let (first, refused) = tokio::join!(first, async {
        armada_tests::sandbox::eventually("the first poll holds its slot", || async {
            slots_held().await == 1
        })
        .await;
        let refused = poll(1).await.unwrap();
        let now = poll(0).await.unwrap().status().as_u16();
        (refused, now)
    });
    let (refused, without_wait) = refused;
    assert_eq!(refused.status().as_u16(), 429);
    assert_eq!(refused.headers()["retry-after"].to_str().unwrap(), "5");
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(
        error_code(&body).as_deref(),
        Some("TOO_MANY_LONG_POLLS"),
        "{body}"
    );
    assert_eq!(without_wait, 200, "a poll without wait needs no slot");
    let first = first.unwrap();
    assert_eq!(first.status().as_u16(), 200);
    assert_eq!(slots_held().await, 0, "the first poll gave its slot back");
    assert_eq!(poll(1).await.unwrap().status().as_u16(), 200);
    t.stack.stop().await;
}

/// The API describes itself at `GET /v1/openapi.json` (no key), as the
/// routers do; a method a route does not take is `405` with `Allow`, in
/// the API's error body; paths and queries are percent-decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_describes_itself_and_answers_wrong_methods_with_allow() {
    let t = TestStack::start().await;
    let k = Some(t.stack.tenant_key.as_str());
    let (s, served) = t
        .raw(Method::GET, "/v1/openapi.json", None, None, &[])
        .await;
    assert_eq!(s, 200);
    let generated = serde_json::to_value(armada_cli::openapi::document()).unwrap();
    assert_eq!(served, generated, "the served document is the routers'");

    let wrong = reqwest::Client::new()
        .patch(format!("{}/v1/runs", t.stack.api_url))
        .bearer_auth(&t.stack.tenant_key)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 405);
    let allow = wrong.headers()["allow"].to_str().unwrap().to_string();
    assert!(allow.contains("POST"), "{allow}");
    let body: serde_json::Value = wrong.json().await.unwrap();
    assert_eq!(
        error_code(&body).as_deref(),
        Some("METHOD_NOT_ALLOWED"),
        "{body}"
    );
    let (s, v) = t.raw(Method::DELETE, "/v1/approvals", k, None, &[]).await;
    assert_eq!(
        (s, error_code(&v).as_deref()),
        (405, Some("METHOD_NOT_ALLOWED"))
    );

    let (s, v) = t.raw(Method::GET, "/v1/runs/a%20b", k, None, &[]).await;
    assert_eq!(s, 404);
    assert!(
        error_message(&v).contains("'a b'"),
        "the id is decoded: {v}"
    );
    let (s, v) = t
        .raw(Method::GET, "/v1/runs/run_x/events?after=-1", k, None, &[])
        .await;
    assert_eq!((s, error_code(&v).as_deref()), (400, Some("INVALID_QUERY")));
    t.stack.stop().await;
}
