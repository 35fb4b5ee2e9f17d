//! The local sandbox data plane: what Fargate does for a sandbox task, done
//! on this machine. It watches the emulator's ECS tasks; each RUNNING task
//! gets a directory, its identity's unprivileged uid (unique, from the
//! sandboxes table), its tenant's own `/data` and a cgroup with the task's
//! memory, CPU and pid limits, and its `armada-sandbox agent` runs there as
//! a local process, every call of which is denied the repository (and its
//! `.armada/` keys) and the other tenants' data. A task stopped through the ECS API (StopTask) has its
//! processes killed and its files removed; an agent that exits on its own
//! (its sandbox destroyed) gets its task stopped, as Fargate stops a task
//! whose essential container exits. The control plane's code path —
//! RunTask, StopTask, DescribeTasks — is the one that runs in AWS.
//!
//! In `fargate` mode ([`DataPlaneMode`]) the agent is started as Fargate
//! starts a task's container instead ([`fargate`]): what a profile gets on
//! Fargate is then what the tests measure.

mod binds;
mod fargate;
mod host;

pub use fargate::DataPlaneMode;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::sync::watch;

use armada_core::adapters::dynamo::sandboxes::{Change, SandboxStore};
use armada_core::adapters::ecs::SandboxProvider;
use armada_core::error::StoreError;
use armada_core::ports::provider::{task_env, TaskInfo};
use armada_core::ports::{Provider as _, Sandboxes as _, SandboxesExt as _};
use armada_domain::machine::Machine;
use armada_domain::sandbox::lifecycle::{SandboxAction, SandboxEvent, SandboxRecord, SandboxState};
use armada_domain::sandbox::{host_port, Limits, CONTAINER_PORTS};
use armada_sandbox::cgroup::Cgroup;
use armada_sandbox::env::HOST_DENY_ENV;
use armada_sandbox::fargate::{TASK_SPEC_ENV, TASK_SPEC_ON_STDIN};
use armada_sandbox::program::Program;

/// Processes a sandbox may have at once.
const PIDS_MAX: u32 = 512;

#[derive(Debug, Clone)]
pub struct DataPlaneOptions {
    /// Where sandbox directories live (traversable by unprivileged uids).
    pub root: PathBuf,
    /// The sandbox program the agents run ([`sandbox_program`]).
    pub agent: Program,
    pub endpoint: String,
    pub region: String,
    /// Added to every agent's environment (tests: fault injection, waits).
    pub extra_env: Vec<(String, String)>,
    pub poll: Duration,
    /// Whether tasks run as local processes or as Fargate would run them.
    pub mode: DataPlaneMode,
}

impl DataPlaneOptions {
    /// Whether idle sandboxes are frozen here (the default) rather than
    /// saved and stopped as on Fargate (`ARMADA_HIBERNATE_MODE=snapshot`).
    fn freezes(&self) -> bool {
        !self
            .extra_env
            .iter()
            .any(|(k, v)| k == "ARMADA_HIBERNATE_MODE" && v != "freeze")
    }
}

struct LocalTask {
    child: tokio::process::Child,
    cgroup: Option<Cgroup>,
    dir: PathBuf,
    tenant: String,
    agent: String,
    generation: u64,
    frozen: bool,
    /// The v2 group judging its binds, when made for it ([`binds`]).
    bind_group: Option<PathBuf>,
}

/// The agents' processes the data plane runs, by task ARN: what
/// `armada chaos`'s `sandbox-kill` kills (an agent dying on its own, as a
/// container crashing would end its Fargate task).
#[derive(Debug, Clone, Default)]
pub struct AgentPids(Arc<std::sync::Mutex<BTreeMap<String, u32>>>);

impl AgentPids {
    /// The running agents: (task ARN, pid).
    pub fn list(&self) -> Vec<(String, u32)> {
        self.0
            .lock()
            .map(|m| m.iter().map(|(a, p)| (a.clone(), *p)).collect())
            .unwrap_or_default()
    }

    fn set(&self, arn: &str, pid: Option<u32>) {
        if let Ok(mut m) = self.0.lock() {
            match pid {
                Some(p) => m.insert(arn.to_string(), p),
                None => m.remove(arn),
            };
        }
    }
}

