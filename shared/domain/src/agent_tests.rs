//! Parsing agent definitions: defaults, and every refusal naming its field.

use super::*;
use serde_json::json;

fn body() -> serde_json::Value {
    json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 4096},
        "system_prompt": "You help.",
        "skills": ["current_time"]
    })
}

#[test]
fn parses_a_minimal_definition_with_defaults() {
    let a = AgentDefinition::from_json("assistant", &body()).unwrap();
    assert_eq!(a.limits, AgentLimits::default());
    assert_eq!(a.model.provider, ModelProvider::Scripted);
}

#[test]
fn names_the_bad_field() {
    let mut b = body();
    b["model"]["context_window"] = json!("big");
    assert_eq!(
        AgentDefinition::from_json("a", &b).unwrap_err().field,
        "model.context_window"
    );
    let mut b = body();
    b["skills"] = json!(["rm_rf"]);
    let mut def = AgentDefinition::from_json("a", &b).unwrap();
    assert_eq!(
        def.resolve_manifests(|_| None).unwrap_err().field,
        "skills[0]"
    );
    assert_eq!(
        AgentDefinition::from_json("Bad Name", &body())
            .unwrap_err()
            .field,
        "name"
    );
    let mut b = body();
    b["sandbox"] = json!({"mounts": [{"path": "/etc", "mode": "ro"}], "user": "u1"});
    let e = AgentDefinition::from_json("a", &b).unwrap_err();
    assert_eq!(e.field, "sandbox.mounts[0]");
    assert!(e.message.contains("refused"), "{}", e.message);
    let mut b = body();
    b["sandbox"] = json!({"limits": {"call_timeout_s": 3600}});
    assert_eq!(
        AgentDefinition::from_json("a", &b).unwrap_err().field,
        "sandbox.limits.call_timeout_s"
    );
    let mut b = body();
    b["sandbox"] = json!({"profile": "mine", "profiles": {"mine": {"extends": "off"}}});
    assert_eq!(
        AgentDefinition::from_json("a", &b).unwrap_err().field,
        "sandbox.profile"
    );
    let mut b = body();
    b["limits"] = json!({"max_model_turns": 100000});
    assert_eq!(
        AgentDefinition::from_json("a", &b).unwrap_err().field,
        "limits.max_model_turns"
    );
}

#[test]
fn an_unknown_field_at_any_level_is_refused_naming_it() {
    let cases = [
        (json!({"sandboxx": {"profile": "strict"}}), "sandboxx"),
        (json!({"approvalz": {}}), "approvalz"),
        (
            json!({"model": {"provider": "scripted", "model_id": "m", "context_window": 4096, "temp": 1}}),
            "model.temp",
        ),
        (json!({"limits": {"max_turns": 3}}), "limits.max_turns"),
        (json!({"sandbox": {"profle": "strict"}}), "sandbox.profle"),
        (
            json!({"sandbox": {"limits": {"disk": 5}}}),
            "sandbox.limits.disk",
        ),
        (
            json!({"sandbox": {"profile": "p", "profiles": {"p": {"extends": "strict", "restrict_netwrk": false}}}}),
            "sandbox.profiles.p.restrict_netwrk",
        ),
        (
            json!({"sandbox": {"user": "u1", "mounts": [{"path": "/data/users/u1/workspace", "mode": "ro", "writable": true}]}}),
            "sandbox.mounts[0].writable",
        ),
        (
            json!({"approvals": {"requires": ["shell_exec"]}}),
            "approvals.requires",
        ),
        (
            json!({"http_allow_hosts": ["http://example.com/"]}),
            "http_allow_hosts[0]",
        ),
    ];
    for (extra, field) in cases {
        let mut b = body();
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let e = AgentDefinition::from_json("a", &b).unwrap_err();
        assert_eq!(e.field, field, "{extra}");
    }
}
