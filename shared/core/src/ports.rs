//! The ports: what the handlers need from the outside world, one trait per
//! table or concern, named by what the domain asks of it. The DynamoDB, SQS,
//! S3 and ECS adapters implement them (`store::*`, `queues`, `payloads`,
//! `hands`, `models`); `crate::memory` (feature `test-support`) implements every one in memory for
//! unit tests. No SDK type crosses a port: writes that must land with a
//! Run's commit are named by [`Also`], failed conditions are
//! [`StoreError::Conflict`], and the adapters own the attribute mapping.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;

use armada_domain::agent::{AgentDefinition, ModelSpec};
use armada_domain::api::KeyRole;
use armada_domain::approval::{Approval, ApprovalState};
use armada_domain::chat::{ChatMessage, ModelReply, Role, ToolSpec};
use armada_domain::context::HistoryTurn;
use armada_domain::fields::FieldError;
use armada_domain::messages::{DispatchMessage, HarnessMessage};
use armada_domain::run::{Payload, Run, RunEventRecord, RunHead, Stamp};
use armada_domain::sandbox::credentials::TaskCredentials;
use armada_domain::sandbox::hand::{CallMark, HandMessage};
use armada_domain::sandbox::lifecycle::SandboxRecord;
use armada_domain::sandbox::ProfileDef;
use armada_domain::session::SessionHeader;
use armada_domain::skills::SkillManifest;
use armada_domain::team::TeamDefinition;

use crate::config::SandboxConfig;
use crate::error::StoreError;
use crate::hands::{TaskInfo, TaskRequest};
use crate::models::ModelError;

/// A write that lands in the same transaction as a Run's creation or
/// commit. In a conflict, `Conflict { which: Some(0) }` is the Run itself
/// and `Some(1 + i)` the `i`-th of these.
#[derive(Debug, Clone, PartialEq)]
pub enum Also {
    /// Accepts message `header.next_seq + 1` of a session for `run_id`:
    /// conditional on the counter read (and, for a `reject` session, on no
    /// earlier message being still open).
    SessionMessage {
        header: SessionHeader,
        run_id: String,
    },
    /// A turn of a session's history (its content already in the payload
    /// bucket when large); written once.
    SessionTurn {
        session_id: String,
        turn: u64,
        role: Role,
        content: Payload,
        run_id: String,
    },
    /// The `Idempotency-Key` of the request that created the Run; written once.
    IdempotencyKey {
        tenant: String,
        key: String,
        record: IdemRecord,
        now_ms: i64,
    },
    /// An approval of one of the Run's calls, created with the commit that
    /// parks the Run; written once.
    Approval(Box<Approval>),
    /// The marker of a Run a tenant started through the API (or of the
    /// next step of its relay chain), counted by [`Quotas::active_runs`]
    /// until the Run is settled or `until_ms` passes; written once.
    ActiveRun {
        tenant: String,
        run_id: String,
        until_ms: i64,
    },
}

impl Also {
    /// The marker of `run`, a root the API accepts or a chain's next
    /// step. It expires once the
    /// Run cannot be active any more, as a backstop for a settlement that
    /// never came: its deadline, plus the longest one approval may hold it
    /// (time waiting for a person is given back to its budget). A Run
    /// held past that by approval after approval stops counting, in the
    /// tenant's favour.
    pub fn active_run(run: &Run) -> Also {
        let approval_ms = armada_domain::approval::policy::MAX_EXPIRES_S as i64 * 1000;
        Also::ActiveRun {
            tenant: run.tenant.clone(),
            run_id: run.run_id.clone(),
            until_ms: run.budgets.deadline_ms + approval_ms,
        }
    }
}

/// What an `Idempotency-Key` was first used for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdemRecord {
    pub fingerprint: String,
    pub run_id: String,
}

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

