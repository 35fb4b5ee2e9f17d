//! Waiting for Runs to end, on clients of the bench's own (so the
//! functions' call log stays theirs) and gently: one consistent
//! BatchGetItem every 50 ms for every Run in flight. When a Run ended is
//! read from the call log (the end of its terminal commit), not from here.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};
use tokio::sync::{mpsc, oneshot};

use armada_domain::run::RunState;

type Waiter = (String, oneshot::Sender<Result<()>>);

/// How long a Run may take before the bench gives up on it.
const GIVE_UP: Duration = Duration::from_secs(120);

#[derive(Clone)]
pub(super) struct Watcher {
    tx: mpsc::UnboundedSender<Waiter>,
}

impl Watcher {
    pub(super) fn start(dynamo: aws_sdk_dynamodb::Client, table: String) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Waiter>();
        tokio::spawn(async move {
            let mut pending: Vec<(String, oneshot::Sender<Result<()>>, Instant)> = Vec::new();
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                loop {
                    match rx.try_recv() {
                        Ok((id, reply)) => pending.push((id, reply, Instant::now())),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => return,
                    }
                }
                let mut done = HashSet::new();
                for chunk in pending.chunks(100) {
                    done.extend(terminal_among(&dynamo, &table, chunk).await);
                }
                let mut still = Vec::new();
                for (id, reply, since) in pending.drain(..) {
                    if done.contains(&id) {
                        let _ = reply.send(Ok(()));
                    } else if since.elapsed() > GIVE_UP {
                        let _ = reply.send(Err(anyhow!("run {id} did not finish")));
                    } else {
                        still.push((id, reply, since));
                    }
                }
                pending = still;
            }
        });
        Watcher { tx }
    }

    /// Returns once the Run is terminal.
    pub(super) async fn watch(&self, run_id: &str) -> Result<()> {
        let (reply, wait) = oneshot::channel();
        self.tx
            .send((run_id.to_string(), reply))
            .map_err(|_| anyhow!("the watcher stopped"))?;
        wait.await.map_err(|_| anyhow!("the watcher stopped"))?
    }
}

/// The ids among `chunk` whose Run is terminal (a read that fails is tried
/// again on the next tick).
async fn terminal_among<T>(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    chunk: &[(String, T, Instant)],
) -> Vec<String> {
    let keys = chunk
        .iter()
        .map(|(id, _, _)| {
            std::collections::HashMap::from([("run_id".to_string(), AttributeValue::S(id.clone()))])
        })
        .collect();
    let Ok(ka) = KeysAndAttributes::builder()
        .set_keys(Some(keys))
        .projection_expression("run_id, #s")
        .expression_attribute_names("#s", "state")
        .consistent_read(true)
        .build()
    else {
        return vec![];
    };
    let Ok(out) = dynamo
        .batch_get_item()
        .request_items(table, ka)
        .send()
        .await
    else {
        return vec![];
    };
    out.responses()
        .and_then(|r| r.get(table))
        .into_iter()
        .flatten()
        .filter(|item| {
            item.get("state")
                .and_then(|v| v.as_s().ok())
                .and_then(|s| RunState::parse(s))
                .is_some_and(RunState::is_terminal)
        })
        .filter_map(|item| item.get("run_id").and_then(|v| v.as_s().ok()).cloned())
        .collect()
}
