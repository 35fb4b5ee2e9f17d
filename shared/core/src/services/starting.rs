//! Starting a Run: what `POST /v1/runs`, a session's message, a team's or
//! chain's start, a hook's delivery and a schedule's firing share. The Run
//! is checked against its tenant's quotas, deduplicated by its key (an
//! `Idempotency-Key`, a delivery's or a firing's id), written with what
//! must land with it, and its start enqueued. Refusals are this module's
//! own ([`StartRefused`]); each caller answers them in its own terms.

use std::time::Duration;

use serde_json::Value;

use armada_domain::agent::AgentDefinition;
use armada_domain::api::{minute_window, CreateRun, RunTarget};
use armada_domain::collab::chain::{step_run_id, ChainLink};
use armada_domain::collab::{Lineage, RunKind};
use armada_domain::messages::DispatchMessage;
use armada_domain::run::{
    Created, LogEvent, NewRun as NewRunRecord, Payload, Run, RunState, Trigger,
};
use armada_domain::session::SessionHeader;
use armada_domain::team::{Strategy, TeamDefinition};

use crate::clock::new_id;
use crate::error::StoreError;
use crate::ports::{Also, IdemRecord};
use crate::services::auth::TenantKey;
use crate::Services;

/// Why a Run was not started (nothing was written, unless it says so).
#[derive(Debug, thiserror::Error)]
pub enum StartRefused {
    /// An agent, team, session or Run that is not there (or is another
    /// tenant's).
    #[error("{0} not found")]
    NotFound(String),
    #[error("this tenant may have {active} runs active at once")]
    TooManyActiveRuns { active: u32 },
    #[error("this tenant may start {per_minute} runs a minute")]
    RateLimited { per_minute: u32, retry_after_s: u32 },
    /// More Runs below one root than the deployment allows.
    #[error("{0}")]
    TooManyDescendants(String),
    #[error("the session's previous message is still being answered")]
    SessionBusy,
    #[error("this Idempotency-Key was used with a different request body")]
    IdempotencyKeyReused,
    /// The Run is written, its start not queued: the same key again
    /// finds it and queues it.
    #[error("the run was recorded but could not be queued; retry with the same Idempotency-Key")]
    NotQueued,
    /// Other writers kept changing what it lands with: retry.
    #[error("{0}")]
    Contended(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl StartRefused {
    /// A `NotFound` said in the caller's words; any other refusal (a store
    /// that did not answer, say) as it is, never taken for a missing thing.
    fn naming(self, what: String) -> StartRefused {
        match self {
            StartRefused::NotFound(_) => StartRefused::NotFound(what),
            other => other,
        }
    }
}

/// How long a Run's key is remembered: a caller's `Idempotency-Key` a
/// day; a hook delivery's or a schedule firing's a week, since senders
/// redeliver for days (GitHub keeps a delivery three days, Standard
/// Webhooks senders retry for more than one).
fn dedup_days(started_from: Option<&Trigger>) -> u32 {
    match started_from {
        Some(Trigger::Hook { .. } | Trigger::Schedule { .. } | Trigger::Email { .. }) => 7,
        _ => 1,
    }
}

/// A Run started (or found again by its key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub run_id: String,
    pub state: RunState,
    pub chain_id: Option<String>,
    pub session_id: Option<String>,
    /// Its message's number in its session.
    pub seq: Option<u64>,
    /// Its key was seen before: this is that Run.
    pub replayed: Option<bool>,
}

/// A registered agent, or `404` naming it.
pub async fn agent_named(svc: &Services, name: &str) -> Result<AgentDefinition, StartRefused> {
    svc.registry
        .agent(name)
        .await?
        .ok_or_else(|| StartRefused::NotFound(format!("agent '{name}'")))
}

/// Tells the dispatcher to start the Run, three tries; when none lands,
/// the caller is told to retry with the same `Idempotency-Key` (the Run
/// is written already, so the retry finds it).
pub async fn enqueue_start(svc: &Services, run: &Run) -> Result<(), StartRefused> {
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
    Err(StartRefused::NotQueued)
}

/// What a new Run is attached to.
pub struct NewRun<'a> {
    pub tenant: &'a str,
    /// The key id that asked: it may not approve the Run's own gated calls.
    pub started_by: &'a str,
    /// The starter's address (its key's owner), when known.
    pub started_by_address: Option<&'a str>,
    pub agent: &'a AgentDefinition,
    pub input: String,
    pub session: Option<SessionHeader>,
    pub callback_url: Option<String>,
    pub metadata: Value,
    pub idempotency: Option<(String, String)>,
    /// The team this is the team's Run of (fan-out aggregator, lead).
    pub team: Option<TeamDefinition>,
    /// The first step of a relay chain (its Run id is the chain's).
    pub chain: Option<ChainLink>,
    /// What started it from outside, when not a key (a hook's delivery).
    pub started_from: Option<Trigger>,
}

