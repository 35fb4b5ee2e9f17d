//! The API against its published contract (`docs/openapi.json`), on the
//! real emulator: schemathesis (from PyPI, pinned) fuzzes every operation
//! with each kind of key and follows the document's links; and every
//! operation that takes a tenant's id answers another tenant `404`.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use reqwest::Method;
use serde_json::json;

use armada_api::hooks::{HookCreated, HookView};

use armada_cli::local::emulator;
use armada_tests::approvals::{approvals_of, put_agent, put_launch, wait_state};
use armada_tests::{error_code, root, TestStack};

/// The fuzzer and its dependencies, pinned.
const SCHEMATHESIS_VERSION: &str = "4.32.5";
const SCHEMATHESIS_REQUIREMENTS: &str = include_str!("fixtures/schemathesis-requirements.txt");

/// A key of another tenant, minted by the admin.
async fn mint(t: &TestStack, tenant: &str, role: &str) -> String {
    let minted = t
        .admin
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant}/keys"),
            Some(&json!({"role": role})),
            true,
        )
        .await
        .unwrap();
    minted["key"].as_str().unwrap().to_string()
}

/// Every operation of the document that acts on a tenant's own things by
/// id, called with another tenant's key and the first tenant's ids, is
/// `404 NOT_FOUND`, and nothing of the first tenant's changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_operation_on_a_tenants_id_is_not_found_for_another_tenant() {
    let t = TestStack::start().await;
    put_launch(&t).await;
    put_agent(&t, "ops", &["launch"], json!({}), json!({})).await;
    let run_id = t.client.create_run("ops", "/tool launch {}").await.unwrap();
    wait_state(&t.client, &run_id, "AWAITING_HITL").await;
    let approval_id = approvals_of(&t.client, &run_id).await.remove(0);
    let session_id = t.client.create_session("assistant").await.unwrap();
    let chain = t
        .client
        .call(
            Method::POST,
            "/v1/runs",
            Some(&json!({"chain": ["assistant", "assistant"], "input": "relay"})),
            false,
        )
        .await
        .unwrap();
    let chain_id = chain["chain_id"].as_str().unwrap().to_string();
    let hook: HookCreated = t
        .client
        .typed(
            Method::POST,
            "/v1/hooks",
            Some(&json!({"kind": "github", "agent": "ops"})),
        )
        .await
        .unwrap();
    let schedule: armada_api::schedules::ScheduleCreated = t
        .client
        .typed(
            Method::POST,
            "/v1/schedules",
            Some(&json!({"expression": "rate(1 day)", "agent": "ops", "input": "x"})),
        )
        .await
        .unwrap();
    let mailbox: armada_api::mailboxes::MailboxCreated = t
        .client
        .typed(
            Method::POST,
            "/v1/mailboxes",
            Some(&json!({"name": "ops", "agent": "ops", "allow_senders": ["@example.com"]})),
        )
        .await
        .unwrap();
    let ids: HashMap<&str, String> = HashMap::from([
        ("run_id", run_id.clone()),
        ("approval_id", approval_id.clone()),
        ("session_id", session_id),
        ("chain_id", chain_id),
        ("tenant", t.stack.tenant.clone()),
        ("agent", "ops".to_string()),
        ("hook_id", hook.hook_id.clone()),
        ("schedule_id", schedule.schedule_id.clone()),
        ("mailbox_id", mailbox.mailbox_id.clone()),
        // Whether or not the Run kept one, another tenant learns nothing.
        ("artifact_id", "call_0_1-1".to_string()),
    ]);
    let keys = HashMap::from([
        ("member_key", mint(&t, "intruder", "member").await),
        ("approver_key", mint(&t, "intruder", "approver").await),
    ]);

    let doc = serde_json::to_value(armada_cli::openapi::document()).unwrap();
    let mut swept = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let params: Vec<&str> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
                .collect();
            // Shared registry names (agents, teams, skills, profiles, keys)
            // are the admin's; the review page takes a link, not a key.
            let shared = params.iter().any(|p| ["name", "key_id"].contains(p));
            if params.is_empty() || shared || path.ends_with("/review") {
                continue;
            }
            let Some(scheme) = op["security"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|req| req.as_object()?.keys().next().cloned())
                .find(|s| keys.contains_key(s.as_str()))
            else {
                continue;
            };
            assert!(
                params.iter().all(|p| ids.contains_key(p)),
                "{method} {path}: a tenant operation on an id this sweep has no value for"
            );
            let mut url = path.clone();
            for p in &params {
                url = url.replace(&format!("{{{p}}}"), &ids[p]);
            }
            let body = match (method.as_str(), path.as_str()) {
                ("post", p) if p.ends_with("/messages") => Some(r#"{"input": "hello"}"#),
                ("post", p) if p.ends_with("/decision") => Some(r#"{"decision": "approve"}"#),
                ("post" | "patch", _) => Some("{}"),
                _ => None,
            };
            let m = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
            let (s, v) = t
                .raw(m, &url, Some(&keys[scheme.as_str()]), body, &[])
                .await;
            assert_eq!(
                (s, error_code(&v).as_deref()),
                (404, Some("NOT_FOUND")),
                "{method} {path} with another tenant's {scheme}: {v}"
            );
            swept.push(format!("{method} {path}"));
        }
    }
    assert!(swept.len() >= 10, "the sweep covered {swept:?}");
    // The first tenant's things are as they were.
    let run = t.client.get(&format!("/v1/runs/{run_id}")).await.unwrap();
    assert_eq!(run["state"], "AWAITING_HITL", "{run}");
    let a = t
        .client
        .get(&format!("/v1/approvals/{approval_id}"))
        .await
        .unwrap();
    assert_eq!(a["state"], "pending", "{a}");
    let h: HookView = t
        .client
        .typed(Method::GET, &format!("/v1/hooks/{}", hook.hook_id), None)
        .await
        .unwrap();
    assert_eq!((h.enabled, h.version), (true, 1), "{h:?}");
    t.stack.stop().await;
}

