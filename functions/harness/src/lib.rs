//! T3 harness: executes exactly one step of one Run per message.
//!
//! claim (lease + epoch) → load agent, history, transcript → assemble context
//! → call the model → record the requested tool calls (fenced) → run inline
//! skills → fenced commit → next message. A message for a step that is done,
//! a Run that is terminal, or a step someone else holds is judged against the
//! Run record, so at-least-once delivery has exactly one effect.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures::future::BoxFuture;
use serde_json::{json, Value};
use tracing::Instrument;

use armada_core::error::StoreError;
use armada_core::sandboxing::{self, SandboxError};
use armada_core::sqs::{process_batch, BatchPolicy, Outcome};
use armada_core::Services;
use armada_domain::agent::{AgentDefinition, Provisioning};
use armada_domain::chat::{ChatMessage, ModelReply, Role, ToolCall};
use armada_domain::context::{self, HistoryTurn};
use armada_domain::ledger::{self, Recovery, ToolCallRecord, ToolCallState};
use armada_domain::messages::{DispatchMessage, HarnessMessage, ResultBody};
use armada_domain::run::{
    clip, Delivery, Payload, Run, RunAction, RunError, RunEvent, RunEventRecord, Stamp,
};
use armada_domain::sandbox::hand::{
    codes, error_json, CallOutcome, Invocation, SANDBOX_LOST, SECURITY_VIOLATION,
};
use armada_domain::sandbox::lifecycle::{sandbox_key, Acquired};
use armada_domain::session;
use armada_domain::skills;

/// Event payloads are previews: the full text is on the Run (or in S3).
const EVENT_PREVIEW_BYTES: usize = 8 * 1024;
/// A tool result kept whole in the ledger (the Run's item); larger ones are
/// whole in their `tool_result` event only.
const LEDGER_RESULT_BYTES: usize = 4 * 1024;
/// Attempts of a call whose sandbox died before it started.
const MAX_SANDBOX_ATTEMPTS: u32 = 3;

/// A tool result as its event (and so the model) keeps it: whole up to
/// 64 KiB of JSON, else the start of it, marked truncated. Events are items
/// of at most 400 KB, and a model's context is smaller still.
const EVENT_RESULT_BYTES: usize = 64 * 1024;

fn event_result(result: &Value) -> Value {
    let text = result.to_string();
    if text.len() <= EVENT_RESULT_BYTES {
        return result.clone();
    }
    let (preview, _) = clip(&text, EVENT_RESULT_BYTES);
    json!({"truncated": true, "bytes": text.len(), "preview": preview})
}

/// The ledger keeps small results whole and a note for large ones.
fn ledger_copy(result: &Value) -> Value {
    let text = result.to_string();
    if text.len() <= LEDGER_RESULT_BYTES {
        result.clone()
    } else {
        json!({"bytes": text.len(), "note": "the whole result is in the run's tool_result event"})
    }
}

/// A sandbox call that may be sent again: its next attempt is planned.
fn plan_again(
    run: &mut Run,
    rec: &ToolCallRecord,
    reason: &str,
    events: &mut Vec<RunEventRecord>,
    now: i64,
) {
    if let Some(r) = run.ledger.get_mut(&rec.call_id) {
        r.attempt += 1;
        r.state = ToolCallState::Planned;
    }
    events.push(run.push_event(
        "tool_retried",
        json!({"call_id": rec.call_id, "name": rec.skill, "reason": reason, "attempt": rec.attempt + 1}),
        now,
    ));
}

/// A call's timeout: the skill's manifest, capped by the sandbox's limit.
fn call_timeout(agent: &AgentDefinition, skill: &str) -> u32 {
    let manifest = agent
        .manifest(skill)
        .map_or(agent.sandbox.limits.call_timeout_s, |m| m.timeout_s);
    manifest.min(agent.sandbox.limits.call_timeout_s)
}

/// The built-in that executes a skill's calls.
fn executor(agent: &AgentDefinition, skill: &str) -> String {
    agent
        .manifest(skill)
        .map_or_else(|| skill.to_string(), |m| m.executor().to_string())
}

/// Messages dropped as duplicates or overtaken.
pub static STALE_DROPS: AtomicU64 = AtomicU64::new(0);
/// Commits refused because a newer epoch had claimed the Run.
pub static FENCED_COMMITS: AtomicU64 = AtomicU64::new(0);

/// The step was aborted the way a Lambda dies: nothing acknowledged,
/// nothing committed, the lease left to expire.
#[derive(Debug, thiserror::Error)]
#[error("harness step aborted: {0}")]
pub struct Aborted(pub String);

