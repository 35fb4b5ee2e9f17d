//! Agent definitions, as stored in the registry and sent to `PUT /v1/agents/{name}`.

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::approval::ApprovalPolicy;
use crate::fields::{FieldError, Fields};
use crate::names::valid_name;
use crate::sandbox::{
    check_mount, CapabilitySet, Limits, ProfileDef, ProfileError, Profiles, CAPS,
};
use crate::served;
use crate::skills::{self, MountDecl, SkillManifest};

/// The fields of an agent's definition (`version`, `manifests` and
/// `shadowed_profiles` are what a `GET` adds: accepted and ignored).
pub const AGENT_FIELDS: [&str; 14] = [
    "name",
    "description",
    "model",
    "system_prompt",
    "skills",
    "limits",
    "http_allow_hosts",
    "http_headers",
    "mcp_servers",
    "sandbox",
    "approvals",
    "version",
    "manifests",
    "shadowed_profiles",
];

/// The fields of an agent's `model`.
pub const MODEL_FIELDS: [&str; 5] = [
    "provider",
    "model_id",
    "context_window",
    "base_url",
    "api_key_env",
];

/// The fields of an agent's `limits`.
pub const AGENT_LIMITS_FIELDS: [&str; 3] = ["max_model_turns", "max_tool_calls", "timeout_s"];

/// The fields of an agent's `sandbox` section.
pub const SANDBOX_FIELDS: [&str; 9] = [
    "profile",
    "provisioning",
    "resident",
    "limits",
    "egress_ports",
    "mounts",
    "user",
    "profiles",
    "idle_hibernate_s",
];

/// The fields of `sandbox.limits`.
pub const SANDBOX_LIMITS_FIELDS: [&str; 4] =
    ["cpu_millis", "memory_mb", "disk_mb", "call_timeout_s"];

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelProvider {
    /// The deterministic scripted model, served over the OpenAI wire protocol
    /// at the deployment's configured scripted-model URL.
    Scripted,
    /// Any OpenAI-compatible chat-completions endpoint.
    Openai,
    /// Amazon Bedrock, through the Converse API.
    Bedrock,
}

impl ModelProvider {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "scripted" => Some(Self::Scripted),
            "openai" => Some(Self::Openai),
            "bedrock" => Some(Self::Bedrock),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSpec {
    pub provider: ModelProvider,
    pub model_id: String,
    /// The model's context window, in tokens.
    pub context_window: u64,
    /// Base URL for `openai` (e.g. `https://api.openai.com/v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Name of the environment variable that holds the API key for `openai`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentLimits {
    pub max_model_turns: u32,
    pub max_tool_calls: u32,
    /// Wall-clock budget of one Run, in seconds.
    pub timeout_s: u32,
}

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits {
            max_model_turns: 8,
            max_tool_calls: 16,
            timeout_s: 300,
        }
    }
}

/// The caps no agent definition may exceed.
pub const MAX_MODEL_TURNS: u32 = 100;
pub const MAX_TOOL_CALLS: u32 = 500;
pub const MAX_RUN_TIMEOUT_S: u32 = 3600;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentDefinition {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub model: ModelSpec,
    pub system_prompt: String,
    #[serde(default)]
    pub skills: Vec<String>,
    #[serde(default)]
    pub limits: AgentLimits,
    /// Hosts the `http_request` skill may reach.
    #[serde(default)]
    pub http_allow_hosts: Vec<String>,
    /// Headers `http_request` sends to some of those hosts, the model
    /// unasked (tokens as the tenant's secrets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_headers: Vec<crate::egress::HttpHeaders>,
    /// Remote MCP servers whose tools it uses (frozen into `manifests`
    /// as `<server>__<tool>` when it is registered).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<crate::mcp::McpServer>,
    /// Where the agent's sandbox skills run.
    #[serde(default)]
    pub sandbox: SandboxSpec,
    /// The manifests of its skills as they were when it was registered
    /// (its placement requirements are frozen with the definition).
    #[serde(default)]
    pub manifests: BTreeMap<String, SkillManifest>,
    /// Who approves its risky calls, and how (absent: the defaults, under
    /// which `high`-risk and destructive calls still wait for an approver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<ApprovalPolicy>,
    /// Incremented by every update.
    #[serde(default)]
    pub version: u64,
}

