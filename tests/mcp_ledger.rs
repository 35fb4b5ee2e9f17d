//! A tool's own annotations decide what a crash and a risk mean, against
//! an MCP server built with PyPI's `mcp` (its `MCPServer`;
//! `tests/fixtures/mcp/ledger-server.py`) that checks a bearer token the
//! tenant keeps as a secret and pages its tool list: an idempotent tool's
//! lost result is asked again, an unannotated one's becomes
//! `TOOL_INDETERMINATE` with its effect done once, a destructive one
//! waits for an approval and runs once approved; the token reaches the
//! server and nothing recorded holds it. Calls share a session until the
//! server ends it, and then begin another.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use armada_api::registry::AgentView;
use armada_cli::local::emulator;
use armada_tests::approvals::{approvals_of, decide, key, wait_state};
use armada_tests::{fast_redelivery, free_port, outcome, root, wait, CrashAfterTools, TestStack};

const TOKEN: &str = "tok-mcp-5d1e9a77c3";

/// The Python server on a port of its own; killed when dropped.
struct LedgerServer {
    child: Child,
    url: String,
    /// One line per call with an effect.
    calls: PathBuf,
    /// One line per session the server began (its id).
    sessions: PathBuf,
}

impl Drop for LedgerServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.calls);
        let _ = std::fs::remove_file(&self.sessions);
    }
}

impl LedgerServer {
    /// The ids of the sessions the server began, oldest first.
    fn sessions(&self) -> Vec<String> {
        std::fs::read_to_string(&self.sessions)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// How many calls of `tool` the server carried out.
    fn calls(&self, tool: &str) -> usize {
        std::fs::read_to_string(&self.calls)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.split(' ').next() == Some(tool))
            .count()
    }
}

async fn ledger_server() -> LedgerServer {
    let python = emulator::install_isolated_tool(
        &root(),
        "mcp",
        "2.3.0",
        include_str!("fixtures/mcp/requirements.txt"),
        "python",
    )
    .unwrap();
    let port = free_port();
    let calls = std::env::temp_dir().join(format!("armada-mcp-calls-{port}"));
    let sessions = std::env::temp_dir().join(format!("armada-mcp-sessions-{port}"));
    for f in [&calls, &sessions] {
        let _ = std::fs::remove_file(f);
    }
    let child = Command::new(python)
        .arg(root().join("tests/fixtures/mcp/ledger-server.py"))
        .arg(port.to_string())
        .env("MCP_TOKEN", TOKEN)
        .env("MCP_CALLS", &calls)
        .env("MCP_SESSIONS", &sessions)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = LedgerServer {
        child,
        url: format!("http://127.0.0.1:{port}/mcp"),
        calls,
        sessions,
    };
    wait::listening("the MCP server", port).await;
    server
}

/// The tenant keeps the server's token as a secret; the agent `ledger`
/// names it, and its tools are listed (every page) with it.
async fn register(t: &TestStack, server: &LedgerServer) -> AgentView {
    t.put_secret("mcp-token", &format!("Bearer {TOKEN}")).await;
    let def = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
        "system_prompt": "You keep the books.",
        "mcp_servers": [{
            "name": "books",
            "url": server.url,
            "headers": {"Authorization": {"secret": "mcp-token"}},
        }],
        "limits": {"timeout_s": 60}
    });
    let path = format!("/v1/agents/ledger?tenant={}", t.stack.tenant);
    let admin = t.stack.admin_key.clone();
    let (status, v) = t
        .raw(
            Method::PUT,
            &path,
            Some(&admin),
            Some(&def.to_string()),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let view: AgentView = serde_json::from_value(v).unwrap();
    let m = &view.definition["manifests"];
    // Four tools over two pages, each at the risk its annotations imply.
    let risks: Vec<(&str, &str)> = ["add", "set_flag", "charge", "delete_thing"]
        .iter()
        .map(|tool| {
            let name = format!("books__{tool}");
            (*tool, m[&name]["risk"].as_str().unwrap_or("missing"))
        })
        .collect();
    assert_eq!(
        risks,
        [
            ("add", "low"),
            ("set_flag", "medium"),
            ("charge", "medium"),
            ("delete_thing", "high")
        ],
        "{m}"
    );
    view
}

