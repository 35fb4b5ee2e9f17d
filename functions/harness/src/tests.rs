//! The harness's decisions on in-memory ports: claims, fencing, duplicate
//! and stale deliveries, inline tool calls and their ledger, the follow-up
//! messages. No emulator; the emulator tests in `tests/` are the
//! integration layer.

use std::sync::Arc;

use armada_core::memory::fixtures::{accepted_run, agent, sqs_event};
use armada_core::memory::{test_config, Memory};
use armada_domain::ledger::{ToolCallEvent, ToolCallRecord, ToolCallState};
use armada_domain::machine::Machine;
use armada_domain::run::{RunEvent, RunState, Stamp};

use super::*;
use armada_domain::messages::DispatchMessage;
use armada_domain::messages::ResultBody;
use armada_domain::run::Payload;
use serde_json::json;

const TENANT: &str = "acme";

/// Services on memory, a harness over them, and the agent its Runs use.
async fn setup() -> (Arc<Services>, Arc<Memory>, Harness) {
    let (svc, mem) = Services::in_memory(test_config());
    agent(&svc, "assistant", &["current_time"]).await;
    (svc.clone(), mem, Harness::new(svc))
}

/// A Run of the test agent, accepted and not yet started.
async fn new_run(svc: &Services, input: &str) -> Run {
    let def = svc.registry.agent("assistant").await.ok().flatten();
    accepted_run(svc, TENANT, &def.expect("the test agent"), input).await
}

fn step_message(run_id: &str, tenant: &str, step: u32) -> String {
    let msg = HarnessMessage::Step {
        run_id: run_id.into(),
        tenant: tenant.into(),
        step,
        epoch: 0,
    };
    serde_json::to_string(&msg).unwrap_or_default()
}

/// Delivers messages as one batch; returns the ids Lambda would redeliver.
async fn deliver(h: &Harness, svc: &Services, bodies: &[String]) -> Vec<String> {
    let event = sqs_event(&svc.cfg.harness_queue, bodies);
    let resp = h.handle_event(event).await.expect("the batch is handled");
    resp.batch_item_failures
        .into_iter()
        .map(|f| f.item_identifier)
        .collect()
}

async fn run_of(svc: &Services, run_id: &str) -> Run {
    svc.runs
        .get(run_id)
        .await
        .ok()
        .flatten()
        .expect("the run exists")
}

async fn kinds(svc: &Services, run_id: &str) -> Vec<String> {
    let events = svc.run_events.all_events(run_id).await.unwrap_or_default();
    events
        .into_iter()
        .map(|e| e.kind().as_str().to_string())
        .collect()
}

#[tokio::test]
async fn a_step_claims_answers_and_announces_the_end_once() {
    let (svc, mem, h) = setup().await;
    let run = new_run(&svc, "hello").await;
    assert!(deliver(&h, &svc, &[step_message(&run.run_id, TENANT, 0)])
        .await
        .is_empty());
    let done = run_of(&svc, &run.run_id).await;
    assert_eq!(
        (done.state(), done.epoch, done.lease_until_ms),
        (RunState::Completed, 1, 0)
    );
    assert_eq!(
        done.output,
        Some(Payload::Inline {
            text: "echo: hello".into()
        })
    );
    assert_eq!(
        kinds(&svc, &run.run_id).await,
        ["run_created", "model_reply", "run_completed"]
    );
    assert_eq!(
        mem.take_dispatch(),
        [DispatchMessage::RunTerminal {
            run_id: run.run_id.clone(),
            tenant: TENANT.into()
        }]
    );
    assert!(mem.take_harness().is_empty());
}

