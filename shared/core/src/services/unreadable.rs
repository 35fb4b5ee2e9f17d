//! Runs whose document cannot be read: ended all the same, from what their
//! item says beside the document ([`armada_domain::run::RunHead`]), so no
//! Run is left non-terminal, its session blocked or its sandbox held.

use armada_domain::run::{EndNote, Run, RunError, RunEvent, RunHead, CORRUPT_RECORD};

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

/// An unreadable Run as the domain rebuilds it from its head, and how it
/// is ended unless it had ended already (`None` then: the document is
/// only rewritten readable). `why` is the store's complaint about it.
pub fn rebuilt(
    head: &RunHead,
    why: &str,
    ending: Ending<'_>,
) -> (Run, Option<(RunEvent, EndNote)>) {
    let run = Run::rebuilt(head, why);
    if run.state().is_terminal() {
        return (run, None);
    }
    let end = match ending {
        Ending::Fail => (
            RunEvent::Failed {
                error: run.error.clone().unwrap_or_else(|| {
                    RunError::new(CORRUPT_RECORD, "the run's record could not be read")
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
    (run, Some(end))
}
