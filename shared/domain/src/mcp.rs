//! Remote MCP servers an agent uses (`mcp_servers`): each server as the
//! definition names it, and the tools it listed at registration frozen
//! into the agent's version as skill manifests named `<server>__<tool>`.
//! The tool's own annotations decide its risk (an approval for a
//! destructive one) and whether a call whose result was lost may be made
//! again (read-only or idempotent ones only).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fields::{FieldError, Fields};
use crate::names::valid_name;
use crate::sandbox::{SkillKind, MAX_CALL_TIMEOUT_S};
use crate::secret::Configured;
pub use crate::skills::{McpBinding, ToolHints};
use crate::skills::{Risk, SkillManifest, MCP};

/// The fields of one `mcp_servers` entry.
pub const MCP_SERVER_FIELDS: [&str; 6] = ["name", "url", "headers", "tools", "risk", "timeout_s"];

/// How many servers an agent uses, and tools it takes from one.
pub const MAX_MCP_SERVERS: usize = 8;
pub const MAX_TOOLS_PER_SERVER: usize = 128;
/// A server's name is short enough to leave its tools room in a model's
/// 64-character tool names.
pub const MAX_SERVER_NAME: usize = 24;
/// Between a server's name and its tool's in the name the model sees.
pub const SEPARATOR: &str = "__";
/// A call's timeout when the definition gives none.
pub const DEFAULT_MCP_TIMEOUT_S: u32 = 60;
/// The largest tool schema frozen into a definition (serialized).
pub use crate::fields::MAX_SCHEMA_BYTES;
/// The longest description offered to the model (longer ones are cut).
pub const MAX_DESCRIPTION: usize = 2048;

/// Headers the transport sets itself: no definition may set them.
pub const TRANSPORT_HEADERS: [&str; 5] = [
    "accept",
    "content-type",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// A remote MCP server as an agent's definition names it.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpServer {
    pub name: String,
    /// Its Streamable HTTP endpoint.
    pub url: String,
    /// Sent with every request (tokens as the tenant's secrets).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, Configured>,
    /// The tools taken from it (absent: every tool it lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Risks that override what a tool's annotations imply.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub risk: BTreeMap<String, Risk>,
    pub timeout_s: u32,
}

/// A tool as its server listed it.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedTool {
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    pub input_schema: Value,
    pub hints: Option<ToolHints>,
}

impl ListedTool {
    /// A tool as `tools/list` puts it on the wire (`None`: no name).
    pub fn from_wire(v: &Value) -> Option<ListedTool> {
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let hints = v.get("annotations").filter(|a| a.is_object()).map(|a| {
            let hint = |k: &str| a.get(k).and_then(Value::as_bool);
            ToolHints {
                read_only: hint("readOnlyHint"),
                destructive: hint("destructiveHint"),
                idempotent: hint("idempotentHint"),
                open_world: hint("openWorldHint"),
            }
        });
        Some(ListedTool {
            name: text("name")?,
            title: text("title"),
            description: text("description"),
            input_schema: v.get("inputSchema").cloned().unwrap_or(Value::Null),
            hints,
        })
    }
}

/// Content a call answered that is not text (an image, audio, a binary
/// resource): stored as the Run's artifact `id` and referenced from the
/// result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    pub id: String,
    pub mime_type: String,
    /// As the server sent it: base64.
    pub data: String,
}

/// How many artifacts one call keeps, and how large each may be.
pub const MAX_ARTIFACTS_PER_CALL: usize = 8;
pub const MAX_ARTIFACT_BYTES: usize = 8 << 20;

/// Where a Run's artifact is stored (the payload bucket).
pub fn artifact_key(run_id: &str, artifact_id: &str) -> String {
    format!("artifacts/{run_id}/{artifact_id}")
}

/// Whether `id` is one [`tool_result`] gives: `<call id>-<n>`.
pub fn artifact_call(id: &str) -> Option<(&str, usize)> {
    let (call, n) = id.rsplit_once('-')?;
    let n: usize = n
        .parse()
        .ok()
        .filter(|n| (1..=MAX_ARTIFACTS_PER_CALL).contains(n))?;
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    (!call.is_empty() && call.len() <= 80 && call.chars().all(plain)).then_some((call, n))
}

