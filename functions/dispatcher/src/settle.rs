//! Settling a Run that reached a terminal state: its tenant's marker let
//! go, its session advanced, its callback delivered (through the delivery
//! queue), its sandbox released, its children cancelled, and it is closed.

use crate::DispatchError;
use crate::Dispatcher;
use crate::Handled;
use armada_core::batch::Outcome;
use armada_core::cas::until_written;
use armada_core::cas::Try;
use armada_core::error::StoreError;
use armada_core::services::sandboxing;
use armada_domain::api::Delivery;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::Run;
use armada_domain::run::RunEvent;
use armada_domain::run::RunEventRecord;
use armada_domain::run::Stamp;
use armada_domain::run::{CallbackReport, LogEvent};
use serde_json::json;

impl Dispatcher {
    /// Post-terminal duties, then `CLOSED_*`.
    pub(crate) async fn settle(&self, run_id: &str, tenant: &str) -> Handled {
        let Some(run) = self.load(run_id, tenant).await? else {
            return Ok(Outcome::Done);
        };
        if run.state().is_active() {
            tracing::warn!(run_id, state = %run.state(), "terminal notice for an active run dropped");
            return Ok(Outcome::Done);
        }
        if run.state().is_closed() {
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
    pub(crate) async fn deliver_callback(
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
        if !run.state().is_closed() {
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
                "state": run.state().outcome(),
                "output": match &run.output {
                    Some(p) => Some(self.svc.payloads.read(p).await?),
                    None => None,
                },
                "error": run.error,
                "session_id": run.session_id,
                "metadata": run.metadata,
            }),
        };
        let delivered = self.callback(&run, &url, &delivery, body).await?;
        // Recorded on the Run as it is now (read again on a conflict); the
        // delivery itself is never repeated for the record's sake.
        let recorded = until_written::<_, DispatchError, _>(|| async {
            let Some(current) = self.svc.runs.get(run_id).await? else {
                return Ok(Try::Done(()));
            };
            let prev = current.stamp();
            let mut next = current;
            let ev = next.push_event(delivered.clone(), self.svc.clock.now_ms());
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
    pub(crate) async fn callback(
        &self,
        run: &Run,
        url: &str,
        delivery: &str,
        mut body: serde_json::Value,
    ) -> Result<LogEvent, StoreError> {
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
        tracing::info!(run_id = %run.run_id, delivery, delivered = report.delivered, attempts = report.attempts, "callback");
        let recorded = CallbackReport {
            delivery: delivery.to_string(),
            attempts: report.attempts,
            status: report.status,
            error: report.error,
        };
        Ok(if report.delivered {
            LogEvent::CallbackDelivered(recorded)
        } else {
            LogEvent::CallbackFailed(recorded)
        })
    }

    pub(crate) async fn close(&self, run: Run, mut events: Vec<RunEventRecord>) -> Handled {
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
        let closed = LogEvent::RunClosed {
            outcome: next.state().outcome(),
        };
        events.push(next.push_event(closed, now));
        match self.svc.runs.save(prev, &next, &events, vec![]).await {
            Ok(()) | Err(StoreError::Conflict { .. }) => Ok(Outcome::Done),
            Err(e) => Err(e.into()),
        }
    }

    /// The Run let go of its agent's sandbox (or left the queue for it); the
    /// next waiting Run, if any, is woken.
    pub(crate) async fn release_sandbox(&self, run: &Run) -> Handled {
        sandboxing::release_and_wake(&self.svc, run).await?;
        Ok(Outcome::Done)
    }
}
