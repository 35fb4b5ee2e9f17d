//! The skill catalog. Every skill has a manifest: what kind of work it is
//! (which decides whether it runs inline in the harness or in the agent's
//! sandbox, seed 000 §A), its timeout, declared mounts and ports, its risk,
//! and whether repeating it is harmless. The built-ins are here; their
//! executors are the harness's inline skills and the sandbox agent.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::chat::ToolSpec;
use crate::fields::FieldError;
use crate::sandbox::{
    self, MountMode, Placement, SkillKind, DEFAULT_CALL_TIMEOUT_S, MAX_CALL_TIMEOUT_S,
};

/// The fields of a mount declaration.
pub const MOUNT_FIELDS: [&str; 2] = ["path", "mode"];

/// The fields of a skill manifest (`name` is what a `GET` adds: the
/// path's, accepted and ignored).
pub const SKILL_FIELDS: [&str; 12] = [
    "name",
    "description",
    "kind",
    "requires_sandbox",
    "timeout_s",
    "mounts",
    "ports",
    "risk",
    "idempotent",
    "parameters",
    "executor",
    "program",
];

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
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

impl MountDecl {
    /// A mount as written in a request, checked against the mount policy
    /// for `user`; errors name `field`.
    pub fn parse(v: &Value, field: &str, user: &str) -> Result<Self, FieldError> {
        let Value::Object(o) = v else {
            return Err(FieldError::new(
                field,
                "must be {\"path\": str, \"mode\": \"ro\" | \"rw\"}",
            ));
        };
        let f = crate::fields::Fields::nested(o, field)?;
        f.only(&MOUNT_FIELDS)?;
        let mode = match f.req_str("mode")? {
            "ro" => MountMode::Ro,
            "rw" => MountMode::Rw,
            _ => {
                return Err(FieldError::new(
                    &format!("{field}.mode"),
                    "must be ro or rw",
                ))
            }
        };
        let decl = MountDecl {
            path: f.req_str("path")?.to_string(),
            mode,
        };
        sandbox::check_mount(&decl.path, decl.mode, user)
            .map_err(|e| FieldError::new(field, &e.to_string()))?;
        Ok(decl)
    }
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
    /// The built-in that executes it (default: the skill's own name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<String>,
    /// For a tool of a remote MCP server: which (executor [`MCP`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpBinding>,
    /// The program the skill brings (executor [`PROGRAM`]), run in the
    /// agent's sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<crate::program::Program>,
}

impl SkillManifest {
    /// The built-in executor that runs a call of this skill.
    pub fn executor(&self) -> &str {
        self.executor.as_deref().unwrap_or(&self.name)
    }

