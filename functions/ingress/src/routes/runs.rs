//! `/v1/runs`: start (validated, deduplicated by Idempotency-Key, written
//! and enqueued), read, events (long-poll), cancel.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::Value;

use armada_api::runs::{
    CreateRunBody, EventView, EventsPage, EventsQuery, RunAccepted, RunCancelled, RunView,
};
use armada_api::server::{JsonBody, Path, Query};
use armada_api::{ApiError, ErrorBody};
use armada_core::cas::{until_written, Try};
use armada_core::clock::{new_id, rfc3339};
use armada_core::error::StoreError;
use armada_core::ports::{Also, IdemRecord};
use armada_core::services::auth::{Principal, TenantKey};
use armada_core::services::ending::{self, Ended};
use armada_core::services::unreadable::{self, Ending};
use armada_core::Services;
use armada_domain::agent::AgentDefinition;
use armada_domain::api::{minute_window, CreateRun, RunTarget};
use armada_domain::collab::chain::{step_run_id, ChainLink};
use armada_domain::collab::{Lineage, RunKind};
use armada_domain::crypto::sha256_hex;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::{
    NewRun as NewRunRecord, Payload, Run, RunEvent, RunEventRecord, RunHead, RunState,
    CORRUPT_RECORD,
};
use armada_domain::session::SessionHeader;
use armada_domain::team::TeamDefinition;

use super::agents::agent_named;
use super::collab::{create_chain, create_team_run};
use super::sessions::session_for;
use super::{tenant, tenant_key};
use armada_api::error::KeyRefusals;
use armada_domain::run::{Created, EndNote, LogEvent};

/// The longest `wait` a caller may ask of the events endpoint.
const MAX_EVENTS_WAIT_S: u64 = 20;

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
    Unreadable { head: RunHead, why: String },
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
        Err(StoreError::Corrupt(why)) => match unreadable::head_of(svc, run_id, tenant).await? {
            Some(head) => Ok(Loaded::Unreadable { head, why }),
            None => Err(not_found()),
        },
        Err(e) => Err(e.into()),
    }
}

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
    }
}

pub(crate) async fn enqueue_start(svc: &Services, run: &Run) -> Result<(), ApiError> {
    let msg = DispatchMessage::StartRun {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
    };
    let mut last = None;
    for attempt in 0..3u32 {
        match svc.queues.send_dispatch(&msg).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                tracing::warn!(attempt, error = %e, "enqueue failed");
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
        }
    }
    tracing::error!(run_id = %run.run_id, error = ?last, "run written but not enqueued");
    Err(ApiError::unavailable(
        "the run was recorded but could not be queued; retry with the same Idempotency-Key",
    ))
}

/// What a new Run is attached to.
pub(crate) struct NewRun<'a> {
    pub(crate) tenant: &'a str,
    /// The key id that asked: it may not approve the Run's own gated calls.
    pub(crate) started_by: &'a str,
    /// The starter's address (its key's owner), when known.
    pub(crate) started_by_address: Option<&'a str>,
    pub(crate) agent: &'a AgentDefinition,
    pub(crate) input: String,
    pub(crate) session: Option<SessionHeader>,
    pub(crate) callback_url: Option<String>,
    pub(crate) metadata: Value,
    pub(crate) idempotency: Option<(String, String)>,
    /// The team this is the team's Run of (fan-out aggregator, lead).
    pub(crate) team: Option<TeamDefinition>,
    /// The first step of a relay chain (its Run id is the chain's).
    pub(crate) chain: Option<ChainLink>,
}

impl<'a> NewRun<'a> {
    /// A Run of `agent` as a create request asks for it: no session, team
    /// or chain unless the caller adds one.
    pub(crate) fn of(
        key: &'a TenantKey,
        agent: &'a AgentDefinition,
        cr: CreateRun,
        idempotency: Option<(String, String)>,
    ) -> Self {
        NewRun {
            tenant: &key.tenant,
            started_by: &key.key_id,
            started_by_address: key.owner.as_deref(),
            agent,
            input: cr.input,
            session: None,
            callback_url: cr.callback_url,
            metadata: cr.metadata,
            idempotency,
            team: None,
            chain: None,
        }
    }
}