/// Points where tests inject faults into a step (a worker dying, a worker
/// stalling until it is superseded). Production uses [`NoHooks`].
pub trait StepHooks: Send + Sync {
    /// Called after the model answered and before anything is committed.
    fn after_model_call<'a>(&'a self, _run: &'a Run) -> BoxFuture<'a, Result<(), Aborted>> {
        Box::pin(async { Ok(()) })
    }

    /// Called after the step's tools ran and before their results are committed.
    fn after_tools_ran<'a>(&'a self, _run: &'a Run) -> BoxFuture<'a, Result<(), Aborted>> {
        Box::pin(async { Ok(()) })
    }
}

#[derive(Debug, Default)]
pub struct NoHooks;

impl StepHooks for NoHooks {}

pub struct Harness {
    svc: Arc<Services>,
    hooks: Arc<dyn StepHooks>,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness").finish_non_exhaustive()
    }
}

/// Why a step could not finish normally.
#[derive(Debug)]
enum StepError {
    /// Worth redelivering (store or queue unavailable).
    Retry(String),
    /// Another worker holds the step: redeliver after its lease.
    Busy {
        reason: String,
        until_s: u32,
    },
    /// A newer epoch owns the Run: this worker's work is void.
    Fenced,
    Aborted(Aborted),
}

impl From<StoreError> for StepError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict { which: Some(0) } | StoreError::Conflict { which: None } => {
                StepError::Fenced
            }
            other => StepError::Retry(other.to_string()),
        }
    }
}

impl Harness {
    pub fn new(svc: Arc<Services>) -> Self {
        Self::with_hooks(svc, Arc::new(NoHooks))
    }

    pub fn with_hooks(svc: Arc<Services>, hooks: Arc<dyn StepHooks>) -> Self {
        Harness { svc, hooks }
    }

    /// Handles one SQS batch. An `Err` is a function error: Lambda (and the
    /// local poller) then leave the whole batch for redelivery.
    pub async fn handle_event(&self, event: SqsEvent) -> Result<SqsBatchResponse, Aborted> {
        let aborted = std::sync::Mutex::new(None);
        let policy = BatchPolicy {
            retry_base_s: self.svc.cfg.retry_base_seconds,
            keep_hidden_s: Some(self.svc.cfg.harness_visibility_s),
        };
        let resp = process_batch(event, &self.svc.queues, policy, |msg| async {
            // Once the invocation has died, it handles nothing more.
            if aborted.lock().map(|a| a.is_some()).unwrap_or(true) {
                return Outcome::Abandoned;
            }
            match self.handle_record(msg).await {
                Ok(o) => o,
                Err(a) => {
                    if let Ok(mut slot) = aborted.lock() {
                        *slot = Some(a);
                    }
                    Outcome::Abandoned
                }
            }
        })
        .await;
        match aborted.into_inner().ok().flatten() {
            Some(a) => Err(a),
            None => Ok(resp),
        }
    }