    /// A manifest from a registry request: it names a built-in executor and
    /// may make its placement stricter, never weaker.
    pub fn from_json(name: &str, body: &Value) -> Result<Self, FieldError> {
        use crate::fields::Fields;
        if !crate::names::valid_name(name) {
            return Err(FieldError::new(
                "name",
                "must be 1-64 characters of a-z, 0-9, '-' or '_'",
            ));
        }
        let f = Fields::new(body)?;
        f.only(&SKILL_FIELDS)?;
        let program = match f.get("program") {
            Some(v) => Some(crate::program::Program::parse(v)?),
            None => None,
        };
        let executor = match (&program, f.opt_str("executor")?) {
            (Some(_), Some(_)) => {
                return Err(FieldError::new(
                    "executor",
                    "a skill brings a program or names a built-in executor, not both",
                ))
            }
            (Some(_), None) => PROGRAM.to_string(),
            (None, e) => e.unwrap_or(name).to_string(),
        };
        let base = match program {
            Some(_) => program_base(),
            None => builtin(&executor).ok_or_else(|| {
                FieldError::new(
                    "executor",
                    &format!(
                        "'{executor}' is not a built-in skill (one of {})",
                        BUILTIN.join(", ")
                    ),
                )
            })?,
        };
        let kind: SkillKind = match f.opt_str("kind")? {
            None => base.kind,
            Some(k) => serde_json::from_value(json!(k)).map_err(|_| {
                FieldError::new(
                    "kind",
                    "must be one of code_execution, service_deployment, build_install, llm_call, database_query, external_api, text_processing, web_search",
                )
            })?,
        };
        let requires_sandbox = f.opt_bool("requires_sandbox")?.unwrap_or(false);
        let placement = sandbox::placement(kind, requires_sandbox);
        if placement != base.placement() {
            let why = if base.in_sandbox() {
                format!("'{executor}' runs in a sandbox: a manifest may make placement stricter, never weaker")
            } else {
                format!("'{executor}' runs in the harness and cannot run in a sandbox")
            };
            return Err(FieldError::new("kind", &why));
        }
        let timeout_s = match f.opt_u64("timeout_s")? {
            None => base.timeout_s,
            Some(t) if (1..=u64::from(MAX_CALL_TIMEOUT_S)).contains(&t) => t as u32,
            Some(_) => {
                return Err(FieldError::new(
                    "timeout_s",
                    &format!("must be between 1 and {MAX_CALL_TIMEOUT_S}"),
                ))
            }
        };
        let mut mounts = Vec::new();
        if let Some(ms) = f.opt_array("mounts")? {
            for (i, m) in ms.iter().enumerate() {
                // The user is the agent's: checked again when an agent uses it.
                let user = m
                    .get("path")
                    .and_then(Value::as_str)
                    .and_then(|p| p.strip_prefix("/data/users/"))
                    .and_then(|r| r.split('/').next())
                    .unwrap_or_default();
                mounts.push(MountDecl::parse(m, &format!("mounts[{i}]"), user)?);
            }
        }
        let ports = match f.opt_u64("ports")? {
            None => base.ports,
            Some(p) if p <= 10 => p as u8,
            Some(_) => return Err(FieldError::new("ports", "must be at most 10 (the pool)")),
        };
        let risk = match f.opt_str("risk")? {
            None => base.risk,
            Some(r) => serde_json::from_value(json!(r))
                .map_err(|_| FieldError::new("risk", "must be low, medium or high"))?,
        };
        Ok(SkillManifest {
            name: name.to_string(),
            description: f
                .opt_str("description")?
                .map(str::to_string)
                .unwrap_or(base.description),
            kind,
            requires_sandbox,
            timeout_s,
            mounts,
            ports,
            risk,
            idempotent: f.opt_bool("idempotent")?.unwrap_or(base.idempotent),
            parameters: match body.get("parameters") {
                None | Some(Value::Null) => base.parameters,
                Some(p) if p.is_object() => p.clone(),
                Some(_) => {
                    return Err(FieldError::new(
                        "parameters",
                        "must be a JSON schema object",
                    ))
                }
            },
            executor: (executor != name).then_some(executor),
            mcp: None,
            program,
        })
    }
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
/// Asks another agent: answered by a child Run (collaboration).
pub const DELEGATE: &str = "delegate";
/// A lead team's Run hands out tasks: answered by executor Runs.
pub const PLAN: &str = "plan";

/// What a tool's annotations say of it (absent: the server said nothing).
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolHints {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world: Option<bool>,
}

impl ToolHints {
    /// High when the tool says it is destructive, low when it only reads,
    /// medium otherwise (a tool that says nothing included).
    pub fn risk(hints: Option<&ToolHints>) -> Risk {
        match hints {
            Some(h) if h.destructive == Some(true) => Risk::High,
            Some(h) if h.read_only == Some(true) => Risk::Low,
            _ => Risk::Medium,
        }
    }

    /// Whether a call whose result was lost may be made again.
    pub fn repeatable(hints: Option<&ToolHints>) -> bool {
        hints.is_some_and(|h| h.read_only == Some(true) || h.idempotent == Some(true))
    }
}

/// Which server and tool a frozen manifest calls.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpBinding {
    pub server: String,
    /// The tool's name on its server.
    pub tool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hints: Option<ToolHints>,
}

/// A program a skill brings, run in the agent's sandbox (never a
/// registry manifest's executor by name).
pub const PROGRAM: &str = "program";

/// What a manifest that brings a program starts from: code executed in
/// the sandbox, medium risk, not to be repeated.
fn program_base() -> SkillManifest {
    SkillManifest {
        name: PROGRAM.into(),
        description: "A program of the skill's own.".into(),
        kind: SkillKind::CodeExecution,
        requires_sandbox: true,
        timeout_s: DEFAULT_CALL_TIMEOUT_S,
        mounts: vec![],
        ports: 0,
        risk: Risk::Medium,
        idempotent: false,
        parameters: json!({"type": "object"}),
        executor: Some(PROGRAM.into()),
        mcp: None,
        program: None,
    }
}