/// The Run records: read, created, claimed, leased and committed, every
/// write after creation conditional on the version the writer read.
#[async_trait]
pub trait Runs: Send + Sync + Debug {
    /// Reads a Run (strongly consistent).
    async fn get(&self, run_id: &str) -> Result<Option<Run>, StoreError>;
    /// What a Run's item says outside its document: readable when `get`
    /// finds the document corrupt.
    async fn head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError>;
    /// Creates a Run with its first events and `also`, atomically.
    async fn create(
        &self,
        run: &Run,
        events: &[RunEventRecord],
        also: Vec<Also>,
    ) -> Result<(), StoreError>;
    /// Writes `claimed` if the Run is still as `read` (state, step, epoch)
    /// and its lease has expired by `claimed.updated_at_ms`.
    async fn claim(&self, read: &Run, claimed: &Run) -> Result<(), StoreError>;
    /// Extends a live lease of `epoch`; `false` if it is not ours or ended.
    async fn renew(
        &self,
        run_id: &str,
        epoch: u64,
        lease_until_ms: i64,
    ) -> Result<bool, StoreError>;
    /// Ends the lease of `epoch` now, if `epoch` still owns the Run.
    async fn release(&self, run_id: &str, epoch: u64) -> Result<(), StoreError>;
    /// Commits the new version of a Run, its new events and `also`,
    /// conditional on `prev`; a superseded writer gets `Conflict { which:
    /// Some(0) }`. The lease is never written back as read: only ended (0).
    async fn save(
        &self,
        prev: Stamp,
        run: &Run,
        events: &[RunEventRecord],
        also: Vec<Also>,
    ) -> Result<(), StoreError>;
}

/// Human approvals: created with their Run's commit ([`Also::Approval`]),
/// then changed only by writes conditional on the version read.
#[async_trait]
pub trait Approvals: Send + Sync + Debug {
    /// Reads an approval (strongly consistent).
    async fn get(&self, approval_id: &str) -> Result<Option<Approval>, StoreError>;
    /// Writes `approval` if the stored one is still at `prev_version`.
    async fn update(&self, prev_version: u64, approval: &Approval) -> Result<(), StoreError>;
    /// Every approval of a Run.
    async fn of_run(&self, run_id: &str) -> Result<Vec<Approval>, StoreError>;
    /// A tenant's approvals, newest first, at most `limit`, of one state
    /// when given.
    async fn of_tenant(
        &self,
        tenant: &str,
        state: Option<ApprovalState>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError>;
}

/// Outbound email.
#[async_trait]
pub trait Mail: Send + Sync + Debug {
    /// Sends one message to `to`; the provider's message id.
    async fn send(&self, to: &str, subject: &str, text: &str) -> Result<String, String>;
}

/// A Run's append-only event log.
#[async_trait]
pub trait RunEvents: Send + Sync + Debug {
    /// Events with `seq > after`, oldest first, at most `limit`.
    async fn events(
        &self,
        run_id: &str,
        after: u64,
        limit: i32,
    ) -> Result<Vec<RunEventRecord>, StoreError>;

