//! `POST /v1/runs/{run_id}/callback/redeliver`: a failed callback tried
//! again, through its machine, from the delivery queue.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use armada_api::error::KeyRefusals;
use armada_api::runs::CallbackRequeued;
use armada_api::server::Path;
use armada_api::{ApiError, ErrorBody};
use armada_core::cas::{until_written, Try};
use armada_core::error::StoreError;
use armada_core::services::auth::Principal;
use armada_core::Services;
use armada_domain::machine::Machine;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::callback::{CallbackEvent, CallbackRecord};

use super::owned::load_run;
use super::runs::callback_view;
use super::tenant;

/// Queues a failed callback again: a new round of attempts, with the same
/// `webhook-id`.
#[utoipa::path(post, path = "/v1/runs/{run_id}/callback/redeliver", tag = "runs",
    params(("run_id" = String, Path, description = "The Run's id.")),
    responses(
        (status = 202, description = "Queued again.", body = CallbackRequeued),
        (status = 404, description = "`NOT_FOUND`: no such Run in the caller's tenant, or it has no callback.", body = ErrorBody),
        (status = 409, description = "`CALLBACK_NOT_FAILED`: it is pending, retrying or delivered.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn redeliver_callback(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(run_id): Path<String>,
) -> Result<(StatusCode, Json<CallbackRequeued>), ApiError> {
    let tenant = tenant(&who)?;
    let no_callback = || ApiError::not_found(&format!("the callback of run '{run_id}'"));
    let requeued = until_written(|| async {
        let run = load_run(&svc, tenant, &run_id).await?;
        let Some(mut record) = run.callback.clone() else {
            return Err(no_callback());
        };
        record
            .apply(CallbackEvent::Redeliver, svc.clock.now_ms())
            .map_err(|e| ApiError::conflict("CALLBACK_NOT_FAILED", e.to_string()))?;
        let prev = run.stamp();
        let mut next = run;
        next.callback = Some(record);
        match svc.runs.save(prev, &next, &[], vec![]).await {
            Ok(()) => Ok(Try::Done(next)),
            Err(StoreError::Conflict { .. }) => Ok(Try::Again),
            Err(e) => Err(e.into()),
        }
    })
    .await?
    .ok_or_else(|| ApiError::unavailable("the run is changing quickly; retry"))?;
    let record: &CallbackRecord = requeued.callback.as_ref().ok_or_else(no_callback)?;
    let secret = &svc.cfg.callback_signing_secret;
    let msg = match record.chain {
        Some(state) => {
            DispatchMessage::deliver_chain_callback(secret, &run_id, &requeued.tenant, state)
        }
        None => DispatchMessage::deliver_callback(secret, &run_id, &requeued.tenant),
    };
    svc.queues.send_routed(&msg).await?;
    tracing::info!(run_id, "callback queued again");
    let callback = callback_view(&requeued).ok_or_else(no_callback)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(CallbackRequeued { run_id, callback }),
    ))
}
