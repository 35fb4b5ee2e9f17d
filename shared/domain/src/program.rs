//! Programs a skill brings (`program` in its manifest), run in the agent's
//! sandbox under the jail like any sandbox call: the command (no shell),
//! its environment (literals, and the tenant's secrets, opened by the
//! harness and sealed for the one sandbox generation that runs the call),
//! and how it speaks: `json`, one process per call, the arguments as JSON
//! on stdin and the result as JSON on stdout, its exit code its success.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::crypto::{aead_open, aead_seal, hmac_sha256};
use crate::fields::{schema_ok, MAX_SCHEMA_BYTES};
use crate::fields::{FieldError, Fields};
use crate::secret::Configured;
use crate::skill_files::SkillFiles;

/// The fields of a manifest's `program` (`files` is read-only: the
/// uploaded version is kept whatever a body says).
pub const PROGRAM_FIELDS: [&str; 6] = ["command", "protocol", "env", "install", "files", "tools"];

/// Bounds on a command and its environment.
pub const MAX_ARGS: usize = 32;
pub const MAX_ARG_BYTES: usize = 4096;
pub const MAX_ENV: usize = 32;
/// Bounds on the install steps.
pub const MAX_INSTALL_STEPS: usize = 8;
/// The most tools an `mcp` program offers.
pub const MAX_PROGRAM_TOOLS: usize = 64;

/// Variables the sandbox sets itself, which no program's may replace.
const RESERVED_ENV: [&str; 6] = [
    "PATH",
    "HOME",
    "PORT",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "TMPDIR",
];

/// How a program speaks.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgramProtocol {
    /// One process per call: arguments on stdin, the result on stdout.
    Json,
    /// An MCP server over stdio, kept running in the sandbox across
    /// calls (started again if it dies); each of its tools a tool.
    Mcp,
}

/// A program a skill brings.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Program {
    /// The executable and its arguments (no shell).
    pub command: Vec<String>,
    pub protocol: ProgramProtocol,
    /// Its environment: a value, or a tenant's secret named.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, Configured>,
    /// Shell commands run once per version of the program's files (and of
    /// these steps), in its directory, before its first call there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub install: Vec<String>,
    /// The files uploaded for it (`PUT /v1/skills/{name}/files`), by
    /// version; never written through the manifest's own body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<SkillFiles>,
    /// `mcp`: the tools it offers, as its `tools/list` answers them (name,
    /// description, `inputSchema`, `annotations`), frozen with the skill:
    /// the model is offered each as `<skill>__<tool>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Value>,
    /// The one tool of an `mcp` program a manifest offers (set when an
    /// agent's skill is expanded into its tools, never written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serves: Option<Served>,
}

/// A tool of a skill's `mcp` program, as one of an agent's tools.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Served {
    /// The skill whose program it is.
    pub skill: String,
    /// The tool's name as the server lists it.
    pub tool: String,
}

impl Program {
    /// A manifest's `program` as written; errors name `program.<field>`.
    pub fn parse(v: &Value) -> Result<Program, FieldError> {
        let obj = v
            .as_object()
            .ok_or_else(|| FieldError::new("program", "must be {command, protocol, env?}"))?;
        let f = Fields::nested(obj, "program")?;
        f.only(&PROGRAM_FIELDS)?;
        let command = f.opt_str_list("command")?.unwrap_or_default();
        let bad_arg = |a: &String| a.is_empty() || a.len() > MAX_ARG_BYTES || a.contains('\0');
        if command.is_empty() || command.len() > MAX_ARGS || command.iter().any(bad_arg) {
            return Err(FieldError::new(
                "program.command",
                &format!(
                    "must be the executable and its arguments: 1 to {MAX_ARGS} non-empty \
                     strings of at most {MAX_ARG_BYTES} bytes"
                ),
            ));
        }
        let protocol = match f.req_str("protocol")? {
            "json" => ProgramProtocol::Json,
            "mcp" => ProgramProtocol::Mcp,
            _ => return Err(FieldError::new("program.protocol", "must be json or mcp")),
        };
        let tools = f.opt_array("tools")?.cloned().unwrap_or_default();
        match protocol {
            ProgramProtocol::Mcp => judge_tools(&tools)?,
            ProgramProtocol::Json if !tools.is_empty() => {
                return Err(FieldError::new(
                    "program.tools",
                    "only an mcp program offers tools",
                ))
            }
            ProgramProtocol::Json => {}
        }
        let mut env = BTreeMap::new();
        if let Some(given) = f.opt_obj("env")? {
            if given.len() > MAX_ENV {
                return Err(FieldError::new(
                    "program.env",
                    &format!("at most {MAX_ENV} variables"),
                ));
            }
            for (name, value) in given {
                let at = format!("program.env.{name}");
                let first_ok = name
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
                let valid = first_ok
                    && name.len() <= 64
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !valid || RESERVED_ENV.contains(&name.as_str()) || name.starts_with("ARMADA_") {
                    return Err(FieldError::new(
                        &at,
                        "is not a variable a program may be given",
                    ));
                }
                let value = Configured::parse(&at, value)?;
                if let Configured::Literal(text) = &value {
                    if text.contains('\0') {
                        return Err(FieldError::new(&at, "must not hold a NUL"));
                    }
                }
                env.insert(name.clone(), value);
            }
        }
        let install = f.opt_str_list("install")?.unwrap_or_default();
        let bad_step =
            |s: &String| s.trim().is_empty() || s.len() > MAX_ARG_BYTES || s.contains('\0');
        if install.len() > MAX_INSTALL_STEPS || install.iter().any(bad_step) {
            return Err(FieldError::new(
                "program.install",
                &format!(
                    "must be at most {MAX_INSTALL_STEPS} shell commands of 1 to {MAX_ARG_BYTES} bytes"
                ),
            ));
        }
        Ok(Program {
            command,
            protocol,
            env,
            install,
            files: None,
            tools,
            serves: None,
        })
    }
}

