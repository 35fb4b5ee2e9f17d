//! The dispatcher's decisions on in-memory ports: starting Runs, a
//! session's messages one after another, settling and closing, dead
//! letters and the watchdog's deadline. No emulator.

use std::sync::Arc;

use armada_core::memory::fixtures::{accepted_run, agent, session, session_message, sqs_event};
use armada_core::memory::{test_config, Memory};
use armada_domain::agent::AgentDefinition;
use armada_domain::run::{LogEvent, Payload};

use super::*;
use armada_domain::messages::HarnessMessage;
use armada_domain::run::RunState;

const TENANT: &str = "acme";

async fn setup() -> (Arc<Services>, Arc<Memory>, Dispatcher, AgentDefinition) {
    let (svc, mem) = Services::in_memory(test_config());
    let def = agent(&svc, "assistant", &["current_time"]).await;
    (svc.clone(), mem, Dispatcher::new(svc), def)
}

async fn deliver(d: &Dispatcher, queue: &str, msg: &impl serde::Serialize) -> usize {
    let body = serde_json::to_string(msg).unwrap_or_default();
    d.handle_event(sqs_event(queue, &[body]))
        .await
        .batch_item_failures
        .len()
}

/// As [`deliver`], carried by the SQS message `message_id`.
async fn deliver_as(d: &Dispatcher, queue: &str, msg: &DispatchMessage, message_id: &str) -> usize {
    let body = serde_json::to_string(msg).unwrap_or_default();
    let mut event = sqs_event(queue, &[body]);
    event.records[0].message_id = Some(message_id.to_string());
    d.handle_event(event).await.batch_item_failures.len()
}

fn start(run: &Run) -> DispatchMessage {
    DispatchMessage::StartRun {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
    }
}

fn terminal(run: &Run) -> DispatchMessage {
    DispatchMessage::RunTerminal {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
    }
}

fn first_step(run: &Run) -> HarnessMessage {
    HarnessMessage::Step {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
        step: 0,
        epoch: 0,
    }
}

/// Moves a stored Run as a harness step would (claim, then `event`).
fn step_to(mem: &Memory, run_id: &str, event: Option<RunEvent>) {
    let mut st = mem.state();
    let r = st.runs.get_mut(run_id).expect("the run exists");
    r.apply(RunEvent::Claimed { lease_until_ms: 0 }, 1)
        .expect("claimable");
    if let Some(e) = event {
        r.apply(e, 2).expect("legal");
    }
}

fn state_of(mem: &Memory, run_id: &str) -> RunState {
    mem.state().runs[run_id].state()
}

#[tokio::test]
async fn a_run_is_started_once_and_a_started_one_is_left_alone() {
    let (svc, mem, d, def) = setup().await;
    let run = accepted_run(&svc, TENANT, &def, "hi").await;
    assert_eq!(deliver(&d, &svc.cfg.dispatch_queue, &start(&run)).await, 0);
    assert_eq!(mem.take_harness(), [first_step(&run)]);
    step_to(&mem, &run.run_id, None);
    deliver(&d, &svc.cfg.dispatch_queue, &start(&run)).await;
    assert!(
        mem.take_harness().is_empty(),
        "a duplicate start is dropped"
    );
}

#[tokio::test]
async fn a_sessions_messages_run_one_after_another() {
    let (svc, mem, d, def) = setup().await;
    let h = session(&svc, TENANT, &def).await;
    let first = session_message(&svc, &h.session_id, &def, "one").await;
    let second = session_message(&svc, &h.session_id, &def, "two").await;
    let q = svc.cfg.dispatch_queue.clone();
    deliver(&d, &q, &start(&first)).await;
    assert_eq!(mem.take_harness(), [first_step(&first)]);
    step_to(&mem, &first.run_id, None);
    deliver(&d, &q, &start(&second)).await;
    assert!(
        mem.take_harness().is_empty(),
        "the second waits for the first"
    );

    let output = Payload::Inline { text: "1".into() };
    if let Some(r) = mem.state().runs.get_mut(&first.run_id) {
        r.apply(RunEvent::Answered { output }, 3).expect("legal");
    }
    deliver(&d, &q, &terminal(&first)).await;
    assert_eq!(mem.take_harness(), [first_step(&second)], "then it starts");
    assert_eq!(state_of(&mem, &first.run_id), RunState::ClosedCompleted);
    let header = mem.state().sessions[&h.session_id].clone();
    assert_eq!((header.next_seq, header.done_seq), (2, 1));
    // Settling is idempotent: a second notice closes nothing twice.
    deliver(&d, &q, &terminal(&first)).await;
    assert!(mem.take_harness().is_empty());
}

