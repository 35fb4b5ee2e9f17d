//! Remote MCP servers end to end, against the reference server the MCP
//! project publishes on npm (`@modelcontextprotocol/server-everything`,
//! Streamable HTTP): an agent registered with it has its tools listed and
//! frozen with their annotations' risk; a Run calls them inline, through
//! the egress guard, and gets their text, structured content and error
//! results, their progress as events; a server that cannot be listed (no
//! server, a private address, a web page that is no MCP server) is
//! refused naming it.

#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};

use reqwest::Method;
use serde_json::{json, Value};

use armada_api::registry::AgentView;
use armada_cli::local::emulator;
use armada_tests::{free_port, outcome, root, wait, LogEvent, TestStack};

const EVERYTHING: &[&str] = &["@modelcontextprotocol/server-everything@2026.8.31"];

/// The reference server, listening on a port of its own; killed when
/// dropped.
struct Everything {
    child: Child,
    url: String,
}

impl Drop for Everything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn everything() -> Everything {
    let dir = emulator::install_npm_tool(&root(), "mcp-everything", EVERYTHING).unwrap();
    let port = free_port();
    let child = Command::new(dir.join("node_modules/.bin/mcp-server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Everything {
        child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    };
    wait::listening("the MCP server", port).await;
    server
}

/// An HTTP server that is no MCP server: every request gets a web page's
/// 404.
async fn not_mcp() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", l.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let page = "<html><body>Not Found</body></html>";
                let answer = format!(
                    "HTTP/1.1 404 Not Found\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    url
}

fn agent(servers: Value) -> Value {
    json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
        "system_prompt": "You use tools.",
        "mcp_servers": servers,
        "limits": {"timeout_s": 60}
    })
}

