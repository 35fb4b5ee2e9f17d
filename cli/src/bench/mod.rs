//! `armada bench`: end-to-end latency, throughput and AWS API calls per Run
//! through a local stack with the scripted model, against the floor (the
//! same sequence of raw emulator calls, timed in the same run), plus each
//! function binary's size, init time and peak RSS under the Lambda Runtime
//! API. Numbers are reported, never asserted.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use armada_core::aws::AwsClients;
use armada_core::ports::RunEvents as _;
use armada_core::store::runs::RunStore;

mod fill;
mod runtime_api;
mod sandbox;

use runtime_api::binaries;
use sandbox::{confinement_overhead, sandboxes};

use crate::client::Client;
use crate::local::{emulator, LocalOptions, LocalStack};

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub runs: usize,
    pub session_messages: usize,
    pub concurrency: usize,
    /// Also measure the release function binaries (size, init, RSS).
    pub binaries: bool,
    /// Samples of each sandbox measurement (cold start, warm reuse, wake);
    /// 0 skips the sandbox phase.
    pub sandbox_samples: usize,
    /// After the one-at-a-time phase, load this many finished Runs and
    /// measure it again (0: don't).
    pub fill: usize,
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

fn wall_ms() -> i64 {
    armada_core::clock::Clock::default().now_ms()
}

/// Watches for Runs to end, on clients of its own (so the counts stay
/// clean) and gently: one consistent BatchGetItem every 50 ms for every Run
/// in flight, so watching does not load the emulator. A Run's end is the
/// time of its terminal event.
#[derive(Clone)]
struct Watcher {
    tx: tokio::sync::mpsc::UnboundedSender<(String, tokio::sync::oneshot::Sender<Result<i64>>)>,
}