#[tokio::test]
async fn a_duplicate_delivery_has_one_effect() {
    let (svc, _mem, h) = setup().await;
    let run = new_run(&svc, "hello").await;
    let msg = step_message(&run.run_id, TENANT, 0);
    deliver(&h, &svc, std::slice::from_ref(&msg)).await;
    let failed = deliver(&h, &svc, &[msg]).await;
    assert!(failed.is_empty(), "a duplicate is dropped, not retried");
    assert_eq!(run_of(&svc, &run.run_id).await.epoch, 1, "claimed once");
    let replies = kinds(&svc, &run.run_id).await;
    assert_eq!(replies.iter().filter(|k| *k == "model_reply").count(), 1);
    assert_eq!(svc.counters.stale_drops.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_step_held_under_a_live_lease_is_retried_later_and_left_alone() {
    let (svc, mem, h) = setup().await;
    let run = new_run(&svc, "hello").await;
    mem.state()
        .runs
        .get_mut(&run.run_id)
        .expect("run")
        .lease_until_ms = svc.clock.now_ms() + 60_000;
    let failed = deliver(&h, &svc, &[step_message(&run.run_id, TENANT, 0)]).await;
    assert_eq!(failed, ["m0"], "redelivered after the lease");
    let after = run_of(&svc, &run.run_id).await;
    assert_eq!((after.state(), after.epoch), (RunState::Pending, 0));
}

/// Two deliveries of one step read the Run at once; one claims it and
/// dies there. The other, whose claim met the first's, keeps its message
/// (it waits out the winner's lease) instead of dropping it: the winner's
/// claim was no promise to finish. (Found by `armada chaos`: a session's
/// message left EXECUTING at epoch 1 with no message to carry it on.)
#[tokio::test]
async fn a_claim_lost_to_a_worker_that_then_dies_keeps_its_message() {
    let (svc, _mem, h) = setup().await;
    let run = new_run(&svc, "hello").await;
    let read = run_of(&svc, &run.run_id).await;
    let won = h.claim(read.clone(), TENANT, 0).await.expect("claimed");
    assert!(won.is_some(), "the first claims");
    // The winner dies here. The loser's claim, from the same read:
    let lost = h.claim(read, TENANT, 0).await;
    assert!(
        matches!(lost, Err(StepError::Busy { until_s, .. }) if until_s > 0),
        "{lost:?}"
    );
    // Once the winner's lease is out, the message it kept claims again.
    svc.clock.advance(svc.cfg.step_lease_ms + 1);
    let failed = deliver(&h, &svc, &[step_message(&run.run_id, TENANT, 0)]).await;
    assert!(failed.is_empty(), "{failed:?}");
    let after = run_of(&svc, &run.run_id).await;
    assert_eq!((after.state(), after.epoch), (RunState::Completed, 2));
}

/// Takes the Run away from the worker after its model call, as a second
/// worker claiming it would.
struct Superseded(Arc<Memory>);

impl StepHooks for Superseded {
    fn after_model_call<'a>(&'a self, run: &'a Run) -> BoxFuture<'a, Result<(), Aborted>> {
        Box::pin(async move {
            if let Some(r) = self.0.state().runs.get_mut(&run.run_id) {
                r.epoch += 1;
            }
            Ok(())
        })
    }
}

#[tokio::test]
async fn a_superseded_worker_cannot_commit() {
    let (svc, mem, _) = setup().await;
    let h = Harness::with_hooks(svc.clone(), Arc::new(Superseded(mem.clone())));
    let run = new_run(&svc, "hello").await;
    let failed = deliver(&h, &svc, &[step_message(&run.run_id, TENANT, 0)]).await;
    assert_eq!(svc.counters.fenced_commits.load(Ordering::Relaxed), 1);
    let after = run_of(&svc, &run.run_id).await;
    assert_eq!((after.state(), after.epoch), (RunState::Executing, 2));
    assert_eq!(kinds(&svc, &run.run_id).await, ["run_created"]);
    // Its work is dropped, its message kept: the newer claim's worker may
    // die holding the step (a chaos run found a Run left EXECUTING so).
    assert_eq!(failed.len(), 1, "the step's message is kept");
    assert!(mem.take_dispatch().is_empty(), "nothing announced");
    // The newer claim's worker died: once its lease is out, the kept
    // message finishes the step.
    svc.clock.advance(svc.cfg.step_lease_ms + 1);
    let plain = Harness::new(svc.clone());
    let failed = deliver(&plain, &svc, &[step_message(&run.run_id, TENANT, 0)]).await;
    assert!(failed.is_empty(), "{failed:?}");
    let after = run_of(&svc, &run.run_id).await;
    assert_eq!((after.state(), after.epoch), (RunState::Completed, 3));
}

#[tokio::test]
async fn an_inline_tool_call_is_recorded_run_and_followed_by_the_next_step() {
    let (svc, mem, h) = setup().await;
    let run = new_run(&svc, "/tool current_time {}").await;
    deliver(&h, &svc, &[step_message(&run.run_id, TENANT, 0)]).await;
    let after = run_of(&svc, &run.run_id).await;
    assert_eq!((after.state(), after.step), (RunState::Executing, 1));
    let calls: Vec<&ToolCallRecord> = after.ledger.values().collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].skill.as_str(), calls[0].state()),
        ("current_time", ToolCallState::Done)
    );
    let next = mem.take_harness();
    assert_eq!(
        next,
        [HarnessMessage::Step {
            run_id: run.run_id.clone(),
            tenant: TENANT.into(),
            step: 1,
            epoch: after.epoch,
        }]
    );
    deliver(&h, &svc, &[step_message(&run.run_id, TENANT, 1)]).await;
    let done = run_of(&svc, &run.run_id).await;
    assert_eq!(done.state(), RunState::Completed);
    let text = match done.output {
        Some(Payload::Inline { text }) => text,
        other => panic!("{other:?}"),
    };
    assert!(text.starts_with("tool current_time returned: "), "{text}");
}

