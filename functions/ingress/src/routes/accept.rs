//! Accepting a Run: what `POST /v1/runs`, a session's message and a
//! team's or chain's start share. The Run is validated, deduplicated by
//! its `Idempotency-Key`, written with what must land with it, and its
//! start enqueued.

use std::time::Duration;

use axum::http::HeaderMap;
use serde_json::Value;

use armada_api::runs::RunAccepted;
use armada_api::ApiError;
use armada_core::clock::new_id;
use armada_core::error::StoreError;
use armada_core::ports::{Also, IdemRecord};
use armada_core::services::auth::TenantKey;
use armada_core::Services;
use armada_domain::agent::AgentDefinition;
use armada_domain::api::{minute_window, CreateRun};
use armada_domain::collab::chain::{step_run_id, ChainLink};
use armada_domain::collab::{Lineage, RunKind};
use armada_domain::crypto::sha256_hex;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::{
    Created, LogEvent, NewRun as NewRunRecord, Payload, Run, RunState, Trigger,
};
use armada_domain::session::SessionHeader;
use armada_domain::team::TeamDefinition;

use super::owned::load_run;

/// A registered agent, or `404` naming it.
pub(crate) async fn agent_named(svc: &Services, name: &str) -> Result<AgentDefinition, ApiError> {
    svc.registry
        .agent(name)
        .await?
        .ok_or_else(|| ApiError::not_found(&format!("agent '{name}'")))
}

/// Tells the dispatcher to start the Run, three tries; when none lands,
/// the caller is told to retry with the same `Idempotency-Key` (the Run
/// is written already, so the retry finds it).
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
    /// What started it from outside, when not a key (a hook's delivery).
    pub(crate) started_from: Option<Trigger>,
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
            started_from: cr.started_from,
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
        run.started_from = new.started_from.clone();
        let created = LogEvent::RunCreated(Created {
            agent: run.agent.clone(),
            trigger: Some(run.trigger()),
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
