//! The measured phases: Runs posted by `concurrency` clients, each waiting
//! for its Run to end, with the functions' and the pollers' calls logged
//! meanwhile and every Run accounted against its floor ([`super::floor`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::floor::{account, Posted, RunTiming};
use super::{pct, sorted};
use crate::local::LocalStack;

/// A phase's Runs and calls.
pub(super) struct Phase {
    pub name: String,
    pub concurrency: usize,
    pub timings: Vec<RunTiming>,
    pub wall: Duration,
    pub calls: BTreeMap<String, u64>,
    pub esm_calls: BTreeMap<String, u64>,
}

/// Runs `n` items of `work` on `concurrency` clients. An item posts its
/// Runs, waits for each to end, and returns them with the instant it
/// posted each.
pub(super) async fn phase<F, Fut>(
    stack: &LocalStack,
    name: &str,
    n: usize,
    concurrency: usize,
    work: F,
) -> Result<Phase>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Vec<Posted>>> + Send,
{
    let workers = concurrency.max(1);
    // Settle what the phase before left (closing its last Runs), then log.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stack.aws.calls.reset();
    stack.esm_aws.calls.reset();
    stack.aws.calls.drain_log();
    stack.esm_aws.calls.drain_log();
    let start = Instant::now();
    let work = Arc::new(work);
    let mut tasks = Vec::new();
    for w in 0..workers {
        let work = work.clone();
        let share = n / workers + usize::from(w < n % workers);
        tasks.push(tokio::spawn(async move {
            let mut all = Vec::new();
            for i in 0..share {
                all.extend(work(w * 1_000_000 + i).await?);
            }
            Ok::<_, anyhow::Error>(all)
        }));
    }
    let mut runs = Vec::new();
    for t in tasks {
        runs.extend(t.await??);
    }
    let wall = start.elapsed();
    let calls = stack.aws.calls.drain_log();
    let receives = stack.esm_aws.calls.drain_log();
    Ok(Phase {
        name: name.to_string(),
        concurrency: workers,
        timings: account(&runs, &calls, &receives)?,
        wall,
        calls: stack.aws.calls.snapshot(),
        esm_calls: stack.esm_aws.calls.snapshot(),
    })
}

fn per_run(calls: &BTreeMap<String, u64>, n: usize) -> String {
    calls
        .iter()
        .map(|(k, v)| format!("{k} {:.1}", *v as f64 / n as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Phase {
    pub fn latency_p50(&self) -> f64 {
        pct(
            &sorted(self.timings.iter().map(|t| t.latency_ms).collect()),
            0.5,
        )
    }

    pub fn floor_p50(&self) -> f64 {
        pct(
            &sorted(self.timings.iter().map(|t| t.floor_ms).collect()),
            0.5,
        )
    }

    /// Prints latency and throughput beside their floors, the floor's
    /// parts, and the AWS calls per Run.
    pub fn report(&self) {
        let n = self.timings.len().max(1);
        let lat = sorted(self.timings.iter().map(|t| t.latency_ms).collect());
        let ours = sorted(
            self.timings
                .iter()
                .map(|t| t.latency_ms - t.floor_ms)
                .collect(),
        );
        let mean_floor = self.timings.iter().map(|t| t.floor_ms).sum::<f64>() / n as f64;
        let rate = n as f64 / self.wall.as_secs_f64();
        // The rate the same clients would reach if every Run cost only its floor.
        let floor_rate = self.concurrency as f64 * 1000.0 / mean_floor;
        println!(
            "\n{}: {n} in {:.2} s = {rate:.1} Runs/s (floor at this concurrency {floor_rate:.1}/s, {:.2}x)",
            self.name,
            self.wall.as_secs_f64(),
            floor_rate / rate
        );
        println!(
            "  latency p50 {:.1} ms  p95 {:.1} ms  floor p50 {:.1} ms  ratio {:.2}x  ours p50 {:.1} ms",
            pct(&lat, 0.5),
            pct(&lat, 0.95),
            self.floor_p50(),
            self.latency_p50() / self.floor_p50(),
            pct(&ours, 0.5)
        );
        let mut parts: BTreeMap<&str, f64> = BTreeMap::new();
        for t in &self.timings {
            for (op, v) in &t.by_op {
                *parts.entry(op).or_default() += v / n as f64;
            }
        }
        let parts: Vec<String> = parts.iter().map(|(op, v)| format!("{op} {v:.1}")).collect();
        println!("  floor per run, ms: {}", parts.join(", "));
        println!(
            "  function AWS calls per run: {:.1}  [{}]",
            self.calls.values().sum::<u64>() as f64 / n as f64,
            per_run(&self.calls, n)
        );
        println!(
            "  event source mapping calls per run: {:.1}  [{}]",
            self.esm_calls.values().sum::<u64>() as f64 / n as f64,
            per_run(&self.esm_calls, n)
        );
    }
}
