//! `/v1/runs`: start (validated, deduplicated by Idempotency-Key, written
//! and enqueued), read, events (long-poll), cancel.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::Value;

use armada_api::runs::{
    CallbackView, CreateRunBody, EventView, EventsPage, EventsQuery, RunAccepted, RunCancelled,
    RunView,
};
use armada_api::server::{JsonBody, Path, Query};
use armada_api::{ApiError, ErrorBody};
use armada_core::clock::{new_id, rfc3339};
use armada_core::services::auth::{Principal, TenantKey};
use armada_core::Services;
use armada_domain::api::{CreateRun, RunTarget};
use armada_domain::run::callback::CallbackRecord;
use armada_domain::run::{Payload, Run, RunEventRecord, RunHead, CORRUPT_RECORD};

use super::accept::{agent_named, egress_checked, idempotency, start_run, start_target, NewRun};
use super::owned::{cancel_run_by, load_any, Loaded};
use super::sessions::session_for;
use super::{tenant, tenant_key};
use armada_api::error::KeyRefusals;

/// The longest `wait` a caller may ask of the events endpoint.
const MAX_EVENTS_WAIT_S: u64 = 20;

/// The view of a Run whose document cannot be read: its head, and why.
fn unreadable_view(head: &RunHead) -> RunView {
    RunView {
        run_id: head.run_id.clone(),
        agent: head.agent.clone(),
        state: head.state,
        input: None,
        created_at: rfc3339(head.created_at_ms),
        updated_at: rfc3339(head.updated_at_ms),
        usage: None,
        step: head.step,
        epoch: head.epoch,
        metadata: None,
        output: None,
        error: Some(armada_domain::run::RunError::new(
            CORRUPT_RECORD,
            "the run's record could not be read",
        )),
        session_id: None,
        parent_run_id: None,
        root_run_id: None,
        kind: None,
        depth: None,
        path: None,
        outstanding_children: None,
        team: None,
        chain_id: None,
        chain_index: None,
        chain_remaining: None,
        trigger: None,
        callback: None,
    }
}

/// A stored text, or `None` (logged) when it cannot be read.
async fn payload_text(svc: &Services, p: &Payload) -> Option<String> {
    match svc.payloads.read(p).await {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "stored payload unreadable");
            None
        }
    }
}

/// A Run's public view.
pub async fn run_view(svc: &Services, run: &Run) -> RunView {
    let lineage = run.lineage();
    let output = match &run.output {
        Some(o) => payload_text(svc, o).await,
        None => None,
    };
    RunView {
        run_id: run.run_id.clone(),
        agent: run.agent.clone(),
        state: run.state(),
        input: payload_text(svc, &run.input).await,
        created_at: rfc3339(run.created_at_ms),
        updated_at: rfc3339(run.updated_at_ms),
        usage: Some(run.usage),
        step: run.step,
        epoch: run.epoch,
        metadata: Some(run.metadata.clone()),
        output,
        error: run.error.clone(),
        session_id: run.session_id.clone(),
        parent_run_id: run.parent_run_id.clone(),
        root_run_id: Some(lineage.root_run_id),
        kind: Some(lineage.kind),
        depth: Some(lineage.depth),
        path: Some(lineage.path),
        outstanding_children: Some(run.outstanding_children() as u64),
        team: run.team.as_ref().map(|t| t.name.clone()),
        chain_id: run.chain.as_ref().map(|c| c.chain_id.clone()),
        chain_index: run.chain.as_ref().map(|c| c.index as u64),
        chain_remaining: run.chain.as_ref().map(|c| c.remaining().to_vec()),
        trigger: Some(run.trigger()),
        callback: callback_view(run),
    }
}

/// How a Run's callback stands: its record, or pending while it has a
/// URL and no attempt was made.
pub(crate) fn callback_view(run: &Run) -> Option<CallbackView> {
    let record = match &run.callback {
        Some(r) => r.clone(),
        None if run.callback_url.is_some() => CallbackRecord::new(&run.run_id, None),
        None => return None,
    };
    Some(CallbackView {
        state: record.state(),
        attempts: record.attempts,
        last_status: record.last_status,
        next_attempt_at: record.next_attempt_at_ms.map(rfc3339),
    })
}

