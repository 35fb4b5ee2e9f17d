//! The registry, sandboxes, provider, queues, blobs and model in memory.
//! The model is the scripted one, called in process (a `Fail` is a
//! retryable error, as its HTTP 500 would be; a `Sleep` is not slept).

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;

use armada_domain::agent::{AgentDefinition, ModelSpec};
use armada_domain::chat::{ChatMessage, ModelReply, ToolSpec};
use armada_domain::messages::{DispatchMessage, HarnessMessage};
use armada_domain::sandbox::hand::{CallMark, HandMessage};
use armada_domain::sandbox::lifecycle::{sandbox_key, SandboxRecord};
use armada_domain::sandbox::ProfileDef;
use armada_domain::scripted::{self, Scripted};
use armada_domain::skills::SkillManifest;
use armada_domain::team::TeamDefinition;

use super::{conflict, Memory};
use crate::adapters::ecs::started_by;
use crate::config::SandboxConfig;
use crate::error::StoreError;
use crate::ports::model::ModelError;
use crate::ports::provider::{TaskInfo, TaskRequest};
use crate::ports::{
    Blobs, Bounded, CallRef, Model, Provider, Queues, Registry, Sandboxes, StoredKey, StoredMark,
};
use armada_domain::sandbox::credentials::TaskCredentials;

fn call_key(call: &CallRef) -> String {
    format!("{}#{}#{}", call.run_id, call.call_id, call.attempt)
}

fn port_key(host: &str, port: u16) -> String {
    format!("{host}#{port}")
}

/// Uids live beside the ports (the memory state has no table of its own
/// for them): `uid#<tenant>#<agent>` → ("uid", uid), and the counter
/// `uid-counter` → ("uid", how many were taken). No port key starts so.
const UID_COUNTER: &str = "uid-counter";

fn uid_key(tenant: &str, agent: &str) -> String {
    format!("uid#{}", sandbox_key(tenant, agent))
}

#[async_trait]
impl Registry for Memory {
    async fn agent(&self, name: &str) -> Result<Option<AgentDefinition>, StoreError> {
        Ok(self.state().agents.get(name).map(|(d, _)| d.clone()))
    }

    async fn put_agent(&self, def: &AgentDefinition) -> Result<u64, StoreError> {
        let mut st = self.state();
        let version = st.agents.get(&def.name).map_or(1, |(_, v)| v + 1);
        st.agents.insert(def.name.clone(), (def.clone(), version));
        Ok(version)
    }

    async fn put_agent_if(&self, def: &AgentDefinition, version: u64) -> Result<u64, StoreError> {
        let mut st = self.state();
        match st.agents.get(&def.name) {
            Some((_, v)) if *v == version => {
                st.agents
                    .insert(def.name.clone(), (def.clone(), version + 1));
                Ok(version + 1)
            }
            _ => Err(StoreError::Conflict { which: None }),
        }
    }

    async fn list_agents(&self) -> Result<Vec<(AgentDefinition, u64)>, StoreError> {
        let mut all: Vec<_> = self.state().agents.values().cloned().collect();
        all.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        Ok(all)
    }

    async fn agent_version(
        &self,
        name: &str,
    ) -> Result<Option<(AgentDefinition, u64)>, StoreError> {
        Ok(self.state().agents.get(name).cloned())
    }

