use serde_json::json;

use super::*;
use crate::skills::Risk;

fn filesystem() -> SkillManifest {
    SkillManifest::from_json(
        "fs",
        &json!({"program": {
            "command": ["mcp-server-filesystem", "/workspace"],
            "protocol": "mcp",
            "tools": [
                {"name": "read_text_file", "description": "Reads a file.",
                 "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
                 "annotations": {"readOnlyHint": true}},
                {"name": "write_file", "inputSchema": {"type": "object"},
                 "annotations": {"destructiveHint": true, "idempotentHint": true}},
                {"name": "list.dir", "inputSchema": {"type": "object"}},
            ],
        }}),
    )
    .unwrap()
}

#[test]
fn an_mcp_programs_tools_are_offered_each_with_its_annotations() {
    let m = filesystem();
    assert!(is_server(&m));
    let tools = served_tools("fs", &m);
    let names: Vec<_> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["fs__read_text_file", "fs__write_file", "fs__list_dir"]
    );
    let (read, write, list) = (&tools[0], &tools[1], &tools[2]);
    assert_eq!((read.risk, read.idempotent), (Risk::Low, true));
    assert_eq!((write.risk, write.idempotent), (Risk::High, true));
    assert_eq!((list.risk, list.idempotent), (Risk::Medium, false));
    assert_eq!(read.description, "Reads a file.");
    assert_eq!(read.parameters["properties"]["path"]["type"], "string");
    assert!(read.in_sandbox());
    let p = read.program.as_ref().unwrap();
    assert_eq!(
        p.serves,
        Some(Served {
            skill: "fs".into(),
            tool: "read_text_file".into()
        })
    );
    // A served tool is no server of its own, and carries no listing.
    assert!(!is_server(read) && p.tools.is_empty());
}

#[test]
fn other_skills_offer_no_tools_of_their_own() {
    let json_program = SkillManifest::from_json(
        "adder",
        &json!({"program": {"command": ["adder"], "protocol": "json"}}),
    )
    .unwrap();
    assert!(served_tools("adder", &json_program).is_empty());
    let shell = crate::skills::builtin("shell_exec").unwrap();
    assert!(served_tools("shell_exec", &shell).is_empty());
}
