//! Runs whose document cannot be read: ended all the same, from what their
//! item says beside the document ([`armada_domain::run::RunHead`]), so no
//! Run is left non-terminal, its session blocked or its sandbox held.

use serde_json::json;

use armada_domain::run::{Run, RunEvent, RunHead};

use crate::error::StoreError;
use crate::Services;

/// How an unreadable Run is ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending<'a> {
    /// It fails (its messages went to a dead-letter queue).
    Fail,
    /// Someone cancelled it.
    Cancel { by: &'a str },
}

/// The head of `run_id` when it is `tenant`'s.
pub async fn head_of(
    svc: &Services,
    run_id: &str,
    tenant: &str,
) -> Result<Option<RunHead>, StoreError> {
    Ok(svc.runs.head(run_id).await?.filter(|h| h.tenant == tenant))
}

/// Rewrites an unreadable Run as the domain rebuilds it from its head,
/// ended as `ending` says unless it had ended already, conditional on the
/// head's stamp (a `Conflict` means it changed: read again). `why` is the
/// store's complaint about the document. `None`: no such Run of `tenant`.
pub async fn end(
    svc: &Services,
    run_id: &str,
    tenant: &str,
    why: &str,
    ending: Ending<'_>,
) -> Result<Option<Run>, StoreError> {
    let Some(head) = head_of(svc, run_id, tenant).await? else {
        return Ok(None);
    };
    let now = svc.clock.now_ms();
    let mut run = Run::rebuilt(&head, why);
    let prev = run.stamp();
    let mut events = Vec::new();
    if !run.state.is_terminal() {
        let (event, by) = match ending {
            Ending::Fail => (
                RunEvent::Failed {
                    error: run.error.clone().unwrap_or_else(|| {
                        armada_domain::run::RunError::new(
                            armada_domain::run::CORRUPT_RECORD,
                            "the run's record could not be read",
                        )
                    }),
                },
                None,
            ),
            Ending::Cancel { by } => (RunEvent::CancelRequested, Some(by)),
        };
        run.apply_from_outside(event, now)
            .map_err(|e| StoreError::Terminal(e.to_string()))?;
        let mut data = json!({"error": run.error});
        if let Some(by) = by {
            data["by"] = json!(by);
        }
        events.extend(run.push_end_event(data, now));
    }
    svc.runs.save(prev, &run, &events, vec![]).await?;
    tracing::error!(run_id, tenant, why, state = %run.state, "a run whose record could not be read was rebuilt and ended");
    Ok(Some(run))
}
