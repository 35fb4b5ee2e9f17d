//! The sandbox provider: tasks, hand queues, and what a task is
//! started with (its tags and environment, read by the sandbox agent).

use std::collections::HashMap;
use std::fmt::Debug;

use async_trait::async_trait;

use armada_domain::agent::SandboxSpec;
use armada_domain::sandbox::credentials::TaskCredentials;
use armada_domain::sandbox::hand::HandMessage;
use armada_domain::sandbox::CapabilitySet;

use crate::config::SandboxConfig;
use crate::error::StoreError;

/// The tags a sandbox task carries: its identity, where ECS shows it.
pub const TAG_TENANT: &str = "armada:tenant";
pub const TAG_AGENT: &str = "armada:agent";
pub const TAG_GENERATION: &str = "armada:generation";

/// The environment a sandbox task starts with (set by the provider as it
/// starts the task): the contract between it and the sandbox agent,
/// which reads it.
pub mod task_env {
    pub const TENANT: &str = "ARMADA_SANDBOX_TENANT";
    pub const AGENT: &str = "ARMADA_SANDBOX_AGENT";
    pub const GENERATION: &str = "ARMADA_SANDBOX_GENERATION";
    pub const HAND_QUEUE_URL: &str = "ARMADA_HAND_QUEUE_URL";
    pub const HARNESS_QUEUE_URL: &str = "ARMADA_HARNESS_QUEUE_URL";
    pub const SANDBOXES_TABLE: &str = "ARMADA_SANDBOXES_TABLE";
    pub const PAYLOAD_BUCKET: &str = "ARMADA_PAYLOAD_BUCKET";
    pub const CAPS: &str = "ARMADA_SANDBOX_CAPS";
    pub const LIMITS: &str = "ARMADA_SANDBOX_LIMITS";
    pub const EGRESS_PORTS: &str = "ARMADA_SANDBOX_EGRESS_PORTS";
    pub const MOUNTS: &str = "ARMADA_SANDBOX_MOUNTS";
    pub const USER: &str = "ARMADA_SANDBOX_USER";
    pub const IDLE_SECONDS: &str = "ARMADA_SANDBOX_IDLE_SECONDS";
    pub const RESIDENT: &str = "ARMADA_SANDBOX_RESIDENT";
    pub const HEARTBEAT_SECONDS: &str = "ARMADA_SANDBOX_HEARTBEAT_SECONDS";
    /// A saved workspace to restore before starting (a wake by snapshot).
    pub const RESTORE: &str = "ARMADA_SANDBOX_RESTORE";
    /// The generation's own key, sealing its answers
    /// (`armada_domain::sandbox::seal`); the agent removes it from its
    /// environment as it starts.
    pub const ANSWER_KEY: &str = "ARMADA_SANDBOX_ANSWER_KEY";
    /// `isolated` when the task's security groups allow no egress (the
    /// profile restricts the network), else `open`.
    pub const TASK_NETWORK: &str = "ARMADA_SANDBOX_TASK_NETWORK";
    /// Where the agent asks for new credentials.
    pub const DISPATCH_QUEUE_URL: &str = "ARMADA_DISPATCH_QUEUE_URL";
    /// The task's own credentials (the SDK's names) and when they expire.
    pub const ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
    pub const SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
    pub const SESSION_TOKEN: &str = "AWS_SESSION_TOKEN";
    pub const CREDENTIALS_EXPIRE_MS: &str = "ARMADA_SANDBOX_CREDENTIALS_EXPIRE_MS";
    /// Variables whose values are secrets (never logged or shown).
    pub const SECRETS: [&str; 3] = [ANSWER_KEY, SECRET_ACCESS_KEY, SESSION_TOKEN];
    /// Variables handed over in the generation's bootstrap file, never in
    /// the task's overrides (see [`bootstrap_key`](crate::adapters::ecs::bootstrap_key)):
    /// the secrets, and what changes with each set of credentials, so a
    /// retried start's overrides are the first try's.
    pub const BOOTSTRAP: [&str; 5] = [
        ANSWER_KEY,
        ACCESS_KEY_ID,
        SECRET_ACCESS_KEY,
        SESSION_TOKEN,
        CREDENTIALS_EXPIRE_MS,
    ];
}