/// When an agent's sandbox is made (seed 002).
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provisioning {
    /// At the first sandbox skill call; pure chat Runs never get one.
    #[default]
    OnToolUse,
    /// Before the Run's first model call.
    Eager,
}

/// The agent's sandbox requirements, frozen with the definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// A built-in profile, a global custom one, or one of `profiles`.
    pub profile: String,
    pub provisioning: Provisioning,
    /// Kept warm (prewarmed, never hibernated).
    pub resident: bool,
    pub limits: Limits,
    /// TCP ports calls may connect to (the egress allow-list).
    pub egress_ports: Vec<u16>,
    /// Bind mounts: exact sub-paths of `user`'s workspace.
    pub mounts: Vec<MountDecl>,
    /// The user whose workspace the sandbox may mount.
    pub user: Option<String>,
    /// Project profiles: they may add names, never redefine global ones.
    pub profiles: BTreeMap<String, ProfileDef>,
    /// Idle time after which the sandbox hibernates.
    pub idle_hibernate_s: u32,
}

/// Seed 000 §B: public HTTPS is on the allow-list.
pub const DEFAULT_EGRESS_PORTS: [u16; 1] = [443];
pub const DEFAULT_IDLE_HIBERNATE_S: u32 = 900;

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec {
            profile: "workspace".into(),
            provisioning: Provisioning::OnToolUse,
            resident: false,
            limits: Limits::default(),
            egress_ports: DEFAULT_EGRESS_PORTS.to_vec(),
            mounts: vec![],
            user: None,
            profiles: BTreeMap::new(),
            idle_hibernate_s: DEFAULT_IDLE_HIBERNATE_S,
        }
    }
}

impl SandboxSpec {
    /// The capability set to enforce: global profiles first (they win),
    /// then this definition's project profiles. Also returns the project
    /// names that were shadowed by global ones.
    pub fn resolve(
        &self,
        global: BTreeMap<String, ProfileDef>,
    ) -> Result<(CapabilitySet, Vec<String>), ProfileError> {
        let profiles = Profiles::load(global, self.profiles.clone())?;
        let caps = profiles.resolve(&self.profile)?;
        Ok((caps, profiles.shadowed))
    }

