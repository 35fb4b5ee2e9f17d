//! `/v1/schedules` (a tenant's key): the tenant's schedules, created,
//! read, changed and deleted, each with its timer on EventBridge
//! Scheduler kept saying what it says, and the firings each made.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::SecondsFormat;

use armada_api::error::KeyRefusals;
use armada_api::hooks::ListQuery;
use armada_api::schedules::{
    CreateScheduleBody, FiringView, FiringsPage, PatchScheduleBody, ScheduleCreated, ScheduleView,
    SchedulesPage,
};
use armada_api::server::{JsonBody, Path, Query};
use armada_api::{ApiError, ErrorBody};
use armada_core::cas::{change, Changed};
use armada_core::clock::{new_id, rfc3339};
use armada_core::services::auth::Principal;
use armada_core::services::starting;
use armada_core::Services;
use armada_domain::api::RunTarget;
use armada_domain::messages::DispatchMessage;
use armada_domain::schedule::{
    Schedule, ScheduleAction, ScheduleEvent, SchedulePatch, ScheduleRefusal, ScheduleSpec,
};

use super::accept::{egress_checked, refused};
use super::{list_limit, member, tenant_key};

/// What EventBridge Scheduler fills in with each firing's time.
const SCHEDULED_TIME: &str = "<aws.scheduler.scheduled-time>";

pub(crate) fn schedule_view(svc: &Services, s: &Schedule) -> ScheduleView {
    let spec = &s.spec;
    let tz = spec.tz();
    let (agent, team, chain) = match &spec.target {
        RunTarget::Agent(a) => (Some(a.clone()), None, None),
        RunTarget::Team(t) => (None, Some(t.clone()), None),
        RunTarget::Chain(c) => (None, None, Some(c.clone())),
    };
    let next = if s.enabled() {
        spec.next_firings(svc.clock.now_ms(), s.created_at_ms, 5)
            .iter()
            .map(|t| {
                t.with_timezone(&tz)
                    .to_rfc3339_opts(SecondsFormat::Secs, false)
            })
            .collect()
    } else {
        vec![]
    };
    ScheduleView {
        schedule_id: s.schedule_id.clone(),
        expression: spec.expression.clone(),
        timezone: spec.timezone.clone(),
        agent,
        team,
        chain,
        input: spec.input.clone(),
        callback_url: spec.callback_url.clone(),
        start_at: spec.start_at_ms.map(rfc3339),
        end_at: spec.end_at_ms.map(rfc3339),
        overlap: spec.overlap,
        enabled: s.enabled(),
        next,
        created_at: rfc3339(s.created_at_ms),
        updated_at: rfc3339(s.updated_at_ms),
        version: s.version,
    }
}

/// What a schedule's runs would be of exists now, and its callback is
/// one the stack may call.
async fn check_spec(svc: &Services, spec: &ScheduleSpec) -> Result<(), ApiError> {
    starting::target_exists(svc, &spec.target)
        .await
        .map_err(refused)?;
    if let Some(url) = &spec.callback_url {
        egress_checked(svc, "callback_url", url)?;
    }
    Ok(())
}

/// Makes the schedule's timer say what it says now.
async fn sync_timer(svc: &Services, s: &Schedule) -> Result<(), ApiError> {
    let msg = DispatchMessage::fire_schedule(
        &svc.cfg.callback_signing_secret,
        &s.schedule_id,
        &s.tenant,
        SCHEDULED_TIME,
    );
    let text = serde_json::to_string(&msg).map_err(|_| ApiError::internal())?;
    svc.timers.put(s, &text).await.map_err(|e| {
        tracing::error!(schedule_id = %s.schedule_id, error = %e, "a schedule's timer was not set");
        ApiError::unavailable("the schedule's timer could not be set; send the change again")
    })
}

async fn own_schedule(svc: &Services, tenant: &str, id: &str) -> Result<Schedule, ApiError> {
    match svc.schedules.get(id).await? {
        Some(s) if s.tenant == tenant => Ok(s),
        _ => Err(ApiError::not_found(&format!("schedule '{id}'"))),
    }
}

/// Changes a schedule of the caller's tenant through its machine, and
/// carries out what it decided (its timer set or removed).
async fn change_schedule(
    svc: &Services,
    tenant: &str,
    id: &str,
    event: ScheduleEvent,
) -> Result<Schedule, ApiError> {
    let changed = change(
        svc.schedules.as_ref(),
        id,
        || svc.clock.now_ms(),
        |s: &Schedule| (s.tenant == tenant).then(|| event.clone()),
    )
    .await?;
    let not_found = || ApiError::not_found(&format!("schedule '{id}'"));
    let (schedule, actions) = match changed {
        Some(Changed::Written(s, actions)) => (s, actions),
        Some(Changed::Missing | Changed::Left(_)) => return Err(not_found()),
        Some(Changed::Refused(_, ScheduleRefusal::Deleted)) => return Err(not_found()),
        Some(Changed::Refused(_, ScheduleRefusal::Invalid(e))) => return Err(e.into()),
        None => {
            return Err(ApiError::unavailable(
                "the schedule is changing quickly; retry",
            ))
        }
    };
    for action in actions {
        match action {
            ScheduleAction::Sync => sync_timer(svc, &schedule).await?,
            ScheduleAction::Remove => svc.timers.remove(id).await?,
        }
    }
    Ok(schedule)
}

