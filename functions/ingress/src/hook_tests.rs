//! Deliveries to hooks on in-memory ports: the order of the checks (the
//! signature before anything, a repeat before the hourly budget), what
//! is recorded, and two racing copies of one delivery. No emulator.

use serde_json::{json, Value};

use armada_domain::crypto::hmac_sha256_hex;
use armada_domain::hook::inbound::Outcome;

use crate::tests::{code, Api};

/// Creates a GitHub hook of `tenant`'s; its id and secret.
async fn github_hook(api: &Api, key: &str, extra: Value) -> (String, String) {
    let mut body = json!({"kind": "github", "agent": "assistant"});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    let (s, v) = api
        .call("POST", "/v1/hooks", Some(key), &[], Some(body))
        .await;
    assert_eq!(s, 201, "{v}");
    (
        v["hook_id"].as_str().unwrap_or_default().to_string(),
        v["secret"].as_str().unwrap_or_default().to_string(),
    )
}

/// A push delivery `id` signed with `secret`: its status and body.
async fn push(api: &Api, hook_id: &str, secret: &str, id: &str) -> (u16, Value, Option<u32>) {
    let body = json!({"ref": "refs/heads/main", "repository": {"full_name": "octo/hello"}});
    let sig = format!(
        "sha256={}",
        hmac_sha256_hex(secret.as_bytes(), body.to_string().as_bytes())
    );
    let headers = [
        ("x-github-event", "push"),
        ("x-github-delivery", id),
        ("x-hub-signature-256", sig.as_str()),
    ];
    api.send(
        "POST",
        &format!("/v1/hooks/{hook_id}"),
        None,
        &headers,
        Some(body),
    )
    .await
}

fn outcomes(api: &Api, hook_id: &str) -> Vec<Outcome> {
    let mut ds = api.mem.state().deliveries.clone();
    ds.retain(|d| d.hook_id == hook_id);
    ds.iter().map(|d| d.outcome()).collect()
}

#[tokio::test]
async fn a_repeat_gets_its_first_run_even_once_the_hourly_budget_is_spent() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    let (id, secret) = github_hook(&api, &key, json!({"max_runs_per_hour": 1})).await;
    let (s, first, _) = push(&api, &id, &secret, "d-1").await;
    assert_eq!(s, 202, "{first}");
    let (s, again, _) = push(&api, &id, &secret, "d-1").await;
    assert_eq!(
        (s, &again["run_id"], &again["duplicate"]),
        (200, &first["run_id"], &json!(true))
    );
    let (s, over, retry) = push(&api, &id, &secret, "d-2").await;
    assert_eq!((s, code(&over)), (429, "HOOK_RATE_LIMITED"), "{over}");
    assert!(retry.is_some_and(|r| (1..=3600).contains(&r)), "{retry:?}");
    assert_eq!(
        outcomes(&api, &id),
        [Outcome::Started, Outcome::Duplicate, Outcome::RateLimited]
    );
    assert_eq!(api.mem.state().runs.len(), 1);
}

#[tokio::test]
async fn the_signature_is_checked_before_anything_is_said_of_the_hook() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    let (id, secret) = github_hook(&api, &key, json!({"enabled": false})).await;
    // Unsigned by its secret: 401, whatever the hook's state, and nothing kept.
    let (s, v, _) = push(&api, &id, "a guess", "d-1").await;
    assert_eq!((s, code(&v)), (401, "UNAUTHORIZED"), "{v}");
    assert!(outcomes(&api, &id).is_empty());
    // Signed: now it hears that the hook is disabled, recorded.
    let (s, v, _) = push(&api, &id, &secret, "d-1").await;
    assert_eq!((s, code(&v)), (409, "HOOK_DISABLED"), "{v}");
    assert_eq!(outcomes(&api, &id), [Outcome::Disabled]);
    assert!(api.mem.state().runs.is_empty());
    assert_eq!(
        api.svc
            .counters
            .unverified_deliveries
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn two_copies_of_one_delivery_racing_start_one_run() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    let (id, secret) = github_hook(&api, &key, json!({})).await;
    let (a, b) = tokio::join!(
        push(&api, &id, &secret, "d-race"),
        push(&api, &id, &secret, "d-race")
    );
    let mut statuses = [a.0, b.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 202], "{a:?} {b:?}");
    assert_eq!(a.1["run_id"], b.1["run_id"]);
    assert_eq!(api.mem.state().runs.len(), 1);
}

#[tokio::test]
async fn a_hook_whose_agent_is_gone_rejects_its_deliveries_and_records_why() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    let (id, secret) = github_hook(&api, &key, json!({})).await;
    api.mem.state().agents.remove("assistant");
    let (s, v, _) = push(&api, &id, &secret, "d-1").await;
    assert_eq!((s, code(&v)), (404, "NOT_FOUND"), "{v}");
    let recorded = api.mem.state().deliveries.clone();
    assert_eq!(recorded[0].outcome(), Outcome::Rejected);
    assert!(recorded[0]
        .reason
        .as_deref()
        .unwrap_or_default()
        .contains("agent 'assistant'"));
}