/// What the provider needs to start a generation's task.
#[derive(Debug, Clone)]
pub struct TaskRequest<'a> {
    pub tenant: &'a str,
    pub agent: &'a str,
    pub generation: u64,
    pub hand_queue_url: &'a str,
    /// The sandbox record's salt (see [`answer_key`](armada_domain::sandbox::seal::answer_key)).
    pub salt: &'a str,
    pub caps: &'a CapabilitySet,
    pub spec: &'a SandboxSpec,
    /// The workspace snapshot to restore (waking a hibernated sandbox).
    pub restore: Option<&'a str>,
    /// Names this start: a start asked again under the same token is the
    /// one task already started, not a second
    /// ([`start_token`](armada_domain::sandbox::lifecycle::SandboxRecord::start_token)).
    pub start_token: &'a str,
}

/// A task as ECS describes it.
#[derive(Clone, PartialEq)]
pub struct TaskInfo {
    pub arn: String,
    pub last_status: String,
    pub desired_status: String,
    pub started_by: Option<String>,
    pub tags: HashMap<String, String>,
    /// The sandbox container's environment overrides.
    pub env: HashMap<String, String>,
    /// The environment files its overrides name (S3 object ARNs).
    pub env_files: Vec<String>,
    pub task_definition: String,
}

impl std::fmt::Debug for TaskInfo {
    // Its environment holds the task's secrets: only their names are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env: std::collections::BTreeMap<&str, &str> = self
            .env
            .iter()
            .map(|(k, v)| {
                let shown = if task_env::SECRETS.contains(&k.as_str()) {
                    "<secret>"
                } else {
                    v.as_str()
                };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("TaskInfo")
            .field("arn", &self.arn)
            .field("last_status", &self.last_status)
            .field("desired_status", &self.desired_status)
            .field("started_by", &self.started_by)
            .field("tags", &self.tags)
            .field("env", &env)
            .field("task_definition", &self.task_definition)
            .finish()
    }
}

impl TaskInfo {
    pub fn is_running(&self) -> bool {
        self.last_status == "RUNNING" && self.desired_status == "RUNNING"
    }
    pub fn is_stopped(&self) -> bool {
        self.desired_status == "STOPPED" || self.last_status == "STOPPED"
    }
}

/// The sandbox provider: hand queues and the tasks sandboxes run in.
#[async_trait]
pub trait Provider: Send + Sync + Debug {
    fn config(&self) -> &SandboxConfig;
    /// The hand queue of a generation (created if missing); its URL.
    async fn hand_queue(
        &self,
        tenant: &str,
        agent: &str,
        generation: u64,
        salt: &str,
    ) -> Result<String, StoreError>;
    async fn delete_hand_queue(&self, url: &str) -> Result<(), StoreError>;
    /// Deletes a generation's bootstrap files (its secrets, handed to its
    /// task as an environment file), once the sandbox is gone.
    async fn delete_bootstrap(
        &self,
        tenant: &str,
        agent: &str,
        generation: u64,
    ) -> Result<(), StoreError>;
    async fn send(&self, queue_url: &str, msg: &HandMessage) -> Result<(), StoreError>;
    /// Starts a generation's task; returns its ARN.
    async fn start(&self, req: &TaskRequest<'_>) -> Result<String, StoreError>;
    /// Credentials of a generation's own, narrowed to its identity
    /// (`None` where the deployment names no identity role).
    async fn credentials(
        &self,
        tenant: &str,
        agent: &str,
        generation: u64,
        hand_queue_url: &str,
    ) -> Result<Option<TaskCredentials>, StoreError>;
    async fn stop(&self, task_arn: &str, reason: &str) -> Result<(), StoreError>;
    /// Task ARNs, of one identity's tasks when `started` is given.
    async fn list(&self, started: Option<&str>) -> Result<Vec<String>, StoreError>;
    async fn describe(&self, arns: &[String]) -> Result<Vec<TaskInfo>, StoreError>;
}
