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

/// Reads the arguments, the file its install step built, and how many
/// times that step ran (it appends a line each time).
const FILED: &str = "import json, os, sys\n\
a = json.load(sys.stdin)\n\
d = os.environ['ARMADA_SKILL_DIR']\n\
built = open(os.path.join(d, 'built.txt')).read()\n\
installs = len(open('.skills/filed-installs.log').read().splitlines())\n\
print(json.dumps({'sum': a['a'] + a['b'], 'built': built, 'installs': installs, 'dir': d}))";

/// A gzip of a tar that GNU tar made of `files` (relative name → text),
/// as `tar -czf` makes it, with `extra` arguments.
fn gnu_tar(files: &[(&str, &str)], extra: &[&str]) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!(
        "armada-tar-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    for (name, text) in files {
        let at = dir.join(name);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(at, text).unwrap();
    }
    let out = std::process::Command::new("tar")
        .current_dir(&dir)
        .args(["-czf", "-"])
        .args(extra)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

async fn upload(t: &TestStack, skill: &str, body: Vec<u8>) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .put(format!("{}/v1/skills/{skill}/files", t.stack.api_url))
        .bearer_auth(&t.stack.admin_key)
        .header("content-type", "application/gzip")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_programs_uploaded_files_are_staged_and_installed_once_per_version() {
    let t = start().await;
    let skill = json!({
        "description": "Adds two numbers with its own files.",
        "program": {
            "command": ["python3", ".skills/filed/tool/main.py"],
            "protocol": "json",
            "install": [
                "python3 -c \"open('built.txt', 'w').write('built by install')\"",
                "echo ran >> ../filed-installs.log",
            ],
        },
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    });
    let (status, v) = put(&t, "/v1/skills/filed", &skill).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = upload(&t, "filed", gnu_tar(&[("tool/main.py", FILED)], &["."])).await;
    assert_eq!(status, 200, "{v}");
    let files = v["program"]["files"].clone();
    assert_eq!(files["files"], 1, "{v}");
    assert_eq!(files["sha256"].as_str().unwrap().len(), 64, "{v}");
    // The manifest written again keeps its upload.
    let (_, v) = put(&t, "/v1/skills/filed", &skill).await;
    assert_eq!(v["program"]["files"], files, "{v}");
    let agent = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
        "system_prompt": "You add.",
        "skills": ["filed"],
        "limits": {"timeout_s": 120}
    });
    let (status, v) = put(&t, "/v1/agents/filed", &agent).await;
    assert_eq!(status, 200, "{v}");

    for (a, b) in [(2, 3), (4, 5)] {
        let ask = format!(r#"/tool filed {{"a": {a}, "b": {b}}}"#);
        let (_, run) = t.ask("filed", &ask).await;
        assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
        let r = tool_result(&run, "filed");
        assert_eq!(r["sum"], a + b, "{r}");
        assert_eq!(r["built"], "built by install", "{r}");
        assert_eq!(r["dir"], ".skills/filed", "{r}");
        // Installed by the first call only.
        assert_eq!(r["installs"], 1, "{r}");
    }
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_uploads_are_refused_naming_what_is_wrong() {
    let t = TestStack::start().await;
    let program = json!({"program": {"command": ["x"], "protocol": "json"}});
    let (status, _) = put(&t, "/v1/skills/up", &program).await;
    assert_eq!(status, 200);
    let ok = gnu_tar(&[("a.txt", "a")], &["."]);
    // A member out of the skill's directory, kept so by -P.
    let escape = gnu_tar(&[("in/a.txt", "a")], &["-P", "in/../in/a.txt"]);
    let cases = [
        ("up", escape, 400, "INVALID_ARCHIVE", Some("'..'")),
        (
            "up",
            b"not a tar at all".to_vec(),
            400,
            "INVALID_ARCHIVE",
            None,
        ),
        ("nope", ok.clone(), 404, "NOT_FOUND", None),
        ("current_time", ok.clone(), 404, "NOT_FOUND", None),
    ];
    for (skill, body, want, code, names) in cases {
        let (status, v) = upload(&t, skill, body).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (want, Some(code)),
            "{v}"
        );
        if let Some(n) = names {
            assert!(v["error"]["message"].as_str().unwrap().contains(n), "{v}");
        }
    }
    let (status, _) = put(&t, "/v1/skills/plain", &json!({"executor": "shell_exec"})).await;
    assert_eq!(status, 200);
    let (status, v) = upload(&t, "plain", ok).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("NO_PROGRAM")),
        "{v}"
    );
    let big = vec![7u8; 4 * 1024 * 1024 + 1];
    let (status, v) = upload(&t, "up", big).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (413, Some("PAYLOAD_TOO_LARGE")),
        "{v}"
    );
    t.stack.stop().await;
}