/// Nothing the stack shows of a Run holds the token.
async fn holds_no_token(t: &TestStack, run_id: &str) {
    let key = t.stack.tenant_key.clone();
    let events = serde_json::to_string(&t.events(run_id).await).unwrap();
    let (_, view) = t
        .raw(
            Method::GET,
            &format!("/v1/runs/{run_id}"),
            Some(&key),
            None,
            &[],
        )
        .await;
    for text in [events, view.to_string()] {
        assert!(!text.contains(TOKEN), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn annotations_decide_what_a_lost_result_means() {
    let server = ledger_server().await;
    let t = TestStack::start_with(fast_redelivery("5"), Some(Arc::new(CrashAfterTools))).await;
    register(&t, &server).await;

    // Idempotent: the worker died after the call, and the call is made
    // again for the step that carries on.
    let (run_id, run) = t
        .ask("ledger", r#"/tool books__set_flag {"name": "closed"}"#)
        .await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert_eq!(server.calls("set_flag"), 2, "asked again after the crash");
    holds_no_token(&t, &run_id).await;

    // Says nothing of itself: done once, and the Run says it is uncertain.
    let (run_id, run) = t
        .ask("ledger", r#"/tool books__charge {"amount": 42}"#)
        .await;
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "TOOL_INDETERMINATE"
    );
    assert_eq!(server.calls("charge"), 1, "never replayed");
    holds_no_token(&t, &run_id).await;
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_destructive_tool_waits_for_an_approval_and_runs_once() {
    let server = ledger_server().await;
    let t = TestStack::start().await;
    register(&t, &server).await;
    let (approver, _) = key(&t, &t.stack.tenant, "approver").await;
    let run_id = t
        .client
        .create_run(
            "ledger",
            r#"/tool books__delete_thing {"name": "ledger-2025"}"#,
        )
        .await
        .unwrap();
    wait_state(&t.client, &run_id, "AWAITING_HITL").await;
    assert_eq!(server.calls("delete_thing"), 0, "not before the decision");
    let asked = approvals_of(&t.client, &run_id).await;
    assert_eq!(asked.len(), 1);
    decide(&approver, &asked[0], "approve", "").await.unwrap();
    let run = t
        .client
        .wait_run(&run_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert!(
        run.output
            .as_deref()
            .unwrap_or_default()
            .contains("deleted ledger-2025"),
        "{run:?}"
    );
    assert_eq!(server.calls("delete_thing"), 1);
    holds_no_token(&t, &run_id).await;
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_share_a_session_until_the_server_ends_it() {
    let server = ledger_server().await;
    let t = TestStack::start().await;
    register(&t, &server).await;
    let listed = server.sessions().len();
    let add = |a: u32| format!(r#"/tool books__add {{"a": {a}, "b": 1}}"#);
    for a in [1, 2] {
        let (_, run) = t.ask("ledger", &add(a)).await;
        assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    }
    let begun = server.sessions();
    assert_eq!(begun.len(), listed + 1, "two calls, one session: {begun:?}");

    // The server ends it (as one restarted or idle would): the next call
    // meets a 404 on its id, and a new session is begun for it.
    let ended = reqwest::Client::new()
        .delete(&server.url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("mcp-session-id", begun.last().unwrap())
        .send()
        .await
        .unwrap();
    assert!(ended.status().is_success(), "{}", ended.status());
    let (_, run) = t.ask("ledger", &add(3)).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert!(
        run.output.as_deref().unwrap_or_default().contains('4'),
        "{run:?}"
    );
    assert_eq!(server.sessions().len(), listed + 2);
    t.stack.stop().await;
}
