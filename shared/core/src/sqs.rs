//! SQS batch handling as Lambda's event source mapping expects it: one span
//! per record, per-record outcomes, `batchItemFailures` for the ones to
//! redeliver (with a backoff), and FIFO order kept by failing every later
//! record of a group once one fails.

use std::future::Future;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use tracing::Instrument;

use crate::queues::Queues;

/// What became of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Handled (or deliberately dropped, which was logged): delete it.
    Done,
    /// Failed for a reason worth retrying: redeliver after a backoff of at
    /// least `min_delay_s` (e.g. until another worker's lease expires).
    Retry { reason: String, min_delay_s: u32 },
    /// The invocation died (as a Lambda that crashes or times out): the
    /// record is reported failed and left alone, so it comes back only after
    /// its visibility timeout.
    Abandoned,
}

impl Outcome {
    pub fn retry(reason: impl Into<String>) -> Self {
        Outcome::Retry {
            reason: reason.into(),
            min_delay_s: 0,
        }
    }

    fn failed(&self) -> bool {
        !matches!(self, Outcome::Done)
    }
}

/// The name of the queue a record came from.
pub fn source_queue(msg: &SqsMessage) -> String {
    msg.event_source_arn
        .as_deref()
        .map(Queues::queue_name)
        .unwrap_or_default()
        .to_string()
}

pub fn receive_count(msg: &SqsMessage) -> u32 {
    msg.attributes
        .get("ApproximateReceiveCount")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn failure(id: &str) -> BatchItemFailure {
    let mut f = BatchItemFailure::default();
    f.item_identifier = id.to_string();
    f
}

/// Handles every record with `handle`; FIFO records sequentially per group,
/// standard records concurrently.
pub async fn process_batch<F, Fut>(
    event: SqsEvent,
    queues: &Queues,
    retry_base_s: u32,
    handle: F,
) -> SqsBatchResponse
where
    F: Fn(SqsMessage) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let mut failures = Vec::new();
    let fifo = event
        .records
        .first()
        .and_then(|r| r.event_source_arn.as_deref())
        .is_some_and(|a| a.ends_with(".fifo"));
    let run_one = |msg: SqsMessage| {
        let id = msg.message_id.clone().unwrap_or_default();
        let queue = source_queue(&msg);
        let receives = receive_count(&msg);
        let span = tracing::info_span!("record", message_id = %id, queue = %queue, receives);
        let receipt = msg.receipt_handle.clone().unwrap_or_default();
        let arn = msg.event_source_arn.clone().unwrap_or_default();
        let fut = handle(msg);
        async move {
            let outcome = fut.await;
            (id, outcome, receipt, arn, receives)
        }
        .instrument(span)
    };
    let mut results = Vec::new();
    if fifo {
        // Order matters within a group only: groups run side by side, each
        // in order, and once a record fails the rest of its group fails
        // unprocessed (so it is redelivered in order).
        let mut groups: Vec<(String, Vec<SqsMessage>)> = Vec::new();
        for msg in event.records {
            let group = msg
                .attributes
                .get("MessageGroupId")
                .cloned()
                .unwrap_or_default();
            match groups.iter_mut().find(|(g, _)| *g == group) {
                Some((_, msgs)) => msgs.push(msg),
                None => groups.push((group, vec![msg])),
            }
        }
        let per_group = groups.into_iter().map(|(_, msgs)| async {
            let mut done = Vec::new();
            let mut skipped = Vec::new();
            for msg in msgs {
                if done
                    .last()
                    .is_some_and(|r: &(String, Outcome, String, String, u32)| r.1.failed())
                {
                    skipped.push(msg.message_id.clone().unwrap_or_default());
                    continue;
                }
                done.push(run_one(msg).await);
            }
            (done, skipped)
        });
        for (done, skipped) in futures::future::join_all(per_group).await {
            results.extend(done);
            failures.extend(skipped.iter().map(|id| failure(id)));
        }
    } else {
        results = futures::future::join_all(event.records.into_iter().map(run_one)).await;
    }
    for (id, outcome, receipt, arn, receives) in results {
        match outcome {
            Outcome::Done => {}
            Outcome::Retry {
                reason,
                min_delay_s,
            } => {
                tracing::warn!(message_id = %id, %reason, "record failed; it will be redelivered");
                if let Some(url) = queues.url_for_arn(&arn) {
                    queues
                        .back_off(url, &receipt, receives, retry_base_s, min_delay_s)
                        .await;
                }
                failures.push(failure(&id));
            }
            Outcome::Abandoned => failures.push(failure(&id)),
        }
    }
    let mut resp = SqsBatchResponse::default();
    resp.batch_item_failures = failures;
    resp
}