pub struct DataPlane {
    /// Its agents' pids, shared with whoever asked ([`DataPlane::agents`]).
    pids: AgentPids,
    provider: SandboxProvider,
    store: SandboxStore,
    opts: DataPlaneOptions,
    parent: Option<Cgroup>,
    tasks: HashMap<String, LocalTask>,
    /// Tasks seen stopped: the emulator keeps listing them; never look again.
    done: HashSet<String>,
    /// What every sandbox is denied ([`host::denied_paths`]), as the
    /// agents read it ([`HOST_DENY_ENV`]).
    denied: String,
    ticks: u64,
    /// The stack's name (its groups are named after it).
    stack: String,
}

impl std::fmt::Debug for DataPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPlane")
            .field("root", &self.opts.root)
            .field("tasks", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

/// `armada sandbox agent|exec`: the sandbox program inside the `armada`
/// binary, so `armada up` runs sandboxes from the build it was started
/// from (no second build, no stale agent).
pub const SANDBOX_SUBCOMMAND: &str = "sandbox";

/// How the local data plane starts a sandbox agent: the running `armada`
/// binary's `sandbox` subcommand; from a test binary (which has no such
/// subcommand), the workspace's `armada-sandbox` built beside it (cargo
/// builds every binary of the workspace for its tests).
pub fn sandbox_program() -> Result<Program> {
    let exe = std::env::current_exe()?;
    let parent = exe.parent().unwrap_or(Path::new("/"));
    if parent.ends_with("deps") {
        let beside = parent.parent().unwrap_or(parent).join("armada-sandbox");
        if !beside.is_file() {
            bail!(
                "{} is missing: build the workspace (cargo test --workspace builds it)",
                beside.display()
            );
        }
        return Ok(Program::new(beside, &[]));
    }
    Ok(Program::new(exe, &[SANDBOX_SUBCOMMAND]))
}

/// Applies a lifecycle step to a task's sandbox record (if it applies).
async fn record<E: std::fmt::Display + Send>(
    store: &SandboxStore,
    t: &LocalTask,
    mut step: impl FnMut(&mut SandboxRecord) -> Result<Vec<SandboxAction>, E> + Send,
) -> Result<(), armada_core::error::StoreError> {
    store
        .modify(&t.tenant, &t.agent, |cur| match cur {
            Some(mut r) => match step(&mut r) {
                Ok(_) => Change::Write(Box::new(r), ()),
                Err(e) => {
                    tracing::error!(sandbox = %r.key(), error = %e, "illegal sandbox transition refused");
                    Change::Keep(())
                }
            },
            None => Change::Keep(()),
        })
        .await
}

/// The tenant and agent a task's sandbox belongs to, as its environment
/// says; a task without them is not started.
fn identity(info: &TaskInfo) -> Result<(&str, &str)> {
    let get = |k: &str| {
        info.env
            .get(k)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
            .with_context(|| format!("the task has no {k}"))
    };
    let (tenant, agent) = (get(task_env::TENANT)?, get(task_env::AGENT)?);
    if !armada_domain::names::valid_tenant(tenant) {
        bail!("the task's tenant {tenant:?} is not a tenant id");
    }
    Ok((tenant, agent))
}

fn task_id(arn: &str) -> String {
    arn.rsplit('/').next().unwrap_or(arn).to_string()
}

impl DataPlane {
    pub fn new(
        provider: SandboxProvider,
        store: SandboxStore,
        opts: DataPlaneOptions,
        stack: &str,
    ) -> Self {
        let parent = Cgroup::current()
            .and_then(|c| {
                // Left over from an earlier run of this stack: its processes go.
                let group = c.child(&format!("armada-{stack}"))?;
                group.kill_all()?;
                Ok(group)
            })
            .map_err(|e| tracing::warn!(error = %e, "no cgroup for sandboxes: their limits will not be enforced"))
            .ok();
        binds::clear_leftovers(stack);
        DataPlane {
            pids: AgentPids::default(),
            provider,
            store,
            opts,
            parent,
            tasks: HashMap::new(),
            done: HashSet::new(),
            denied: "[]".into(),
            ticks: 0,
            stack: stack.to_string(),
        }
    }

    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        if let Err(e) = std::fs::create_dir_all(&self.opts.root) {
            tracing::error!(error = %e, "cannot create the sandbox root");
        }
        let denied = host::denied_paths(
            &host::repositories(),
            &host::data_base(&self.opts.root),
            std::slice::from_ref(&self.opts.root),
        );
        tracing::info!(?denied, "hidden from every sandbox");
        self.denied = serde_json::to_string(&denied).unwrap_or_else(|_| "[]".into());
        loop {
            if let Err(e) = self.tick().await {
                tracing::debug!(error = %format!("{e:#}"), "data plane tick failed");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.opts.poll) => {}
                _ = shutdown.changed() => break,
            }
        }
        let arns: Vec<String> = self.tasks.keys().cloned().collect();
        for arn in arns {
            self.kill(&arn).await;
        }
        if let Some(p) = &self.parent {
            let _ = p.destroy();
        }
        // The stack's own directory, once its tasks took theirs with them:
        // left behind, every later stack's tasks would hide it, one by one.
        let _ = std::fs::remove_dir(&self.opts.root);
    }

    /// Its agents' pids, as it starts and ends them.
    pub fn agents(&self) -> AgentPids {
        self.pids.clone()
    }

    async fn tick(&mut self) -> Result<()> {
        self.ticks += 1;
        // Frozen tasks are looked at every tick (a Run waits for them to
        // wake), running ones every fifth (idleness is not urgent).
        if self.opts.freezes() {
            self.hibernation(self.ticks.is_multiple_of(5)).await;
        }
        let listed = self.provider.list(None).await?;
        let fresh: Vec<String> = listed
            .iter()
            .filter(|a| !self.done.contains(*a))
            .cloned()
            .collect();
        let infos = self.provider.describe(&fresh).await?;
        let seen: HashSet<&str> = infos.iter().map(|t| t.arn.as_str()).collect();
        // Tasks the emulator forgot (an emulator restart): nothing runs them.
        let vanished: Vec<String> = self
            .tasks
            .keys()
            .filter(|a| !seen.contains(a.as_str()))
            .cloned()
            .collect();
        for arn in vanished {
            self.kill(&arn).await;
        }
        for info in infos {
            if info.is_stopped() {
                if self.tasks.contains_key(&info.arn) {
                    tracing::info!(task = %info.arn, "task stopped: killing its sandbox");
                    self.kill(&info.arn).await;
                }
                self.done.insert(info.arn);
            } else if info.is_running() && !self.tasks.contains_key(&info.arn) {
                // As ECS does when it starts a task, the host fetches the
                // environment files the task's overrides name (its
                // generation's secrets) and gives the agent the lot.
                let info = match self.provider.task_environment(&info).await {
                    Ok(env) => TaskInfo { env, ..info },
                    Err(e) if e.is_retryable() => {
                        tracing::debug!(task = %info.arn, error = %e, "a sandbox task's environment is not readable yet");
                        continue;
                    }
                    Err(e) => {
                        tracing::error!(task = %info.arn, error = %e, "a sandbox task's environment files cannot be read");
                        info
                    }
                };
                let started = match self.identity_uid(&info).await {
                    Ok(uid) => self.start(&info, uid),
                    // The table is briefly unreachable: the next tick tries again.
                    Err(e) if e.downcast_ref().is_some_and(StoreError::is_retryable) => {
                        tracing::debug!(task = %info.arn, error = %format!("{e:#}"), "no uid for a sandbox task yet");
                        continue;
                    }
                    Err(e) => Err(e),
                };
                if let Err(e) = started {
                    tracing::error!(task = %info.arn, error = %format!("{e:#}"), "could not start a sandbox task");
                    if let Err(e) = self
                        .provider
                        .stop(&info.arn, &format!("the host could not start it: {e}"))
                        .await
                    {
                        tracing::warn!(task = %info.arn, error = %e, "could not mark an unstartable task stopped");
                    }
                }
            }
        }
        // An agent that exited ends its task.
        let exited: Vec<String> = self
            .tasks
            .iter_mut()
            .filter_map(|(arn, t)| match t.child.try_wait() {
                Ok(Some(_)) => Some(arn.clone()),
                _ => None,
            })
            .collect();
        for arn in exited {
            tracing::info!(task = %arn, "sandbox agent exited: stopping its task");
            self.kill(&arn).await;
            self.provider
                .stop(&arn, "Essential container in task exited")
                .await?;
            self.done.insert(arn);
        }
        Ok(())
    }

    /// The uid of the task's identity: its own, whatever other tenants'
    /// tasks are called ([`armada_core::ports::Sandboxes::identity_uid`]).
    async fn identity_uid(&self, info: &TaskInfo) -> Result<u32> {
        let (tenant, agent) = identity(info)?;
        Ok(self.store.identity_uid(tenant, agent).await?)
    }

    fn start(&mut self, info: &TaskInfo, uid: u32) -> Result<()> {
        let id = task_id(&info.arn);
        let (tenant, _) = identity(info)?;
        // The tenant's own `/data`: another tenant's users are not in it.
        let data_root = host::tenant_data(&host::data_base(&self.opts.root), tenant)?;
        let dir = self.opts.root.join(&id);
        std::fs::create_dir_all(&dir)?;
        let limits: Limits = info
            .env
            .get(task_env::LIMITS)
            .map(|l| serde_json::from_str(l))
            .transpose()?
            .unwrap_or_default();
        let cgroup = match &self.parent {
            Some(p) => {
                let cg = p.child(&id)?;
                cg.set_memory_limit(u64::from(limits.memory_mb) * 1024 * 1024)?;
                if let Err(e) = cg.set_cpu_millis(limits.cpu_millis) {
                    tracing::warn!(error = %e, "no CPU quota for the sandbox");
                }
                cg.set_pids_max(PIDS_MAX)?;
                Some(cg)
            }
            None => None,
        };
        let log = std::fs::File::create(dir.join("agent.log"))?;
        let mut cmd = self.opts.agent.command(self.opts.mode.entry());
        cmd.env_clear()
            .envs(info.env.iter())
            .env("ARMADA_SANDBOX_ROOT", dir.join("sandbox"))
            .env("ARMADA_DATA_ROOT", &data_root)
            .env(HOST_DENY_ENV, &self.denied)
            .env("ARMADA_SANDBOX_UID", uid.to_string())
            .env("ARMADA_PORT_MODE", "host")
            .env("ARMADA_PORT_POOL", "local")
            .env("ARMADA_HIBERNATE_MODE", "freeze")
            .env("ARMADA_TASK_ARN", &info.arn)
            .env("AWS_ENDPOINT_URL", &self.opts.endpoint)
            .env("AWS_REGION", &self.opts.region)
            .env(
                "RUST_LOG",
                std::env::var("ARMADA_SANDBOX_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(self.opts.extra_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        // The task's own credentials, when the provider gave it some (as
        // Fargate would hand them over); the emulator's dummy ones otherwise.
        if !info.env.contains_key(task_env::ACCESS_KEY_ID) {
            cmd.env(task_env::ACCESS_KEY_ID, "test")
                .env(task_env::SECRET_ACCESS_KEY, "test");
        }
        // The task's spec goes to the launcher on its standard input: what
        // it hides grows with the host's other stacks and tasks, past what
        // one environment variable may hold (128 KiB).
        let mut spec_text = None;
        if self.opts.mode == DataPlaneMode::Fargate {
            let spec =
                fargate::task_spec(info, &self.opts.root, &dir, &data_root, &self.opts.endpoint)?;
            // The host's paths are not in the task at all: nothing to deny.
            cmd.env(TASK_SPEC_ENV, TASK_SPEC_ON_STDIN)
                .env(HOST_DENY_ENV, "[]")
                .stdin(Stdio::piped());
            spec_text = Some(serde_json::to_string(&spec)?);
        }
        let bind_group = match binds::guard(&self.stack, &id, cgroup.as_ref()) {
            Ok(g) => g,
            Err(why) => {
                tracing::warn!(task = %info.arn, %why, "what this sandbox serves is not held to loopback");
                None
            }
        };
        let mut joins = cgroup.as_ref().map(Cgroup::join_files).unwrap_or_default();
        joins.extend(bind_group.iter().map(|g| g.join("cgroup.procs")));
        if !joins.is_empty() {
            armada_sandbox::sys::join_cgroups_before_exec(&mut cmd, &joins)?;
        }
        // Should this process die without stopping its tasks, they go too.
        armada_sandbox::sys::die_with_parent(&mut cmd);
        let mut child = cmd.spawn().context("starting armada-sandbox agent")?;
        if let (Some(text), Some(mut stdin)) = (spec_text, child.stdin.take()) {
            // Written beside the start (a pipe holds 64 KiB; the launcher
            // reads it all before anything else), then closed: the end.
            let arn = info.arn.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                if let Err(e) = stdin.write_all(text.as_bytes()).await {
                    tracing::error!(task = %arn, error = %e, "the task's spec was not handed over");
                }
            });
        }
        tracing::info!(task = %info.arn, pid = child.id(), "sandbox task running locally");
        self.pids.set(&info.arn, child.id());
        self.tasks.insert(
            info.arn.clone(),
            LocalTask {
                child,
                cgroup,
                dir,
                tenant: info.env.get(task_env::TENANT).cloned().unwrap_or_default(),
                agent: info.env.get(task_env::AGENT).cloned().unwrap_or_default(),
                generation: info
                    .env
                    .get(task_env::GENERATION)
                    .and_then(|g| g.parse().ok())
                    .unwrap_or(0),
                frozen: false,
                bind_group,
            },
        );
        Ok(())
    }

    /// Freezes the processes of tasks whose sandbox is hibernating, and
    /// thaws those whose sandbox a Run asked for (seed 000 §C: pause and
    /// resume, state intact).
    async fn hibernation(&mut self, running_too: bool) {
        let now = self.store_now();
        for t in self.tasks.values_mut() {
            let Some(cg) = &t.cgroup else { continue };
            if !t.frozen && !running_too {
                continue;
            }
            let rec = match self.store.get(&t.tenant, &t.agent).await {
                Ok(Some(r)) if r.generation == t.generation => r,
                _ => continue,
            };
            let g = t.generation;
            match (rec.state(), t.frozen) {
                (SandboxState::Hibernating, false) => {
                    let cg = cg.clone();
                    if matches!(
                        tokio::task::spawn_blocking(move || cg.freeze()).await,
                        Ok(Ok(()))
                    ) {
                        t.frozen = true;
                        let r = record(&self.store, t, |r| {
                            r.apply(SandboxEvent::Hibernated { generation: g }, now)
                        })
                        .await;
                        if let Err(e) = r {
                            tracing::warn!(error = %e, "could not record a hibernation");
                        }
                        tracing::info!(sandbox = %rec.key(), "sandbox hibernated: its processes are frozen");
                    }
                }
                (SandboxState::Waking, _) => {
                    if t.frozen && cg.thaw().is_err() {
                        continue;
                    }
                    t.frozen = false;
                    let woke = record(&self.store, t, |r| {
                        r.apply(SandboxEvent::Woke { generation: g }, now)
                    });
                    if let Err(e) = woke.await {
                        tracing::warn!(sandbox = %rec.key(), error = %e, "could not record a wake");
                    }
                    tracing::info!(sandbox = %rec.key(), "sandbox woke");
                }
                _ => {}
            }
        }
    }

    fn store_now(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }

    /// Kills a task's processes, frees its ports and removes its files.
    async fn kill(&mut self, arn: &str) {
        let Some(mut t) = self.tasks.remove(arn) else {
            return;
        };
        self.pids.set(arn, None);
        match t.cgroup.take() {
            Some(cg) => {
                let _ = tokio::task::spawn_blocking(move || cg.destroy()).await;
            }
            None => {
                let _ = t.child.start_kill();
            }
        }
        let _ = t.child.wait().await;
        if let Some(g) = &t.bind_group {
            binds::release(g);
        }
        for c in CONTAINER_PORTS {
            if let Some(h) = host_port(c) {
                if let Err(e) = self.store.release_port("local", h, arn).await {
                    tracing::warn!(task = arn, port = h, error = %e, "could not give a host port back");
                }
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&t.dir) {
            tracing::warn!(dir = %t.dir.display(), error = %e, "could not remove a sandbox's files");
        }
    }
}
