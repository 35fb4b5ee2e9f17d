//! SQS pollers that feed handlers exactly as Lambda's event source mapping
//! does: long polling, batches up to the mapping's size, the record JSON
//! Lambda sends, deletion of what succeeded, and nothing deleted on a
//! function error. Like the mapping, a poller does not wait for one batch
//! before it receives the next: batches run side by side up to the
//! function's concurrency (Lambda scales a FIFO queue's consumers with its
//! message groups; the queue itself never hands out a group's next message
//! while one is in flight). Redelivery, FIFO group order and the redrive
//! to a DLQ after maxReceiveCount are the queue's own (the emulator's).
//!
//! Under `armada chaos` a poller also delivers as SQS may at its worst
//! ([`DeliveryFaults`]): a batch handed to a second invocation at the
//! same time, an old batch handed again later (its receipts stale, so
//! nothing of it is deleted), and a batch handed late.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    MessageSystemAttributeName,
};
use futures::future::BoxFuture;
use serde_json::json;
use tokio::sync::watch;

/// Deliveries as SQS's at-least-once allows them, injected on a seeded
/// schedule: each batch is handed twice at once with probability
/// `duplicate_percent`, before each batch an earlier one of the same queue
/// is handed again with probability `replay_percent`, and a batch reaches
/// its function late (up to `max_delay`, its messages in flight meanwhile)
/// with probability `delay_percent`.
#[derive(Debug)]
pub struct DeliveryFaults {
    pub duplicate_percent: u64,
    pub replay_percent: u64,
    pub delay_percent: u64,
    pub max_delay: Duration,
    rng: std::sync::Mutex<crate::rng::Rng>,
    pub duplicated: std::sync::atomic::AtomicU64,
    pub replayed: std::sync::atomic::AtomicU64,
    pub delayed: std::sync::atomic::AtomicU64,
}

impl DeliveryFaults {
    pub fn new(seed: u64, duplicate_percent: u64, replay_percent: u64) -> Self {
        DeliveryFaults {
            duplicate_percent,
            replay_percent,
            delay_percent: 0,
            max_delay: Duration::ZERO,
            rng: std::sync::Mutex::new(crate::rng::Rng::new(seed)),
            duplicated: Default::default(),
            replayed: Default::default(),
            delayed: Default::default(),
        }
    }

    /// Also hands `percent` of batches late, by up to `max`.
    pub fn with_delays(mut self, percent: u64, max: Duration) -> Self {
        self.delay_percent = percent;
        self.max_delay = max;
        self
    }

    /// How late this batch is handed, if it is.
    fn delay(&self) -> Option<Duration> {
        if self.delay_percent == 0 || !self.draw(self.delay_percent) {
            return None;
        }
        let ms = self
            .rng
            .lock()
            .map(|mut r| r.between(0, self.max_delay.as_millis() as u64))
            .unwrap_or(0);
        self.delayed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(Duration::from_millis(ms))
    }

    fn draw(&self, percent: u64) -> bool {
        self.rng
            .lock()
            .map(|mut r| r.chance(percent))
            .unwrap_or(false)
    }

    fn pick(&self, n: usize) -> usize {
        self.rng
            .lock()
            .map(|mut r| r.between(0, n.saturating_sub(1) as u64) as usize)
            .unwrap_or(0)
    }
}

/// How many earlier batches a poller keeps to hand again.
const REPLAYABLE: usize = 32;

pub type SqsHandler =
    Arc<dyn Fn(SqsEvent) -> BoxFuture<'static, Result<SqsBatchResponse, String>> + Send + Sync>;

#[derive(Debug, Clone)]
pub struct PollerSpec {
    pub queue_url: String,
    pub queue_arn: String,
    pub batch_size: i32,
    pub wait_seconds: i32,
    pub region: String,
    /// How long a batch held back before its function begins (a late
    /// delivery) is hidden at a time: as long as a dead worker's step
    /// (`CrashReturnSeconds`), since a host killed meanwhile takes the
    /// batch with it (Lambda's poller would outlive the function).
    pub hold_s: i32,
}