#[tokio::test]
async fn a_session_message_still_queued_at_its_deadline_times_out_then() {
    let (svc, mem, d, def) = setup().await;
    let h = session(&svc, TENANT, &def).await;
    let first = session_message(&svc, &h.session_id, &def, "one").await;
    let second = session_message(&svc, &h.session_id, &def, "two").await;
    let third = session_message(&svc, &h.session_id, &def, "three").await;
    let q = svc.cfg.dispatch_queue.clone();
    deliver(&d, &q, &start(&first)).await;
    assert_eq!(mem.take_harness(), [first_step(&first)]);
    step_to(&mem, &first.run_id, None);
    // Queued behind the head: it is to be started again at its deadline.
    deliver(&d, &q, &start(&second)).await;
    assert!(mem.take_harness().is_empty());
    let timeout_s = def.limits.timeout_s;
    let sent = std::mem::take(&mut mem.state().dispatch);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].0, start(&second));
    assert!(
        (timeout_s - 1..=timeout_s + 1).contains(&sent[0].1),
        "{sent:?}"
    );
    // Before it, the start again only waits on.
    deliver(&d, &q, &start(&second)).await;
    assert_eq!(state_of(&mem, &second.run_id), RunState::Pending);
    mem.take_dispatch();
    // At it, still queued: it times out, and nothing of it starts.
    svc.clock.advance(i64::from(timeout_s) * 1000 + 1);
    deliver(&d, &q, &start(&second)).await;
    assert_eq!(state_of(&mem, &second.run_id), RunState::ClosedTimedOut);
    assert!(mem.take_harness().is_empty());
    // When the head ends, the session passes over it to the third.
    let output = Payload::Inline { text: "1".into() };
    if let Some(r) = mem.state().runs.get_mut(&first.run_id) {
        r.apply(RunEvent::Answered { output }, 3).expect("legal");
    }
    deliver(&d, &q, &terminal(&first)).await;
    let header = mem.state().sessions[&h.session_id].clone();
    assert_eq!(header.done_seq, 2);
    let started = mem.take_harness();
    assert!(
        started.is_empty() || started == [first_step(&third)],
        "{started:?}"
    );
}

#[tokio::test]
async fn a_dead_lettered_step_fails_its_run_fenced_and_closes_it() {
    let (svc, mem, d, def) = setup().await;
    let run = accepted_run(&svc, TENANT, &def, "hi").await;
    step_to(&mem, &run.run_id, None);
    let dlq = svc.cfg.harness_dlq.clone();
    assert_eq!(deliver(&d, &dlq, &first_step(&run)).await, 0);
    let after = mem.state().runs[&run.run_id].clone();
    assert_eq!(after.state(), RunState::ClosedFailed);
    assert_eq!(after.epoch, 2, "a worker still on the step is fenced out");
    assert_eq!(after.error.map(|e| e.code), Some("DEAD_LETTERED".into()));
}

/// A copy of a message the Run is past (its start, once it runs; a step
/// it finished) can run out of deliveries under at-least-once delivery:
/// the Run never waited for it and goes on. (Found by `armada chaos`: a
/// healthy Run waiting for an approval was failed by its start's copy.)
#[tokio::test]
async fn a_dead_letter_the_run_is_past_leaves_it_alone() {
    let (svc, mem, d, def) = setup().await;
    let run = accepted_run(&svc, TENANT, &def, "hi").await;
    step_to(&mem, &run.run_id, Some(RunEvent::AwaitTool));
    let dispatch_dlq = svc.cfg.dispatch_dlq.clone();
    assert_eq!(deliver(&d, &dispatch_dlq, &start(&run)).await, 0);
    assert_eq!(state_of(&mem, &run.run_id), RunState::AwaitingTool);
    // A watchdog check that ran out of deliveries is made again.
    let check = DispatchMessage::CheckRun {
        run_id: run.run_id.clone(),
        tenant: TENANT.into(),
        step: 0,
        epoch: 1,
        n: 0,
    };
    assert_eq!(deliver(&d, &dispatch_dlq, &check).await, 0);
    assert_eq!(state_of(&mem, &run.run_id), RunState::AwaitingTool);
    // The next of its chain: no copy of the dead one went on.
    let DispatchMessage::CheckRun { n: 0, .. } = check else {
        panic!("{check:?}");
    };
    let next = DispatchMessage::CheckRun {
        run_id: run.run_id.clone(),
        tenant: TENANT.into(),
        step: 0,
        epoch: 1,
        n: 1,
    };
    assert_eq!(
        mem.state().dispatch.last(),
        Some(&(next, svc.cfg.sandbox.check_seconds))
    );
    // The copy of the step that began its wait: the worker that committed
    // the wait may have died before scheduling its watchdog, so the
    // watchdog is asked to look.
    let dlq = svc.cfg.harness_dlq.clone();
    mem.take_dispatch();
    assert_eq!(deliver(&d, &dlq, &first_step(&run)).await, 0);
    assert_eq!(state_of(&mem, &run.run_id), RunState::AwaitingTool);
    assert!(
        matches!(mem.take_dispatch().as_slice(), [DispatchMessage::CheckRun { run_id, .. }] if *run_id == run.run_id)
    );
    // A step still to run (its worker died after claiming it) is another
    // matter: that Run fails.
    let stuck = accepted_run(&svc, TENANT, &def, "ho").await;
    step_to(&mem, &stuck.run_id, None);
    assert_eq!(deliver(&d, &dlq, &first_step(&stuck)).await, 0);
    assert_eq!(state_of(&mem, &stuck.run_id), RunState::ClosedFailed);
}

