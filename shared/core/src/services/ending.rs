//! Ending a Run from outside its harness (a cancel, a deadline while it
//! waits, a dead letter, its parent's end, a team it cannot be) and
//! carrying out what a Run's machine decided. The Run takes the event with
//! the next epoch, so a worker still in a step cannot commit after it; its
//! end event is written with the change, conditional on the stamp read.

use armada_domain::messages::{DispatchMessage, HarnessMessage};
use armada_domain::run::{EndNote, IllegalTransition, Run, RunAction, RunEvent};

use crate::error::StoreError;
use crate::Services;

/// A Run ended and written, with what its machine decided to do next
/// (carried out by [`carry_out`], or by the dispatcher inline).
#[derive(Debug)]
#[must_use = "the machine's actions must be carried out"]
pub struct Ended {
    pub run: Run,
    pub actions: Vec<RunAction>,
}

/// Ends `run` with `event`, its end event carrying the Run's error and
/// what `note` says. `Ok(Err(_))` when the Run cannot take `event`
/// (nothing is written); a `Conflict` means it changed since it was read.
pub async fn end_from_outside(
    svc: &Services,
    run: Run,
    event: RunEvent,
    note: EndNote,
) -> Result<Result<Ended, IllegalTransition>, StoreError> {
    let now = svc.clock.now_ms();
    let prev = run.stamp();
    let mut next = run;
    let actions = match next.apply_from_outside(event, now) {
        Ok(actions) => actions,
        Err(e) => return Ok(Err(e)),
    };
    let ended: Vec<_> = next.push_end_event(note, now).into_iter().collect();
    svc.runs.save(prev, &next, &ended, vec![]).await?;
    Ok(Ok(Ended { run: next, actions }))
}

/// Carries out, once a Run's change is committed, what its machine
/// decided: the next step queued for the harness, or its end announced to
/// the dispatcher. (A lost message is sent again by the Run's watchdog.)
pub async fn carry_out(svc: &Services, run: &Run, actions: &[RunAction]) -> Result<(), StoreError> {
    for action in actions {
        match action {
            RunAction::EnqueueNextStep => {
                svc.queues
                    .send_harness(&HarnessMessage::Step {
                        run_id: run.run_id.clone(),
                        tenant: run.tenant.clone(),
                        step: run.step,
                    })
                    .await?
            }
            RunAction::AnnounceTerminal => {
                svc.queues
                    .send_dispatch(&DispatchMessage::RunTerminal {
                        run_id: run.run_id.clone(),
                        tenant: run.tenant.clone(),
                    })
                    .await?
            }
        }
    }
    Ok(())
}
