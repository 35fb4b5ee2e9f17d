use serde_json::json;

use super::*;

fn servers(v: Value) -> Result<Vec<McpServer>, FieldError> {
    McpServer::parse_list(&v)
}

fn tool(name: &str, hints: Option<ToolHints>) -> ListedTool {
    ListedTool {
        name: name.to_string(),
        title: None,
        description: Some(format!("{name} does it")),
        input_schema: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        hints,
    }
}

fn hints(read_only: bool, destructive: bool, idempotent: bool) -> Option<ToolHints> {
    Some(ToolHints {
        read_only: Some(read_only),
        destructive: Some(destructive),
        idempotent: Some(idempotent),
        open_world: None,
    })
}

#[test]
fn a_server_is_read_with_its_secret_headers_and_defaults() {
    let s = servers(json!([{
        "name": "crm",
        "url": "https://crm.example.com/mcp",
        "headers": {"Authorization": {"secret": "crm-token"}, "X-Team": "blue"},
    }]))
    .unwrap();
    assert_eq!(s[0].timeout_s, DEFAULT_MCP_TIMEOUT_S);
    assert_eq!(
        s[0].headers["Authorization"],
        Configured::Secret {
            secret: "crm-token".into()
        }
    );
    assert_eq!(s[0].tools, None);
}

#[test]
fn bad_servers_are_refused_naming_the_field() {
    let field = |v: Value| servers(v).unwrap_err().field;
    let ok = json!({"name": "crm", "url": "https://crm.example.com/mcp"});
    let with = |k: &str, v: Value| {
        let mut o = ok.clone();
        o[k] = v;
        json!([o])
    };
    assert_eq!(field(json!({})), "mcp_servers");
    assert_eq!(field(json!([ok, ok])), "mcp_servers[1].name");
    assert_eq!(field(with("name", json!("a__b"))), "mcp_servers[0].name");
    assert_eq!(field(with("name", json!("Crm"))), "mcp_servers[0].name");
    for url in ["ftp://x/mcp", "https://u:p@x/mcp", "https:///mcp", "x"] {
        assert_eq!(
            field(with("url", json!(url))),
            "mcp_servers[0].url",
            "{url}"
        );
    }
    assert_eq!(
        field(with("headers", json!({"Mcp-Session-Id": "x"}))),
        "mcp_servers[0].headers.Mcp-Session-Id"
    );
    assert_eq!(
        field(with("headers", json!({"X": {"secret": "Bad Name"}}))),
        "mcp_servers[0].headers.X.secret"
    );
    assert_eq!(field(with("tools", json!([]))), "mcp_servers[0].tools");
    assert_eq!(
        field(with("tools", json!(["a", "a"]))),
        "mcp_servers[0].tools[1]"
    );
    assert_eq!(
        field(with("risk", json!({"a": "severe"}))),
        "mcp_servers[0].risk.a"
    );
    assert_eq!(
        field(with("timeout_s", json!(0))),
        "mcp_servers[0].timeout_s"
    );
    assert_eq!(field(with("urls", json!("x"))), "mcp_servers[0].urls");
    let many: Vec<Value> = (0..=MAX_MCP_SERVERS)
        .map(|i| json!({"name": format!("s{i}"), "url": "https://x/mcp"}))
        .collect();
    assert_eq!(field(json!(many)), "mcp_servers");
}

#[test]
fn annotations_decide_risk_and_repeats_unless_the_agent_says_otherwise() {
    let s = &servers(json!([{
        "name": "ops",
        "url": "https://ops.example.com/mcp",
        "risk": {"restart": "low"},
    }]))
    .unwrap()[0];
    let listed = [
        tool("lookup", hints(true, false, false)),
        tool("drop", hints(false, true, false)),
        tool("restart", hints(false, true, true)),
        tool("upsert", hints(false, false, true)),
        tool("send.mail", None),
    ];
    let frozen = s.freeze("mcp_servers[0]", &listed, &[]).unwrap();
    let got: Vec<(&str, Risk, bool)> = frozen
        .iter()
        .map(|(n, m)| (n.as_str(), m.risk, m.idempotent))
        .collect();
    assert_eq!(
        got,
        [
            ("ops__drop", Risk::High, false),
            ("ops__lookup", Risk::Low, true),
            ("ops__restart", Risk::Low, true),
            ("ops__send_mail", Risk::Medium, false),
            ("ops__upsert", Risk::Medium, true),
        ]
    );
    let m = &frozen["ops__send_mail"];
    assert_eq!(m.executor(), MCP);
    assert!(!m.in_sandbox());
    assert_eq!(m.mcp.as_ref().unwrap().tool, "send.mail");
    assert_eq!(m.parameters, listed[4].input_schema);
}

