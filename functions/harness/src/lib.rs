//! T3 harness: executes exactly one step of one Run per message.
//!
//! claim (lease + epoch) → load agent, history, transcript → assemble context
//! → call the model → record the requested tool calls (fenced) → run inline
//! skills → fenced commit → next message. A message for a step that is done,
//! a Run that is terminal, or a step someone else holds is judged against the
//! Run record, so at-least-once delivery has exactly one effect.
//!
//! Layout, by phase: this file takes the SQS batch and routes each record;
//! [`claim`] judges the delivery and claims the step (and keeps its lease);
//! [`step`] does the step's work (model, ledger, inline and sandbox calls);
//! [`tool_result`] applies a sandbox's answer; [`commit`] ends the step
//! (wait, complete, fail) with one fenced commit and what follows it.

use std::sync::atomic::Ordering;
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

mod claim;
mod commit;
mod step;
mod tool_result;

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
                self.svc
                    .counters
                    .fenced_commits
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!("commit rejected: a newer epoch owns the run; work discarded");
                Ok(Outcome::Done)
            }
            Err(StepError::Aborted(a)) => Err(a),
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
