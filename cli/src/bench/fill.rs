//! `armada bench --fill N`: the stack as it is after N finished Runs. The
//! items one real finished Run left (its record in the runs table and its
//! events) are copied N times under new run ids, so the emulator holds what
//! N Runs would have left, item for item and byte for byte, without N Runs'
//! wall time. Then the same phases are measured again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use futures::{stream, TryStreamExt};

use armada_core::adapters::aws::AwsClients;

type Item = HashMap<String, AttributeValue>;

/// The items of one Run: its record and its events.
async fn items_of(
    aws: &AwsClients,
    runs: &str,
    events: &str,
    run_id: &str,
) -> Result<Vec<(String, Item)>> {
    let key = AttributeValue::S(run_id.to_string());
    let record = aws
        .dynamo
        .get_item()
        .table_name(runs)
        .key("run_id", key.clone())
        .consistent_read(true)
        .send()
        .await?
        .item
        .ok_or_else(|| anyhow!("run {run_id} is not in {runs}"))?;
    let mut out = vec![(runs.to_string(), record)];
    let mut start = None;
    loop {
        let page = aws
            .dynamo
            .query()
            .table_name(events)
            .key_condition_expression("run_id = :r")
            .expression_attribute_values(":r", key.clone())
            .set_exclusive_start_key(start)
            .send()
            .await?;
        out.extend(
            page.items()
                .iter()
                .cloned()
                .map(|i| (events.to_string(), i)),
        );
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            return Ok(out);
        }
    }
}

/// Writes `n` copies of the finished Run `run_id` (each under a new id);
/// how long it took.
pub async fn fill(
    aws: &AwsClients,
    runs: &str,
    events: &str,
    run_id: &str,
    n: usize,
) -> Result<Duration> {
    let start = Instant::now();
    let template = items_of(aws, runs, events, run_id).await?;
    let copies = (0..n).flat_map(|_| {
        let id = AttributeValue::S(armada_core::clock::new_id("run"));
        template.iter().map(move |(table, item)| {
            let mut item = item.clone();
            item.insert("run_id".into(), id.clone());
            (table.clone(), item)
        })
    });
    // BatchWriteItem takes 25 puts; a few batches in flight at once.
    let batches: Vec<Vec<(String, Item)>> = copies
        .collect::<Vec<_>>()
        .chunks(25)
        .map(<[_]>::to_vec)
        .collect();
    stream::iter(batches.into_iter().map(Ok::<_, anyhow::Error>))
        .try_for_each_concurrent(4, |batch| async move { write_batch(aws, batch).await })
        .await?;
    Ok(start.elapsed())
}

/// One BatchWriteItem, with what the service left unprocessed sent again.
async fn write_batch(aws: &AwsClients, batch: Vec<(String, Item)>) -> Result<()> {
    let mut pending: HashMap<String, Vec<WriteRequest>> = HashMap::new();
    for (table, item) in batch {
        let put = PutRequest::builder().set_item(Some(item)).build()?;
        pending
            .entry(table)
            .or_default()
            .push(WriteRequest::builder().put_request(put).build());
    }
    for attempt in 0..10u32 {
        let out = aws
            .dynamo
            .batch_write_item()
            .set_request_items(Some(pending))
            .send()
            .await?;
        pending = out.unprocessed_items.unwrap_or_default();
        pending.retain(|_, v| !v.is_empty());
        if pending.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50 << attempt.min(5))).await;
    }
    Err(anyhow!(
        "the emulator kept items unprocessed after 10 attempts"
    ))
}

/// A process's resident memory now (`VmRSS`), in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_field(pid, "VmRSS:")
}

pub fn status_field(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// CPU time (user + system) a process has used so far, in ms.
pub fn cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at ")".
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks * 1000.0 / clock_ticks_per_second())
}

fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// CPU used so far by this process (every function, poller and the bench's
/// own client) and by the emulator, when it is ours to look at.
#[derive(Debug, Clone, Copy)]
pub struct Cpu {
    pub ours_ms: f64,
    pub emulator_ms: Option<f64>,
}

impl Cpu {
    pub fn now(emulator_pid: Option<u32>) -> Self {
        Cpu {
            ours_ms: cpu_ms(std::process::id()).unwrap_or(0.0),
            emulator_ms: emulator_pid.and_then(cpu_ms),
        }
    }

    /// CPU per unit of work since `before`.
    pub fn per(&self, before: &Cpu, n: usize) -> (f64, Option<f64>) {
        let n = n.max(1) as f64;
        (
            (self.ours_ms - before.ours_ms) / n,
            self.emulator_ms
                .zip(before.emulator_ms)
                .map(|(a, b)| (a - b) / n),
        )
    }
}
