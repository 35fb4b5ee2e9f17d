//! The sandbox agent: the one long-running process of a sandbox task.
//!
//! At start it gives the workspace a filesystem of the disk limit's size
//! (in a mount namespace of its own, where it may mount), checks its
//! mounts, applies its capability set to a probe call and measures what
//! took effect; a profile that cannot be enforced as frozen fails the
//! sandbox closed. Otherwise it reports READY with its
//! controls and then serves its hand queue, one call at a time:
//!
//! 1. the call is marked STARTED with a conditional write (a call runs at
//!    most once across duplicate deliveries and agent restarts; a call the
//!    control plane abandoned never starts);
//! 2. the skill runs in the jail;
//! 3. the outcome goes to the harness queue (to S3 if it is too large);
//! 4. the call is marked FINISHED and its message deleted.
//!
//! A call that was STARTED by an earlier incarnation of this agent (it
//! crashed mid-call) is answered `Lost`: its effect is unknown, and the
//! harness decides whether it may be repeated. After an OOM or a timeout
//! the agent reports the answer and then destroys its sandbox.
//!
//! Layout, by job: this file configures the agent and runs it; [`disk`]
//! gives the workspace a filesystem of the disk limit's size; [`probe`]
//! checks mounts and measures the capability set; [`serve`] serves the hand
//! queue; [`credentials`] holds and renews the task's own AWS credentials;
//! [`hibernate`] sleeps and wakes; [`ports`] grants and releases
//! pooled host ports; [`faults`] are the tests' injected faults (a cargo
//! feature that release builds never enable).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use armada_core::adapters::aws::AwsClients;
use armada_core::adapters::dynamo::sandboxes::{Change, SandboxStore};
use armada_core::ports::provider::task_env;
use armada_core::ports::SandboxReports as _;
use armada_domain::machine::Machine;
use armada_domain::sandbox::controls::Control;
use armada_domain::sandbox::hand::Invocation;
use armada_domain::sandbox::lifecycle::{SandboxEvent, SandboxRecord, SandboxState};
use armada_domain::sandbox::{CapabilitySet, Limits};
use armada_domain::skills::MountDecl;

use crate::cgroup::Cgroup;
use crate::env::SandboxEnv;
use crate::program::Program;
use crate::runner::Runner;
use crate::skills::PortGrant;

mod credentials;
pub mod disk;
mod faults;
mod hibernate;
mod mcp;
mod ports;
mod probe;
mod serve;
mod stage;

/// Outcomes larger than this go to the payload bucket (SQS takes 256 KiB).
const INLINE_OUTCOME_BYTES: usize = 200 * 1024;
/// Private targets the operator lets calls reach through their egress
/// proxy (comma-separated `host:port`, `host:*`).
pub const EGRESS_ALLOW_ENV: &str = "ARMADA_SANDBOX_EGRESS_ALLOW";

/// How a pooled port is exposed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortMode {
    /// Sandboxes share a host: container port 8081 is published as host
    /// port 39137, from a pool shared by every sandbox of `pool`.
    Host { pool: String, public_host: String },
    /// The task has its own address (Fargate awsvpc): the container port
    /// itself, from the task's own pool.
    Container { public_host: String },
}