    fn from_fields(f: &Fields<'_>) -> Result<Self, FieldError> {
        f.only(&SANDBOX_FIELDS)?;
        let mut spec = SandboxSpec::default();
        if let Some(p) = f.opt_str("profile")? {
            if p.is_empty() {
                return Err(FieldError::new("sandbox.profile", "must not be empty"));
            }
            spec.profile = p.to_string();
        }
        spec.provisioning = match f.opt_str("provisioning")? {
            None | Some("on_tool_use") => Provisioning::OnToolUse,
            Some("eager") => Provisioning::Eager,
            Some(_) => {
                return Err(FieldError::new(
                    "sandbox.provisioning",
                    "must be on_tool_use or eager",
                ))
            }
        };
        spec.resident = f.opt_bool("resident")?.unwrap_or(false);
        if let Some(l) = f.opt_obj("limits")? {
            let l = Fields::nested(l, "sandbox.limits")?;
            l.only(&SANDBOX_LIMITS_FIELDS)?;
            let mut limits = Limits::default();
            for (name, slot, cap) in [
                ("cpu_millis", &mut limits.cpu_millis, CAPS.cpu_millis),
                ("memory_mb", &mut limits.memory_mb, CAPS.memory_mb),
                ("disk_mb", &mut limits.disk_mb, CAPS.disk_mb),
                (
                    "call_timeout_s",
                    &mut limits.call_timeout_s,
                    CAPS.call_timeout_s,
                ),
            ] {
                if let Some(v) = l.opt_u64(name)? {
                    *slot = capped(v, cap, &format!("sandbox.limits.{name}"))?;
                }
            }
            spec.limits = limits;
        }
        if let Some(ports) = f.opt_array("egress_ports")? {
            spec.egress_ports = ports
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    p.as_u64()
                        .filter(|p| (1..=65535).contains(p))
                        .map(|p| p as u16)
                        .ok_or_else(|| {
                            FieldError::new(
                                &format!("sandbox.egress_ports[{i}]"),
                                "must be a port from 1 to 65535",
                            )
                        })
                })
                .collect::<Result<_, _>>()?;
        }
        spec.user = f.opt_str("user")?.map(str::to_string);
        if let Some(mounts) = f.opt_array("mounts")? {
            for (i, m) in mounts.iter().enumerate() {
                let user = spec.user.as_deref().ok_or_else(|| {
                    FieldError::new("sandbox.user", "is required when mounts are declared")
                })?;
                spec.mounts
                    .push(MountDecl::parse(m, &format!("sandbox.mounts[{i}]"), user)?);
            }
        }
        if let Some(ps) = f.opt_obj("profiles")? {
            for (name, def) in ps {
                let def = ProfileDef::parse(def, &format!("sandbox.profiles.{name}"))?;
                spec.profiles.insert(name.clone(), def);
            }
        }
        if let Some(v) = f.opt_u64("idle_hibernate_s")? {
            spec.idle_hibernate_s = capped(v, 7 * 86_400, "sandbox.idle_hibernate_s")?;
        }
        // A project profile that cannot resolve is refused now, not at start.
        Profiles::load(BTreeMap::new(), spec.profiles.clone())
            .and_then(|p| p.resolve(&spec.profile).map(|_| ()))
            .or_else(|e| match e {
                // Resolvable later from global profiles.
                ProfileError::Unknown(_) => Ok(()),
                other => Err(other),
            })
            .map_err(|e| FieldError::new("sandbox.profile", &e.to_string()))?;
        Ok(spec)
    }
}

