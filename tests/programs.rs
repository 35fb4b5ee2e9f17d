//! Skills that bring their own program, on the local stack: registered
//! with its command and environment (a tenant's secret named), called by
//! a Run, run in the agent's sandbox by its agent with the environment
//! the harness sealed for that one generation and call; the secret's
//! value reaches the program and nothing recorded; a secret the tenant
//! lacks refuses the call, naming only the name; bad programs are `400`.

#![allow(clippy::unwrap_used)]

use reqwest::Method;
use serde_json::{json, Value};

use armada_tests::sandbox::{start, tool_result};
use armada_tests::{outcome, TestStack};

const TOKEN: &str = "tok-prog-4c3b2a19f8";

/// Adds `a` and `b`, and says how long its token is and whether it is
/// the one it should be (it never prints the token itself but once, on
/// purpose, to show it is scrubbed).
const ADDER: &str = "import json, os, sys\n\
a = json.load(sys.stdin)\n\
t = os.environ['CRM_TOKEN']\n\
print(json.dumps({'sum': a['a'] + a['b'], 'token_len': len(t), 'echo': t}))";

async fn put(t: &TestStack, path: &str, body: &Value) -> (u16, Value) {
    let admin = t.stack.admin_key.clone();
    t.raw(
        Method::PUT,
        path,
        Some(&admin),
        Some(&body.to_string()),
        &[],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_skill_runs_its_own_program_with_the_tenants_secret() {
    let t = start().await;
    t.put_secret("crm-token", TOKEN).await;
    let skill = json!({
        "description": "Adds two numbers.",
        "program": {
            "command": ["python3", "-c", ADDER],
            "protocol": "json",
            "env": {"CRM_TOKEN": {"secret": "crm-token"}},
        },
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    });
    let (status, v) = put(&t, "/v1/skills/adder", &skill).await;
    assert_eq!(status, 200, "{v}");
    let agent = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
        "system_prompt": "You add.",
        "skills": ["adder"],
        "limits": {"timeout_s": 120}
    });
    let (status, v) = put(&t, "/v1/agents/adder", &agent).await;
    assert_eq!(status, 200, "{v}");

    let (run_id, run) = t.ask("adder", r#"/tool adder {"a": 2, "b": 3}"#).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let r = tool_result(&run, "adder");
    assert_eq!(r["sum"], 5, "{r}");
    assert_eq!(r["token_len"], TOKEN.len());
    assert_eq!(r["echo"], "[secret:crm-token]");
    let events = serde_json::to_string(&t.events(&run_id).await).unwrap();
    assert!(!events.contains(TOKEN), "{events}");
    assert!(events.contains("tool_dispatched"), "it ran in the sandbox");

    // Deleted: the call is refused, naming only the name, and not run.
    t.delete_secret("crm-token").await;
    let (_, run) = t.ask("adder", r#"/tool adder {"a": 1, "b": 1}"#).await;
    let r = tool_result(&run, "adder");
    assert_eq!(r["error"]["code"], "SECRET_NOT_FOUND", "{r}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("crm-token"));
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_programs_are_refused_naming_the_field() {
    let t = TestStack::start().await;
    let cases = [
        (
            json!({"program": {"command": [], "protocol": "json"}}),
            "program.command",
        ),
        (
            json!({"program": {"command": ["x"], "protocol": "mcp2"}}),
            "program.protocol",
        ),
        (
            json!({"program": {"command": ["x"], "protocol": "json", "env": {"PATH": "/x"}}}),
            "program.env.PATH",
        ),
        (
            json!({"program": {"command": ["x"], "protocol": "json"}, "executor": "shell_exec"}),
            "executor",
        ),
        (
            json!({"program": {"command": ["x"], "protocol": "json"}, "kind": "external_api"}),
            "kind",
        ),
    ];
    for (body, field) in cases {
        let (status, v) = put(&t, "/v1/skills/bad", &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["code"], "INVALID_FIELD", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{field}: {message}");
    }
    t.stack.stop().await;
}