/// Everything the agent is told by its task.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub tenant: String,
    pub agent: String,
    pub generation: u64,
    pub task_arn: String,
    pub hand_queue_url: String,
    pub harness_queue_url: String,
    pub sandboxes_table: String,
    pub payload_bucket: String,
    pub caps: CapabilitySet,
    pub limits: Limits,
    pub egress_ports: Vec<u16>,
    pub mounts: Vec<MountDecl>,
    pub user: Option<String>,
    pub idle_seconds: u32,
    pub resident: bool,
    pub heartbeat_seconds: u32,
    pub root: PathBuf,
    pub data_root: PathBuf,
    pub uid: u32,
    pub ports: PortMode,
    /// Long-poll wait of the hand queue.
    pub wait_seconds: i32,
    /// How an idle sandbox sleeps.
    pub hibernate: Hibernation,
    /// A saved workspace to restore before starting (a wake by snapshot).
    pub restore: Option<String>,
    /// This generation's key: it seals every answer, so the harness knows
    /// the answer came from here. The calls never see it (their
    /// environment is built from scratch; the agent's own is readable by
    /// root only).
    pub answer_key: String,
    /// The task's own AWS credentials, when the provider assumed the
    /// identity role for it.
    pub credentials: Option<armada_domain::sandbox::credentials::TaskCredentials>,
    /// Where new credentials are asked for.
    pub dispatch_queue_url: Option<String>,
    /// Ask for new credentials this long after receiving them instead of a
    /// third of their life (`ARMADA_SANDBOX_RENEW_AFTER_SECONDS`, tests).
    pub renew_after_ms: Option<i64>,
}

/// How an idle sandbox sleeps (`ARMADA_HIBERNATE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hibernation {
    /// It does not.
    Never,
    /// Its host freezes the task's processes and thaws them on a wake
    /// (the local data plane).
    Freeze,
    /// Its workspace goes to S3 and the task stops; a wake starts a new
    /// task that restores it (Fargate, which cannot pause a task).
    Snapshot,
}

impl AgentConfig {
    pub async fn from_env() -> Result<Self> {
        let vars: BTreeMap<String, String> = std::env::vars().collect();
        let get = |k: &str| -> Result<String> {
            vars.get(k)
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or_else(|| anyhow!("{k} is not set"))
        };
        let opt = |k: &str| vars.get(k).filter(|v| !v.is_empty()).cloned();
        let json = |k: &str| -> Result<Value> {
            serde_json::from_str(&get(k)?).with_context(|| format!("{k} is not JSON"))
        };
        let public_host = opt("ARMADA_PUBLIC_HOST").unwrap_or_else(|| "127.0.0.1".into());
        let ports = match opt("ARMADA_PORT_MODE").as_deref() {
            Some("host") => PortMode::Host {
                pool: opt("ARMADA_PORT_POOL").unwrap_or_else(|| "local".into()),
                public_host,
            },
            _ => PortMode::Container { public_host },
        };
        let task_arn = match opt("ARMADA_TASK_ARN") {
            Some(a) => a,
            None => task_arn_from_metadata().await?,
        };
        Ok(AgentConfig {
            tenant: get(task_env::TENANT)?,
            agent: get(task_env::AGENT)?,
            generation: get(task_env::GENERATION)?.parse()?,
            task_arn,
            hand_queue_url: get(task_env::HAND_QUEUE_URL)?,
            harness_queue_url: get(task_env::HARNESS_QUEUE_URL)?,
            sandboxes_table: get(task_env::SANDBOXES_TABLE)?,
            payload_bucket: get(task_env::PAYLOAD_BUCKET)?,
            caps: serde_json::from_value(json(task_env::CAPS)?)?,
            limits: serde_json::from_value(json(task_env::LIMITS)?)?,
            egress_ports: opt(task_env::EGRESS_PORTS)
                .unwrap_or_default()
                .split(',')
                .filter(|p| !p.is_empty())
                .map(str::parse)
                .collect::<Result<_, _>>()?,
            mounts: match opt(task_env::MOUNTS) {
                Some(m) => serde_json::from_str(&m)?,
                None => vec![],
            },
            user: opt(task_env::USER),
            idle_seconds: opt(task_env::IDLE_SECONDS)
                .map(|v| v.parse())
                .transpose()?
                .unwrap_or(900),
            resident: opt(task_env::RESIDENT).as_deref() == Some("true"),
            heartbeat_seconds: opt(task_env::HEARTBEAT_SECONDS)
                .map(|v| v.parse())
                .transpose()?
                .unwrap_or(10),
            root: PathBuf::from(opt("ARMADA_SANDBOX_ROOT").unwrap_or_else(|| "/sandbox".into())),
            data_root: PathBuf::from(opt("ARMADA_DATA_ROOT").unwrap_or_else(|| "/data".into())),
            uid: opt("ARMADA_SANDBOX_UID")
                .map(|v| v.parse())
                .transpose()?
                .unwrap_or(65_534),
            ports,
            wait_seconds: opt("ARMADA_HAND_WAIT_SECONDS")
                .map(|v| v.parse())
                .transpose()?
                .unwrap_or(20),
            hibernate: match opt("ARMADA_HIBERNATE_MODE").as_deref() {
                Some("freeze") => Hibernation::Freeze,
                Some("snapshot") => Hibernation::Snapshot,
                _ => Hibernation::Never,
            },
            restore: opt(task_env::RESTORE),
            answer_key: get(task_env::ANSWER_KEY)?,
            credentials: match opt(task_env::CREDENTIALS_EXPIRE_MS) {
                Some(expires) => Some(armada_domain::sandbox::credentials::TaskCredentials {
                    access_key_id: get(task_env::ACCESS_KEY_ID)?,
                    secret_access_key: get(task_env::SECRET_ACCESS_KEY)?,
                    session_token: get(task_env::SESSION_TOKEN)?,
                    expires_at_ms: expires.parse()?,
                }),
                None => None,
            },
            dispatch_queue_url: opt(task_env::DISPATCH_QUEUE_URL),
            renew_after_ms: opt("ARMADA_SANDBOX_RENEW_AFTER_SECONDS")
                .map(|v| v.parse::<i64>().map(|s| s * 1000))
                .transpose()?,
        })
    }