impl AgentDefinition {
    /// Parses and validates a definition from a request body. `name` comes
    /// from the path and wins over any name in the body.
    pub fn from_json(name: &str, body: &serde_json::Value) -> Result<Self, FieldError> {
        if !valid_name(name) {
            return Err(FieldError::new(
                "name",
                "must be 1-64 characters of a-z, 0-9, '-' or '_'",
            ));
        }
        let f = Fields::new(body)?;
        // A typo in any section (say `sandboxx`) must never fall back to
        // defaults: every level refuses what it does not define. What a
        // `GET` adds (its version, the skills' frozen manifests, a `PUT`'s
        // report of shadowed profiles) is accepted and ignored, so that a
        // definition read can be written back as it is.
        f.only(&AGENT_FIELDS)?;
        let model = f.req_obj("model")?;
        let m = Fields::nested(model, "model")?;
        m.only(&MODEL_FIELDS)?;
        let provider_s = m.req_str("provider")?;
        let provider = ModelProvider::parse(provider_s).ok_or_else(|| {
            FieldError::new("model.provider", "must be one of scripted, openai, bedrock")
        })?;
        let model_id = m.req_str("model_id")?.to_string();
        if model_id.is_empty() {
            return Err(FieldError::new("model.model_id", "must not be empty"));
        }
        let context_window = m.req_u64("context_window")?;
        if !(256..=10_000_000).contains(&context_window) {
            return Err(FieldError::new(
                "model.context_window",
                "must be between 256 and 10000000 tokens",
            ));
        }
        let base_url = m.opt_str("base_url")?.map(str::to_string);
        if provider == ModelProvider::Openai && base_url.is_none() {
            return Err(FieldError::new(
                "model.base_url",
                "is required for the openai provider",
            ));
        }
        let api_key_env = m.opt_str("api_key_env")?.map(str::to_string);
        let system_prompt = f.req_str("system_prompt")?.to_string();
        let description = f.opt_str("description")?.unwrap_or_default().to_string();
        let skills = f.opt_str_list("skills")?.unwrap_or_default();
        for (i, s) in skills.iter().enumerate() {
            if !valid_name(s) {
                return Err(FieldError::new(
                    &format!("skills[{i}]"),
                    &format!("'{s}' is not a skill name"),
                ));
            }
        }
        let mut limits = AgentLimits::default();
        if let Some(l) = f.opt_obj("limits")? {
            let l = Fields::nested(l, "limits")?;
            l.only(&AGENT_LIMITS_FIELDS)?;
            if let Some(v) = l.opt_u64("max_model_turns")? {
                limits.max_model_turns = capped(v, MAX_MODEL_TURNS, "limits.max_model_turns")?;
            }
            if let Some(v) = l.opt_u64("max_tool_calls")? {
                limits.max_tool_calls = capped(v, MAX_TOOL_CALLS, "limits.max_tool_calls")?;
            }
            if let Some(v) = l.opt_u64("timeout_s")? {
                limits.timeout_s = capped(v, MAX_RUN_TIMEOUT_S, "limits.timeout_s")?;
            }
        }
        let http_allow_hosts = f.opt_str_list("http_allow_hosts")?.unwrap_or_default();
        let allowed = crate::egress::parse_allow_hosts(&http_allow_hosts)?;
        let http_headers = match f.get("http_headers") {
            Some(v) => crate::egress::parse_http_headers(v, &allowed)?,
            None => Vec::new(),
        };
        let mcp_servers = match f.get("mcp_servers") {
            Some(v) => crate::mcp::McpServer::parse_list(v)?,
            None => Vec::new(),
        };
        let sandbox = match f.opt_obj("sandbox")? {
            Some(o) => SandboxSpec::from_fields(&Fields::nested(o, "sandbox")?)?,
            None => SandboxSpec::default(),
        };
        let approvals = match f.opt_obj("approvals")? {
            Some(o) => Some(ApprovalPolicy::from_fields(&Fields::nested(
                o,
                "approvals",
            )?)?),
            None => None,
        };
        Ok(AgentDefinition {
            name: name.to_string(),
            description,
            model: ModelSpec {
                provider,
                model_id,
                context_window,
                base_url,
                api_key_env,
            },
            system_prompt,
            skills,
            limits,
            http_allow_hosts,
            http_headers,
            mcp_servers,
            sandbox,
            manifests: BTreeMap::new(),
            approvals,
            version: 0,
        })
    }
}

impl AgentDefinition {
    /// Freezes the manifests of the agent's skills: a registry manifest
    /// (`lookup`) or a built-in. An unknown skill, or a manifest mount the
    /// agent's user may not have, is refused naming the field.
    pub fn resolve_manifests(
        &mut self,
        lookup: impl Fn(&str) -> Option<SkillManifest>,
    ) -> Result<(), FieldError> {
        let user = self.sandbox.user.clone().unwrap_or_default();
        let mut manifests = BTreeMap::new();
        for (i, s) in self.skills.iter().enumerate() {
            let field = format!("skills[{i}]");
            let m = lookup(s)
                .or_else(|| skills::builtin(s))
                .ok_or_else(|| FieldError::new(&field, &format!("unknown skill '{s}'")))?;
            for mount in &m.mounts {
                check_mount(&mount.path, mount.mode, &user).map_err(|e| {
                    FieldError::new(&field, &format!("skill '{s}' mounts {}: {e}", mount.path))
                })?;
            }
            for tool in served::served_tools(s, &m) {
                let taken = self.skills.contains(&tool.name)
                    || manifests.values().any(|o: &SkillManifest| {
                        served::served_tools(&o.name, o)
                            .iter()
                            .any(|t| t.name == tool.name)
                    });
                if taken || tool.name.len() > 64 {
                    return Err(FieldError::new(
                        &field,
                        &format!(
                            "skill '{s}' offers a tool the model would call '{}', which is \
                             too long or another tool's name",
                            tool.name
                        ),
                    ));
                }
            }
            manifests.insert(s.clone(), m);
        }
        self.manifests = manifests;
        Ok(())
    }