    async fn delete_agent(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.state().agents.remove(name).is_some())
    }

    async fn profiles(&self) -> Result<BTreeMap<String, ProfileDef>, StoreError> {
        Ok(self.state().profiles.clone())
    }

    async fn put_profile(&self, name: &str, def: &ProfileDef) -> Result<(), StoreError> {
        self.state().profiles.insert(name.to_string(), def.clone());
        Ok(())
    }

    async fn skill(&self, name: &str) -> Result<Option<SkillManifest>, StoreError> {
        Ok(self.state().skills.get(name).cloned())
    }

    async fn put_skill(&self, m: &SkillManifest) -> Result<(), StoreError> {
        self.state().skills.insert(m.name.clone(), m.clone());
        Ok(())
    }

    async fn list_skills(&self) -> Result<Vec<SkillManifest>, StoreError> {
        Ok(self.state().skills.values().cloned().collect())
    }

    async fn team(&self, name: &str) -> Result<Option<TeamDefinition>, StoreError> {
        Ok(self.state().teams.get(name).cloned())
    }

    async fn put_team(&self, def: &TeamDefinition) -> Result<(), StoreError> {
        self.state().teams.insert(def.name.clone(), def.clone());
        Ok(())
    }

    async fn list_teams(&self) -> Result<Vec<TeamDefinition>, StoreError> {
        Ok(self.state().teams.values().cloned().collect())
    }

    async fn delete_team(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.state().teams.remove(name).is_some())
    }

    async fn put_key(&self, key: &StoredKey, _now_ms: i64) -> Result<(), StoreError> {
        let mut st = self.state();
        if st.keys.contains_key(&key.key_id) {
            return Err(conflict(None));
        }
        st.keys.insert(key.key_id.clone(), key.clone());
        Ok(())
    }

    async fn key(&self, key_id: &str) -> Result<Option<StoredKey>, StoreError> {
        Ok(self.state().keys.get(key_id).cloned())
    }

    async fn callback_salt(&self, tenant: &str) -> Result<Option<String>, StoreError> {
        Ok(self.state().callback_salts.get(tenant).cloned())
    }

    async fn put_callback_salt(
        &self,
        tenant: &str,
        salt: &str,
        _now_ms: i64,
    ) -> Result<(), StoreError> {
        self.state()
            .callback_salts
            .insert(tenant.to_string(), salt.to_string());
        Ok(())
    }

    async fn revoke_key(&self, key_id: &str, _now_ms: i64) -> Result<(), StoreError> {
        match self.state().keys.get_mut(key_id) {
            Some(k) => {
                k.revoked = true;
                Ok(())
            }
            None => Err(conflict(None)),
        }
    }
}

#[async_trait]
impl Sandboxes for Memory {
    async fn get(&self, tenant: &str, agent: &str) -> Result<Option<SandboxRecord>, StoreError> {
        Ok(self
            .state()
            .sandboxes
            .get(&sandbox_key(tenant, agent))
            .cloned())
    }

    async fn list(&self, tenant: &str) -> Result<Vec<SandboxRecord>, StoreError> {
        let st = self.state();
        Ok(st
            .sandboxes
            .values()
            .filter(|r| r.tenant == tenant)
            .cloned()
            .collect())
    }

    async fn list_agent(&self, agent: &str) -> Result<Vec<SandboxRecord>, StoreError> {
        let st = self.state();
        Ok(st
            .sandboxes
            .values()
            .filter(|r| r.agent == agent)
            .cloned()
            .collect())
    }

    async fn put_if_version(
        &self,
        rec: &SandboxRecord,
        read_version: Option<u64>,
    ) -> Result<(), StoreError> {
        let mut st = self.state();
        let key = rec.key();
        if st.sandboxes.get(&key).map(|r| r.version) != read_version {
            return Err(conflict(None));
        }
        st.sandboxes.insert(key, rec.clone());
        Ok(())
    }

    async fn put_report_if_version(
        &self,
        rec: &SandboxRecord,
        read_version: u64,
    ) -> Result<(), StoreError> {
        let mut st = self.state();
        let key = rec.key();
        let Some(stored) = st.sandboxes.get(&key).filter(|r| r.version == read_version) else {
            return Err(conflict(None));
        };
        // Read back as the table's adapter reads it: the control half as
        // stored, the report as written.
        let control =
            serde_json::to_string(stored).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let report =
            serde_json::to_string(&rec.report()).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let next = SandboxRecord::from_parts(&key, &control, Some(&report), rec.version)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        st.sandboxes.insert(key, next);
        Ok(())
    }

