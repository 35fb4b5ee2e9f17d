//! Agents working together, at the API: starting a team's Run or a relay
//! chain, and watching them: a Run's tree (the DelegationTrace, from its
//! root down through every child each Run lists), a Run's children, a
//! chain. Every read is the caller's tenant's: a child lives in its
//! parent's.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;

use armada_api::collab::{
    ChainCancelled, ChainView, ChildView, ChildrenView, TraceEntry, TraceView,
};
use armada_api::server::Path;
use armada_api::{ApiError, ErrorBody};
use armada_core::clock::rfc3339;
use armada_core::services::auth::Principal;
use armada_core::Services;
use armada_domain::collab::chain::{self, step_run_id};
use armada_domain::collab::SlotState;
use armada_domain::run::{Run, RunState};

use super::owned::{cancel_run_by, load_run};
use super::tenant;
use armada_api::error::KeyRefusals;

/// The most Runs one trace lists (a tree is bounded by team sizes and the
/// depth limit; this is a guard, reported when reached).
const MAX_TRACE_RUNS: usize = 1000;

fn trace_entry(run: &Run) -> TraceEntry {
    let l = run.lineage();
    TraceEntry {
        run_id: run.run_id.clone(),
        parent_run_id: run.parent_run_id.clone(),
        agent: run.agent.clone(),
        kind: l.kind,
        depth: l.depth,
        path: l.path,
        state: run.state(),
        created_at: rfc3339(run.created_at_ms),
        ended_at: run.ended_at_ms.map(rfc3339),
        outstanding_children: run.outstanding_children() as u64,
    }
}