#[tokio::test]
async fn a_lost_call_with_effects_fails_the_run_instead_of_running_twice() {
    let (svc, _mem, h) = setup().await;
    let mut run = new_run(&svc, "hello").await;
    // A previous worker recorded the call as dispatched and died.
    let prev = Stamp {
        epoch: run.epoch,
        event_seq: run.event_seq,
    };
    let mut rec = ToolCallRecord::planned("c1", "http_request", json!({}), 0, false, false);
    let sent = ToolCallEvent::Dispatched { generation: None };
    rec.apply(sent, 0).expect("a planned call is dispatched");
    run.ledger.insert("c1".into(), rec);
    svc.runs.save(prev, &run, &[], vec![]).await.expect("saved");
    deliver(&h, &svc, &[step_message(&run.run_id, TENANT, 0)]).await;
    let after = run_of(&svc, &run.run_id).await;
    assert_eq!(after.state(), RunState::Failed);
    assert_eq!(
        after.error.map(|e| e.code),
        Some("TOOL_INDETERMINATE".into())
    );
    assert_eq!(after.ledger["c1"].state(), ToolCallState::Indeterminate);
}

#[tokio::test]
async fn a_message_naming_another_tenant_changes_nothing() {
    let (svc, _mem, h) = setup().await;
    let run = new_run(&svc, "hello").await;
    let failed = deliver(&h, &svc, &[step_message(&run.run_id, "mallory", 0)]).await;
    assert!(failed.is_empty());
    let after = run_of(&svc, &run.run_id).await;
    assert_eq!((after.state(), after.epoch), (RunState::Pending, 0));
}

#[tokio::test]
async fn a_run_whose_agent_was_deleted_fails_with_a_reason() {
    let (svc, _mem, h) = setup().await;
    let run = new_run(&svc, "hello").await;
    svc.registry
        .delete_agent("assistant")
        .await
        .expect("deleted");
    deliver(&h, &svc, &[step_message(&run.run_id, TENANT, 0)]).await;
    let after = run_of(&svc, &run.run_id).await;
    assert_eq!(after.state(), RunState::Failed);
    assert_eq!(after.error.map(|e| e.code), Some("AGENT_NOT_FOUND".into()));
}

/// A sandbox's answer stored in the bucket is read only up to the bound:
/// a bigger one fails its call with a named code, the Run goes on.
#[tokio::test]
async fn a_stored_outcome_over_the_bound_fails_its_call_unread() {
    use armada_domain::sandbox::access::outcome_key;
    use armada_domain::sandbox::hand::{codes, MAX_STORED_OUTCOME_BYTES};
    use armada_domain::sandbox::seal::{answer_key, Answer};

    let (svc, mem, h) = setup().await;
    let mut run = new_run(&svc, "hello").await;
    let prev = Stamp {
        epoch: run.epoch,
        event_seq: run.event_seq,
    };
    // The call went to the agent's sandbox, generation 1, and waits.
    let mut rec = ToolCallRecord::planned("c1", "shell_exec", json!({}), 0, false, true);
    let sent = ToolCallEvent::Dispatched {
        generation: Some(1),
    };
    rec.apply(sent, 0).expect("a planned call is dispatched");
    let attempt = rec.attempt;
    run.ledger.insert("c1".into(), rec);
    let now = svc.clock.now_ms();
    run.apply(
        RunEvent::Claimed {
            lease_until_ms: now,
        },
        now,
    )
    .expect("claimed");
    run.apply(RunEvent::AwaitTool, now).expect("waits");
    svc.runs.save(prev, &run, &[], vec![]).await.expect("saved");
    // The sandbox stored an outcome one byte over the bound, under its
    // own prefix, and sealed its answer as it does.
    let key = outcome_key(TENANT, "assistant", &run.run_id, "c1", attempt);
    let huge = "x".repeat(usize::try_from(MAX_STORED_OUTCOME_BYTES).unwrap_or_default() + 1);
    svc.payloads.put_text(&key, &huge).await.expect("stored");
    let body = ResultBody::Stored {
        key,
        sha256: armada_domain::crypto::sha256_hex(huge.as_bytes()),
    };
    let seal = Answer {
        run_id: &run.run_id,
        tenant: TENANT,
        step: 0,
        call_id: "c1",
        attempt,
        body: &body,
    }
    .seal(
        &answer_key(&svc.cfg.callback_signing_secret, TENANT, "assistant", 1, ""),
        1,
    );
    let msg = HarnessMessage::ToolResult {
        run_id: run.run_id.clone(),
        tenant: TENANT.into(),
        step: 0,
        call_id: "c1".into(),
        attempt,
        body,
        seal: Some(seal),
    };
    let failed = deliver(&h, &svc, &[serde_json::to_string(&msg).unwrap_or_default()]).await;
    assert!(failed.is_empty(), "refused, not retried");
    let after = run_of(&svc, &run.run_id).await;
    let c1 = &after.ledger["c1"];
    assert!(c1.state().is_settled(), "{:?}", c1.state());
    let result = c1.result.clone().unwrap_or_default();
    assert_eq!(result["error"]["code"], codes::RESULT_TOO_LARGE, "{result}");
    assert!(
        !after.state().is_terminal(),
        "the Run carries on: {}",
        after.state()
    );
    assert_eq!(svc.counters.forged_drops.load(Ordering::Relaxed), 0);
    assert!(!mem.take_harness().is_empty(), "its next step is asked for");
}

