//! Delivery faults against the real emulator: duplicates, a worker that dies
//! between the model call and the commit, a stale worker's late commit, and
//! a message that keeps failing.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;

use armada_core::Services;
use armada_domain::messages::{check_slot, DispatchMessage, HarnessMessage};
use armada_domain::run::{EventKind, LogEvent, Run};
use armada_harness::{Aborted, StepHooks};
use armada_tests::wait::{self, drained, eventually};
use armada_tests::{fast_redelivery, outcome, CrashAfterTools, RunState, TestStack};

fn input_of(run: &Run) -> String {
    run.input_text().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_deliveries_have_exactly_one_effect() {
    let t = TestStack::start().await;
    let run_id = t
        .client
        .create_run("assistant", "/tool current_time {}")
        .await
        .unwrap();
    let q = &t.stack.svc.queues;
    let start = DispatchMessage::StartRun {
        run_id: run_id.clone(),
        tenant: "local".into(),
    };
    // A duplicate start while the Run is queued or running.
    q.send_dispatch(&start).await.unwrap();
    t.wait_closed(&run_id).await;
    let before = t.event_types(&run_id).await;
    let model_calls = t.stack.model_stats.requests.load(Ordering::Relaxed);
    assert_eq!(model_calls, 2);
    // Every kind of message delivered again, after the fact. Step messages
    // get fresh deduplication ids so the FIFO queue really delivers them.
    q.send_dispatch(&start).await.unwrap();
    q.send_dispatch(&DispatchMessage::RunTerminal {
        run_id: run_id.clone(),
        tenant: "local".into(),
    })
    .await
    .unwrap();
    for step in 0..3 {
        let body = serde_json::to_string(&HarnessMessage::Step {
            run_id: run_id.clone(),
            tenant: "local".into(),
            step,
            epoch: 0,
        })
        .unwrap();
        t.stack
            .aws
            .sqs
            .send_message()
            .queue_url(q.harness_url())
            .message_body(body)
            .message_group_id(&run_id)
            .message_deduplication_id(format!("dup-{step}"))
            .send()
            .await
            .unwrap();
    }
    // A message naming the Run under another tenant is refused.
    q.send_harness(&HarnessMessage::Step {
        run_id: run_id.clone(),
        tenant: "mallory".into(),
        step: 2,
        epoch: 0,
    })
    .await
    .unwrap();
    drained(&t).await;
    assert_eq!(t.event_types(&run_id).await, before);
    assert_eq!(
        t.stack.model_stats.requests.load(Ordering::Relaxed),
        model_calls
    );
    let run = t.client.get(&format!("/v1/runs/{run_id}")).await.unwrap();
    assert_eq!(run["state"], "CLOSED_COMPLETED");
    t.stack.stop().await;
}

/// Dies (as a Lambda would) after the model call of the first attempt at a
/// Run whose input says `crash-once`; on every attempt for `always-crash`.
struct Crash;

impl StepHooks for Crash {
    fn after_model_call<'a>(&'a self, run: &'a Run) -> BoxFuture<'a, Result<(), Aborted>> {
        Box::pin(async move {
            let input = input_of(run);
            if (input.contains("crash-once") && run.epoch == 1) || input.contains("always-crash") {
                return Err(Aborted(format!("injected crash at epoch {}", run.epoch)));
            }
            Ok(())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_before_its_commit_is_recovered_once() {
    let t = TestStack::start_with(fast_redelivery("5"), Some(Arc::new(Crash))).await;
    let (run_id, run) = t.ask("assistant", "crash-once please").await;
    assert_eq!(
        run.output.as_deref().unwrap_or_default(),
        "echo: crash-once please",
        "{run:?}"
    );
    assert_eq!(
        run.epoch, 2,
        "redelivery claimed with a higher epoch: {run:?}"
    );
    assert_eq!(t.stack.model_stats.requests.load(Ordering::Relaxed), 2);
    t.wait_closed(&run_id).await;
    let types = t.event_types(&run_id).await;
    assert_eq!(
        types.iter().filter(|t| *t == "run_completed").count(),
        1,
        "{types:?}"
    );
    assert_eq!(
        types.iter().filter(|t| *t == "model_reply").count(),
        1,
        "{types:?}"
    );
    t.stack.stop().await;
}

/// Works slowly (8 s after the model call) at the first attempt at a Run
/// whose input says `slow-once`, or never comes back from it (`hang-once`),
/// as a worker whose host is about to be killed; `reached` counts arrivals.
#[derive(Default)]
struct Slow {
    reached: std::sync::atomic::AtomicU32,
}

impl StepHooks for Slow {
    fn after_model_call<'a>(&'a self, run: &'a Run) -> BoxFuture<'a, Result<(), Aborted>> {
        Box::pin(async move {
            let input = input_of(run);
            if run.epoch == 1 && input.contains("slow-once") {
                self.reached.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(8)).await;
            }
            if run.epoch == 1 && input.contains("hang-once") {
                self.reached.fetch_add(1, Ordering::SeqCst);
                futures::future::pending::<()>().await;
            }
            Ok(())
        })
    }
}

/// A step that outlives its queue's visibility timeout and its lease many
/// times over is not handed to another worker: while it lives it keeps its
/// message hidden and its lease renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_live_slow_step_keeps_its_message_and_its_lease() {
    let stall = Arc::new(Slow::default());
    let t = TestStack::start_with(fast_redelivery("5"), Some(stall.clone())).await;
    let (_, run) = t.ask("assistant", "slow-once please").await;
    assert_eq!(
        run.output.as_deref().unwrap_or_default(),
        "echo: slow-once please",
        "{run:?}"
    );
    assert_eq!(run.epoch, 1, "no second worker claimed it: {run:?}");
    assert_eq!(stall.reached.load(Ordering::SeqCst), 1);
    assert_eq!(t.stack.model_stats.requests.load(Ordering::Relaxed), 1);
    t.stack.stop().await;
}

/// `kill -9` of the functions host while a Run is EXECUTING, then the host
/// started again, with the template's defaults: the Run completes at
/// epoch 2 within a minute, as the README promises (the step had its
/// message hidden and its Run leased for `CrashReturnSeconds`, 20 s, not
/// the queue's 60 s), not after its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_whose_host_was_killed_resumes_within_a_minute() {
    let stall = Arc::new(Slow::default());
    let name = TestStack::stack_name();
    let first =
        TestStack::start_as(name.clone(), HashMap::new(), Some(stall.clone()), vec![]).await;
    let run_id = first
        .client
        .create_run("assistant", "hang-once please")
        .await
        .unwrap();
    eventually("the step to reach the model", || async {
        stall.reached.load(Ordering::SeqCst) > 0
    })
    .await;
    assert_eq!(
        stall.reached.load(Ordering::SeqCst),
        1,
        "the step reached the model"
    );
    let view = first
        .client
        .get(&format!("/v1/runs/{run_id}"))
        .await
        .unwrap();
    assert_eq!(view["state"], "EXECUTING", "{view}");
    // Killed once its lease was renewed: the heartbeat that renews it has
    // shortened its message's hiding by then (it does so at once), so
    // what the kill leaves comes back after `CrashReturnSeconds`.
    let leased = |svc: Arc<Services>, id: String| async move {
        svc.runs
            .get(&id)
            .await
            .ok()
            .flatten()
            .map(|r| r.lease_until_ms)
    };
    let first_lease = leased(first.stack.svc.clone(), run_id.clone())
        .await
        .unwrap();
    wait::until(
        "the step's lease to be renewed",
        Duration::from_secs(30),
        || {
            let lease = leased(first.stack.svc.clone(), run_id.clone());
            async move { lease.await.filter(|l| *l > first_lease) }
        },
    )
    .await;
    first.stack.kill();
    let killed_at = std::time::Instant::now();

    let second = TestStack::start_as(name, HashMap::new(), Some(stall.clone()), vec![]).await;
    let run = second
        .client
        .wait_run(&run_id, Duration::from_secs(60))
        .await
        .expect("the run ends within a minute of the crash");
    let took = killed_at.elapsed();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert_eq!(
        run.output.as_deref().unwrap_or_default(),
        "echo: hang-once please",
        "{run:?}"
    );
    assert_eq!(run.epoch, 2, "{run:?}");
    assert!(took < Duration::from_secs(60), "recovered after {took:?}");
    eprintln!("recovered {took:?} after the kill");
    second.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_that_keeps_failing_is_dead_lettered_and_its_run_fails() {
    let t = TestStack::start_with(fast_redelivery("2"), Some(Arc::new(Crash))).await;
    let (run_id, run) = t.ask("assistant", "always-crash").await;
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "DEAD_LETTERED"
    );
    assert!(
        run.error
            .as_ref()
            .map_or("", |e| e.message.as_str())
            .contains("harness-dlq"),
        "{run:?}"
    );
    assert_eq!(t.wait_closed(&run_id).await.state, RunState::ClosedFailed);
    t.stack.stop().await;
}

/// Damages the document of a `corrupt-me` Run after its model call, as a
/// bug or a bad migration would (JSON nested past what the reader parses),
/// and crashes the step.
struct Corrupt {
    aws: Arc<OnceLock<(aws_sdk_dynamodb::Client, String)>>,
}

impl StepHooks for Corrupt {
    fn after_model_call<'a>(&'a self, run: &'a Run) -> BoxFuture<'a, Result<(), Aborted>> {
        Box::pin(async move {
            if !input_of(run).contains("corrupt-me") {
                return Ok(());
            }
            if let Some((dynamo, table)) = self.aws.get() {
                let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
                let written = dynamo
                    .update_item()
                    .table_name(table)
                    .key(
                        "run_id",
                        aws_sdk_dynamodb::types::AttributeValue::S(run.run_id.clone()),
                    )
                    .update_expression("SET #doc = :doc")
                    .expression_attribute_names("#doc", "doc")
                    .expression_attribute_values(
                        ":doc",
                        aws_sdk_dynamodb::types::AttributeValue::S(deep),
                    )
                    .send()
                    .await;
                written.map_err(|e| Aborted(format!("could not damage the record: {e}")))?;
            }
            Err(Aborted("injected crash after damaging the record".into()))
        })
    }
}

/// A Run whose record can no longer be read fails every delivery and
/// reaches the dead-letter queue, where it is rebuilt from the attributes
/// beside its document, failed with CORRUPT_RECORD and closed: `GET`
/// answers it all along (never a 500), and nothing is left waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_whose_record_cannot_be_read_is_still_read_and_ended() {
    let slot = Arc::new(OnceLock::new());
    let t = TestStack::start_with(
        fast_redelivery("2"),
        Some(Arc::new(Corrupt { aws: slot.clone() })),
    )
    .await;
    let _ = slot.set((
        t.stack.aws.dynamo.clone(),
        t.stack.svc.cfg.runs_table.clone(),
    ));
    let run_id = t
        .client
        .create_run("assistant", "corrupt-me")
        .await
        .unwrap();
    let run = t
        .client
        .wait_run(&run_id, Duration::from_secs(90))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "CORRUPT_RECORD",
        "{run:?}"
    );
    assert_eq!(t.wait_closed(&run_id).await.state, RunState::ClosedFailed);
    assert!(t
        .event_types(&run_id)
        .await
        .contains(&"run_failed".to_string()));
    t.stack.stop().await;
}

