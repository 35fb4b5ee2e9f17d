//! Helpers of the approval tests: a high-risk skill, agents with an
//! approval policy, approver keys, the links in the outbox's `.eml` files,
//! the review page as a browser would use it, and decisions by key.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use armada_api::approvals::{ApprovalList, ApprovalView};
use armada_cli::client::Client;
pub use armada_domain::approval::ApprovalState;

use crate::{wait, EventView, LogEvent, RunView, TestStack};

/// `launch`: a high-risk skill (it tells the time, so its result is real).
pub async fn put_launch(t: &TestStack) {
    let body = json!({"executor": "current_time", "risk": "high", "description": "Launches."});
    t.admin
        .call(Method::PUT, "/v1/skills/launch", Some(&body), true)
        .await
        .unwrap();
}

pub async fn put_agent(
    t: &TestStack,
    name: &str,
    skills: &[&str],
    approvals: Value,
    sandbox: Value,
) {
    let def = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
        "system_prompt": format!("You are {name}."),
        "skills": skills,
        "approvals": approvals,
        "sandbox": sandbox,
        "limits": {"timeout_s": 60}
    });
    t.admin
        .call(Method::PUT, &format!("/v1/agents/{name}"), Some(&def), true)
        .await
        .unwrap();
}

/// A key of `tenant` with `role`, as a client.
pub async fn key(t: &TestStack, tenant: &str, role: &str) -> (Client, String) {
    let v = t
        .admin
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant}/keys"),
            Some(&json!({ "role": role })),
            true,
        )
        .await
        .unwrap();
    assert_eq!(v["role"], role);
    let k = v["key"].as_str().unwrap().to_string();
    (Client::new(&t.stack.api_url, &k, None), k)
}

/// Waits until the Run is in `state` (up to a minute).
pub async fn wait_state(c: &Client, run_id: &str, state: &str) -> RunView {
    let what = format!("run {run_id} to be {state}");
    wait::until(&what, Duration::from_secs(60), || async {
        let run = c.run(run_id).await.unwrap();
        (run.state.as_str() == state).then_some(run)
    })
    .await
}

/// The events' types, in order.
pub fn kinds(events: &[EventView]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind().as_str()).collect()
}

/// An approval, as `GET /v1/approvals/{id}` shows it.
pub async fn approval(c: &Client, approval_id: &str) -> ApprovalView {
    let path = format!("/v1/approvals/{approval_id}");
    c.typed(Method::GET, &path, None).await.unwrap()
}

/// The tenant's approvals in `state`, newest first.
pub async fn approvals_in(c: &Client, state: &str) -> Vec<ApprovalView> {
    let path = format!("/v1/approvals?state={state}");
    let list: ApprovalList = c.typed(Method::GET, &path, None).await.unwrap();
    list.approvals
}

/// The approvals a Run asked for, in the order it asked.
pub async fn approvals_of(c: &Client, run_id: &str) -> Vec<String> {
    c.events(run_id, 0, 0)
        .await
        .unwrap()
        .events
        .into_iter()
        .filter_map(|e| match e.event {
            LogEvent::ApprovalRequested { approval_id, .. } => Some(approval_id),
            _ => None,
        })
        .collect()
}

/// The review link of `approval_id` in the outbox's `.eml` files, once
/// its email is there.
pub async fn eml_link(outbox: &Path, approval_id: &str) -> String {
    let what = format!("an email for {approval_id} in {}", outbox.display());
    let marker = format!("/v1/approvals/{approval_id}/review?token=");
    wait::until(&what, wait::PATIENCE, || async {
        std::fs::read_dir(outbox)
            .into_iter()
            .flatten()
            .flatten()
            .find_map(|entry| {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let link = text
                    .lines()
                    .find(|l| l.contains(&marker))?
                    .trim()
                    .to_string();
                assert!(text.contains("\r\nSubject: "), "{text}");
                Some(link)
            })
    })
    .await
}

pub async fn get_page(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Submits the review page's form, as a browser would.
pub async fn submit(api: &str, approval_id: &str, token: &str, decision: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("{api}/v1/approvals/{approval_id}/review"))
        .form(&[("token", token), ("decision", decision), ("comment", "")])
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

pub fn token_of(link: &str) -> String {
    link.split("token=").nth(1).unwrap().to_string()
}

pub async fn decide(
    c: &Client,
    approval_id: &str,
    decision: &str,
    comment: &str,
) -> Result<Value, u16> {
    c.post(
        &format!("/v1/approvals/{approval_id}/decision"),
        &json!({"decision": decision, "comment": comment}),
    )
    .await
    .map_err(|e| {
        e.downcast_ref::<armada_cli::client::ApiFailure>()
            .map_or(0, |f| f.status)
    })
}

/// Waits for the Run to pause, then the view of the first approval it
/// asked for.
pub async fn first_approval(c: &Client, run_id: &str) -> ApprovalView {
    wait_state(c, run_id, "AWAITING_HITL").await;
    let ids = approvals_of(c, run_id).await;
    approval(c, &ids[0]).await
}
