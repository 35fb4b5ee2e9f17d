//! Approvals, the dispatcher's part: their links sent (a token minted per
//! recipient, its hash stored, then the email or chat message sent; a
//! failure is retried by the queue and the approval is never lost: it
//! exists before anything is sent), their deadlines (the watchdog of a Run
//! in `AWAITING_HITL`, a chain of delayed messages re-sent until the
//! earliest deadline is due), and their end with their Run (a cancelled
//! Run's pending approvals end `cancelled`).

use crate::Dispatcher;
use crate::Handled;
use armada_core::batch::Outcome;
use armada_core::cas::{change, Changed};
use armada_core::clock::rfc3339;
use armada_domain::api::Delivery;
use armada_domain::approval::{notice, Approval, ApprovalEvent, ApprovalState, CHAT_RECIPIENT};
use armada_domain::messages::DispatchMessage;
use armada_domain::messages::HarnessMessage;
use armada_domain::run::Run;
use serde_json::json;

/// The longest delay SQS gives a message.
const MAX_DELAY_S: i64 = 900;

impl Dispatcher {
    /// Sends approval `approval_id`'s link to `recipient`: a token minted
    /// for it (one conditional write of the approval), then the message.
    pub(crate) async fn notify(&self, approval_id: &str, tenant: &str, recipient: &str) -> Handled {
        let svc = &self.svc;
        let token = armada_domain::approval::new_token();
        let ours =
            |a: &Approval| a.tenant == tenant && a.recipients().iter().any(|r| r == recipient);
        let minted = change(
            svc.approvals.as_ref(),
            approval_id,
            || svc.clock.now_ms(),
            |a: &Approval| {
                ours(a).then(|| ApprovalEvent::MintToken {
                    recipient: recipient.to_string(),
                    token: token.clone(),
                })
            },
        )
        .await?;
        let a = match minted {
            Some(Changed::Written(a, _)) => a,
            Some(Changed::Missing) => {
                tracing::warn!(approval_id, "notice for an unknown approval dropped");
                return Ok(Outcome::Done);
            }
            Some(Changed::Left(_)) => {
                tracing::error!(
                    approval_id,
                    tenant,
                    recipient,
                    "security: a notice for another tenant's approval or recipient; dropped"
                );
                return Ok(Outcome::Done);
            }
            // Decided, expired or cancelled meanwhile: nothing to ask.
            Some(Changed::Refused(..)) => return Ok(Outcome::Done),
            None => {
                return Ok(Outcome::retry(
                    "the approval kept changing while its link was minted",
                ))
            }
        };
        let link = notice::review_link(svc.cfg.public_url.as_deref(), approval_id, &token);
        let sent = if recipient == CHAT_RECIPIENT {
            self.notify_chat(&a, &link).await
        } else {
            let text = notice::email_text(&a, &link, rfc3339);
            svc.mail
                .send(recipient, &notice::subject(&a), &text)
                .await
                .map(|_| ())
        };
        match sent {
            Ok(()) => {
                tracing::info!(approval_id, recipient, "approval link sent");
                Ok(Outcome::Done)
            }
            // The next attempt mints a new link (this one never arrived).
            Err(e) => Ok(Outcome::retry(format!(
                "approval link to {recipient} not sent: {e}"
            ))),
        }
    }

    async fn notify_chat(&self, a: &Approval, link: &str) -> Result<(), String> {
        let Some(url) = a.chat_webhook_url.as_deref() else {
            return Ok(());
        };
        let mut body = notice::chat_message(a, link, rfc3339);
        body["tenant"] = json!(a.tenant);
        let delivery = format!("{}-chat", a.approval_id);
        let callbacks = &self.svc.callbacks;
        let secret = callbacks
            .tenant_secret(self.svc.registry.as_ref(), &a.tenant)
            .await
            .map_err(|e| e.to_string())?;
        let now = self.svc.clock.now_ms();
        let report = callbacks
            .deliver(
                Delivery::ChatMessage,
                url,
                &delivery,
                &secret,
                &body,
                now / 1000,
            )
            .await;
        if report.delivered {
            Ok(())
        } else {
            Err(report.error.unwrap_or_else(|| "not delivered".into()))
        }
    }

