//! Every port in memory, for unit tests of the handlers' decision logic:
//! one [`Memory`] holds all the tables behind one lock, so a Run's commit
//! and the writes that go with it ([`Also`]) are atomic here as in
//! DynamoDB, with the same conditions (fencing on the version read, a
//! claim only of the state read with an expired lease, create-once items).
//! Queues and the sandbox provider record what was sent, for the tests to
//! read and to deliver by hand. Nothing here is used outside tests.
//!
//! - this file: [`Memory`], [`Services::in_memory`], runs, events, sessions,
//!   idempotency
//! - [`others`]: registry, sandboxes, provider, queues, blobs, the model
//! - [`triggers`]: hooks and their deliveries
//! - [`mailboxes`]: mailboxes, their mail and their replies
//! - [`schedules`]: schedules, their firings and timers
//! - [`secrets`]: tenants' secrets, sealed

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use armada_domain::agent::AgentDefinition;
use armada_domain::approval::{Approval, ApprovalState};
use armada_domain::chat::Role;
use armada_domain::context::HistoryTurn;
use armada_domain::hook::inbound::Delivery;
use armada_domain::hook::Hook;
use armada_domain::mailbox::receipt::MailReceipt;
use armada_domain::mailbox::reply::ReplyRecord;
use armada_domain::mailbox::Mailbox;
use armada_domain::messages::{DispatchMessage, HarnessMessage};
use armada_domain::run::{Payload, Run, RunEventRecord, RunHead, Stamp};
use armada_domain::sandbox::hand::HandMessage;
use armada_domain::sandbox::lifecycle::SandboxRecord;
use armada_domain::sandbox::ProfileDef;
use armada_domain::schedule::{FiringRecord, Schedule};
use armada_domain::session::{OnBusy, SessionHeader};
use armada_domain::skills::SkillManifest;
use armada_domain::team::TeamDefinition;

use crate::clock::Clock;
use crate::config::Config;
use crate::error::StoreError;
use crate::ports::provider::TaskInfo;
use crate::ports::{
    Also, Approvals, Blobs, IdemRecord, Idempotency, Mail, Quotas, RunEvents, Runs, Sessions,
    StoredKey, StoredMark,
};
use crate::services::callbacks::Callbacks;
use crate::services::egress::Egress;
use crate::services::tools::InlineTools;
use crate::{Counters, Services};

pub mod fixtures;
mod mailboxes;
mod others;
mod schedules;
mod secrets;
mod triggers;

