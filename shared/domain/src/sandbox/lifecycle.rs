//! One sandbox per agent identity (tenant + agent; a team is one identity),
//! as a record and its transitions (seed 000 §C–E). The store applies each
//! transition to the record it read and writes it back conditional on the
//! record's version, so two Runs racing to create one agent's sandbox create
//! one, and a Run waiting for the sandbox is handed it exactly once.
//!
//! ```text
//!  (none) ─acquire─► PROVISIONING ─agent ready─► READY ─idle─► HIBERNATING ─► HIBERNATED
//!                       │  ▲ start timeout,           │   ▲                         │
//!                       │  └─ retry once              │   └──── woke ◄── WAKING ◄───┘ acquire
//!                       ▼                             ▼
//!                     FAILED                     DESTROYING ─► DESTROYED   (acquire again: a new generation)
//! ```
//!
//! The holder is a Run: the sandbox serves one Run at a time, from its first
//! sandbox call to its end (a Run awaiting approval keeps it). Other Runs of
//! the identity queue as waiters and are handed the sandbox in order.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::controls::Controls;

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SandboxState {
    /// A task was asked for; its agent has not reported in yet.
    Provisioning,
    /// The agent reported in with the controls it enforces.
    Ready,
    /// Idle and being put to sleep (processes frozen / workspace saved).
    Hibernating,
    Hibernated,
    /// Asked for while asleep: being brought back.
    Waking,
    /// Being stopped (agent deleted, OOM, timeout, panic, security).
    Destroying,
    Destroyed,
    /// Could not start, or could not enforce its profile (fail closed).
    Failed,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Provisioning => "PROVISIONING",
            SandboxState::Ready => "READY",
            SandboxState::Hibernating => "HIBERNATING",
            SandboxState::Hibernated => "HIBERNATED",
            SandboxState::Waking => "WAKING",
            SandboxState::Destroying => "DESTROYING",
            SandboxState::Destroyed => "DESTROYED",
            SandboxState::Failed => "FAILED",
        }
    }

    /// Gone: the next acquire starts a new generation.
    pub fn is_gone(self) -> bool {
        match self {
            SandboxState::Destroying | SandboxState::Destroyed | SandboxState::Failed => true,
            SandboxState::Provisioning
            | SandboxState::Ready
            | SandboxState::Hibernating
            | SandboxState::Hibernated
            | SandboxState::Waking => false,
        }
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pooled port held by a sandbox (`serve`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortLease {
    pub container: u16,
    pub host: u16,
}

/// The credentials a sandbox holds, as its record shows them (no secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialsInfo {
    pub access_key_id: String,
    pub expires_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub tenant: String,
    pub agent: String,
    /// Changed only by its machine ([`SandboxRecord::apply`]).
    state: SandboxState,
    /// Incremented by every (re)creation; a task, its hand queue and its
    /// calls belong to one generation.
    pub generation: u64,
    /// Every write is conditional on the version it read.
    pub version: u64,
    pub task_arn: Option<String>,
    pub hand_queue_url: Option<String>,
    pub holder_run_id: Option<String>,
    /// Runs waiting for the sandbox, first come first served.
    pub waiters: Vec<String>,
    pub ports: Vec<PortLease>,
    pub profile: String,
    /// What the agent inside reported in force.
    pub controls: Option<Controls>,
    pub created_at_ms: i64,
    pub last_used_at_ms: i64,
    pub heartbeat_at_ms: i64,
    pub state_changed_at_ms: i64,
    /// Task starts of this generation (a start that times out is retried once).
    pub start_attempts: u32,
    /// Why the sandbox failed or was destroyed.
    pub failure: Option<String>,
    /// Where a hibernated sandbox's workspace was saved, when its task was
    /// stopped rather than frozen (Fargate).
    #[serde(default)]
    pub snapshot_key: Option<String>,
    /// The AWS credentials the generation's agent holds (key id and
    /// expiry only), as its last heartbeat said.
    #[serde(default)]
    pub credentials: Option<CredentialsInfo>,
    /// Random, chosen when the record is made: it goes into the names of
    /// its hand queues and the keys of its generations, which therefore
    /// never repeat when a deleted identity starts again at generation 1.
    /// (Empty in a record from before salts.)
    #[serde(default)]
    pub salt: String,
    /// Tasks asked for over the record's life: names each start (see
    /// [`SandboxRecord::start_token`]).
    #[serde(default)]
    pub task_starts: u64,
}

/// The identity a sandbox belongs to.
pub fn sandbox_key(tenant: &str, agent: &str) -> String {
    format!("{tenant}#{agent}")
}

/// What a Run asking for the sandbox gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The Run holds the sandbox. When `start` is set the caller starts a
    /// task for this generation (a new sandbox or a hibernated one waking).
    Held { start: Option<Start> },
    /// Another Run holds it; this Run is waiter number `position` (1-based).
    Waiting { position: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Create,
    Wake,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    #[error("the sandbox is at generation {have}, not {expected}")]
    Generation { expected: u64, have: u64 },
    #[error("the sandbox is {state}, which does not allow {what}")]
    State {
        state: SandboxState,
        what: &'static str,
    },
}

impl SandboxRecord {
    /// Where the sandbox is in its life.
    pub fn state(&self) -> SandboxState {
        self.state
    }

    /// Takes the state the sandbox's agent reports, as the record is
    /// loaded ([`super::report`]): loading is not a transition, and only
    /// the sandbox module reads a report.
    pub(super) fn take_reported_state(&mut self, state: SandboxState) {
        self.state = state;
    }

    /// A fresh record for the first acquire of an identity.
    pub fn new(tenant: &str, agent: &str, profile: &str, now_ms: i64) -> Self {
        SandboxRecord {
            tenant: tenant.to_string(),
            agent: agent.to_string(),
            state: SandboxState::Destroyed,
            generation: 0,
            version: 0,
            task_arn: None,
            hand_queue_url: None,
            holder_run_id: None,
            waiters: vec![],
            ports: vec![],
            profile: profile.to_string(),
            controls: None,
            created_at_ms: now_ms,
            last_used_at_ms: now_ms,
            heartbeat_at_ms: 0,
            state_changed_at_ms: now_ms,
            start_attempts: 0,
            failure: None,
            snapshot_key: None,
            credentials: None,
            salt: String::new(),
            task_starts: 0,
        }
    }

    /// This record with its salt (a new record's, chosen by the caller).
    pub fn salted(mut self, salt: &str) -> Self {
        self.salt = salt.to_string();
        self
    }

    pub fn key(&self) -> String {
        sandbox_key(&self.tenant, &self.agent)
    }

    fn set_state(&mut self, state: SandboxState, now_ms: i64) {
        self.state = state;
        self.state_changed_at_ms = now_ms;
    }

    fn generation_is(&self, generation: u64) -> Result<(), LifecycleError> {
        if self.generation == generation {
            Ok(())
        } else {
            Err(LifecycleError::Generation {
                expected: generation,
                have: self.generation,
            })
        }
    }

    /// Asked for while asleep. A sandbox saved to a snapshot has no task
    /// any more (its agent said so, and only the control plane writes which
    /// task a sandbox runs in): a new one is started, its first attempt.
    fn wake(&mut self, now_ms: i64) {
        if self.state == SandboxState::Hibernated && self.snapshot_key.is_some() {
            self.want_task();
            self.start_attempts = 1;
        }
        self.set_state(SandboxState::Waking, now_ms);
    }

    /// Starts a new generation held by `run_id`.
    fn regenerate(&mut self, run_id: &str, profile: &str, now_ms: i64) {
        self.generation += 1;
        self.set_state(SandboxState::Provisioning, now_ms);
        self.want_task();
        self.credentials = None;
        self.hand_queue_url = None;
        self.ports.clear();
        self.controls = None;
        self.failure = None;
        self.snapshot_key = None;
        self.heartbeat_at_ms = 0;
        self.start_attempts = 1;
        self.profile = profile.to_string();
        self.holder_run_id = Some(run_id.to_string());
        self.waiters.retain(|w| w != run_id);
        self.created_at_ms = now_ms;
    }

    /// A Run asks for the sandbox (its first sandbox call, or an `eager`
    /// agent's first step). `profile` is the agent's current profile: it
    /// applies to a new generation only.
    fn acquire(&mut self, run_id: &str, profile: &str, now_ms: i64) -> Acquired {
        match &self.holder_run_id {
            Some(h) if h != run_id => {
                if !self.waiters.iter().any(|w| w == run_id) {
                    self.waiters.push(run_id.to_string());
                }
                let position = self
                    .waiters
                    .iter()
                    .position(|w| w == run_id)
                    .map_or(self.waiters.len(), |p| p + 1);
                return Acquired::Waiting { position };
            }
            Some(_) | None => {}
        }
        self.holder_run_id = Some(run_id.to_string());
        self.waiters.retain(|w| w != run_id);
        self.last_used_at_ms = now_ms;
        let start = match self.state {
            SandboxState::Provisioning | SandboxState::Ready | SandboxState::Waking => None,
            SandboxState::Hibernating | SandboxState::Hibernated => {
                self.wake(now_ms);
                Some(Start::Wake)
            }
            SandboxState::Destroying | SandboxState::Destroyed | SandboxState::Failed => {
                self.regenerate(run_id, profile, now_ms);
                Some(Start::Create)
            }
        };
        Acquired::Held { start }
    }

    /// A Run ended: it lets go (or leaves the queue). Returns the Run the
    /// sandbox was handed to, if any.
    fn release(&mut self, run_id: &str, now_ms: i64) -> Option<String> {
        self.waiters.retain(|w| w != run_id);
        if self.holder_run_id.as_deref() != Some(run_id) {
            return None;
        }
        self.last_used_at_ms = now_ms;
        if self.waiters.is_empty() {
            self.holder_run_id = None;
            return None;
        }
        let next = self.waiters.remove(0);
        self.holder_run_id = Some(next.clone());
        Some(next)
    }

    /// The provider started (or restarted) this generation's task.
    fn task_started(
        &mut self,
        generation: u64,
        task_arn: &str,
        hand_queue_url: &str,
    ) -> Result<(), LifecycleError> {
        self.generation_is(generation)?;
        self.task_arn = Some(task_arn.to_string());
        self.hand_queue_url = Some(hand_queue_url.to_string());
        Ok(())
    }

    /// The agent inside reported in, enforcing `controls`. (Which task it
    /// runs in is the control plane's to say: `task_started`.)
    fn agent_ready(
        &mut self,
        generation: u64,
        controls: Controls,
        now_ms: i64,
    ) -> Result<(), LifecycleError> {
        self.generation_is(generation)?;
        match self.state {
            SandboxState::Provisioning | SandboxState::Waking | SandboxState::Ready => {}
            other => {
                return Err(LifecycleError::State {
                    state: other,
                    what: "an agent reporting ready",
                })
            }
        }
        self.controls = Some(controls);
        self.heartbeat_at_ms = now_ms;
        self.set_state(SandboxState::Ready, now_ms);
        Ok(())
    }

    /// The agent could not start or could not enforce its profile.
    fn fail(&mut self, generation: u64, why: &str, now_ms: i64) -> Result<(), LifecycleError> {
        self.generation_is(generation)?;
        self.failure = Some(why.to_string());
        self.ports.clear();
        self.set_state(SandboxState::Failed, now_ms);
        Ok(())
    }

    fn heartbeat(
        &mut self,
        generation: u64,
        now_ms: i64,
        credentials: Option<CredentialsInfo>,
    ) -> Result<(), LifecycleError> {
        self.generation_is(generation)?;
        self.heartbeat_at_ms = now_ms;
        self.credentials = credentials;
        Ok(())
    }

    /// A call finished: the sandbox was used now.
    fn touch(&mut self, generation: u64, now_ms: i64) -> Result<(), LifecycleError> {
        self.generation_is(generation)?;
        self.last_used_at_ms = now_ms;
        self.heartbeat_at_ms = now_ms;
        Ok(())
    }

    /// Asks to stop the sandbox. Idempotent for a sandbox already going.
    fn destroy(&mut self, why: &str, now_ms: i64) -> bool {
        if self.state.is_gone() {
            return false;
        }
        self.failure = Some(why.to_string());
        self.ports.clear();
        self.set_state(SandboxState::Destroying, now_ms);
        true
    }

    /// The task of `generation` is stopped.
    fn stopped(&mut self, generation: u64, now_ms: i64) -> Result<(), LifecycleError> {
        self.generation_is(generation)?;
        if self.state != SandboxState::Failed {
            self.set_state(SandboxState::Destroyed, now_ms);
        }
        self.ports.clear();
        Ok(())
    }

    /// Idle long enough, and held by nobody: put it to sleep.
    fn hibernate(
        &mut self,
        generation: u64,
        idle_ms: i64,
        now_ms: i64,
    ) -> Result<(), LifecycleError> {
        self.generation_is(generation)?;
        if self.state != SandboxState::Ready
            || self.holder_run_id.is_some()
            || now_ms - self.last_used_at_ms < idle_ms
        {
            return Err(LifecycleError::State {
                state: self.state,
                what: "hibernation (busy, held or not idle long enough)",
            });
        }
        self.ports.clear();
        self.set_state(SandboxState::Hibernating, now_ms);
        Ok(())
    }

    fn hibernated(&mut self, generation: u64, now_ms: i64) -> Result<(), LifecycleError> {
        self.generation_is(generation)?;
        if self.state != SandboxState::Hibernating {
            return Err(LifecycleError::State {
                state: self.state,
                what: "finishing hibernation",
            });
        }
        self.set_state(SandboxState::Hibernated, now_ms);
        Ok(())
    }

    /// Hibernation by snapshot: the workspace is saved under `key` and the
    /// task stops; a wake starts a new task of the same generation from it.
    fn snapshotted(
        &mut self,
        generation: u64,
        key: &str,
        now_ms: i64,
    ) -> Result<(), LifecycleError> {
        self.hibernated(generation, now_ms)?;
        self.snapshot_key = Some(key.to_string());
        self.task_arn = None;
        self.start_attempts = 1;
        Ok(())
    }

    /// A hibernated sandbox's processes run again (the task was kept, frozen).
    fn woke(&mut self, generation: u64, now_ms: i64) -> Result<(), LifecycleError> {
        self.generation_is(generation)?;
        if self.state != SandboxState::Waking {
            return Err(LifecycleError::State {
                state: self.state,
                what: "waking",
            });
        }
        self.heartbeat_at_ms = now_ms;
        self.set_state(SandboxState::Ready, now_ms);
        Ok(())
    }

    /// Makes sure an identity has a sandbox without anyone holding it (a
    /// resident agent's prewarm). Returns whether a task must be started.
    fn prewarm(&mut self, profile: &str, now_ms: i64) -> Option<Start> {
        match self.state {
            SandboxState::Provisioning | SandboxState::Ready | SandboxState::Waking => None,
            SandboxState::Hibernating | SandboxState::Hibernated => {
                self.wake(now_ms);
                Some(Start::Wake)
            }
            SandboxState::Destroying | SandboxState::Destroyed | SandboxState::Failed => {
                let holder = self.holder_run_id.take();
                self.regenerate("", profile, now_ms);
                self.holder_run_id = holder;
                Some(Start::Create)
            }
        }
    }

    /// The start of this generation took too long. The first time the
    /// caller starts the task again; the second time the sandbox fails.
    fn start_timed_out(
        &mut self,
        generation: u64,
        attempt: u32,
        timeout_s: u32,
        now_ms: i64,
    ) -> Result<bool, LifecycleError> {
        self.generation_is(generation)?;
        if !matches!(
            self.state,
            SandboxState::Provisioning | SandboxState::Waking
        ) || self.start_attempts != attempt
        {
            return Err(LifecycleError::State {
                state: self.state,
                what: "a start timeout (it started, or was retried already)",
            });
        }
        if self.start_attempts < 2 {
            self.start_attempts += 1;
            self.want_task();
            // Still starting (or waking): the clock starts again.
            self.set_state(self.state, now_ms);
            Ok(true)
        } else {
            self.failure = Some(format!(
                "the sandbox did not start within {timeout_s} s, twice"
            ));
            self.set_state(SandboxState::Failed, now_ms);
            Ok(false)
        }
    }
}

/// What happens to a sandbox: asked for and let go by Runs, started and
/// reported on by its task, put to sleep, destroyed.
#[derive(Debug, Clone, PartialEq)]
pub enum SandboxEvent {
    /// A Run asks for it (its first sandbox call, or an `eager` agent's
    /// first step); `profile` is the agent's, for a new generation.
    Acquire { run_id: String, profile: String },
    /// A Run ended: it lets go, or leaves the queue.
    Release { run_id: String },
    /// A resident agent's sandbox is made (or woken) with no Run holding it.
    Prewarm { profile: String },
    /// The provider started (or restarted) the generation's task.
    TaskStarted {
        generation: u64,
        task_arn: String,
        hand_queue_url: String,
    },
    /// The agent inside reported in, enforcing `controls`.
    AgentReady {
        generation: u64,
        controls: Box<Controls>,
    },
    /// The agent could not start, or could not enforce its profile.
    Fail { generation: u64, why: String },
    /// The agent is alive, signing with `credentials`.
    Heartbeat {
        generation: u64,
        credentials: Option<CredentialsInfo>,
    },
    /// A call finished.
    Touch { generation: u64 },
    /// Stop it (idempotent for a sandbox already going).
    Destroy { why: String },
    /// The generation's task stopped.
    Stopped { generation: u64 },
    /// Idle for `idle_ms` and held by nobody: to sleep.
    Hibernate { generation: u64, idle_ms: i64 },
    /// Asleep, its task frozen.
    Hibernated { generation: u64 },
    /// Asleep as a snapshot under `key`; its task stopped.
    Snapshotted { generation: u64, key: String },
    /// A frozen task runs again.
    Woke { generation: u64 },
    /// The generation's start (attempt `attempt`) took over `timeout_s`.
    StartTimedOut {
        generation: u64,
        attempt: u32,
        timeout_s: u32,
    },
}

/// What the handler does once a sandbox's change is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxAction {
    /// The asking Run holds the sandbox.
    Held,
    /// Another Run holds it: the asking Run waits, at this place (1-based).
    Wait { position: usize },
    /// Start a task for the generation: a new sandbox, or one waking.
    StartTask(Start),
    /// The Run that was let go of handed the sandbox to this waiting Run.
    HandTo(String),
    /// Stop the generation's task (it is being destroyed).
    StopTask,
    /// Start the generation's task again (its first start took too long).
    RestartTask,
}

