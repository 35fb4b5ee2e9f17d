//! Helpers of the sandbox tests: a stack with a quick watchdog, agents with
//! code skills, their ECS tasks and files, and polling for a condition.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use armada_api::runs::RunView;
pub use armada_api::sandboxes::SandboxView;
use armada_cli::client::Client;
use armada_core::adapters::ecs::started_by;
pub use armada_domain::sandbox::lifecycle::SandboxState;

use crate::{params, TestStack};

/// Quick watchdog, heartbeat and staleness, so losses show in seconds.
pub fn fast() -> HashMap<String, String> {
    params(&[
        ("SandboxCheckSeconds", "1"),
        ("SandboxHeartbeatSeconds", "1"),
        ("SandboxStaleSeconds", "4"),
    ])
}

pub async fn start() -> TestStack {
    TestStack::start_with(fast(), None).await
}

/// The result JSON inside the scripted model's `tool <name> returned: <json>`.
pub fn tool_result(run: &RunView, skill: &str) -> Value {
    let out = run.output.as_deref().unwrap_or_default();
    let json = out
        .strip_prefix(&format!("tool {skill} returned: "))
        .unwrap_or_else(|| panic!("not a {skill} result: {run:?}"));
    serde_json::from_str(json).unwrap()
}

pub fn sh(command: &str) -> String {
    format!("/tool shell_exec {}", json!({ "command": command }))
}

pub fn py(code: &str) -> String {
    format!("/tool python_exec {}", json!({ "code": code }))
}

/// The caller's sandbox of `agent`, as the API shows it.
pub async fn sandbox_of(c: &Client, agent: &str) -> SandboxView {
    let path = format!("/v1/sandboxes/{agent}");
    c.typed(Method::GET, &path, None).await.unwrap()
}

pub async fn put_agent(t: &TestStack, name: &str, sandbox: Value) -> Value {
    t.admin
        .call(
            Method::PUT,
            &format!("/v1/agents/{name}"),
            Some(&json!({
                "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
                "system_prompt": "You run code.",
                "skills": ["shell_exec", "python_exec", "file_read", "file_write", "serve"],
                "sandbox": sandbox,
                "limits": {"timeout_s": 120}
            })),
            true,
        )
        .await
        .unwrap()
}

pub async fn tasks_of(t: &TestStack, tenant: &str, agent: &str) -> Vec<String> {
    t.stack
        .aws
        .ecs
        .list_tasks()
        .cluster(&t.stack.svc.cfg.sandbox.cluster)
        .started_by(started_by(tenant, agent))
        .send()
        .await
        .unwrap()
        .task_arns()
        .to_vec()
}

/// A task as the emulator's ECS describes it.
pub async fn describe_task(t: &TestStack, arn: &str) -> aws_sdk_ecs::types::Task {
    let d = t
        .stack
        .aws
        .ecs
        .describe_tasks()
        .cluster(&t.stack.svc.cfg.sandbox.cluster)
        .tasks(arn)
        .send()
        .await
        .unwrap();
    d.tasks()[0].clone()
}

pub async fn task_status(t: &TestStack, arn: &str) -> String {
    describe_task(t, arn)
        .await
        .last_status()
        .unwrap_or_default()
        .to_string()
}

/// The admin destroys a tenant's sandbox of `agent`; its view after.
pub async fn destroy_sandbox(t: &TestStack, tenant: &str, agent: &str) -> Value {
    t.admin
        .call(
            Method::DELETE,
            &format!("/v1/sandboxes/{agent}?tenant={tenant}"),
            None,
            true,
        )
        .await
        .unwrap()
}

pub fn task_dir(t: &TestStack, arn: &str) -> PathBuf {
    PathBuf::from("/var/tmp/armada")
        .join(t.stack.template.stack())
        .join(arn.rsplit('/').next().unwrap())
}

pub use crate::wait::eventually;

/// A client of another tenant (a key the admin mints for it).
pub async fn tenant_client(t: &TestStack, tenant: &str) -> Client {
    let minted = t
        .admin
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant}/keys"),
            None,
            true,
        )
        .await
        .unwrap();
    Client::new(&t.stack.api_url, minted["key"].as_str().unwrap(), None)
}

/// A Run of `agent` by `c`'s tenant, waited for: its final view.
pub async fn ask_as(c: &Client, agent: &str, input: &str) -> RunView {
    let run_id = c.create_run(agent, input).await.unwrap();
    c.wait_run(&run_id, Duration::from_secs(60)).await.unwrap()
}

/// The stdout of a Run's `shell_exec` call, or why it has none.
pub fn stdout_of(run: &RunView) -> String {
    let r = tool_result(run, "shell_exec");
    r["stdout"]
        .as_str()
        .unwrap_or_else(|| panic!("no stdout: {r}"))
        .to_string()
}

/// Where the data plane keeps the tenants' `/data` (beside the stacks'
/// sandbox roots): `tenants/<tenant>/users/<user>/workspace`.
pub fn data_dir() -> PathBuf {
    PathBuf::from("/var/tmp/armada/data")
}
