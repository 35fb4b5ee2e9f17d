//! The SQS adapter: queue URLs resolved from names once at start-up, typed
//! sends, and backoff for messages whose handling failed for a retryable reason.

use std::collections::HashMap;

use aws_sdk_sqs::Client;

use armada_domain::crypto::hmac_sha256_hex;
use armada_domain::messages::{DispatchMessage, HarnessMessage};

use async_trait::async_trait;

use crate::config::Config;
use crate::error::{classify, StoreError};
use crate::ports;

/// The key of the harness queue's deduplication ids, from the deployment
/// secret.
fn dedup_key(secret: &str) -> String {
    hmac_sha256_hex(secret.as_bytes(), b"armada-fifo-dedup")
}

/// A deduplication id no sandbox can predict. A sandbox's credentials may
/// send to the harness queue and it learns its Runs' ids: with ids such as
/// `<run>-step-<n>` it could send one first and have SQS drop the real
/// step as a duplicate within its five-minute window. Keyed, the ids are
/// still one per message (a duplicate send is still dropped).
pub fn keyed_dedup_id(key: &str, natural: &str) -> String {
    hmac_sha256_hex(key.as_bytes(), natural.as_bytes())
}

#[derive(Debug, Clone)]
pub struct Queues {
    sqs: Client,
    pub dispatch_url: String,
    pub harness_url: String,
    pub delivery_url: String,
    /// Queue name → URL, for every queue this process consumes or sends to.
    urls: HashMap<String, String>,
    pub dispatch_dlq: String,
    pub harness_dlq: String,
    /// Keys the harness queue's deduplication ids (see [`keyed_dedup_id`]).
    dedup_key: String,
}

impl Queues {
    pub async fn resolve(sqs: Client, cfg: &Config) -> Result<Self, StoreError> {
        let mut urls = HashMap::new();
        let alarms = Some(&cfg.alarms.queue).filter(|q| !q.is_empty());
        for name in [
            &cfg.dispatch_queue,
            &cfg.harness_queue,
            &cfg.dispatch_dlq,
            &cfg.harness_dlq,
            &cfg.delivery_queue,
        ]
        .into_iter()
        .chain(alarms)
        {
            let out = sqs
                .get_queue_url()
                .queue_name(name)
                .send()
                .await
                .map_err(classify)?;
            let url = out
                .queue_url()
                .ok_or_else(|| StoreError::Terminal(format!("no URL for queue {name}")))?;
            urls.insert(name.clone(), url.to_string());
        }
        Ok(Queues {
            dispatch_url: urls[&cfg.dispatch_queue].clone(),
            harness_url: urls[&cfg.harness_queue].clone(),
            delivery_url: urls[&cfg.delivery_queue].clone(),
            urls,
            sqs,
            dispatch_dlq: cfg.dispatch_dlq.clone(),
            harness_dlq: cfg.harness_dlq.clone(),
            dedup_key: dedup_key(&cfg.callback_signing_secret),
        })
    }

    /// The deduplication id the control plane sends `msg` with.
    pub fn dedup_id(&self, msg: &HarnessMessage) -> String {
        keyed_dedup_id(&self.dedup_key, &msg.dedup_id())
    }

    /// Sends `msg` to the standard queue at `url`, delivered after
    /// `delay_s` (at most SQS's 900).
    async fn send_standard(
        &self,
        url: &str,
        msg: &DispatchMessage,
        delay_s: u32,
    ) -> Result<(), StoreError> {
        let body = serde_json::to_string(msg).map_err(|e| StoreError::Terminal(e.to_string()))?;
        let mut req = self.sqs.send_message().queue_url(url).message_body(body);
        if delay_s > 0 {
            req = req.delay_seconds(delay_s.min(900) as i32);
        }
        req.send().await.map_err(classify)?;
        Ok(())
    }

    pub fn queue_name(arn: &str) -> &str {
        arn.rsplit(':').next().unwrap_or(arn)
    }
}

#[async_trait]
impl ports::Queues for Queues {
    async fn send_dispatch_delayed(
        &self,
        msg: &DispatchMessage,
        delay_s: u32,
    ) -> Result<(), StoreError> {
        self.send_standard(&self.dispatch_url, msg, delay_s).await
    }

    async fn send_delivery(&self, msg: &DispatchMessage, delay_s: u32) -> Result<(), StoreError> {
        self.send_standard(&self.delivery_url, msg, delay_s).await
    }

    async fn send_dead_letter(&self, msg: &DispatchMessage) -> Result<(), StoreError> {
        let url = self
            .urls
            .get(&self.dispatch_dlq)
            .ok_or_else(|| StoreError::Terminal("no URL for the dispatch DLQ".into()))?;
        self.send_standard(url, msg, 0).await
    }

    /// Grouped by run id and deduplicated per step, so one Run's steps are
    /// delivered in order and once per five-minute window even if sent twice.
    async fn send_harness(&self, msg: &HarnessMessage) -> Result<(), StoreError> {
        let body = serde_json::to_string(msg).map_err(|e| StoreError::Terminal(e.to_string()))?;
        self.sqs
            .send_message()
            .queue_url(&self.harness_url)
            .message_body(body)
            .message_group_id(msg.run_id())
            .message_deduplication_id(self.dedup_id(msg))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    fn url_for_arn(&self, arn: &str) -> Option<String> {
        let name = arn.rsplit(':').next()?;
        self.urls.get(name).cloned()
    }

    fn harness_url(&self) -> String {
        self.harness_url.clone()
    }

    fn dispatch_url(&self) -> String {
        self.dispatch_url.clone()
    }

    fn is_dead_letter_queue(&self, name: &str) -> bool {
        name == self.dispatch_dlq || name == self.harness_dlq
    }

    /// An error is logged, as the next beat tries again.
    async fn keep_hidden(&self, queue_url: &str, receipt_handle: &str, seconds: u32) {
        if let Err(e) = self
            .sqs
            .change_message_visibility()
            .queue_url(queue_url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(seconds.min(43_200) as i32)
            .send()
            .await
        {
            tracing::warn!(error = %classify(e), "could not extend a message's visibility");
        }
    }

    /// Without it a failed message would wait the whole visibility timeout.
    async fn back_off(
        &self,
        queue_url: &str,
        receipt_handle: &str,
        receives: u32,
        base_s: u32,
        min_delay_s: u32,
    ) {
        let delay = u64::from(base_s)
            .saturating_mul(1u64 << receives.saturating_sub(1).min(16))
            .max(u64::from(min_delay_s))
            .min(900) as i32;
        if let Err(e) = self
            .sqs
            .change_message_visibility()
            .queue_url(queue_url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(delay)
            .send()
            .await
        {
            tracing::warn!(error = %classify(e), "could not set the retry backoff; the visibility timeout applies");
        }
    }
}
