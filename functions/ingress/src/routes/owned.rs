//! A tenant's existing Runs, as the runs and collaboration routes find
//! and end them: read (even when the record cannot be read, from what
//! its item says) and cancelled.

use armada_api::runs::RunCancelled;
use armada_api::ApiError;
use armada_core::error::StoreError;
use armada_core::services::ending::{self, EndOutcome, Ended};
use armada_core::services::unreadable::{self, Ending};
use armada_core::Services;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::{EndNote, Run, RunEvent, RunHead, RunState};

/// A Run of the caller's tenant (another tenant's is `404`, as one that
/// does not exist).
pub(crate) async fn load_run(svc: &Services, tenant: &str, run_id: &str) -> Result<Run, ApiError> {
    match svc.runs.get(run_id).await? {
        // Another tenant's Run does not exist for this caller.
        Some(run) if run.tenant == tenant => Ok(run),
        _ => Err(ApiError::not_found(&format!("run '{run_id}'"))),
    }
}

/// A Run as [`load_run`] reads it, or, when its document cannot be read,
/// what its item says beside it.
pub(crate) enum Loaded {
    Run(Box<Run>),
    Unreadable(RunHead),
}

pub(crate) async fn load_any(
    svc: &Services,
    tenant: &str,
    run_id: &str,
) -> Result<Loaded, ApiError> {
    let not_found = || ApiError::not_found(&format!("run '{run_id}'"));
    match svc.runs.get(run_id).await {
        // Another tenant's Run does not exist for this caller.
        Ok(Some(run)) if run.tenant == tenant => Ok(Loaded::Run(Box::new(run))),
        Ok(_) => Err(not_found()),
        Err(StoreError::Corrupt(_)) => match unreadable::head_of(svc, run_id, tenant).await? {
            Some(head) => Ok(Loaded::Unreadable(head)),
            None => Err(not_found()),
        },
        Err(e) => Err(e.into()),
    }
}

/// Carries out what the Run's machine decided on its end (the dispatcher
/// is told, and settles it). Not told, the cancel is recorded all the
/// same, and the caller is asked to retry: its retry finds the Run ended
/// and tells the dispatcher then (nothing else would: a Run cancelled
/// while a step ran, or before its start, has no watchdog).
async fn carry_out(svc: &Services, ended: &Ended) -> Result<(), ApiError> {
    ending::carry_out(svc, &ended.run, &ended.actions)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, run_id = %ended.run.run_id, "cancel recorded but not announced");
            ApiError::unavailable("the cancel is recorded but was not announced; retry")
        })
}

/// A Run found ended but not yet settled (its announcement may have been
/// lost with an earlier try of this cancel): the dispatcher is told
/// again (settling twice closes nothing twice).
async fn announce_again(svc: &Services, run_id: &str, tenant: &str) -> Result<(), ApiError> {
    let terminal = DispatchMessage::RunTerminal {
        run_id: run_id.to_string(),
        tenant: tenant.to_string(),
    };
    svc.queues.send_dispatch(&terminal).await.map_err(|e| {
        tracing::error!(error = %e, run_id, "an ended run not announced again");
        ApiError::unavailable("the run ended but was not announced; retry")
    })
}

/// Cancels a Run (fenced: a worker still in a step cannot commit after it)
/// and announces its end; `by` says who asked, in its `run_cancelled` event.
pub(crate) async fn cancel_run_by(
    svc: &Services,
    tenant: &str,
    run_id: &str,
    by: &str,
) -> Result<RunCancelled, ApiError> {
    let note = EndNote {
        by: Some(by.to_string()),
        ..EndNote::default()
    };
    let ended = ending::end(
        svc,
        run_id,
        tenant,
        RunEvent::CancelRequested,
        note,
        Ending::Cancel { by },
    )
    .await?;
    let terminal =
        |state: RunState| ApiError::conflict("RUN_TERMINAL", format!("the run is already {state}"));
    let ended = match ended {
        Some(EndOutcome::Ended(ended)) => *ended,
        Some(EndOutcome::Missing) => return Err(ApiError::not_found(&format!("run '{run_id}'"))),
        Some(EndOutcome::AlreadyEnded(state)) => {
            if !state.is_closed() {
                announce_again(svc, run_id, tenant).await?;
            }
            return Err(terminal(state));
        }
        Some(EndOutcome::Refused(e)) => {
            return Err(ApiError::conflict("RUN_TERMINAL", e.to_string()))
        }
        None => return Err(ApiError::unavailable("the run is changing quickly; retry")),
    };
    carry_out(svc, &ended).await?;
    Ok(RunCancelled {
        run_id: run_id.to_string(),
        state: ended.run.state(),
    })
}
