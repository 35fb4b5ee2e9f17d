//! New credentials for a sandbox agent whose own expire within the hour
//! (`armada_domain::sandbox::credentials`): the request must be sealed by
//! the generation's answer key and come from the generation the identity's
//! record names; the credentials go to that generation's hand queue, which
//! only its task can read.

use std::sync::atomic::Ordering;

use armada_core::batch::Outcome;
use armada_domain::sandbox::credentials::{judge_renewal, Renewal, RenewalVerdict};
use armada_domain::sandbox::hand::HandMessage;
use armada_domain::sandbox::seal::answer_key;

use super::{Dispatcher, Handled};

impl Dispatcher {
    pub(super) async fn renew_credentials(&self, req: &Renewal<'_>, seal: &str) -> Handled {
        // The record's salt is in the generation's key: read it first.
        let record = match self.svc.sandboxes.get(req.tenant, req.agent).await {
            Ok(r) => r,
            Err(e) => return Err(e.into()),
        };
        let key = answer_key(
            &self.svc.cfg.callback_signing_secret,
            req.tenant,
            req.agent,
            req.generation,
            record.as_ref().map(|r| r.salt.as_str()).unwrap_or_default(),
        );
        let sealed = req.sealed_by(seal, &key);
        let now = self.svc.clock.now_ms();
        let hand_queue_url = match judge_renewal(req, sealed, record.as_ref(), now) {
            RenewalVerdict::Issue { hand_queue_url } => hand_queue_url,
            RenewalVerdict::Drop(why) => {
                if sealed {
                    tracing::info!(
                        tenant = req.tenant,
                        agent = req.agent,
                        generation = req.generation,
                        why,
                        "credentials renewal dropped"
                    );
                } else {
                    self.svc
                        .counters
                        .forged_drops
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        tenant = req.tenant,
                        agent = req.agent,
                        generation = req.generation,
                        why,
                        "credentials renewal dropped"
                    );
                }
                return Ok(Outcome::Done);
            }
        };
        let issued = self
            .svc
            .provider
            .credentials(req.tenant, req.agent, req.generation, &hand_queue_url)
            .await;
        let credentials = match issued {
            Ok(Some(c)) => c,
            Ok(None) => {
                tracing::warn!(
                    tenant = req.tenant,
                    agent = req.agent,
                    "credentials renewal asked for, but the deployment names no identity role"
                );
                return Ok(Outcome::Done);
            }
            Err(e) => return Err(e.into()),
        };
        tracing::info!(tenant = req.tenant, agent = req.agent, generation = req.generation, key = %credentials.access_key_id, "credentials renewed");
        let msg = HandMessage::Credentials {
            generation: req.generation,
            credentials,
        };
        match self.svc.provider.send(&hand_queue_url, &msg).await {
            Ok(()) => Ok(Outcome::Done),
            Err(e) => Err(e.into()),
        }
    }
}