/// Starts a Run of an agent, a team or a relay chain. With an
/// `Idempotency-Key`, the same body gets the same Run.
#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = CreateRunBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 characters: a repeat with the same body answers the same Run.")),
    responses(
        (status = 202, description = "Recorded and queued.", body = RunAccepted,
            links(
                ("GetRun" = (operation_id = "get_run", parameters(("run_id" = "$response.body#/run_id")))),
                ("RunEvents" = (operation_id = "run_events", parameters(("run_id" = "$response.body#/run_id")))),
                ("CancelRun" = (operation_id = "cancel_run", parameters(("run_id" = "$response.body#/run_id")))),
                ("RunTrace" = (operation_id = "run_trace", parameters(("run_id" = "$response.body#/run_id")))),
                ("RunChildren" = (operation_id = "run_children", parameters(("run_id" = "$response.body#/run_id")))),
                ("GetChain" = (operation_id = "get_chain", parameters(("chain_id" = "$response.body#/chain_id")))),
                ("CancelChain" = (operation_id = "cancel_chain", parameters(("chain_id" = "$response.body#/chain_id")))),
            )),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`, `INVALID_HEADER`, `TOO_MANY_DESCENDANTS`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: the agent, team or session.", body = ErrorBody),
        (status = 409, description = "`IDEMPOTENCY_KEY_REUSED`, `SESSION_BUSY`.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        (status = 429, description = "`RATE_LIMITED`, `TOO_MANY_ACTIVE_RUNS` (with `Retry-After`).", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn create_run(
    State(svc): State<Arc<Services>>,
    who: Principal,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<RunAccepted>), ApiError> {
    let key = tenant_key(&who)?;
    start_requested(&svc, key, &headers, &body)
        .await
        .map(|r| (StatusCode::ACCEPTED, Json(r)))
}

async fn start_requested(
    svc: &Services,
    key: &TenantKey,
    headers: &HeaderMap,
    body: &Value,
) -> Result<RunAccepted, ApiError> {
    let tenant = key.tenant.as_str();
    let cr = CreateRun::parse(body)?;
    if let Some(url) = &cr.callback_url {
        egress_checked(svc, "callback_url", url)?;
    }
    let idem = idempotency(headers, "POST /v1/runs", body)?;
    // A team's or a chain's Run takes no session: started as it asks.
    let RunTarget::Agent(name) = cr.target.clone() else {
        return start_target(svc, key, cr, idem).await;
    };
    let agent = agent_named(svc, &name).await?;
    let session = match &cr.session_id {
        None => None,
        Some(sid) => {
            let h = session_for(svc, tenant, sid).await?;
            if h.agent != agent.name {
                return Err(ApiError::new(
                    400,
                    "INVALID_FIELD",
                    format!("session_id: the session belongs to agent '{}'", h.agent),
                ));
            }
            Some(h)
        }
    };
    let new = NewRun {
        session,
        ..NewRun::of(key, &agent, cr, idem)
    };
    start_run(svc, new).await
}

/// A Run: its state, input, output or error, usage and place in its tree.
#[utoipa::path(get, path = "/v1/runs/{run_id}", tag = "runs",
    params(("run_id" = String, Path, description = "The Run's id.")),
    responses(
        (status = 200, description = "The Run.", body = RunView),
        (status = 404, description = "`NOT_FOUND`: no such Run in the caller's tenant.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn get_run(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(run_id): Path<String>,
) -> Result<Json<RunView>, ApiError> {
    match load_any(&svc, tenant(&who)?, &run_id).await? {
        Loaded::Run(run) => Ok(Json(run_view(&svc, &run).await)),
        Loaded::Unreadable(head) => Ok(Json(unreadable_view(&head))),
    }
}

/// A Run's events after `after`, oldest first; with `wait`, the answer
/// waits up to that many seconds for one.
#[utoipa::path(get, path = "/v1/runs/{run_id}/events", tag = "runs",
    params(("run_id" = String, Path, description = "The Run's id."), EventsQuery),
    responses(
        (status = 200, description = "A page of events (possibly empty).", body = EventsPage),
        (status = 400, description = "`INVALID_QUERY`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: no such Run in the caller's tenant.", body = ErrorBody),
        (status = 429, description = "`TOO_MANY_LONG_POLLS` (with `Retry-After`).", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn run_events(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(run_id): Path<String>,
    Query(q): Query<EventsQuery>,
) -> Result<Json<EventsPage>, ApiError> {
    let tenant = tenant(&who)?;
    let after = u64::try_from(q.after.unwrap_or(0)).map_err(|_| {
        ApiError::new(
            400,
            "INVALID_QUERY",
            "after: must be a sequence number (0 or more)",
        )
    })?;
    let wait_s = q.wait.unwrap_or(0);
    if wait_s > MAX_EVENTS_WAIT_S {
        return Err(ApiError::new(
            400,
            "INVALID_QUERY",
            format!("wait: at most {MAX_EVENTS_WAIT_S} seconds"),
        ));
    }
    let svc = svc.as_ref();
    let run_id = run_id.as_str();
    load_any(svc, tenant, run_id).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(wait_s);
    let events = svc.run_events.events(run_id, after, 100).await?;
    if !events.is_empty() || wait_s == 0 {
        return Ok(Json(events_page(events, after)));
    }
    // A poll that has to wait holds one of its tenant's slots while it
    // does, across every instance; it gives it back when it ends, and a
    // slot whose instance died frees itself once the poll's time is up.
    let holder = new_id("poll");
    let now = svc.clock.now_ms();
    let until = now + (wait_s * 1000 + POLL_SLOT_MARGIN_MS) as i64;
    let limit = svc.cfg.tenant_concurrent_long_polls;
    let Some(slot) = svc
        .quotas
        .take_poll_slot(tenant, limit, &holder, now, until)
        .await?
    else {
        return Err(ApiError::too_many_long_polls(limit));
    };
    let polled = poll_events(svc, run_id, after, deadline).await;
    if let Err(e) = svc.quotas.release_poll_slot(tenant, slot, &holder).await {
        tracing::warn!(error = %e, tenant, slot, "long-poll slot not given back; it frees itself when its time is up");
    }
    polled.map(Json)
}

/// How long past its wait a long-poll's slot stays taken, should its
/// instance die before giving it back.
const POLL_SLOT_MARGIN_MS: u64 = 10_000;

/// Reads the events after `after` until there are some or `deadline`.
async fn poll_events(
    svc: &Services,
    run_id: &str,
    after: u64,
    deadline: tokio::time::Instant,
) -> Result<EventsPage, ApiError> {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let events = svc.run_events.events(run_id, after, 100).await?;
        if !events.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(events_page(events, after));
        }
    }
}

/// A page of events as `GET /v1/runs/{id}/events` answers it.
fn events_page(events: Vec<RunEventRecord>, after: u64) -> EventsPage {
    let next = events.last().map(|e| e.seq).unwrap_or(after);
    let events = events
        .into_iter()
        .map(|e| EventView {
            seq: e.seq,
            at: rfc3339(e.at_ms),
            event: e.event,
        })
        .collect();
    EventsPage { events, next }
}

/// Cancels a Run that has not ended; a worker still in its step cannot
/// commit after it.
#[utoipa::path(post, path = "/v1/runs/{run_id}/cancel", tag = "runs",
    params(("run_id" = String, Path, description = "The Run's id.")),
    responses(
        (status = 200, description = "Cancelled.", body = RunCancelled),
        (status = 404, description = "`NOT_FOUND`: no such Run in the caller's tenant.", body = ErrorBody),
        (status = 409, description = "`RUN_TERMINAL`: the Run already ended.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn cancel_run(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(run_id): Path<String>,
) -> Result<Json<RunCancelled>, ApiError> {
    cancel_run_by(&svc, tenant(&who)?, &run_id, "api")
        .await
        .map(Json)
}
