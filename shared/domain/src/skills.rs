//! The skill catalog. Inline skills run inside the harness; sandbox skills
//! (code execution, builds, services) arrive with the sandboxes issue.

use serde_json::json;

use crate::chat::ToolSpec;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Risk {
    Low,
    Medium,
    High,
}

#[derive(Debug, Clone)]
pub struct InlineSkill {
    pub name: &'static str,
    pub description: &'static str,
    pub risk: Risk,
    /// Whether repeating a call whose result was lost is harmless.
    pub idempotent: bool,
}

pub const CURRENT_TIME: &str = "current_time";
pub const HTTP_REQUEST: &str = "http_request";

const INLINE: [InlineSkill; 2] = [
    InlineSkill {
        name: CURRENT_TIME,
        description: "Returns the current UTC time in RFC 3339.",
        risk: Risk::Low,
        idempotent: true,
    },
    InlineSkill {
        name: HTTP_REQUEST,
        description: "Makes an HTTP request to an allow-listed host and returns status and body.",
        risk: Risk::Medium,
        idempotent: false,
    },
];

pub fn inline(name: &str) -> Option<&'static InlineSkill> {
    INLINE.iter().find(|s| s.name == name)
}

/// Whether this particular call may be repeated: GET/HEAD requests may, other
/// methods may not.
pub fn call_is_idempotent(name: &str, args: &serde_json::Value) -> bool {
    match name {
        HTTP_REQUEST => matches!(
            args.get("method").and_then(|m| m.as_str()).unwrap_or("GET"),
            "GET" | "HEAD"
        ),
        other => inline(other).is_some_and(|s| s.idempotent),
    }
}

pub fn tool_spec(name: &str) -> Option<ToolSpec> {
    let skill = inline(name)?;
    let parameters = match name {
        HTTP_REQUEST => json!({
            "type": "object",
            "properties": {
                "url": {"type": "string"},
                "method": {"type": "string", "enum": ["GET", "HEAD", "POST", "PUT", "DELETE"]},
                "body": {"type": "string"}
            },
            "required": ["url"]
        }),
        _ => json!({"type": "object", "properties": {}}),
    };
    Some(ToolSpec {
        name: skill.name.to_string(),
        description: skill.description.to_string(),
        parameters,
    })
}