/// A Run whose document cannot be read: every delivery of its step fails
/// and it reaches the dead-letter queue, where it is rebuilt from what
/// its item says beside the document, failed with CORRUPT_RECORD, settled
/// and closed: readable again, nothing left waiting.
#[tokio::test]
async fn a_dead_lettered_run_whose_record_cannot_be_read_is_still_ended() {
    let (svc, mem, d, def) = setup().await;
    let run = accepted_run(&svc, TENANT, &def, "hi").await;
    step_to(&mem, &run.run_id, Some(RunEvent::AwaitTool));
    mem.state().corrupt_runs.insert(run.run_id.clone());
    assert!(svc.runs.get(&run.run_id).await.is_err());
    let dlq = svc.cfg.harness_dlq.clone();
    assert_eq!(deliver(&d, &dlq, &first_step(&run)).await, 0);
    let after = svc.runs.get(&run.run_id).await.unwrap().unwrap();
    assert_eq!(after.state(), RunState::ClosedFailed);
    assert_eq!(after.epoch, 2, "a worker still on the step is fenced out");
    assert_eq!(
        after.error.map(|e| e.code),
        Some(armada_domain::run::CORRUPT_RECORD.into())
    );
    let kinds: Vec<String> = mem.state().events[&run.run_id]
        .values()
        .map(|e| e.kind().as_str().to_string())
        .collect();
    assert!(kinds.contains(&"run_failed".to_string()), "{kinds:?}");
}

/// The tenant's Runs counted as active (as ingress counts them).
async fn active(svc: &Services) -> u32 {
    let now = svc.clock.now_ms();
    svc.quotas.active_runs(TENANT, 10, now).await.unwrap()
}

/// A Run started through the API stops counting against its tenant's
/// active Runs when it is settled, whichever way it ended: answered, or
/// dead-lettered with a record that cannot be read. Settling again is
/// harmless.
#[tokio::test]
async fn a_settled_run_no_longer_counts_as_its_tenants_active_run() {
    let (svc, mem, d, def) = setup().await;
    let done = accepted_run(&svc, TENANT, &def, "hi").await;
    let lost = accepted_run(&svc, TENANT, &def, "hi").await;
    assert_eq!(active(&svc).await, 2);
    let output = Payload::Inline { text: "1".into() };
    step_to(&mem, &done.run_id, Some(RunEvent::Answered { output }));
    let q = svc.cfg.dispatch_queue.clone();
    assert_eq!(deliver(&d, &q, &terminal(&done)).await, 0);
    assert_eq!(state_of(&mem, &done.run_id), RunState::ClosedCompleted);
    assert_eq!(active(&svc).await, 1);

    step_to(&mem, &lost.run_id, Some(RunEvent::AwaitTool));
    mem.state().corrupt_runs.insert(lost.run_id.clone());
    let dlq = svc.cfg.harness_dlq.clone();
    assert_eq!(deliver(&d, &dlq, &first_step(&lost)).await, 0);
    assert_eq!(state_of(&mem, &lost.run_id), RunState::ClosedFailed);
    assert_eq!(active(&svc).await, 0);
    assert_eq!(deliver(&d, &q, &terminal(&done)).await, 0);
    assert_eq!(active(&svc).await, 0);
}

