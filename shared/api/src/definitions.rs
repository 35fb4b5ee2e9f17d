//! What the registry's `PUT` routes take, field by field: agents, their
//! model, limits, sandbox and approvals, skill manifests, teams and
//! sandbox profiles. The domain parses these bodies itself (every error
//! names its field, and an unknown field is refused at every level);
//! these types describe the same fields for the OpenAPI document and for
//! clients, and the tests below hold them to the domain's field lists.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use armada_domain::agent::{ModelProvider, Provisioning};
use armada_domain::approval::policy::{Destructive, MediumRisk, OnIndeterminate, OnReject};
use armada_domain::egress::HttpHeaders;
use armada_domain::sandbox::{MountMode, SkillKind};
use armada_domain::skills::Risk;
use armada_domain::team::Strategy;

/// `PUT /v1/agents/{name}`: an agent's definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentBody {
    /// Read-only: the name is the path's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub model: ModelBody,
    pub system_prompt: String,
    /// Skills by name: built-ins or registered manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skills: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<AgentLimitsBody>,
    /// `host` or `host:port` entries `http_request` may reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_allow_hosts: Option<Vec<String>>,
    /// Headers `http_request` sends to a host of `http_allow_hosts`
    /// whatever the model asks: a value, or a tenant's secret named
    /// (`{"secret": "crm-token"}`, opened only as the request goes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_headers: Option<Vec<HttpHeaders>>,
    /// Remote MCP servers whose tools the agent uses: listed when it is
    /// written, frozen into its version as `<server>__<tool>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<Vec<McpServerBody>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<ApprovalsBody>,
    /// Read-only: what a `GET` shows (ignored when written back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub version: Option<u64>,
    /// Read-only: the skills' manifests as frozen into this version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only, value_type = Option<Object>)]
    pub manifests: Option<Value>,
    /// Read-only: global profiles that override project profiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub shadowed_profiles: Option<Vec<String>>,
}

/// A remote MCP server (Streamable HTTP) an agent uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServerBody {
    /// 1-24 characters of a-z, 0-9, '-' or '_', without '__': the prefix
    /// of its tools' names.
    pub name: String,
    /// Its endpoint, reached through the egress guard.
    pub url: String,
    /// Sent with every request: a value, or a tenant's secret named
    /// (`{"secret": "crm-token"}`), the Run's tenant's when a call is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub headers: Option<BTreeMap<String, Value>>,
    /// The tools the agent takes (absent: every one the server lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// A tool's risk, over what its annotations imply (destructive: high,
    /// read-only: low, otherwise medium).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<BTreeMap<String, Risk>>,
    /// A call's timeout (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1800)]
    pub timeout_s: Option<u32>,
}

/// The model an agent answers with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelBody {
    pub provider: ModelProvider,
    pub model_id: String,
    /// Tokens, from 256 to 10,000,000.
    #[schema(minimum = 256, maximum = 10_000_000)]
    pub context_window: u64,
    /// Required for `openai` (any OpenAI-compatible endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The environment variable of the functions that holds its key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

/// A Run's budgets (each capped by the deployment).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentLimitsBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_turns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
}

/// The agent's sandbox: where its code-executing tools run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxBody {
    /// The capability profile (a global one, or one of `profiles`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning: Option<Provisioning>,
    /// Kept running between calls instead of hibernating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<SandboxLimitsBody>,
    /// Ports its code may connect out to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<u16>>)]
    pub egress_ports: Option<Vec<u64>>,
    /// Shared directories (need `user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mounts: Option<Vec<MountBody>>,
    /// The person the sandbox acts for (its workspace is `/data/users/<user>/workspace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Project profiles, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiles: Option<BTreeMap<String, ProfileBody>>,
    /// Idle seconds before the sandbox hibernates (at most a week).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_hibernate_s: Option<u64>,
}

/// A sandbox's resources per call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxLimitsBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_timeout_s: Option<u64>,
}

/// A shared directory in a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountBody {
    pub path: String,
    pub mode: MountMode,
}

