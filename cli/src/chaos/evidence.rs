//! What a report says about a Run left open, beyond the rule it broke:
//! its events in order, its calls of the step it stopped at, and the
//! sandbox it waits on with the marks its agent left. Read from the stack
//! before it stops, so that a failure seen once (in CI, say) can be
//! explained from the report alone.

use std::fmt::Write;

use armada_core::ports::CallRef;
use armada_core::Services;

use super::checker::Violation;

/// Adds to each `not_closed` violation what the stack holds about its Run.
pub async fn explain(svc: &Services, violations: &mut [Violation]) {
    let now = svc.clock.now_ms();
    for v in violations.iter_mut().filter(|v| v.rule == "not_closed") {
        let mut more = String::new();
        if let Err(e) = describe(svc, &v.run_id, now, &mut more).await {
            let _ = write!(more, "; (evidence not read: {e})");
        }
        v.detail.push_str(&more);
    }
}

async fn describe(svc: &Services, run_id: &str, now: i64, out: &mut String) -> anyhow::Result<()> {
    let Some(run) = svc.runs.get(run_id).await? else {
        return Ok(());
    };
    let events = svc.run_events.all_events(run_id).await?;
    let kinds: Vec<String> = events
        .iter()
        .map(|e| {
            format!(
                "{}@{}",
                e.kind().as_str(),
                (e.at_ms - run.created_at_ms) / 1000
            )
        })
        .collect();
    let _ = write!(
        out,
        "; events [{}]; lease {} s ago",
        kinds.join(" "),
        (now - run.lease_until_ms) / 1000
    );
    let at_step = run.ledger.values().filter(|c| c.step == run.step);
    for c in at_step {
        let _ = write!(
            out,
            "; call {} {} {:?} attempt {} generation {:?}",
            c.call_id,
            c.skill,
            c.state(),
            c.attempt,
            c.generation
        );
        if c.sandbox {
            let mark = svc.sandboxes.mark(&CallRef::of(&run, c)).await?;
            let _ = write!(
                out,
                " mark {:?}",
                mark.map(|m| (m.mark, m.generation, (now - m.at_ms) / 1000))
            );
        }
    }
    if run.sandbox_key.is_some() {
        if let Some(r) = svc.sandboxes.get(&run.tenant, &run.agent).await? {
            let _ = write!(
                out,
                "; sandbox {} generation {} holder {:?} waiters {} heartbeat {} s ago, \
                 state {} s ago, task {}",
                r.state().as_str(),
                r.generation,
                r.holder_run_id,
                r.waiters.len(),
                (now - r.heartbeat_at_ms) / 1000,
                (now - r.state_changed_at_ms) / 1000,
                r.task_arn.is_some()
            );
        }
    }
    Ok(())
}