/// What the scripted model's answer says its one tool call returned.
fn returned(output: &str) -> Value {
    output
        .split_once("returned: ")
        .and_then(|(_, j)| serde_json::from_str(j).ok())
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_uses_the_tools_a_remote_mcp_server_lists() {
    let server = everything().await;
    let t = TestStack::start().await;
    let key = t.stack.tenant_key.clone();
    let admin = t.stack.admin_key.clone();
    let tools = [
        "echo",
        "get-sum",
        "get-structured-content",
        "get-tiny-image",
        "trigger-long-running-operation",
    ];
    let def = agent(json!([{
        "name": "every",
        "url": server.url,
        "tools": tools,
        "risk": {"get-tiny-image": "medium"},
    }]));
    let (status, v) = t
        .raw(
            Method::PUT,
            "/v1/agents/mcp-user",
            Some(&admin),
            Some(&def.to_string()),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let view: AgentView = serde_json::from_value(v).unwrap();
    let manifests = &view.definition["manifests"];
    for tool in tools {
        let m = &manifests[format!("every__{tool}")];
        assert_eq!(m["mcp"]["tool"], tool, "{manifests}");
        assert_eq!(m["executor"], "mcp");
    }
    // The server says they only read: low risk, and repeatable; the
    // agent's own map wins over that.
    assert_eq!(manifests["every__get-sum"]["risk"], "low");
    assert_eq!(manifests["every__get-sum"]["idempotent"], true);
    assert_eq!(manifests["every__get-tiny-image"]["risk"], "medium");
    assert!(manifests["every__get-sum"]["parameters"]["properties"]["a"].is_object());

    let call = |tool: &str, args: Value| format!("/tool every__{tool} {args}");
    let (_, run) = t
        .ask("mcp-user", &call("get-sum", json!({"a": 2, "b": 3})))
        .await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let sum = returned(&run.output.clone().unwrap_or_default());
    assert!(sum["text"].as_str().unwrap().contains('5'), "{sum}");

    let (_, run) = t
        .ask(
            "mcp-user",
            &call("get-structured-content", json!({"location": "Chicago"})),
        )
        .await;
    let weather = returned(&run.output.clone().unwrap_or_default());
    assert!(
        weather["structured"]["temperature"].is_number(),
        "{weather}"
    );

    // An image is kept as the Run's artifact; the result names it.
    let (run_id, run) = t.ask("mcp-user", &call("get-tiny-image", json!({}))).await;
    let image = returned(&run.output.clone().unwrap_or_default());
    let content = image["content"].as_array().unwrap();
    let png = content
        .iter()
        .find(|c| c["type"] == "image" && c["mime_type"] == "image/png")
        .unwrap_or_else(|| panic!("{image}"));
    let artifact = png["artifact"].as_str().unwrap();
    let api = t.stack.api_url.as_str();
    let fetch = |key: String, path: String| async move {
        let resp = reqwest::Client::new()
            .get(format!("{api}{path}"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.bytes().await.unwrap().to_vec())
    };
    let path = format!("/v1/runs/{run_id}/artifacts/{artifact}");
    let (status, bytes) = fetch(key.clone(), path.clone()).await;
    assert_eq!(status, 200);
    assert!(bytes.starts_with(b"\x89PNG"), "{bytes:?}");
    assert_eq!(png["bytes"].as_u64(), Some(bytes.len() as u64));
    // Another tenant's key, and a name no call of the Run gives: nothing.
    let (_, other) = armada_tests::approvals::key(&t, "other", "member").await;
    let (status, _) = fetch(other, path).await;
    assert_eq!(status, 404);
    let bogus = format!("/v1/runs/{run_id}/artifacts/call_9_9-1");
    assert_eq!(fetch(key.clone(), bogus).await.0, 404);

    // A long-running tool's progress notifications are the Run's events,
    // before its result.
    let (run_id, run) = t
        .ask(
            "mcp-user",
            &call(
                "trigger-long-running-operation",
                json!({"duration": 1, "steps": 3}),
            ),
        )
        .await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let noted: Vec<f64> = t
        .events(&run_id)
        .await
        .into_iter()
        .filter_map(|e| match e.event {
            LogEvent::ToolProgress {
                progress, total, ..
            } => {
                assert_eq!(total, Some(3.0));
                Some(progress)
            }
            _ => None,
        })
        .collect();
    assert_eq!(noted, [1.0, 2.0, 3.0]);

    // The tool's own error result is the call's error.
    let (_, run) = t.ask("mcp-user", &call("echo", json!({}))).await;
    let failed = returned(&run.output.clone().unwrap_or_default());
    assert_eq!(failed["error"]["code"], "TOOL_ERROR", "{failed}");

    // A tenant sees the frozen tools too (they are the agent's contract).
    let (status, _) = t
        .raw(Method::GET, "/v1/agents/mcp-user", Some(&key), None, &[])
        .await;
    assert_eq!(status, 200);
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_cannot_be_listed_is_refused_naming_it() {
    let server = everything().await;
    let t = TestStack::start().await;
    let admin = t.stack.admin_key.clone();
    let put = |def: Value, query: &'static str| {
        let admin = admin.clone();
        let t = &t;
        async move {
            t.raw(
                Method::PUT,
                &format!("/v1/agents/mcp-bad{query}"),
                Some(&admin),
                Some(&def.to_string()),
                &[],
            )
            .await
        }
    };
    let closed = free_port();
    let web_page = not_mcp().await;
    let cases = [
        (
            json!([{"name": "gone", "url": format!("http://127.0.0.1:{closed}/mcp")}]),
            "",
            "MCP_UNREACHABLE",
            "mcp_servers[0]",
        ),
        (
            json!([{"name": "page", "url": web_page}]),
            "",
            "MCP_UNREACHABLE",
            "server 'page' could not be reached as an MCP server",
        ),
        (
            json!([{"name": "inside", "url": "http://10.255.255.1/mcp"}]),
            "",
            "EGRESS_REFUSED",
            "mcp_servers[0]",
        ),
        (
            json!([{"name": "every", "url": server.url, "tools": ["echo", "no-such-tool"]}]),
            "",
            "INVALID_FIELD",
            "mcp_servers[0].tools[1]",
        ),
        (
            json!([{"name": "every", "url": server.url,
                    "headers": {"Authorization": {"secret": "mcp-token"}}}]),
            "",
            "INVALID_FIELD",
            "mcp_servers[0].headers",
        ),
        (
            json!([{"name": "every", "url": server.url,
                    "headers": {"Authorization": {"secret": "mcp-token"}}}]),
            "?tenant=acme",
            "SECRET_NOT_FOUND",
            "mcp-token",
        ),
    ];
    for (servers, query, code, names) in cases {
        let (status, v) = put(agent(servers.clone()), query).await;
        assert_eq!(status, 400, "{servers}: {v}");
        assert_eq!(v["error"]["code"], code, "{servers}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "{servers}: {v}");
    }
    let (status, _) = t
        .raw(Method::GET, "/v1/agents/mcp-bad", Some(&admin), None, &[])
        .await;
    assert_eq!(status, 404, "nothing refused was written");

    // Refreshing lists again into a new version.
    let (status, v) = put(
        agent(json!([{"name": "every", "url": server.url, "tools": ["echo"]}])),
        "",
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let refresh = || {
        t.raw(
            Method::POST,
            "/v1/agents/mcp-bad/refresh-tools",
            Some(&admin),
            None,
            &[],
        )
    };
    let (status, v) = refresh().await;
    assert_eq!(status, 200, "{v}");
    let view: AgentView = serde_json::from_value(v).unwrap();
    assert_eq!(view.version, 2);
    assert!(view.definition["manifests"]["every__echo"].is_object());
    drop(server);
    let (status, v) = refresh().await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (400, json!("MCP_UNREACHABLE")),
        "{v}"
    );
    t.stack.stop().await;
}
