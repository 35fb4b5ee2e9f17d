//! A tenant's existing Runs, as the runs and collaboration routes find
//! and end them: read (even when the record cannot be read, from what
//! its item says) and cancelled.

use armada_api::runs::RunCancelled;
use armada_api::ApiError;
use armada_core::error::StoreError;
use armada_core::services::ending::{self, EndOutcome, Ended};
use armada_core::services::unreadable::{self, Ending};
use armada_core::Services;
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
/// is told, and settles it). The cancel is recorded either way: a lost
/// message is sent again when the dispatcher next sees the Run.
async fn carry_out(svc: &Services, ended: &Ended) {
    if let Err(e) = ending::carry_out(svc, &ended.run, &ended.actions).await {
        tracing::error!(error = %e, run_id = %ended.run.run_id, "cancel recorded but not announced");
    }
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
        Some(EndOutcome::AlreadyEnded(state)) => return Err(terminal(state)),
        Some(EndOutcome::Refused(e)) => {
            return Err(ApiError::conflict("RUN_TERMINAL", e.to_string()))
        }
        None => return Err(ApiError::unavailable("the run is changing quickly; retry")),
    };
    carry_out(svc, &ended).await;
    Ok(RunCancelled {
        run_id: run_id.to_string(),
        state: ended.run.state(),
    })
}
