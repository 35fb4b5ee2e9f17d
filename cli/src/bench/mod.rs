//! `armada bench`: end-to-end latency, throughput and AWS API calls per Run
//! through a local stack with the scripted model, each Run against its
//! floor (the emulator's own time on that Run's calls, measured as it ran),
//! plus each function binary's size, init time and peak RSS under the
//! Lambda Runtime API. Numbers are reported, never asserted.
//!
//! By phase: [`watch`] waits for Runs to end; [`pipeline`] runs a phase
//! and reports it; [`floor`] accounts each Run; [`fill`] loads finished
//! Runs; [`sandbox`] and [`runtime_api`] measure sandboxes and binaries;
//! [`durability`] the emulator's journal and restarts.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;

use armada_core::adapters::aws::AwsClients;

mod durability;
mod fanout;
mod fill;
mod floor;
mod pipeline;
mod runtime_api;
mod sandbox;
mod watch;

use floor::Posted;
use pipeline::phase;
use runtime_api::binaries;
use sandbox::{confinement_overhead, sandboxes};
use watch::Watcher;

use crate::client::Client;
use crate::local::{emulator, LocalOptions, LocalStack};

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub runs: usize,
    pub session_messages: usize,
    /// Runs in flight in each throughput phase (one phase per level).
    pub concurrency: Vec<usize>,
    /// Also measure the release function binaries (size, init, RSS).
    pub binaries: bool,
    /// Samples of each sandbox measurement (cold start, warm reuse, wake);
    /// 0 skips the sandbox phase.
    pub sandbox_samples: usize,
    /// After the one-at-a-time phase, load this many finished Runs and
    /// measure it again (0: don't).
    pub fill: usize,
    /// Members of the fan-out team measured against one member alone (0
    /// skips the fan-out phase).
    pub fan_out: usize,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v
}