/// The tables, queues and tasks of an in-memory deployment.
#[derive(Debug, Default)]
pub struct State {
    pub runs: HashMap<String, Run>,
    /// Runs whose document reads as corrupt (until a save rewrites it).
    pub corrupt_runs: std::collections::HashSet<String>,
    pub events: HashMap<String, BTreeMap<u64, RunEventRecord>>,
    pub sessions: HashMap<String, SessionHeader>,
    /// (session, seq) → the Run of that message.
    pub session_index: HashMap<(String, u64), String>,
    /// session → turn → (role, content, run).
    pub turns: HashMap<String, BTreeMap<u64, (Role, Payload, String)>>,
    pub idempotency: HashMap<String, IdemRecord>,
    /// (tenant, minute) → Runs started (the per-tenant rate quota).
    pub run_starts: HashMap<(String, i64), u32>,
    /// slot → the message that took it (the watchdog's checks).
    pub slots: HashMap<String, String>,
    /// (tenant, run) → until when the marker of an active Run counts.
    pub active_runs: BTreeMap<(String, String), i64>,
    /// (tenant, slot) → (holder, until) of a long-poll waiting.
    pub poll_slots: BTreeMap<(String, u32), (String, i64)>,
    pub agents: HashMap<String, (AgentDefinition, u64)>,
    pub skills: BTreeMap<String, SkillManifest>,
    pub profiles: BTreeMap<String, ProfileDef>,
    pub teams: BTreeMap<String, TeamDefinition>,
    pub keys: HashMap<String, StoredKey>,
    /// tenant → the salt of its callback signing secret.
    pub callback_salts: HashMap<String, String>,
    pub approvals: BTreeMap<String, Approval>,
    pub hooks: HashMap<String, Hook>,
    /// `tenant/name` → the secret, sealed.
    pub secrets: HashMap<String, armada_domain::secret::Secret>,
    /// Answered hook deliveries, as recorded.
    pub deliveries: Vec<Delivery>,
    /// (hook, hour) → Runs started (the hook's `max_runs_per_hour`).
    pub hook_starts: HashMap<(String, i64), u32>,
    pub mailboxes: HashMap<String, Mailbox>,
    /// Messages received by mailboxes, as recorded.
    pub mail_receipts: Vec<MailReceipt>,
    /// (mailbox, hour) → Runs started.
    pub mailbox_starts: HashMap<(String, i64), u32>,
    /// Replies by `Message-ID`.
    pub replies: HashMap<String, ReplyRecord>,
    /// Whole messages sent: (from, to, message).
    pub raw_mails: Vec<(String, String, String)>,
    /// Alarm topics made, by ARN.
    pub topics: std::collections::HashSet<String>,
    pub schedules: HashMap<String, Schedule>,
    /// (schedule, scheduled at) → its firing, in order.
    pub firings: BTreeMap<(String, i64), FiringRecord>,
    /// schedule → its timer: what it fires, and the message it sends.
    pub timers: HashMap<String, (Schedule, String)>,
    /// Emails sent: (to, subject, text).
    pub mails: Vec<(String, String, String)>,
    /// Sends that fail before one succeeds (a provider outage).
    pub mail_failures: u32,
    /// Sends to the dispatch queue that fail before one succeeds (an
    /// SQS outage).
    pub dispatch_failures: u32,
    pub sandboxes: HashMap<String, SandboxRecord>,
    pub marks: HashMap<String, StoredMark>,
    /// `host#port` → (holder, generation).
    pub ports: HashMap<String, (String, u64)>,
    pub blobs: HashMap<String, String>,
    /// Stored bytes that are not text (attachments, messages).
    pub files: HashMap<String, Vec<u8>>,
    /// Messages sent to the harness queue, oldest first.
    pub harness: Vec<HarnessMessage>,
    /// Messages sent to the dispatch queue, with their delay.
    pub dispatch: Vec<(DispatchMessage, u32)>,
    /// Messages sent to the dispatch dead-letter queue.
    pub dead_letters: Vec<DispatchMessage>,
    /// Messages sent to hand queues: (queue URL, message).
    pub hands: Vec<(String, HandMessage)>,
    /// Tasks the provider started, by ARN.
    pub tasks: BTreeMap<String, TaskInfo>,
    /// The task each start token started (as ECS keeps client tokens).
    pub start_tokens: HashMap<String, String>,
    /// Credentials the provider issued: (tenant, agent, generation, key id).
    pub credentials: Vec<(String, String, u64, String)>,
}

/// Every port over one [`State`].
#[derive(Debug)]
pub struct Memory {
    state: Mutex<State>,
    cfg: Config,
}

impl Memory {
    pub fn new(cfg: Config) -> Arc<Memory> {
        Arc::new(Memory {
            state: Mutex::default(),
            cfg,
        })
    }

    /// The state, for a test to look at or to change.
    pub fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding it has failed already.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the harness messages sent so far.
    pub fn take_harness(&self) -> Vec<HarnessMessage> {
        std::mem::take(&mut self.state().harness)
    }

    /// Takes the dispatch messages sent so far (without their delays).
    pub fn take_dispatch(&self) -> Vec<DispatchMessage> {
        std::mem::take(&mut self.state().dispatch)
            .into_iter()
            .map(|(m, _)| m)
            .collect()
    }
}

