//! Signed deliveries to a tenant's endpoints: a terminal Run's outcome to
//! the `callback_url` its creator gave (signed per Standard Webhooks, tried
//! once per message: the delivery queue and the callback's machine retry
//! it), and an approval's chat message to the agent's `chat_webhook_url`
//! (retried a bounded number of times). Delivery is at least once:
//! receivers deduplicate on `webhook-id` (and `X-Armada-Delivery`).
//! Every delivery goes through the egress guard and is signed with a key of
//! the tenant's own secret (`POST /v1/tenants/{t}/callback-secret` rotates
//! it), so one tenant cannot sign as another, and with a key of its kind
//! ([`Delivery`]), so a chat message does not pass for a callback.

use std::time::Duration;

use serde_json::Value;

use armada_domain::api::{tenant_callback_secret, Delivery};
use armada_domain::crypto::standard_signature;

use crate::error::StoreError;
use crate::ports::Registry;
use crate::services::egress::{Egress, EgressError};

#[derive(Debug, Clone)]
pub struct Callbacks {
    egress: Egress,
    /// The deployment's secret, from which each tenant's is derived.
    secret: String,
    attempts: u32,
}

/// How a delivery went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryReport {
    pub delivered: bool,
    pub attempts: u32,
    /// The last HTTP status seen, if any.
    pub status: Option<u16>,
    /// A coarse reason (`EGRESS_REFUSED`, `CONNECT_FAILED`, `HTTP_<status>`,
    /// `INVALID_URL`): never the remote's own text.
    pub error: Option<String>,
}

impl Callbacks {
    pub fn new(secret: &str, attempts: u32, egress: Egress) -> Self {
        Callbacks {
            egress,
            secret: secret.to_string(),
            attempts: attempts.max(1),
        }
    }

    /// The signing secret of `tenant` (derived from the deployment's and
    /// the salt of the tenant's last rotation).
    pub async fn tenant_secret(
        &self,
        registry: &dyn Registry,
        tenant: &str,
    ) -> Result<String, StoreError> {
        let salt = registry.callback_salt(tenant).await?.unwrap_or_default();
        Ok(tenant_callback_secret(&self.secret, tenant, &salt))
    }

    /// Posts `body`, a delivery of `kind`, signed with its key of `secret`
    /// (the tenant's own).
    pub async fn deliver(
        &self,
        kind: Delivery,
        url: &str,
        delivery_id: &str,
        secret: &str,
        body: &Value,
        now_s: i64,
    ) -> DeliveryReport {
        let fail = |attempts, status, error: String| DeliveryReport {
            delivered: false,
            attempts,
            status,
            error: Some(error),
        };
        let text = body.to_string();
        let mut last = fail(0, None, "not attempted".into());
        // A callback is tried once per message: its retries are the
        // delivery queue's, spread over up to a day by its machine.
        let attempts = match kind {
            Delivery::Callback => 1,
            Delivery::ChatMessage => self.attempts,
        };
        for attempt in 1..=attempts {
            // A target the guard refuses is refused for good: no retry.
            let req = match self.egress.request(reqwest::Method::POST, url) {
                Ok(r) => r,
                Err(e) => return fail(attempt - 1, None, e.code().into()),
            };
            let req = req
                .timeout(Duration::from_secs(5))
                .header("content-type", "application/json")
                .header("x-armada-delivery", delivery_id);
            let req = match kind {
                // Standard Webhooks: any of its libraries verifies it.
                Delivery::Callback => req
                    .header("webhook-id", delivery_id)
                    .header("webhook-timestamp", now_s.to_string())
                    .header(
                        "webhook-signature",
                        standard_signature(secret, delivery_id, now_s, text.as_bytes())
                            .unwrap_or_default(),
                    ),
                Delivery::ChatMessage => {
                    req.header("x-armada-signature", kind.signature(secret, now_s, &text))
                }
            };
            let resp = Egress::send(req.body(text.clone())).await;
            match resp {
                Ok(r) if r.status().is_success() => {
                    return DeliveryReport {
                        delivered: true,
                        attempts: attempt,
                        status: Some(r.status().as_u16()),
                        error: None,
                    }
                }
                Ok(r) => {
                    let status = r.status();
                    last = fail(
                        attempt,
                        Some(status.as_u16()),
                        format!("HTTP_{}", status.as_u16()),
                    );
                    // A 4xx other than 408/429 will not get better.
                    if status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429
                    {
                        return last;
                    }
                }
                Err(EgressError::Refused) => return fail(attempt, None, "EGRESS_REFUSED".into()),
                Err(e) => last = fail(attempt, None, e.code().into()),
            }
            if attempt < attempts {
                tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
            }
        }
        last
    }
}