    async fn handle_record(&self, msg: SqsMessage) -> Result<Outcome, Aborted> {
        let body = msg.body.unwrap_or_default();
        let parsed: HarnessMessage = match serde_json::from_str(&body) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %e, "malformed harness message dropped");
                return Ok(Outcome::Done);
            }
        };
        let result = match parsed {
            HarnessMessage::Step {
                run_id,
                tenant,
                step,
            } => {
                let span = tracing::info_span!("step", %run_id, %tenant, step);
                self.step(&run_id, &tenant, step).instrument(span).await
            }
            HarnessMessage::ToolResult {
                run_id,
                tenant,
                step,
                call_id,
                attempt,
                body,
            } => {
                let span = tracing::info_span!("tool_result", %run_id, %tenant, step, %call_id);
                self.tool_result(&run_id, &tenant, step, &call_id, attempt, body)
                    .instrument(span)
                    .await
            }
        };
        match result {
            Ok(()) => Ok(Outcome::Done),
            Err(StepError::Retry(reason)) => Ok(Outcome::retry(reason)),
            Err(StepError::Busy { reason, until_s }) => Ok(Outcome::Retry {
                reason,
                min_delay_s: until_s,
            }),
            Err(StepError::Fenced) => {
                FENCED_COMMITS.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("commit rejected: a newer epoch owns the run; work discarded");
                Ok(Outcome::Done)
            }
            Err(StepError::Aborted(a)) => Err(a),
        }
    }

    /// Reads a Run and claims `step` of it, or says why not (`None`: the
    /// message is stale or the Run unknown, and is dropped).
    async fn read(&self, run_id: &str) -> Result<Option<Run>, StepError> {
        let run = self.svc.runs.get(run_id).await?;
        if run.is_none() {
            tracing::warn!(run_id, "message for an unknown run dropped");
        }
        Ok(run)
    }

    async fn claim(
        &self,
        run: Run,
        tenant: &str,
        step: u32,
    ) -> Result<Option<(Run, i64)>, StepError> {
        let svc = &self.svc;
        let run_id = run.run_id.as_str();
        if run.tenant != tenant {
            tracing::error!(run_id, tenant, owner = %run.tenant, "security: message tenant does not own the run; dropped");
            return Ok(None);
        }
        let now = svc.clock.now_ms();
        match run.classify_delivery(step, now) {
            Delivery::Stale { reason } => {
                STALE_DROPS.fetch_add(1, Ordering::Relaxed);
                tracing::info!(run_id, step, current = run.step, state = %run.state, reason = reason.as_str(), "stale message dropped");
                self.resend_followup(&run, now).await?;
                return Ok(None);
            }
            Delivery::LeaseHeld { until_ms } => {
                let left_ms = until_ms - now;
                return Err(StepError::Busy {
                    reason: format!("step {step} is held by another worker for {left_ms} ms"),
                    until_s: ((left_ms + 999) / 1000) as u32,
                });
            }
            Delivery::Claimable => {}
        }
        match svc.runs.claim(&run, now, svc.cfg.step_lease_ms).await {
            Ok(r) => {
                tracing::info!(run_id, step, epoch = r.epoch, "claimed");
                Ok(Some((r, now)))
            }
            Err(StoreError::Conflict { .. }) => {
                STALE_DROPS.fetch_add(1, Ordering::Relaxed);
                tracing::info!(run_id, step, "claim lost to another worker; dropped");
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Gives a claimed step back early when it failed for a retryable reason,
    /// so the redelivery can claim it (fenced: only if still ours).
    async fn give_back(&self, run_id: &str, epoch: u64, result: &Result<(), StepError>) {
        if let Err(StepError::Retry(_)) = result {
            if let Err(e) = self.svc.runs.release(run_id, epoch).await {
                tracing::warn!(run_id, error = %e, "could not release the lease; it will expire");
            }
        }
    }

    async fn step(&self, run_id: &str, tenant: &str, step: u32) -> Result<(), StepError> {
        let Some(run) = self.read(run_id).await? else {
            return Ok(());
        };
        let Some((run, now)) = self.claim(run, tenant, step).await? else {
            return Ok(());
        };
        let epoch = run.epoch;
        let result = tokio::select! {
            result = self.execute(run, now) => result,
            never = self.keep_lease(run_id, epoch) => match never {},
        };
        self.give_back(run_id, epoch, &result).await;
        result
    }

    /// Renews the claimed step's lease every third of it while the step
    /// works, so the lease can be short: a worker that dies stops renewing,
    /// and its Run is claimable again within one lease. Runs until dropped
    /// (the step ended); once the lease is no longer ours it only waits.
    async fn keep_lease(&self, run_id: &str, epoch: u64) -> std::convert::Infallible {
        let lease_ms = self.svc.cfg.step_lease_ms.max(3);
        let every = Duration::from_millis((lease_ms / 3) as u64);
        loop {
            tokio::time::sleep(every).await;
            let until = self.svc.clock.now_ms() + lease_ms;
            match self.svc.runs.renew(run_id, epoch, until).await {
                Ok(true) => tracing::debug!(run_id, epoch, until, "lease renewed"),
                Ok(false) => return futures::future::pending().await,
                Err(e) => {
                    tracing::warn!(run_id, error = %e, "could not renew the lease; trying again")
                }
            }
        }
    }

    /// A sandbox call's outcome arrived.
    async fn tool_result(
        &self,
        run_id: &str,
        tenant: &str,
        step: u32,
        call_id: &str,
        attempt: u32,
        body: ResultBody,
    ) -> Result<(), StepError> {
        let svc = &self.svc;
        let outcome = match body {
            ResultBody::Inline { outcome } => outcome,
            ResultBody::Stored { key } => {
                let text = svc.payloads.get_text(&key).await?;
                serde_json::from_str(&text)
                    .map_err(|e| StepError::Retry(format!("stored outcome {key}: {e}")))?
            }
        };
        // Judge the answer against the ledger before claiming anything.
        let Some(current) = self.read(run_id).await? else {
            return Ok(());
        };
        let fresh = current.ledger.get(call_id).is_some_and(|r| {
            r.sandbox && !r.state.is_settled() && r.attempt == attempt && r.step == step
        });
        if !fresh || current.state.is_terminal() {
            STALE_DROPS.fetch_add(1, Ordering::Relaxed);
            tracing::info!(run_id, call_id, attempt, state = %current.state, "outcome for a settled call, an old attempt or an ended run dropped");
            return Ok(());
        }
        // The answer belongs to the Run as just read: claim that version.
        let Some((mut run, now)) = self.claim(current, tenant, step).await? else {
            return Ok(());
        };
        let epoch = run.epoch;
        let result = async {
            let prev = run.stamp();
            let Some(agent) = self.agent_or_end(&mut run, prev).await? else {
                return Ok(());
            };
            let mut events = Vec::new();
            if let Some(err) = self.apply_outcome(&mut run, call_id, outcome, &mut events, now) {
                return self
                    .finish(&mut run, prev, RunEvent::Failed, Some(err), events)
                    .await;
            }
            self.advance(run, prev, &agent, events).await
        }
        .await;
        self.give_back(run_id, epoch, &result).await;
        result
    }

    /// Records a sandbox call's outcome in the ledger. Returns the error
    /// that ends the Run, if the outcome ends it.
    fn apply_outcome(
        &self,
        run: &mut Run,
        call_id: &str,
        outcome: CallOutcome,
        events: &mut Vec<RunEventRecord>,
        now: i64,
    ) -> Option<RunError> {
        let rec = run.ledger.get(call_id)?.clone();
        let (state, result, ends_run) = match outcome {
            CallOutcome::Finished { result } => {
                let state = if result.get("error").is_some() {
                    ToolCallState::Failed
                } else {
                    ToolCallState::Done
                };
                (state, result, None)
            }
            CallOutcome::NotRun { code, message } => {
                if code == SANDBOX_LOST && rec.attempt < MAX_SANDBOX_ATTEMPTS {
                    // It never ran: safe to send again, to a new sandbox.
                    plan_again(run, &rec, &message, events, now);
                    return None;
                }
                let ends = match code.as_str() {
                    SANDBOX_LOST | codes::SANDBOX_UNAVAILABLE => Some(RunError::new(
                        codes::SANDBOX_UNAVAILABLE,
                        format!("tool call {call_id} could not run: {message}"),
                    )),
                    SECURITY_VIOLATION => {
                        events.push(run.push_event(
                            "security_violation",
                            json!({"call_id": call_id, "message": message}),
                            now,
                        ));
                        Some(RunError::new(SECURITY_VIOLATION, message.clone()))
                    }
                    _ => None,
                };
                (ToolCallState::Failed, error_json(&code, message), ends)
            }
            CallOutcome::Lost { reason } => {
                if ledger::recover(&rec) == Some(Recovery::Redo) {
                    plan_again(run, &rec, &reason, events, now);
                    return None;
                }
                if let Some(r) = run.ledger.get_mut(call_id) {
                    r.state = ToolCallState::Indeterminate;
                }
                events.push(run.push_event(
                    "tool_indeterminate",
                    json!({"call_id": call_id, "name": rec.skill, "reason": reason}),
                    now,
                ));
                return Some(RunError::new(
                    "TOOL_INDETERMINATE",
                    format!(
                        "tool call {call_id} was dispatched but its sandbox was lost ({reason}); it is not idempotent, so it was not repeated"
                    ),
                ));
            }
        };
        if let Some(r) = run.ledger.get_mut(call_id) {
            r.state = state;
            r.result = Some(ledger_copy(&result));
        }
        events.push(run.push_event(
            "tool_result",
            json!({"call_id": call_id, "name": rec.skill, "state": state, "result": event_result(&result)}),
            now,
        ));
        ends_run
    }

    /// The Run's agent; a Run whose agent was deleted ends here.
    async fn agent_or_end(
        &self,
        run: &mut Run,
        prev: Stamp,
    ) -> Result<Option<AgentDefinition>, StepError> {
        if let Some(agent) = self.svc.registry.agent(&run.agent).await? {
            return Ok(Some(agent));
        }
        let err = RunError::new(
            "AGENT_NOT_FOUND",
            format!("agent '{}' no longer exists", run.agent),
        );
        self.finish(run, prev, RunEvent::Failed, Some(err), vec![])
            .await?;
        Ok(None)
    }

    /// The claimed part of a step.
    async fn execute(&self, mut run: Run, now: i64) -> Result<(), StepError> {
        let svc = &self.svc;
        let mut prev = run.stamp();
        if run.past_deadline(now) {
            let err = RunError::new("TIMED_OUT", "the run exceeded its wall-clock budget");
            return self
                .finish(
                    &mut run,
                    prev,
                    RunEvent::DeadlineExceeded,
                    Some(err),
                    vec![],
                )
                .await;
        }
        let Some(agent) = self.agent_or_end(&mut run, prev).await? else {
            return Ok(());
        };
        let mut events = Vec::new();

        // Calls of this step still open: sandbox calls may be waiting (for
        // the sandbox, or for their answer); an inline call left DISPATCHED
        // means a previous worker died before committing its result.
        let pending: Vec<ToolCallRecord> = run
            .ledger
            .values()
            .filter(|r| r.step == run.step && !r.state.is_settled())
            .cloned()
            .collect();
        let fresh = pending.is_empty();
        if fresh {
            // `eager`: the sandbox is there before the first model call.
            if agent.sandbox.provisioning == Provisioning::Eager
                && run.sandbox_key.is_none()
                && agent.uses_sandbox()
            {
                run.sandbox_key = Some(sandbox_key(&run.tenant, &run.agent));
                svc.runs.save(prev, &run, &[], vec![]).await?;
                prev = run.stamp();
            }
            if let Some(wait) = self.eager_wait(&mut run, &agent, now).await? {
                events.push(wait);
                return self.wait(run, prev, events).await;
            }
            if run.usage.model_turns >= run.budgets.max_model_turns {
                let err = RunError::new(
                    "BUDGET_EXCEEDED",
                    format!(
                        "the run used its {} model turns",
                        run.budgets.max_model_turns
                    ),
                );
                return self
                    .finish(&mut run, prev, RunEvent::Failed, Some(err), vec![])
                    .await;
            }
            let input = match &run.input {
                Payload::Inline { text } => text.clone(),
                Payload::Stored { key, .. } => svc.payloads.get_text(key).await?,
            };
            let history = match &run.session_id {
                Some(sid) => svc.sessions.history(sid).await?,
                None => vec![],
            };
            let log = svc.runs.all_events(&run.run_id).await?;
            let transcript = transcript(&input, &log);
            let assembled = context::assemble(
                &agent.system_prompt,
                &history,
                &transcript,
                agent.model.context_window,
            );
            if let Some(c) = assembled.compaction {
                events.push(run.push_event(
                    "history_compacted",
                    json!({"dropped_turns": c.dropped_turns, "kept_turns": c.kept_turns}),
                    now,
                ));
            }
            let specs: Vec<_> = agent
                .skills
                .iter()
                .filter_map(|s| agent.manifest(s).map(|m| m.tool_spec()))
                .collect();
            let reply = match svc
                .models
                .complete_with_retry(
                    &agent.model,
                    &assembled.messages,
                    &specs,
                    svc.cfg.model_attempts,
                )
                .await
            {
                Ok((reply, attempts)) => {
                    if attempts > 1 {
                        events.push(run.push_event(
                            "model_retried",
                            json!({"attempts": attempts}),
                            now,
                        ));
                    }
                    reply
                }
                Err((e, attempts)) => {
                    let err = RunError::new(
                        "MODEL_ERROR",
                        format!("the model failed after {attempts} attempt(s): {e}"),
                    );
                    return self
                        .finish(&mut run, prev, RunEvent::Failed, Some(err), events)
                        .await;
                }
            };
            self.hooks
                .after_model_call(&run)
                .await
                .map_err(StepError::Aborted)?;
            let now = svc.clock.now_ms();
            run.usage.model_turns += 1;
            run.usage.input_tokens += reply.usage.input_tokens;
            run.usage.output_tokens += reply.usage.output_tokens;
            let (preview, truncated) = clip(&reply.content, EVENT_PREVIEW_BYTES);
            events.push(run.push_event(
                "model_reply",
                json!({"content": preview, "truncated": truncated, "tool_calls": reply.tool_calls}),
                now,
            ));
            if reply.tool_calls.is_empty() {
                return self.complete(&mut run, prev, events, &input, reply).await;
            }
            let total = run.usage.tool_calls as usize + reply.tool_calls.len();
            if total > run.budgets.max_tool_calls as usize {
                let err = RunError::new(
                    "BUDGET_EXCEEDED",
                    format!(
                        "the run would exceed its {} tool calls",
                        run.budgets.max_tool_calls
                    ),
                );
                return self
                    .finish(&mut run, prev, RunEvent::Failed, Some(err), events)
                    .await;
            }
            // Record every call before running any: inline calls as
            // dispatched, sandbox calls as planned (they are dispatched
            // once the sandbox is held).
            for c in &reply.tool_calls {
                let manifest = agent.manifest(&c.name);
                let in_sandbox = manifest.as_ref().is_some_and(|m| m.in_sandbox());
                if in_sandbox {
                    run.sandbox_key = Some(sandbox_key(&run.tenant, &run.agent));
                }
                run.ledger.insert(
                    c.id.clone(),
                    ToolCallRecord {
                        call_id: c.id.clone(),
                        skill: c.name.clone(),
                        args: c.args.clone(),
                        step: run.step,
                        state: if in_sandbox {
                            ToolCallState::Planned
                        } else {
                            ToolCallState::Dispatched
                        },
                        idempotent: manifest
                            .as_ref()
                            .is_some_and(|m| skills::call_is_idempotent(m, &c.args)),
                        result: None,
                        sandbox: in_sandbox,
                        attempt: 1,
                    },
                );
                events.push(run.push_event(
                    "tool_call",
                    json!({"call_id": c.id, "name": c.name, "args": c.args}),
                    now,
                ));
            }
            run.usage.tool_calls += reply.tool_calls.len() as u32;
            run.updated_at_ms = now;
            svc.runs.save(prev, &run, &events, vec![]).await?;
            prev = run.stamp();
            events.clear();
        }

        // Inline calls run here, in the step.
        let inline: Vec<ToolCallRecord> = run
            .ledger
            .values()
            .filter(|r| r.step == run.step && !r.sandbox && !r.state.is_settled())
            .cloned()
            .collect();
        let mut indeterminate = Vec::new();
        for rec in &inline {
            if !fresh && ledger::recover(rec) == Some(Recovery::Indeterminate) {
                indeterminate.push(rec.call_id.clone());
                if let Some(r) = run.ledger.get_mut(&rec.call_id) {
                    r.state = ToolCallState::Indeterminate;
                }
                events.push(run.push_event(
                    "tool_indeterminate",
                    json!({"call_id": rec.call_id, "name": rec.skill}),
                    now,
                ));
            }
        }
        if !indeterminate.is_empty() {
            let err = RunError::new(
                "TOOL_INDETERMINATE",
                format!(
                    "tool calls {} were dispatched but their results were lost; they are not idempotent, so they were not repeated",
                    indeterminate.join(", ")
                ),
            );
            return self
                .finish(&mut run, prev, RunEvent::Failed, Some(err), events)
                .await;
        }
        for rec in &inline {
            let call = ToolCall {
                id: rec.call_id.clone(),
                name: rec.skill.clone(),
                args: rec.args.clone(),
            };
            let outcome = svc.tools.execute(&agent, &call, svc.clock.now_ms()).await;
            let (state, result) = match outcome {
                Ok(v) => (ToolCallState::Done, v),
                Err(f) => (ToolCallState::Failed, f.to_json()),
            };
            if let Some(r) = run.ledger.get_mut(&rec.call_id) {
                r.state = state;
                r.result = Some(ledger_copy(&result));
            }
            events.push(run.push_event(
                "tool_result",
                json!({"call_id": rec.call_id, "name": rec.skill, "state": state, "result": event_result(&result)}),
                svc.clock.now_ms(),
            ));
        }
        self.hooks
            .after_tools_ran(&run)
            .await
            .map_err(StepError::Aborted)?;
        self.advance(run, prev, &agent, events).await
    }

    /// An `eager` agent holds its sandbox before its first model call; the
    /// event to record when the Run has to wait for it.
    async fn eager_wait(
        &self,
        run: &mut Run,
        agent: &AgentDefinition,
        now: i64,
    ) -> Result<Option<RunEventRecord>, StepError> {
        if agent.sandbox.provisioning != Provisioning::Eager || !agent.uses_sandbox() {
            return Ok(None);
        }
        let holding = match sandboxing::acquire(&self.svc, &run.tenant, &run.run_id, agent).await {
            Ok(h) => h,
            Err(SandboxError::Store(e)) => return Err(e.into()),
            // A placement that cannot be met fails when a call needs it.
            Err(SandboxError::Placement(why)) => {
                tracing::warn!(%why, "eager sandbox could not be placed");
                return Ok(None);
            }
        };
        Ok(match holding.acquired {
            Acquired::Held { .. } => None,
            Acquired::Waiting { position } => Some(run.push_event(
                "sandbox_wait",
                json!({"position": position, "holder_run_id": holding.record.holder_run_id}),
                now,
            )),
        })
    }

    /// After a step's inline calls and any sandbox outcome: dispatch the
    /// planned sandbox calls (when the sandbox is held), then either wait
    /// for their answers or go on to the next step.
    async fn advance(
        &self,
        mut run: Run,
        prev: Stamp,
        agent: &AgentDefinition,
        mut events: Vec<RunEventRecord>,
    ) -> Result<(), StepError> {
        let svc = &self.svc;
        let now = svc.clock.now_ms();
        let planned: Vec<ToolCallRecord> = run
            .ledger
            .values()
            .filter(|r| r.step == run.step && r.sandbox && r.state == ToolCallState::Planned)
            .cloned()
            .collect();
        if !planned.is_empty() {
            if agent.destructive() {
                // A read-write sub-path of the user's workspace: every call
                // needs a human's approval (seed 000 §F).
                events.push(run.push_event(
                    "approval_required",
                    json!({
                        "calls": planned.iter().map(|c| &c.call_id).collect::<Vec<_>>(),
                        "reason": "the agent's sandbox mounts a read-write sub-path of the user's workspace: its calls are destructive and need a human's approval",
                    }),
                    now,
                ));
                run.apply(&RunEvent::AwaitApproval, now)
                    .map_err(|e| StepError::Retry(e.to_string()))?;
                run.lease_until_ms = 0;
                svc.runs.save(prev, &run, &events, vec![]).await?;
                return self.check_later(&run).await;
            }
            let holding = match sandboxing::acquire(svc, &run.tenant, &run.run_id, agent).await {
                Ok(h) => h,
                Err(SandboxError::Store(e)) => return Err(e.into()),
                Err(SandboxError::Placement(why)) => {
                    let err = RunError::new(codes::SANDBOX_UNAVAILABLE, why);
                    let mut run = run;
                    return self
                        .finish(&mut run, prev, RunEvent::Failed, Some(err), events)
                        .await;
                }
            };
            match holding.acquired {
                Acquired::Held { .. } => {
                    let rec = &holding.record;
                    for c in &planned {
                        let inv = Invocation {
                            run_id: run.run_id.clone(),
                            tenant: run.tenant.clone(),
                            agent: run.agent.clone(),
                            generation: rec.generation,
                            step: run.step,
                            call_id: c.call_id.clone(),
                            attempt: c.attempt,
                            skill: executor(agent, &c.skill),
                            args: c.args.clone(),
                            timeout_s: call_timeout(agent, &c.skill),
                        };
                        sandboxing::dispatch(svc, rec, &inv)
                            .await
                            .map_err(|e| StepError::Retry(e.to_string()))?;
                        if let Some(r) = run.ledger.get_mut(&c.call_id) {
                            r.state = ToolCallState::Dispatched;
                            r.result = Some(json!({"generation": rec.generation}));
                        }
                        events.push(run.push_event(
                            "tool_dispatched",
                            json!({"call_id": c.call_id, "name": c.skill, "attempt": c.attempt, "sandbox": rec.key(), "generation": rec.generation}),
                            now,
                        ));
                    }
                }
                Acquired::Waiting { position } => {
                    events.push(run.push_event(
                        "sandbox_wait",
                        json!({"position": position, "holder_run_id": holding.record.holder_run_id}),
                        now,
                    ));
                }
            }
        }
        let open = run
            .ledger
            .values()
            .any(|r| r.step == run.step && !r.state.is_settled());
        if open {
            return self.wait(run, prev, events).await;
        }
        let actions = run
            .apply(&RunEvent::StepContinues, now)
            .map_err(|e| StepError::Retry(e.to_string()))?;
        run.step += 1;
        run.lease_until_ms = 0;
        svc.runs.save(prev, &run, &events, vec![]).await?;
        self.carry_out(&run, &actions).await
    }

    /// The Run waits for its sandbox: AWAITING_TOOL, with a watchdog.
    async fn wait(
        &self,
        mut run: Run,
        prev: Stamp,
        events: Vec<RunEventRecord>,
    ) -> Result<(), StepError> {
        let now = self.svc.clock.now_ms();
        run.apply(&RunEvent::AwaitTool, now)
            .map_err(|e| StepError::Retry(e.to_string()))?;
        run.lease_until_ms = 0;
        self.svc.runs.save(prev, &run, &events, vec![]).await?;
        self.check_later(&run).await
    }

    /// Asks the dispatcher to check on a waiting Run after a while.
    async fn check_later(&self, run: &Run) -> Result<(), StepError> {
        self.svc
            .queues
            .send_dispatch_delayed(
                &DispatchMessage::CheckRun {
                    run_id: run.run_id.clone(),
                    tenant: run.tenant.clone(),
                    step: run.step,
                    epoch: run.epoch,
                },
                self.svc.cfg.sandbox.check_seconds,
            )
            .await
            .map_err(|e| StepError::Retry(format!("watchdog not scheduled: {e}")))
    }

    async fn complete(
        &self,
        run: &mut Run,
        prev: Stamp,
        mut events: Vec<RunEventRecord>,
        input: &str,
        reply: ModelReply,
    ) -> Result<(), StepError> {
        let now = self.svc.clock.now_ms();
        let actions = run
            .apply(&RunEvent::Answered, now)
            .map_err(|e| StepError::Retry(e.to_string()))?;
        let svc = &self.svc;
        let key = format!("outputs/{}/{}", run.tenant, run.run_id);
        run.output = Some(
            svc.payloads
                .spill(&key, &reply.content, svc.cfg.inline_limit_bytes)
                .await?,
        );
        run.lease_until_ms = 0;
        let (preview, truncated) = clip(&reply.content, EVENT_PREVIEW_BYTES);
        events.push(run.push_event(
            "run_completed",
            json!({"output": preview, "truncated": truncated}),
            now,
        ));
        let mut extra = Vec::new();
        if let (Some(sid), Some(seq)) = (&run.session_id, run.session_seq) {
            let (user_turn, assistant_turn) = session::turn_numbers(seq);
            let turn = |role, content: &str| HistoryTurn {
                role,
                content: content.to_string(),
                run_id: run.run_id.clone(),
            };
            extra.push(
                svc.sessions
                    .turn_put(sid, user_turn, &turn(Role::User, input))
                    .await?,
            );
            extra.push(
                svc.sessions
                    .turn_put(sid, assistant_turn, &turn(Role::Assistant, &reply.content))
                    .await?,
            );
        }
        self.svc.runs.save(prev, run, &events, extra).await?;
        tracing::info!(run_id = %run.run_id, epoch = run.epoch, "run completed");
        self.carry_out(run, &actions).await
    }

    /// Ends the Run in a terminal state other than COMPLETED.
    async fn finish(
        &self,
        run: &mut Run,
        prev: Stamp,
        event: RunEvent,
        error: Option<RunError>,
        mut events: Vec<RunEventRecord>,
    ) -> Result<(), StepError> {
        let now = self.svc.clock.now_ms();
        let actions = run
            .apply(&event, now)
            .map_err(|e| StepError::Retry(e.to_string()))?;
        run.lease_until_ms = 0;
        let kind = match run.state {
            armada_domain::run::RunState::TimedOut => "run_timed_out",
            _ => "run_failed",
        };
        events.push(run.push_event(kind, json!({"error": error}), now));
        run.error = error;
        self.svc.runs.save(prev, run, &events, vec![]).await?;
        tracing::warn!(run_id = %run.run_id, state = %run.state, error = ?run.error, "run ended");
        self.carry_out(run, &actions).await
    }

    async fn carry_out(&self, run: &Run, actions: &[RunAction]) -> Result<(), StepError> {
        for a in actions {
            match a {
                RunAction::EnqueueNextStep => self
                    .svc
                    .queues
                    .send_harness(&HarnessMessage::Step {
                        run_id: run.run_id.clone(),
                        tenant: run.tenant.clone(),
                        step: run.step,
                    })
                    .await
                    .map_err(|e| StepError::Retry(format!("next step not queued: {e}")))?,
                RunAction::AnnounceTerminal => self
                    .svc
                    .queues
                    .send_dispatch(&DispatchMessage::RunTerminal {
                        run_id: run.run_id.clone(),
                        tenant: run.tenant.clone(),
                    })
                    .await
                    .map_err(|e| StepError::Retry(format!("terminal state not announced: {e}")))?,
            }
        }
        Ok(())
    }

    /// A stale message may be the redelivery of a step whose commit landed
    /// but whose follow-up message was lost: send the follow-up again (the
    /// FIFO deduplication id and the claim make a second copy harmless).
    async fn resend_followup(&self, run: &Run, now: i64) -> Result<(), StepError> {
        if run.state.is_active() && run.lease_until_ms <= now {
            self.carry_out(run, &[RunAction::EnqueueNextStep]).await
        } else if run.state.is_terminal() && !run.state.is_closed() {
            self.carry_out(run, &[RunAction::AnnounceTerminal]).await
        } else {
            Ok(())
        }
    }
}

/// The Run's own conversation so far: its input, then every tool round.
pub fn transcript(input: &str, log: &[RunEventRecord]) -> Vec<ChatMessage> {
    let mut msgs = vec![ChatMessage::text(Role::User, input)];
    for ev in log {
        match ev.kind.as_str() {
            "model_reply" => {
                let calls: Vec<ToolCall> = ev
                    .data
                    .get("tool_calls")
                    .cloned()
                    .and_then(|v| serde_json::from_value(v).ok())
                    .unwrap_or_default();
                if calls.is_empty() {
                    continue;
                }
                msgs.push(ChatMessage {
                    role: Role::Assistant,
                    content: ev
                        .data
                        .get("content")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    tool_calls: calls,
                    tool_call_id: None,
                    name: None,
                });
            }
            "tool_result" => {
                let call = ToolCall {
                    id: ev
                        .data
                        .get("call_id")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    name: ev
                        .data
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    args: json!({}),
                };
                let result = ev.data.get("result").cloned().unwrap_or(Value::Null);
                msgs.push(ChatMessage::tool_result(&call, result.to_string()));
            }
            _ => {}
        }
    }
    msgs
}
