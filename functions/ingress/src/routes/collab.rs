//! Watching agents work together: a Run's tree (the DelegationTrace, from
//! its root down through every child each Run lists) and a Run's children.
//! Every read is the caller's tenant's: a child lives in its parent's.

use std::collections::VecDeque;

use armada_domain::collab::SlotState;

use crate::*;

/// The most Runs one trace lists (a tree is bounded by team sizes and the
/// depth limit; this is a guard, reported when reached).
const MAX_TRACE_RUNS: usize = 1000;

fn trace_entry(run: &Run) -> Value {
    let l = run.lineage();
    json!({
        "run_id": run.run_id,
        "parent_run_id": run.parent_run_id,
        "agent": run.agent,
        "kind": l.kind,
        "depth": l.depth,
        "path": l.path,
        "state": run.state,
        "created_at": rfc3339(run.created_at_ms),
        "ended_at": run.ended_at_ms.map(rfc3339),
        "outstanding_children": run.outstanding_children(),
    })
}

/// `GET /v1/runs/{id}/trace`: every Run of the tree the Run belongs to,
/// parents before their children, children in the order they were asked for.
pub(crate) async fn run_trace(svc: &Services, tenant: &str, run_id: &str) -> ApiResult {
    let run = load_run(svc, tenant, run_id).await?;
    let root_id = run.lineage().root_run_id;
    let root = if root_id == run.run_id {
        run
    } else {
        load_run(svc, tenant, &root_id).await?
    };
    let mut runs = Vec::new();
    let mut queue = VecDeque::from([root]);
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
            match svc.runs.get(&id).await.map_err(store_err)? {
                Some(child) if child.tenant == tenant => queue.push_back(child),
                // Planned, not created yet (or never, its parent ended first).
                _ => {}
            }
        }
    }
    Ok((
        200,
        json!({"root_run_id": root_id, "runs": runs, "truncated": truncated}),
    ))
}

/// `GET /v1/runs/{id}/children`: the Run's children, every waiting point's,
/// with where each stands.
pub(crate) async fn run_children(svc: &Services, tenant: &str, run_id: &str) -> ApiResult {
    let run = load_run(svc, tenant, run_id).await?;
    let mut list = Vec::new();
    let slots = run.children.iter().flat_map(|c| c.slots.iter());
    for s in slots {
        let child = svc.runs.get(&s.run_id).await.map_err(store_err)?;
        let state = match (&child, s.state) {
            (Some(c), _) => json!(c.state),
            (None, SlotState::Queued) => json!("QUEUED"),
            (None, _) => Value::Null,
        };
        list.push(json!({
            "run_id": s.run_id,
            "agent": s.agent,
            "kind": s.kind,
            "round": s.round,
            "call_id": s.call_id,
            "state": state,
            "noted": s.state == SlotState::Ended,
            "error": s.outcome.as_ref().and_then(|o| o.error.clone()),
        }));
    }
    Ok((
        200,
        json!({"run_id": run.run_id, "outstanding_children": run.outstanding_children(), "children": list}),
    ))
}
