//! Runs whose document cannot be read: ended all the same, from what their
//! item says beside the document ([`armada_domain::run::RunHead`]), so no
//! Run is left non-terminal, its session blocked or its sandbox held.

use armada_domain::run::{EndNote, Run, RunEvent, RunHead};

use crate::error::StoreError;
use crate::services::ending::{end_from_outside, Ended};
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
) -> Result<Option<Ended>, StoreError> {
    let Some(head) = head_of(svc, run_id, tenant).await? else {
        return Ok(None);
    };
    let run = Run::rebuilt(&head, why);
    let ended = if run.state().is_terminal() {
        // Ended already: the document is rewritten readable, nothing more.
        svc.runs.save(run.stamp(), &run, &[], vec![]).await?;
        Ended {
            run,
            actions: vec![],
        }
    } else {
        let (event, extra) = match ending {
            Ending::Fail => (
                RunEvent::Failed {
                    error: run.error.clone().unwrap_or_else(|| {
                        armada_domain::run::RunError::new(
                            armada_domain::run::CORRUPT_RECORD,
                            "the run's record could not be read",
                        )
                    }),
                },
                EndNote::default(),
            ),
            Ending::Cancel { by } => (
                RunEvent::CancelRequested,
                EndNote {
                    by: Some(by.to_string()),
                    ..EndNote::default()
                },
            ),
        };
        end_from_outside(svc, run, event, extra)
            .await?
            .map_err(|e| StoreError::Terminal(e.to_string()))?
    };
    tracing::error!(run_id, tenant, why, state = %ended.run.state(), "a run whose record could not be read was rebuilt and ended");
    Ok(Some(ended))
}