    /// Freezes the tools each of its MCP servers listed (`listed`, in the
    /// order of `mcp_servers`) beside its skills' manifests.
    pub fn freeze_mcp_tools(
        &mut self,
        listed: &[Vec<crate::mcp::ListedTool>],
    ) -> Result<(), FieldError> {
        // A listing again replaces what the last one froze.
        self.manifests.retain(|_, m| m.mcp.is_none());
        let mut taken = self.tool_names();
        for (i, (server, tools)) in self.mcp_servers.iter().zip(listed).enumerate() {
            let frozen = server.freeze(&format!("mcp_servers[{i}]"), tools, &taken)?;
            taken.extend(frozen.keys().cloned());
            self.manifests.extend(frozen);
        }
        Ok(())
    }

    /// Every tool the model is offered: its skills (a skill whose program
    /// is an MCP server as its tools), then its MCP servers' frozen tools.
    pub fn tool_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for s in &self.skills {
            match self.manifests.get(s).filter(|m| served::is_server(m)) {
                // A skill whose program is an MCP server is its tools.
                Some(m) => names.extend(served::served_tools(s, m).into_iter().map(|t| t.name)),
                None => names.push(s.clone()),
            }
        }
        names.extend(
            self.manifests
                .iter()
                .filter(|(_, m)| m.mcp.is_some())
                .map(|(n, _)| n.clone()),
        );
        names
    }

    /// A skill's manifest as frozen (definitions stored before manifests
    /// were frozen fall back to the built-ins), or an MCP server's tool.
    pub fn manifest(&self, skill: &str) -> Option<SkillManifest> {
        if !self.skills.iter().any(|s| s == skill) {
            let remote = self.manifests.get(skill).filter(|m| m.mcp.is_some());
            return remote.cloned().or_else(|| {
                self.manifests
                    .iter()
                    .filter(|(s, m)| self.skills.contains(s) && served::is_server(m))
                    .flat_map(|(s, m)| served::served_tools(s, m))
                    .find(|t| t.name == skill)
            });
        }
        self.manifests
            .get(skill)
            .cloned()
            .or_else(|| skills::builtin(skill))
    }

    /// Whether any of its skills runs in a sandbox.
    pub fn uses_sandbox(&self) -> bool {
        self.skills
            .iter()
            .any(|s| self.manifest(s).is_some_and(|m| m.in_sandbox()))
    }

    /// The sandbox's mounts: the definition's and its skills' manifests'.
    pub fn sandbox_mounts(&self) -> Vec<MountDecl> {
        let mut all = self.sandbox.mounts.clone();
        for s in &self.skills {
            for m in self.manifest(s).map(|m| m.mounts).unwrap_or_default() {
                if !all.contains(&m) {
                    all.push(m);
                }
            }
        }
        all
    }

    /// Whether its sandbox calls are destructive: a read-write sub-path of
    /// the user's workspace is mounted (they need an approval). A mount the
    /// policy refuses is not judged here: the sandbox refuses to start.
    pub fn destructive(&self) -> bool {
        let user = self.sandbox.user.as_deref().unwrap_or_default();
        self.sandbox_mounts()
            .iter()
            .any(|m| check_mount(&m.path, m.mode, user) == Ok(true))
    }
}

fn capped(v: u64, cap: u32, field: &str) -> Result<u32, FieldError> {
    if v == 0 || v > u64::from(cap) {
        return Err(FieldError::new(
            field,
            &format!("must be between 1 and {cap}"),
        ));
    }
    Ok(v as u32)
}

#[cfg(test)]
#[path = "agent_tests.rs"]
mod tests;
