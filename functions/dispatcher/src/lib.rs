//! T2 dispatcher: turns accepted requests into running Runs and settles Runs
//! that reached a terminal state. It keeps no state in memory.
//!
//! - `StartRun`: a direct Run gets its first harness step; a session Run
//!   starts only when every earlier message of its session has ended.
//! - `RunTerminal`: lets go of the tenant's marker of an active Run,
//!   advances the session (starting the next queued message), then closes
//!   the Run (`CLOSED_*`).
//! - `CheckRun`: the watchdog of a waiting Run: its deadline; for a Run
//!   waiting on a sandbox, its sandbox's start timeout and calls whose
//!   sandbox died.
//! - `RenewCredentials`: a sandbox agent's new AWS credentials, sent to
//!   its hand queue, in [`credentials`].
//! - `SpawnChildren`, and children's ends on `RunTerminal`: collaboration
//!   (fan-out expansion, starting children within `max_parallel`, the
//!   parent's counter and round 2, cancelling a parent's children), in
//!   [`children`].
//! - Dead letters (from either DLQ): the Run whose message kept failing is
//!   failed with the reason, so no Run stays non-terminal forever.
//!
//! Settling a Run also lets go of its agent's sandbox and wakes the next
//! Run waiting for it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use tracing::Instrument;

use armada_core::adapters::calls::on_behalf;
use armada_core::batch::{process_batch, receive_count, source_queue, BatchPolicy, Outcome};
use armada_core::error::StoreError;
use armada_core::services::ending::{self, Ended};
use armada_core::Services;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::{EndNote, IllegalTransition, Run, RunEvent};
use armada_domain::sandbox::credentials::Renewal;
use watchdog::WatchCheck;

#[derive(Debug, Clone)]
pub struct Dispatcher {
    svc: Arc<Services>,
}

/// Why handling a message failed in a way worth retrying: the record is
/// delivered again after a backoff.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<DispatchError> for Outcome {
    fn from(e: DispatchError) -> Outcome {
        Outcome::retry(e.to_string())
    }
}

/// What handling a message came to, or why it is to be retried.
type Handled = Result<Outcome, DispatchError>;

impl Dispatcher {
    pub fn new(svc: Arc<Services>) -> Self {
        Dispatcher { svc }
    }

    pub async fn handle_event(&self, event: SqsEvent) -> SqsBatchResponse {
        // Its records stay hidden while it works on them (a heartbeat), so
        // its queues' visibility can be short: a record of an invocation
        // that died comes back within it, not after six timeouts.
        let policy = BatchPolicy {
            retry_base_s: self.svc.cfg.retry_base_seconds,
            keep_hidden_s: Some(self.svc.cfg.dispatch_hide_s()),
            visibility_s: self.svc.cfg.dispatch_visibility_s,
            // Most of its records are done within a second: those cost no
            // call to shorten.
            shorten_after: std::time::Duration::from_secs(1),
        };
        process_batch(event, self.svc.queues.as_ref(), policy, |msg| {
            self.handle_record(msg)
        })
        .await
    }