    async fn delete(&self, rec: &SandboxRecord) -> Result<(), StoreError> {
        let mut st = self.state();
        let key = rec.key();
        if st.sandboxes.get(&key).map(|r| r.version) != Some(rec.version) {
            return Err(conflict(None));
        }
        st.sandboxes.remove(&key);
        Ok(())
    }

    async fn mark_first(
        &self,
        call: &CallRef,
        mark: CallMark,
        generation: u64,
        now_ms: i64,
    ) -> Result<Option<StoredMark>, StoreError> {
        let mut st = self.state();
        let key = call_key(call);
        if let Some(m) = st.marks.get(&key) {
            return Ok(Some(m.clone()));
        }
        let m = StoredMark {
            mark,
            generation,
            at_ms: now_ms,
        };
        st.marks.insert(key, m);
        Ok(None)
    }

    async fn mark_finished(&self, call: &CallRef, now_ms: i64) -> Result<(), StoreError> {
        let mut st = self.state();
        match st.marks.get_mut(&call_key(call)) {
            Some(m) if m.mark == CallMark::Started => {
                m.mark = CallMark::Finished;
                m.at_ms = now_ms;
                Ok(())
            }
            _ => Err(conflict(None)),
        }
    }

    async fn mark(&self, call: &CallRef) -> Result<Option<StoredMark>, StoreError> {
        Ok(self.state().marks.get(&call_key(call)).cloned())
    }

    async fn take_port(
        &self,
        host: &str,
        port: u16,
        holder: &str,
        generation: u64,
    ) -> Result<bool, StoreError> {
        let mut st = self.state();
        let key = port_key(host, port);
        if st.ports.get(&key).is_some_and(|(h, _)| h != holder) {
            return Ok(false);
        }
        st.ports.insert(key, (holder.to_string(), generation));
        Ok(true)
    }

    async fn release_port(&self, host: &str, port: u16, holder: &str) -> Result<(), StoreError> {
        let mut st = self.state();
        let key = port_key(host, port);
        if st.ports.get(&key).is_some_and(|(h, _)| h == holder) {
            st.ports.remove(&key);
        }
        Ok(())
    }

    async fn port_holder(&self, host: &str, port: u16) -> Result<Option<String>, StoreError> {
        let st = self.state();
        Ok(st.ports.get(&port_key(host, port)).map(|(h, _)| h.clone()))
    }

    async fn identity_uid(&self, tenant: &str, agent: &str) -> Result<u32, StoreError> {
        let mut st = self.state();
        let key = uid_key(tenant, agent);
        if let Some((_, uid)) = st.ports.get(&key) {
            return u32::try_from(*uid).map_err(|e| StoreError::Corrupt(e.to_string()));
        }
        let taken = st.ports.get(UID_COUNTER).map_or(0, |(_, n)| *n);
        let uid = u32::try_from(taken)
            .ok()
            .and_then(|i| crate::ports::FIRST_SANDBOX_UID.checked_add(i))
            .ok_or_else(|| StoreError::Corrupt(format!("uid counter at {taken}")))?;
        st.ports
            .insert(UID_COUNTER.to_string(), ("uid".to_string(), taken + 1));
        st.ports.insert(key, ("uid".to_string(), u64::from(uid)));
        Ok(uid)
    }
}

#[async_trait]
impl Provider for Memory {
    fn config(&self) -> &SandboxConfig {
        &self.cfg.sandbox
    }

    async fn hand_queue(
        &self,
        tenant: &str,
        agent: &str,
        generation: u64,
        _salt: &str,
    ) -> Result<String, StoreError> {
        Ok(format!("memory://hand/{tenant}/{agent}/g{generation}"))
    }

    async fn delete_hand_queue(&self, _url: &str) -> Result<(), StoreError> {
        Ok(())
    }