/// Creates a schedule: its Runs start at the times its expression names,
/// in its time zone.
#[utoipa::path(post, path = "/v1/schedules", tag = "schedules", request_body = CreateScheduleBody,
    responses(
        (status = 201, description = "Created, with its next five firings.", body = ScheduleCreated,
            links(
                ("GetSchedule" = (operation_id = "get_schedule", parameters(("schedule_id" = "$response.body#/schedule_id")))),
                ("ScheduleFirings" = (operation_id = "schedule_firings", parameters(("schedule_id" = "$response.body#/schedule_id")))),
                ("DeleteSchedule" = (operation_id = "delete_schedule", parameters(("schedule_id" = "$response.body#/schedule_id")))),
            )),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD` (an expression EventBridge Scheduler would not take names `expression` and what is wrong).", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: the agent or team.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn create_schedule(
    State(svc): State<Arc<Services>>,
    who: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<ScheduleCreated>), ApiError> {
    let key = member(&who)?;
    let (spec, enabled) = ScheduleSpec::parse(&body)?;
    check_spec(&svc, &spec).await?;
    let schedule = Schedule::new(
        &new_id("sch"),
        &key.tenant,
        &key.key_id,
        spec,
        enabled,
        svc.clock.now_ms(),
    );
    svc.schedules.create(&schedule).await?;
    sync_timer(&svc, &schedule).await?;
    tracing::info!(schedule_id = %schedule.schedule_id, tenant = %schedule.tenant, expression = %schedule.spec.expression, "schedule created");
    let view = schedule_view(&svc, &schedule);
    Ok((
        StatusCode::CREATED,
        Json(ScheduleCreated {
            schedule_id: schedule.schedule_id.clone(),
            next: view.next.clone(),
            schedule: view,
        }),
    ))
}

/// The tenant's schedules, newest first.
#[utoipa::path(get, path = "/v1/schedules", tag = "schedules", params(ListQuery),
    responses(
        (status = 200, description = "The schedules.", body = SchedulesPage),
        (status = 400, description = "`INVALID_QUERY`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn list_schedules(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Query(q): Query<ListQuery>,
) -> Result<Json<SchedulesPage>, ApiError> {
    let key = tenant_key(&who)?;
    let schedules = svc
        .schedules
        .of_tenant(&key.tenant, list_limit(&q)?)
        .await?;
    Ok(Json(SchedulesPage {
        schedules: schedules.iter().map(|s| schedule_view(&svc, s)).collect(),
    }))
}

/// A schedule, with its next firings.
#[utoipa::path(get, path = "/v1/schedules/{schedule_id}", tag = "schedules",
    params(("schedule_id" = String, Path, description = "The schedule's id.")),
    responses(
        (status = 200, description = "The schedule.", body = ScheduleView),
        (status = 404, description = "`NOT_FOUND`: no such schedule in the caller's tenant.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn get_schedule(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(schedule_id): Path<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    let key = tenant_key(&who)?;
    let s = own_schedule(&svc, &key.tenant, &schedule_id).await?;
    Ok(Json(schedule_view(&svc, &s)))
}

/// Changes a schedule (any field; `null` clears an optional one); its
/// timer follows.
#[utoipa::path(patch, path = "/v1/schedules/{schedule_id}", tag = "schedules", request_body = PatchScheduleBody,
    params(("schedule_id" = String, Path, description = "The schedule's id.")),
    responses(
        (status = 200, description = "The schedule as changed.", body = ScheduleView),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: the schedule, or the agent or team it would name.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn patch_schedule(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(schedule_id): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<ScheduleView>, ApiError> {
    let key = member(&who)?;
    let patch = SchedulePatch::parse(&body)?;
    let current = own_schedule(&svc, &key.tenant, &schedule_id).await?;
    let mut wanted = current.spec.clone();
    if let Some(t) = &patch.target {
        wanted.target = t.clone();
    }
    if let Some(u) = &patch.callback_url {
        wanted.callback_url = u.clone();
    }
    check_spec(&svc, &wanted).await?;
    let s = change_schedule(
        &svc,
        &key.tenant,
        &schedule_id,
        ScheduleEvent::Update(patch),
    )
    .await?;
    Ok(Json(schedule_view(&svc, &s)))
}

/// Deletes a schedule and its timer: it fires no more.
#[utoipa::path(delete, path = "/v1/schedules/{schedule_id}", tag = "schedules",
    params(("schedule_id" = String, Path, description = "The schedule's id.")),
    responses(
        (status = 204, description = "Deleted."),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn delete_schedule(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(schedule_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let key = member(&who)?;
    change_schedule(&svc, &key.tenant, &schedule_id, ScheduleEvent::Delete).await?;
    tracing::info!(schedule_id, tenant = %key.tenant, "schedule deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// A schedule's firings, newest first (kept 30 days): each one started a
/// Run, was skipped while the last one was active, or was missed because
/// it came too late.
#[utoipa::path(get, path = "/v1/schedules/{schedule_id}/firings", tag = "schedules",
    params(("schedule_id" = String, Path, description = "The schedule's id."), ListQuery),
    responses(
        (status = 200, description = "The firings.", body = FiringsPage),
        (status = 400, description = "`INVALID_QUERY`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn schedule_firings(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(schedule_id): Path<String>,
    Query(q): Query<ListQuery>,
) -> Result<Json<FiringsPage>, ApiError> {
    let key = tenant_key(&who)?;
    let limit = list_limit(&q)?;
    own_schedule(&svc, &key.tenant, &schedule_id).await?;
    let firings = svc.schedules.firings(&schedule_id, limit).await?;
    Ok(Json(FiringsPage {
        firings: firings
            .iter()
            .map(|f| FiringView {
                scheduled_at: rfc3339(f.scheduled_at_ms),
                fired_at: rfc3339(f.fired_at_ms),
                outcome: f.outcome,
                run_id: f.run_id.clone(),
            })
            .collect(),
    }))
}