#[tokio::test]
async fn a_close_that_meets_another_writer_is_tried_again_not_taken_for_done() {
    let (svc, mem, d, def) = setup().await;
    let run = accepted_run(&svc, TENANT, &def, "hi").await;
    let output = Payload::Inline { text: "1".into() };
    step_to(&mem, &run.run_id, Some(RunEvent::Answered { output }));
    let read = mem.state().runs[&run.run_id].clone();
    // Another writer changes the Run after the settling read it.
    let mut other = read.clone();
    let noted = LogEvent::HistoryCompacted {
        dropped_turns: 0,
        kept_turns: 0,
    };
    let event = other.push_event(noted, 5);
    svc.runs
        .save(read.stamp(), &other, &[event], vec![])
        .await
        .expect("the other write");
    let outcome = d.close(read, vec![]).await.expect("answered");
    assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
    assert_eq!(
        state_of(&mem, &run.run_id),
        RunState::Completed,
        "not closed yet"
    );
    // Its repeat closes it.
    let q = svc.cfg.dispatch_queue.clone();
    assert_eq!(deliver(&d, &q, &terminal(&run)).await, 0);
    assert_eq!(state_of(&mem, &run.run_id), RunState::ClosedCompleted);
    // A close that lost to another settling's close is done.
    let outcome = d.close(other, vec![]).await.expect("answered");
    assert_eq!(outcome, Outcome::Done);
}

#[tokio::test]
async fn the_watchdog_times_out_a_waiting_run_past_its_deadline() {
    let (svc, mem, d, def) = setup().await;
    let run = accepted_run(&svc, TENANT, &def, "hi").await;
    step_to(&mem, &run.run_id, Some(RunEvent::AwaitTool));
    let check = DispatchMessage::CheckRun {
        run_id: run.run_id.clone(),
        tenant: TENANT.into(),
        step: 0,
        epoch: 1,
        n: 0,
    };
    // Before the deadline it only checks again later.
    deliver(&d, &svc.cfg.dispatch_queue, &check).await;
    assert_eq!(state_of(&mem, &run.run_id), RunState::AwaitingTool);
    assert!(matches!(
        mem.take_dispatch().as_slice(),
        [DispatchMessage::CheckRun { .. }]
    ));
    svc.clock
        .advance(i64::from(def.limits.timeout_s) * 1000 + 1);
    deliver(&d, &svc.cfg.dispatch_queue, &check).await;
    let after = mem.state().runs[&run.run_id].clone();
    assert_eq!(after.state(), RunState::ClosedTimedOut);
    assert_eq!(after.error.map(|e| e.code), Some("TIMED_OUT".into()));
}

/// A check handled twice (its delete lost, or its batch handed to two
/// invocations) sends its successor twice; only the first copy of that
/// successor goes on, so the chain stays one chain. A redelivery of the
/// message that took the slot still goes on (it may have died midway).
#[tokio::test]
async fn a_watchdog_check_handled_twice_leaves_one_chain() {
    let (svc, mem, d, def) = setup().await;
    let run = accepted_run(&svc, TENANT, &def, "hi").await;
    step_to(&mem, &run.run_id, Some(RunEvent::AwaitTool));
    let check = DispatchMessage::CheckRun {
        run_id: run.run_id.clone(),
        tenant: TENANT.into(),
        step: 0,
        epoch: 1,
        n: 0,
    };
    let queue = svc.cfg.dispatch_queue.clone();
    // The same message handled twice: two successors, copies of one.
    assert_eq!(deliver_as(&d, &queue, &check, "first").await, 0);
    assert_eq!(deliver_as(&d, &queue, &check, "first").await, 0);
    let successors = mem.take_dispatch();
    assert_eq!(successors.len(), 2, "{successors:?}");
    assert!(successors
        .iter()
        .all(|m| matches!(m, DispatchMessage::CheckRun { n: 1, .. })));
    // Two SQS messages now: the first to arrive goes on, the other is
    // dropped; the first's redelivery goes on again.
    assert_eq!(deliver_as(&d, &queue, &successors[0], "one").await, 0);
    assert_eq!(mem.take_dispatch().len(), 1);
    assert_eq!(deliver_as(&d, &queue, &successors[1], "two").await, 0);
    assert!(mem.take_dispatch().is_empty(), "the chain forked");
    assert_eq!(deliver_as(&d, &queue, &successors[0], "one").await, 0);
    assert!(matches!(
        mem.take_dispatch().as_slice(),
        [DispatchMessage::CheckRun { n: 2, .. }]
    ));
}