    /// Every event of a Run, page by page.
    async fn all_events(&self, run_id: &str) -> Result<Vec<RunEventRecord>, StoreError> {
        let mut all: Vec<RunEventRecord> = Vec::new();
        loop {
            let after = all.last().map_or(0, |e| e.seq);
            let page = self.events(run_id, after, 500).await?;
            let done = page.len() < 500;
            all.extend(page);
            if done {
                return Ok(all);
            }
        }
    }
}

/// Session headers, their message index and their history.
#[async_trait]
pub trait Sessions: Send + Sync + Debug {
    /// Creates a session; an existing id is a `Conflict`.
    async fn create(&self, h: &SessionHeader) -> Result<(), StoreError>;
    async fn header(&self, session_id: &str) -> Result<Option<SessionHeader>, StoreError>;
    /// The Run that carries message `seq`.
    async fn message_run(&self, session_id: &str, seq: u64) -> Result<Option<String>, StoreError>;
    /// The whole history, oldest first, with stored contents read back.
    async fn history(&self, session_id: &str) -> Result<Vec<HistoryTurn>, StoreError>;
    /// Counts message `seq` as done, if `seq - 1` is the last one done.
    async fn mark_done(&self, session_id: &str, seq: u64) -> Result<(), StoreError>;
}

/// `Idempotency-Key` records (written through [`Also::IdempotencyKey`]).
#[async_trait]
pub trait Idempotency: Send + Sync + Debug {
    async fn get(&self, tenant: &str, key: &str) -> Result<Option<IdemRecord>, StoreError>;
    /// Counts one Run started by `tenant` in the minute starting at
    /// `window_s`, unless `limit` were counted already: `false` then, and
    /// nothing is counted (one conditional write; the counter expires).
    async fn count_run_start(
        &self,
        tenant: &str,
        window_s: i64,
        limit: u32,
    ) -> Result<bool, StoreError>;
}

/// What a tenant holds at once, across every Lambda instance: a marker
/// per active Run it started through the API (written with the Run,
/// [`Also::ActiveRun`], removed when the Run is settled) and a slot per
/// long-poll waiting. Every item expires, so what a lost settlement or a
/// crashed instance leaves behind stops counting.
#[async_trait]
pub trait Quotas: Send + Sync + Debug {
    /// The tenant's active Runs, counted no further than `limit`; a marker
    /// whose expiry passed by `now_ms` is not counted.
    async fn active_runs(&self, tenant: &str, limit: u32, now_ms: i64) -> Result<u32, StoreError>;
    /// Removes the marker of a Run that ended; one already gone (removed
    /// before, expired, or never written: a child) is no error.
    async fn run_ended(&self, tenant: &str, run_id: &str) -> Result<(), StoreError>;
    /// Takes one of the tenant's `limit` long-poll slots for `holder`
    /// until `until_ms`: its number, or `None` when every one is held. A
    /// slot whose holder's time passed by `now_ms` is free again.
    async fn take_poll_slot(
        &self,
        tenant: &str,
        limit: u32,
        holder: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Option<u32>, StoreError>;
    /// Gives a slot back, if `holder` still holds it (one taken over
    /// since, its time having passed, is left to its new holder).
    async fn release_poll_slot(
        &self,
        tenant: &str,
        slot: u32,
        holder: &str,
    ) -> Result<(), StoreError>;
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

/// What a read-modify-write of a sandbox record decided.
#[derive(Debug)]
pub enum Change<T> {
    /// Write this record (conditional on the version read) and return `T`.
    Write(Box<SandboxRecord>, T),
    /// Leave the record as it is.
    Keep(T),
}

/// Identifies one attempt of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRef {
    /// The identity the call was sent to (its mark lives under it).
    pub tenant: String,
    pub agent: String,
    pub run_id: String,
    pub call_id: String,
    pub attempt: u32,
}

/// The mark of a call, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMark {
    pub mark: CallMark,
    pub generation: u64,
    pub at_ms: i64,
}

/// Conflicting writers retried by [`SandboxesExt::modify`] before giving up.
const CAS_ATTEMPTS: usize = crate::cas::ATTEMPTS;

/// The first uid [`Sandboxes::identity_uid`] hands out (the ones below
/// are the host's own users').
pub const FIRST_SANDBOX_UID: u32 = 300_000;

/// Sandbox records (one per agent identity), call marks and pooled ports.
#[async_trait]
pub trait Sandboxes: Send + Sync + Debug {
    async fn get(&self, tenant: &str, agent: &str) -> Result<Option<SandboxRecord>, StoreError>;
    async fn list(&self, tenant: &str) -> Result<Vec<SandboxRecord>, StoreError>;
    /// Every tenant's record of one agent.
    async fn list_agent(&self, agent: &str) -> Result<Vec<SandboxRecord>, StoreError>;
    /// Writes `rec` with version `read_version + 1` if the stored version is
    /// still `read_version` (`None`: if there is no record yet).
    async fn put_if_version(
        &self,
        rec: &SandboxRecord,
        read_version: Option<u64>,
    ) -> Result<(), StoreError>;
    /// The sandbox agent's write: the report half of `rec` only, with
    /// version `read_version + 1`, if the stored version is still
    /// `read_version`. (The control half is the control plane's.)
    async fn put_report_if_version(
        &self,
        rec: &SandboxRecord,
        read_version: u64,
    ) -> Result<(), StoreError>;
    /// Removes a record, if unchanged since read.
    async fn delete(&self, rec: &SandboxRecord) -> Result<(), StoreError>;
    /// Marks a call once: `None` if this mark was written, else the mark
    /// already there.
    async fn mark_first(
        &self,
        call: &CallRef,
        mark: CallMark,
        generation: u64,
        now_ms: i64,
    ) -> Result<Option<StoredMark>, StoreError>;
    async fn mark_finished(&self, call: &CallRef, now_ms: i64) -> Result<(), StoreError>;
    async fn mark(&self, call: &CallRef) -> Result<Option<StoredMark>, StoreError>;
    /// Takes a pooled port for `holder`; `false` if someone holds it.
    async fn take_port(
        &self,
        host: &str,
        port: u16,
        holder: &str,
        generation: u64,
    ) -> Result<bool, StoreError>;
    async fn release_port(&self, host: &str, port: u16, holder: &str) -> Result<(), StoreError>;
    async fn port_holder(&self, host: &str, port: u16) -> Result<Option<String>, StoreError>;
    /// The host uid of an identity's sandboxes (the local data plane's):
    /// taken once from a counter, so no two identities ever share one
    /// (the first is [`FIRST_SANDBOX_UID`]), and kept for every later
    /// generation of the identity, whose files under `/data` stay its own.
    async fn identity_uid(&self, tenant: &str, agent: &str) -> Result<u32, StoreError>;
}

/// Read-modify-write over any [`Sandboxes`].
#[async_trait]
pub trait SandboxesExt: Sandboxes {
    /// Reads the record of an identity, lets `f` decide, and writes what it
    /// decided conditional on the version read (or on the key's absence).
    /// A conflicting writer makes it read and decide again.
    async fn modify<T: Send>(
        &self,
        tenant: &str,
        agent: &str,
        f: impl FnMut(Option<SandboxRecord>) -> Change<T> + Send,
    ) -> Result<T, StoreError> {
        read_modify_write(self, tenant, agent, Half::Whole, f).await
    }
}

impl<S: Sandboxes + ?Sized> SandboxesExt for S {}

/// The sandbox agent's read-modify-write: as [`SandboxesExt::modify`], but
/// what is written is the record's report half only (whatever `f` did to
/// the control half is not the agent's to write), and never a new record.
#[async_trait]
pub trait SandboxReports: Sandboxes {
    async fn modify_report<T: Send>(
        &self,
        tenant: &str,
        agent: &str,
        f: impl FnMut(Option<SandboxRecord>) -> Change<T> + Send,
    ) -> Result<T, StoreError> {
        read_modify_write(self, tenant, agent, Half::Report, f).await
    }
}

/// Which half of a sandbox record a read-modify-write writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Half {
    /// The whole record (the control plane).
    Whole,
    /// The report half only (the sandbox's agent), of a record that exists.
    Report,
}

