//! Whether a message moved to a dead-letter queue still mattered to its
//! Run. A message that failed on every delivery fails its Run, so that no
//! Run waits forever for it; but under at-least-once delivery a copy of a
//! message the Run is long past (its start, a step it finished, a result
//! already taken) can run out of deliveries too, and failing a healthy Run
//! for it would be a fault of our own making.

use crate::collab::SlotState;
use crate::ledger::ToolCallState;
use crate::messages::{DispatchMessage, HarnessMessage};
use crate::run::{Run, RunState};

/// A dead letter, from either dead-letter queue.
#[derive(Debug, Clone, Copy)]
pub enum DeadLetter<'a> {
    Harness(&'a HarnessMessage),
    Dispatch(&'a DispatchMessage),
}

/// What becomes of a Run whose message was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It never waited for the message (a copy of one it is past): it
    /// goes on untouched.
    Past,
    /// It fails with the reason (or, ended already, is settled).
    Fail,
    /// It waits (for a sandbox, a person, children) and the message was
    /// one that could carry its wait's follow-ups: its step (a worker
    /// killed after committing the wait sent neither the children's start
    /// nor the watchdog), a hand-over, or its watchdog's own check. Its
    /// watchdog is asked to look, which starts what was lost, while the
    /// Run has time left (its deadline bounds this).
    Watch,
}

/// The verdict on `run` for a dead letter, at `now_ms`.
pub fn judge(run: &Run, letter: DeadLetter<'_>, now_ms: i64) -> Verdict {
    let waiting = run.state().is_waiting();
    let of_this_wait = match letter {
        DeadLetter::Harness(
            HarnessMessage::Step { step, .. } | HarnessMessage::SandboxHanded { step, .. },
        ) => run.step == *step,
        DeadLetter::Dispatch(DispatchMessage::CheckRun { step, epoch, .. }) => {
            run.step == *step && run.epoch == *epoch
        }
        _ => false,
    };
    if waiting && of_this_wait {
        // Past its deadline there is nothing left to wait for.
        return if run.past_deadline(now_ms) {
            Verdict::Fail
        } else {
            Verdict::Watch
        };
    }
    if still_needed(run, letter) {
        Verdict::Fail
    } else {
        Verdict::Past
    }
}

/// The check that a [`Verdict::Watch`] sends: the next of the chain the
/// dead letter was a check of (the chain went on from no copy of it), or
/// the wait's first check (a copy of it merges with the chain when one
/// goes on: [`crate::messages::check_slot`]).
pub fn watch(run: &Run, letter: DeadLetter<'_>) -> DispatchMessage {
    let n = match letter {
        DeadLetter::Dispatch(DispatchMessage::CheckRun { n, .. }) => n + 1,
        _ => 0,
    };
    DispatchMessage::CheckRun {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
        step: run.step,
        epoch: run.epoch,
        n,
    }
}

/// Whether `run` still waited for what `letter` carried: only then is the
/// Run failed for it. A Run already ended is settled all the same (its
/// settling may be what failed).
pub fn still_needed(run: &Run, letter: DeadLetter<'_>) -> bool {
    if run.state().is_terminal() {
        return true;
    }
    match letter {
        DeadLetter::Harness(m) => match m {
            // A step's message drives a Run only until the step waits
            // (then a result, a decision or a child's end does).
            HarnessMessage::Step { step, .. } => {
                run.step == *step && matches!(run.state(), RunState::Pending | RunState::Executing)
            }
            HarnessMessage::SandboxHanded { step, .. } => {
                run.step == *step && run.state() == RunState::AwaitingTool
            }
            HarnessMessage::ChildEnded { child_run_id, .. } => run
                .children
                .as_ref()
                .and_then(|c| c.slot(child_run_id))
                .is_some_and(|s| s.state() != SlotState::Ended),
            HarnessMessage::ApprovalDecided { .. } => run.state() == RunState::AwaitingHitl,
            HarnessMessage::ToolResult {
                step,
                call_id,
                attempt,
                ..
            } => {
                run.step == *step
                    && run.ledger.get(call_id).is_some_and(|c| {
                        c.state() == ToolCallState::Dispatched && c.attempt == *attempt
                    })
            }
        },
        DeadLetter::Dispatch(m) => match m {
            DispatchMessage::StartRun { .. } => run.state() == RunState::Pending,
            // A check matters only to a wait (see `judge`).
            DispatchMessage::CheckRun { step, epoch, .. } => {
                run.step == *step && run.epoch == *epoch && run.state().is_waiting()
            }
            // Only while children of its round are still to start.
            DispatchMessage::SpawnChildren { round, .. } => {
                run.state() == RunState::AwaitingChildren
                    && run.children.as_ref().is_some_and(|c| {
                        c.slots
                            .iter()
                            .any(|s| s.round == *round && s.state() == SlotState::Queued)
                    })
            }
            // The rest carry nothing a Run waits for, or none at all.
            _ => true,
        },
    }
}

#[cfg(test)]
#[path = "dead_letter_tests.rs"]
mod tests;
