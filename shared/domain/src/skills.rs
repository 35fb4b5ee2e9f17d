//! The skill catalog. Every skill has a manifest: what kind of work it is
//! (which decides whether it runs inline in the harness or in the agent's
//! sandbox, seed 000 §A), its timeout, declared mounts and ports, its risk,
//! and whether repeating it is harmless. The built-ins are here; their
//! executors are the harness's inline skills and the sandbox agent.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::chat::ToolSpec;
use crate::sandbox::{
    self, MountMode, Placement, SkillKind, DEFAULT_CALL_TIMEOUT_S, MAX_CALL_TIMEOUT_S,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Risk {
    Low,
    Medium,
    High,
}

/// A bind mount a skill needs: an exact sub-path of the user's workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountDecl {
    pub path: String,
    pub mode: MountMode,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkillManifest {
    pub name: String,
    pub description: String,
    pub kind: SkillKind,
    /// Ask for a sandbox where the kind alone would not need one (a manifest
    /// may make placement stricter, never weaker).
    #[serde(default)]
    pub requires_sandbox: bool,
    /// Per-call timeout (default 5 min, at most 30).
    pub timeout_s: u32,
    #[serde(default)]
    pub mounts: Vec<MountDecl>,
    /// How many pooled ports a call may hold.
    #[serde(default)]
    pub ports: u8,
    pub risk: Risk,
    /// Whether repeating a call whose result was lost is harmless.
    pub idempotent: bool,
    /// JSON schema of the arguments, as offered to the model.
    pub parameters: Value,
}

impl SkillManifest {
    pub fn placement(&self) -> Placement {
        sandbox::placement(self.kind, self.requires_sandbox)
    }

    pub fn in_sandbox(&self) -> bool {
        self.placement() == Placement::Sandbox
    }

    pub fn tool_spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            parameters: self.parameters.clone(),
        }
    }
}

pub const CURRENT_TIME: &str = "current_time";
pub const HTTP_REQUEST: &str = "http_request";
pub const SHELL_EXEC: &str = "shell_exec";
pub const PYTHON_EXEC: &str = "python_exec";
pub const FILE_READ: &str = "file_read";
pub const FILE_WRITE: &str = "file_write";
pub const SERVE: &str = "serve";

/// Every built-in skill, by name.
pub const BUILTIN: [&str; 7] = [
    CURRENT_TIME,
    HTTP_REQUEST,
    SHELL_EXEC,
    PYTHON_EXEC,
    FILE_READ,
    FILE_WRITE,
    SERVE,
];

fn code_args(field: &str) -> Value {
    json!({
        "type": "object",
        "properties": {
            field: {"type": "string"},
            "timeout_s": {"type": "integer", "minimum": 1, "maximum": MAX_CALL_TIMEOUT_S}
        },
        "required": [field]
    })
}

/// The manifest of a built-in skill.
pub fn builtin(name: &str) -> Option<SkillManifest> {
    let m =
        |name: &str, description: &str, kind, risk, idempotent, ports, parameters| SkillManifest {
            name: name.to_string(),
            description: description.to_string(),
            kind,
            requires_sandbox: false,
            timeout_s: DEFAULT_CALL_TIMEOUT_S,
            mounts: vec![],
            ports,
            risk,
            idempotent,
            parameters,
        };
    let manifest = match name {
        CURRENT_TIME => m(
            CURRENT_TIME,
            "Returns the current UTC time in RFC 3339.",
            SkillKind::TextProcessing,
            Risk::Low,
            true,
            0,
            json!({"type": "object", "properties": {}}),
        ),
        HTTP_REQUEST => m(
            HTTP_REQUEST,
            "Makes an HTTP request to an allow-listed host and returns status and body.",
            SkillKind::ExternalApi,
            Risk::Medium,
            false,
            0,
            json!({
                "type": "object",
                "properties": {
                    "url": {"type": "string"},
                    "method": {"type": "string", "enum": ["GET", "HEAD", "POST", "PUT", "DELETE"]},
                    "body": {"type": "string"}
                },
                "required": ["url"]
            }),
        ),
        SHELL_EXEC => m(
            SHELL_EXEC,
            "Runs a shell command in the agent's sandbox (working directory: its workspace) and returns exit_code, stdout and stderr.",
            SkillKind::CodeExecution,
            Risk::Medium,
            false,
            0,
            code_args("command"),
        ),
        PYTHON_EXEC => m(
            PYTHON_EXEC,
            "Runs Python 3 code in the agent's sandbox and returns exit_code, stdout and stderr.",
            SkillKind::CodeExecution,
            Risk::Medium,
            false,
            0,
            code_args("code"),
        ),
        FILE_READ => m(
            FILE_READ,
            "Reads a text file; relative paths resolve in the sandbox workspace.",
            SkillKind::CodeExecution,
            Risk::Low,
            true,
            0,
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        ),
        FILE_WRITE => m(
            FILE_WRITE,
            "Writes a text file (creating directories); relative paths resolve in the sandbox workspace.",
            SkillKind::CodeExecution,
            Risk::Medium,
            // Writing the same content twice leaves the same file.
            true,
            0,
            json!({
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"]
            }),
        ),
        SERVE => m(
            SERVE,
            "Starts a long-running server in the sandbox on a pooled port ($PORT) and returns the URL it is reachable at.",
            SkillKind::ServiceDeployment,
            Risk::Medium,
            false,
            1,
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "port": {"type": "integer", "description": "container port 8081-8090; default: the first free one"}
                },
                "required": ["command"]
            }),
        ),
        _ => return None,
    };
    Some(manifest)
}

/// Whether this particular call may be repeated: a GET/HEAD request may,
/// other methods may not; otherwise the manifest decides.
pub fn call_is_idempotent(name: &str, args: &serde_json::Value) -> bool {
    match name {
        HTTP_REQUEST => matches!(
            args.get("method").and_then(|m| m.as_str()).unwrap_or("GET"),
            "GET" | "HEAD"
        ),
        other => builtin(other).is_some_and(|s| s.idempotent),
    }
}

pub fn tool_spec(name: &str) -> Option<ToolSpec> {
    builtin(name).map(|m| m.tool_spec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_runs_in_the_sandbox_and_apis_do_not() {
        for name in [SHELL_EXEC, PYTHON_EXEC, FILE_READ, FILE_WRITE, SERVE] {
            assert!(builtin(name).unwrap().in_sandbox(), "{name}");
        }
        for name in [CURRENT_TIME, HTTP_REQUEST] {
            assert!(!builtin(name).unwrap().in_sandbox(), "{name}");
        }
        assert!(builtin("rm_rf").is_none());
        assert!(call_is_idempotent(FILE_READ, &json!({})));
        assert!(!call_is_idempotent(SHELL_EXEC, &json!({})));
        assert!(!call_is_idempotent(
            HTTP_REQUEST,
            &json!({"method": "POST"})
        ));
    }
}