/// One schemathesis run against the stack with the given keys; its report
/// on failure.
async fn schemathesis(t: &TestStack, name: &str, auth: &str, extra: &[&str]) -> String {
    let st = emulator::install_isolated_tool(
        &root(),
        "schemathesis",
        SCHEMATHESIS_VERSION,
        SCHEMATHESIS_REQUIREMENTS,
        "st",
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("armada-st-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("schemathesis.toml");
    std::fs::write(
        &config,
        format!(
            "{auth}\n\
             [phases.stateful]\nmax-steps = 120\n\n\
             # Bodies the document allows but the domain refuses (an agent\n\
             # that is not registered, an input past a limit the schema\n\
             # does not state) are answered 4xx, as documented.\n\
             [checks.positive_data_acceptance]\n\
             expected-statuses = [\"2XX\", \"400\", \"401\", \"403\", \"404\", \"409\", \"412\", \"429\"]\n"
        ),
    )
    .unwrap();
    let api = &t.stack.api_url;
    let out = tokio::process::Command::new(&st)
        .arg("--config-file")
        .arg(&config)
        .args(["--no-color", "run"])
        .arg(format!("{api}/v1/openapi.json"))
        .args(["--url", api])
        .args(["--checks", "all", "--seed", "1", "--max-examples", "12"])
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        // A long-poll may take its whole `wait` (at most 20 s).
        .args(["--request-timeout", "30", "--max-response-time", "25"])
        .args(extra)
        .current_dir(&dir)
        .output()
        .await
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "schemathesis ({name}):\n{report}");
    eprintln!("schemathesis ({name}):\n{report}");
    report
}

/// How many of the document's links a stateful run followed.
fn links_covered(report: &str) -> usize {
    report
        .lines()
        .find_map(|l| l.trim().strip_prefix("API Links:"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Every operation, with the key its document names (admin, member,
/// approver), then with only an approver's and only the admin's: no 5xx,
/// no answer the document does not describe, nothing the links' stateful
/// runs (create a Run, read it, its events, cancel it; open a session,
/// post to it, read it; mint a key, revoke it) find wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schemathesis_finds_nothing_outside_the_contract() {
    let t = TestStack::start().await;
    // An approval waiting, so the approvals' operations have one to read.
    put_launch(&t).await;
    put_agent(&t, "ops", &["launch"], json!({}), json!({})).await;
    let gated = t.client.create_run("ops", "/tool launch {}").await.unwrap();
    wait_state(&t.client, &gated, "AWAITING_HITL").await;
    let approver = &t.stack.approver_key;
    let by_scheme = format!(
        "[auth.openapi.admin_key]\nbearer = \"{}\"\n\
         [auth.openapi.member_key]\nbearer = \"{}\"\n\
         [auth.openapi.approver_key]\nbearer = \"{approver}\"\n",
        t.stack.admin_key, t.stack.tenant_key
    );
    let report = schemathesis(&t, "keys-by-scheme", &by_scheme, &[]).await;
    assert!(
        links_covered(&report) >= 4,
        "the stateful phase followed the Run's and the session's links:\n{report}"
    );
    for (name, key) in [("approver", approver), ("admin", &t.stack.admin_key)] {
        let header = format!("headers = {{ Authorization = \"Bearer {key}\" }}\n");
        schemathesis(
            &t,
            name,
            &header,
            &["--phases", "examples,coverage,fuzzing"],
        )
        .await;
    }
    t.stack.stop().await;
}