/// The one compare-and-set loop of sandbox records: read, let `f` decide,
/// write what it decided conditional on the version read; a conflicting
/// writer makes it read and decide again.
async fn read_modify_write<S, T>(
    store: &S,
    tenant: &str,
    agent: &str,
    half: Half,
    mut f: impl FnMut(Option<SandboxRecord>) -> Change<T> + Send,
) -> Result<T, StoreError>
where
    S: Sandboxes + ?Sized,
    T: Send,
{
    for _ in 0..CAS_ATTEMPTS {
        let read = store.get(tenant, agent).await?;
        let read_version = read.as_ref().map(|r| r.version);
        let (mut rec, out) = match f(read) {
            Change::Keep(out) => return Ok(out),
            Change::Write(rec, out) => (rec, out),
        };
        rec.version = read_version.map_or(1, |v| v + 1);
        let written = match (half, read_version) {
            (Half::Whole, _) => store.put_if_version(&rec, read_version).await,
            (Half::Report, Some(v)) => store.put_report_if_version(&rec, v).await,
            (Half::Report, None) => {
                return Err(StoreError::Terminal(format!(
                    "sandbox {tenant}#{agent}: an agent cannot create its record"
                )))
            }
        };
        match written {
            Ok(()) => return Ok(out),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Retryable(format!(
        "sandbox {tenant}#{agent} kept changing under {CAS_ATTEMPTS} attempts"
    )))
}

impl<S: Sandboxes + ?Sized> SandboxReports for S {}

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

/// The work queues: the dispatch queue, the harness FIFO queue, and the
/// visibility of messages being handled.
#[async_trait]
pub trait Queues: Send + Sync + Debug {
    /// Sends to the dispatch queue, delivered after `delay_s` (at most 900).
    async fn send_dispatch_delayed(
        &self,
        msg: &DispatchMessage,
        delay_s: u32,
    ) -> Result<(), StoreError>;
    /// Sends to the harness FIFO queue, grouped by Run and deduplicated per
    /// step.
    async fn send_harness(&self, msg: &HarnessMessage) -> Result<(), StoreError>;
    /// Sends to the delivery queue (callbacks and chat messages to a
    /// tenant's endpoints), delivered after `delay_s` (at most 900).
    async fn send_delivery(&self, msg: &DispatchMessage, delay_s: u32) -> Result<(), StoreError>;
    /// Hides a message being handled for `seconds` more (a heartbeat).
    async fn keep_hidden(&self, queue_url: &str, receipt_handle: &str, seconds: u32);
    /// Delays the next delivery of a failed message: `base * 2^(receives-1)`
    /// seconds (at least `min_delay_s`), capped at 15 minutes.
    async fn back_off(
        &self,
        queue_url: &str,
        receipt_handle: &str,
        receives: u32,
        base_s: u32,
        min_delay_s: u32,
    );
    /// The URL of a queue from the ARN an SQS event names.
    fn url_for_arn(&self, arn: &str) -> Option<String>;
    /// Whether a queue (by name) is one of the dead-letter queues.
    fn is_dead_letter_queue(&self, name: &str) -> bool;
    /// Where sandboxes send their answers (the harness queue's URL).
    fn harness_url(&self) -> String;
    /// Where sandboxes ask for new credentials (the dispatch queue's URL).
    fn dispatch_url(&self) -> String;

    async fn send_dispatch(&self, msg: &DispatchMessage) -> Result<(), StoreError> {
        self.send_dispatch_delayed(msg, 0).await
    }
    /// Sends a dispatcher's message to the queue of its kind: what goes to
    /// a tenant's endpoint to the delivery queue (a slow endpoint holds a
    /// delivery slot there, never the settling of Runs), the rest to the
    /// dispatch queue.
    async fn send_routed(&self, msg: &DispatchMessage) -> Result<(), StoreError> {
        if msg.is_delivery() {
            self.send_delivery(msg, 0).await
        } else {
            self.send_dispatch(msg).await
        }
    }
}

/// A stored text read no further than a bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bounded {
    Text(String),
    /// Over the bound: `bytes` is its stored size when that was told, or
    /// how much had been read when the bound was passed.
    TooLarge {
        bytes: u64,
    },
}

