//! SQS batch handling as Lambda's event source mapping expects it: one span
//! per record, per-record outcomes, `batchItemFailures` for the ones to
//! redeliver (with a backoff), FIFO order kept by failing every later
//! record of a group once one fails, and a visibility heartbeat: while the
//! invocation lives, its unfinished records stay hidden, so the queue's
//! visibility timeout can be short and a dead worker's record comes back
//! soon after it died.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use tracing::Instrument;

use crate::ports::Queues;

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
        .map(crate::adapters::sqs::Queues::queue_name)
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

/// How a consumer's batches are handled.
#[derive(Debug, Clone, Copy)]
pub struct BatchPolicy {
    /// First backoff of a retried record (doubles per receive).
    pub retry_base_s: u32,
    /// While the batch is handled, its unfinished records are hidden for
    /// this long again every third of it (`None`: no heartbeat; the queue's
    /// visibility timeout must then outlast the whole batch).
    pub keep_hidden_s: Option<u32>,
    /// The queue's visibility timeout, for which a receive hides a record
    /// first. When `keep_hidden_s` is shorter, records still unfinished
    /// after `shorten_after` are hidden for `keep_hidden_s` then: should
    /// the invocation die, they come back that soon rather than after the
    /// whole timeout (records done by then cost no call).
    pub visibility_s: u32,
    pub shorten_after: Duration,
}

/// The records of a batch still being handled: (message id, queue URL, receipt).
type InFlight = Arc<Mutex<Vec<(String, String, String)>>>;

/// Extends the visibility of every record in `in_flight`, forever; the
/// caller drops it when the batch is done.
async fn heartbeat(
    queues: &dyn Queues,
    in_flight: InFlight,
    policy: BatchPolicy,
) -> std::convert::Infallible {
    let Some(seconds) = policy.keep_hidden_s else {
        return futures::future::pending().await;
    };
    let every = Duration::from_millis(u64::from(seconds.max(1)) * 1000 / 3);
    let mut wait = if seconds < policy.visibility_s {
        policy.shorten_after.min(every)
    } else {
        every
    };
    loop {
        tokio::time::sleep(wait).await;
        wait = every;
        let records = in_flight.lock().map(|r| r.clone()).unwrap_or_default();
        for (_, url, receipt) in records {
            queues.keep_hidden(&url, &receipt, seconds).await;
        }
    }
}

/// Handles every record with `handle`; FIFO records sequentially per group,
/// standard records concurrently.
pub async fn process_batch<F, Fut>(
    event: SqsEvent,
    queues: &dyn Queues,
    policy: BatchPolicy,
    handle: F,
) -> SqsBatchResponse
where
    F: Fn(SqsMessage) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let in_flight: InFlight = Arc::new(Mutex::new(
        event
            .records
            .iter()
            .filter_map(|m| {
                let url = queues.url_for_arn(m.event_source_arn.as_deref()?)?;
                Some((
                    m.message_id.clone()?,
                    url.to_string(),
                    m.receipt_handle.clone()?,
                ))
            })
            .collect(),
    ));
    let work = handle_records(
        event,
        queues,
        policy.retry_base_s,
        handle,
        in_flight.clone(),
    );
    tokio::select! {
        resp = work => resp,
        never = heartbeat(queues, in_flight, policy) => match never {},
    }
}

async fn handle_records<F, Fut>(
    event: SqsEvent,
    queues: &dyn Queues,
    retry_base_s: u32,
    handle: F,
    in_flight: InFlight,
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
        let in_flight = in_flight.clone();
        async move {
            let outcome = fut.await;
            if let Ok(mut records) = in_flight.lock() {
                records.retain(|(record, _, _)| *record != id);
            }
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
                        .back_off(&url, &receipt, receives, retry_base_s, min_delay_s)
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
