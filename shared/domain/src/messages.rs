//! Queue message contracts, each defined once and used by its producer and
//! its consumer. Messages carry ids, never bodies: the Run record is the
//! source of truth, so a duplicated or reordered message can be judged against it.

use serde::{Deserialize, Serialize};

/// On the dispatch queue (ingress → dispatcher, harness → dispatcher).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DispatchMessage {
    /// A Run was accepted and waits to be started.
    StartRun { run_id: String, tenant: String },
    /// A Run reached a terminal state; its post-terminal duties are due.
    RunTerminal { run_id: String, tenant: String },
}

impl DispatchMessage {
    pub fn run_id(&self) -> &str {
        match self {
            DispatchMessage::StartRun { run_id, .. }
            | DispatchMessage::RunTerminal { run_id, .. } => run_id,
        }
    }
}

/// On the harness FIFO queue, grouped by run id so one Run's steps never overlap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HarnessMessage {
    /// Execute step `step` of the Run.
    Step {
        run_id: String,
        tenant: String,
        step: u32,
    },
}

impl HarnessMessage {
    pub fn run_id(&self) -> &str {
        match self {
            HarnessMessage::Step { run_id, .. } => run_id,
        }
    }

    /// The FIFO deduplication id: one per Run step.
    pub fn dedup_id(&self) -> String {
        match self {
            HarnessMessage::Step { run_id, step, .. } => format!("{run_id}-step-{step}"),
        }
    }
}
