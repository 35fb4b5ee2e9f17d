//! T1 ingress: the HTTP API v1. It authenticates, validates, deduplicates,
//! writes the request and enqueues it for the dispatcher; it never runs an
//! agent. The same handler runs under `lambda_http` in AWS and behind the
//! local stack's HTTP server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_http::{Body, Request, Response};
use serde_json::{json, Value};

use armada_core::clock::{new_id, rfc3339};
use armada_core::error::StoreError;
use armada_core::sandboxing;
use armada_core::store::idempotency::IdemRecord;
use armada_core::store::registry::StoredKey;
use armada_core::Services;
use armada_domain::agent::AgentDefinition;
use armada_domain::api::{
    digest_eq, parse_message, sha256_hex, valid_tenant, ApiError, ApiKey, CreateRun, CreateSession,
};
use armada_domain::messages::DispatchMessage;
use armada_domain::run::{Budgets, Payload, Run, RunEvent, RunState, Usage};
use armada_domain::sandbox::{ProfileDef, Profiles};
use armada_domain::session::SessionHeader;

/// Bodies above this are refused with 413.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The longest `wait` a caller may ask of the events endpoint.
const MAX_EVENTS_WAIT_S: u64 = 20;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Principal {
    Admin,
    Tenant(String),
}

type ApiResult = Result<(u16, Value), ApiError>;

/// Handles one HTTP request and always answers: errors become JSON bodies
/// with a stable code; internals go to the log.
pub async fn handle(svc: Arc<Services>, req: Request) -> Response<Body> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let span = tracing::info_span!("http", %method, %path);
    let _enter = span.enter();
    let result = route(&svc, &req, &method, &path).await;
    let (status, body) = match result {
        Ok(ok) => ok,
        Err(e) => {
            if e.status >= 500 {
                tracing::error!(code = e.code, message = %e.message, "request failed");
            } else {
                tracing::info!(status = e.status, code = e.code, "request refused");
            }
            (e.status, e.body())
        }
    };
    json_response(status, &body)
}

pub fn json_response(status: u16, body: &Value) -> Response<Body> {
    let text = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::Text(text))
        .unwrap_or_else(|_| Response::new(Body::Empty))
}

fn store_err(e: StoreError) -> ApiError {
    match e {
        StoreError::Retryable(m) => {
            tracing::warn!(error = %m, "store unavailable");
            ApiError::unavailable("the service is briefly unavailable; retry")
        }
        other => {
            tracing::error!(error = %other, "store error");
            ApiError::internal()
        }
    }
}

