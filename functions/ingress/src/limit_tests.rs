//! What a tenant may ask of the API, on in-memory ports: its Runs a
//! minute, its Runs active at once, its long-polls waiting, and query
//! values within what the document states.

use lambda_http::Body;
use serde_json::{json, Value};

use crate::tests::{code, handle, Api};

/// A tenant starts at most its quota of Runs a minute: past it the start
/// is `429 RATE_LIMITED` with `Retry-After` (the rest of the minute) and
/// writes nothing; another tenant is not held back; the next minute
/// counts afresh.
#[tokio::test]
async fn a_tenant_past_its_runs_per_minute_waits_for_the_next_minute() {
    let api = Api::with(|c| c.tenant_runs_per_minute = 2).await;
    let (key, other) = (api.key("acme").await, api.key("beta").await);
    let start = json!({"agent": "assistant", "input": "hi"});
    for _ in 0..2 {
        let (status, _) = api
            .call("POST", "/v1/runs", Some(&key), &[], Some(start.clone()))
            .await;
        assert_eq!(status, 202);
    }
    let req = http::Request::builder()
        .method("POST")
        .uri("/v1/runs")
        .header("authorization", format!("Bearer {key}"))
        .body(Body::Text(start.to_string()))
        .expect("a well-formed request");
    let resp = handle(api.svc.clone(), req).await;
    assert_eq!(resp.status().as_u16(), 429);
    let wait: u32 = resp.headers()[http::header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    let body: Value = match resp.body() {
        Body::Text(t) => serde_json::from_str(t).unwrap(),
        _ => Value::Null,
    };
    assert_eq!(code(&body), "RATE_LIMITED", "{body}");
    assert_eq!(
        api.mem.state().runs.len(),
        2,
        "the refused start wrote nothing"
    );
    let (status, _) = api
        .call("POST", "/v1/runs", Some(&other), &[], Some(start.clone()))
        .await;
    assert_eq!(status, 202, "another tenant has its own quota");
    api.svc.clock.advance(i64::from(wait) * 1000);
    let (status, _) = api
        .call("POST", "/v1/runs", Some(&key), &[], Some(start))
        .await;
    assert_eq!(status, 202, "a new minute");
}

/// A tenant has at most its quota of Runs active at once: past it a start
/// is `429 TOO_MANY_ACTIVE_RUNS` with `Retry-After` and writes nothing (nor
/// counts against its rate); another tenant is not held back; once one of
/// its Runs is settled (its marker removed), or the markers expired (a
/// settlement that never came), it starts again.
#[tokio::test]
async fn a_tenant_with_its_quota_of_active_runs_waits_for_one_to_end() {
    let api = Api::with(|c| c.tenant_active_runs = 2).await;
    let (key, other) = (api.key("acme").await, api.key("beta").await);
    let start = json!({"agent": "assistant", "input": "hi"});
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, v) = api
            .call("POST", "/v1/runs", Some(&key), &[], Some(start.clone()))
            .await;
        assert_eq!(status, 202, "{v}");
        ids.push(v["run_id"].as_str().unwrap().to_string());
    }
    let (status, body, wait) = api
        .send("POST", "/v1/runs", Some(&key), &[], Some(start.clone()))
        .await;
    assert_eq!(
        (status, code(&body)),
        (429, "TOO_MANY_ACTIVE_RUNS"),
        "{body}"
    );
    assert_eq!(wait, Some(armada_api::error::ACTIVE_RUNS_RETRY_S));
    {
        let st = api.mem.state();
        assert_eq!(st.runs.len(), 2, "the refused start wrote nothing");
        let counted: u32 = st.run_starts.values().sum();
        assert_eq!(counted, 2, "nor was it counted against the rate");
    }
    let (status, _) = api
        .call("POST", "/v1/runs", Some(&other), &[], Some(start.clone()))
        .await;
    assert_eq!(status, 202, "another tenant has its own quota");

    // The dispatcher settles one: its marker goes, and a start is let in.
    api.svc.quotas.run_ended("acme", &ids[0]).await.unwrap();
    let (status, _) = api
        .call("POST", "/v1/runs", Some(&key), &[], Some(start.clone()))
        .await;
    assert_eq!(status, 202);
    let (status, _) = api
        .call("POST", "/v1/runs", Some(&key), &[], Some(start.clone()))
        .await;
    assert_eq!(status, 429, "two active again");
    // Markers outlive no Run: past its deadline and the longest approval
    // they no longer count, settled or not.
    api.svc.clock.advance(8 * 86_400 * 1000);
    let (status, _) = api
        .call("POST", "/v1/runs", Some(&key), &[], Some(start))
        .await;
    assert_eq!(status, 202);
}

