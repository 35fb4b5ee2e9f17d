//! Result callbacks: a signed POST of a terminal Run's outcome to the
//! `callback_url` its creator gave, retried a bounded number of times.
//! Delivery is at least once: receivers deduplicate on `X-Armada-Delivery`.

use std::net::IpAddr;
use std::time::Duration;

use serde_json::Value;

use armada_domain::api::callback_signature;

#[derive(Debug, Clone)]
pub struct Callbacks {
    http: reqwest::Client,
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
    pub error: Option<String>,
}

/// Cloud metadata endpoints are never a callback target.
fn forbidden_host(url: &reqwest::Url) -> bool {
    match url
        .host_str()
        .and_then(|h| h.trim_matches(['[', ']']).parse::<IpAddr>().ok())
    {
        Some(IpAddr::V4(v4)) => v4.is_link_local(),
        Some(IpAddr::V6(v6)) => (v6.segments()[0] & 0xffc0) == 0xfe80 || v6.segments()[0] == 0xfd00,
        None => false,
    }
}

impl Callbacks {
    pub fn new(secret: &str, attempts: u32) -> Self {
        Callbacks {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
            secret: secret.to_string(),
            attempts: attempts.max(1),
        }
    }

    pub async fn deliver(
        &self,
        url: &str,
        delivery_id: &str,
        body: &Value,
        now_s: i64,
    ) -> DeliveryReport {
        let fail = |attempts, status, error: String| DeliveryReport {
            delivered: false,
            attempts,
            status,
            error: Some(error),
        };
        let parsed = match reqwest::Url::parse(url) {
            Ok(u) => u,
            Err(e) => return fail(0, None, format!("invalid callback_url: {e}")),
        };
        if forbidden_host(&parsed) {
            return fail(
                0,
                None,
                "callback_url points at a link-local address".into(),
            );
        }
        let text = body.to_string();
        let mut last = fail(0, None, "not attempted".into());
        for attempt in 1..=self.attempts {
            let sig = callback_signature(&self.secret, now_s, &text);
            let resp = self
                .http
                .post(parsed.clone())
                .header("content-type", "application/json")
                .header("x-armada-signature", sig)
                .header("x-armada-delivery", delivery_id)
                .body(text.clone())
                .send()
                .await;
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
                    last = fail(attempt, Some(status.as_u16()), format!("HTTP {status}"));
                    // A 4xx other than 408/429 will not get better.
                    if status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429
                    {
                        return last;
                    }
                }
                Err(e) => last = fail(attempt, None, e.to_string()),
            }
            if attempt < self.attempts {
                tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
            }
        }
        last
    }
}