    async fn handle_record(&self, msg: SqsMessage) -> Outcome {
        let queue = source_queue(&msg);
        let receives = receive_count(&msg);
        let message_id = msg.message_id.clone().unwrap_or_default();
        let body = msg.body.unwrap_or_default();
        if !self.svc.cfg.alarms.queue.is_empty() && queue == self.svc.cfg.alarms.queue {
            return self.alarm(&body).await.unwrap_or_else(Outcome::from);
        }
        if !self.svc.cfg.inbox.queue.is_empty() && queue == self.svc.cfg.inbox.queue {
            return match armada_core::services::inbox::receive(&self.svc, &body).await {
                Ok(()) => Outcome::Done,
                Err(e) => Outcome::from(DispatchError::from(e)),
            };
        }
        if self.svc.queues.is_dead_letter_queue(&queue) {
            return self
                .dead_letter(&queue, &body, receives)
                .await
                .unwrap_or_else(Outcome::from);
        }
        let parsed: DispatchMessage = match serde_json::from_str(&body) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %e, "malformed dispatch message dropped");
                return Outcome::Done;
            }
        };
        let subject = parsed.subject().to_string();
        let sealed = parsed.sealed_by_control_plane(&self.svc.cfg.callback_signing_secret);
        let span = tracing::info_span!("dispatch", %subject);
        let work = async {
            match parsed {
                DispatchMessage::StartRun { run_id, tenant } => self.start(&run_id, &tenant).await,
                DispatchMessage::RunTerminal { run_id, tenant } => {
                    self.settle(&run_id, &tenant).await
                }
                DispatchMessage::CheckRun {
                    run_id,
                    tenant,
                    step,
                    epoch,
                    n,
                } => {
                    let check = WatchCheck {
                        run_id: &run_id,
                        tenant: &tenant,
                        step,
                        epoch,
                        n,
                        message_id: &message_id,
                    };
                    self.check_run(&check).await
                }
                DispatchMessage::SpawnChildren {
                    run_id,
                    tenant,
                    round,
                } => self.spawn_children(&run_id, &tenant, round).await,
                DispatchMessage::NotifyApproval {
                    approval_id,
                    tenant,
                    recipient,
                    ..
                } => {
                    if !sealed {
                        self.svc.counters.forged_drops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::error!(security = true, %approval_id, %tenant, "an approval notice not sealed by the control plane was dropped");
                        return Ok(Outcome::Done);
                    }
                    self.notify(&approval_id, &tenant, &recipient).await
                }
                DispatchMessage::FireSchedule {
                    schedule_id,
                    tenant,
                    scheduled_at,
                    ..
                } => {
                    if !sealed {
                        self.svc.counters.forged_drops.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(security = true, %schedule_id, %tenant, "a schedule's firing not sealed by the control plane was dropped");
                        return Ok(Outcome::Done);
                    }
                    self.fire_schedule(&schedule_id, &tenant, &scheduled_at)
                        .await
                }
                DispatchMessage::DeliverCallback {
                    run_id,
                    tenant,
                    chain,
                    ..
                } => {
                    if !sealed {
                        self.svc.counters.forged_drops.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(security = true, %run_id, %tenant, "a callback delivery not sealed by the control plane was dropped");
                        return Ok(Outcome::Done);
                    }
                    self.deliver_callback(&run_id, &tenant, chain, receives)
                        .await
                }
                DispatchMessage::SendReply { run_id, tenant, .. } => {
                    if !sealed {
                        self.svc.counters.forged_drops.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(security = true, %run_id, %tenant, "a mail reply not sealed by the control plane was dropped");
                        return Ok(Outcome::Done);
                    }
                    self.send_reply(&run_id, &tenant).await
                }
                DispatchMessage::RenewCredentials {
                    tenant,
                    agent,
                    generation,
                    requested_at_ms,
                    seal,
                } => {
                    let req = Renewal {
                        tenant: &tenant,
                        agent: &agent,
                        generation,
                        requested_at_ms,
                    };
                    self.renew_credentials(&req, &seal).await
                }
            }
        }
        .instrument(span);
        on_behalf(Some(&subject), work)
            .await
            .unwrap_or_else(Outcome::from)
    }

    async fn load(&self, run_id: &str, tenant: &str) -> Result<Option<Run>, StoreError> {
        match self.svc.runs.get(run_id).await? {
            Some(r) if r.tenant == tenant => Ok(Some(r)),
            Some(r) => {
                tracing::error!(run_id, tenant, owner = %r.tenant, "security: message tenant does not own the run; dropped");
                Ok(None)
            }
            None => {
                tracing::warn!(run_id, "message for an unknown run dropped");
                Ok(None)
            }
        }
    }

    /// Ends a Run from outside the harness ([`ending::end_from_outside`]).
    /// The machine's one action on an end, announcing it, is the
    /// dispatcher's own: the caller settles the Run next.
    async fn end_from_outside(
        &self,
        run: Run,
        event: RunEvent,
        note: EndNote,
    ) -> Result<Result<Ended, IllegalTransition>, StoreError> {
        ending::end_from_outside(&self.svc, run, event, note).await
    }

    /// A move the domain refused: logged with the Run and counted, and the
    /// message dropped (retrying cannot make it legal).
    fn illegal(&self, run_id: &str, e: &IllegalTransition) -> Outcome {
        self.svc
            .counters
            .illegal_transitions
            .fetch_add(1, Ordering::Relaxed);
        tracing::error!(run_id, error = %e, "illegal transition refused; message dropped");
        Outcome::Done
    }
}

mod alarms;
mod approvals;
mod callbacks;
mod chains;
mod children;
mod credentials;
mod dead_letter;
mod replies;
mod schedules;
mod settle;
mod start;
mod watchdog;

#[cfg(test)]
mod approval_tests;
#[cfg(test)]
mod callback_tests;
#[cfg(test)]
mod collab_tests;
#[cfg(test)]
mod mail_tests;
#[cfg(test)]
mod schedule_tests;
#[cfg(test)]
mod test_stack;
#[cfg(test)]
mod tests;
