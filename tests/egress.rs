//! The egress guard end to end, tried as a tenant would try it: the
//! emulator and private addresses are out of reach of `http_request` and of
//! callbacks, allow-list entries hold their port, failures say only a
//! coarse reason, and definitions with a typo anywhere are refused.

#![allow(clippy::unwrap_used)]

use reqwest::Method;
use serde_json::{json, Value};

use armada_tests::{
    callback_receiver, emulator_endpoint, error_code, error_message, outcome, params, put_fetcher,
    EventKind, LogEvent, RunView, TestStack,
};

fn fetch(url: &str) -> String {
    format!("/tool http_request {}", json!({ "url": url }))
}

/// The `error.code` of the tool result the scripted model echoed.
fn tool_error(run: &RunView) -> String {
    let out = run.output.as_deref().unwrap_or_default();
    let json = out.split_once("returned: ").map(|(_, j)| j).unwrap_or(out);
    let v: Value = serde_json::from_str(json).unwrap_or(Value::Null);
    v["error"]["code"].as_str().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_request_never_reaches_the_emulator_and_entries_hold_their_port() {
    // The test stack lists 127.0.0.1:* for its receivers: the emulator is
    // still refused, because it is the platform's own.
    let t = TestStack::start().await;
    let (receiver, mut rx) = callback_receiver(vec![200]).await;
    let receiver_host = receiver
        .trim_start_matches("http://")
        .trim_end_matches("/hook")
        .to_string();
    let emulator = emulator_endpoint();
    let emulator_host = emulator.trim_start_matches("http://").to_string();
    put_fetcher(
        &t,
        "fetcher",
        &[receiver_host.clone(), emulator_host.clone()],
    )
    .await;

    let (_, run) = t.ask("fetcher", &fetch(&format!("{emulator}/"))).await;
    assert_eq!(tool_error(&run), "EGRESS_REFUSED", "{run:?}");
    let localhost = emulator.replace("127.0.0.1", "localhost");
    put_fetcher(
        &t,
        "fetcher2",
        &[localhost.trim_start_matches("http://").to_string()],
    )
    .await;
    let (_, run) = t
        .ask("fetcher2", &fetch(&format!("{localhost}/moto-api/")))
        .await;
    assert_eq!(tool_error(&run), "EGRESS_REFUSED", "by name too: {run:?}");

    let (_, run) = t.ask("fetcher", &fetch(&receiver)).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert!(
        run.output.as_deref().unwrap().contains("\"status\":200"),
        "{run:?}"
    );
    assert!(rx.recv().await.is_some(), "the listed receiver was reached");

    // An entry without a port allows the scheme's port only.
    put_fetcher(&t, "portless", &["127.0.0.1".into()]).await;
    let (_, run) = t.ask("portless", &fetch(&receiver)).await;
    assert_eq!(tool_error(&run), "EGRESS_DENIED", "{run:?}");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_an_operator_listing_loopback_is_refused_and_failures_are_coarse() {
    let t = TestStack::start_with(params(&[("EgressAllow", "")]), None).await;
    let (receiver, mut rx) = callback_receiver(vec![200]).await;
    let port = receiver
        .split(':')
        .nth(2)
        .unwrap()
        .trim_end_matches("/hook");

    // A literal private address is refused when the Run is asked for.
    for url in [
        receiver.clone(),
        "http://169.254.169.254/latest/meta-data/".into(),
        "http://[::ffff:169.254.169.254]/".into(),
        "http://10.0.0.1/".into(),
        format!("http://[::1]:{port}/hook"),
    ] {
        let body = json!({"agent": "assistant", "input": "hi", "callback_url": url}).to_string();
        let (status, v) = t
            .raw(
                Method::POST,
                "/v1/runs",
                Some(&t.stack.tenant_key),
                Some(&body),
                &[],
            )
            .await;
        assert_eq!(status, 400, "{url}: {v}");
        assert_eq!(error_code(&v).as_deref(), Some("INVALID_FIELD"));
        assert!(error_message(&v).contains("EGRESS_REFUSED"), "{v}");
    }

    // A name that resolves to loopback is refused when it is sent, and the
    // event says so in one word.
    let by_name = format!("http://localhost:{port}/hook");
    let v = t
        .client
        .post(
            "/v1/runs",
            &json!({"agent": "assistant", "input": "hi", "callback_url": by_name}),
        )
        .await
        .unwrap();
    let run_id = v["run_id"].as_str().unwrap().to_string();
    t.wait_closed(&run_id).await;
    let failed = t.event_eventually(&run_id, EventKind::CallbackFailed).await;
    let LogEvent::CallbackFailed(report) = failed else {
        unreachable!("an event of the kind asked for")
    };
    assert_eq!(
        report.error.as_deref(),
        Some("EGRESS_REFUSED"),
        "{report:?}"
    );
    assert!(rx.try_recv().is_err(), "nothing reached the receiver");

    // http_request to an allow-listed name that is loopback: refused too.
    put_fetcher(&t, "fetcher", &[format!("localhost:{port}")]).await;
    let (_, run) = t.ask("fetcher", &fetch(&by_name)).await;
    assert_eq!(tool_error(&run), "EGRESS_REFUSED", "{run:?}");

    // A closed port, listed by nobody, answers the same way as an open one:
    // refused before any connection is tried (no port-scan oracle).
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    put_fetcher(&t, "scanner", &[format!("localhost:{closed}")]).await;
    let (_, run) = t
        .ask("scanner", &fetch(&format!("http://localhost:{closed}/")))
        .await;
    assert_eq!(tool_error(&run), "EGRESS_REFUSED", "{run:?}");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_typo_in_any_definition_is_refused_naming_the_field() {
    let t = TestStack::start().await;
    let agent = |extra: Value| {
        let mut d = json!({
            "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
            "system_prompt": "x",
            "skills": ["shell_exec"],
        });
        for (k, v) in extra.as_object().unwrap() {
            d[k] = v.clone();
        }
        d.to_string()
    };
    let admin = t.stack.admin_key.clone();
    for (path, body, field) in [
        ("/v1/agents/typo", agent(json!({"sandboxx": {"profile": "strict"}})), "sandboxx"),
        ("/v1/agents/typo", agent(json!({"approvalz": {"require": ["shell_exec"]}})), "approvalz"),
        (
            "/v1/agents/typo",
            agent(json!({"sandbox": {"profile": "strict", "limit": {"memory_mb": 64}}})),
            "sandbox.limit",
        ),
        (
            "/v1/agents/typo",
            agent(json!({"approvals": {"require": ["shell_exec"], "expire_s": 60}})),
            "approvals.expire_s",
        ),
        (
            "/v1/profiles/typo",
            json!({"extends": "strict", "restrict_netwrk": false}).to_string(),
            "profile.restrict_netwrk",
        ),
        (
            "/v1/skills/typo",
            json!({"executor": "shell_exec", "riskk": "low"}).to_string(),
            "riskk",
        ),
        (
            "/v1/teams/typo",
            json!({"members": ["assistant"], "strategy": "fan_out", "failure_policy": {"quorom": 1}}).to_string(),
            "failure_policy.quorom",
        ),
    ] {
        let (status, v) = t.raw(Method::PUT, path, Some(&admin), Some(&body), &[]).await;
        assert_eq!(status, 400, "{path} {body}: {v}");
        assert_eq!(error_code(&v).as_deref(), Some("INVALID_FIELD"), "{v}");
        let msg = error_message(&v);
        assert!(msg.starts_with(&format!("{field}:")), "{field}: {msg}");
    }
    let (status, _) = t
        .raw(Method::GET, "/v1/agents/typo", Some(&admin), None, &[])
        .await;
    assert_eq!(status, 404, "nothing was stored");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_tenant_signs_with_its_own_secret_and_only_it_can_rotate_it() {
    use armada_tests::approvals::key;
    let t = TestStack::start().await;
    let (acme, _) = key(&t, "acme", "member").await;
    let (acme_approver, _) = key(&t, "acme", "approver").await;
    let rotate = |c: &armada_cli::client::Client, tenant: &str| {
        let c = c.clone();
        let path = format!("/v1/tenants/{tenant}/callback-secret");
        async move { c.call(Method::POST, &path, Some(&json!({})), false).await }
    };
    let err = rotate(&t.client, "acme").await.unwrap_err().to_string();
    assert!(
        err.contains("404"),
        "another tenant's secret is not there: {err}"
    );
    let err = rotate(&acme_approver, "acme")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("403"), "{err}");
    let local = rotate(&t.client, &t.stack.tenant).await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let first = rotate(&acme, "acme").await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let second = rotate(&acme, "acme").await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(first, second, "rotation gives a new secret");
    assert_ne!(second, local);

    let (url, mut rx) = callback_receiver(vec![200]).await;
    let v = acme
        .post(
            "/v1/runs",
            &json!({"agent": "assistant", "input": "hi", "callback_url": url}),
        )
        .await
        .unwrap();
    let run_id = v["run_id"].as_str().unwrap().to_string();
    let request = rx.recv().await.unwrap();
    let payload: Value = serde_json::from_str(&request.body).unwrap();
    assert_eq!(
        (payload["run_id"].as_str(), payload["tenant"].as_str()),
        (Some(run_id.as_str()), Some("acme"))
    );
    // Verified as any Standard Webhooks receiver would, by its library.
    assert!(
        request.verifies_with(&second),
        "signed with acme's current secret"
    );
    assert!(
        !request.verifies_with(&first),
        "not with the one it replaced"
    );
    assert!(!request.verifies_with(&local), "not with another tenant's");
    let deployment = &t.stack.svc.cfg.callback_signing_secret;
    assert!(
        !request.verifies_with(&format!("whsec_{deployment}")),
        "not with the deployment's"
    );
    t.stack.stop().await;
}
