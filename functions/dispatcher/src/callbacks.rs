//! Callbacks: a closed Run's outcome (or its chain's) POSTed to the URL it
//! was started with, from the delivery queue, signed per Standard Webhooks
//! with the tenant's secret. Each message makes one attempt; the Run's
//! callback record decides what follows (delivered, failed, or tried again
//! after a backoff, re-enqueued with a delay of at most SQS's 15 minutes
//! until it is due), for up to a day, then the dead-letter queue.

use serde_json::json;

use crate::DispatchError;
use crate::Dispatcher;
use crate::Handled;
use armada_core::batch::Outcome;
use armada_core::cas::{until_written, Try};
use armada_core::error::StoreError;
use armada_core::services::callbacks::DeliveryReport;
use armada_domain::api::Delivery;
use armada_domain::collab::chain::ChainState;
use armada_domain::machine::Machine;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::callback::{Attempt, CallbackAction, CallbackEvent, CallbackRecord};
use armada_domain::run::{CallbackReport, LogEvent, Run};

/// The longest delay SQS gives a message.
const MAX_DELAY_S: i64 = 900;

impl Dispatcher {
    /// The message that delivers `run_id`'s callback (sealed again: the
    /// same message every time).
    fn callback_message(
        &self,
        run_id: &str,
        tenant: &str,
        chain: Option<ChainState>,
    ) -> DispatchMessage {
        let secret = &self.svc.cfg.callback_signing_secret;
        match chain {
            Some(state) => DispatchMessage::deliver_chain_callback(secret, run_id, tenant, state),
            None => DispatchMessage::deliver_callback(secret, run_id, tenant),
        }
    }

    /// One attempt at closed Run `run_id`'s callback, unless its record
    /// says it is done or not due yet; the outcome goes through the
    /// record's machine, and what it decides is carried out. A Run not yet
    /// closed (its settling is under way) is looked at again later.
    pub(crate) async fn deliver_callback(
        &self,
        run_id: &str,
        tenant: &str,
        chain: Option<ChainState>,
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
        if !run.state().is_closed() && receives < 5 {
            // Its settling queued this before closing it: a few tries, then
            // it is delivered as the Run stands.
            return Ok(Outcome::retry("the run is not closed yet".to_string()));
        }
        let record = run
            .callback
            .clone()
            .unwrap_or_else(|| CallbackRecord::new(&delivery, chain));
        if record.state().is_final() {
            // A repeat of a message whose delivery was decided.
            return Ok(Outcome::Done);
        }
        let now = self.svc.clock.now_ms();
        if let Some(due) = record.next_attempt_at_ms {
            let wait_s = (due - now + 999).div_euclid(1000);
            if wait_s > 1 {
                // Not due: back on the queue for as long as SQS allows.
                let msg = self.callback_message(run_id, tenant, chain);
                let delay = wait_s.min(MAX_DELAY_S) as u32;
                self.svc.queues.send_delivery(&msg, delay).await?;
                return Ok(Outcome::Done);
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
                "trigger": run.trigger(),
            }),
        };
        let report = self.callback(&run, &url, &delivery, body).await?;
        let actions = self
            .record_attempt(run_id, &delivery, chain, &report)
            .await?;
        for action in actions {
            let msg = self.callback_message(run_id, tenant, chain);
            match action {
                CallbackAction::RetryIn(delay_s) => {
                    let delay = i64::from(delay_s).min(MAX_DELAY_S) as u32;
                    self.svc.queues.send_delivery(&msg, delay).await?;
                }
                CallbackAction::Failed { dead_letter: true } => {
                    tracing::warn!(
                        run_id,
                        delivery,
                        "a callback ran out of time; dead-lettered"
                    );
                    self.svc.queues.send_dead_letter(&msg).await?;
                }
                CallbackAction::Delivered
                | CallbackAction::Failed { dead_letter: false }
                | CallbackAction::Send => {}
            }
        }
        Ok(Outcome::Done)
    }

    /// Notes an attempt on the Run as it is now (read again on a
    /// conflict; the attempt itself is never repeated for the record's
    /// sake): the callback's machine decides, `callback_delivered` or
    /// `callback_failed` is recorded when it ends. What it decided.
    async fn record_attempt(
        &self,
        run_id: &str,
        delivery: &str,
        chain: Option<ChainState>,
        report: &DeliveryReport,
    ) -> Result<Vec<CallbackAction>, DispatchError> {
        let attempt = Attempt {
            delivered: report.delivered,
            status: report.status,
            error: report.error.clone(),
            refused: matches!(
                report.error.as_deref(),
                Some("EGRESS_REFUSED" | "INVALID_URL")
            ),
        };
        let policy = self.svc.cfg.callback_policy;
        let recorded = until_written::<_, DispatchError, _>(|| async {
            let Some(current) = self.svc.runs.get(run_id).await? else {
                return Ok(Try::Done(vec![]));
            };
            let prev = current.stamp();
            let mut next = current;
            let mut record = next
                .callback
                .clone()
                .unwrap_or_else(|| CallbackRecord::new(delivery, chain));
            let now = self.svc.clock.now_ms();
            let event = CallbackEvent::Attempted {
                attempt: attempt.clone(),
                policy,
            };
            let Ok(actions) = record.apply(event, now) else {
                // Decided by another attempt in the meantime.
                return Ok(Try::Done(vec![]));
            };
            let noted = CallbackReport {
                delivery: delivery.to_string(),
                attempts: record.attempts,
                status: record.last_status,
                error: record.last_error.clone(),
            };
            let mut events = Vec::new();
            for action in &actions {
                match action {
                    CallbackAction::Delivered => events
                        .push(next.push_event(LogEvent::CallbackDelivered(noted.clone()), now)),
                    CallbackAction::Failed { .. } => {
                        events.push(next.push_event(LogEvent::CallbackFailed(noted.clone()), now))
                    }
                    CallbackAction::RetryIn(_) | CallbackAction::Send => {}
                }
            }
            next.callback = Some(record);
            match self.svc.runs.save(prev, &next, &events, vec![]).await {
                Ok(()) => Ok(Try::Done(actions)),
                Err(StoreError::Conflict { .. }) => Ok(Try::Again),
                Err(e) => Err(e.into()),
            }
        })
        .await?;
        match recorded {
            Some(actions) => Ok(actions),
            None => Err(DispatchError::from(StoreError::Conflict { which: None })),
        }
    }

    /// Makes one signed attempt at a callback (naming the tenant).
    pub(crate) async fn callback(
        &self,
        run: &Run,
        url: &str,
        delivery: &str,
        mut body: serde_json::Value,
    ) -> Result<DeliveryReport, StoreError> {
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
        tracing::info!(run_id = %run.run_id, delivery, delivered = report.delivered, status = ?report.status, "callback attempt");
        Ok(report)
    }
}