impl Acquired {
    /// What an `Acquire`'s actions say the asking Run got.
    pub fn of(actions: &[SandboxAction]) -> Acquired {
        if let Some(position) = actions.iter().find_map(|a| match a {
            SandboxAction::Wait { position } => Some(*position),
            _ => None,
        }) {
            return Acquired::Waiting { position };
        }
        let start = actions.iter().find_map(|a| match a {
            SandboxAction::StartTask(s) => Some(*s),
            _ => None,
        });
        Acquired::Held { start }
    }
}

/// The sandbox record in the machines' common shape: every change is an
/// event applied at a time, refused (changing nothing) or answered with
/// what to do once it is written; writes are conditional on `version`.
impl crate::machine::Machine for SandboxRecord {
    type Event = SandboxEvent;
    type Action = SandboxAction;
    type Refusal = LifecycleError;
    type Version = u64;

    fn apply(
        &mut self,
        event: SandboxEvent,
        now_ms: i64,
    ) -> Result<Vec<SandboxAction>, LifecycleError> {
        use SandboxEvent as E;
        Ok(match event {
            E::Acquire { run_id, profile } => match self.acquire(&run_id, &profile, now_ms) {
                Acquired::Waiting { position } => vec![SandboxAction::Wait { position }],
                Acquired::Held { start } => std::iter::once(SandboxAction::Held)
                    .chain(start.map(SandboxAction::StartTask))
                    .collect(),
            },
            E::Release { run_id } => self
                .release(&run_id, now_ms)
                .map(SandboxAction::HandTo)
                .into_iter()
                .collect(),
            E::Prewarm { profile } => self
                .prewarm(&profile, now_ms)
                .map(SandboxAction::StartTask)
                .into_iter()
                .collect(),
            E::TaskStarted {
                generation,
                task_arn,
                hand_queue_url,
            } => {
                self.task_started(generation, &task_arn, &hand_queue_url)?;
                vec![]
            }
            E::AgentReady {
                generation,
                controls,
            } => {
                self.agent_ready(generation, *controls, now_ms)?;
                vec![]
            }
            E::Fail { generation, why } => {
                self.fail(generation, &why, now_ms)?;
                vec![]
            }
            E::Heartbeat {
                generation,
                credentials,
            } => {
                self.heartbeat(generation, now_ms, credentials)?;
                vec![]
            }
            E::Touch { generation } => {
                self.touch(generation, now_ms)?;
                vec![]
            }
            E::Destroy { why } => {
                if self.destroy(&why, now_ms) {
                    vec![SandboxAction::StopTask]
                } else {
                    vec![]
                }
            }
            E::Stopped { generation } => {
                self.stopped(generation, now_ms)?;
                vec![]
            }
            E::Hibernate {
                generation,
                idle_ms,
            } => {
                self.hibernate(generation, idle_ms, now_ms)?;
                vec![]
            }
            E::Hibernated { generation } => {
                self.hibernated(generation, now_ms)?;
                vec![]
            }
            E::Snapshotted { generation, key } => {
                self.snapshotted(generation, &key, now_ms)?;
                vec![]
            }
            E::Woke { generation } => {
                self.woke(generation, now_ms)?;
                vec![]
            }
            E::StartTimedOut {
                generation,
                attempt,
                timeout_s,
            } => {
                // Not started again: it failed, and its task is left to
                // the provider's own timeout (no action).
                if self.start_timed_out(generation, attempt, timeout_s, now_ms)? {
                    vec![SandboxAction::RestartTask]
                } else {
                    vec![]
                }
            }
        })
    }

    fn version(&self) -> u64 {
        self.version
    }
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