/// `GET /v1/runs/{id}/trace`: every Run of the tree the Run belongs to,
/// parents before their children, children in the order they were asked
/// for (for a chain step: the chain's steps in order, then what they asked).
#[utoipa::path(get, path = "/v1/runs/{run_id}/trace", tag = "collaboration",
    params(("run_id" = String, Path, description = "Any Run of the tree.")),
    responses(
        (status = 200, description = "The tree's Runs.", body = TraceView),
        (status = 404, description = "`NOT_FOUND`: no such Run in the caller's tenant.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn run_trace(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(run_id): Path<String>,
) -> Result<Json<TraceView>, ApiError> {
    let tenant = tenant(&who)?;
    let svc = svc.as_ref();
    let run = load_run(svc, tenant, &run_id).await?;
    let root_id = run.lineage().root_run_id;
    let root = if root_id == run.run_id {
        run
    } else {
        load_run(svc, tenant, &root_id).await?
    };
    // A chain's steps are peers: its trace is every step in order, each
    // with its own descendants.
    let roots: Vec<Run> = match root.chain.clone() {
        Some(link) => chain_runs(svc, tenant, &link.chain_id)
            .await?
            .into_iter()
            .flatten()
            .collect(),
        None => vec![root],
    };
    let mut runs = Vec::new();
    let mut queue = VecDeque::from(roots);
    let mut truncated = false;
    while let Some(r) = queue.pop_front() {
        if runs.len() >= MAX_TRACE_RUNS {
            truncated = true;
            break;
        }
        runs.push(trace_entry(&r));
        let ids: Vec<String> = r
            .children
            .iter()
            .flat_map(|c| c.slots.iter().map(|s| s.run_id.clone()))
            .collect();
        for id in ids {
            match svc.runs.get(&id).await? {
                Some(child) if child.tenant == tenant => queue.push_back(child),
                // Planned, not created yet (or never, its parent ended first).
                _ => {}
            }
        }
    }
    Ok(Json(TraceView {
        root_run_id: root_id,
        runs,
        truncated,
    }))
}

/// `GET /v1/runs/{id}/children`: the Run's children, every waiting point's,
/// with where each stands.
#[utoipa::path(get, path = "/v1/runs/{run_id}/children", tag = "collaboration",
    params(("run_id" = String, Path, description = "The parent Run.")),
    responses(
        (status = 200, description = "Its children.", body = ChildrenView),
        (status = 404, description = "`NOT_FOUND`: no such Run in the caller's tenant.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn run_children(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(run_id): Path<String>,
) -> Result<Json<ChildrenView>, ApiError> {
    let run = load_run(&svc, tenant(&who)?, &run_id).await?;
    let mut list = Vec::new();
    let slots = run.children.iter().flat_map(|c| c.slots.iter());
    for s in slots {
        let child = svc.runs.get(&s.run_id).await?;
        let state = match (&child, s.state()) {
            (Some(c), _) => Some(c.state().to_string()),
            (None, SlotState::Queued) => Some("QUEUED".to_string()),
            (None, _) => None,
        };
        list.push(ChildView {
            run_id: s.run_id.clone(),
            agent: s.agent.clone(),
            kind: s.kind,
            round: s.round,
            call_id: s.call_id.clone(),
            state,
            noted: s.state() == SlotState::Ended,
            error: s.outcome.as_ref().and_then(|o| o.error.clone()),
        });
    }
    Ok(Json(ChildrenView {
        run_id: run.run_id.clone(),
        outstanding_children: run.outstanding_children() as u64,
        children: list,
    }))
}

/// A chain's steps' Runs, in order (a step not started has none); its
/// first step's Run says how many steps there are. Another tenant's chain
/// does not exist for the caller.
async fn chain_runs(
    svc: &Services,
    tenant: &str,
    chain_id: &str,
) -> Result<Vec<Option<Run>>, ApiError> {
    let not_found = || ApiError::not_found(&format!("chain '{chain_id}'"));
    if !chain_id.starts_with("chain_") {
        return Err(not_found());
    }
    let first = svc
        .runs
        .get(&step_run_id(chain_id, 0))
        .await?
        .filter(|r| r.tenant == tenant)
        .ok_or_else(not_found)?;
    let n = first.chain.as_ref().map_or(1, |c| c.steps.len());
    let mut runs = vec![Some(first)];
    for i in 1..n {
        let r = svc.runs.get(&step_run_id(chain_id, i)).await?;
        runs.push(r.filter(|r| r.tenant == tenant));
    }
    Ok(runs)
}

/// `GET /v1/chains/{chain_id}`: `{chain_id, state, steps: [{agent, run_id?, state}]}`.
#[utoipa::path(get, path = "/v1/chains/{chain_id}", tag = "collaboration",
    params(("chain_id" = String, Path, description = "The chain's id (`chain_…`).")),
    responses(
        (status = 200, description = "The chain.", body = ChainView),
        (status = 404, description = "`NOT_FOUND`: no such chain in the caller's tenant.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn get_chain(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(chain_id): Path<String>,
) -> Result<Json<ChainView>, ApiError> {
    let runs = chain_runs(&svc, tenant(&who)?, &chain_id).await?;
    let link = runs[0].as_ref().and_then(|r| r.chain.clone());
    let steps = link.as_ref().map(|l| l.steps.clone()).unwrap_or_default();
    let refs: Vec<Option<&Run>> = runs.iter().map(Option::as_ref).collect();
    let (state, views) = chain::view(&steps, &refs);
    Ok(Json(ChainView {
        chain_id,
        state,
        steps: views,
        team: link.and_then(|l| l.team),
    }))
}

/// `POST /v1/chains/{chain_id}/cancel`: cancels the running step; its end
/// breaks the chain and the steps after it are skipped.
#[utoipa::path(post, path = "/v1/chains/{chain_id}/cancel", tag = "collaboration",
    params(("chain_id" = String, Path, description = "The chain's id (`chain_…`).")),
    responses(
        (status = 200, description = "Its running step is cancelled.", body = ChainCancelled),
        (status = 404, description = "`NOT_FOUND`: no such chain in the caller's tenant.", body = ErrorBody),
        (status = 409, description = "`CHAIN_ENDED`, `RUN_TERMINAL`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn cancel_chain(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(chain_id): Path<String>,
) -> Result<Json<ChainCancelled>, ApiError> {
    let tenant = tenant(&who)?;
    let (svc, chain_id) = (svc.as_ref(), chain_id.as_str());
    // Between two steps (one completed, the next about to be created) no
    // step is active for a moment: look again shortly.
    for _ in 0..20 {
        let runs = chain_runs(svc, tenant, chain_id).await?;
        let steps = runs[0]
            .as_ref()
            .and_then(|r| r.chain.as_ref())
            .map(|l| l.steps.clone())
            .unwrap_or_default();
        let refs: Vec<Option<&Run>> = runs.iter().map(Option::as_ref).collect();
        let (state, _) = chain::view(&steps, &refs);
        if state != chain::ChainState::Running {
            return Err(ApiError::conflict(
                "CHAIN_ENDED",
                format!("the chain already ended {}", chain_state_name(state)),
            ));
        }
        if let Some(active) = runs.iter().flatten().find(|r| r.state().is_active()) {
            let cancelled = cancel_run_by(svc, tenant, &active.run_id, "chain").await?;
            return Ok(Json(ChainCancelled {
                chain_id: chain_id.to_string(),
                cancelled_run_id: cancelled.run_id,
                state: RunState::Cancelled,
            }));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(ApiError::unavailable(
        "the chain is between two steps; retry",
    ))
}

/// A chain's state as the API writes it, quoted (`"COMPLETED"`).
fn chain_state_name(state: chain::ChainState) -> String {
    serde_json::to_string(&state).unwrap_or_default()
}