/// The test setup, its services dying once at `point`.
async fn dying_at(point: FaultPoint) -> (Arc<Services>, Arc<Memory>, Harness) {
    let (svc, mem) = Services::in_memory(test_config());
    let mut dying = (*svc).clone();
    dying.faults = Arc::new(armada_core::faults::DiesOnceAt::new(point));
    let svc = Arc::new(dying);
    agent(&svc, "assistant", &["current_time"]).await;
    (svc.clone(), mem, Harness::new(svc))
}

#[tokio::test]
async fn a_worker_killed_after_its_commit_leaves_the_follow_up_to_the_redelivery() {
    let (svc, mem, h) = dying_at(FaultPoint::AfterCommit).await;
    let run = new_run(&svc, "hello").await;
    let msg = step_message(&run.run_id, TENANT, 0);
    let event = sqs_event(&svc.cfg.harness_queue, std::slice::from_ref(&msg));
    assert!(h.handle_event(event).await.is_err(), "the worker died");
    let committed = run_of(&svc, &run.run_id).await;
    assert_eq!(committed.state(), RunState::Completed, "the commit landed");
    assert!(mem.take_dispatch().is_empty(), "its end was not announced");
    // The message comes back; the Run is past it, and its end is
    // announced once, by the redelivery.
    assert!(deliver(&h, &svc, &[msg]).await.is_empty());
    assert_eq!(
        mem.take_dispatch(),
        [DispatchMessage::RunTerminal {
            run_id: run.run_id.clone(),
            tenant: TENANT.into()
        }]
    );
    assert_eq!(
        kinds(&svc, &run.run_id).await,
        ["run_created", "model_reply", "run_completed"]
    );
}

#[tokio::test]
async fn a_worker_killed_after_its_claim_is_followed_by_one_that_claims_again() {
    let (svc, mem, h) = dying_at(FaultPoint::AfterClaim).await;
    let run = new_run(&svc, "hello").await;
    let msg = step_message(&run.run_id, TENANT, 0);
    let event = sqs_event(&svc.cfg.harness_queue, std::slice::from_ref(&msg));
    assert!(h.handle_event(event).await.is_err(), "the worker died");
    // Its lease outlives it; once it has expired, the redelivery claims.
    mem.state()
        .runs
        .get_mut(&run.run_id)
        .expect("run")
        .lease_until_ms = 0;
    assert!(deliver(&h, &svc, &[msg]).await.is_empty());
    let done = run_of(&svc, &run.run_id).await;
    assert_eq!((done.state(), done.epoch), (RunState::Completed, 2));
}

/// A Run waiting on call `c1` of its agent's sandbox (held, generation
/// 1), the call as `shape` leaves it.
async fn waiting_on_c1(
    svc: &Services,
    mem: &Memory,
    shape: impl FnOnce(&mut ToolCallRecord),
) -> Run {
    let mut run = new_run(svc, "hello").await;
    let def = svc.registry.agent("assistant").await.ok().flatten();
    armada_core::services::sandboxing::acquire(svc, TENANT, &run.run_id, &def.expect("agent"))
        .await
        .expect("held");
    let prev = run.stamp();
    let mut rec = ToolCallRecord::planned("c1", "shell_exec", json!({}), 0, false, true);
    shape(&mut rec);
    run.ledger.insert("c1".into(), rec);
    let now = svc.clock.now_ms();
    let claimed = RunEvent::Claimed {
        lease_until_ms: now,
    };
    run.apply(claimed, now).expect("claimed");
    run.apply(RunEvent::AwaitTool, now).expect("waits");
    svc.runs.save(prev, &run, &[], vec![]).await.expect("saved");
    let _ = mem.take_harness();
    run
}