    /// The watchdog of a Run waiting for humans: overdue approvals expire,
    /// decisions the Run has not taken note of are sent to it again, links
    /// never sent are sent; then the next check, no later than the earliest
    /// deadline.
    pub(crate) async fn check_approvals(
        &self,
        run: &Run,
        step: u32,
        next: &DispatchMessage,
    ) -> Handled {
        let svc = &self.svc;
        let now = svc.clock.now_ms();
        let waiting: Vec<String> = run
            .ledger
            .values()
            .filter(|r| r.step == step && !r.state().is_settled() && r.awaits_approval())
            .filter_map(|r| r.approval.as_ref().map(|a| a.approval_id.clone()))
            .collect();
        let mut next_due = i64::MAX;
        for id in &waiting {
            // Overdue and still pending: it expires (a decision that lands
            // first wins, and is sent below).
            let overdue = |a: &Approval| {
                (a.state() == ApprovalState::Pending && a.is_overdue(now))
                    .then_some(ApprovalEvent::Expire)
            };
            let a = match change(svc.approvals.as_ref(), id, || now, overdue).await? {
                Some(Changed::Written(a, _)) => {
                    tracing::info!(approval_id = %id, "approval expired");
                    a
                }
                Some(Changed::Left(a) | Changed::Refused(a, _)) => a,
                Some(Changed::Missing) => continue,
                None => return Ok(Outcome::retry("approval changed while expiring")),
            };
            if a.state() != ApprovalState::Pending {
                svc.queues
                    .send_harness(&HarnessMessage::ApprovalDecided {
                        run_id: run.run_id.clone(),
                        tenant: run.tenant.clone(),
                        approval_id: id.clone(),
                    })
                    .await?;
                continue;
            }
            next_due = next_due.min(a.expires_at_ms);
            let unsent = a
                .recipients()
                .into_iter()
                .filter(|r| !a.tokens.iter().any(|t| &t.recipient == r));
            for recipient in unsent {
                let msg = DispatchMessage::notify_approval(
                    &svc.cfg.callback_signing_secret,
                    id,
                    &run.tenant,
                    &recipient,
                );
                svc.queues.send_routed(&msg).await?;
            }
        }
        if next_due == i64::MAX {
            // Every decision is on its way to the Run: its harness checks again.
            return Ok(Outcome::Done);
        }
        let until_due_s = (next_due - now + 999) / 1000;
        // At most SQS's longest delay, and no longer than 30 sandbox checks
        // (a stack with quick checks looks at approvals quickly too).
        let cap = MAX_DELAY_S.min(i64::from(svc.cfg.sandbox.check_seconds.max(1)) * 30);
        let delay = until_due_s.clamp(1, cap) as u32;
        svc.queues.send_dispatch_delayed(next, delay).await?;
        Ok(Outcome::Done)
    }

    /// A Run ended: its approvals still pending end `cancelled` (their
    /// links then say so).
    pub(crate) async fn cancel_approvals(&self, run: &Run) -> Handled {
        if !run.ledger.values().any(|r| r.approval.is_some()) {
            return Ok(Outcome::Done);
        }
        let svc = &self.svc;
        let pending = |a: &Approval| {
            (a.state() == ApprovalState::Pending && a.tenant == run.tenant)
                .then_some(ApprovalEvent::Cancel)
        };
        for a in svc.approvals.of_run(&run.run_id).await? {
            if pending(&a).is_none() {
                continue;
            }
            let now = || svc.clock.now_ms();
            if change(svc.approvals.as_ref(), &a.approval_id, now, pending)
                .await?
                .is_none()
            {
                return Ok(Outcome::retry("approval changed while cancelling"));
            }
        }
        Ok(Outcome::Done)
    }
}
