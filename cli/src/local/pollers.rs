//! SQS pollers that feed handlers exactly as Lambda's event source mapping
//! does: long polling, batches up to the mapping's size, the record JSON
//! Lambda sends, deletion of what succeeded, and nothing deleted on a
//! function error. Redelivery, FIFO group order and the redrive to a DLQ
//! after maxReceiveCount are the queue's own (the emulator's) behaviour.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName};
use futures::future::BoxFuture;
use serde_json::json;
use tokio::sync::watch;

pub type SqsHandler =
    Arc<dyn Fn(SqsEvent) -> BoxFuture<'static, Result<SqsBatchResponse, String>> + Send + Sync>;

#[derive(Debug, Clone)]
pub struct PollerSpec {
    pub queue_url: String,
    pub queue_arn: String,
    pub batch_size: i32,
    pub wait_seconds: i32,
    pub region: String,
}

pub async fn run(
    sqs: aws_sdk_sqs::Client,
    spec: PollerSpec,
    handler: SqsHandler,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let receive = sqs
            .receive_message()
            .queue_url(&spec.queue_url)
            .max_number_of_messages(spec.batch_size.clamp(1, 10))
            .wait_time_seconds(spec.wait_seconds)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send();
        let out = tokio::select! {
            r = receive => r,
            _ = shutdown.changed() => return,
        };
        let msgs = match out {
            Ok(o) => {
                backoff = Duration::from_millis(200);
                o.messages.unwrap_or_default()
            }
            Err(e) => {
                // The emulator may be restarting: keep trying, gently.
                tracing::debug!(queue = %spec.queue_url, error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "receive failed");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {},
                    _ = shutdown.changed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if msgs.is_empty() {
            continue;
        }
        let records: Vec<serde_json::Value> = msgs
            .iter()
            .map(|m| {
                let attrs: serde_json::Map<String, serde_json::Value> = m
                    .attributes()
                    .map(|a| {
                        a.iter()
                            .map(|(k, v)| (k.as_str().to_string(), json!(v)))
                            .collect()
                    })
                    .unwrap_or_default();
                json!({
                    "messageId": m.message_id(),
                    "receiptHandle": m.receipt_handle(),
                    "body": m.body(),
                    "attributes": attrs,
                    "messageAttributes": {},
                    "md5OfBody": m.md5_of_body(),
                    "eventSource": "aws:sqs",
                    "eventSourceARN": spec.queue_arn,
                    "awsRegion": spec.region,
                })
            })
            .collect();
        let event: SqsEvent = match serde_json::from_value(json!({"Records": records})) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "could not build the SQS event");
                continue;
            }
        };
        let failed: Vec<String> = match handler(event).await {
            Ok(resp) => resp
                .batch_item_failures
                .into_iter()
                .map(|f| f.item_identifier)
                .collect(),
            Err(e) => {
                // A function error: Lambda deletes nothing; every message
                // comes back after its visibility timeout.
                tracing::warn!(error = %e, "function error; the batch will be redelivered");
                continue;
            }
        };
        let entries: Vec<DeleteMessageBatchRequestEntry> = msgs
            .iter()
            .filter(|m| !failed.iter().any(|f| Some(f.as_str()) == m.message_id()))
            .enumerate()
            .filter_map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(format!("m{i}"))
                    .receipt_handle(m.receipt_handle()?)
                    .build()
                    .ok()
            })
            .collect();
        if !entries.is_empty() {
            if let Err(e) = sqs
                .delete_message_batch()
                .queue_url(&spec.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
            {
                tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "delete failed; messages will be redelivered");
            }
        }
    }
}
