//! Definitions (agents, skills, teams, profiles) and API keys.

use std::collections::BTreeMap;
use std::fmt::Debug;

use async_trait::async_trait;

use armada_domain::agent::AgentDefinition;
use armada_domain::api::KeyRole;
use armada_domain::fields::FieldError;
use armada_domain::sandbox::ProfileDef;
use armada_domain::skills::SkillManifest;
use armada_domain::team::TeamDefinition;

use crate::error::StoreError;

/// An API key as stored: the secret's SHA-256 only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    pub key_id: String,
    pub tenant: String,
    pub secret_sha256: String,
    pub revoked: bool,
    pub role: KeyRole,
    /// The address of the person the key is theirs (given when it was
    /// minted): four eyes hold across keys and approval links alike.
    pub owner: Option<String>,
}

/// Agents, skills, profiles and API keys.
#[async_trait]
pub trait Registry: Send + Sync + Debug {
    async fn agent(&self, name: &str) -> Result<Option<AgentDefinition>, StoreError>;
    /// Creates or replaces an agent; returns its new version.
    async fn put_agent(&self, def: &AgentDefinition) -> Result<u64, StoreError>;
    /// Replaces an agent only while its stored version is `version` (a
    /// `PUT` with `If-Match`): `Conflict` when it changed since, or is gone.
    async fn put_agent_if(&self, def: &AgentDefinition, version: u64) -> Result<u64, StoreError>;
    async fn list_agents(&self) -> Result<Vec<(AgentDefinition, u64)>, StoreError>;
    async fn agent_version(&self, name: &str)
        -> Result<Option<(AgentDefinition, u64)>, StoreError>;
    /// `false` when there was no such agent.
    async fn delete_agent(&self, name: &str) -> Result<bool, StoreError>;
    async fn profiles(&self) -> Result<BTreeMap<String, ProfileDef>, StoreError>;
    async fn put_profile(&self, name: &str, def: &ProfileDef) -> Result<(), StoreError>;
    async fn skill(&self, name: &str) -> Result<Option<SkillManifest>, StoreError>;
    async fn put_skill(&self, m: &SkillManifest) -> Result<(), StoreError>;
    async fn list_skills(&self) -> Result<Vec<SkillManifest>, StoreError>;
    async fn team(&self, name: &str) -> Result<Option<TeamDefinition>, StoreError>;
    /// Creates or replaces a team.
    async fn put_team(&self, def: &TeamDefinition) -> Result<(), StoreError>;
    async fn list_teams(&self) -> Result<Vec<TeamDefinition>, StoreError>;
    /// `false` when there was no such team.
    async fn delete_team(&self, name: &str) -> Result<bool, StoreError>;
    async fn put_key(&self, key: &StoredKey, now_ms: i64) -> Result<(), StoreError>;
    async fn key(&self, key_id: &str) -> Result<Option<StoredKey>, StoreError>;
    async fn revoke_key(&self, key_id: &str, now_ms: i64) -> Result<(), StoreError>;
    /// The salt of a tenant's callback signing secret (`None` until it was
    /// first rotated).
    async fn callback_salt(&self, tenant: &str) -> Result<Option<String>, StoreError>;
    async fn put_callback_salt(
        &self,
        tenant: &str,
        salt: &str,
        now_ms: i64,
    ) -> Result<(), StoreError>;

    /// Freezes the manifests of a definition's skills: the registry's own
    /// manifest where there is one, else the built-in.
    async fn resolve_manifests(
        &self,
        def: &mut AgentDefinition,
    ) -> Result<Result<(), FieldError>, StoreError> {
        let mut found = std::collections::HashMap::new();
        for s in &def.skills {
            if let Some(m) = self.skill(s).await? {
                found.insert(s.clone(), m);
            }
        }
        Ok(def.resolve_manifests(|s| found.get(s).cloned()))
    }
}
