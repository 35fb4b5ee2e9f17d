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
use serde_json::json;
use tracing::Instrument;

use armada_core::calls::on_behalf;
use armada_core::cas::{until_written, Try};
use armada_core::ending::{self, Ended};
use armada_core::error::StoreError;
use armada_core::sandboxing::{self};
use armada_core::sqs::{process_batch, receive_count, source_queue, BatchPolicy, Outcome};
use armada_core::unreadable::{self, Ending};
use armada_core::Services;
use armada_domain::api::Delivery;
use armada_domain::messages::{DispatchMessage, HarnessMessage};
use armada_domain::run::{
    IllegalTransition, Run, RunError, RunEvent, RunEventRecord, RunState, Stamp,
};
use armada_domain::sandbox::credentials::Renewal;

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
        // The dispatch queue's visibility outlasts a whole batch (6x the
        // function's timeout), so its records need no heartbeat.
        let policy = BatchPolicy {
            retry_base_s: self.svc.cfg.retry_base_seconds,
            keep_hidden_s: None,
        };
        process_batch(event, self.svc.queues.as_ref(), policy, |msg| {
            self.handle_record(msg)
        })
        .await
    }

    async fn handle_record(&self, msg: SqsMessage) -> Outcome {
        let queue = source_queue(&msg);
        let receives = receive_count(&msg);
        let body = msg.body.unwrap_or_default();
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
                } => self.check_run(&run_id, &tenant, step, epoch).await,
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

    async fn start(&self, run_id: &str, tenant: &str) -> Handled {
        let Some(run) = self.load(run_id, tenant).await? else {
            return Ok(Outcome::Done);
        };
        if run.state == RunState::AwaitingChildren && Self::fans_out(&run) {
            // A start retried after its expansion committed: the spawn
            // that may not have happened is safe to do again.
            return self.spawn_children(run_id, tenant, 1).await;
        }
        if run.state != RunState::Pending {
            tracing::info!(run_id, state = %run.state, "already started; duplicate dropped");
            return Ok(Outcome::Done);
        }
        if !self.parent_still_waits(&run).await? {
            return self.cancel_orphan(run).await;
        }
        if Self::fans_out(&run) {
            return self.expand(run).await;
        }
        if run.prewarm_sandbox {
            // A resident agent: its sandbox is made warm now, not at the
            // first call. A failure here only costs the warm start.
            if let Ok(Some(agent)) = self.svc.registry.agent(&run.agent).await {
                if let Err(e) = sandboxing::prewarm(&self.svc, &run.tenant, &agent).await {
                    tracing::warn!(run_id, error = %e, "could not prewarm the sandbox");
                }
            }
        }
        match &run.session_id {
            Some(sid) => self.advance_session(sid, &run).await,
            None => self.send_first_step(&run).await,
        }
    }

    async fn send_first_step(&self, run: &Run) -> Handled {
        self.svc
            .queues
            .send_harness(&HarnessMessage::Step {
                run_id: run.run_id.clone(),
                tenant: run.tenant.clone(),
                step: 0,
            })
            .await?;
        tracing::info!(run_id = %run.run_id, "run started");
        Ok(Outcome::Done)
    }

    /// Passes over ended messages at the head of the session and starts the
    /// first one still PENDING. Safe to repeat: it only moves forward, with
    /// conditional writes, and a second start of the same Run is dropped by
    /// the harness.
    ///
    /// `known` is a Run of this session the caller has just read; it is not
    /// read again when it is the head.
    async fn advance_session(&self, session_id: &str, known: &Run) -> Handled {
        let Some(mut h) = self.svc.sessions.header(session_id).await? else {
            tracing::error!(session_id, "session of a run is missing");
            return Ok(Outcome::Done);
        };
        // Whether `h.next_seq` is as read (not carried over a local update).
        let mut fresh = true;
        for _ in 0..1000 {
            let next = h.done_seq + 1;
            if next > h.next_seq {
                if fresh {
                    return Ok(Outcome::Done);
                }
                // A message may have been accepted since the header was read.
                h = match self.svc.sessions.header(session_id).await? {
                    Some(h) => h,
                    None => return Ok(Outcome::Done),
                };
                fresh = true;
                continue;
            }
            let run = if known.session_seq == Some(next) {
                known.clone()
            } else {
                let Some(rid) = self.svc.sessions.message_run(session_id, next).await? else {
                    tracing::error!(session_id, seq = next, "session message index missing");
                    return Ok(Outcome::Done);
                };
                let Some(run) = self.svc.runs.get(&rid).await? else {
                    return Ok(Outcome::Done);
                };
                run
            };
            if run.state.is_terminal() {
                match self.svc.sessions.mark_done(session_id, next).await {
                    // We moved the session on: no need to read it again.
                    Ok(()) => {
                        h.done_seq = next;
                        fresh = false;
                    }
                    // Someone else did: see where it is now.
                    Err(StoreError::Conflict { .. }) => {
                        h = match self.svc.sessions.header(session_id).await? {
                            Some(h) => h,
                            None => return Ok(Outcome::Done),
                        };
                        fresh = true;
                    }
                    Err(e) => return Err(e.into()),
                }
                continue;
            }
            if run.state == RunState::Pending {
                return self.send_first_step(&run).await;
            }
            // The head is running: it will advance the session when it ends.
            return Ok(Outcome::Done);
        }
        Ok(Outcome::retry("session advance did not converge"))
    }

    /// Post-terminal duties, then `CLOSED_*`.
    async fn settle(&self, run_id: &str, tenant: &str) -> Handled {
        let Some(run) = self.load(run_id, tenant).await? else {
            return Ok(Outcome::Done);
        };
        if run.state.is_active() {
            tracing::warn!(run_id, state = %run.state, "terminal notice for an active run dropped");
            return Ok(Outcome::Done);
        }
        if run.state.is_closed() {
            tracing::info!(run_id, "already closed; duplicate dropped");
            return Ok(Outcome::Done);
        }
        // A Run started through the API stops counting against its
        // tenant's active Runs as soon as it has ended (not after its
        // callback, which may take a while); removing the marker again
        // when this settlement is retried is harmless.
        if run.parent_run_id.is_none() {
            self.svc.quotas.run_ended(&run.tenant, &run.run_id).await?;
        }
        if let Some(sid) = &run.session_id {
            let advanced = self.advance_session(sid, &run).await?;
            if advanced != Outcome::Done {
                return Ok(advanced);
            }
        }
        if run.sandbox_key.is_some() {
            let released = self.release_sandbox(&run).await?;
            if released != Outcome::Done {
                return Ok(released);
            }
        }
        // Collaboration: the children it leaves go with it, its parent
        // hears of its end.
        let cancelled = self.cancel_children(&run).await?;
        if cancelled != Outcome::Done {
            return Ok(cancelled);
        }
        let cancelled = self.cancel_approvals(&run).await?;
        if cancelled != Outcome::Done {
            return Ok(cancelled);
        }
        let announced = self.announce_to_parent(&run).await?;
        if announced != Outcome::Done {
            return Ok(announced);
        }
        let mut next = run;
        let mut events = Vec::new();
        let advanced = self.advance_chain(&mut next, &mut events).await?;
        if advanced != Outcome::Done {
            return Ok(advanced);
        }
        if next.callback_url.is_some() {
            // Queued before the close, so a settle that stops between the
            // two is repeated and queues it again (receivers deduplicate on
            // the delivery id, the Run's id); delivered once the Run is
            // closed, apart from the settling of Runs.
            let msg = DispatchMessage::deliver_callback(
                &self.svc.cfg.callback_signing_secret,
                &next.run_id,
                &next.tenant,
            );
            self.svc.queues.send_routed(&msg).await?;
        }
        self.close(next, events).await
    }

    /// Delivers closed Run `run_id`'s outcome to its callback URL and
    /// records how it went on the Run (`callback_delivered` or
    /// `callback_failed`, with the delivery id). A Run not yet closed (its
    /// settling is under way) is looked at again later.
    async fn deliver_callback(
        &self,
        run_id: &str,
        tenant: &str,
        chain: Option<armada_domain::collab::chain::ChainState>,
        receives: u32,
    ) -> Handled {
        let Some(run) = self.svc.runs.get(run_id).await? else {
            return Ok(Outcome::Done);
        };
        if run.tenant != tenant {
            tracing::error!(
                security = true,
                run_id,
                tenant,
                "a callback delivery naming another tenant's Run was dropped"
            );
            return Ok(Outcome::Done);
        }
        // A chain's outcome goes to the chain's URL, its id the delivery's.
        let (url, delivery) = match (&chain, &run.chain) {
            (Some(_), Some(link)) => (link.callback_url.clone(), link.chain_id.clone()),
            (Some(_), None) => (None, String::new()),
            (None, _) => (run.callback_url.clone(), run.run_id.clone()),
        };
        let Some(url) = url else {
            return Ok(Outcome::Done);
        };
        if !run.state.is_closed() {
            // Its settling queued this before closing it: a few tries, then
            // it is delivered as the Run stands.
            if receives < 5 {
                return Ok(Outcome::retry("the run is not closed yet".to_string()));
            }
        }
        let body = match (chain, &run.chain) {
            (Some(state), Some(link)) => self.chain_result(&run, link, state).await?,
            _ => json!({
                "run_id": run.run_id,
                "agent": run.agent,
                "state": run.state.outcome(),
                "output": match &run.output {
                    Some(p) => Some(self.svc.payloads.read(p).await?),
                    None => None,
                },
                "error": run.error,
                "session_id": run.session_id,
                "metadata": run.metadata,
            }),
        };
        let (kind, data) = self.callback(&run, &url, &delivery, body).await?;
        // Recorded on the Run as it is now (read again on a conflict); the
        // delivery itself is never repeated for the record's sake.
        let recorded = until_written::<_, DispatchError, _>(|| async {
            let Some(current) = self.svc.runs.get(run_id).await? else {
                return Ok(Try::Done(()));
            };
            let prev = current.stamp();
            let mut next = current;
            let ev = next.push_event(kind, data.clone(), self.svc.clock.now_ms());
            match self.svc.runs.save(prev, &next, &[ev], vec![]).await {
                Ok(()) => Ok(Try::Done(())),
                Err(StoreError::Conflict { .. }) => Ok(Try::Again),
                Err(e) => {
                    tracing::warn!(run_id, error = %e, "the callback's outcome was not recorded");
                    Ok(Try::Done(()))
                }
            }
        })
        .await?;
        if recorded.is_none() {
            tracing::warn!(
                run_id,
                "the callback's outcome was not recorded: the Run kept changing"
            );
        }
        Ok(Outcome::Done)
    }

    /// Delivers a callback (signed with the tenant's secret, naming the
    /// tenant, retried) and says how it went: `callback_delivered` or
    /// `callback_failed`, with what the event records.
    async fn callback(
        &self,
        run: &Run,
        url: &str,
        delivery: &str,
        mut body: serde_json::Value,
    ) -> Result<(&'static str, serde_json::Value), StoreError> {
        let secret = self
            .svc
            .callbacks
            .tenant_secret(self.svc.registry.as_ref(), &run.tenant)
            .await?;
        body["tenant"] = json!(run.tenant);
        let now = self.svc.clock.now_ms();
        let report = self
            .svc
            .callbacks
            .deliver(
                Delivery::Callback,
                url,
                delivery,
                &secret,
                &body,
                now / 1000,
            )
            .await;
        let kind = if report.delivered {
            "callback_delivered"
        } else {
            "callback_failed"
        };
        tracing::info!(run_id = %run.run_id, delivery, delivered = report.delivered, attempts = report.attempts, "callback");
        Ok((
            kind,
            json!({"delivery": delivery, "attempts": report.attempts, "status": report.status, "error": report.error}),
        ))
    }

    async fn close(&self, run: Run, mut events: Vec<RunEventRecord>) -> Handled {
        let now = self.svc.clock.now_ms();
        // The version read before any event was added in memory.
        let prev = Stamp {
            epoch: run.epoch,
            event_seq: run.event_seq - events.len() as u64,
        };
        let mut next = run;
        if let Err(e) = next.apply(RunEvent::Closed, now) {
            return Ok(self.illegal(&next.run_id, &e));
        }
        events.push(next.push_event("run_closed", json!({"outcome": next.state.outcome()}), now));
        match self.svc.runs.save(prev, &next, &events, vec![]).await {
            Ok(()) | Err(StoreError::Conflict { .. }) => Ok(Outcome::Done),
            Err(e) => Err(e.into()),
        }
    }

    /// The Run let go of its agent's sandbox (or left the queue for it); the
    /// next waiting Run, if any, is woken.
    async fn release_sandbox(&self, run: &Run) -> Handled {
        sandboxing::release_and_wake(&self.svc, run).await?;
        Ok(Outcome::Done)
    }

    /// Ends a Run from outside the harness ([`ending::end_from_outside`]).
    /// The machine's one action on an end, announcing it, is the
    /// dispatcher's own: the caller settles the Run next.
    async fn end_from_outside(
        &self,
        run: Run,
        event: RunEvent,
        extra: serde_json::Value,
    ) -> Result<Result<Ended, IllegalTransition>, StoreError> {
        ending::end_from_outside(&self.svc, run, event, extra).await
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

    /// A message that kept failing: fail its Run with the reason, then settle it.
    async fn dead_letter(&self, queue: &str, body: &str, receives: u32) -> Handled {
        let (run_id, tenant, what) = if let Ok(m) = serde_json::from_str::<HarnessMessage>(body) {
            match m {
                HarnessMessage::Step {
                    run_id,
                    tenant,
                    step,
                } => (run_id, tenant, format!("step {step}")),
                HarnessMessage::ToolResult {
                    run_id,
                    tenant,
                    call_id,
                    ..
                } => (run_id, tenant, format!("tool result of {call_id}")),
                HarnessMessage::ChildEnded {
                    run_id,
                    tenant,
                    child_run_id,
                } => (run_id, tenant, format!("end of child {child_run_id}")),
                HarnessMessage::ApprovalDecided {
                    run_id,
                    tenant,
                    approval_id,
                } => (
                    run_id,
                    tenant,
                    format!("decision of approval {approval_id}"),
                ),
            }
        } else if let Ok(m) = serde_json::from_str::<DispatchMessage>(body) {
            match m {
                DispatchMessage::StartRun { run_id, tenant } => {
                    (run_id, tenant, "start".to_string())
                }
                DispatchMessage::RunTerminal { run_id, tenant } => {
                    (run_id, tenant, "settlement".to_string())
                }
                DispatchMessage::CheckRun { run_id, tenant, .. } => {
                    (run_id, tenant, "watchdog".to_string())
                }
                DispatchMessage::SpawnChildren { run_id, tenant, .. } => {
                    (run_id, tenant, "children's start".to_string())
                }
                DispatchMessage::DeliverCallback { run_id, .. } => {
                    tracing::error!(
                        run_id,
                        queue,
                        "a callback could not be delivered on any attempt"
                    );
                    return Ok(Outcome::Done);
                }
                DispatchMessage::NotifyApproval {
                    approval_id,
                    recipient,
                    ..
                } => {
                    // The approval stays pending: an approver key can still
                    // decide it, and its deadline still expires it.
                    tracing::error!(
                        approval_id,
                        recipient,
                        queue,
                        "an approval link could not be sent on any attempt"
                    );
                    return Ok(Outcome::Done);
                }
                DispatchMessage::RenewCredentials {
                    tenant,
                    agent,
                    generation,
                    ..
                } => {
                    // The agent asks again every minute until it has them.
                    tracing::error!(
                        tenant,
                        agent,
                        generation,
                        queue,
                        "a credentials renewal failed on every attempt"
                    );
                    return Ok(Outcome::Done);
                }
            }
        } else {
            tracing::error!(queue, "unreadable dead letter dropped");
            return Ok(Outcome::Done);
        };
        tracing::error!(run_id, queue, what, "dead letter received");
        // Whether the Run is ended now (and so is settled next).
        let ended = until_written::<_, DispatchError, _>(|| async {
            let run = match self.load(&run_id, &tenant).await {
                Ok(Some(run)) => run,
                Ok(None) => return Ok(Try::Done(false)),
                // Its document cannot be read (which is likely why every
                // delivery failed): it is rebuilt from its head and ended.
                Err(StoreError::Corrupt(why)) => {
                    return match unreadable::end(&self.svc, &run_id, &tenant, &why, Ending::Fail)
                        .await
                    {
                        Ok(_) => Ok(Try::Done(true)),
                        Err(StoreError::Conflict { .. }) => Ok(Try::Again),
                        Err(e) => Err(e.into()),
                    };
                }
                Err(e) => return Err(e.into()),
            };
            if run.state.is_terminal() {
                return Ok(Try::Done(true));
            }
            let error = RunError::new(
                "DEAD_LETTERED",
                format!(
                    "the run's {what} message failed on every delivery and was moved to {queue}"
                ),
            );
            let event = RunEvent::Failed { error };
            let extra = json!({"receives": receives});
            match self.end_from_outside(run, event, extra).await {
                // Announcing its end is settling it, next.
                Ok(Ok(_)) => Ok(Try::Done(true)),
                Ok(Err(e)) => {
                    self.illegal(&run_id, &e);
                    Ok(Try::Done(false))
                }
                Err(StoreError::Conflict { .. }) => Ok(Try::Again),
                Err(e) => Err(e.into()),
            }
        })
        .await?;
        match ended {
            Some(true) => self.settle(&run_id, &tenant).await,
            Some(false) => Ok(Outcome::Done),
            None => Ok(Outcome::retry("the run kept changing")),
        }
    }
}

mod approvals;
mod chains;
mod children;
mod credentials;
mod watchdog;

#[cfg(test)]
mod approval_tests;
#[cfg(test)]
mod collab_tests;
#[cfg(test)]
mod test_stack;
#[cfg(test)]
mod tests;