#[test]
fn the_allow_list_and_the_risk_map_must_name_listed_tools() {
    let parse = |extra: Value| {
        let mut o = json!({"name": "crm", "url": "https://crm.example.com/mcp"});
        for (k, v) in extra.as_object().unwrap() {
            o[k] = v.clone();
        }
        servers(json!([o])).unwrap().remove(0)
    };
    let listed = [tool("find", None), tool("create", None)];
    let only = parse(json!({"tools": ["find"]}));
    let frozen = only.freeze("mcp_servers[0]", &listed, &[]).unwrap();
    assert_eq!(frozen.keys().collect::<Vec<_>>(), ["crm__find"]);
    let missing = parse(json!({"tools": ["find", "delete"]}));
    let e = missing.freeze("mcp_servers[0]", &listed, &[]).unwrap_err();
    assert_eq!(e.field, "mcp_servers[0].tools[1]");
    let risky = parse(json!({"risk": {"delete": "high"}}));
    let e = risky.freeze("mcp_servers[0]", &listed, &[]).unwrap_err();
    assert_eq!(e.field, "mcp_servers[0].risk.delete");
    // A name the agent has already, or one too long for a model.
    let e = only
        .freeze("mcp_servers[0]", &listed, &["crm__find".into()])
        .unwrap_err();
    assert!(e.message.contains("crm__find"), "{e:?}");
    let long = [tool(&"x".repeat(70), None)];
    assert!(parse(json!({})).freeze("at", &long, &[]).is_err());
    let mut bad_schema = tool("find", None);
    bad_schema.input_schema = json!("not a schema");
    assert!(parse(json!({})).freeze("at", &[bad_schema], &[]).is_err());
}

#[test]
fn a_listed_tool_and_a_result_are_read_from_the_wire() {
    let t = ListedTool::from_wire(&json!({
        "name": "get-sum",
        "description": "Adds",
        "inputSchema": {"type": "object"},
        "annotations": {"readOnlyHint": true, "destructiveHint": false},
    }))
    .unwrap();
    assert_eq!(
        t.hints,
        hints(true, false, false).map(|h| ToolHints {
            idempotent: None,
            ..h
        })
    );
    assert_eq!(ToolHints::risk(t.hints.as_ref()), Risk::Low);
    assert!(ListedTool::from_wire(&json!({"description": "nameless"})).is_none());
    let (ok, artifacts) = tool_result(
        &json!({
            "content": [
                {"type": "text", "text": "It is 22C"},
                {"type": "image", "data": "aGVsbG8h", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "A"}},
                {"type": "resource", "resource": {"uri": "file:///b.bin", "blob": "AAE="}},
            ],
            "structuredContent": {"temperature": 22},
        }),
        "call_0_1",
    )
    .unwrap();
    assert_eq!(ok["text"], "It is 22C");
    assert_eq!(ok["structured"]["temperature"], 22);
    assert_eq!(ok["content"][0]["bytes"], 6);
    assert_eq!(ok["content"][0]["artifact"], "call_0_1-1");
    assert_eq!(ok["content"][1]["text"], "A");
    assert_eq!(ok["content"][2]["artifact"], "call_0_1-2");
    assert_eq!(ok["content"][2]["bytes"], 2);
    assert_eq!(
        artifacts,
        [
            Artifact {
                id: "call_0_1-1".into(),
                mime_type: "image/png".into(),
                data: "aGVsbG8h".into()
            },
            Artifact {
                id: "call_0_1-2".into(),
                mime_type: "application/octet-stream".into(),
                data: "AAE=".into()
            },
        ]
    );
    assert_eq!(artifact_call("call_0_1-2"), Some(("call_0_1", 2)));
    for bad in ["call_0_1", "call_0_1-0", "call_0_1-99", "../x-1", "-1"] {
        assert_eq!(artifact_call(bad), None, "{bad}");
    }
    // Past the bound, described and not kept.
    let many: Vec<Value> = (0..MAX_ARTIFACTS_PER_CALL + 1)
        .map(|_| json!({"type": "image", "data": "AAAA", "mimeType": "image/png"}))
        .collect();
    let (v, kept) = tool_result(&json!({"content": many}), "c").unwrap();
    assert_eq!(kept.len(), MAX_ARTIFACTS_PER_CALL);
    assert!(v["content"][MAX_ARTIFACTS_PER_CALL]["omitted"].is_string());
    let failed = tool_result(
        &json!({
            "content": [{"type": "text", "text": "no such id"}],
            "isError": true,
        }),
        "c",
    );
    assert_eq!(failed, Err("no such id".to_string()));
}
