//! The registry (admin writes): agents, teams, skills, sandbox profiles.
//!
//! Definitions are the domain's (`AgentDefinition`, `TeamDefinition`,
//! `SkillManifest`, `ProfileDef`), validated field by field when written;
//! here they are JSON objects with what the API adds beside them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use crate::definitions::{AgentBody, ProfileBody, SkillBody, TeamBody};

/// An agent's definition (as `PUT` takes it) and its version. A tenant's
/// key does not see the operator's fields (model endpoint and key
/// variable, chat webhook, approvers' addresses). What `GET` answers can
/// be `PUT` back as it is: `name`, `version`, `manifests` and
/// `shadowed_profiles` are read-only and ignored when written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentView {
    pub name: String,
    pub version: u64,
    /// Global profiles that override this agent's project profiles of the
    /// same name (reported by `PUT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadowed_profiles: Option<Vec<String>>,
    /// The definition's fields, as `PUT` takes them.
    #[serde(flatten)]
    #[schema(value_type = AgentBody)]
    pub definition: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentList {
    pub agents: Vec<AgentView>,
}

/// `200` to an agent's deletion: every sandbox it had went with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AgentDeleted {
    pub agent: String,
    pub deleted: bool,
    /// The tenants whose sandbox of the agent was destroyed.
    pub sandboxes_destroyed: Vec<String>,
}

/// A team's definition (`members`, `strategy`, ...), as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TeamView {
    pub name: String,
    /// The definition's fields, as `PUT` takes them.
    #[serde(flatten)]
    #[schema(value_type = TeamBody)]
    pub definition: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TeamList {
    pub teams: Vec<TeamView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TeamDeleted {
    pub team: String,
    pub deleted: bool,
}

/// A skill's manifest (built in, or the registry's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SkillView {
    pub name: String,
    /// The manifest's fields, as `PUT` takes them.
    #[serde(flatten)]
    #[schema(value_type = SkillBody)]
    pub manifest: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SkillList {
    pub skills: Vec<SkillView>,
}

/// The global sandbox profiles, by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProfileList {
    #[schema(value_type = BTreeMap<String, ProfileBody>)]
    pub profiles: BTreeMap<String, Value>,
}

/// `200` to a profile's definition: as written, and as it resolves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProfilePut {
    pub name: String,
    #[schema(value_type = ProfileBody)]
    pub profile: Value,
    #[schema(value_type = Object)]
    pub resolved: Value,
}

/// `PUT /v1/agents/{name}` and `POST /v1/agents/{name}/refresh-tools`:
/// whose secrets open the MCP servers' headers while their tools are
/// listed (agents are every tenant's; secrets are one tenant's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListToolsAs {
    /// The tenant whose secrets the servers' headers name (required when
    /// a header names one).
    pub tenant: Option<String>,
}