impl<'a> NewRun<'a> {
    /// A Run of `agent` as a create request asks for it: no session, team
    /// or chain unless the caller adds one.
    pub fn of(
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

pub async fn start_run(svc: &Services, new: NewRun<'_>) -> Result<Accepted, StartRefused> {
    let now = svc.clock.now_ms();
    // The tenant's Runs not yet ended first, then its rate: a refused
    // start writes nothing. The count is a read and the marker is written
    // with the Run, so starts racing each other can all read the same
    // count: together they pass the limit by at most the number racing,
    // and never drift (each marker goes when its Run is settled).
    let active = svc.cfg.tenant_active_runs;
    if svc.quotas.active_runs(new.tenant, active, now).await? >= active {
        return Err(StartRefused::TooManyActiveRuns { active });
    }
    let limit = svc.cfg.tenant_runs_per_minute;
    let (window, retry_after) = minute_window(now);
    if !svc
        .idempotency
        .count_run_start(new.tenant, window, limit)
        .await?
    {
        return Err(StartRefused::RateLimited {
            per_minute: limit,
            retry_after_s: retry_after,
        });
    }
    let run_id = match &new.chain {
        Some(link) => step_run_id(&link.chain_id, 0),
        None => new_id("run"),
    };
    crate::adapters::calls::name_run(&run_id);
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
        let keep_days = dedup_days(new.started_from.as_ref());
        let idem_index = new.idempotency.as_ref().map(|(key, fp)| {
            also.push(Also::IdempotencyKey {
                tenant: new.tenant.to_string(),
                key: key.clone(),
                record: IdemRecord {
                    fingerprint: fp.clone(),
                    run_id: run_id.clone(),
                },
                now_ms: now,
                keep_days,
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
                return Ok(Accepted {
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
                    .ok_or_else(|| StartRefused::NotFound("session".into()))?;
                if fresh.on_busy == armada_domain::session::OnBusy::Reject && fresh.busy() {
                    return Err(StartRefused::SessionBusy);
                }
                session = Some(fresh);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(StartRefused::Contended("the session is contended; retry"))
}

/// A repeated `Idempotency-Key`: the same body gets the same Run (re-queued
/// if it never left PENDING); a different body is refused.
pub async fn replay(
    svc: &Services,
    tenant: &str,
    key: &str,
    fp: &str,
) -> Result<Accepted, StartRefused> {
    let rec = svc
        .idempotency
        .get(tenant, key)
        .await?
        .ok_or(StartRefused::Contended(
            "idempotency record is settling; retry",
        ))?;
    if rec.fingerprint != fp {
        return Err(StartRefused::IdempotencyKeyReused);
    }
    let run = match svc.runs.get(&rec.run_id).await? {
        // Another tenant's Run does not exist for this caller.
        Some(run) if run.tenant == tenant => run,
        _ => return Err(StartRefused::NotFound(format!("run '{}'", rec.run_id))),
    };
    if run.state() == RunState::Pending {
        enqueue_start(svc, &run).await?;
    }
    Ok(Accepted {
        run_id: run.run_id.clone(),
        state: run.state(),
        chain_id: run.chain.as_ref().map(|l| l.chain_id.clone()),
        session_id: run.session_id.clone(),
        seq: None,
        replayed: Some(true),
    })
}

/// A sequential relay chain: its first step's Run, carrying the chain's
/// link (every step's agent, the chain's callback); the dispatcher starts
/// each next step as the one before completes.
pub async fn create_chain(
    svc: &Services,
    key: &TenantKey,
    cr: CreateRun,
    steps: Vec<String>,
    team: Option<String>,
    idempotency: Option<(String, String)>,
) -> Result<Accepted, StartRefused> {
    // Every step after the first is a Run of the chain's tree.
    within_descendants(
        svc,
        steps.len().saturating_sub(1),
        "the chain's steps after the first",
    )?;
    for (i, a) in steps.iter().enumerate() {
        agent_named(svc, a)
            .await
            .map_err(|e| e.naming(format!("agent '{a}' (chain step {i})")))?;
    }
    let first = agent_named(svc, &steps[0]).await?;
    let link = ChainLink {
        chain_id: new_id("chain"),
        index: 0,
        steps,
        // The chain's end is heard once, by its callback (not each step's).
        callback_url: cr.callback_url.clone(),
        team,
    };
    let new = NewRun {
        callback_url: None,
        chain: Some(link),
        ..NewRun::of(key, &first, cr, idempotency)
    };
    start_run(svc, new).await
}

/// A team's Run: every agent the team names must still be registered; a
/// fan-out team's Run is its aggregator's (the dispatcher expands it into
/// the members), a lead team's its lead's.
pub async fn create_team_run(
    svc: &Services,
    key: &TenantKey,
    cr: CreateRun,
    name: &str,
    idempotency: Option<(String, String)>,
) -> Result<Accepted, StartRefused> {
    let team = svc
        .registry
        .team(name)
        .await?
        .ok_or_else(|| StartRefused::NotFound(format!("team '{name}'")))?;
    for a in team.agents() {
        agent_named(svc, a)
            .await
            .map_err(|e| e.naming(format!("agent '{a}' of team '{name}'")))?;
    }
    let runs_as = match team.strategy {
        Strategy::FanOut => {
            within_descendants(svc, team.members.len(), "the team's members")?;
            team.aggregator().to_string()
        }
        Strategy::Lead => team.lead.clone().unwrap_or_else(|| team.members[0].clone()),
        Strategy::Relay => {
            let steps = team.members.clone();
            return create_chain(svc, key, cr, steps, Some(team.name), idempotency).await;
        }
    };
    let agent = agent_named(svc, &runs_as).await?;
    let new = NewRun {
        team: Some(team),
        ..NewRun::of(key, &agent, cr, idempotency)
    };
    start_run(svc, new).await
}

/// Refuses a start that would need more Runs below its root than the
/// deployment's bound (`MaxDescendantsPerRoot`) before anything is
/// written: the tree could never hold them.
fn within_descendants(svc: &Services, runs: usize, what: &str) -> Result<(), StartRefused> {
    let max = svc.cfg.max_descendants_per_root;
    if runs <= max as usize {
        return Ok(());
    }
    Err(StartRefused::TooManyDescendants(format!(
        "{what} are {runs} runs below one root; this deployment allows {max}"
    )))
}

/// Starts what `cr` asks for (an agent's Run, a team's, or a relay
/// chain) as `key`; a session is the caller's to attach.
pub async fn start_target(
    svc: &Services,
    key: &TenantKey,
    cr: CreateRun,
    idempotency: Option<(String, String)>,
) -> Result<Accepted, StartRefused> {
    match cr.target.clone() {
        RunTarget::Agent(name) => {
            let agent = agent_named(svc, &name).await?;
            start_run(svc, NewRun::of(key, &agent, cr, idempotency)).await
        }
        RunTarget::Team(name) => create_team_run(svc, key, cr, &name, idempotency).await,
        RunTarget::Chain(steps) => create_chain(svc, key, cr, steps, None, idempotency).await,
    }
}

/// Whether what `target` names is registered now (a hook or schedule
/// naming nothing would only fail each time it fires).
pub async fn target_exists(svc: &Services, target: &RunTarget) -> Result<(), StartRefused> {
    match target {
        RunTarget::Agent(a) => {
            agent_named(svc, a).await?;
        }
        RunTarget::Team(t) => {
            if svc.registry.team(t).await?.is_none() {
                return Err(StartRefused::NotFound(format!("team '{t}'")));
            }
        }
        RunTarget::Chain(steps) => {
            for a in steps {
                agent_named(svc, a).await?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deliverys_or_firings_key_outlives_a_callers() {
        let hook = Trigger::Hook {
            hook_id: "h".into(),
            event: "push".into(),
            delivery_id: "d".into(),
        };
        let firing = Trigger::Schedule {
            schedule_id: "s".into(),
            scheduled_at: "2026-12-05T10:00:00Z".into(),
        };
        assert_eq!(dedup_days(Some(&hook)), 7);
        assert_eq!(dedup_days(Some(&firing)), 7);
        assert_eq!(dedup_days(None), 1);
        assert_eq!(dedup_days(Some(&Trigger::Api)), 1);
    }

    /// A chain's or team's agents are looked up one by one: a store that
    /// did not answer is a retry later (503), not a missing agent (404),
    /// which a caller would not retry.
    #[test]
    fn only_a_missing_agent_is_named_not_found() {
        let missing =
            StartRefused::NotFound("agent 'a'".into()).naming("agent 'a' (chain step 0)".into());
        assert!(matches!(missing, StartRefused::NotFound(w) if w == "agent 'a' (chain step 0)"));
        let down = StartRefused::Store(StoreError::Retryable("connection refused".into()))
            .naming("agent 'a' (chain step 0)".into());
        assert!(matches!(
            down,
            StartRefused::Store(StoreError::Retryable(_))
        ));
    }
}
