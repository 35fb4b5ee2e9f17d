use serde_json::json;

use super::*;

#[test]
fn a_program_is_read_with_its_environment() {
    let p = Program::parse(&json!({
        "command": ["python3", "tool.py", "--fast"],
        "protocol": "json",
        "env": {"CRM_TOKEN": {"secret": "crm-token"}, "MODE": "live"},
    }))
    .unwrap();
    assert_eq!(p.command, ["python3", "tool.py", "--fast"]);
    assert_eq!(p.protocol, ProgramProtocol::Json);
    assert_eq!(
        p.env["CRM_TOKEN"],
        Configured::Secret {
            secret: "crm-token".into()
        }
    );
}

#[test]
fn bad_programs_are_refused_naming_the_field() {
    let field = |v: Value| Program::parse(&v).unwrap_err().field;
    let ok = json!({"command": ["tool"], "protocol": "json"});
    let with = |k: &str, v: Value| {
        let mut o = ok.clone();
        o[k] = v;
        o
    };
    assert_eq!(field(json!("tool")), "program");
    assert_eq!(field(with("command", json!([]))), "program.command");
    assert_eq!(field(with("command", json!([""]))), "program.command");
    assert_eq!(field(with("command", json!("tool"))), "program.command");
    assert_eq!(
        field(with("protocol", json!("mcp-ish"))),
        "program.protocol"
    );
    assert_eq!(field(json!({"command": ["tool"]})), "program.protocol");
    for name in ["PATH", "LD_PRELOAD", "ARMADA_KEY", "1X", "A-B", ""] {
        let env = json!({ name: "x" });
        assert_eq!(
            field(with("env", env)),
            format!("program.env.{name}"),
            "{name}"
        );
    }
    assert_eq!(
        field(with("env", json!({"T": {"secret": "Bad Name"}}))),
        "program.env.T.secret"
    );
    assert_eq!(field(with("args", json!([]))), "program.args");
    for steps in [json!("npm ci"), json!([" "]), json!(vec!["true"; 9])] {
        assert_eq!(field(with("install", steps)), "program.install");
    }
}

#[test]
fn install_steps_are_kept_and_a_bodys_files_are_not() {
    let p = Program::parse(&json!({
        "command": ["node", "server.js"],
        "protocol": "json",
        "install": ["npm ci --omit=dev"],
        "files": {"sha256": "forged", "bytes": 1, "files": 1},
    }))
    .unwrap();
    assert_eq!(p.install, ["npm ci --omit=dev"]);
    // Only an upload names a version.
    assert_eq!(p.files, None);
}

#[test]
fn a_sealed_environment_opens_only_for_its_generation_and_call() {
    let env = vec![EnvVar {
        name: "CRM_TOKEN".into(),
        value: "tok-9f8e7d6c5b".into(),
        secret: Some("crm-token".into()),
    }];
    let call = env_binding("run_1", "call_1", 1);
    let sealed = seal_env("key-of-generation-3", &call, &env).unwrap();
    assert!(!sealed.contains("tok-9f8e"));
    assert_eq!(open_env("key-of-generation-3", &call, &sealed), Some(env));
    assert_eq!(open_env("key-of-generation-4", &call, &sealed), None);
    let other = env_binding("run_1", "call_1", 2);
    assert_eq!(open_env("key-of-generation-3", &other, &sealed), None);
    assert_eq!(open_env("key-of-generation-3", &call, "not base64!"), None);
}

#[test]
fn a_json_programs_run_is_its_output_or_its_failure() {
    assert_eq!(json_answer(0, " {\"sum\": 3}\n", ""), Ok(json!({"sum": 3})));
    let (code, message) = json_answer(2, "", "Traceback...\nKeyError: 'a'").unwrap_err();
    assert_eq!(code, "PROGRAM_FAILED");
    assert!(
        message.contains("exited 2") && message.contains("KeyError"),
        "{message}"
    );
    let (code, _) = json_answer(0, "sum is 3", "").unwrap_err();
    assert_eq!(code, "PROGRAM_OUTPUT");
    let long = "x".repeat(10_000);
    let (_, message) = json_answer(1, "", &long).unwrap_err();
    assert!(message.len() < 2100);
}

#[test]
fn an_mcp_program_offers_the_tools_its_listing_names() {
    let tool = |name: &str| json!({"name": name, "inputSchema": {"type": "object"}});
    let mcp = |tools: Value| json!({"command": ["srv"], "protocol": "mcp", "tools": tools});
    let p = Program::parse(&mcp(json!([tool("read"), tool("write")]))).unwrap();
    assert_eq!((p.protocol, p.tools.len()), (ProgramProtocol::Mcp, 2));
    let field = |v: Value| Program::parse(&v).unwrap_err().field;
    assert_eq!(field(mcp(json!([]))), "program.tools");
    assert_eq!(
        field(json!({"command": ["srv"], "protocol": "mcp"})),
        "program.tools"
    );
    assert_eq!(
        field(mcp(json!([tool("a"), tool("a")]))),
        "program.tools[1].name"
    );
    assert_eq!(field(mcp(json!([tool("a b")]))), "program.tools[0].name");
    assert_eq!(
        field(mcp(json!([{"name": "a", "inputSchema": "object"}]))),
        "program.tools[0].inputSchema"
    );
    assert_eq!(
        field(json!({"command": ["x"], "protocol": "json", "tools": [tool("a")]})),
        "program.tools"
    );
}