    fn key(&self) -> String {
        armada_domain::sandbox::lifecycle::sandbox_key(&self.tenant, &self.agent)
    }
}

/// On Fargate the task learns its own ARN from the task metadata endpoint.
async fn task_arn_from_metadata() -> Result<String> {
    let uri = std::env::var("ECS_CONTAINER_METADATA_URI_V4")
        .map_err(|_| anyhow!("neither ARMADA_TASK_ARN nor ECS_CONTAINER_METADATA_URI_V4 is set"))?;
    let v: Value = reqwest_get_json(&format!("{uri}/task")).await?;
    v.get("TaskARN")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| anyhow!("no TaskARN in the task metadata"))
}

async fn reqwest_get_json(url: &str) -> Result<Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("metadata URI is not http"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut s = tokio::net::TcpStream::connect(host).await?;
    s.write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    Ok(serde_json::from_str(body)?)
}

/// A call in progress, on disk, so a restarted agent can answer for it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Inflight {
    invocation: Invocation,
    receipt_handle: String,
}

/// Why the agent stopped serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// The sandbox failed closed or was destroyed; the task should stop.
    Destroyed(String),
    /// Asked to stop (SIGTERM).
    Stopped,
    /// Hibernated by snapshot: the task stops, the sandbox lives on.
    Hibernated,
}

