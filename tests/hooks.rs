//! Inbound webhooks against their real senders' code: GitHub deliveries
//! are real payloads from npm `@octokit/webhooks-examples` signed by npm
//! `@octokit/webhooks-methods` (GitHub's own library); Standard Webhooks
//! deliveries are signed by PyPI `standardwebhooks`, the reference
//! library. Each verified delivery starts one Run; repeats, pings,
//! filtered events, bad signatures, a disabled hook and a spent hourly
//! budget start none.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

use reqwest::Method;
use serde_json::{json, Value};

use armada_api::hooks::{
    DeliveriesPage, DeliveryAnswer, HookCreated, HookSecret, HookView, HooksPage,
};
use armada_cli::local::emulator;
use armada_domain::hook::inbound::Outcome;
use armada_domain::run::Trigger;
use armada_tests::{error_code, error_message, root, EventKind, LogEvent, RunState, TestStack};

const OCTOKIT: &[&str] = &[
    "@octokit/webhooks-methods@6.0.0",
    "@octokit/webhooks-examples@7.6.1",
];

/// A real GitHub delivery of `event` (its `index`-th example), signed
/// with `secret` by GitHub's library: (body, `X-Hub-Signature-256`).
fn github_delivery(secret: &str, event: &str, index: usize) -> (String, String) {
    let dir = emulator::install_npm_tool(&root(), "octokit", OCTOKIT).unwrap();
    let script = dir.join("github-delivery.mjs");
    std::fs::write(&script, include_str!("fixtures/hooks/github-delivery.mjs")).unwrap();
    let out = Command::new("node")
        .arg(&script)
        .args([secret, event, &index.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        v["body"].as_str().unwrap().to_string(),
        v["signature"].as_str().unwrap().to_string(),
    )
}

/// Python with the Standard Webhooks reference library.
fn standardwebhooks() -> PathBuf {
    emulator::install_isolated_tool(
        &root(),
        "standardwebhooks",
        "1.3.0",
        include_str!("fixtures/hooks/standardwebhooks-requirements.txt"),
        "python",
    )
    .unwrap()
}

/// The `webhook-signature` the reference library puts on `body`.
fn standard_signature(secret: &str, id: &str, timestamp: i64, body: &str) -> String {
    let script = root().join("tests/fixtures/hooks/standard-sign.py");
    let mut child = Command::new(standardwebhooks())
        .arg(script)
        .args([secret, id, &timestamp.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

async fn create_hook(t: &TestStack, body: Value) -> HookCreated {
    let (s, v) = t
        .raw(
            Method::POST,
            "/v1/hooks",
            Some(&t.stack.tenant_key),
            Some(&body.to_string()),
            &[],
        )
        .await;
    assert_eq!(s, 201, "{v}");
    serde_json::from_value(v).unwrap()
}

/// Posts a delivery to a hook, no key: its status and body.
async fn deliver(
    t: &TestStack,
    hook_id: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    t.raw(
        Method::POST,
        &format!("/v1/hooks/{hook_id}"),
        None,
        Some(body),
        headers,
    )
    .await
}

fn answer(v: Value) -> DeliveryAnswer {
    serde_json::from_value(v).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signed_github_push_starts_one_review_and_nothing_else_does() {
    let t = TestStack::start().await;
    let hook = create_hook(
        &t,
        json!({"kind": "github", "agent": "assistant", "events": ["push"],
               "input_template": "Review the push to {{ payload.repository.full_name }} at {{ payload.after }} ({{ event }})."}),
    )
    .await;
    assert_eq!(hook.secret.as_deref().unwrap().len(), 64, "32 bytes in hex");
    assert!(
        hook.url.ends_with(&format!("/v1/hooks/{}", hook.hook_id)),
        "{}",
        hook.url
    );
    let id = &hook.hook_id;

    // A real push, signed by GitHub's library: one Run, its input rendered.
    let (body, signature) = github_delivery(hook.secret.as_deref().unwrap(), "push", 0);
    let payload: Value = serde_json::from_str(&body).unwrap();
    let headers = [
        ("x-github-event", "push"),
        ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ("x-hub-signature-256", signature.as_str()),
    ];
    let (s, v) = deliver(&t, id, &body, &headers).await;
    assert_eq!(s, 202, "{v}");
    let started = answer(v);
    assert_eq!(started.outcome, Outcome::Started);
    let run_id = started.run_id.unwrap();
    let run = t.wait_closed(&run_id).await;
    assert_eq!(run.state.outcome(), RunState::Completed, "{run:?}");
    let want = format!(
        "Review the push to {} at {} (push).",
        payload["repository"]["full_name"].as_str().unwrap(),
        payload["after"].as_str().unwrap()
    );
    assert_eq!(run.input.as_deref(), Some(want.as_str()));
    let Some(Trigger::Hook {
        hook_id,
        event,
        delivery_id,
    }) = run.trigger.clone()
    else {
        panic!("a hook's Run: {run:?}");
    };
    assert_eq!((hook_id.as_str(), event.as_str()), (id.as_str(), "push"));
    assert!(delivery_id.starts_with("dlv_"), "{delivery_id}");
    let created = t.event(&run_id, EventKind::RunCreated).await.unwrap();
    let LogEvent::RunCreated(created) = created else {
        panic!("{created:?}")
    };
    assert_eq!(created.trigger, run.trigger);

    // A Run started with a key says so.
    let by_key = t.client.create_run("assistant", "hello").await.unwrap();
    assert_eq!(
        t.client.run(&by_key).await.unwrap().trigger,
        Some(Trigger::Api)
    );

    // GitHub's redelivery of it: the same Run, nothing new.
    let (s, v) = deliver(&t, id, &body, &headers).await;
    assert_eq!(s, 200, "{v}");
    let again = answer(v);
    assert_eq!(
        (again.outcome, again.duplicate),
        (Outcome::Duplicate, Some(true))
    );
    assert_eq!(again.run_id.as_deref(), Some(run_id.as_str()));

    // A ping, and an event the hook does not take: answered, nothing started.
    for (event, delivery) in [("ping", "d-ping"), ("pull_request", "d-pr")] {
        let (body, signature) = github_delivery(hook.secret.as_deref().unwrap(), event, 0);
        let h = [
            ("x-github-event", event),
            ("x-github-delivery", delivery),
            ("x-hub-signature-256", signature.as_str()),
        ];
        let (s, v) = deliver(&t, id, &body, &h).await;
        assert_eq!(s, 200, "{event}: {v}");
        assert_eq!(
            answer(v),
            DeliveryAnswer {
                outcome: Outcome::Filtered,
                run_id: None,
                duplicate: None
            }
        );
    }

    // Not signed by this hook's secret, or not signed, or changed after
    // signing: one 401 for all, nothing recorded.
    let (_, forged) = github_delivery("not the secret", "push", 1);
    let tampered = body.replacen("\"ref\"", "\"ref\" ", 1);
    for (body, sig) in [
        (body.as_str(), Some(forged.as_str())),
        (body.as_str(), None),
        (tampered.as_str(), Some(signature.as_str())),
    ] {
        let mut h = vec![
            ("x-github-event", "push"),
            ("x-github-delivery", "d-forged"),
        ];
        if let Some(sig) = sig {
            h.push(("x-hub-signature-256", sig));
        }
        let (s, v) = deliver(&t, id, body, &h).await;
        assert_eq!(
            (s, error_code(&v).as_deref()),
            (401, Some("UNAUTHORIZED")),
            "{v}"
        );
    }

    let recorded = t.hook_deliveries(id).await;
    assert_eq!(
        recorded.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        [
            Outcome::Filtered,
            Outcome::Filtered,
            Outcome::Duplicate,
            Outcome::Started
        ],
        "newest first"
    );
    assert_eq!(recorded[3].1.as_deref(), Some(run_id.as_str()));

    // After a rotation the old secret stops verifying and the new one does.
    let (s, v) = t
        .raw(
            Method::POST,
            &format!("/v1/hooks/{id}/rotate"),
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let rotated: HookSecret = serde_json::from_value(v).unwrap();
    assert_ne!(Some(&rotated.secret), hook.secret.as_ref());
    let (body, old) = github_delivery(hook.secret.as_deref().unwrap(), "push", 1);
    let h = |sig| {
        [
            ("x-github-event", "push"),
            ("x-github-delivery", "d-after-rotation"),
            ("x-hub-signature-256", sig),
        ]
    };
    let (s, _) = deliver(&t, id, &body, &h(old.as_str())).await;
    assert_eq!(s, 401);
    let (_, new) = github_delivery(&rotated.secret, "push", 1);
    let (s, v) = deliver(&t, id, &body, &h(new.as_str())).await;
    assert_eq!(s, 202, "{v}");

    // Disabled: refused, recorded; deleted: gone.
    let patch = t
        .raw(
            Method::PATCH,
            &format!("/v1/hooks/{id}"),
            Some(&t.stack.tenant_key),
            Some(r#"{"enabled": false}"#),
            &[],
        )
        .await;
    assert_eq!(patch.0, 200, "{}", patch.1);
    let view: HookView = serde_json::from_value(patch.1).unwrap();
    assert!(!view.enabled);
    let h = [
        ("x-github-event", "push"),
        ("x-github-delivery", "d-disabled"),
        ("x-hub-signature-256", new.as_str()),
    ];
    let (s, v) = deliver(&t, id, &body, &h).await;
    assert_eq!(
        (s, error_code(&v).as_deref()),
        (409, Some("HOOK_DISABLED")),
        "{v}"
    );
    assert_eq!(t.hook_deliveries(id).await[0].0, Outcome::Disabled);
    let (s, _) = t
        .raw(
            Method::DELETE,
            &format!("/v1/hooks/{id}"),
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(s, 204);
    let (s, v) = deliver(&t, id, &body, &h).await;
    assert_eq!(
        (s, error_code(&v).as_deref()),
        (404, Some("NOT_FOUND")),
        "{v}"
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standard_webhooks_signed_by_the_reference_library_start_runs_within_the_hourly_budget() {
    let t = TestStack::start().await;
    let hook = create_hook(
        &t,
        json!({"kind": "standard", "agent": "assistant", "max_runs_per_hour": 1}),
    )
    .await;
    let secret = hook.secret.clone().unwrap();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let id = &hook.hook_id;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let send = |msg: &'static str, at: i64| {
        let body = json!({"type": "invoice.paid", "timestamp": "2026-12-05T10:00:00Z",
                          "data": {"invoice": msg}})
        .to_string();
        let sig = standard_signature(&secret, msg, at, &body);
        (body, sig, at.to_string())
    };

    let (body, sig, ts) = send("msg_1", now);
    let h = [
        ("webhook-id", "msg_1"),
        ("webhook-timestamp", ts.as_str()),
        ("webhook-signature", sig.as_str()),
    ];
    let (s, v) = deliver(&t, id, &body, &h).await;
    assert_eq!(s, 202, "{v}");
    let run_id = answer(v).run_id.unwrap();
    let run = t.wait_closed(&run_id).await;
    assert!(
        run.input
            .as_deref()
            .unwrap()
            .starts_with("Webhook event: invoice.paid."),
        "{run:?}"
    );

    // A timestamp from ten minutes ago: refused, though correctly signed.
    let (body, sig, ts) = send("msg_old", now - 600);
    let h = [
        ("webhook-id", "msg_old"),
        ("webhook-timestamp", ts.as_str()),
        ("webhook-signature", sig.as_str()),
    ];
    let (s, _) = deliver(&t, id, &body, &h).await;
    assert_eq!(s, 401);

    // A second message this hour: over the budget of one.
    let (body, sig, ts) = send("msg_2", now);
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/hooks/{id}", t.stack.api_url))
        .header("webhook-id", "msg_2")
        .header("webhook-timestamp", ts)
        .header("webhook-signature", sig)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    let wait: u32 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3600).contains(&wait), "{wait}");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(error_code(&v).as_deref(), Some("HOOK_RATE_LIMITED"));
    let outcomes: Vec<Outcome> = t
        .hook_deliveries(id)
        .await
        .into_iter()
        .map(|(o, _)| o)
        .collect();
    assert_eq!(outcomes, [Outcome::RateLimited, Outcome::Started]);
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hooks_are_their_tenants_and_their_templates_are_checked() {
    let t = TestStack::start().await;
    // A template that does not compile is refused, naming it.
    let (s, v) = t
        .raw(
            Method::POST,
            "/v1/hooks",
            Some(&t.stack.tenant_key),
            Some(r#"{"kind": "github", "agent": "assistant", "input_template": "{% if %}"}"#),
            &[],
        )
        .await;
    assert_eq!(
        (s, error_code(&v).as_deref()),
        (400, Some("INVALID_FIELD")),
        "{v}"
    );
    assert!(error_message(&v).starts_with("input_template:"), "{v}");
    let (s, v) = t
        .raw(
            Method::POST,
            "/v1/hooks",
            Some(&t.stack.tenant_key),
            Some(r#"{"kind": "github", "agent": "nobody"}"#),
            &[],
        )
        .await;
    assert_eq!(
        (s, error_code(&v).as_deref()),
        (404, Some("NOT_FOUND")),
        "{v}"
    );

    // One that names what a payload may lack: that delivery is rejected.
    let hook = create_hook(
        &t,
        json!({"kind": "github", "agent": "assistant", "input_template": "{{ payload.pull_request.title }}"}),
    )
    .await;
    let (body, signature) = github_delivery(hook.secret.as_deref().unwrap(), "push", 0);
    let h = [
        ("x-github-event", "push"),
        ("x-github-delivery", "d-1"),
        ("x-hub-signature-256", signature.as_str()),
    ];
    let (s, v) = deliver(&t, &hook.hook_id, &body, &h).await;
    assert_eq!(
        (s, error_code(&v).as_deref()),
        (400, Some("TEMPLATE_ERROR")),
        "{v}"
    );
    let (s, v) = t
        .raw(
            Method::GET,
            &format!("/v1/hooks/{}/deliveries", hook.hook_id),
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(s, 200);
    let page: DeliveriesPage = serde_json::from_value(v).unwrap();
    assert_eq!(page.deliveries[0].outcome, Outcome::Rejected);
    assert!(page.deliveries[0]
        .reason
        .as_deref()
        .unwrap()
        .starts_with("TEMPLATE_ERROR"));

    // The secret is shown once: never in a read.
    let (_, listed) = t
        .raw(
            Method::GET,
            "/v1/hooks",
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert!(!listed.to_string().contains(hook.secret.as_deref().unwrap()));
    let page: HooksPage = serde_json::from_value(listed).unwrap();
    assert_eq!(page.hooks.len(), 1);

    // Another tenant sees none of it.
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
    let acme = minted["key"].as_str().unwrap().to_string();
    let path = format!("/v1/hooks/{}", hook.hook_id);
    for (method, path, body) in [
        (Method::GET, path.clone(), None),
        (Method::PATCH, path.clone(), Some(r#"{"enabled": false}"#)),
        (Method::DELETE, path.clone(), None),
        (Method::POST, format!("{path}/rotate"), None),
        (Method::GET, format!("{path}/deliveries"), None),
    ] {
        let (s, v) = t.raw(method.clone(), &path, Some(&acme), body, &[]).await;
        assert_eq!(s, 404, "{method} {path}: {v}");
    }
    let (_, theirs) = t
        .raw(Method::GET, "/v1/hooks", Some(&acme), None, &[])
        .await;
    let page: HooksPage = serde_json::from_value(theirs).unwrap();
    assert!(page.hooks.is_empty());
    t.stack.stop().await;
}