/// A configuration for unit tests: names that are only names.
pub fn test_config() -> Config {
    let vars: HashMap<String, String> = [
        ("ARMADA_RUNS_TABLE", "runs"),
        ("ARMADA_RUN_EVENTS_TABLE", "run_events"),
        ("ARMADA_SESSIONS_TABLE", "sessions"),
        ("ARMADA_APPROVALS_TABLE", "approvals"),
        ("ARMADA_SANDBOXES_TABLE", "sandboxes"),
        ("ARMADA_REGISTRY_TABLE", "registry"),
        ("ARMADA_IDEMPOTENCY_TABLE", "idempotency"),
        ("ARMADA_QUOTAS_TABLE", "quotas"),
        ("ARMADA_TRIGGERS_TABLE", "triggers"),
        ("ARMADA_DISPATCH_QUEUE", "dispatch"),
        ("ARMADA_DISPATCH_DLQ", "dispatch-dlq"),
        ("ARMADA_DELIVERY_QUEUE", "delivery"),
        ("ARMADA_MAIL_QUEUE", "mail"),
        (
            "ARMADA_MAIL_TOPIC_ARN",
            "arn:aws:sns:us-east-1:000000000000:mail",
        ),
        ("ARMADA_HARNESS_QUEUE", "harness.fifo"),
        ("ARMADA_HARNESS_DLQ", "harness-dlq.fifo"),
        ("ARMADA_PAYLOAD_BUCKET", "payloads"),
        ("ARMADA_ADMIN_KEY_SHA256", &"0".repeat(64)),
        ("ARMADA_CALLBACK_SIGNING_SECRET", "a test signing secret"),
        // Unit tests call loopback receivers of their own.
        ("ARMADA_EGRESS_ALLOW", "127.0.0.1:*"),
        ("ARMADA_SANDBOX_CLUSTER", "cluster"),
        ("ARMADA_SANDBOX_TASK_STANDARD", "standard"),
        ("ARMADA_SANDBOX_TASK_LARGE", "large"),
        ("ARMADA_HAND_QUEUE_PREFIX", "hand"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    // Every variable is set above, with a valid value.
    Config::from_map(&vars).unwrap_or_else(|e| panic!("test configuration: {e}"))
}

impl Services {
    /// Services over in-memory ports, for unit tests; the memory is
    /// returned beside them for the test to inspect.
    pub fn in_memory(cfg: Config) -> (Arc<Services>, Arc<Memory>) {
        let mem = Memory::new(cfg.clone());
        let egress = Egress::of(&cfg);
        let svc = Services {
            counters: Arc::<Counters>::default(),
            runs: mem.clone(),
            run_events: mem.clone(),
            sessions: mem.clone(),
            approvals: mem.clone(),
            hooks: mem.clone(),
            secrets: mem.clone(),
            vault: Arc::new(crate::adapters::vault::DerivedVault::of(&cfg)),
            topics: mem.clone(),
            schedules: mem.clone(),
            mailboxes: mem.clone(),
            timers: mem.clone(),
            registry: mem.clone(),
            sandboxes: mem.clone(),
            provider: mem.clone(),
            idempotency: mem.clone(),
            quotas: mem.clone(),
            queues: mem.clone(),
            payloads: mem.clone(),
            models: mem.clone(),
            tools: InlineTools::new(egress.clone(), mem.clone()),
            callbacks: Callbacks::new(&cfg.callback_signing_secret, 1, egress),
            mail: mem.clone(),
            clock: Clock::default(),
            faults: Arc::new(crate::faults::NoFaults),
            cfg,
        };
        (Arc::new(svc), mem)
    }
}

#[async_trait]
impl Approvals for Memory {
    async fn get(&self, approval_id: &str) -> Result<Option<Approval>, StoreError> {
        Ok(self.state().approvals.get(approval_id).cloned())
    }

    async fn update(&self, prev_version: u64, approval: &Approval) -> Result<(), StoreError> {
        let mut st = self.state();
        match st.approvals.get(&approval.approval_id) {
            Some(a) if a.version == prev_version => {
                st.approvals
                    .insert(approval.approval_id.clone(), approval.clone());
                Ok(())
            }
            _ => Err(conflict(None)),
        }
    }

    async fn of_run(&self, run_id: &str) -> Result<Vec<Approval>, StoreError> {
        let st = self.state();
        Ok(st
            .approvals
            .values()
            .filter(|a| a.run_id == run_id)
            .cloned()
            .collect())
    }

    async fn of_tenant(
        &self,
        tenant: &str,
        state: Option<ApprovalState>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        let st = self.state();
        let mut out: Vec<Approval> = st
            .approvals
            .values()
            .filter(|a| a.tenant == tenant && state.is_none_or(|s| a.state() == s))
            .cloned()
            .collect();
        out.sort_by_key(|a| std::cmp::Reverse(a.created_at_ms));
        out.truncate(limit);
        Ok(out)
    }
}

#[async_trait]
impl Mail for Memory {
    async fn send(&self, to: &str, subject: &str, text: &str) -> Result<String, String> {
        let mut st = self.state();
        if st.mail_failures > 0 {
            st.mail_failures -= 1;
            return Err("the mail provider is unavailable".into());
        }
        st.mails
            .push((to.to_string(), subject.to_string(), text.to_string()));
        Ok(format!("mem-{}", st.mails.len()))
    }

    async fn send_raw(&self, from: &str, to: &str, message: &str) -> Result<String, String> {
        let mut st = self.state();
        if st.mail_failures > 0 {
            st.mail_failures -= 1;
            return Err("the mail provider is unavailable".into());
        }
        st.raw_mails
            .push((from.to_string(), to.to_string(), message.to_string()));
        Ok(format!("mem-raw-{}", st.raw_mails.len()))
    }
}

fn conflict(which: Option<usize>) -> StoreError {
    StoreError::Conflict { which }
}

fn idem_key(tenant: &str, key: &str) -> String {
    format!("{tenant}#{key}")
}

/// Checks every `Also` write's condition, naming the first that fails.
fn check_also(st: &State, also: &[Also]) -> Result<(), StoreError> {
    for (i, a) in also.iter().enumerate() {
        let ok = match a {
            Also::SessionMessage { header, .. } => {
                let seq = header.next_seq + 1;
                st.sessions.get(&header.session_id).is_some_and(|h| {
                    h.next_seq == header.next_seq
                        && (header.on_busy != OnBusy::Reject || h.done_seq == header.next_seq)
                }) && !st
                    .session_index
                    .contains_key(&(header.session_id.clone(), seq))
            }
            Also::SessionTurn {
                session_id, turn, ..
            } => !st
                .turns
                .get(session_id)
                .is_some_and(|t| t.contains_key(turn)),
            Also::IdempotencyKey { tenant, key, .. } => {
                !st.idempotency.contains_key(&idem_key(tenant, key))
            }
            Also::Approval(a) => !st.approvals.contains_key(&a.approval_id),
            Also::ActiveRun { tenant, run_id, .. } => !st
                .active_runs
                .contains_key(&(tenant.clone(), run_id.clone())),
        };
        if !ok {
            return Err(conflict(Some(1 + i)));
        }
    }
    Ok(())
}

fn write_also(st: &mut State, also: Vec<Also>) {
    for a in also {
        match a {
            Also::SessionMessage { header, run_id } => {
                let seq = header.next_seq + 1;
                if let Some(h) = st.sessions.get_mut(&header.session_id) {
                    h.next_seq = seq;
                }
                st.session_index.insert((header.session_id, seq), run_id);
            }
            Also::SessionTurn {
                session_id,
                turn,
                role,
                content,
                run_id,
            } => {
                st.turns
                    .entry(session_id)
                    .or_default()
                    .insert(turn, (role, content, run_id));
            }
            Also::IdempotencyKey {
                tenant,
                key,
                record,
                ..
            } => {
                st.idempotency.insert(idem_key(&tenant, &key), record);
            }
            Also::Approval(a) => {
                st.approvals.insert(a.approval_id.clone(), *a);
            }
            Also::ActiveRun {
                tenant,
                run_id,
                until_ms,
            } => {
                st.active_runs.insert((tenant, run_id), until_ms);
            }
        }
    }
}

fn check_events(st: &State, run_id: &str, events: &[RunEventRecord]) -> Result<(), StoreError> {
    let log = st.events.get(run_id);
    if events
        .iter()
        .any(|e| log.is_some_and(|l| l.contains_key(&e.seq)))
    {
        return Err(conflict(None));
    }
    Ok(())
}

fn write_events(st: &mut State, run_id: &str, events: &[RunEventRecord]) {
    let log = st.events.entry(run_id.to_string()).or_default();
    for e in events {
        log.insert(e.seq, e.clone());
    }
}

#[async_trait]
impl Runs for Memory {
    async fn get(&self, run_id: &str) -> Result<Option<Run>, StoreError> {
        let st = self.state();
        if st.corrupt_runs.contains(run_id) {
            return Err(StoreError::Corrupt(format!("run {run_id}: attribute doc")));
        }
        Ok(st.runs.get(run_id).cloned())
    }

    async fn head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        Ok(self.state().runs.get(run_id).map(|r| RunHead {
            run_id: r.run_id.clone(),
            tenant: r.tenant.clone(),
            agent: r.agent.clone(),
            state: r.state(),
            step: r.step,
            epoch: r.epoch,
            event_seq: r.event_seq,
            created_at_ms: r.created_at_ms,
            updated_at_ms: r.updated_at_ms,
            parent_run_id: r.parent_run_id.clone(),
            session_id: r.session_id.clone(),
            session_seq: r.session_seq,
        }))
    }

    async fn create(
        &self,
        run: &Run,
        events: &[RunEventRecord],
        also: Vec<Also>,
    ) -> Result<(), StoreError> {
        let mut st = self.state();
        if st.runs.contains_key(&run.run_id) {
            return Err(conflict(Some(0)));
        }
        check_also(&st, &also)?;
        check_events(&st, &run.run_id, events)?;
        st.runs.insert(run.run_id.clone(), run.clone());
        write_events(&mut st, &run.run_id, events);
        write_also(&mut st, also);
        Ok(())
    }

    async fn claim(&self, read: &Run, claimed: &Run) -> Result<(), StoreError> {
        let mut st = self.state();
        let Some(cur) = st.runs.get_mut(&read.run_id) else {
            return Err(conflict(None));
        };
        let claimable = cur.state() == read.state()
            && cur.step == read.step
            && cur.epoch == read.epoch
            && cur.lease_until_ms <= claimed.updated_at_ms;
        if !claimable {
            return Err(conflict(None));
        }
        *cur = cur.clone().as_stored(claimed.state());
        cur.epoch = claimed.epoch;
        cur.lease_until_ms = claimed.lease_until_ms;
        cur.updated_at_ms = claimed.updated_at_ms;
        Ok(())
    }

    async fn renew(
        &self,
        run_id: &str,
        epoch: u64,
        lease_until_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut st = self.state();
        match st.runs.get_mut(run_id) {
            Some(r) if r.epoch == epoch && r.lease_until_ms > 0 => {
                r.lease_until_ms = lease_until_ms;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, run_id: &str, epoch: u64) -> Result<(), StoreError> {
        let mut st = self.state();
        if let Some(r) = st.runs.get_mut(run_id).filter(|r| r.epoch == epoch) {
            r.lease_until_ms = 0;
        }
        Ok(())
    }

    async fn save(
        &self,
        prev: Stamp,
        run: &Run,
        events: &[RunEventRecord],
        also: Vec<Also>,
    ) -> Result<(), StoreError> {
        let mut st = self.state();
        let lease = match st.runs.get(&run.run_id) {
            Some(cur) if cur.epoch == prev.epoch && cur.event_seq == prev.event_seq => {
                cur.lease_until_ms
            }
            _ => return Err(conflict(Some(0))),
        };
        check_events(&st, &run.run_id, events)?;
        check_also(&st, &also)?;
        let mut next = run.clone();
        // A save ends the lease (0) but never writes back the one it read.
        if next.lease_until_ms != 0 {
            next.lease_until_ms = lease;
        }
        st.runs.insert(run.run_id.clone(), next);
        st.corrupt_runs.remove(&run.run_id);
        write_events(&mut st, &run.run_id, events);
        write_also(&mut st, also);
        Ok(())
    }
}

#[async_trait]
impl RunEvents for Memory {
    async fn events(
        &self,
        run_id: &str,
        after: u64,
        limit: i32,
    ) -> Result<Vec<RunEventRecord>, StoreError> {
        let st = self.state();
        Ok(st
            .events
            .get(run_id)
            .map(|log| {
                log.range(after + 1..)
                    .take(limit.max(0) as usize)
                    .map(|(_, e)| e.clone())
                    .collect()
            })
            .unwrap_or_default())
    }
}

#[async_trait]
impl Sessions for Memory {
    async fn create(&self, h: &SessionHeader) -> Result<(), StoreError> {
        let mut st = self.state();
        if st.sessions.contains_key(&h.session_id) {
            return Err(conflict(None));
        }
        st.sessions.insert(h.session_id.clone(), h.clone());
        Ok(())
    }

    async fn header(&self, session_id: &str) -> Result<Option<SessionHeader>, StoreError> {
        Ok(self.state().sessions.get(session_id).cloned())
    }

    async fn message_run(&self, session_id: &str, seq: u64) -> Result<Option<String>, StoreError> {
        let st = self.state();
        Ok(st
            .session_index
            .get(&(session_id.to_string(), seq))
            .cloned())
    }

    async fn history(&self, session_id: &str) -> Result<Vec<HistoryTurn>, StoreError> {
        let turns: Vec<(Role, Payload, String)> = self
            .state()
            .turns
            .get(session_id)
            .map(|t| t.values().cloned().collect())
            .unwrap_or_default();
        let mut out = Vec::with_capacity(turns.len());
        for (role, content, run_id) in turns {
            out.push(HistoryTurn {
                role,
                content: self.read(&content).await?,
                run_id,
            });
        }
        Ok(out)
    }

    async fn mark_done(&self, session_id: &str, seq: u64) -> Result<(), StoreError> {
        let mut st = self.state();
        match st.sessions.get_mut(session_id) {
            Some(h) if h.done_seq + 1 == seq => {
                h.done_seq = seq;
                Ok(())
            }
            _ => Err(conflict(None)),
        }
    }
}

#[async_trait]
impl Idempotency for Memory {
    async fn get(&self, tenant: &str, key: &str) -> Result<Option<IdemRecord>, StoreError> {
        Ok(self
            .state()
            .idempotency
            .get(&idem_key(tenant, key))
            .cloned())
    }

    async fn count_run_start(
        &self,
        tenant: &str,
        window_s: i64,
        limit: u32,
    ) -> Result<bool, StoreError> {
        let mut st = self.state();
        let n = st
            .run_starts
            .entry((tenant.to_string(), window_s))
            .or_insert(0);
        if *n >= limit {
            return Ok(false);
        }
        *n += 1;
        Ok(true)
    }

    async fn take_slot(&self, slot: &str, holder: &str, _now_ms: i64) -> Result<bool, StoreError> {
        let mut st = self.state();
        let taken = st
            .slots
            .entry(slot.to_string())
            .or_insert_with(|| holder.to_string());
        Ok(taken == holder)
    }
}

#[async_trait]
impl Quotas for Memory {
    async fn active_runs(&self, tenant: &str, limit: u32, now_ms: i64) -> Result<u32, StoreError> {
        let st = self.state();
        let live = st
            .active_runs
            .iter()
            .filter(|((t, _), until)| t == tenant && **until > now_ms)
            .take(limit as usize)
            .count();
        Ok(u32::try_from(live).unwrap_or(limit))
    }

    async fn run_ended(&self, tenant: &str, run_id: &str) -> Result<(), StoreError> {
        self.state()
            .active_runs
            .remove(&(tenant.to_string(), run_id.to_string()));
        Ok(())
    }

    async fn take_poll_slot(
        &self,
        tenant: &str,
        limit: u32,
        holder: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Option<u32>, StoreError> {
        let mut st = self.state();
        let free = (0..limit).find(|i| {
            st.poll_slots
                .get(&(tenant.to_string(), *i))
                .is_none_or(|(_, until)| *until <= now_ms)
        });
        if let Some(i) = free {
            st.poll_slots
                .insert((tenant.to_string(), i), (holder.to_string(), until_ms));
        }
        Ok(free)
    }

    async fn release_poll_slot(
        &self,
        tenant: &str,
        slot: u32,
        holder: &str,
    ) -> Result<(), StoreError> {
        let mut st = self.state();
        let key = (tenant.to_string(), slot);
        if st.poll_slots.get(&key).is_some_and(|(h, _)| h == holder) {
            st.poll_slots.remove(&key);
        }
        Ok(())
    }
}
