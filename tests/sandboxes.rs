//! Sandboxes on the local stack: the harness asks ECS (the emulator's) for
//! a task, the local data plane runs the task's agent as a confined process,
//! and real skills run in it.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{json, Value};

use armada_tests::{outcome, TestStack};

/// The result JSON inside the scripted model's `tool <name> returned: <json>`.
fn tool_result(run: &Value, skill: &str) -> Value {
    let out = run["output"].as_str().unwrap_or_default();
    let prefix = format!("tool {skill} returned: ");
    let json = out
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("not a {skill} result: {run}"));
    serde_json::from_str(json).unwrap()
}

async fn sandbox(t: &TestStack, agent: &str) -> Value {
    t.client
        .get(&format!("/v1/sandboxes/{agent}"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coder_runs_a_command_in_its_own_sandbox() {
    let t = TestStack::start().await;
    let (run_id, run) = t
        .ask("coder", r#"/tool shell_exec {"command": "echo hi; id -u"}"#)
        .await;
    assert_eq!(outcome(&run), "COMPLETED", "{run}");
    let r = tool_result(&run, "shell_exec");
    assert_eq!(r["exit_code"], 0, "{r}");
    let uid: u32 = r["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        uid >= 300_000,
        "runs as the sandbox's own uid, not root: {uid}"
    );
    assert_eq!(r["stdout"].as_str().unwrap().lines().next(), Some("hi"));
    let types = t.event_types(&run_id).await;
    assert!(types.contains(&"tool_dispatched".to_string()), "{types:?}");
    let sb = sandbox(&t, "coder").await;
    assert_eq!(sb["state"], "READY", "{sb}");
    assert_eq!(sb["profile"], "workspace");
    assert!(sb["task_arn"].as_str().unwrap().contains(":task/"), "{sb}");
    for control in [
        "filesystem",
        "network",
        "syscalls",
        "memory",
        "cpu",
        "pids",
        "mounts",
    ] {
        let c = &sb["controls"][control];
        assert!(
            c["status"].is_string() && c["reason"].is_string(),
            "{control}: {sb}"
        );
    }
    assert_eq!(sb["controls"]["filesystem"]["status"], "enforced", "{sb}");
    assert_eq!(sb["controls"]["memory"]["status"], "enforced", "{sb}");
    // The run ended: it no longer holds the sandbox.
    let closed = t.wait_closed(&run_id).await;
    assert_eq!(closed["state"], "CLOSED_COMPLETED");
    let sb = sandbox(&t, "coder").await;
    assert!(sb["holder_run_id"].is_null(), "{sb}");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chat_run_of_an_on_tool_use_agent_creates_no_task() {
    let t = TestStack::start().await;
    let (_, run) = t.ask("coder", "just talk to me").await;
    assert_eq!(run["output"], "echo: just talk to me");
    let (status, body) = t
        .raw(
            reqwest::Method::GET,
            "/v1/sandboxes/coder",
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let tasks = t
        .stack
        .aws
        .ecs
        .list_tasks()
        .cluster(&t.stack.svc.cfg.sandbox.cluster)
        .send()
        .await
        .unwrap();
    assert!(tasks.task_arns().is_empty(), "no task was started");
    let _ = json!(null);
    let _ = Duration::from_secs(0);
    t.stack.stop().await;
}
