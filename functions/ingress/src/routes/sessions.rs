//! `/v1/sessions`: create, post a message (queued or refused while a Run
//! is active), read the turns.

use crate::*;

pub(crate) async fn session_for(
    svc: &Services,
    tenant: &str,
    session_id: &str,
) -> Result<SessionHeader, ApiError> {
    match svc.sessions.header(session_id).await.map_err(store_err)? {
        Some(h) if h.tenant == tenant => Ok(h),
        _ => Err(ApiError::not_found(&format!("session '{session_id}'"))),
    }
}

pub(crate) async fn create_session(svc: &Services, req: &Request, tenant: &str) -> ApiResult {
    let body = body_json(req)?;
    let cs = CreateSession::parse(&body)?;
    let agent = agent_named(svc, &cs.agent).await?;
    let header = SessionHeader {
        session_id: new_id("ses"),
        tenant: tenant.to_string(),
        agent: agent.name.clone(),
        on_busy: cs.on_busy,
        next_seq: 0,
        done_seq: 0,
        created_at_ms: svc.clock.now_ms(),
    };
    svc.sessions.create(&header).await.map_err(store_err)?;
    Ok((
        201,
        json!({"session_id": header.session_id, "agent": header.agent, "on_busy": header.on_busy}),
    ))
}

pub(crate) async fn session_message(
    svc: &Services,
    req: &Request,
    key: &TenantKey,
    session_id: &str,
) -> ApiResult {
    let tenant = key.tenant.as_str();
    let body = body_json(req)?;
    let input = parse_message(&body)?;
    let idem = idempotency(
        req,
        &format!("POST /v1/sessions/{session_id}/messages"),
        &body,
    )?;
    let header = session_for(svc, tenant, session_id).await?;
    let agent = agent_named(svc, &header.agent).await?;
    start_run(
        svc,
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
        },
    )
    .await
}

pub(crate) async fn get_session(svc: &Services, tenant: &str, session_id: &str) -> ApiResult {
    let h = session_for(svc, tenant, session_id).await?;
    let turns = svc.sessions.history(session_id).await.map_err(store_err)?;
    Ok((
        200,
        json!({
            "session_id": h.session_id,
            "agent": h.agent,
            "on_busy": h.on_busy,
            "messages": h.next_seq,
            "answered": h.done_seq,
            "turns": turns,
        }),
    ))
}