/// A long-poll that has to wait holds one of its tenant's slots while it
/// does: with every slot held (by another instance's poll) it is `429
/// TOO_MANY_LONG_POLLS` with `Retry-After`; a poll without wait, or one
/// whose events are there at once, needs none; another tenant has its
/// own; a slot whose holder's time passed is free again, and a poll gives
/// its slot back when it ends.
#[tokio::test]
async fn a_tenant_with_its_long_polls_all_waiting_is_told_to_retry() {
    let api = Api::with(|c| c.tenant_concurrent_long_polls = 1).await;
    let (key, other) = (api.key("acme").await, api.key("beta").await);
    let start = json!({"agent": "assistant", "input": "hi"});
    let (_, v) = api
        .call("POST", "/v1/runs", Some(&key), &[], Some(start.clone()))
        .await;
    let id = v["run_id"].as_str().unwrap().to_string();
    let (_, v) = api
        .call("POST", "/v1/runs", Some(&other), &[], Some(start))
        .await;
    let theirs = v["run_id"].as_str().unwrap().to_string();
    let now = api.svc.clock.now_ms();
    let held = api
        .svc
        .quotas
        .take_poll_slot("acme", 1, "elsewhere", now, now + 30_000)
        .await
        .unwrap();
    assert_eq!(held, Some(0));

    let waiting = format!("/v1/runs/{id}/events?after=99&wait=1");
    let (status, body, wait) = api.send("GET", &waiting, Some(&key), &[], None).await;
    assert_eq!(
        (status, code(&body)),
        (429, "TOO_MANY_LONG_POLLS"),
        "{body}"
    );
    assert_eq!(wait, Some(armada_api::error::LONG_POLLS_RETRY_S));
    for path in [
        format!("/v1/runs/{id}/events?after=99"),
        format!("/v1/runs/{id}/events?after=0&wait=1"),
    ] {
        let (status, _) = api.call("GET", &path, Some(&key), &[], None).await;
        assert_eq!(status, 200, "{path} needs no slot");
    }
    let path = format!("/v1/runs/{theirs}/events?after=99&wait=1");
    let (status, _) = api.call("GET", &path, Some(&other), &[], None).await;
    assert_eq!(status, 200, "another tenant has slots of its own");

    // The other instance died: its slot frees itself when its time is up.
    api.svc.clock.advance(30_000);
    let (status, v) = api.call("GET", &waiting, Some(&key), &[], None).await;
    assert_eq!(
        (status, v["events"].as_array().map(Vec::len)),
        (200, Some(0))
    );
    assert!(
        api.mem.state().poll_slots.is_empty(),
        "every poll gave its slot back"
    );
}

/// Found by schemathesis: a `wait` past the document's maximum was
/// quietly shortened, and an `after` past the document's int64 accepted;
/// both are refused, as the document says.
#[tokio::test]
async fn query_values_outside_the_document_are_refused() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    let (_, created) = api.start(&key).await;
    let id = created["run_id"].as_str().unwrap();
    let cases = [
        ("after=0&wait=20", 200),
        ("after=0&wait=21", 400),
        ("after=0&wait=-1", 400),
        ("after=0&wait=x", 400),
        ("after=-1", 400),
        ("after=9223372036854775808", 400),
    ];
    for (query, status) in cases {
        let wait = query;
        let path = format!("/v1/runs/{id}/events?{query}");
        let (got, resp) = api.call("GET", &path, Some(&key), &[], None).await;
        assert_eq!(got, status, "{wait}: {resp}");
        if status == 400 {
            assert_eq!(code(&resp), "INVALID_QUERY", "{resp}");
        }
    } // A tenant key's `?tenant=` is ignored, but a malformed one refused.
    for (query, status) in [("?tenant=acme", 200), ("?tenant=Not%20A%20Tenant", 400)] {
        let path = format!("/v1/sandboxes{query}");
        let (got, resp) = api.call("GET", &path, Some(&key), &[], None).await;
        assert_eq!(got, status, "{query}: {resp}");
    }
}
