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
//! [`tool_result`] applies a sandbox's answer; [`children`] plans the
//! children of `delegate`/`plan` calls and waits for them; [`child_end`]
//! notes children's ends on their parent (in the parent's FIFO group);
//! [`commit`] ends the step (wait, complete, fail) with one fenced commit
//! and what follows.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures::future::BoxFuture;
use tracing::Instrument;

use armada_core::adapters::calls::on_behalf;
use armada_core::batch::{process_batch, BatchPolicy, Outcome};
use armada_core::error::StoreError;
use armada_core::Services;
use armada_domain::messages::HarnessMessage;
use armada_domain::run::{IllegalTransition, Run};
use armada_domain::step::StepRefused;

mod approvals;
mod child_end;
mod children;
mod claim;
mod commit;
mod program;
mod step;
mod tool_result;

pub use armada_core::faults::{Aborted, FaultPoint};

/// Where tests act inside a step (a worker dying, a worker stalling until
/// it is superseded). Production uses [`NoHooks`]. The named fault points
/// are met through [`Services::faults`](armada_core::Services).
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
    /// The domain refused a move (a bug, or a message that cannot fit the
    /// Run): logged with the Run, counted, and the message dropped, since
    /// no retry can make it legal.
    Illegal(String),
    Aborted(Aborted),
}

impl From<IllegalTransition> for StepError {
    fn from(e: IllegalTransition) -> Self {
        StepError::Illegal(e.to_string())
    }
}

impl From<StepRefused> for StepError {
    fn from(e: StepRefused) -> Self {
        StepError::Illegal(e.to_string())
    }
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
        let ends = BatchEnds::of(&event);
        let policy = BatchPolicy {
            retry_base_s: self.svc.cfg.retry_base_seconds,
            keep_hidden_s: Some(self.svc.cfg.harness_hide_s()),
            visibility_s: self.svc.cfg.harness_visibility_s,
            // At once: a step's model call outlasts the first second (and
            // the scripted model's does not), and a step is the work
            // most worth getting back soon.
            shorten_after: std::time::Duration::ZERO,
        };
        let resp = process_batch(event, self.svc.queues.as_ref(), policy, |msg| async {
            // Once the invocation has died, it handles nothing more.
            if aborted.lock().map(|a| a.is_some()).unwrap_or(true) {
                return Outcome::Abandoned;
            }
            match self.handle_record(msg, &ends).await {
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

    fn count_fenced(&self) {
        self.svc
            .counters
            .fenced_commits
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!("commit rejected: a newer epoch owns the run; work discarded");
    }

    async fn handle_record(&self, msg: SqsMessage, ends: &BatchEnds) -> Result<Outcome, Aborted> {
        let body = msg.body.unwrap_or_default();
        let parsed: HarnessMessage = match serde_json::from_str(&body) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %e, "malformed harness message dropped");
                return Ok(Outcome::Done);
            }
        };
        // The step a message carries on, should its work be fenced.
        let carries = match &parsed {
            HarnessMessage::Step { run_id, step, .. }
            | HarnessMessage::SandboxHanded { run_id, step, .. } => Some((run_id.clone(), *step)),
            _ => None,
        };
        let result = match parsed {
            HarnessMessage::Step {
                run_id,
                tenant,
                step,
                ..
            } => {
                let span = tracing::info_span!("step", %run_id, %tenant, step);
                let work = self.step(&run_id, &tenant, step).instrument(span);
                on_behalf(Some(&run_id), work).await
            }
            HarnessMessage::SandboxHanded {
                run_id,
                tenant,
                step,
                ..
            } => {
                // The step goes on as a redelivery of it would.
                let span = tracing::info_span!("sandbox_handed", %run_id, %tenant, step);
                let work = self.step(&run_id, &tenant, step).instrument(span);
                on_behalf(Some(&run_id), work).await
            }
            HarnessMessage::ChildEnded {
                run_id,
                tenant,
                child_run_id,
            } => {
                // The first end of a parent in this batch notes them all
                // (its group's messages come in order, one after another).
                let Some(batch) = ends.take(&run_id, &child_run_id) else {
                    return Ok(Outcome::Done);
                };
                let span =
                    tracing::info_span!("child_ended", %run_id, %tenant, children = batch.len());
                let work = self
                    .note_child_ends(&run_id, &tenant, &batch)
                    .instrument(span);
                let result = on_behalf(Some(&run_id), work).await;
                if result.is_err() {
                    ends.give_back(&run_id, batch);
                }
                result
            }
            HarnessMessage::ApprovalDecided {
                run_id,
                tenant,
                approval_id,
            } => {
                let span = tracing::info_span!("approval_decided", %run_id, %tenant, %approval_id);
                let work = self
                    .approval_decided(&run_id, &tenant, &approval_id)
                    .instrument(span);
                on_behalf(Some(&run_id), work).await
            }
            HarnessMessage::ToolResult {
                run_id,
                tenant,
                step,
                call_id,
                attempt,
                body,
                seal,
            } => {
                let span = tracing::info_span!("tool_result", %run_id, %tenant, step, %call_id);
                let work = self
                    .tool_result(&run_id, &tenant, step, &call_id, attempt, body, seal)
                    .instrument(span);
                on_behalf(Some(&run_id), work).await
            }
        };
        let result = match (result, carries) {
            // Fenced by a newer claim: this message may still be all that
            // carries the step on.
            (Err(StepError::Fenced), Some((run_id, step))) => {
                self.count_fenced();
                self.rejudge(&run_id, step, "the worker that fenced this one")
                    .await
            }
            (result, _) => result,
        };
        match result {
            Ok(()) => Ok(Outcome::Done),
            Err(StepError::Retry(reason)) => Ok(Outcome::retry(reason)),
            Err(StepError::Busy { reason, until_s }) => Ok(Outcome::Retry {
                reason,
                min_delay_s: until_s,
            }),
            Err(StepError::Fenced) => {
                self.count_fenced();
                Ok(Outcome::Done)
            }
            Err(StepError::Illegal(why)) => {
                self.svc
                    .counters
                    .illegal_transitions
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(%why, "illegal transition refused; message dropped");
                Ok(Outcome::Done)
            }
            Err(StepError::Aborted(a)) => Err(a),
        }
    }
}

/// The children's ends in one batch, by parent: the first message of a
/// parent's group takes them all, the rest find theirs taken.
#[derive(Debug, Default)]
struct BatchEnds(std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>);

impl BatchEnds {
    fn of(event: &SqsEvent) -> BatchEnds {
        let mut by_parent: std::collections::HashMap<String, Vec<String>> = Default::default();
        for r in &event.records {
            let parsed = r
                .body
                .as_deref()
                .and_then(|b| serde_json::from_str::<HarnessMessage>(b).ok());
            if let Some(HarnessMessage::ChildEnded {
                run_id,
                child_run_id,
                ..
            }) = parsed
            {
                by_parent.entry(run_id).or_default().push(child_run_id);
            }
        }
        BatchEnds(std::sync::Mutex::new(by_parent))
    }

    /// The parent's ends not taken yet, if `child` is among them.
    fn take(&self, parent: &str, child: &str) -> Option<Vec<String>> {
        let mut map = self.0.lock().ok()?;
        let pending = map.get(parent)?;
        if !pending.iter().any(|c| c == child) {
            return None;
        }
        map.remove(parent)
    }

    /// Ends whose note failed: their messages come back and take them again.
    fn give_back(&self, parent: &str, children: Vec<String>) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(parent.to_string(), children);
        }
    }
}

#[cfg(test)]
mod tests;