    async fn delete_bootstrap(
        &self,
        _tenant: &str,
        _agent: &str,
        _generation: u64,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    async fn send(&self, queue_url: &str, msg: &HandMessage) -> Result<(), StoreError> {
        self.state()
            .hands
            .push((queue_url.to_string(), msg.clone()));
        Ok(())
    }

    /// Issued only where the deployment names an identity role, as in AWS;
    /// every set has its own key id.
    async fn credentials(
        &self,
        tenant: &str,
        agent: &str,
        generation: u64,
        _hand_queue_url: &str,
    ) -> Result<Option<TaskCredentials>, StoreError> {
        if self.cfg.sandbox.identity_role_arn.is_none() {
            return Ok(None);
        }
        let mut st = self.state();
        let key = format!("ASIAMEMORY{}", st.credentials.len() + 1);
        st.credentials
            .push((tenant.into(), agent.into(), generation, key.clone()));
        Ok(Some(TaskCredentials {
            access_key_id: key,
            secret_access_key: "memory-secret".into(),
            session_token: "memory-token".into(),
            expires_at_ms: i64::MAX / 2,
        }))
    }

    async fn start(&self, req: &TaskRequest<'_>) -> Result<String, StoreError> {
        let mut st = self.state();
        if let Some(arn) = st.start_tokens.get(req.start_token) {
            return Ok(arn.clone());
        }
        let arn = format!("arn:memory:task/{}", st.tasks.len() + 1);
        st.start_tokens
            .insert(req.start_token.to_string(), arn.clone());
        let info = TaskInfo {
            arn: arn.clone(),
            last_status: "PROVISIONING".into(),
            desired_status: "RUNNING".into(),
            started_by: Some(started_by(req.tenant, req.agent)),
            tags: HashMap::new(),
            env: HashMap::new(),
            env_files: vec![],
            task_definition: "memory".into(),
        };
        st.tasks.insert(arn.clone(), info);
        Ok(arn)
    }

    async fn stop(&self, task_arn: &str, _reason: &str) -> Result<(), StoreError> {
        if let Some(t) = self.state().tasks.get_mut(task_arn) {
            t.desired_status = "STOPPED".into();
            t.last_status = "STOPPED".into();
        }
        Ok(())
    }

    async fn list(&self, started: Option<&str>) -> Result<Vec<String>, StoreError> {
        let st = self.state();
        Ok(st
            .tasks
            .values()
            .filter(|t| started.is_none_or(|s| t.started_by.as_deref() == Some(s)))
            .map(|t| t.arn.clone())
            .collect())
    }

    async fn describe(&self, arns: &[String]) -> Result<Vec<TaskInfo>, StoreError> {
        let st = self.state();
        Ok(arns
            .iter()
            .filter_map(|a| st.tasks.get(a).cloned())
            .collect())
    }
}

#[async_trait]
impl Queues for Memory {
    async fn send_dispatch_delayed(
        &self,
        msg: &DispatchMessage,
        delay_s: u32,
    ) -> Result<(), StoreError> {
        let mut st = self.state();
        if st.dispatch_failures > 0 {
            st.dispatch_failures -= 1;
            return Err(StoreError::Retryable("the queue is unreachable".into()));
        }
        st.dispatch.push((msg.clone(), delay_s));
        Ok(())
    }

    /// In memory the delivery queue is the dispatch queue: the same
    /// consumer takes both.
    async fn send_delivery(&self, msg: &DispatchMessage, delay_s: u32) -> Result<(), StoreError> {
        self.state().dispatch.push((msg.clone(), delay_s));
        Ok(())
    }

    async fn send_dead_letter(&self, msg: &DispatchMessage) -> Result<(), StoreError> {
        self.state().dead_letters.push(msg.clone());
        Ok(())
    }

    async fn send_harness(&self, msg: &HarnessMessage) -> Result<(), StoreError> {
        self.state().harness.push(msg.clone());
        Ok(())
    }

    async fn keep_hidden(&self, _queue_url: &str, _receipt_handle: &str, _seconds: u32) {}

    async fn back_off(
        &self,
        _queue_url: &str,
        _receipt_handle: &str,
        _receives: u32,
        _base_s: u32,
        _min_delay_s: u32,
    ) {
    }

    fn url_for_arn(&self, arn: &str) -> Option<String> {
        let name = crate::adapters::sqs::Queues::queue_name(arn);
        Some(format!("memory://{name}"))
    }