/// The watchdog timed a Run out and died before settling it: the check's
/// redelivery settles it, rather than taking it for a Run that moved on.
#[tokio::test]
async fn a_check_that_finds_its_run_ended_but_unsettled_settles_it() {
    let (svc, mem, d, def) = setup().await;
    let run = accepted_run(&svc, TENANT, &def, "hi").await;
    step_to(&mem, &run.run_id, Some(RunEvent::AwaitTool));
    {
        let mut st = mem.state();
        let r = st.runs.get_mut(&run.run_id).expect("the run");
        let error = armada_domain::run::RunError::new("TIMED_OUT", "late");
        r.apply(RunEvent::DeadlineExceeded { error }, 3)
            .expect("timed out");
    }
    let check = DispatchMessage::CheckRun {
        run_id: run.run_id.clone(),
        tenant: TENANT.into(),
        step: 0,
        epoch: 1,
        n: 0,
    };
    assert_eq!(deliver(&d, &svc.cfg.dispatch_queue, &check).await, 0);
    assert_eq!(state_of(&mem, &run.run_id), RunState::ClosedTimedOut);
}

#[tokio::test]
async fn a_message_naming_another_tenant_changes_nothing() {
    let (svc, mem, d, def) = setup().await;
    let run = accepted_run(&svc, TENANT, &def, "hi").await;
    let forged = DispatchMessage::StartRun {
        run_id: run.run_id.clone(),
        tenant: "mallory".into(),
    };
    deliver(&d, &svc.cfg.dispatch_queue, &forged).await;
    assert!(mem.take_harness().is_empty());
    assert_eq!(state_of(&mem, &run.run_id), RunState::Pending);
}

/// Two Runs of one agent, each waiting at step 0: the first holds the
/// agent's sandbox, the second is queued behind it.
async fn two_on_one_sandbox() -> (Arc<Services>, Arc<Memory>, Dispatcher, Run, Run) {
    let (svc, mem, d, def) = setup().await;
    let first = accepted_run(&svc, TENANT, &def, "one").await;
    let second = accepted_run(&svc, TENANT, &def, "two").await;
    for run in [&first, &second] {
        armada_core::services::sandboxing::acquire(&svc, TENANT, &run.run_id, &def)
            .await
            .expect("asked");
        step_to(&mem, &run.run_id, Some(RunEvent::AwaitTool));
        let mut st = mem.state();
        st.runs.get_mut(&run.run_id).expect("the run").sandbox_key = Some(
            armada_domain::sandbox::lifecycle::sandbox_key(TENANT, "assistant"),
        );
    }
    (svc, mem, d, first, second)
}

fn check_at_step_0(run: &Run) -> DispatchMessage {
    DispatchMessage::CheckRun {
        run_id: run.run_id.clone(),
        tenant: TENANT.into(),
        step: 0,
        epoch: 1,
        n: 0,
    }
}

#[tokio::test]
async fn the_watchdog_tells_a_run_again_that_it_holds_its_sandbox() {
    let (svc, mem, d, first, second) = two_on_one_sandbox().await;
    // A Run still waiting for the sandbox is not told anything.
    deliver(&d, &svc.cfg.dispatch_queue, &check_at_step_0(&second)).await;
    assert!(mem.take_harness().is_empty());
    // The first lets go; the message handing the sandbox over is lost
    // (its sender died after the release).
    armada_core::services::sandboxing::release_and_wake(&svc, &first)
        .await
        .expect("released");
    let handed = mem.take_harness();
    assert!(
        matches!(&handed[..], [HarnessMessage::SandboxHanded { run_id, .. }] if *run_id == second.run_id),
        "{handed:?}"
    );
    // The watchdog sends the same message again: the same hand-over.
    deliver(&d, &svc.cfg.dispatch_queue, &check_at_step_0(&second)).await;
    let again = mem.take_harness();
    assert_eq!(again, handed);
    assert_eq!(again[0].dedup_id(), handed[0].dedup_id());
}

/// Found by the chaos gate: the holder's call was lost with its sandbox,
/// which the watchdog destroyed; the holder failed and handed the gone
/// sandbox to the next Run, which never heard. Nine Runs waited behind it
/// until their deadlines.
#[tokio::test]
async fn a_run_handed_a_gone_sandbox_is_told_again_too() {
    let (svc, mem, d, first, second) = two_on_one_sandbox().await;
    armada_core::services::sandboxing::destroy(&svc, TENANT, "assistant", "its call was lost")
        .await
        .expect("destroyed");
    armada_core::services::sandboxing::release_and_wake(&svc, &first)
        .await
        .expect("released");
    let handed = mem.take_harness();
    assert_eq!(handed.len(), 1, "{handed:?}");
    deliver(&d, &svc.cfg.dispatch_queue, &check_at_step_0(&second)).await;
    assert_eq!(mem.take_harness(), handed);
}