/// Receives batches and hands each to `handler` in a task of its own, at
/// most `concurrency` at once. Aborting the poller aborts its batches (as
/// `kill -9` of the functions host would); a shutdown lets them finish.
pub async fn run(
    sqs: aws_sdk_sqs::Client,
    spec: PollerSpec,
    handler: SqsHandler,
    concurrency: usize,
    faults: Option<Arc<DeliveryFaults>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut earlier: std::collections::VecDeque<SqsEvent> = std::collections::VecDeque::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut in_flight = tokio::task::JoinSet::new();
    let mut backoff = Duration::from_millis(200);
    loop {
        while in_flight.try_join_next().is_some() {}
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = shutdown.changed() => break,
        };
        let receive = sqs
            .receive_message()
            .queue_url(&spec.queue_url)
            .max_number_of_messages(spec.batch_size.clamp(1, 10))
            .wait_time_seconds(spec.wait_seconds)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send();
        let out = tokio::select! {
            r = receive => r,
            _ = shutdown.changed() => break,
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
                    _ = shutdown.changed() => break,
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
                sqs_record(&Received {
                    message_id: m.message_id().unwrap_or_default(),
                    receipt_handle: m.receipt_handle().unwrap_or_default(),
                    body: m.body().unwrap_or_default(),
                    md5_of_body: m.md5_of_body().unwrap_or_default(),
                    attributes: attrs,
                    queue_arn: &spec.queue_arn,
                    region: &spec.region,
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
        if let Some(f) = &faults {
            use std::sync::atomic::Ordering::Relaxed;
            // Handed to a second invocation at once, or an old batch again:
            // their answers delete nothing (the second's receipts are the
            // first's, an old one's are stale).
            let again = (!earlier.is_empty() && f.draw(f.replay_percent))
                .then(|| earlier[f.pick(earlier.len())].clone());
            let twice = f.draw(f.duplicate_percent).then(|| event.clone());
            for (extra, counter) in [(again, &f.replayed), (twice, &f.duplicated)] {
                if let Some(extra) = extra {
                    counter.fetch_add(1, Relaxed);
                    let handler = handler.clone();
                    in_flight.spawn(async move {
                        let _ = handler(extra).await;
                    });
                }
            }
            earlier.push_back(event.clone());
            if earlier.len() > REPLAYABLE {
                earlier.pop_front();
            }
        }
        let late = faults.as_ref().and_then(|f| f.delay());
        let (sqs, spec, handler) = (sqs.clone(), spec.clone(), handler.clone());
        in_flight.spawn(async move {
            if let Some(late) = late {
                tokio::select! {
                    _ = tokio::time::sleep(late) => {}
                    never = keep_hidden(&sqs, &spec, &msgs) => match never {},
                }
            }
            handle_batch(&sqs, &spec, &handler, event, &msgs).await;
            drop(permit);
        });
    }
    // Shut down: the batches in flight finish (their messages are deleted
    // or left to come back), none is started.
    while in_flight.join_next().await.is_some() {}
}

/// Keeps `msgs` hidden `spec.hold_s` at a time, every third of it, until
/// dropped; a failed extension leaves them to the queue's timeout.
async fn keep_hidden(
    sqs: &aws_sdk_sqs::Client,
    spec: &PollerSpec,
    msgs: &[aws_sdk_sqs::types::Message],
) -> std::convert::Infallible {
    let every = Duration::from_millis(spec.hold_s.max(1) as u64 * 1000 / 3);
    loop {
        let entries: Vec<ChangeMessageVisibilityBatchRequestEntry> = msgs
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(format!("m{i}"))
                    .receipt_handle(m.receipt_handle()?)
                    .visibility_timeout(spec.hold_s)
                    .build()
                    .ok()
            })
            .collect();
        let kept = sqs
            .change_message_visibility_batch()
            .queue_url(&spec.queue_url)
            .set_entries(Some(entries))
            .send()
            .await;
        if let Err(e) = kept {
            tracing::debug!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "a late batch not kept hidden");
        }
        tokio::time::sleep(every).await;
    }
}

/// A message as ReceiveMessage returned it, with its queue.
pub struct Received<'a> {
    pub message_id: &'a str,
    pub receipt_handle: &'a str,
    pub body: &'a str,
    pub md5_of_body: &'a str,
    /// Its system attributes (a FIFO queue's include `MessageGroupId`,
    /// `MessageDeduplicationId` and `SequenceNumber`).
    pub attributes: serde_json::Map<String, serde_json::Value>,
    pub queue_arn: &'a str,
    pub region: &'a str,
}

/// The record of one message in the SQS event Lambda hands a function
/// (its shape checked against AWS's documented examples, see
/// `tests/fixtures/aws`).
pub fn sqs_record(m: &Received<'_>) -> serde_json::Value {
    json!({
        "messageId": m.message_id,
        "receiptHandle": m.receipt_handle,
        "body": m.body,
        "attributes": m.attributes,
        "messageAttributes": {},
        "md5OfBody": m.md5_of_body,
        "eventSource": "aws:sqs",
        "eventSourceARN": m.queue_arn,
        "awsRegion": m.region,
    })
}

/// Runs one batch through the handler and deletes what succeeded.
async fn handle_batch(
    sqs: &aws_sdk_sqs::Client,
    spec: &PollerSpec,
    handler: &SqsHandler,
    event: SqsEvent,
    msgs: &[aws_sdk_sqs::types::Message],
) {
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
            return;
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