pub async fn run(root: &Path, opts: BenchOptions) -> Result<()> {
    let mut lo = LocalOptions::new(root);
    lo.api_port = 0;
    // The bench measures the platform, not a tenant's quota.
    lo.parameters
        .insert("TenantRunsPerMinute".into(), "1000000".into());
    lo.parameters
        .insert("TenantActiveRuns".into(), "100000".into());
    lo.parameters
        .insert("TenantConcurrentLongPolls".into(), "1000".into());
    lo.stack = format!("armada-bench-{}", &armada_core::clock::new_id("b")[28..]);
    if lo.endpoint.is_none() {
        let default = "http://127.0.0.1:4566";
        if emulator::answers(default).await {
            lo.endpoint = Some(default.into());
        } else {
            lo.emulator_port = crate::local::process::free_port()?;
            lo.emulator_dies_with_us = true;
            // Durable, as `armada up` runs it.
            lo.emulator_state = Some(emulator::ensure_state_dir(root)?.join(lo.stack.clone()));
        }
    }
    let own_emulator = lo.endpoint.is_none().then(|| lo.emulator());
    let stack = LocalStack::start(lo).await?;
    let client = Client::new(&stack.api_url, &stack.tenant_key, None);
    let region = stack
        .aws
        .sdk_config
        .region()
        .map(|r| r.as_ref().to_string());
    let own_aws =
        AwsClients::load_local(&stack.endpoint, region.as_deref().unwrap_or("us-east-1")).await;
    let watcher = Watcher::start(own_aws.dynamo.clone(), stack.svc.cfg.runs_table.clone());
    let levels = if opts.concurrency.is_empty() {
        vec![8]
    } else {
        opts.concurrency.clone()
    };
    println!(
        "armada bench: {} runs per throughput phase, {} session messages, concurrency {levels:?}",
        opts.runs, opts.session_messages
    );
    println!(
        "  emulator {}  stack {}",
        stack.endpoint,
        stack.template.stack()
    );

    // Warm up, then record the calls of one Run on its own.
    for _ in 0..3 {
        let id = client.create_run("assistant", "warm up").await?;
        watcher.watch(&id).await?;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stack.aws.calls.start_log();
    stack.esm_aws.calls.start_log();
    let alone_id = client.create_run("assistant", "one alone").await?;
    watcher.watch(&alone_id).await?;
    // Let the dispatcher settle it (RunTerminal → CLOSED_*).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fn_ops: Vec<String> = stack
        .aws
        .calls
        .drain_log()
        .into_iter()
        .map(|c| c.op)
        .collect();
    let esm_ops: Vec<String> = stack
        .esm_aws
        .calls
        .drain_log()
        .into_iter()
        .map(|c| c.op)
        .collect();
    println!(
        "\nOne Run alone: {} function calls: {}",
        fn_ops.len(),
        fn_ops.join(" ")
    );
    println!(
        "  event source mapping calls meanwhile: {} ({} receives)",
        esm_ops.len(),
        esm_ops
            .iter()
            .filter(|o| o.ends_with("ReceiveMessage"))
            .count()
    );

    let one_run = |c: Client, w: Watcher| {
        move |i: usize| {
            let (c, w) = (c.clone(), w.clone());
            async move {
                let at = Instant::now();
                let run_id = c.create_run("assistant", &format!("question {i}")).await?;
                w.watch(&run_id).await?;
                Ok(vec![Posted {
                    run_id,
                    session: None,
                    at,
                }])
            }
        }
    };
    let alone_n = (opts.runs / 5).max(10);
    let emulator_pid = stack.emulator_pid();
    let rss_empty = emulator_pid.and_then(fill::rss_kib);
    let cpu_before = fill::Cpu::now(emulator_pid);
    let alone = phase(
        &stack,
        "Single-answer runs, one at a time",
        alone_n,
        1,
        one_run(client.clone(), watcher.clone()),
    )
    .await?;
    let cpu_alone = fill::Cpu::now(emulator_pid).per(&cpu_before, alone_n);
    let mut filled = None;
    if opts.fill > 0 {
        let (runs, events) = (&stack.svc.cfg.runs_table, &stack.svc.cfg.run_events_table);
        let took = fill::fill(&own_aws, runs, events, &alone_id, opts.fill).await?;
        let rss_filled = emulator_pid.and_then(fill::rss_kib);
        let cpu_before = fill::Cpu::now(emulator_pid);
        let name = format!(
            "Single-answer runs, one at a time, after {} runs",
            opts.fill
        );
        let p = phase(
            &stack,
            &name,
            alone_n,
            1,
            one_run(client.clone(), watcher.clone()),
        )
        .await?;
        let cpu = fill::Cpu::now(emulator_pid).per(&cpu_before, alone_n);
        filled = Some((took, rss_filled, p, cpu));
    }
    let mut concurrent = Vec::new();
    for &c in &levels {
        let name = format!("Single-answer runs, {c} at a time");
        let work = one_run(client.clone(), watcher.clone());
        concurrent.push(phase(&stack, &name, opts.runs, c, work).await?);
    }
    let workers = levels[0].max(1);
    let per_worker = (opts.session_messages / workers).max(1);
    let (c, w) = (client.clone(), watcher.clone());
    let sessions = phase(&stack, "Session messages", workers, workers, move |_| {
        let (c, w) = (c.clone(), w.clone());
        async move {
            let sid = c.create_session("assistant").await?;
            let mut runs = Vec::new();
            for m in 0..per_worker {
                let at = Instant::now();
                let run_id = c.send_message(&sid, &format!("message {m}")).await?;
                w.watch(&run_id).await?;
                runs.push(Posted {
                    run_id,
                    session: Some(sid.clone()),
                    at,
                });
            }
            Ok(runs)
        }
    })
    .await?;

    println!(
        "\nFloor: per Run, the emulator's time on that Run's own calls up to its terminal \
         commit and on its queue hops, as measured during the phase (see bench/floor.rs); \
         latency: from the POST to the end of the terminal commit."
    );
    alone.report();
    let mib = |k: Option<u64>| {
        k.map_or("n/a".to_string(), |k| {
            format!("{:.0} MB", k as f64 / 1024.0)
        })
    };
    let cpu_line = |(ours, emulator): (f64, Option<f64>)| {
        format!(
            "  CPU per run: ours {ours:.1} ms (all functions, pollers and this bench's client), emulator {}",
            emulator.map_or("n/a (not ours)".into(), |e| format!("{e:.1} ms"))
        )
    };
    println!("{}", cpu_line(cpu_alone));
    println!("  emulator RSS {}", mib(rss_empty));
    if let Some((took, rss_filled, p, cpu)) = &filled {
        println!(
            "\nFilled with {} finished runs (copies of a real one's items) in {:.1} s; emulator RSS {}",
            opts.fill,
            took.as_secs_f64(),
            mib(*rss_filled)
        );
        p.report();
        println!("{}", cpu_line(*cpu));
        println!(
            "  filled / empty: latency p50 {:.2}x, floor p50 {:.2}x",
            p.latency_p50() / alone.latency_p50(),
            p.floor_p50() / alone.floor_p50()
        );
    }
    for p in &concurrent {
        p.report();
    }
    sessions.report();

    if opts.fan_out > 0 {
        let f = fanout::FanOut {
            members: opts.fan_out,
            sleep_ms: 1000,
            samples: 5,
        };
        fanout::fan_out(&stack, &client, &watcher, &f).await?;
    }
    if opts.sandbox_samples > 0 {
        sandboxes(&stack, &client, opts.sandbox_samples).await?;
        confinement_overhead(&stack, 100).await?;
    }
    if opts.binaries {
        let env = stack.template.environment("harness")?;
        binaries(root, &stack, &env).await?;
    }
    let pid = stack.emulator_pid();
    stack.stop().await;
    if let (Some(how), Some(pid)) = (own_emulator, pid) {
        durability::journal_cost(root, 1000).await?;
        let pid = durability::restart_times(root, &how, pid).await?;
        crate::local::process::stop(pid, Duration::from_secs(300));
        if let Some(state) = &how.state {
            let _ = std::fs::remove_dir_all(state);
        }
    } else if let Some(pid) = pid {
        crate::local::process::terminate(pid);
    }
    Ok(())
}