pub(crate) async fn start_run(svc: &Services, new: NewRun<'_>) -> Result<RunAccepted, ApiError> {
    let now = svc.clock.now_ms();
    // The tenant's Runs not yet ended first, then its rate: a refused
    // start writes nothing. The count is a read and the marker is written
    // with the Run, so starts racing each other can all read the same
    // count: together they pass the limit by at most the number racing,
    // and never drift (each marker goes when its Run is settled).
    let active = svc.cfg.tenant_active_runs;
    if svc.quotas.active_runs(new.tenant, active, now).await? >= active {
        return Err(ApiError::too_many_active_runs(active));
    }
    let limit = svc.cfg.tenant_runs_per_minute;
    let (window, retry_after) = minute_window(now);
    if !svc
        .idempotency
        .count_run_start(new.tenant, window, limit)
        .await?
    {
        return Err(ApiError::rate_limited(limit, retry_after));
    }
    let run_id = match &new.chain {
        Some(link) => step_run_id(&link.chain_id, 0),
        None => new_id("run"),
    };
    armada_core::adapters::calls::name_run(&run_id);
    let input = if new.input.len() > svc.cfg.inline_limit_bytes {
        let key = format!("inputs/{}/{run_id}", new.tenant);
        svc.payloads.put_text(&key, &new.input).await?;
        Payload::Stored {
            key,
            bytes: new.input.len(),
        }
    } else {
        Payload::Inline { text: new.input }
    };
    // A resident agent's sandbox is warmed as its Run starts.
    let prewarm_sandbox = new.agent.sandbox.resident
        && new
            .agent
            .skills
            .iter()
            .any(|s| armada_domain::skills::builtin(s).is_some_and(|m| m.in_sandbox()));
    let mut session = new.session;
    for _attempt in 0..5 {
        let mut run = Run::new(
            NewRunRecord {
                run_id: run_id.clone(),
                tenant: new.tenant.to_string(),
                agent: new.agent.name.clone(),
                input: input.clone(),
                session: session
                    .as_ref()
                    .map(|h| (h.session_id.clone(), h.next_seq + 1)),
                parent_run_id: None,
                callback_url: new.callback_url.clone(),
                metadata: new.metadata.clone(),
                limits: new.agent.limits,
                prewarm_sandbox,
            },
            now,
        );
        run.team = new.team.clone();
        run.started_by = Some(new.started_by.to_string());
        run.started_by_address = new.started_by_address.map(str::to_string);
        if let Some(link) = &new.chain {
            run.chain = Some(link.clone());
            run.lineage = Some(Lineage {
                kind: RunKind::ChainStep,
                ..Lineage::root(&run.run_id, &run.agent)
            });
        }
        let created = LogEvent::RunCreated(Created {
            agent: run.agent.clone(),
            team: run.team.as_ref().map(|t| t.name.clone()),
            session_id: run.session_id.clone(),
            session_seq: run.session_seq,
            ..Created::default()
        });
        let created = run.push_event(created, now);
        // In a conflict, `which` is 1 + the index of the `Also` that failed.
        let mut also = Vec::new();
        let idem_index = new.idempotency.as_ref().map(|(key, fp)| {
            also.push(Also::IdempotencyKey {
                tenant: new.tenant.to_string(),
                key: key.clone(),
                record: IdemRecord {
                    fingerprint: fp.clone(),
                    run_id: run_id.clone(),
                },
                now_ms: now,
            });
            also.len()
        });
        let session_index = session.as_ref().map(|h| {
            also.push(Also::SessionMessage {
                header: h.clone(),
                run_id: run_id.clone(),
            });
            also.len()
        });
        also.push(Also::active_run(&run));
        match svc.runs.create(&run, &[created], also).await {
            Ok(()) => {
                enqueue_start(svc, &run).await?;
                let session = run.session_id.clone().zip(run.session_seq);
                return Ok(RunAccepted {
                    run_id: run.run_id.clone(),
                    state: run.state(),
                    chain_id: run.chain.as_ref().map(|l| l.chain_id.clone()),
                    seq: session.as_ref().map(|(_, seq)| *seq),
                    session_id: session.map(|(s, _)| s),
                    replayed: None,
                });
            }
            Err(StoreError::Conflict { which }) if which.is_some() && which == idem_index => {
                let (key, fp) = new.idempotency.as_ref().expect("idem_index implies a key");
                return replay(svc, new.tenant, key, fp).await;
            }
            Err(StoreError::Conflict { which }) if which.is_some() && which == session_index => {
                let h = session.as_ref().expect("session_index implies a session");
                let fresh = svc
                    .sessions
                    .header(&h.session_id)
                    .await?
                    .ok_or_else(|| ApiError::not_found("session"))?;
                if fresh.on_busy == armada_domain::session::OnBusy::Reject && fresh.busy() {
                    return Err(ApiError::conflict(
                        "SESSION_BUSY",
                        "the session's previous message is still being answered",
                    ));
                }
                session = Some(fresh);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::unavailable("the session is contended; retry"))
}

/// A repeated `Idempotency-Key`: the same body gets the same Run (re-queued
/// if it never left PENDING); a different body is refused.
pub(crate) async fn replay(
    svc: &Services,
    tenant: &str,
    key: &str,
    fp: &str,
) -> Result<RunAccepted, ApiError> {
    let rec = svc
        .idempotency
        .get(tenant, key)
        .await?
        .ok_or_else(|| ApiError::unavailable("idempotency record is settling; retry"))?;
    if rec.fingerprint != fp {
        return Err(ApiError::conflict(
            "IDEMPOTENCY_KEY_REUSED",
            "this Idempotency-Key was used with a different request body",
        ));
    }
    let run = load_run(svc, tenant, &rec.run_id).await?;
    if run.state() == RunState::Pending {
        enqueue_start(svc, &run).await?;
    }
    Ok(RunAccepted {
        run_id: run.run_id.clone(),
        state: run.state(),
        chain_id: run.chain.as_ref().map(|l| l.chain_id.clone()),
        session_id: run.session_id.clone(),
        seq: None,
        replayed: Some(true),
    })
}

pub(crate) fn idempotency(
    headers: &HeaderMap,
    route: &str,
    body: &Value,
) -> Result<Option<(String, String)>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = v
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| {
            ApiError::new(
                400,
                "INVALID_HEADER",
                "Idempotency-Key must be 1-255 visible characters",
            )
        })?;
    // serde_json's maps are ordered, so this is a canonical fingerprint.
    let fp = sha256_hex(format!("{route}\n{body}").as_bytes());
    Ok(Some((key.to_string(), fp)))
}