async fn route(svc: &Arc<Services>, req: &Request, method: &str, path: &str) -> ApiResult {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    if segs.first() != Some(&"v1") {
        return Err(ApiError::not_found("route"));
    }
    if req.body().len() > MAX_BODY_BYTES {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    if let (["v1", "health"], "GET") = (segs.as_slice(), method) {
        return Ok((200, json!({"status": "ok"})));
    }
    let who = authenticate(svc, req).await?;
    match (segs.as_slice(), method) {
        (["v1", "runs"], "POST") => create_run(svc, req, tenant(&who)?).await,
        (["v1", "runs", id], "GET") => get_run(svc, tenant(&who)?, id).await,
        (["v1", "runs", id, "events"], "GET") => run_events(svc, req, tenant(&who)?, id).await,
        (["v1", "runs", id, "cancel"], "POST") => cancel_run(svc, tenant(&who)?, id).await,
        (["v1", "sessions"], "POST") => create_session(svc, req, tenant(&who)?).await,
        (["v1", "sessions", id], "GET") => get_session(svc, tenant(&who)?, id).await,
        (["v1", "sessions", id, "messages"], "POST") => {
            session_message(svc, req, tenant(&who)?, id).await
        }
        (["v1", "agents"], "GET") => list_agents(svc).await,
        (["v1", "agents", name], "GET") => get_agent(svc, name).await,
        (["v1", "agents", name], "PUT") => {
            admin(&who)?;
            put_agent(svc, req, name).await
        }
        (["v1", "agents", name], "DELETE") => {
            admin(&who)?;
            delete_agent(svc, name).await
        }
        (["v1", "profiles"], "GET") => list_profiles(svc).await,
        (["v1", "skills"], "GET") => list_skills(svc).await,
        (["v1", "skills", name], "GET") => get_skill(svc, name).await,
        (["v1", "skills", name], "PUT") => {
            admin(&who)?;
            put_skill(svc, req, name).await
        }
        (["v1", "profiles", name], "PUT") => {
            admin(&who)?;
            put_profile(svc, req, name).await
        }
        (["v1", "sandboxes"], "GET") => {
            let t = sandbox_tenant(&who, req)?;
            list_sandboxes(svc, &t).await
        }
        (["v1", "sandboxes", agent], "GET") => {
            let t = sandbox_tenant(&who, req)?;
            get_sandbox(svc, &t, agent).await
        }
        (["v1", "sandboxes", agent], "DELETE") => {
            admin(&who)?;
            let t = sandbox_tenant(&who, req)?;
            destroy_sandbox(svc, &t, agent).await
        }
        (["v1", "tenants", t, "keys"], "POST") => {
            admin(&who)?;
            mint_key(svc, t).await
        }
        (["v1", "keys", key_id], "DELETE") => {
            admin(&who)?;
            revoke_key(svc, key_id).await
        }
        _ => Err(ApiError::not_found("route")),
    }
}

fn tenant(who: &Principal) -> Result<&str, ApiError> {
    match who {
        Principal::Tenant(t) => Ok(t),
        Principal::Admin => Err(ApiError::forbidden(
            "the admin key manages agents and keys; use a tenant key for runs and sessions",
        )),
    }
}

fn admin(who: &Principal) -> Result<(), ApiError> {
    match who {
        Principal::Admin => Ok(()),
        Principal::Tenant(_) => Err(ApiError::forbidden("this operation needs the admin key")),
    }
}

async fn authenticate(svc: &Services, req: &Request) -> Result<Principal, ApiError> {
    let header = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(ApiError::unauthorized)?;
    let token = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
        .ok_or_else(ApiError::unauthorized)?
        .trim();
    if digest_eq(&sha256_hex(token.as_bytes()), &svc.cfg.admin_key_sha256) {
        return Ok(Principal::Admin);
    }
    let key = ApiKey::parse(token).ok_or_else(ApiError::unauthorized)?;
    let stored = svc
        .registry
        .key(&key.key_id)
        .await
        .map_err(store_err)?
        .ok_or_else(ApiError::unauthorized)?;
    if stored.revoked || !digest_eq(&stored.secret_sha256, &key.secret_hash()) {
        return Err(ApiError::unauthorized());
    }
    Ok(Principal::Tenant(stored.tenant))
}

fn body_json(req: &Request) -> Result<Value, ApiError> {
    let bytes: &[u8] = req.body().as_ref();
    if bytes.is_empty() {
        return Err(ApiError::invalid_json("the body is empty"));
    }
    serde_json::from_slice(bytes).map_err(ApiError::invalid_json)
}

fn query(req: &Request) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

async fn agent_named(svc: &Services, name: &str) -> Result<AgentDefinition, ApiError> {
    svc.registry
        .agent(name)
        .await
        .map_err(store_err)?
        .ok_or_else(|| ApiError::not_found(&format!("agent '{name}'")))
}

async fn payload_json(svc: &Services, p: &Payload) -> Value {
    match svc.payloads.read(p).await {
        Ok(t) => json!(t),
        Err(e) => {
            tracing::warn!(error = %e, "stored payload unreadable");
            Value::Null
        }
    }
}

/// A Run's public view.
pub async fn run_view(svc: &Services, run: &Run) -> Value {
    let input = payload_json(svc, &run.input).await;
    let mut v = json!({
        "run_id": run.run_id,
        "agent": run.agent,
        "state": run.state,
        "input": input,
        "created_at": rfc3339(run.created_at_ms),
        "updated_at": rfc3339(run.updated_at_ms),
        "usage": run.usage,
        "step": run.step,
        "epoch": run.epoch,
        "metadata": run.metadata,
    });
    if let Some(o) = &run.output {
        v["output"] = payload_json(svc, o).await;
    }
    if let Some(e) = &run.error {
        v["error"] = json!(e);
    }
    if let Some(s) = &run.session_id {
        v["session_id"] = json!(s);
    }
    if let Some(p) = &run.parent_run_id {
        v["parent_run_id"] = json!(p);
    }
    v
}

async fn load_run(svc: &Services, tenant: &str, run_id: &str) -> Result<Run, ApiError> {
    match svc.runs.get(run_id).await.map_err(store_err)? {
        // Another tenant's Run does not exist for this caller.
        Some(run) if run.tenant == tenant => Ok(run),
        _ => Err(ApiError::not_found(&format!("run '{run_id}'"))),
    }
}

async fn enqueue_start(svc: &Services, run: &Run) -> Result<(), ApiError> {
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
struct NewRun<'a> {
    tenant: &'a str,
    agent: &'a AgentDefinition,
    input: String,
    session: Option<SessionHeader>,
    callback_url: Option<String>,
    metadata: Value,
    idempotency: Option<(String, String)>,
}

async fn start_run(svc: &Services, new: NewRun<'_>) -> Result<(u16, Value), ApiError> {
    let now = svc.clock.now_ms();
    let run_id = new_id("run");
    let input = if new.input.len() > svc.cfg.inline_limit_bytes {
        let key = format!("inputs/{}/{run_id}", new.tenant);
        svc.payloads
            .put_text(&key, &new.input)
            .await
            .map_err(store_err)?;
        Payload::Stored {
            key,
            bytes: new.input.len(),
        }
    } else {
        Payload::Inline { text: new.input }
    };
    let limits = new.agent.limits;
    let mut session = new.session;
    for _attempt in 0..5 {
        let mut run = Run {
            run_id: run_id.clone(),
            tenant: new.tenant.to_string(),
            agent: new.agent.name.clone(),
            state: RunState::Pending,
            step: 0,
            epoch: 0,
            lease_until_ms: 0,
            event_seq: 0,
            input: input.clone(),
            output: None,
            error: None,
            session_id: session.as_ref().map(|h| h.session_id.clone()),
            session_seq: session.as_ref().map(|h| h.next_seq + 1),
            parent_run_id: None,
            callback_url: new.callback_url.clone(),
            metadata: new.metadata.clone(),
            created_at_ms: now,
            updated_at_ms: now,
            budgets: Budgets {
                max_model_turns: limits.max_model_turns,
                max_tool_calls: limits.max_tool_calls,
                deadline_ms: now + i64::from(limits.timeout_s) * 1000,
            },
            usage: Usage::default(),
            ledger: Default::default(),
            sandbox_key: None,
            prewarm_sandbox: new.agent.sandbox.resident
                && new
                    .agent
                    .skills
                    .iter()
                    .any(|s| armada_domain::skills::builtin(s).is_some_and(|m| m.in_sandbox())),
        };
        let created = run.push_event(
            "run_created",
            json!({"agent": run.agent, "session_id": run.session_id, "session_seq": run.session_seq}),
            now,
        );
        let mut extra = Vec::new();
        let idem_index = new.idempotency.as_ref().map(|(key, fp)| {
            extra.push(svc.idempotency.claim_item(
                new.tenant,
                key,
                &IdemRecord {
                    fingerprint: fp.clone(),
                    run_id: run_id.clone(),
                },
                now,
            ));
            extra.len()
        });
        let session_index = session.as_ref().map(|h| {
            let first = extra.len() + 1;
            extra.extend(svc.sessions.accept_message(h, &run_id));
            first
        });
        match svc.runs.create(&run, &[created], extra).await {
            Ok(()) => {
                enqueue_start(svc, &run).await?;
                let mut body = json!({"run_id": run.run_id, "state": run.state});
                if let (Some(s), Some(seq)) = (&run.session_id, run.session_seq) {
                    body["session_id"] = json!(s);
                    body["seq"] = json!(seq);
                }
                return Ok((202, body));
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
                    .await
                    .map_err(store_err)?
                    .ok_or_else(|| ApiError::not_found("session"))?;
                if fresh.on_busy == armada_domain::session::OnBusy::Reject && fresh.busy() {
                    return Err(ApiError::conflict(
                        "SESSION_BUSY",
                        "the session's previous message is still being answered",
                    ));
                }
                session = Some(fresh);
            }
            Err(e) => return Err(store_err(e)),
        }
    }
    Err(ApiError::unavailable("the session is contended; retry"))
}

/// A repeated `Idempotency-Key`: the same body gets the same Run (re-queued
/// if it never left PENDING); a different body is refused.
async fn replay(svc: &Services, tenant: &str, key: &str, fp: &str) -> ApiResult {
    let rec = svc
        .idempotency
        .get(tenant, key)
        .await
        .map_err(store_err)?
        .ok_or_else(|| ApiError::unavailable("idempotency record is settling; retry"))?;
    if rec.fingerprint != fp {
        return Err(ApiError::conflict(
            "IDEMPOTENCY_KEY_REUSED",
            "this Idempotency-Key was used with a different request body",
        ));
    }
    let run = load_run(svc, tenant, &rec.run_id).await?;
    if run.state == RunState::Pending {
        enqueue_start(svc, &run).await?;
    }
    let mut body = json!({"run_id": run.run_id, "state": run.state, "replayed": true});
    if let Some(s) = &run.session_id {
        body["session_id"] = json!(s);
    }
    Ok((202, body))
}

fn idempotency(
    req: &Request,
    route: &str,
    body: &Value,
) -> Result<Option<(String, String)>, ApiError> {
    let Some(v) = req.headers().get("idempotency-key") else {
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

async fn session_for(
    svc: &Services,
    tenant: &str,
    session_id: &str,
) -> Result<SessionHeader, ApiError> {
    match svc.sessions.header(session_id).await.map_err(store_err)? {
        Some(h) if h.tenant == tenant => Ok(h),
        _ => Err(ApiError::not_found(&format!("session '{session_id}'"))),
    }
}

async fn create_run(svc: &Services, req: &Request, tenant: &str) -> ApiResult {
    let body = body_json(req)?;
    let cr = CreateRun::parse(&body)?;
    let idem = idempotency(req, "POST /v1/runs", &body)?;
    let agent = agent_named(svc, &cr.agent).await?;
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
    start_run(
        svc,
        NewRun {
            tenant,
            agent: &agent,
            input: cr.input,
            session,
            callback_url: cr.callback_url,
            metadata: cr.metadata,
            idempotency: idem,
        },
    )
    .await
}

async fn get_run(svc: &Services, tenant: &str, run_id: &str) -> ApiResult {
    let run = load_run(svc, tenant, run_id).await?;
    Ok((200, run_view(svc, &run).await))
}

async fn run_events(svc: &Services, req: &Request, tenant: &str, run_id: &str) -> ApiResult {
    let q = query(req);
    let after: u64 = match q.get("after") {
        None => 0,
        Some(v) => v.parse().map_err(|_| {
            ApiError::new(400, "INVALID_QUERY", "after must be a non-negative integer")
        })?,
    };
    let wait_s: u64 = match q.get("wait") {
        None => 0,
        Some(v) => v
            .parse::<u64>()
            .map_err(|_| ApiError::new(400, "INVALID_QUERY", "wait must be a number of seconds"))?
            .min(MAX_EVENTS_WAIT_S),
    };
    load_run(svc, tenant, run_id).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(wait_s);
    loop {
        let events = svc
            .runs
            .events(run_id, after, 100)
            .await
            .map_err(store_err)?;
        if !events.is_empty() || tokio::time::Instant::now() >= deadline {
            let next = events.last().map(|e| e.seq).unwrap_or(after);
            let list: Vec<Value> = events
                .into_iter()
                .map(|e| {
                    let mut v = json!({"seq": e.seq, "type": e.kind, "at": rfc3339(e.at_ms)});
                    if let (Value::Object(dst), Value::Object(src)) = (&mut v, e.data) {
                        for (k, val) in src {
                            dst.entry(k).or_insert(val);
                        }
                    }
                    v
                })
                .collect();
            return Ok((200, json!({"events": list, "next": next})));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn cancel_run(svc: &Services, tenant: &str, run_id: &str) -> ApiResult {
    for _ in 0..5 {
        let run = load_run(svc, tenant, run_id).await?;
        if run.state.is_terminal() {
            return Err(ApiError::conflict(
                "RUN_TERMINAL",
                format!("the run is already {}", run.state),
            ));
        }
        let now = svc.clock.now_ms();
        let prev = run.stamp();
        let mut next = run.clone();
        next.apply(&RunEvent::CancelRequested, now)
            .map_err(|e| ApiError::conflict("RUN_TERMINAL", e.to_string()))?;
        // A new epoch fences out any worker still executing a step.
        next.epoch += 1;
        next.lease_until_ms = 0;
        let ev = next.push_event("run_cancelled", json!({"by": "api"}), now);
        match svc.runs.save(prev, &next, &[ev], vec![]).await {
            Ok(()) => {
                let msg = DispatchMessage::RunTerminal {
                    run_id: next.run_id.clone(),
                    tenant: next.tenant.clone(),
                };
                if let Err(e) = svc.queues.send_dispatch(&msg).await {
                    // The Run is cancelled; its post-terminal duties are
                    // retried when the dispatcher next sees this Run.
                    tracing::error!(error = %e, run_id, "cancel recorded but not announced");
                }
                return Ok((200, json!({"run_id": run_id, "state": next.state})));
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(store_err(e)),
        }
    }
    Err(ApiError::unavailable("the run is changing quickly; retry"))
}

async fn create_session(svc: &Services, req: &Request, tenant: &str) -> ApiResult {
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

async fn session_message(
    svc: &Services,
    req: &Request,
    tenant: &str,
    session_id: &str,
) -> ApiResult {
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
            agent: &agent,
            input,
            session: Some(header),
            callback_url: None,
            metadata: json!({}),
            idempotency: idem,
        },
    )
    .await
}

async fn get_session(svc: &Services, tenant: &str, session_id: &str) -> ApiResult {
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

fn agent_json(def: &AgentDefinition, version: u64) -> Value {
    let mut v = serde_json::to_value(def).unwrap_or(Value::Null);
    v["version"] = json!(version);
    v
}

async fn list_agents(svc: &Services) -> ApiResult {
    let agents = svc.registry.list_agents().await.map_err(store_err)?;
    let list: Vec<Value> = agents.iter().map(|(d, v)| agent_json(d, *v)).collect();
    Ok((200, json!({"agents": list})))
}

async fn get_agent(svc: &Services, name: &str) -> ApiResult {
    match svc.registry.agent_version(name).await.map_err(store_err)? {
        Some((def, v)) => Ok((200, agent_json(&def, v))),
        None => Err(ApiError::not_found(&format!("agent '{name}'"))),
    }
}

async fn put_agent(svc: &Services, req: &Request, name: &str) -> ApiResult {
    let body = body_json(req)?;
    let mut def = AgentDefinition::from_json(name, &body)?;
    svc.registry
        .resolve_manifests(&mut def)
        .await
        .map_err(store_err)??;
    // The profile must resolve now, global profiles first: a placement that
    // could never be met is refused here rather than at the first call.
    let global = svc.registry.profiles().await.map_err(store_err)?;
    let (_, shadowed) = def
        .sandbox
        .resolve(global)
        .map_err(|e| ApiError::new(400, "INVALID_FIELD", format!("sandbox.profile: {e}")))?;
    let version = svc.registry.put_agent(&def).await.map_err(store_err)?;
    let mut v = agent_json(&def, version);
    if !shadowed.is_empty() {
        // Reported, not silently dropped: the global definitions hold.
        v["shadowed_profiles"] = json!(shadowed);
    }
    Ok((200, v))
}

/// Deletes an agent and, with it, every sandbox it has in any tenant: no
/// task and no file of it is left (seed 000 §E).
async fn delete_agent(svc: &Services, name: &str) -> ApiResult {
    let sandboxes = svc.sandboxes.list_agent(name).await.map_err(store_err)?;
    let mut destroyed = Vec::new();
    for rec in sandboxes {
        sandboxing::destroy(svc, &rec.tenant, &rec.agent, "the agent was deleted")
            .await
            .map_err(store_err)?;
        if let Some(gone) = svc
            .sandboxes
            .get(&rec.tenant, &rec.agent)
            .await
            .map_err(store_err)?
        {
            let _ = svc.sandboxes.delete(&gone).await;
        }
        destroyed.push(rec.tenant);
    }
    if !svc.registry.delete_agent(name).await.map_err(store_err)? && destroyed.is_empty() {
        return Err(ApiError::not_found(&format!("agent '{name}'")));
    }
    Ok((
        200,
        json!({"agent": name, "deleted": true, "sandboxes_destroyed": destroyed}),
    ))
}

/// Every skill: the built-ins, then the registry's (which may reuse a
/// built-in's name to change its manifest, within the same rules).
async fn list_skills(svc: &Services) -> ApiResult {
    let custom = svc.registry.list_skills().await.map_err(store_err)?;
    let mut all: Vec<Value> = armada_domain::skills::BUILTIN
        .iter()
        .filter(|b| !custom.iter().any(|c| c.name == **b))
        .filter_map(|b| armada_domain::skills::builtin(b))
        .map(|m| json!(m))
        .collect();
    all.extend(custom.iter().map(|m| json!(m)));
    Ok((200, json!({"skills": all})))
}

async fn get_skill(svc: &Services, name: &str) -> ApiResult {
    match svc.registry.skill(name).await.map_err(store_err)? {
        Some(m) => Ok((200, json!(m))),
        None => armada_domain::skills::builtin(name)
            .map(|m| (200, json!(m)))
            .ok_or_else(|| ApiError::not_found(&format!("skill '{name}'"))),
    }
}

/// Defines a skill manifest. Agents registered afterwards freeze it; those
/// registered before keep the manifest they froze.
async fn put_skill(svc: &Services, req: &Request, name: &str) -> ApiResult {
    let body = body_json(req)?;
    let m = armada_domain::skills::SkillManifest::from_json(name, &body)?;
    svc.registry.put_skill(&m).await.map_err(store_err)?;
    Ok((200, json!(m)))
}

async fn list_profiles(svc: &Services) -> ApiResult {
    let profiles = svc.registry.profiles().await.map_err(store_err)?;
    Ok((200, json!({"profiles": profiles})))
}

/// Defines (or redefines) a global custom profile. Global definitions win
/// over any agent's project profile of the same name.
async fn put_profile(svc: &Services, req: &Request, name: &str) -> ApiResult {
    if !armada_domain::agent::valid_name(name) {
        return Err(ApiError::new(
            400,
            "INVALID_FIELD",
            "name: must be 1-64 characters of a-z, 0-9, '-' or '_'",
        ));
    }
    let body = body_json(req)?;
    let def: ProfileDef = serde_json::from_value(body)
        .map_err(|e| ApiError::new(400, "INVALID_FIELD", format!("profile: {e}")))?;
    let mut all = svc.registry.profiles().await.map_err(store_err)?;
    all.insert(name.to_string(), def.clone());
    let check = Profiles::load(all, Default::default())
        .and_then(|p| p.resolve(name))
        .map_err(|e| ApiError::new(400, "INVALID_FIELD", format!("profile: {e}")))?;
    svc.registry
        .put_profile(name, &def)
        .await
        .map_err(store_err)?;
    Ok((
        200,
        json!({"name": name, "profile": def, "resolved": check}),
    ))
}

/// Whose sandboxes: a tenant key sees its own; the admin names a tenant.
fn sandbox_tenant(who: &Principal, req: &Request) -> Result<String, ApiError> {
    match who {
        Principal::Tenant(t) => Ok(t.clone()),
        Principal::Admin => query(req)
            .get("tenant")
            .filter(|t| valid_tenant(t))
            .cloned()
            .ok_or_else(|| {
                ApiError::new(
                    400,
                    "INVALID_FIELD",
                    "tenant: the admin key names the tenant (?tenant=)",
                )
            }),
    }
}

async fn list_sandboxes(svc: &Services, tenant: &str) -> ApiResult {
    let list = svc.sandboxes.list(tenant).await.map_err(store_err)?;
    let views: Vec<Value> = list.iter().map(sandboxing::view).collect();
    Ok((200, json!({"sandboxes": views})))
}

async fn get_sandbox(svc: &Services, tenant: &str, agent: &str) -> ApiResult {
    match svc.sandboxes.get(tenant, agent).await.map_err(store_err)? {
        Some(rec) => Ok((200, sandboxing::view(&rec))),
        None => Err(ApiError::not_found(&format!("sandbox of agent '{agent}'"))),
    }
}

async fn destroy_sandbox(svc: &Services, tenant: &str, agent: &str) -> ApiResult {
    match sandboxing::destroy(svc, tenant, agent, "destroyed by an administrator")
        .await
        .map_err(store_err)?
    {
        Some(rec) => Ok((200, sandboxing::view(&rec))),
        None => Err(ApiError::not_found(&format!("sandbox of agent '{agent}'"))),
    }
}

async fn mint_key(svc: &Services, tenant: &str) -> ApiResult {
    if !valid_tenant(tenant) {
        return Err(ApiError::new(
            400,
            "INVALID_FIELD",
            "tenant: must be 1-64 characters of a-z, 0-9 or '-'",
        ));
    }
    let key = ApiKey::mint();
    svc.registry
        .put_key(
            &StoredKey {
                key_id: key.key_id.clone(),
                tenant: tenant.to_string(),
                secret_sha256: key.secret_hash(),
                revoked: false,
            },
            svc.clock.now_ms(),
        )
        .await
        .map_err(store_err)?;
    Ok((
        201,
        json!({"key": key.token(), "key_id": key.key_id, "tenant": tenant}),
    ))
}

async fn revoke_key(svc: &Services, key_id: &str) -> ApiResult {
    match svc.registry.revoke_key(key_id, svc.clock.now_ms()).await {
        Ok(()) => Ok((200, json!({"key_id": key_id, "revoked": true}))),
        Err(StoreError::Conflict { .. }) => Err(ApiError::not_found(&format!("key '{key_id}'"))),
        Err(e) => Err(store_err(e)),
    }
}
