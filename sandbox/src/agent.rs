//! The sandbox agent: the one long-running process of a sandbox task.
//!
//! At start it checks its mounts, applies its capability set to a probe
//! call and measures what took effect; a profile that cannot be enforced as
//! frozen fails the sandbox closed. Otherwise it reports READY with its
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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use armada_core::aws::AwsClients;
use armada_core::hands::task_env;
use armada_core::store::sandboxes::{CallRef, Change, SandboxStore};
use armada_domain::messages::{HarnessMessage, ResultBody};
use armada_domain::sandbox::controls::{Control, Controls, Enforcement, Required};
use armada_domain::sandbox::hand::{codes, CallMark, CallOutcome, HandMessage, Invocation};
use armada_domain::sandbox::lifecycle::{PortLease, SandboxRecord, SandboxState};
use armada_domain::sandbox::{check_mount, host_port, CapabilitySet, Limits, CONTAINER_PORTS};
use armada_domain::skills::{MountDecl, SERVE};

use crate::cgroup::Cgroup;
use crate::entry::Program;
use crate::env::SandboxEnv;
use crate::jail::{Action, Step};
use crate::runner::{Call, Runner};
use crate::skills::{self, Aftermath, PortGrant};

/// Outcomes larger than this go to the payload bucket (SQS takes 256 KiB).
const INLINE_OUTCOME_BYTES: usize = 200 * 1024;

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
    pub fn new(cfg: AgentConfig, aws: AwsClients, jail: Program) -> Self {
        let store = SandboxStore::new(aws.dynamo.clone(), &cfg.sandboxes_table);
        let (usable, _) = usable_cgroup();
        let env = SandboxEnv {
            root: cfg.root.clone(),
            uid: cfg.uid,
            gid: cfg.uid,
            caps: cfg.caps.clone(),
            limits: cfg.limits,
            egress_ports: cfg.egress_ports.clone(),
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
        }
    }

    fn inflight_path(&self) -> PathBuf {
        self.cfg.root.join("inflight.json")
    }

    /// Updates this generation's record; `f` returns false to leave it.
    async fn update(
        &self,
        mut f: impl FnMut(&mut SandboxRecord) -> bool,
    ) -> Result<Option<SandboxRecord>> {
        let generation = self.cfg.generation;
        let out = self
            .store
            .modify(&self.cfg.tenant, &self.cfg.agent, |rec| match rec {
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
        self.update(|r| r.fail(r.generation, why, now).is_ok())
            .await?;
        Ok(Exit::Destroyed(why.to_string()))
    }

    /// Mounts are checked again here: registry data may have been edited
    /// past the API's validation.
    fn check_mounts(&self) -> Result<(), String> {
        let user = self.cfg.user.as_deref().unwrap_or_default();
        for m in &self.cfg.mounts {
            check_mount(&m.path, m.mode, user).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Applies the capability set to a probe call and reports per control
    /// what actually took effect.
    pub async fn measure(&self) -> Result<Controls> {
        self.runner
            .env
            .prepare()
            .context("preparing the sandbox directories")?;
        let probe = Call {
            action: Action::Exec {
                argv: vec!["/bin/true".into()],
            },
            run_id: "probe".into(),
            stdin: None,
            timeout: Duration::from_secs(30),
            bind_ports: vec![],
            env: vec![],
        };
        let run = self.runner.run(probe).await?;
        let _ = self.runner.env.drop_scratch("probe");
        let rep = &run.report;
        let caps = &self.cfg.caps;
        let step = |s: Step, what: &str| -> Control {
            Control {
                status: rep.status(s),
                reason: if rep.detail(s).is_empty() {
                    format!("{what}: not applied")
                } else {
                    rep.detail(s).to_string()
                },
            }
        };
        let off = || Control::not_enforced("profile off: the capability set is not applied");
        let filesystem = if !caps.enforce {
            off()
        } else {
            let mut c = step(Step::Filesystem, "landlock");
            if rep.status(Step::Uid) != Enforcement::Enforced && c.status == Enforcement::Enforced {
                c.status = Enforcement::Partial;
            }
            c.reason = format!("{}; {}", c.reason, rep.detail(Step::Uid));
            c
        };
        let network = if !caps.enforce {
            off()
        } else if caps.restrict_network {
            step(Step::Network, "network namespace")
        } else if rep.status(Step::Tcp) == Enforcement::Enforced {
            Control::partial(format!(
                "not restricted by the profile; {} (landlock); UDP and destinations are not filtered",
                rep.detail(Step::Tcp)
            ))
        } else {
            Control::not_enforced(
                "not restricted by the profile, and TCP ports could not be limited",
            )
        };
        let syscalls = if caps.enforce {
            step(Step::Syscalls, "seccomp")
        } else {
            off()
        };
        let mounts = if caps.enforce {
            step(Step::Mounts, "mount namespace")
        } else {
            off()
        };
        let (_, own) = usable_cgroup();
        let limit_control = |v: Option<String>, what: &str| match v {
            Some(d) => Control::enforced(d),
            None => Control::not_enforced(format!("no {what} limit is in force on the sandbox")),
        };
        let memory = limit_control(
            own.as_ref().and_then(Cgroup::memory_limit).map(|b| {
                format!(
                    "{} MB on the sandbox's cgroup; each call gets {} MB",
                    b / (1024 * 1024),
                    self.runner.env.call_memory_bytes() / (1024 * 1024)
                )
            }),
            "memory",
        );
        let cpu = limit_control(
            own.as_ref()
                .and_then(Cgroup::cpu_millis)
                .map(|m| format!("{m} millicores (CFS quota; throttled, not killed)")),
            "CPU",
        );
        let pids = limit_control(
            own.as_ref()
                .and_then(Cgroup::pids_max)
                .map(|n| format!("at most {n} processes")),
            "pid",
        );
        Ok(Controls {
            filesystem,
            network,
            syscalls,
            memory,
            cpu,
            pids,
            mounts,
        })
    }

    /// Starts the sandbox and serves its hand queue until it must stop;
    /// then gives back its ports, and records a destroyed sandbox as stopped.
    pub async fn run(mut self, stop: tokio::sync::watch::Receiver<bool>) -> Result<Exit> {
        let exit = self.serve(stop).await;
        self.release_all().await;
        if let Ok(Exit::Destroyed(_)) = &exit {
            let (now, g) = (now_ms(), self.cfg.generation);
            let _ = self
                .update(|r| r.state == SandboxState::Destroying && r.stopped(g, now).is_ok())
                .await;
        }
        exit
    }

    async fn serve(&mut self, mut stop: tokio::sync::watch::Receiver<bool>) -> Result<Exit> {
        if faults::stall_at_start(&self.cfg.agent) {
            // A task that never comes up (a hung image pull, say).
            let _ = stop.changed().await;
            return Ok(Exit::Stopped);
        }
        if let Err(why) = self.check_mounts() {
            return self.fail_closed(&format!("refused at start: {why}")).await;
        }
        if let Some(key) = self.cfg.restore.clone() {
            if let Err(e) = self.restore(&key).await {
                return self
                    .fail_closed(&format!(
                        "could not restore the workspace from {key}: {e:#}"
                    ))
                    .await;
            }
        }
        let controls = match self.measure().await {
            Ok(c) => c,
            Err(e) => return self.fail_closed(&format!("could not confine: {e:#}")).await,
        };
        let unmet = Required::of(&self.cfg.caps).unmet(&controls);
        if !unmet.is_empty() {
            return self
                .fail_closed(&format!(
                    "profile '{}' cannot be enforced here: {}",
                    self.cfg.caps.profile,
                    unmet.join("; ")
                ))
                .await;
        }
        let now = now_ms();
        let arn = self.cfg.task_arn.clone();
        let ready = self
            .update(|r| {
                r.agent_ready(r.generation, &arn, controls.clone(), now)
                    .is_ok()
            })
            .await?;
        match ready {
            Some(r) if r.state == SandboxState::Ready => {}
            other => {
                let why = format!(
                    "this task's generation {} is not the sandbox's ({:?})",
                    self.cfg.generation,
                    other.map(|r| (r.generation, r.state))
                );
                tracing::warn!(sandbox = %self.cfg.key(), %why, "stale sandbox task exits");
                return Ok(Exit::Destroyed(why));
            }
        }
        tracing::info!(sandbox = %self.cfg.key(), generation = self.cfg.generation, "sandbox ready");
        self.recover_inflight().await?;
        // The heartbeat goes on during calls too: a long call is not a dead
        // sandbox. It also notices the sandbox being destroyed meanwhile.
        let (gone_tx, mut gone) = tokio::sync::watch::channel(None::<String>);
        let beat = tokio::spawn(heartbeat(
            self.store.clone(),
            self.cfg.tenant.clone(),
            self.cfg.agent.clone(),
            self.cfg.generation,
            Duration::from_secs(u64::from(self.cfg.heartbeat_seconds)),
            gone_tx,
        ));
        let exit = self.serve_queue(&mut stop, &mut gone).await;
        beat.abort();
        exit
    }

    async fn serve_queue(
        &mut self,
        stop: &mut tokio::sync::watch::Receiver<bool>,
        gone: &mut tokio::sync::watch::Receiver<Option<String>>,
    ) -> Result<Exit> {
        let idle = Duration::from_secs(u64::from(self.cfg.idle_seconds));
        // Look for calls often enough to notice idleness in time.
        let wait = self.cfg.wait_seconds.min(
            i32::try_from(self.cfg.idle_seconds / 2)
                .unwrap_or(i32::MAX)
                .max(1),
        );
        let mut last_active = Instant::now();
        loop {
            if let Some(why) = gone.borrow().clone() {
                return Ok(Exit::Destroyed(why));
            }
            if self.may_hibernate() && last_active.elapsed() >= idle {
                if let Some(exit) = self.hibernate(idle).await? {
                    return Ok(exit);
                }
                last_active = Instant::now();
            }
            let receive = self
                .aws
                .sqs
                .receive_message()
                .queue_url(&self.cfg.hand_queue_url)
                .max_number_of_messages(1)
                .wait_time_seconds(wait)
                .send();
            let out = tokio::select! {
                r = receive => r,
                _ = stop.changed() => return Ok(Exit::Stopped),
            };
            let msgs = match out {
                Ok(o) => o.messages.unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "hand queue receive failed");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            for m in msgs {
                let receipt = m.receipt_handle().unwrap_or_default().to_string();
                let msg: HandMessage = match serde_json::from_str(m.body().unwrap_or_default()) {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::error!(error = %e, "malformed hand message dropped");
                        self.delete(&receipt).await;
                        continue;
                    }
                };
                match msg {
                    HandMessage::EndRun { run_id, .. } => {
                        let cleaned = self.runner.env.drop_scratch(&run_id);
                        self.delete(&receipt).await;
                        if let Err(e) = cleaned {
                            // A Run's files could not be removed: the next
                            // Run would see them. The sandbox goes instead.
                            let why =
                                format!("force-destroyed: cleanup after run {run_id} failed: {e}");
                            let now = now_ms();
                            self.update(|r| r.destroy(&why, now)).await?;
                            self.shutdown_services();
                            return Ok(Exit::Destroyed(why));
                        }
                    }
                    HandMessage::Invoke(inv) => {
                        if let Some(exit) = self.invoke(inv, &receipt).await? {
                            self.shutdown_services();
                            return Ok(exit);
                        }
                        last_active = Instant::now();
                    }
                }
            }
        }
    }

    /// Resident sandboxes stay warm; one serving a dev server stays up.
    fn may_hibernate(&self) -> bool {
        self.cfg.hibernate != Hibernation::Never && !self.cfg.resident && self.services.is_empty()
    }

    /// Idle and held by nobody: go to sleep. Frozen by the host, or saved
    /// to S3 with the task stopping (`Some(Exit::Hibernated)`).
    async fn hibernate(&self, idle: Duration) -> Result<Option<Exit>> {
        let (now, g) = (now_ms(), self.cfg.generation);
        let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
        let r = self
            .update(|r| r.hibernate(g, idle_ms, now).is_ok())
            .await?;
        if !r.is_some_and(|r| r.state == SandboxState::Hibernating) {
            return Ok(None);
        }
        tracing::info!(sandbox = %self.cfg.key(), mode = ?self.cfg.hibernate, "idle: hibernating");
        if self.cfg.hibernate != Hibernation::Snapshot {
            return Ok(None);
        }
        let key = self.snapshot().await?;
        let now = now_ms();
        let after = self
            .update(|r| match r.state {
                SandboxState::Hibernating => r.snapshotted(g, &key, now).is_ok(),
                // A Run asked for it meanwhile: stay up.
                SandboxState::Waking => r.woke(g, now).is_ok(),
                _ => false,
            })
            .await?;
        Ok(match after.map(|r| r.state) {
            Some(SandboxState::Hibernated) => Some(Exit::Hibernated),
            _ => None,
        })
    }

    fn snapshot_key(&self) -> String {
        format!(
            "sandboxes/{}/{}/g{}/workspace.tar.gz",
            self.cfg.tenant, self.cfg.agent, self.cfg.generation
        )
    }

    /// Saves the workspace and home to the payload bucket.
    async fn snapshot(&self) -> Result<String> {
        let file = self.cfg.root.join("snapshot.tar.gz");
        let status = tokio::process::Command::new("tar")
            .arg("-C")
            .arg(&self.cfg.root)
            .args(["-czf"])
            .arg(&file)
            .args(["workspace", "home"])
            .status()
            .await
            .context("running tar")?;
        if !status.success() {
            anyhow::bail!("tar failed: {status}");
        }
        let key = self.snapshot_key();
        let body = aws_sdk_s3::primitives::ByteStream::from_path(&file)
            .await
            .context("reading the snapshot")?;
        self.aws
            .s3
            .put_object()
            .bucket(&self.cfg.payload_bucket)
            .key(&key)
            .body(body)
            .send()
            .await
            .context("storing the snapshot")?;
        let _ = std::fs::remove_file(&file);
        Ok(key)
    }

    /// Restores a saved workspace and home, owned by this sandbox's uid.
    async fn restore(&self, key: &str) -> Result<()> {
        self.runner.env.prepare()?;
        let out = self
            .aws
            .s3
            .get_object()
            .bucket(&self.cfg.payload_bucket)
            .key(key)
            .send()
            .await
            .context("fetching the snapshot")?;
        let bytes = out.body.collect().await?.into_bytes();
        let file = self.cfg.root.join("restore.tar.gz");
        std::fs::write(&file, &bytes)?;
        let status = tokio::process::Command::new("tar")
            .arg("-C")
            .arg(&self.cfg.root)
            .arg("-xzf")
            .arg(&file)
            .status()
            .await
            .context("running tar")?;
        let _ = std::fs::remove_file(&file);
        if !status.success() {
            anyhow::bail!("tar failed: {status}");
        }
        // The new task has a uid of its own.
        for d in [self.runner.env.workspace(), self.runner.env.home()] {
            chown_tree(&d, self.cfg.uid)?;
        }
        tracing::info!(sandbox = %self.cfg.key(), key, "workspace restored");
        Ok(())
    }

    async fn delete(&self, receipt: &str) {
        if let Err(e) = self
            .aws
            .sqs
            .delete_message()
            .queue_url(&self.cfg.hand_queue_url)
            .receipt_handle(receipt)
            .send()
            .await
        {
            tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "could not delete a hand message; it will come back");
        }
    }

    /// A restarted agent answers for the call its predecessor died in.
    async fn recover_inflight(&self) -> Result<()> {
        let Ok(text) = std::fs::read_to_string(self.inflight_path()) else {
            return Ok(());
        };
        let Ok(inflight) = serde_json::from_str::<Inflight>(&text) else {
            let _ = std::fs::remove_file(self.inflight_path());
            return Ok(());
        };
        let inv = inflight.invocation;
        tracing::warn!(run_id = %inv.run_id, call_id = %inv.call_id, "answering for a call the previous agent died in");
        self.answer(
            &inv,
            CallOutcome::Lost {
                reason: "the sandbox agent crashed during the call".into(),
            },
        )
        .await?;
        self.delete(&inflight.receipt_handle).await;
        let _ = std::fs::remove_file(self.inflight_path());
        Ok(())
    }

    /// Sends an outcome to the harness queue.
    async fn answer(&self, inv: &Invocation, outcome: CallOutcome) -> Result<()> {
        let inline = serde_json::to_string(&outcome)?;
        let body = if inline.len() > INLINE_OUTCOME_BYTES {
            let key = format!(
                "sandboxes/{}/{}/{}-{}.json",
                inv.tenant, inv.run_id, inv.call_id, inv.attempt
            );
            self.aws
                .s3
                .put_object()
                .bucket(&self.cfg.payload_bucket)
                .key(&key)
                .content_type("application/json")
                .body(inline.into_bytes().into())
                .send()
                .await
                .context("storing a large outcome")?;
            ResultBody::Stored { key }
        } else {
            ResultBody::Inline { outcome }
        };
        let msg = HarnessMessage::ToolResult {
            run_id: inv.run_id.clone(),
            tenant: inv.tenant.clone(),
            step: inv.step,
            call_id: inv.call_id.clone(),
            attempt: inv.attempt,
            body,
        };
        self.aws
            .sqs
            .send_message()
            .queue_url(&self.cfg.harness_queue_url)
            .message_body(serde_json::to_string(&msg)?)
            .message_group_id(&inv.run_id)
            .message_deduplication_id(msg.dedup_id())
            .send()
            .await
            .context("sending an outcome to the harness queue")?;
        Ok(())
    }

    /// Handles one call; `Some(exit)` when the sandbox must stop after it.
    async fn invoke(&mut self, inv: Invocation, receipt: &str) -> Result<Option<Exit>> {
        let span = tracing::info_span!("call", run_id = %inv.run_id, call_id = %inv.call_id, skill = %inv.skill);
        let _g = span.enter();
        if inv.tenant != self.cfg.tenant || inv.agent != self.cfg.agent {
            // Seed 000 §E: a sandbox serving another identity is destroyed
            // at once, and the event is recorded.
            let why = format!(
                "security: sandbox of {}#{} was sent a call of {}#{}",
                self.cfg.tenant, self.cfg.agent, inv.tenant, inv.agent
            );
            tracing::error!(security = true, %why, "cross-identity call refused; destroying the sandbox");
            self.answer(
                &inv,
                CallOutcome::NotRun {
                    code: armada_domain::sandbox::hand::SECURITY_VIOLATION.into(),
                    message: why.clone(),
                },
            )
            .await?;
            self.delete(receipt).await;
            let now = now_ms();
            self.update(|r| r.destroy(&why, now)).await?;
            return Ok(Some(Exit::Destroyed(why)));
        }
        let call = CallRef {
            run_id: inv.run_id.clone(),
            call_id: inv.call_id.clone(),
            attempt: inv.attempt,
        };
        let prior = self
            .store
            .mark_first(&call, CallMark::Started, self.cfg.generation, now_ms())
            .await?;
        match prior.map(|m| m.mark) {
            None => {}
            Some(CallMark::Started) => {
                // Started by an agent that died before answering.
                self.answer(
                    &inv,
                    CallOutcome::Lost {
                        reason: "the call was started by a sandbox that died before answering"
                            .into(),
                    },
                )
                .await?;
                self.delete(receipt).await;
                return Ok(None);
            }
            Some(CallMark::Finished) | Some(CallMark::Abandoned) => {
                // Answered already, or given up on by the control plane.
                self.delete(receipt).await;
                return Ok(None);
            }
        }
        let inflight = Inflight {
            invocation: inv.clone(),
            receipt_handle: receipt.to_string(),
        };
        std::fs::write(self.inflight_path(), serde_json::to_vec(&inflight)?)?;
        faults::panic_on(&inv);
        let answer = if inv.skill == SERVE {
            self.serve_call(&inv).await
        } else {
            skills::invoke(
                &self.runner,
                &inv.skill,
                &inv.args,
                &inv.run_id,
                inv.timeout_s,
            )
            .await
        };
        self.answer(
            &inv,
            CallOutcome::Finished {
                result: answer.result.clone(),
            },
        )
        .await?;
        if let Err(e) = self.store.mark_finished(&call, now_ms()).await {
            tracing::warn!(error = %e, "could not mark the call finished");
        }
        self.delete(receipt).await;
        let _ = std::fs::remove_file(self.inflight_path());
        let now = now_ms();
        let g = self.cfg.generation;
        let ports: Vec<PortLease> = self
            .ports
            .values()
            .map(|p| PortLease {
                container: p.container,
                host: p.bind,
            })
            .collect();
        self.update(|r| {
            r.ports = ports.clone();
            r.touch(g, now).is_ok()
        })
        .await?;
        if answer.aftermath == Aftermath::Destroy {
            let code = answer.result["error"]["code"].as_str().unwrap_or("error");
            let why = format!("force-destroyed after {code} in call {}", inv.call_id);
            self.update(|r| r.destroy(&why, now)).await?;
            return Ok(Some(Exit::Destroyed(why)));
        }
        Ok(None)
    }

    /// Grants a pooled port (waiting while the pool is full: the call
    /// queues), then starts the server on it.
    async fn serve_call(&mut self, inv: &Invocation) -> crate::skills::SkillAnswer {
        let wanted = match inv.args.get("port") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().and_then(|p| u16::try_from(p).ok()) {
                Some(p) if CONTAINER_PORTS.contains(&p) => Some(p),
                _ => {
                    return crate::skills::SkillAnswer {
                        result: armada_domain::sandbox::hand::error_json(
                            codes::INVALID_ARGS,
                            "'port' must be a container port from 8081 to 8090",
                        ),
                        aftermath: Aftermath::Keep,
                    }
                }
            },
        };
        let grant = match self.grant_port(wanted, inv.timeout_s).await {
            Ok(g) => g,
            Err(e) => {
                return crate::skills::SkillAnswer {
                    result: e,
                    aftermath: Aftermath::Keep,
                }
            }
        };
        match skills::serve(&self.runner, &inv.args, &inv.run_id, &grant, inv.timeout_s).await {
            Ok((answer, detached)) => {
                self.services.push(detached);
                answer
            }
            Err(answer) => {
                self.release_port(grant.container).await;
                answer
            }
        }
    }

    fn pool(&self) -> String {
        match &self.cfg.ports {
            PortMode::Host { pool, .. } => pool.clone(),
            PortMode::Container { .. } => self.cfg.task_arn.clone(),
        }
    }

    async fn grant_port(
        &mut self,
        wanted: Option<u16>,
        timeout_s: u32,
    ) -> Result<PortGrant, Value> {
        if let Some(p) = wanted.and_then(|w| self.ports.get(&w)) {
            // Ours already: a server on it is replaced.
            return Ok(p.clone());
        }
        let deadline = Instant::now() + Duration::from_secs(u64::from(timeout_s));
        // Ports are held by the task, so its host can free them when it stops.
        let holder = self.cfg.task_arn.clone();
        let pool = self.pool();
        loop {
            let candidates: Vec<u16> = match wanted {
                Some(w) => vec![w],
                None => CONTAINER_PORTS
                    .clone()
                    .filter(|p| !self.ports.contains_key(p))
                    .collect(),
            };
            for c in candidates {
                let (bind, url) = match &self.cfg.ports {
                    PortMode::Host { public_host, .. } => {
                        let h = host_port(c).unwrap_or(c);
                        // A shared host: a port something else listens on
                        // is not in the pool, whatever the registry says.
                        if std::net::TcpListener::bind(("0.0.0.0", h)).is_err() {
                            continue;
                        }
                        (h, format!("http://{public_host}:{h}"))
                    }
                    PortMode::Container { public_host } => (c, format!("http://{public_host}:{c}")),
                };
                match self
                    .store
                    .take_port(&pool, bind, &holder, self.cfg.generation)
                    .await
                {
                    Ok(true) => {
                        let g = PortGrant {
                            container: c,
                            bind,
                            url,
                        };
                        self.ports.insert(c, g.clone());
                        return Ok(g);
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!(error = %e, "port registry unavailable"),
                }
            }
            if Instant::now() >= deadline {
                return Err(armada_domain::sandbox::hand::error_json(
                    "PORTS_EXHAUSTED",
                    format!("no pooled port became free within {timeout_s} s"),
                ));
            }
            // The pool is full: the call waits its turn (seed 000 §D).
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn release_port(&mut self, container: u16) {
        if let Some(g) = self.ports.remove(&container) {
            let _ = self
                .store
                .release_port(&self.pool(), g.bind, &self.cfg.task_arn)
                .await;
        }
    }

    fn shutdown_services(&mut self) {
        for s in self.services.drain(..) {
            if let Some(cg) = s.cgroup {
                let _ = cg.destroy();
            }
        }
    }

    /// Gives back what the sandbox holds outside itself (ports).
    pub async fn release_all(&mut self) {
        self.shutdown_services();
        let held: Vec<u16> = self.ports.keys().copied().collect();
        for c in held {
            self.release_port(c).await;
        }
    }
}

/// Faults the tests inject through the task's environment (the local data
/// plane passes them on): never set in a deployment.
mod faults {
    use super::Invocation;

    /// `ARMADA_TEST_STALL_AGENT=<agent>`: that agent's sandbox never starts.
    pub fn stall_at_start(agent: &str) -> bool {
        std::env::var("ARMADA_TEST_STALL_AGENT").is_ok_and(|a| a == agent)
    }

    /// `ARMADA_TEST_PANIC_ON=<marker>`: the agent panics in a call whose
    /// arguments contain the marker.
    pub fn panic_on(inv: &Invocation) {
        if let Ok(marker) = std::env::var("ARMADA_TEST_PANIC_ON") {
            if !marker.is_empty() && inv.args.to_string().contains(&marker) {
                panic!("injected panic in call {}", inv.call_id);
            }
        }
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
    gone: tokio::sync::watch::Sender<Option<String>>,
) {
    loop {
        tokio::time::sleep(every).await;
        let now = now_ms();
        let r = store
            .modify(&tenant, &agent, |rec| match rec {
                Some(mut r) if r.generation == generation && !r.state.is_gone() => {
                    let _ = r.heartbeat(generation, now);
                    Change::Write(Box::new(r), None)
                }
                Some(r) if r.generation == generation => Change::Keep(Some(
                    r.failure
                        .unwrap_or_else(|| format!("the sandbox is {}", r.state)),
                )),
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