/// Freezes the first attempt of a `stall-once` Run until a second worker has
/// completed it, then lets the stale worker try to commit. The whole
/// invocation is frozen, its visibility heartbeat and lease renewal too (as
/// the platform freezes a Lambda, or a paused process): blocking the task
/// stops every branch of it, while the rest of the stack runs on.
struct Stall {
    svc: Arc<OnceLock<Arc<Services>>>,
}

impl StepHooks for Stall {
    fn after_model_call<'a>(&'a self, run: &'a Run) -> BoxFuture<'a, Result<(), Aborted>> {
        Box::pin(async move {
            if !input_of(run).contains("stall-once") || run.epoch != 1 {
                return Ok(());
            }
            let handle = tokio::runtime::Handle::current();
            tokio::task::block_in_place(|| handle.block_on(self.until_terminal(run)));
            Ok(())
        })
    }
}

impl Stall {
    async fn until_terminal(&self, run: &Run) {
        eventually("the run to end behind the stalled worker", || async {
            let Some(svc) = self.svc.get() else {
                return false;
            };
            matches!(svc.runs.get(&run.run_id).await, Ok(Some(now)) if now.state().is_terminal())
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_workers_commit_is_rejected() {
    let slot = Arc::new(OnceLock::new());
    let t = TestStack::start_with(
        fast_redelivery("5"),
        Some(Arc::new(Stall { svc: slot.clone() })),
    )
    .await;
    let _ = slot.set(t.stack.svc.clone());
    let fenced_before = t.stack.svc.counters.fenced_commits.load(Ordering::Relaxed);
    let (run_id, run) = t.ask("assistant", "stall-once").await;
    assert_eq!(
        run.output.as_deref().unwrap_or_default(),
        "echo: stall-once"
    );
    assert_eq!(run.epoch, 2);
    // The stalled worker wakes, tries to commit epoch 1, and is refused.
    eventually("the stale commit to be rejected", || async {
        t.stack.svc.counters.fenced_commits.load(Ordering::Relaxed) > fenced_before
    })
    .await;
    t.wait_closed(&run_id).await;
    let types = t.event_types(&run_id).await;
    assert_eq!(
        types.iter().filter(|t| *t == "run_completed").count(),
        1,
        "{types:?}"
    );
    t.stack.stop().await;
}

/// Counts the requests a loopback HTTP server gets, answering 200.
/// A receiver that counts requests and keeps each one's
/// `Idempotency-Key`.
async fn counting_server() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let heard = keys.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let key = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("idempotency-key")
                        .then(|| value.trim().to_string())
                })
                .unwrap_or_default();
            heard.lock().unwrap().push(key);
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .await;
        }
    });
    (url, keys)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_result_is_repeated_only_for_idempotent_calls() {
    let t = TestStack::start_with(fast_redelivery("5"), Some(Arc::new(CrashAfterTools))).await;
    let (url, hits) = counting_server().await;
    let host = url.trim_start_matches("http://").to_string();
    armada_tests::put_fetcher(&t, "fetcher", &[host]).await;
    // POST is not idempotent: after the crash it is not sent again, and the
    // Run surfaces the uncertainty.
    let input =
        format!(r#"/tool http_request {{"url": "{url}/charge", "method": "POST", "body": "42"}}"#);
    let (run_id, run) = t.ask("fetcher", &input).await;
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "TOOL_INDETERMINATE"
    );
    let keys = hits.lock().unwrap().clone();
    assert_eq!(keys.len(), 1, "the POST was sent exactly once");
    let Some(LogEvent::ToolCall { call_id, .. }) = t.event(&run_id, EventKind::ToolCall).await
    else {
        panic!("no tool_call event")
    };
    assert_eq!(
        keys[0],
        armada_domain::ledger::effect_key(&run_id, &call_id),
        "it carries its call's idempotency key"
    );
    assert!(t
        .event_types(&run_id)
        .await
        .contains(&"tool_indeterminate".to_string()));

    // GET is idempotent: it is repeated and the Run completes.
    let input = format!(r#"/tool http_request {{"url": "{url}/status"}}"#);
    let (_, run) = t.ask("fetcher", &input).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert!(
        run.output
            .as_deref()
            .unwrap_or_default()
            .starts_with("tool http_request returned: {"),
        "{run:?}"
    );
    assert_eq!(hits.lock().unwrap().len(), 3, "the GET ran twice");
    t.stack.stop().await;
}

/// The watchdog's checks take their slots on the real table: the first
/// message to take a slot goes on, and so do its redeliveries; a copy that
/// another message carries does not, so a check handled twice leaves one
/// chain (`a_watchdog_check_handled_twice_leaves_one_chain` has the rest).
#[tokio::test]
async fn a_check_slot_is_taken_by_one_message() {
    let t = TestStack::start().await;
    let store = &t.stack.svc.idempotency;
    let now = t.stack.svc.clock.now_ms();
    let slot = check_slot("run-x", 2, 1, 3);
    assert!(store.take_slot(&slot, "m-1", now).await.unwrap());
    assert!(store.take_slot(&slot, "m-1", now).await.unwrap());
    assert!(!store.take_slot(&slot, "m-2", now).await.unwrap());
    let next = check_slot("run-x", 2, 1, 4);
    assert!(store.take_slot(&next, "m-2", now).await.unwrap());
    t.stack.stop().await;
}
