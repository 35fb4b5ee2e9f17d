//! Ending a Run from outside its harness (a cancel, a deadline while it
//! waits, a dead letter, its parent's end, a team it cannot be) and
//! carrying out what a Run's machine decided. The Run takes the event with
//! the next epoch, so a worker still in a step cannot commit after it; its
//! end event is written with the change, conditional on the stamp read.

use armada_domain::messages::{DispatchMessage, HarnessMessage};
use armada_domain::run::{EndNote, IllegalTransition, Run, RunAction, RunEvent, RunState};

use crate::cas::{until_written, Try};
use crate::error::StoreError;
use crate::services::unreadable::{self, Ending};
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

/// How [`end`] went.
#[derive(Debug)]
#[must_use = "an ended Run's actions must be carried out"]
pub enum EndOutcome {
    /// There is no such Run of the tenant.
    Missing,
    /// It had ended already, in this state (nothing written, unless its
    /// unreadable document was rewritten readable).
    AlreadyEnded(RunState),
    /// Its machine refused the event (nothing written).
    Refused(IllegalTransition),
    /// Ended and written.
    Ended(Box<Ended>),
}

/// Ends the Run `run_id` of `tenant` with `event` and `note`: read, ended
/// through its machine, written conditional on the stamp read, read and
/// decided again when another writer came first. A Run whose document
/// cannot be read is rebuilt from its head and ended as `if_unreadable`
/// says. `None` when every try met another writer.
pub async fn end(
    svc: &Services,
    run_id: &str,
    tenant: &str,
    event: RunEvent,
    note: EndNote,
    if_unreadable: Ending<'_>,
) -> Result<Option<EndOutcome>, StoreError> {
    until_written(|| async {
        let (run, event, note) = match svc.runs.get(run_id).await {
            Ok(Some(run)) if run.tenant == tenant => (run, event.clone(), note.clone()),
            Ok(Some(run)) => {
                tracing::error!(run_id, tenant, owner = %run.tenant, "security: an end names another tenant's run; refused");
                return Ok(Try::Done(EndOutcome::Missing));
            }
            Ok(None) => return Ok(Try::Done(EndOutcome::Missing)),
            Err(StoreError::Corrupt(why)) => {
                let Some(head) = unreadable::head_of(svc, run_id, tenant).await? else {
                    return Ok(Try::Done(EndOutcome::Missing));
                };
                tracing::error!(run_id, tenant, why, "a run whose record could not be read is rebuilt from its head");
                match unreadable::rebuilt(&head, &why, if_unreadable) {
                    (run, Some((event, note))) => (run, event, note),
                    (run, None) => {
                        return match svc.runs.save(run.stamp(), &run, &[], vec![]).await {
                            Ok(()) => Ok(Try::Done(EndOutcome::AlreadyEnded(run.state()))),
                            Err(StoreError::Conflict { .. }) => Ok(Try::Again),
                            Err(e) => Err(e),
                        };
                    }
                }
            }
            Err(e) => return Err(e),
        };
        if run.state().is_terminal() {
            return Ok(Try::Done(EndOutcome::AlreadyEnded(run.state())));
        }
        match end_from_outside(svc, run, event, note).await {
            Ok(Ok(ended)) => Ok(Try::Done(EndOutcome::Ended(Box::new(ended)))),
            Ok(Err(refused)) => Ok(Try::Done(EndOutcome::Refused(refused))),
            Err(StoreError::Conflict { .. }) => Ok(Try::Again),
            Err(e) => Err(e),
        }
    })
    .await
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
                        epoch: run.epoch,
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