/// A holder that ended without letting go (its step asked for the
/// sandbox after its end let go) is let go by the next Run's watchdog.
#[tokio::test]
async fn a_holder_that_ended_without_letting_go_is_let_go() {
    let (svc, mem, d, first, second) = two_on_one_sandbox().await;
    {
        let mut st = mem.state();
        let r = st.runs.get_mut(&first.run_id).expect("the run");
        let error = armada_domain::run::RunError::new("TIMED_OUT", "late");
        r.apply(RunEvent::DeadlineExceeded { error }, 3)
            .expect("timed out");
    }
    deliver(&d, &svc.cfg.dispatch_queue, &check_at_step_0(&second)).await;
    let handed = mem.take_harness();
    assert!(
        matches!(&handed[..], [HarnessMessage::SandboxHanded { run_id, .. }] if *run_id == second.run_id),
        "{handed:?}"
    );
    let rec = svc.sandboxes.get(TENANT, "assistant").await.expect("read");
    let holder = rec.and_then(|r| r.holder_run_id);
    assert_eq!(holder.as_deref(), Some(second.run_id.as_str()));
}

/// The holder's call `c1`, dispatched to its sandbox's generation, which
/// marked it finished `ago_ms` before now.
async fn finished_call(svc: &Services, mem: &Memory, run: &Run, ago_ms: i64) {
    use armada_core::ports::CallRef;
    use armada_domain::ledger::{ToolCallEvent, ToolCallRecord};
    use armada_domain::machine::Machine;
    use armada_domain::sandbox::hand::CallMark;
    let rec = svc.sandboxes.get(TENANT, "assistant").await.expect("read");
    let generation = rec.expect("the sandbox").generation;
    let mut c1 = ToolCallRecord::planned("c1", "shell_exec", serde_json::json!({}), 0, false, true);
    let sent = ToolCallEvent::Dispatched {
        generation: Some(generation),
    };
    c1.apply(sent, 1).expect("dispatched");
    mem.state()
        .runs
        .get_mut(&run.run_id)
        .expect("the run")
        .ledger
        .insert("c1".into(), c1);
    let call = CallRef {
        tenant: TENANT.into(),
        agent: "assistant".into(),
        run_id: run.run_id.clone(),
        call_id: "c1".into(),
        attempt: 1,
    };
    let at = svc.clock.now_ms() - ago_ms;
    let store = &svc.sandboxes;
    store
        .mark_first(&call, CallMark::Started, generation, at)
        .await
        .expect("started");
    store.mark_finished(&call, at).await.expect("finished");
}

/// A call its sandbox finished whose answer never came (lost on the way,
/// or dropped): once longer ago than an answer can take, the watchdog
/// speaks for it as lost, and leaves the sandbox be; until then it waits.
#[tokio::test]
async fn a_finished_call_whose_answer_never_came_is_answered_as_lost() {
    use armada_domain::messages::ResultBody;
    use armada_domain::sandbox::hand::CallOutcome;
    let (svc, mem, d, first, _second) = two_on_one_sandbox().await;
    let patience = armada_core::services::sandboxing::answer_patience_ms(&svc);
    finished_call(&svc, &mem, &first, patience / 2).await;
    deliver(&d, &svc.cfg.dispatch_queue, &check_at_step_0(&first)).await;
    assert!(
        mem.take_harness().is_empty(),
        "its answer may be on its way"
    );

    let (svc, mem, d, first, _second) = two_on_one_sandbox().await;
    finished_call(&svc, &mem, &first, patience + 1000).await;
    deliver(&d, &svc.cfg.dispatch_queue, &check_at_step_0(&first)).await;
    let told = mem.take_harness();
    assert!(
        matches!(
            &told[..],
            [HarnessMessage::ToolResult { call_id, body: ResultBody::Inline { outcome: CallOutcome::Lost { .. } }, .. }] if call_id == "c1"
        ),
        "{told:?}"
    );
    let rec = svc.sandboxes.get(TENANT, "assistant").await.expect("read");
    assert!(
        !rec.expect("the sandbox").state().is_gone(),
        "not destroyed"
    );
}
