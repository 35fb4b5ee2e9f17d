//! The fan-out figures (issue 8): the wall time of a team whose members
//! each sleep, from the POST until the team's Run is terminal (round 2
//! included), against one such member alone measured the same way; and
//! the AWS calls per child Run (its own steps, its start, its end noted on
//! the parent) and per aggregation (the team's Run: its creation, the
//! expansion that creates and starts every child, round 2, its close),
//! each call counted for the Run whose work made it.

use std::time::Instant;

use anyhow::Result;
use serde_json::json;

use super::{pct, sorted, Watcher};
use crate::client::{run_id, Client};
use crate::local::LocalStack;

pub(super) struct FanOut {
    pub members: usize,
    pub sleep_ms: u64,
    pub samples: usize,
}

pub(super) async fn fan_out(
    stack: &LocalStack,
    client: &Client,
    watcher: &Watcher,
    f: &FanOut,
) -> Result<()> {
    let admin = Client::new(
        &stack.api_url,
        &stack.admin_key,
        Some(stack.admin_key.clone()),
    );
    let names: Vec<String> = (0..f.members).map(|i| format!("fan-{i}")).collect();
    for name in &names {
        let def = json!({
            "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
            "system_prompt": "A member of the bench's team.",
        });
        let path = format!("/v1/agents/{name}");
        admin
            .call(reqwest::Method::PUT, &path, Some(&def), true)
            .await?;
    }
    let team = json!({"members": names, "strategy": "fan_out", "max_parallel": f.members});
    admin
        .call(
            reqwest::Method::PUT,
            "/v1/teams/bench-fan",
            Some(&team),
            true,
        )
        .await?;
    let input = format!("/sleep {} report in", f.sleep_ms);
    let (mut alone, mut together) = (Vec::new(), Vec::new());
    for _ in 0..f.samples {
        let at = Instant::now();
        let id = client.create_run(&names[0], &input).await?;
        watcher.watch(&id).await?;
        alone.push(at.elapsed().as_secs_f64() * 1000.0);
        let at = Instant::now();
        let v = client
            .post("/v1/runs", &json!({"team": "bench-fan", "input": input}))
            .await?;
        watcher.watch(&run_id(&v)?).await?;
        together.push(at.elapsed().as_secs_f64() * 1000.0);
    }
    // One more team Run with the call log on, settled before it is read.
    stack.aws.calls.start_log();
    let posted = Instant::now();
    let v = client
        .post("/v1/runs", &json!({"team": "bench-fan", "input": input}))
        .await?;
    let parent = run_id(&v)?;
    watcher.watch(&parent).await?;
    let ended = Instant::now();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let log = stack.aws.calls.drain_log();
    let busy = busy_ms(&log, posted, ended);
    let wall = ended.duration_since(posted).as_secs_f64() * 1000.0;
    let kids = client.get(&format!("/v1/runs/{parent}/children")).await?;
    let kid_ids: Vec<String> = kids["children"]
        .as_array()
        .map(|k| {
            k.iter()
                .filter_map(|c| c["run_id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let for_run = |c: &armada_core::adapters::calls::CallRecord| -> Option<bool> {
        let whose = if c.on_behalf.is_empty() {
            &c.runs
        } else {
            &c.on_behalf
        };
        if whose.iter().any(|r| kid_ids.contains(r)) {
            Some(true)
        } else if whose.contains(&parent) {
            Some(false)
        } else {
            None
        }
    };
    let child_calls = log.iter().filter(|c| for_run(c) == Some(true)).count();
    let parent_calls: Vec<&str> = log
        .iter()
        .filter(|c| for_run(c) == Some(false))
        .map(|c| c.op.as_str())
        .collect();
    let (a, t) = (sorted(alone), sorted(together));
    println!(
        "\nFan-out: a team of {} members each sleeping {} ms in its model call, {} samples",
        f.members, f.sleep_ms, f.samples
    );
    println!(
        "  team p50 {:.0} ms (p95 {:.0}); one member alone p50 {:.0} ms (p95 {:.0}): {:.2}x (aim: within 1.5x)",
        pct(&t, 0.5),
        pct(&t, 0.95),
        pct(&a, 0.5),
        pct(&a, 0.95),
        pct(&t, 0.5) / pct(&a, 0.5)
    );
    println!(
        "  AWS calls per child run {:.1} (its start, its steps, its end noted on the parent); per aggregation {} (creation, expansion creating and starting {} children, round 2, close)",
        child_calls as f64 / kid_ids.len().max(1) as f64,
        parent_calls.len(),
        kid_ids.len()
    );
    println!(
        "  that team run: {wall:.0} ms, of which the emulator was answering the functions' calls {busy:.0} ms (the union of their intervals; one Python process on this machine); the rest {:.0} ms",
        wall - busy
    );
    let mut by_op = std::collections::BTreeMap::<&str, usize>::new();
    for op in parent_calls {
        *by_op.entry(op).or_default() += 1;
    }
    println!("  aggregation's calls: {by_op:?}");
    Ok(())
}

/// How long, between `from` and `to`, at least one of the calls was in
/// flight (the union of their intervals), in ms.
fn busy_ms(log: &[armada_core::adapters::calls::CallRecord], from: Instant, to: Instant) -> f64 {
    let mut spans: Vec<(Instant, Instant)> = log
        .iter()
        .filter_map(|c| Some((c.start.max(from), c.end?.min(to))))
        .filter(|(a, b)| a < b)
        .collect();
    spans.sort();
    let mut total = 0.0;
    let mut current: Option<(Instant, Instant)> = None;
    for (a, b) in spans {
        match current {
            Some((s, e)) if a <= e => current = Some((s, e.max(b))),
            Some((s, e)) => {
                total += e.duration_since(s).as_secs_f64();
                current = Some((a, b));
            }
            None => current = Some((a, b)),
        }
    }
    if let Some((s, e)) = current {
        total += e.duration_since(s).as_secs_f64();
    }
    total * 1000.0
}
