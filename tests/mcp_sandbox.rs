//! A skill whose program is an MCP server over stdio, run in the agent's
//! sandbox: npm's `@modelcontextprotocol/server-filesystem`, its tools as
//! its own `tools/list` answers them (listed here as `armada skills
//! list-tools` does), installed in the sandbox by the skill's `install`
//! step from its uploaded `package.json`, started by the jail and kept
//! across calls. It writes in the workspace; told it may write anywhere,
//! the jail still keeps it out of the rest of the machine; killed between
//! calls, it is started again by the next.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use armada_api::runs::RunView;
use armada_cli::local::emulator;
use armada_tests::sandbox::{start, tool_result};
use armada_tests::{outcome, root, TestStack};

const FILESYSTEM: &str = "@modelcontextprotocol/server-filesystem";
const VERSION: &str = "2026.8.31";
/// The server's entry point, in the skill's directory once installed.
const ENTRY: &str = "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js";

/// The tools the test offers, as the real server lists them.
async fn listed_tools(wanted: &[&str]) -> Value {
    let pin = format!("{FILESYSTEM}@{VERSION}");
    let dir = emulator::install_npm_tool(&root(), "mcp-filesystem", &[&pin]).unwrap();
    let command = [
        "node".to_string(),
        dir.join(ENTRY).display().to_string(),
        dir.display().to_string(),
    ];
    let all = armada_cli::skills::list_stdio_tools(&command)
        .await
        .unwrap();
    let kept: Vec<Value> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| wanted.contains(&t["name"].as_str().unwrap_or_default()))
        .cloned()
        .collect();
    assert_eq!(kept.len(), wanted.len(), "{all}");
    Value::Array(kept)
}

/// A tar of one `package.json` that depends on the server, as GNU tar
/// makes it.
fn package() -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!("armada-mcp-pkg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = json!({"name": "fs-skill", "private": true,
        "dependencies": {FILESYSTEM: VERSION}});
    std::fs::write(dir.join("package.json"), manifest.to_string()).unwrap();
    let out = std::process::Command::new("tar")
        .current_dir(&dir)
        .args(["-cf", "-", "package.json"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success());
    out.stdout
}

async fn ask(t: &TestStack, input: &str) -> RunView {
    let run_id = t.client.create_run("files", input).await.unwrap();
    // The first call installs the server from npm.
    t.client
        .wait_run(&run_id, Duration::from_secs(240))
        .await
        .unwrap()
}

/// The workspace as the server lists it holds the directory it made.
async fn lists_what_it_made(t: &TestStack) {
    let run = ask(t, r#"/tool fs__list_directory {"path": "."}"#).await;
    let r = tool_result(&run, "fs__list_directory");
    let text = r["text"].as_str().unwrap_or_default();
    assert!(text.contains("[DIR] made-by-mcp"), "{r}");
}

fn server_pids() -> Vec<i32> {
    let out = std::process::Command::new("pgrep")
        .args(["-f", &format!("{ENTRY} \\. /$")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_mcp_server_from_npm_runs_in_the_jail_and_comes_back_when_killed() {
    let tools = listed_tools(&["create_directory", "list_directory", "write_file"]).await;
    let t = start().await;
    let admin = t.stack.admin_key.clone();
    let skill = json!({
        "description": "Files, by the MCP project's filesystem server.",
        "program": {
            // The workspace first (relative paths are its), then the
            // whole machine: only the jail says no.
            "command": ["node", format!(".skills/fs/{ENTRY}"), ".", "/"],
            "protocol": "mcp",
            "install": ["npm install --no-audit --no-fund --ignore-scripts --loglevel=error"],
            "tools": tools,
        },
        "timeout_s": 180,
    });
    let put = |path: String, body: Value| {
        let admin = admin.clone();
        let t = &t;
        async move {
            t.raw(
                Method::PUT,
                &path,
                Some(&admin),
                Some(&body.to_string()),
                &[],
            )
            .await
        }
    };
    let (status, v) = put("/v1/skills/fs".into(), skill).await;
    assert_eq!(status, 200, "{v}");
    let resp = reqwest::Client::new()
        .put(format!("{}/v1/skills/fs/files", t.stack.api_url))
        .bearer_auth(&admin)
        .header("content-type", "application/x-tar")
        .body(package())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let agent = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
        "system_prompt": "You keep files.",
        "skills": ["fs"],
        "limits": {"timeout_s": 300}
    });
    let (status, v) = put("/v1/agents/files".into(), agent).await;
    assert_eq!(status, 200, "{v}");
    // The agent's version froze the server's listing with the skill.
    let tools = &v["manifests"]["fs"]["program"]["tools"];
    assert_eq!(tools.as_array().map(Vec::len), Some(3), "{v}");

    let run = ask(&t, r#"/tool fs__create_directory {"path": "made-by-mcp"}"#).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let r = tool_result(&run, "fs__create_directory");
    let text = r["text"].as_str().unwrap_or_default();
    assert!(text.contains("Successfully created"), "{r}");
    lists_what_it_made(&t).await;

    // Outside the workspace the server would write; the jail refuses.
    let escape = format!("/opt/armada-mcp-escape-{}", std::process::id());
    let ask_escape = format!(r#"/tool fs__create_directory {{"path": "{escape}"}}"#);
    let run = ask(&t, &ask_escape).await;
    let r = tool_result(&run, "fs__create_directory");
    assert_eq!(r["error"]["code"], "TOOL_ERROR", "{r}");
    assert!(!std::path::Path::new(&escape).exists());

    // Killed between calls: the next call starts it again.
    let pids = server_pids();
    assert_eq!(pids.len(), 1, "one server kept across calls: {pids:?}");
    for pid in &pids {
        let killed = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
    }
    lists_what_it_made(&t).await;
    let again = server_pids();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_ne!(again, pids);
    t.stack.stop().await;
}