/// Which calls wait for a person, who decides, and what a refusal does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsBody {
    /// Skills whose every call needs an approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require: Option<Vec<String>>,
    /// What a medium-risk call does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<MediumRisk>,
    /// Email addresses asked to decide (the operator's; tenants do not
    /// see them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvers: Option<Vec<String>>,
    /// Where a chat message with the review link is posted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_webhook_url: Option<String>,
    /// Seconds before an undecided approval expires (a rejection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_reject: Option<OnReject>,
    /// Whether the key that started a Run may approve its calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_self_approval: Option<bool>,
    /// What a call whose sandbox was lost after it was sent does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub indeterminate: Option<OnIndeterminate>,
    /// How a destructive sandbox call is recognised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<Destructive>,
}

/// `PUT /v1/skills/{name}`: a skill manifest. It names a built-in
/// `executor` (a manifest cannot bring its own program).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillBody {
    /// Read-only: the name is the path's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<SkillKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_sandbox: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mounts: Option<Vec<MountBody>>,
    /// Ports it serves on (at most 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<Risk>,
    /// Whether a lost call may be sent again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// The JSON Schema of its arguments, as the model sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    /// The built-in that runs it (its name by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<String>,
    /// A program the skill brings instead of naming an executor, run in
    /// the agent's sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<ProgramBody>,
}

/// A program a skill brings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProgramBody {
    /// The executable and its arguments (no shell): 1 to 32 strings.
    pub command: Vec<String>,
    /// `json`: one process per call, the arguments as JSON on stdin, the
    /// result as JSON on stdout, exit code 0 its success. `mcp`: an MCP
    /// server over stdio, kept running in the sandbox across calls, each
    /// of its `tools` offered to the model as `<skill>__<tool>`.
    pub protocol: armada_domain::program::ProgramProtocol,
    /// Its environment: a value, or a tenant's secret named
    /// (`{"secret": "crm-token"}`, the Run's tenant's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub env: Option<BTreeMap<String, Value>>,
    /// Shell commands (at most 8) run once per version of the program's
    /// files and of these steps, in `.skills/<name>/` of the sandbox's
    /// workspace, under the jail, before the first call there
    /// (`npm ci`, `pip install -r requirements.txt --target deps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<Vec<String>>,
    /// Read-only: the version of the files uploaded with
    /// `PUT /v1/skills/{name}/files` (a body's own is ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub files: Option<armada_domain::skill_files::SkillFiles>,
    /// `mcp` only, and required there: the tools the server offers, as its
    /// `tools/list` answers them (`{name, description?, inputSchema,
    /// annotations?}`; `armada skills list-tools -- <command>` prints
    /// them). Annotations decide risk and retries as a remote server's do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
}

/// `PUT /v1/teams/{name}`: a team's definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TeamBody {
    /// Read-only: the name is the path's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub name: Option<String>,
    /// Its agents, in order (1 to 64, each once).
    pub members: Vec<String>,
    pub strategy: Strategy,
    /// Who answers round 2 of a fan-out (its first member by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregator: Option<String>,
    /// Who plans and consolidates (required for `lead`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lead: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicyBody>,
    /// Members running at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<u64>,
}