/// Large bodies (inputs, outputs, turns, results) in the payload bucket.
#[async_trait]
pub trait Blobs: Send + Sync + Debug {
    async fn put_text(&self, key: &str, text: &str) -> Result<(), StoreError>;
    async fn get_text(&self, key: &str) -> Result<String, StoreError>;
    /// Reads at most `max` bytes of the object: for objects someone other
    /// than the platform wrote (a sandbox's outcomes), whose size it does
    /// not control.
    async fn get_text_bounded(&self, key: &str, max: u64) -> Result<Bounded, StoreError>;

    /// Inline when at most `limit` bytes, else stored under `key`.
    async fn spill(&self, key: &str, text: &str, limit: usize) -> Result<Payload, StoreError> {
        if text.len() <= limit {
            return Ok(Payload::Inline {
                text: text.to_string(),
            });
        }
        self.put_text(key, text).await?;
        Ok(Payload::Stored {
            key: key.to_string(),
            bytes: text.len(),
        })
    }

    async fn read(&self, p: &Payload) -> Result<String, StoreError> {
        match p {
            Payload::Inline { text } => Ok(text.clone()),
            Payload::Stored { key, .. } => self.get_text(key).await,
        }
    }
}

/// The model an agent talks to.
#[async_trait]
pub trait Model: Send + Sync + Debug {
    async fn complete(
        &self,
        spec: &ModelSpec,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> Result<ModelReply, ModelError>;

    /// Retries what is retryable, up to `attempts`; says how many it took.
    async fn complete_with_retry(
        &self,
        spec: &ModelSpec,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        attempts: u32,
    ) -> Result<(ModelReply, u32), (ModelError, u32)> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.complete(spec, messages, tools).await {
                Ok(r) => return Ok((r, attempt)),
                Err(e @ ModelError::Terminal(_)) => return Err((e, attempt)),
                Err(e) if attempt >= attempts => return Err((e, attempt)),
                Err(e) => {
                    tracing::warn!(attempt, error = %e, "model call failed; retrying");
                    let backoff = Duration::from_millis(100 * (1 << attempt.min(6)));
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }
}