/// What call `call_id` answered, as the tool's result: its text, its
/// structured content, and what else it sent described, with what is
/// not text to be stored as artifacts (`Err`: the tool said it failed,
/// with its text).
pub fn tool_result(wire: &Value, call_id: &str) -> Result<(Value, Vec<Artifact>), String> {
    let mut text: Vec<&str> = Vec::new();
    let mut other: Vec<Value> = Vec::new();
    let mut artifacts: Vec<Artifact> = Vec::new();
    let mut keep = |mime: Option<&str>, data: Option<&str>, mut entry: Value| {
        // Decoded size: a base64 quad is three bytes, less its padding.
        let bytes = data.map_or(0, |d| {
            let padding = d.bytes().rev().take_while(|&b| b == b'=').count();
            (d.len() / 4 * 3).saturating_sub(padding)
        });
        entry["bytes"] = bytes.into();
        match data {
            Some(_) if artifacts.len() == MAX_ARTIFACTS_PER_CALL => {
                entry["omitted"] = "too many artifacts in one call".into();
            }
            Some(_) if bytes > MAX_ARTIFACT_BYTES => {
                entry["omitted"] = "too large to keep".into();
            }
            Some(d) => {
                let id = format!("{call_id}-{}", artifacts.len() + 1);
                entry["artifact"] = id.clone().into();
                artifacts.push(Artifact {
                    id,
                    mime_type: mime.unwrap_or("application/octet-stream").to_string(),
                    data: d.to_string(),
                });
            }
            None => {}
        }
        entry
    };
    for block in wire
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kind = block
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let field = |k: &str| block.get(k).and_then(Value::as_str);
        match kind {
            "text" => text.extend(field("text")),
            "image" | "audio" => other.push(keep(
                field("mimeType"),
                field("data"),
                serde_json::json!({"type": kind, "mime_type": field("mimeType")}),
            )),
            "resource" => {
                let r = block.get("resource").cloned().unwrap_or_default();
                let rf = |k: &str| r.get(k).and_then(Value::as_str);
                match rf("text") {
                    Some(t) => other.push(serde_json::json!({
                        "type": "resource", "uri": rf("uri"), "text": t,
                    })),
                    None => other.push(keep(
                        rf("mimeType"),
                        rf("blob"),
                        serde_json::json!({
                            "type": "resource", "uri": rf("uri"), "mime_type": rf("mimeType"),
                        }),
                    )),
                }
            }
            "resource_link" => other.push(serde_json::json!({
                "type": "resource_link", "uri": field("uri"), "name": field("name"),
            })),
            _ => {}
        }
    }
    let joined = text.join("\n");
    if wire.get("isError").and_then(Value::as_bool) == Some(true) {
        return Err(joined);
    }
    let mut out = serde_json::Map::new();
    out.insert("text".into(), Value::String(joined));
    if let Some(s) = wire.get("structuredContent") {
        out.insert("structured".into(), s.clone());
    }
    if !other.is_empty() {
        out.insert("content".into(), Value::Array(other));
    }
    Ok((Value::Object(out), artifacts))
}

impl McpServer {
    /// An agent's `mcp_servers` as written: at most [`MAX_MCP_SERVERS`],
    /// names unique.
    pub fn parse_list(v: &Value) -> Result<Vec<McpServer>, FieldError> {
        let list = v
            .as_array()
            .ok_or_else(|| FieldError::new("mcp_servers", "must be a list of servers"))?;
        if list.len() > MAX_MCP_SERVERS {
            return Err(FieldError::new(
                "mcp_servers",
                &format!("at most {MAX_MCP_SERVERS} servers"),
            ));
        }
        let mut servers: Vec<McpServer> = Vec::new();
        for (i, item) in list.iter().enumerate() {
            let at = format!("mcp_servers[{i}]");
            let server = McpServer::parse(item, &at)?;
            if servers.iter().any(|s| s.name == server.name) {
                return Err(FieldError::new(&format!("{at}.name"), "is named twice"));
            }
            servers.push(server);
        }
        Ok(servers)
    }

    fn parse(v: &Value, at: &str) -> Result<McpServer, FieldError> {
        let obj = v
            .as_object()
            .ok_or_else(|| FieldError::new(at, "must be {name, url, ...}"))?;
        let f = Fields::nested(obj, at)?;
        f.only(&MCP_SERVER_FIELDS)?;
        let name = f.req_str("name")?;
        if !valid_name(name) || name.len() > MAX_SERVER_NAME || name.contains(SEPARATOR) {
            return Err(FieldError::new(
                &format!("{at}.name"),
                &format!(
                    "must be 1-{MAX_SERVER_NAME} characters of a-z, 0-9, '-' or '_', \
                     without '{SEPARATOR}'"
                ),
            ));
        }
        let url = f.req_str("url")?;
        if url.len() > 2048 || !url_is_http(url) {
            return Err(FieldError::new(
                &format!("{at}.url"),
                "must be an http(s) URL with a host and no user name",
            ));
        }
        let headers = match f.opt_obj("headers")? {
            Some(h) => {
                crate::egress::parse_header_map(&format!("{at}.headers"), h, &TRANSPORT_HEADERS)?
            }
            None => BTreeMap::new(),
        };
        let tools = f.opt_str_list("tools")?;
        if let Some(t) = &tools {
            if t.is_empty() || t.len() > MAX_TOOLS_PER_SERVER {
                return Err(FieldError::new(
                    &format!("{at}.tools"),
                    &format!("must name 1 to {MAX_TOOLS_PER_SERVER} tools"),
                ));
            }
            for (j, name) in t.iter().enumerate() {
                if name.is_empty() || name.len() > 128 || t[..j].contains(name) {
                    return Err(FieldError::new(
                        &format!("{at}.tools[{j}]"),
                        "must be a tool's name, once",
                    ));
                }
            }
        }
        let mut risk = BTreeMap::new();
        for (tool, level) in f.opt_obj("risk")?.into_iter().flatten() {
            let level = match level.as_str() {
                Some("low") => Risk::Low,
                Some("medium") => Risk::Medium,
                Some("high") => Risk::High,
                _ => {
                    return Err(FieldError::new(
                        &format!("{at}.risk.{tool}"),
                        "must be low, medium or high",
                    ))
                }
            };
            risk.insert(tool.clone(), level);
        }
        let timeout_s = match f.opt_u64("timeout_s")? {
            None => DEFAULT_MCP_TIMEOUT_S,
            Some(t) if (1..=u64::from(MAX_CALL_TIMEOUT_S)).contains(&t) => t as u32,
            Some(_) => {
                return Err(FieldError::new(
                    &format!("{at}.timeout_s"),
                    &format!("must be between 1 and {MAX_CALL_TIMEOUT_S}"),
                ))
            }
        };
        Ok(McpServer {
            name: name.to_string(),
            url: url.to_string(),
            headers,
            tools,
            risk,
            timeout_s,
        })
    }