/// What a team's Run makes of its members' failures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum FailurePolicyBody {
    /// `all` (every member must complete) or `best_effort`.
    Named(FailurePolicyName),
    /// At least `quorum` members must complete.
    Quorum(QuorumBody),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicyName {
    All,
    BestEffort,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuorumBody {
    #[schema(minimum = 1)]
    pub quorum: u64,
}

/// `PUT /v1/profiles/{name}` (and an agent's project profiles): what a
/// sandbox may read, write and reach.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileBody {
    /// The profile this one starts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extends: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_write: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restrict_network: Option<bool>,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;
    use utoipa::PartialSchema;

    use super::*;
    use armada_domain::agent::{
        AgentDefinition, AGENT_FIELDS, AGENT_LIMITS_FIELDS, MODEL_FIELDS, SANDBOX_FIELDS,
        SANDBOX_LIMITS_FIELDS,
    };
    use armada_domain::approval::policy::APPROVAL_FIELDS;
    use armada_domain::sandbox::{ProfileDef, PROFILE_FIELDS};
    use armada_domain::skills::{SkillManifest, MOUNT_FIELDS, SKILL_FIELDS};
    use armada_domain::team::{TeamDefinition, TEAM_FIELDS};

    fn properties<T: PartialSchema>() -> BTreeSet<String> {
        let schema = serde_json::to_value(T::schema()).unwrap();
        schema["properties"]
            .as_object()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// An agent with only what is required.
    fn bare(provider: ModelProvider) -> AgentBody {
        AgentBody {
            name: None,
            description: None,
            model: ModelBody {
                provider,
                model_id: "m".into(),
                context_window: 8192,
                base_url: None,
                api_key_env: None,
            },
            system_prompt: "p".into(),
            skills: None,
            limits: None,
            http_allow_hosts: None,
            http_headers: None,
            mcp_servers: None,
            sandbox: None,
            approvals: None,
            version: None,
            manifests: None,
            shadowed_profiles: None,
        }
    }

    fn names(fields: &[&str]) -> BTreeSet<String> {
        fields.iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn every_body_has_exactly_the_fields_the_domain_parses() {
        assert_eq!(properties::<AgentBody>(), names(&AGENT_FIELDS));
        assert_eq!(
            properties::<McpServerBody>(),
            names(&armada_domain::mcp::MCP_SERVER_FIELDS)
        );
        assert_eq!(properties::<ModelBody>(), names(&MODEL_FIELDS));
        assert_eq!(properties::<AgentLimitsBody>(), names(&AGENT_LIMITS_FIELDS));
        assert_eq!(properties::<SandboxBody>(), names(&SANDBOX_FIELDS));
        assert_eq!(
            properties::<SandboxLimitsBody>(),
            names(&SANDBOX_LIMITS_FIELDS)
        );
        assert_eq!(properties::<MountBody>(), names(&MOUNT_FIELDS));
        assert_eq!(properties::<ApprovalsBody>(), names(&APPROVAL_FIELDS));
        assert_eq!(properties::<SkillBody>(), names(&SKILL_FIELDS));
        assert_eq!(
            properties::<ProgramBody>(),
            names(&armada_domain::program::PROGRAM_FIELDS)
        );
        assert_eq!(properties::<TeamBody>(), names(&TEAM_FIELDS));
        assert_eq!(properties::<ProfileBody>(), names(&PROFILE_FIELDS));
    }

    /// Every field set, and every named value the bodies list, is
    /// accepted by the domain's parser.
    #[test]
    fn bodies_written_with_these_types_are_accepted() {
        let profile = ProfileBody {
            extends: Some("workspace".into()),
            read_only: Some(vec!["/opt".into()]),
            read_write: Some(vec!["/tmp".into()]),
            deny: Some(vec!["/etc/shadow".into()]),
            restrict_network: Some(true),
        };
        let agent = AgentBody {
            description: Some("d".into()),
            model: ModelBody {
                provider: ModelProvider::Openai,
                model_id: "m".into(),
                context_window: 8192,
                base_url: Some("http://models.example:8000/v1".into()),
                api_key_env: Some("MODEL_KEY".into()),
            },
            system_prompt: "You help.".into(),
            skills: Some(vec!["shell_exec".into()]),
            limits: Some(AgentLimitsBody {
                max_model_turns: Some(5),
                max_tool_calls: Some(5),
                timeout_s: Some(60),
            }),
            http_allow_hosts: Some(vec!["api.example.com".into()]),
            http_headers: Some(vec![HttpHeaders {
                host: "api.example.com".into(),
                headers: BTreeMap::from([
                    (
                        "Authorization".into(),
                        armada_domain::secret::Configured::Secret {
                            secret: "api-token".into(),
                        },
                    ),
                    (
                        "X-Team".into(),
                        armada_domain::secret::Configured::Literal("blue".into()),
                    ),
                ]),
            }]),
            mcp_servers: Some(vec![McpServerBody {
                name: "crm".into(),
                url: "https://crm.example.com/mcp".into(),
                headers: Some(BTreeMap::from([(
                    "Authorization".into(),
                    json!({"secret": "crm-token"}),
                )])),
                tools: Some(vec!["find".into()]),
                risk: Some(BTreeMap::from([("find".into(), Risk::Low)])),
                timeout_s: Some(30),
            }]),
            sandbox: Some(SandboxBody {
                profile: Some("mine".into()),
                provisioning: Some(Provisioning::Eager),
                resident: Some(false),
                limits: Some(SandboxLimitsBody {
                    cpu_millis: Some(500),
                    memory_mb: Some(512),
                    disk_mb: Some(1024),
                    call_timeout_s: Some(30),
                }),
                egress_ports: Some(vec![443]),
                mounts: Some(vec![MountBody {
                    path: "/data/users/ana/workspace/notes".into(),
                    mode: MountMode::Rw,
                }]),
                user: Some("ana".into()),
                profiles: Some(BTreeMap::from([("mine".into(), profile.clone())])),
                idle_hibernate_s: Some(600),
            }),
            approvals: Some(ApprovalsBody {
                require: Some(vec!["shell_exec".into()]),
                medium: Some(MediumRisk::Approve),
                approvers: Some(vec!["ops@example.com".into()]),
                chat_webhook_url: Some("https://chat.example/hook".into()),
                expires_s: Some(3600),
                on_reject: Some(OnReject::TellModel),
                allow_self_approval: Some(false),
                indeterminate: Some(OnIndeterminate::Ask),
                destructive: Some(Destructive::Effect),
            }),
            ..bare(ModelProvider::Openai)
        };
        let written = serde_json::to_value(&agent).unwrap();
        AgentDefinition::from_json("a", &written).unwrap();

        for (medium, on_reject, indeterminate, destructive) in [
            (
                MediumRisk::Execute,
                OnReject::Fail,
                OnIndeterminate::Fail,
                Destructive::Words,
            ),
            (
                MediumRisk::Approve,
                OnReject::TellModel,
                OnIndeterminate::Ask,
                Destructive::Effect,
            ),
        ] {
            let body = AgentBody {
                sandbox: Some(SandboxBody {
                    provisioning: Some(Provisioning::OnToolUse),
                    ..SandboxBody::default()
                }),
                approvals: Some(ApprovalsBody {
                    medium: Some(medium),
                    on_reject: Some(on_reject),
                    indeterminate: Some(indeterminate),
                    destructive: Some(destructive),
                    ..ApprovalsBody::default()
                }),
                ..bare(ModelProvider::Scripted)
            };
            AgentDefinition::from_json("a", &serde_json::to_value(&body).unwrap()).unwrap();
        }
        for provider in [ModelProvider::Scripted, ModelProvider::Bedrock] {
            let body = serde_json::to_value(bare(provider)).unwrap();
            AgentDefinition::from_json("a", &body).unwrap();
        }

        for kind in [
            SkillKind::CodeExecution,
            SkillKind::ServiceDeployment,
            SkillKind::BuildInstall,
        ] {
            let skill = SkillBody {
                name: Some("ignored".into()),
                description: Some("runs code".into()),
                kind: Some(kind),
                requires_sandbox: Some(true),
                timeout_s: Some(30),
                mounts: Some(vec![MountBody {
                    path: "/data/users/ana/workspace/notes".into(),
                    mode: MountMode::Ro,
                }]),
                ports: Some(1),
                risk: Some(Risk::High),
                idempotent: Some(false),
                parameters: Some(json!({"type": "object", "properties": {}})),
                executor: Some("shell_exec".into()),
                program: None,
            };
            SkillManifest::from_json("s", &serde_json::to_value(&skill).unwrap()).unwrap();
        }
        for kind in [
            SkillKind::LlmCall,
            SkillKind::DatabaseQuery,
            SkillKind::ExternalApi,
            SkillKind::TextProcessing,
            SkillKind::WebSearch,
        ] {
            let skill = SkillBody {
                kind: Some(kind),
                executor: Some("http_request".into()),
                program: None,
                ..SkillBody::default()
            };
            SkillManifest::from_json("s", &serde_json::to_value(&skill).unwrap()).unwrap();
        }

        let policies = [
            FailurePolicyBody::Named(FailurePolicyName::All),
            FailurePolicyBody::Named(FailurePolicyName::BestEffort),
            FailurePolicyBody::Quorum(QuorumBody { quorum: 2 }),
        ];
        for (strategy, failure_policy) in [Strategy::FanOut, Strategy::Relay, Strategy::Lead]
            .into_iter()
            .zip(policies)
        {
            let team = TeamBody {
                name: None,
                members: vec!["a".into(), "b".into()],
                strategy,
                aggregator: Some("a".into()),
                lead: Some("b".into()),
                failure_policy: Some(failure_policy),
                max_parallel: Some(2),
            };
            TeamDefinition::from_json("t", &serde_json::to_value(&team).unwrap()).unwrap();
        }

        let written = serde_json::to_value(&profile).unwrap();
        ProfileDef::parse(&written, "profile").unwrap();
    }

    /// What a `GET` shows (the domain's records serialised, less the
    /// name) fits these types exactly, so a definition read can be
    /// written back and the views can be described by them.
    #[test]
    fn what_a_get_shows_is_written_in_these_types() {
        fn shown<T: Serialize>(record: &T) -> Value {
            serde_json::to_value(record).unwrap()
        }
        let full = serde_json::to_value(AgentBody {
            sandbox: Some(SandboxBody {
                mounts: Some(vec![MountBody {
                    path: "/data/users/ana/workspace/notes".into(),
                    mode: MountMode::Rw,
                }]),
                user: Some("ana".into()),
                profiles: Some(BTreeMap::from([(
                    "mine".into(),
                    ProfileBody {
                        extends: Some("workspace".into()),
                        ..ProfileBody::default()
                    },
                )])),
                profile: Some("mine".into()),
                ..SandboxBody::default()
            }),
            approvals: Some(ApprovalsBody {
                approvers: Some(vec!["ops@example.com".into()]),
                ..ApprovalsBody::default()
            }),
            skills: Some(vec!["shell_exec".into()]),
            ..bare(ModelProvider::Scripted)
        })
        .unwrap();
        let mut agent = AgentDefinition::from_json("a", &full).unwrap();
        agent.resolve_manifests(|_| None).expect("built-in skills");
        let read: AgentBody = serde_json::from_value(shown(&agent)).unwrap();
        assert!(read.manifests.is_some() && read.sandbox.is_some());

        let team = TeamBody {
            name: None,
            members: vec!["a".into(), "b".into()],
            strategy: Strategy::FanOut,
            aggregator: None,
            lead: None,
            failure_policy: Some(FailurePolicyBody::Quorum(QuorumBody { quorum: 1 })),
            max_parallel: None,
        };
        for policy in [
            FailurePolicyBody::Quorum(QuorumBody { quorum: 1 }),
            FailurePolicyBody::Named(FailurePolicyName::All),
            FailurePolicyBody::Named(FailurePolicyName::BestEffort),
        ] {
            let written = TeamBody {
                failure_policy: Some(policy.clone()),
                ..team.clone()
            };
            let def =
                TeamDefinition::from_json("t", &serde_json::to_value(&written).unwrap()).unwrap();
            let read: TeamBody = serde_json::from_value(shown(&def)).unwrap();
            assert_eq!(read.failure_policy, Some(policy));
        }

        let skill = SkillBody {
            kind: Some(SkillKind::CodeExecution),
            executor: Some("shell_exec".into()),
            program: None,
            ..SkillBody::default()
        };
        let m = SkillManifest::from_json("s", &serde_json::to_value(&skill).unwrap()).unwrap();
        let _: SkillBody = serde_json::from_value(shown(&m)).unwrap();

        let profile = ProfileDef::parse(&json!({"extends": "workspace"}), "p").unwrap();
        let _: ProfileBody = serde_json::from_value(shown(&profile)).unwrap();
    }
}