    fn is_dead_letter_queue(&self, name: &str) -> bool {
        name == self.cfg.dispatch_dlq || name == self.cfg.harness_dlq
    }

    fn harness_url(&self) -> String {
        format!("memory://{}", self.cfg.harness_queue)
    }

    fn dispatch_url(&self) -> String {
        format!("memory://{}", self.cfg.dispatch_queue)
    }
}

#[async_trait]
impl Blobs for Memory {
    async fn put_text(&self, key: &str, text: &str) -> Result<(), StoreError> {
        self.state().blobs.insert(key.to_string(), text.to_string());
        Ok(())
    }

    async fn get_text(&self, key: &str) -> Result<String, StoreError> {
        self.state()
            .blobs
            .get(key)
            .cloned()
            .ok_or_else(|| StoreError::Terminal(format!("NoSuchKey: {key}")))
    }

    async fn put_bytes(
        &self,
        key: &str,
        bytes: &[u8],
        _content_type: &str,
    ) -> Result<(), StoreError> {
        self.state().files.insert(key.to_string(), bytes.to_vec());
        Ok(())
    }

    async fn get_bytes_bounded(
        &self,
        key: &str,
        max: u64,
    ) -> Result<Result<Vec<u8>, u64>, StoreError> {
        let bytes = self
            .state()
            .files
            .get(key)
            .cloned()
            .ok_or_else(|| StoreError::Terminal(format!("NoSuchKey: {key}")))?;
        let len = bytes.len() as u64;
        Ok(if len > max { Err(len) } else { Ok(bytes) })
    }

    async fn copy_absent(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let mut state = self.state();
        if state.files.contains_key(to) {
            return Ok(());
        }
        let bytes = state
            .files
            .get(from)
            .cloned()
            .ok_or_else(|| StoreError::Terminal(format!("NoSuchKey: {from}")))?;
        state.files.insert(to.to_string(), bytes);
        Ok(())
    }

    async fn get_text_bounded(&self, key: &str, max: u64) -> Result<Bounded, StoreError> {
        let text = self.get_text(key).await?;
        let bytes = text.len() as u64;
        Ok(if bytes > max {
            Bounded::TooLarge { bytes }
        } else {
            Bounded::Text(text)
        })
    }
}

#[async_trait]
impl Model for Memory {
    async fn complete(
        &self,
        _spec: &ModelSpec,
        messages: &[ChatMessage],
        _tools: &[ToolSpec],
    ) -> Result<ModelReply, ModelError> {
        let mut answer = scripted::respond(messages);
        loop {
            match answer {
                Scripted::Reply(r) => return Ok(r),
                Scripted::Fail(text) => return Err(ModelError::Retryable(text)),
                Scripted::Sleep(_, rest) => answer = *rest,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::memory::test_config;
    use crate::ports::FIRST_SANDBOX_UID;

    #[tokio::test]
    async fn identities_get_uids_of_their_own_and_keep_them() {
        let m = Memory::new(test_config());
        let a = m.identity_uid("acme", "coder").await.unwrap();
        let b = m.identity_uid("globex", "coder").await.unwrap();
        let c = m.identity_uid("acme", "other").await.unwrap();
        assert_eq!(a, FIRST_SANDBOX_UID);
        assert_eq!((b, c), (FIRST_SANDBOX_UID + 1, FIRST_SANDBOX_UID + 2));
        // Asked again (a later generation): the same uid, nothing counted.
        assert_eq!(m.identity_uid("globex", "coder").await.unwrap(), b);
        assert_eq!(
            m.identity_uid("initech", "coder").await.unwrap(),
            FIRST_SANDBOX_UID + 3
        );
        // Ports of a host named like the counter are not mistaken for it.
        assert!(m.take_port("uid", 8081, "task", 1).await.unwrap());
        assert_eq!(
            m.identity_uid("umbrella", "coder").await.unwrap(),
            FIRST_SANDBOX_UID + 4
        );
    }
}