    /// The manifests of the tools it listed that the agent takes, keyed by
    /// the name the model sees. `at` names the server in errors; `taken`
    /// are the names the agent has already (its skills, other servers').
    pub fn freeze(
        &self,
        at: &str,
        listed: &[ListedTool],
        taken: &[String],
    ) -> Result<BTreeMap<String, SkillManifest>, FieldError> {
        let offered = |name: &str| listed.iter().any(|t| t.name == name);
        for (j, name) in self.tools.iter().flatten().enumerate() {
            if !offered(name) {
                return Err(FieldError::new(
                    &format!("{at}.tools[{j}]"),
                    &format!("server '{}' lists no tool '{name}'", self.name),
                ));
            }
        }
        for tool in self.risk.keys() {
            if !offered(tool) {
                return Err(FieldError::new(
                    &format!("{at}.risk.{tool}"),
                    &format!("server '{}' lists no tool '{tool}'", self.name),
                ));
            }
        }
        let wanted = |t: &&ListedTool| self.tools.as_ref().is_none_or(|w| w.contains(&t.name));
        let mut frozen = BTreeMap::new();
        for tool in listed.iter().filter(wanted) {
            if frozen.len() == MAX_TOOLS_PER_SERVER {
                return Err(FieldError::new(
                    &format!("{at}.tools"),
                    &format!(
                        "server '{}' lists more than {MAX_TOOLS_PER_SERVER} tools: \
                         name the ones the agent takes",
                        self.name
                    ),
                ));
            }
            let name = format!("{}{SEPARATOR}{}", self.name, model_safe(&tool.name));
            if name.len() > 64 || frozen.contains_key(&name) || taken.contains(&name) {
                return Err(FieldError::new(
                    &format!("{at}.tools"),
                    &format!(
                        "tool '{}' cannot be offered to a model as '{name}' (too long, or \
                         taken): leave it out with `tools`",
                        tool.name
                    ),
                ));
            }
            if !crate::fields::schema_ok(&tool.input_schema) {
                return Err(FieldError::new(
                    &format!("{at}.tools"),
                    &format!(
                        "tool '{}' has an input schema that is not a JSON object of at \
                         most {MAX_SCHEMA_BYTES} bytes",
                        tool.name
                    ),
                ));
            }
            let description = tool
                .description
                .clone()
                .or_else(|| tool.title.clone())
                .unwrap_or_else(|| tool.name.clone());
            let manifest = SkillManifest {
                name: name.clone(),
                description: cut(&description, MAX_DESCRIPTION),
                kind: SkillKind::ExternalApi,
                requires_sandbox: false,
                timeout_s: self.timeout_s,
                mounts: vec![],
                ports: 0,
                risk: self
                    .risk
                    .get(&tool.name)
                    .copied()
                    .unwrap_or_else(|| ToolHints::risk(tool.hints.as_ref())),
                idempotent: ToolHints::repeatable(tool.hints.as_ref()),
                parameters: tool.input_schema.clone(),
                executor: Some(MCP.to_string()),
                mcp: Some(McpBinding {
                    server: self.name.clone(),
                    tool: tool.name.clone(),
                    hints: tool.hints,
                }),
                program: None,
            };
            frozen.insert(name, manifest);
        }
        Ok(frozen)
    }
}

/// A tool's name as a model may be offered it: what is not a letter,
/// digit, '-' or '_' becomes '_'.
pub(crate) fn model_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub(crate) fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => s[..i].to_string(),
        None => s.to_string(),
    }
}

fn url_is_http(url: &str) -> bool {
    let Some((scheme, rest)) = url.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    matches!(scheme, "http" | "https")
        && !authority.is_empty()
        && !authority.contains('@')
        && !url.chars().any(|c| c.is_whitespace() || c.is_control())
}

#[cfg(test)]
#[path = "mcp_tests.rs"]
mod tests;
