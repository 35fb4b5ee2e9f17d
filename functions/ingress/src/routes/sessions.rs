//! `/v1/sessions`: create, post a message (queued or refused while a Run
//! is active), read the turns.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::json;

use armada_api::runs::RunAccepted;
use armada_api::server::{JsonBody, Path};
use armada_api::sessions::{CreateSessionBody, MessageBody, SessionCreated, SessionView};
use armada_api::{ApiError, ErrorBody};
use armada_core::clock::new_id;
use armada_core::services::auth::Principal;
use armada_core::Services;
use armada_domain::api::{parse_message, CreateSession};
use armada_domain::session::SessionHeader;

use super::accept::agent_named;
use super::accept::{idempotency, start_run, NewRun};
use super::{tenant, tenant_key};
use armada_api::error::KeyRefusals;

pub(crate) async fn session_for(
    svc: &Services,
    tenant: &str,
    session_id: &str,
) -> Result<SessionHeader, ApiError> {
    match svc.sessions.header(session_id).await? {
        Some(h) if h.tenant == tenant => Ok(h),
        _ => Err(ApiError::not_found(&format!("session '{session_id}'"))),
    }
}

/// Opens a session with an agent: each message is a Run that sees the
/// turns before it.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", request_body = CreateSessionBody,
    responses(
        (status = 201, description = "Opened.", body = SessionCreated,
            links(
                ("GetSession" = (operation_id = "get_session", parameters(("session_id" = "$response.body#/session_id")))),
                ("PostMessage" = (operation_id = "session_message", parameters(("session_id" = "$response.body#/session_id")))),
            )),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: the agent.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn create_session(
    State(svc): State<Arc<Services>>,
    who: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<SessionCreated>), ApiError> {
    let tenant = tenant(&who)?;
    let cs = CreateSession::parse(&body)?;
    let agent = agent_named(&svc, &cs.agent).await?;
    let header = SessionHeader {
        session_id: new_id("ses"),
        tenant: tenant.to_string(),
        agent: agent.name.clone(),
        on_busy: cs.on_busy,
        next_seq: 0,
        done_seq: 0,
        created_at_ms: svc.clock.now_ms(),
    };
    svc.sessions.create(&header).await?;
    Ok((
        StatusCode::CREATED,
        Json(SessionCreated {
            session_id: header.session_id,
            agent: header.agent,
            on_busy: header.on_busy,
        }),
    ))
}

/// Posts the session's next message: a Run of its agent.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/messages", tag = "sessions",
    request_body = MessageBody,
    params(
        ("session_id" = String, Path, description = "The session's id."),
        ("Idempotency-Key" = Option<String>, Header, description = "1-255 characters: a repeat with the same body answers the same Run."),
    ),
    responses(
        (status = 202, description = "Recorded and queued.", body = RunAccepted,
            links(("GetRun" = (operation_id = "get_run", parameters(("run_id" = "$response.body#/run_id")))))),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`, `INVALID_HEADER`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: the session or its agent.", body = ErrorBody),
        (status = 409, description = "`SESSION_BUSY`, `IDEMPOTENCY_KEY_REUSED`.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        (status = 429, description = "`RATE_LIMITED`, `TOO_MANY_ACTIVE_RUNS` (with `Retry-After`).", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn session_message(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<RunAccepted>), ApiError> {
    let key = tenant_key(&who)?;
    let tenant = key.tenant.as_str();
    let input = parse_message(&body)?;
    let idem = idempotency(
        &headers,
        &format!("POST /v1/sessions/{session_id}/messages"),
        &body,
    )?;
    let header = session_for(&svc, tenant, &session_id).await?;
    let agent = agent_named(&svc, &header.agent).await?;
    let accepted = start_run(
        &svc,
        NewRun {
            tenant,
            started_by: &key.key_id,
            started_by_address: key.owner.as_deref(),
            agent: &agent,
            input,
            session: Some(header),
            callback_url: None,
            metadata: json!({}),
            idempotency: idem,
            team: None,
            chain: None,
            started_from: None,
        },
    )
    .await?;
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}

/// A session: its agent, how many messages were posted and answered, and
/// its turns.
#[utoipa::path(get, path = "/v1/sessions/{session_id}", tag = "sessions",
    params(("session_id" = String, Path, description = "The session's id.")),
    responses(
        (status = 200, description = "The session.", body = SessionView),
        (status = 404, description = "`NOT_FOUND`: no such session in the caller's tenant.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn get_session(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(session_id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    let h = session_for(&svc, tenant(&who)?, &session_id).await?;
    let turns = svc.sessions.history(&session_id).await?;
    Ok(Json(SessionView {
        session_id: h.session_id,
        agent: h.agent,
        on_busy: h.on_busy,
        messages: h.next_seq,
        answered: h.done_seq,
        turns,
    }))
}