/// A tool of a remote MCP server, frozen from its listing (never a
/// registry manifest's executor).
pub const MCP: &str = "mcp";

/// Every built-in skill, by name.
pub const BUILTIN: [&str; 9] = [
    CURRENT_TIME,
    HTTP_REQUEST,
    SHELL_EXEC,
    PYTHON_EXEC,
    FILE_READ,
    FILE_WRITE,
    SERVE,
    DELEGATE,
    PLAN,
];

/// Whether calls of this executor are answered by child Runs.
pub fn answered_by_children(executor: &str) -> bool {
    matches!(executor, DELEGATE | PLAN)
}

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
            executor: None,
            mcp: None,
            program: None,
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
        DELEGATE => m(
            DELEGATE,
            "Asks another agent to do a task as a run of its own (its own context and sandbox) and returns its outcome: {run_id, state, output}. Several delegate calls in one turn run in parallel.",
            SkillKind::LlmCall,
            Risk::Low,
            false,
            0,
            json!({
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "description": "the agent to ask"},
                    "task": {"type": "string", "description": "what it should do (at most 16 KiB)"},
                    "resume_from": {"type": "string", "description": "a finished run of the same agent to continue from"}
                },
                "required": ["agent", "task"]
            }),
        ),
        PLAN => m(
            PLAN,
            "Hands out tasks to the team's members, run in parallel; returns every task's outcome so you can consolidate them.",
            SkillKind::LlmCall,
            Risk::Low,
            false,
            0,
            json!({
                "type": "object",
                "properties": {
                    "tasks": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"agent": {"type": "string"}, "task": {"type": "string"}},
                            "required": ["agent", "task"]
                        }
                    }
                },
                "required": ["tasks"]
            }),
        ),
        _ => return None,
    };
    Some(manifest)
}

/// Whether this particular call may be repeated: a GET/HEAD request may,
/// other methods may not; otherwise the manifest decides.
pub fn call_is_idempotent(manifest: &SkillManifest, args: &serde_json::Value) -> bool {
    match manifest.executor() {
        HTTP_REQUEST => matches!(
            args.get("method").and_then(|m| m.as_str()).unwrap_or("GET"),
            "GET" | "HEAD"
        ),
        _ => manifest.idempotent,
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
        let m = |n| builtin(n).unwrap();
        assert!(call_is_idempotent(&m(FILE_READ), &json!({})));
        assert!(!call_is_idempotent(&m(SHELL_EXEC), &json!({})));
        assert!(!call_is_idempotent(
            &m(HTTP_REQUEST),
            &json!({"method": "POST"})
        ));
    }

    #[test]
    fn a_manifest_may_make_placement_stricter_never_weaker() {
        let headless = SkillManifest::from_json(
            "browse",
            &json!({"executor": "shell_exec", "kind": "web_search", "requires_sandbox": true, "timeout_s": 60}),
        )
        .unwrap();
        assert!(headless.in_sandbox());
        assert_eq!(
            (headless.executor(), headless.timeout_s),
            ("shell_exec", 60)
        );
        let weaker = SkillManifest::from_json(
            "summarise",
            &json!({"executor": "shell_exec", "kind": "text_processing"}),
        );
        assert_eq!(weaker.unwrap_err().field, "kind");
        let into_sandbox = SkillManifest::from_json(
            "fetch",
            &json!({"executor": "http_request", "requires_sandbox": true}),
        );
        assert_eq!(into_sandbox.unwrap_err().field, "kind");
        let long =
            SkillManifest::from_json("x", &json!({"executor": "shell_exec", "timeout_s": 3600}));
        assert_eq!(long.unwrap_err().field, "timeout_s");
        let mount = SkillManifest::from_json(
            "y",
            &json!({"executor": "shell_exec", "mounts": [{"path": "/etc", "mode": "ro"}]}),
        );
        assert_eq!(mount.unwrap_err().field, "mounts[0]");
        let typo = SkillManifest::from_json(
            "z",
            &json!({"executor": "shell_exec", "mounts": [{"path": "/data/users/u/workspace", "mode": "ro", "mod": "rw"}]}),
        );
        assert_eq!(typo.unwrap_err().field, "mounts[0].mod");
        let top = SkillManifest::from_json("w", &json!({"executor": "shell_exec", "risks": "low"}));
        assert_eq!(top.unwrap_err().field, "risks");
    }
}