/// A URL the stack will call on the tenant's behalf, refused now if the
/// egress guard would refuse it anyway (a name is judged again when sent).
pub(crate) fn egress_checked(svc: &Services, field: &str, url: &str) -> Result<(), ApiError> {
    svc.tools.egress().check(url).map_err(|e| {
        ApiError::new(
            400,
            "INVALID_FIELD",
            format!(
                "{field}: {} (the stack does not call this target)",
                e.code()
            ),
        )
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
    let name = match cr.target.clone() {
        RunTarget::Agent(name) => name,
        RunTarget::Team(name) => return create_team_run(svc, key, cr, &name, idem).await,
        RunTarget::Chain(steps) => return create_chain(svc, key, cr, steps, None, idem).await,
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
        Loaded::Unreadable { head, .. } => Ok(Json(unreadable_view(&head))),
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

/// Carries out what the Run's machine decided on its end (the dispatcher
/// is told, and settles it). The cancel is recorded either way: a lost
/// message is sent again when the dispatcher next sees the Run.
async fn carry_out(svc: &Services, ended: &Ended) {
    if let Err(e) = ending::carry_out(svc, &ended.run, &ended.actions).await {
        tracing::error!(error = %e, run_id = %ended.run.run_id, "cancel recorded but not announced");
    }
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
    let ended = until_written(|| async {
        let run = match load_any(svc, tenant, run_id).await? {
            Loaded::Run(run) => *run,
            Loaded::Unreadable { head, why } => {
                if head.state.is_terminal() {
                    return Err(ApiError::conflict(
                        "RUN_TERMINAL",
                        format!("the run is already {}", head.state),
                    ));
                }
                match unreadable::end(svc, run_id, tenant, &why, Ending::Cancel { by }).await {
                    Ok(Some(ended)) => {
                        return Ok(Try::Done(ended));
                    }
                    Ok(None) => return Err(ApiError::not_found(&format!("run '{run_id}'"))),
                    Err(StoreError::Conflict { .. }) => return Ok(Try::Again),
                    Err(e) => return Err(e.into()),
                }
            }
        };
        if run.state().is_terminal() {
            return Err(ApiError::conflict(
                "RUN_TERMINAL",
                format!("the run is already {}", run.state()),
            ));
        }
        match ending::end_from_outside(svc, run, RunEvent::CancelRequested, note.clone()).await {
            Ok(Ok(ended)) => Ok(Try::Done(ended)),
            Ok(Err(e)) => Err(ApiError::conflict("RUN_TERMINAL", e.to_string())),
            Err(StoreError::Conflict { .. }) => Ok(Try::Again),
            Err(e) => Err(e.into()),
        }
    })
    .await?
    .ok_or_else(|| ApiError::unavailable("the run is changing quickly; retry"))?;
    carry_out(svc, &ended).await;
    Ok(RunCancelled {
        run_id: run_id.to_string(),
        state: ended.run.state(),
    })
}