pub struct Agent {
    cfg: AgentConfig,
    aws: AwsClients,
    store: SandboxStore,
    runner: Runner,
    /// Ports this sandbox holds: container port → grant.
    ports: BTreeMap<u16, PortGrant>,
    services: Vec<crate::runner::Detached>,
    /// Skills' MCP servers, kept across calls.
    mcp: mcp::McpChildren,
    /// What holds the workspace's size (set up when the agent runs).
    disk: Option<disk::Disk>,
    /// The task's own credentials, which every client signs with.
    held: Option<armada_core::adapters::aws::HeldCredentials>,
    /// When to ask for new credentials next.
    next_renewal_ms: Option<i64>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("sandbox", &self.cfg.key())
            .field("generation", &self.cfg.generation)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The sandbox's own cgroup, if calls can get groups of their own beneath it.
fn usable_cgroup() -> (Option<Cgroup>, Option<Cgroup>) {
    let Ok(own) = Cgroup::current() else {
        return (None, None);
    };
    let probe = format!("probe-{}", std::process::id());
    match own.child(&probe) {
        Ok(child) => {
            let _ = child.destroy();
            (Some(own.clone()), Some(own))
        }
        // Fargate: the task's limits are visible, but not delegated.
        Err(_) => (None, Some(own)),
    }
}

impl Agent {
    pub fn new(
        cfg: AgentConfig,
        aws: AwsClients,
        held: Option<armada_core::adapters::aws::HeldCredentials>,
        jail: Program,
    ) -> Self {
        let store = SandboxStore::new(aws.dynamo.clone(), &cfg.sandboxes_table);
        let (usable, _) = usable_cgroup();
        let env = SandboxEnv {
            root: cfg.root.clone(),
            uid: cfg.uid,
            gid: cfg.uid,
            caps: cfg.caps.clone(),
            limits: cfg.limits,
            egress_ports: cfg.egress_ports.clone(),
            egress_allow: std::env::var(EGRESS_ALLOW_ENV)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default(),
            data_root: cfg.data_root.clone(),
            cgroup: usable,
            mounts: cfg.mounts.clone(),
        };
        Agent {
            runner: Runner::new(env, jail),
            cfg,
            aws,
            store,
            ports: BTreeMap::new(),
            services: Vec::new(),
            mcp: mcp::McpChildren::new(),
            disk: None,
            held,
            next_renewal_ms: None,
        }
    }

    /// The agent's clients and credentials ([`credentials`]).
    pub async fn clients(
        cfg: &AgentConfig,
    ) -> (
        AwsClients,
        Option<armada_core::adapters::aws::HeldCredentials>,
    ) {
        credentials::clients(cfg).await
    }

    /// The workspace's disk, before any call or restore writes to it: in a
    /// mount namespace of the agent's own (entered by executing the agent
    /// again, [`disk::enter_own_mounts`]), a filesystem of the limit's size.
    /// An agent that may not mount (no CAP_SYS_ADMIN: Fargate) keeps the
    /// largest-file limit only, and reports it.
    async fn set_up_disk(&self) -> disk::Disk {
        let disk_mb = self.cfg.limits.disk_mb;
        if crate::sys::geteuid() != 0 {
            return disk::Disk::file_size_only(disk_mb, "the agent does not run as root");
        }
        if !disk::in_own_mounts() {
            tracing::info!("entering a mount namespace of the agent's own");
            let Err(why) = disk::enter_own_mounts();
            tracing::warn!(%why, "no mount namespace of its own: the workspace is not capped");
            return disk::Disk::file_size_only(disk_mb, why);
        }
        let env = self.runner.env.clone();
        let d = tokio::task::spawn_blocking(move || disk::setup(&env, disk::Prefer::Image))
            .await
            .unwrap_or_else(|e| disk::Disk::file_size_only(disk_mb, e.to_string()));
        match &d {
            disk::Disk::Quota(q) => {
                tracing::info!(backing = ?q.backing, fallback = ?q.fallback, disk_mb, "the workspace has a disk of its own")
            }
            disk::Disk::FileSizeOnly { why, .. } => {
                tracing::warn!(%why, "the workspace is not capped")
            }
        }
        d
    }

    /// The `disk` control.
    fn disk_control(&self) -> Control {
        match &self.disk {
            Some(d) => d.control(),
            None => {
                disk::Disk::file_size_only(self.cfg.limits.disk_mb, "no disk was set up").control()
            }
        }
    }

    fn inflight_path(&self) -> PathBuf {
        self.cfg.root.join("inflight.json")
    }