/// An `mcp` program's tools: 1 to [`MAX_PROGRAM_TOOLS`], each as MCP's
/// `tools/list` puts it, named once, its input schema an object.
fn judge_tools(tools: &[Value]) -> Result<(), FieldError> {
    if tools.is_empty() || tools.len() > MAX_PROGRAM_TOOLS {
        return Err(FieldError::new(
            "program.tools",
            &format!(
                "an mcp program offers 1 to {MAX_PROGRAM_TOOLS} tools, as its tools/list \
                 answers them ({{name, description?, inputSchema, annotations?}}; \
                 `armada skills list-tools` prints them)"
            ),
        ));
    }
    let mut seen = Vec::new();
    for (i, v) in tools.iter().enumerate() {
        let at = format!("program.tools[{i}]");
        let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if !v.is_object() || !name_ok || seen.contains(&name) {
            return Err(FieldError::new(
                &format!("{at}.name"),
                "must be a tool name of its own (letters, digits, '_', '-', '.'; at most 64)",
            ));
        }
        if !v.get("inputSchema").is_some_and(schema_ok) {
            return Err(FieldError::new(
                &format!("{at}.inputSchema"),
                &format!("must be a JSON object of at most {MAX_SCHEMA_BYTES} bytes"),
            ));
        }
        seen.push(name);
    }
    Ok(())
}

/// A program as one call sends it to the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramCall {
    pub command: Vec<String>,
    pub protocol: ProgramProtocol,
    /// The environment, sealed ([`seal_env`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// Why the call must not run (its environment could not be opened:
    /// `SECRET_NOT_FOUND`), answered as its error without running it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refusal>,
    /// The skill whose program it is: its files and installs live in
    /// `.skills/<skill>/` of the workspace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub skill: String,
    /// Where the sandbox reads the program's files (its identity's copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<StagedFiles>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub install: Vec<String>,
    /// `mcp`: the server's tool the call calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
}

/// A version of a program's files as a call names it: the object the
/// sandbox reads, and the digest it must have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedFiles {
    pub key: String,
    pub sha256: String,
}

/// A call's error, by code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub code: String,
    pub message: String,
}

/// One variable of a program's environment as a call is given it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
    /// The tenant's secret it holds, if it is one: the sandbox's agent
    /// scrubs its value from what the program answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// A program's environment as sent with one call: sealed for the sandbox
/// generation whose `answer_key` runs it, bound to the call (a sealed
/// environment moved to another call, or another generation, does not
/// open), so that the queue, a dead-letter copy and the agent's in-flight
/// file hold no secret in the clear.
pub fn seal_env(answer_key: &str, call: &str, env: &[EnvVar]) -> Option<String> {
    use base64::Engine;
    let plain = serde_json::to_vec(env).ok()?;
    let sealed = aead_seal(&env_key(answer_key), call.as_bytes(), &plain)?;
    Some(base64::engine::general_purpose::STANDARD.encode(sealed))
}

/// [`seal_env`]'s environment, if it opens for this generation and call.
pub fn open_env(answer_key: &str, call: &str, sealed: &str) -> Option<Vec<EnvVar>> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(sealed.as_bytes())
        .ok()?;
    let plain = aead_open(&env_key(answer_key), call.as_bytes(), &bytes)?;
    serde_json::from_slice(&plain).ok()
}

/// What binds a sealed environment: the call, at its attempt.
pub fn env_binding(run_id: &str, call_id: &str, attempt: u32) -> String {
    format!("armada-program-env\n{run_id}\n{call_id}\n{attempt}")
}

fn env_key(answer_key: &str) -> [u8; 32] {
    hmac_sha256(answer_key.as_bytes(), b"armada-program-env")
}

/// What a `json` program's run comes to: its stdout's JSON when it
/// exited 0, else its failure with the end of what it said.
pub fn json_answer(exit_code: i64, stdout: &str, stderr: &str) -> Result<Value, (String, String)> {
    let tail = |s: &str| {
        let s = s.trim();
        let start = s.char_indices().rev().nth(1999).map_or(0, |(i, _)| i);
        s[start..].to_string()
    };
    if exit_code != 0 {
        return Err((
            "PROGRAM_FAILED".into(),
            format!("the program exited {exit_code}: {}", tail(stderr)),
        ));
    }
    serde_json::from_str(stdout.trim()).map_err(|e| {
        (
            "PROGRAM_OUTPUT".into(),
            format!("the program's output is not JSON ({e}): {}", tail(stdout)),
        )
    })
}

#[cfg(test)]
#[path = "program_tests.rs"]
mod tests;