/// The sealed answer of the sandbox of `generation` to `attempt` of `c1`.
async fn answer_of(svc: &Services, run: &Run, attempt: u32, generation: u64) -> String {
    use armada_domain::sandbox::hand::CallOutcome;
    use armada_domain::sandbox::seal::{answer_key, Answer};
    let rec = svc.sandboxes.get(TENANT, "assistant").await;
    let salt = rec.ok().flatten().map(|r| r.salt).unwrap_or_default();
    let body = ResultBody::Inline {
        outcome: CallOutcome::Finished {
            result: json!({"exit_code": 0, "stdout": "ran\n", "stderr": ""}),
        },
    };
    let key = answer_key(
        &svc.cfg.callback_signing_secret,
        TENANT,
        "assistant",
        generation,
        &salt,
    );
    let seal = Answer {
        run_id: &run.run_id,
        tenant: TENANT,
        step: 0,
        call_id: "c1",
        attempt,
        body: &body,
    }
    .seal(&key, generation);
    let msg = HarnessMessage::ToolResult {
        run_id: run.run_id.clone(),
        tenant: TENANT.into(),
        step: 0,
        call_id: "c1".into(),
        attempt,
        body,
        seal: Some(seal),
    };
    serde_json::to_string(&msg).unwrap_or_default()
}

/// The chaos gate's lost answer: a step retried a call and sent its
/// attempt 2, then died before committing either; the sandbox answered
/// attempt 2 while the ledger still said attempt 1. The answer waits for
/// the ledger, and is taken once the retry and its dispatch are in.
#[tokio::test]
async fn an_answer_ahead_of_its_retrys_commit_waits_for_it_then_is_taken() {
    let (svc, mem, h) = setup().await;
    let dispatched = ToolCallEvent::Dispatched {
        generation: Some(1),
    };
    let run = waiting_on_c1(&svc, &mem, |c| {
        c.apply(dispatched.clone(), 0).expect("dispatched");
    })
    .await;
    let answer = answer_of(&svc, &run, 2, 1).await;
    let failed = deliver(&h, &svc, std::slice::from_ref(&answer)).await;
    assert_eq!(failed.len(), 1, "kept for later, not dropped");
    let after = run_of(&svc, &run.run_id).await;
    assert_eq!(after.ledger["c1"].state(), ToolCallState::Dispatched);
    assert_eq!(svc.counters.stale_drops.load(Ordering::Relaxed), 0);
    // The retry and the dispatch of attempt 2 are committed.
    let mut retried = after.clone();
    let prev = retried.stamp();
    let c1 = retried.ledger.get_mut("c1").expect("c1");
    c1.apply(ToolCallEvent::Retried, 0).expect("retried");
    c1.apply(dispatched, 0).expect("dispatched again");
    svc.runs
        .save(prev, &retried, &[], vec![])
        .await
        .expect("saved");
    assert!(deliver(&h, &svc, &[answer]).await.is_empty());
    let taken = run_of(&svc, &run.run_id).await;
    assert_eq!(taken.ledger["c1"].state(), ToolCallState::Done);
    assert_eq!(taken.ledger["c1"].attempt, 2);
}

/// A call whose dispatch the sending step never committed (still
/// planned, no generation recorded) went to the sandbox's generation of
/// now: its answer is judged by that generation's seal, not refused.
#[tokio::test]
async fn an_answer_to_a_call_whose_dispatch_was_not_committed_is_taken() {
    let (svc, mem, h) = setup().await;
    let run = waiting_on_c1(&svc, &mem, |_| {}).await;
    let generation = svc
        .sandboxes
        .get(TENANT, "assistant")
        .await
        .ok()
        .flatten()
        .expect("the sandbox")
        .generation;
    // Another generation's seal is no answer.
    let forged = answer_of(&svc, &run, 1, generation + 1).await;
    assert!(deliver(&h, &svc, &[forged]).await.is_empty());
    assert_eq!(svc.counters.forged_drops.load(Ordering::Relaxed), 1);
    let answer = answer_of(&svc, &run, 1, generation).await;
    assert!(deliver(&h, &svc, &[answer]).await.is_empty());
    let taken = run_of(&svc, &run.run_id).await;
    assert_eq!(taken.ledger["c1"].state(), ToolCallState::Done, "{taken:?}");
    assert_eq!(svc.counters.forged_drops.load(Ordering::Relaxed), 1);
}
