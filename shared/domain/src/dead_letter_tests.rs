//! Which dead letters still mattered to their Run.

use super::*;
use crate::ledger::{ToolCallEvent, ToolCallRecord};
use crate::machine::Machine;
use crate::run::{test_run, RunEvent};

fn step(run: &Run, step: u32) -> HarnessMessage {
    HarnessMessage::Step {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
        step,
        epoch: 0,
    }
}

fn start(run: &Run) -> DispatchMessage {
    DispatchMessage::StartRun {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
    }
}

/// A Run at `step` 1, executing.
fn past_its_first_step() -> Run {
    let mut run = test_run();
    run.apply(RunEvent::Claimed { lease_until_ms: 5 }, 1)
        .unwrap();
    run.apply(RunEvent::StepContinues, 2).unwrap();
    assert_eq!(run.step, 1);
    run
}

#[test]
fn a_start_or_a_step_the_run_is_past_changes_nothing() {
    let pending = test_run();
    assert!(still_needed(
        &pending,
        DeadLetter::Dispatch(&start(&pending))
    ));
    assert!(still_needed(
        &pending,
        DeadLetter::Harness(&step(&pending, 0))
    ));
    let run = past_its_first_step();
    // Its start, its first step: copies of what it is past.
    assert!(!still_needed(&run, DeadLetter::Dispatch(&start(&run))));
    assert!(!still_needed(&run, DeadLetter::Harness(&step(&run, 0))));
    // The step it is at: it waited for that one.
    assert!(still_needed(&run, DeadLetter::Harness(&step(&run, 1))));
    // Not once the step waits for a person (a decision drives it then).
    let mut asking = run.clone();
    asking
        .apply(RunEvent::Claimed { lease_until_ms: 9 }, 3)
        .unwrap();
    asking.apply(RunEvent::AwaitApproval, 4).unwrap();
    assert_eq!(asking.step, 1);
    assert!(!still_needed(
        &asking,
        DeadLetter::Harness(&step(&asking, 1))
    ));
    // Its watchdog is asked to look instead: the worker that committed
    // the wait may have died before sending what follows it.
    let letter = step(&asking, 1);
    assert_eq!(
        judge(&asking, DeadLetter::Harness(&letter), 5),
        Verdict::Watch
    );
}

#[test]
fn a_result_matters_while_its_call_waits_for_it() {
    let mut run = past_its_first_step();
    let mut call =
        ToolCallRecord::planned("c1", "shell_exec", serde_json::json!({}), 1, false, true);
    call.apply(
        ToolCallEvent::Dispatched {
            generation: Some(1),
        },
        3,
    )
    .unwrap();
    run.ledger.insert("c1".into(), call);
    let result = |attempt| HarnessMessage::ToolResult {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
        step: 1,
        call_id: "c1".into(),
        attempt,
        body: crate::messages::ResultBody::Inline {
            outcome: crate::sandbox::hand::CallOutcome::Lost {
                reason: "test".into(),
            },
        },
        seal: None,
    };
    assert!(still_needed(&run, DeadLetter::Harness(&result(1))));
    assert!(
        !still_needed(&run, DeadLetter::Harness(&result(2))),
        "another attempt's"
    );
}

#[test]
fn a_run_already_ended_is_settled_whatever_the_letter() {
    let mut run = past_its_first_step();
    run.apply(
        RunEvent::Failed {
            error: crate::run::RunError::new("X", "x"),
        },
        4,
    )
    .unwrap();
    assert!(still_needed(&run, DeadLetter::Dispatch(&start(&run))));
}

#[test]
fn a_spawn_matters_while_children_of_its_round_are_to_start() {
    use crate::collab::children::{open_round, start_queued};
    use crate::run::family::{ChildSlot, RunKind};
    let mut run = test_run();
    run.apply(RunEvent::Claimed { lease_until_ms: 5 }, 1)
        .unwrap();
    let member = |id: &str| ChildSlot::queued(id.into(), "m".into(), RunKind::Member, None, None);
    open_round(&mut run, vec![member("c1"), member("c2")], 1);
    run.apply(RunEvent::AwaitChildren, 2).unwrap();
    let spawn = DispatchMessage::SpawnChildren {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
        round: 1,
    };
    assert!(still_needed(&run, DeadLetter::Dispatch(&spawn)));
    // One at a time: c2 still waits to start.
    start_queued(&mut run, 3);
    assert!(still_needed(&run, DeadLetter::Dispatch(&spawn)));
    // Every child started (each end starts the next): nothing to spawn.
    for s in run.children.as_mut().unwrap().slots.iter_mut() {
        if s.state() == SlotState::Queued {
            s.apply(crate::run::family::SlotEvent::Start, 4).unwrap();
        }
    }
    assert!(!still_needed(&run, DeadLetter::Dispatch(&spawn)));
}

#[test]
fn a_dead_watchdog_check_is_made_again_until_the_deadline() {
    let mut run = past_its_first_step();
    run.apply(RunEvent::Claimed { lease_until_ms: 9 }, 3)
        .unwrap();
    run.apply(RunEvent::AwaitChildren, 4).unwrap();
    let check = DispatchMessage::CheckRun {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
        step: run.step,
        epoch: run.epoch,
        n: 0,
    };
    let letter = DeadLetter::Dispatch(&check);
    assert_eq!(judge(&run, letter, 5), Verdict::Watch);
    // So is a copy of the step that began the wait; past the deadline,
    // either fails the Run (nothing would time it out otherwise).
    let began = step(&run, run.step);
    assert_eq!(judge(&run, DeadLetter::Harness(&began), 5), Verdict::Watch);
    let late = run.budgets.deadline_ms;
    assert_eq!(
        judge(&run, DeadLetter::Harness(&began), late),
        Verdict::Fail
    );
    assert_eq!(judge(&run, letter, run.budgets.deadline_ms), Verdict::Fail);
    // A check of an earlier wait: the Run is past it.
    let old = DispatchMessage::CheckRun {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
        step: run.step,
        epoch: run.epoch - 1,
        n: 0,
    };
    assert_eq!(judge(&run, DeadLetter::Dispatch(&old), 5), Verdict::Past);
    // The dead check's chain goes on from its successor; a dead step
    // starts the wait's chain (or meets it, at its first check).
    let next = |letter| match watch(&run, letter) {
        DispatchMessage::CheckRun { n, epoch, step, .. } => (n, epoch, step),
        other => panic!("{other:?}"),
    };
    assert_eq!(next(letter), (1, run.epoch, run.step));
    assert_eq!(next(DeadLetter::Harness(&began)), (0, run.epoch, run.step));
}