    /// Updates this generation's record; `f` returns false to leave it.
    async fn update(
        &self,
        mut f: impl FnMut(&mut SandboxRecord) -> bool + Send,
    ) -> Result<Option<SandboxRecord>> {
        let generation = self.cfg.generation;
        let out = self
            .store
            .modify_report(&self.cfg.tenant, &self.cfg.agent, |rec| match rec {
                Some(mut r) if r.generation == generation => {
                    if f(&mut r) {
                        let copy = r.clone();
                        Change::Write(Box::new(r), Some(copy))
                    } else {
                        Change::Keep(Some(r))
                    }
                }
                _ => Change::Keep(None),
            })
            .await?;
        Ok(out)
    }

    async fn fail_closed(&self, why: &str) -> Result<Exit> {
        tracing::error!(sandbox = %self.cfg.key(), why, "sandbox failed closed");
        let now = now_ms();
        self.update(|r| {
            let failed = SandboxEvent::Fail {
                generation: r.generation,
                why: why.to_string(),
            };
            r.apply(failed, now).is_ok()
        })
        .await?;
        Ok(Exit::Destroyed(why.to_string()))
    }

    /// Starts the sandbox and serves its hand queue until it must stop;
    /// then gives back its ports, and records a destroyed sandbox as stopped.
    /// The workspace's disk is set up first and, once the agent stops
    /// (not when it fails: the agent restarted after it keeps the disk),
    /// unmounted and removed.
    pub async fn run(mut self, stop: tokio::sync::watch::Receiver<bool>) -> Result<Exit> {
        self.disk = Some(self.set_up_disk().await);
        let exit = self.serve(stop).await;
        self.release_all().await;
        if let Ok(Exit::Destroyed(_)) = &exit {
            let (now, g) = (now_ms(), self.cfg.generation);
            let _ = self
                .update(|r| {
                    r.state() == SandboxState::Destroying
                        && r.apply(SandboxEvent::Stopped { generation: g }, now)
                            .is_ok()
                })
                .await;
        }
        if exit.is_ok() {
            if let Some(d) = self.disk.take() {
                if let Err(e) = tokio::task::spawn_blocking(move || d.release()).await {
                    tracing::warn!(error = %e, "could not release the workspace's disk");
                }
            }
        }
        exit
    }
}

/// Beats every `every` while this generation is the sandbox's; says why
/// when it is not any more (destroyed, or a new generation).
async fn heartbeat(
    store: SandboxStore,
    tenant: String,
    agent: String,
    generation: u64,
    every: Duration,
    held: Option<armada_core::adapters::aws::HeldCredentials>,
    gone: tokio::sync::watch::Sender<Option<String>>,
) {
    loop {
        tokio::time::sleep(every).await;
        let now = now_ms();
        let held_now = held.as_ref().map(|h| h.current().info());
        let r = store
            .modify_report(&tenant, &agent, |rec| match rec {
                Some(mut r) if r.generation == generation && !r.state().is_gone() => {
                    let beat = SandboxEvent::Heartbeat {
                        generation,
                        credentials: held_now.clone(),
                    };
                    let _ = r.apply(beat, now);
                    Change::Write(Box::new(r), None)
                }
                Some(r) if r.generation == generation => {
                    let state = r.state();
                    Change::Keep(Some(
                        r.failure
                            .unwrap_or_else(|| format!("the sandbox is {state}")),
                    ))
                }
                _ => Change::Keep(Some("the sandbox moved to a new generation".into())),
            })
            .await;
        match r {
            Ok(Some(why)) => {
                let _ = gone.send(Some(why));
                return;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "heartbeat not recorded"),
        }
    }
}

fn chown_tree(path: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for e in std::fs::read_dir(path)? {
            chown_tree(&e?.path(), uid)?;
        }
    }
    Ok(())
}

/// The task's root directory is the sandbox's (and goes with it).
pub fn remove_root(root: &Path) {
    if let Err(e) = std::fs::remove_dir_all(root) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(root = %root.display(), error = %e, "could not remove the sandbox directory");
        }
    }
}