impl Watcher {
    fn start(store: RunStore, dynamo: aws_sdk_dynamodb::Client, table: String) -> Self {
        use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(
            String,
            tokio::sync::oneshot::Sender<Result<i64>>,
        )>();
        tokio::spawn(async move {
            let mut pending: Vec<(String, tokio::sync::oneshot::Sender<Result<i64>>, Instant)> =
                Vec::new();
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                loop {
                    match rx.try_recv() {
                        Ok((id, reply)) => pending.push((id, reply, Instant::now())),
                        Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                        Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => return,
                    }
                }
                let mut done = std::collections::HashSet::new();
                for chunk in pending.chunks(100) {
                    let keys = chunk
                        .iter()
                        .map(|(id, _, _)| {
                            std::collections::HashMap::from([(
                                "run_id".to_string(),
                                AttributeValue::S(id.clone()),
                            )])
                        })
                        .collect();
                    let Ok(ka) = KeysAndAttributes::builder()
                        .set_keys(Some(keys))
                        .projection_expression("run_id, #s")
                        .expression_attribute_names("#s", "state")
                        .consistent_read(true)
                        .build()
                    else {
                        continue;
                    };
                    let Ok(out) = dynamo
                        .batch_get_item()
                        .request_items(&table, ka)
                        .send()
                        .await
                    else {
                        continue;
                    };
                    for item in out
                        .responses()
                        .and_then(|r| r.get(&table))
                        .into_iter()
                        .flatten()
                    {
                        let state = item
                            .get("state")
                            .and_then(|v| v.as_s().ok())
                            .and_then(|s| armada_domain::run::RunState::parse(s));
                        if state.is_some_and(|s| s.is_terminal()) {
                            if let Some(id) = item.get("run_id").and_then(|v| v.as_s().ok()) {
                                done.insert(id.clone());
                            }
                        }
                    }
                }
                let mut still = Vec::new();
                for (id, reply, since) in pending.drain(..) {
                    if done.contains(&id) {
                        let end = match store.all_events(&id).await {
                            Ok(events) => events
                                .iter()
                                .find(|e| crate::client::TERMINAL_EVENTS.contains(&e.kind.as_str()))
                                .map(|e| e.at_ms)
                                .ok_or_else(|| {
                                    anyhow!("run {id} is terminal without a terminal event")
                                }),
                            Err(e) => Err(e.into()),
                        };
                        let _ = reply.send(end);
                    } else if since.elapsed() > Duration::from_secs(120) {
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

    async fn watch(&self, run_id: &str) -> Result<i64> {
        let (reply, wait) = tokio::sync::oneshot::channel();
        self.tx
            .send((run_id.to_string(), reply))
            .map_err(|_| anyhow!("the watcher stopped"))?;
        wait.await.map_err(|_| anyhow!("the watcher stopped"))?
    }
}

struct Phase {
    latencies_ms: Vec<f64>,
    wall: Duration,
    calls: BTreeMap<String, u64>,
    esm_calls: BTreeMap<String, u64>,
}

async fn phase<F, Fut>(stack: &LocalStack, n: usize, concurrency: usize, work: F) -> Result<Phase>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Vec<f64>>> + Send,
{
    stack.aws.calls.reset();
    stack.esm_aws.calls.reset();
    let start = Instant::now();
    let work = Arc::new(work);
    let mut tasks = Vec::new();
    for w in 0..concurrency.max(1) {
        let work = work.clone();
        let share = n / concurrency.max(1) + usize::from(w < n % concurrency.max(1));
        tasks.push(tokio::spawn(async move {
            let mut all = Vec::new();
            for i in 0..share {
                all.extend(work(w * 1_000_000 + i).await?);
            }
            Ok::<_, anyhow::Error>(all)
        }));
    }
    let mut latencies_ms = Vec::new();
    for t in tasks {
        latencies_ms.extend(t.await??);
    }
    Ok(Phase {
        latencies_ms: sorted(latencies_ms),
        wall: start.elapsed(),
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

/// Replays a recorded sequence of operations as raw calls: on the stack's
/// own runs and events tables (scratch keys), so table size costs the floor
/// what it costs the pipeline, and on a scratch queue.
struct Floor {
    aws: AwsClients,
    table: String,
    events: String,
    queue_url: String,
    bucket: String,
}

impl Floor {
    async fn setup(aws: AwsClients, stack: &LocalStack) -> Result<Self> {
        let queue_url = aws
            .sqs
            .create_queue()
            .queue_name(format!("{}-bench-floor", stack.template.stack()))
            .send()
            .await?
            .queue_url()
            .unwrap_or_default()
            .to_string();
        Ok(Floor {
            aws,
            table: stack.svc.cfg.runs_table.clone(),
            events: stack.svc.cfg.run_events_table.clone(),
            queue_url,
            bucket: stack.svc.cfg.payload_bucket.clone(),
        })
    }

    async fn replay(&self, ops: &[String]) -> Result<Duration> {
        use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
        let s = |v: &str| AttributeValue::S(v.to_string());
        let mut total = Duration::ZERO;
        for (i, op) in ops.iter().enumerate() {
            let key = format!("bench-floor-{}", i % 8);
            // A receive or a delete needs a message: put one there, untimed.
            let mut receipt = None;
            if matches!(
                op.as_str(),
                "SQS.ReceiveMessage" | "SQS.DeleteMessageBatch" | "SQS.ChangeMessageVisibility"
            ) {
                self.aws
                    .sqs
                    .send_message()
                    .queue_url(&self.queue_url)
                    .message_body("{}")
                    .send()
                    .await?;
                if op != "SQS.ReceiveMessage" {
                    let r = self
                        .aws
                        .sqs
                        .receive_message()
                        .queue_url(&self.queue_url)
                        .send()
                        .await?;
                    receipt = r
                        .messages()
                        .first()
                        .and_then(|m| m.receipt_handle())
                        .map(str::to_string);
                }
            }
            let t = Instant::now();
            match op.as_str() {
                "DynamoDB.PutItem" => {
                    self.aws
                        .dynamo
                        .put_item()
                        .table_name(&self.table)
                        .item("run_id", s(&key))
                        .item("v", s("x"))
                        .send()
                        .await?;
                }
                "DynamoDB.UpdateItem" => {
                    self.aws
                        .dynamo
                        .update_item()
                        .table_name(&self.table)
                        .key("run_id", s(&key))
                        .update_expression("SET v = :v")
                        .expression_attribute_values(":v", s("y"))
                        .send()
                        .await?;
                }
                "DynamoDB.Query" => {
                    self.aws
                        .dynamo
                        .query()
                        .table_name(&self.events)
                        .key_condition_expression("run_id = :k")
                        .expression_attribute_values(":k", s(&key))
                        .send()
                        .await?;
                }
                "DynamoDB.TransactWriteItems" => {
                    // Like a commit: the Run's item and one event.
                    let put = |table: &str,
                               extra: Option<(&str, AttributeValue)>|
                     -> Result<TransactWriteItem> {
                        let mut p = Put::builder()
                            .table_name(table)
                            .item("run_id", s(&key))
                            .item("v", s("t"));
                        if let Some((k, v)) = extra {
                            p = p.item(k, v);
                        }
                        Ok(TransactWriteItem::builder().put(p.build()?).build())
                    };
                    self.aws
                        .dynamo
                        .transact_write_items()
                        .transact_items(put(&self.table, None)?)
                        .transact_items(put(
                            &self.events,
                            Some(("seq", AttributeValue::N(i.to_string()))),
                        )?)
                        .send()
                        .await?;
                }
                "SQS.SendMessage" => {
                    self.aws
                        .sqs
                        .send_message()
                        .queue_url(&self.queue_url)
                        .message_body("{}")
                        .send()
                        .await?;
                }
                "SQS.ReceiveMessage" => {
                    self.aws
                        .sqs
                        .receive_message()
                        .queue_url(&self.queue_url)
                        .max_number_of_messages(10)
                        .send()
                        .await?;
                }
                "SQS.DeleteMessageBatch" => {
                    if let Some(r) = receipt {
                        self.aws
                            .sqs
                            .delete_message_batch()
                            .queue_url(&self.queue_url)
                            .entries(
                                aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                                    .id("a")
                                    .receipt_handle(r)
                                    .build()?,
                            )
                            .send()
                            .await?;
                    }
                }
                "SQS.ChangeMessageVisibility" => {
                    if let Some(r) = receipt {
                        self.aws
                            .sqs
                            .change_message_visibility()
                            .queue_url(&self.queue_url)
                            .receipt_handle(r)
                            .visibility_timeout(0)
                            .send()
                            .await?;
                    }
                }
                op if op.starts_with("S3.") => {
                    self.aws
                        .s3
                        .put_object()
                        .bucket(&self.bucket)
                        .key(format!("bench/{key}"))
                        .body(aws_sdk_s3::primitives::ByteStream::from_static(b"x"))
                        .send()
                        .await?;
                }
                // GetItem and anything else: one consistent read.
                _ => {
                    self.aws
                        .dynamo
                        .get_item()
                        .table_name(&self.table)
                        .key("run_id", s(&key))
                        .consistent_read(true)
                        .send()
                        .await?;
                }
            }
            total += t.elapsed();
        }
        // Leave no scratch messages for the next pass.
        let _ = self
            .aws
            .sqs
            .purge_queue()
            .queue_url(&self.queue_url)
            .send()
            .await;
        Ok(total)
    }
}

pub async fn run(root: &Path, opts: BenchOptions) -> Result<()> {
    let mut lo = LocalOptions::new(root);
    lo.api_port = 0;
    lo.stack = format!("armada-bench-{}", &armada_core::clock::new_id("b")[28..]);
    if lo.endpoint.is_none() {
        let default = "http://127.0.0.1:4566";
        if emulator::answers(default).await {
            lo.endpoint = Some(default.into());
        } else {
            lo.emulator_port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            lo.emulator_dies_with_us = true;
        }
    }
    let stack = LocalStack::start(lo).await?;
    let client = Client::new(&stack.api_url, &stack.tenant_key, None);
    let watcher_aws = AwsClients::load_local(
        &stack.endpoint,
        stack
            .aws
            .sdk_config
            .region()
            .map(|r| r.as_ref())
            .unwrap_or("us-east-1"),
    )
    .await;
    let cfg = &stack.svc.cfg;
    let store = RunStore::new(
        watcher_aws.dynamo.clone(),
        &cfg.runs_table,
        &cfg.run_events_table,
        &cfg.sessions_table,
        &cfg.idempotency_table,
    );
    let store = Watcher::start(
        store,
        watcher_aws.dynamo.clone(),
        stack.svc.cfg.runs_table.clone(),
    );
    println!(
        "armada bench: {} runs, {} session messages, concurrency {}",
        opts.runs, opts.session_messages, opts.concurrency
    );
    println!(
        "  emulator {}  stack {}",
        stack.endpoint,
        stack.template.stack()
    );

    // Warm up, then record the call sequence of one Run on its own.
    for _ in 0..3 {
        let id = client.create_run("assistant", "warm up").await?;
        store.watch(&id).await?;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stack.aws.calls.start_log();
    stack.esm_aws.calls.start_log();
    let id = client.create_run("assistant", "one alone").await?;
    store.watch(&id).await?;
    // Let the dispatcher settle it (RunTerminal → CLOSED_*).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fn_ops = stack.aws.calls.take_log();
    let esm_ops: Vec<String> = stack.esm_aws.calls.take_log().into_iter().collect();
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

    let one_run = |c: Client, st: Watcher| {
        move |i: usize| {
            let c = c.clone();
            let st = st.clone();
            async move {
                let t0 = wall_ms();
                let id = c.create_run("assistant", &format!("question {i}")).await?;
                let t1 = st.watch(&id).await?;
                Ok(vec![(t1 - t0) as f64])
            }
        }
    };
    // The critical path to the answer: the functions' calls up to the
    // harness's commit (the second TransactWriteItems: the first creates the
    // Run), plus one receive per queue hop (dispatch, harness).
    let commit = fn_ops
        .iter()
        .enumerate()
        .filter(|(_, o)| o.ends_with("TransactWriteItems"))
        .nth(1)
        .map(|(i, _)| i + 1)
        .unwrap_or(fn_ops.len());
    let floor_ops: Vec<String> = fn_ops[..commit]
        .iter()
        .cloned()
        .chain(std::iter::repeat_n("SQS.ReceiveMessage".to_string(), 2))
        .collect();
    let floor = Floor::setup(watcher_aws.clone(), &stack).await?;
    // The floor right before each phase: the tables grow as the bench goes.
    let measure_floor = || async {
        let mut passes = Vec::new();
        for _ in 0..15 {
            passes.push(floor.replay(&floor_ops).await?.as_secs_f64() * 1000.0);
        }
        Ok::<f64, anyhow::Error>(pct(&sorted(passes), 0.5))
    };
    let alone_n = (opts.runs / 5).max(10);
    let emulator_pid = stack.emulator_pid();
    let rss_empty = emulator_pid.and_then(fill::rss_kib);
    let floor_alone = measure_floor().await?;
    let cpu_before = fill::Cpu::now(emulator_pid);
    let alone = phase(&stack, alone_n, 1, one_run(client.clone(), store.clone())).await?;
    let cpu_alone = fill::Cpu::now(emulator_pid).per(&cpu_before, alone_n);
    let mut filled = None;
    if opts.fill > 0 {
        let (runs, events) = (&stack.svc.cfg.runs_table, &stack.svc.cfg.run_events_table);
        let took = fill::fill(&watcher_aws, runs, events, &id, opts.fill).await?;
        let rss_filled = emulator_pid.and_then(fill::rss_kib);
        let floor = measure_floor().await?;
        let cpu_before = fill::Cpu::now(emulator_pid);
        let p = phase(&stack, alone_n, 1, one_run(client.clone(), store.clone())).await?;
        let cpu = fill::Cpu::now(emulator_pid).per(&cpu_before, alone_n);
        filled = Some((took, rss_filled, floor, p, cpu));
    }
    let floor_single = measure_floor().await?;
    let single = phase(
        &stack,
        opts.runs,
        opts.concurrency,
        one_run(client.clone(), store.clone()),
    )
    .await?;

    let c = client.clone();
    let st = store.clone();
    let floor_sessions = measure_floor().await?;
    let per_worker = (opts.session_messages / opts.concurrency.max(1)).max(1);
    let sessions = phase(
        &stack,
        opts.concurrency.max(1),
        opts.concurrency,
        move |_| {
            let c = c.clone();
            let st = st.clone();
            async move {
                let sid = c.create_session("assistant").await?;
                let mut lat = Vec::new();
                for m in 0..per_worker {
                    let t0 = wall_ms();
                    let id = c.send_message(&sid, &format!("message {m}")).await?;
                    let t1 = st.watch(&id).await?;
                    lat.push((t1 - t0) as f64);
                }
                Ok(lat)
            }
        },
    )
    .await?;
    let session_msgs = per_worker * opts.concurrency.max(1);

    let report = |name: &str, p: &Phase, n: usize, floor_ms: f64| {
        let p50 = pct(&p.latencies_ms, 0.5);
        println!(
            "\n{name}: {n} in {:.2} s = {:.1}/s",
            p.wall.as_secs_f64(),
            n as f64 / p.wall.as_secs_f64()
        );
        println!(
            "  latency p50 {:.1} ms  p95 {:.1} ms  floor {:.1} ms  ratio {:.2}x",
            p50,
            pct(&p.latencies_ms, 0.95),
            floor_ms,
            p50 / floor_ms
        );
        println!(
            "  function AWS calls per run: {:.1}  [{}]",
            p.calls.values().sum::<u64>() as f64 / n as f64,
            per_run(&p.calls, n)
        );
        println!(
            "  event source mapping calls per run: {:.1}  [{}]",
            p.esm_calls.values().sum::<u64>() as f64 / n as f64,
            per_run(&p.esm_calls, n)
        );
    };
    println!(
        "\nFloor: the critical path's {} raw emulator calls in sequence (p50 of 15 passes, before each phase): {}",
        floor_ops.len(),
        floor_ops.join(" ")
    );
    report(
        "Single-answer runs, one at a time",
        &alone,
        alone_n,
        floor_alone,
    );
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
    if let Some((took, rss_filled, floor, p, cpu)) = &filled {
        println!(
            "\nFilled with {} finished runs (copies of a real one's items) in {:.1} s; emulator RSS {}",
            opts.fill,
            took.as_secs_f64(),
            mib(*rss_filled)
        );
        report(
            &format!(
                "Single-answer runs, one at a time, after {} runs",
                opts.fill
            ),
            p,
            alone_n,
            *floor,
        );
        println!("{}", cpu_line(*cpu));
        println!(
            "  filled / empty: latency p50 {:.2}x, floor {:.2}x",
            pct(&p.latencies_ms, 0.5) / pct(&alone.latencies_ms, 0.5),
            floor / floor_alone
        );
    }
    report(
        &format!("Single-answer runs, {} at a time", opts.concurrency),
        &single,
        opts.runs,
        floor_single,
    );
    report("Session messages", &sessions, session_msgs, floor_sessions);

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
    if let Some(pid) = pid {
        crate::local::process::terminate(pid);
    }
    Ok(())
}
