//! Settling a Run that reached a terminal state: its tenant's marker let
//! go, its session advanced, its callback delivered and its mail answered
//! (through the delivery queue), its sandbox released, its children cancelled, and it is closed.

use crate::Dispatcher;
use crate::Handled;
use armada_core::batch::Outcome;
use armada_core::error::StoreError;
use armada_core::services::sandboxing;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::LogEvent;
use armada_domain::run::Run;
use armada_domain::run::RunEvent;
use armada_domain::run::RunEventRecord;
use armada_domain::run::Stamp;
use armada_domain::run::Trigger;

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
        if matches!(next.started_from, Some(Trigger::Email { .. })) && next.chain.is_none() {
            // As the callback: queued before the close, sent once (its
            // record, by its Message-ID, is checked before sending). A
            // relay team's mail is answered by its chain's last step.
            let msg = DispatchMessage::send_reply(
                &self.svc.cfg.callback_signing_secret,
                &next.run_id,
                &next.tenant,
            );
            self.svc.queues.send_routed(&msg).await?;
        }
        self.close(next, events).await
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
            Ok(()) => Ok(Outcome::Done),
            // Changed since it was read: closed by another settling, or
            // changed by another writer, which would leave it unclosed for
            // good if this were taken for done: then the settling is
            // tried again.
            Err(StoreError::Conflict { .. }) => {
                let now_closed = self
                    .svc
                    .runs
                    .head(&next.run_id)
                    .await?
                    .is_some_and(|h| h.state.is_closed());
                if now_closed {
                    Ok(Outcome::Done)
                } else {
                    Ok(Outcome::retry("the run changed while it was closed"))
                }
            }
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
