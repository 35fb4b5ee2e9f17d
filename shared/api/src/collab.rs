//! Agents working together: a Run's tree, its children, relay chains.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use armada_domain::collab::chain::{ChainState, StepView};
use armada_domain::collab::RunKind;
use armada_domain::run::{RunError, RunState};

/// `GET /v1/runs/{run_id}/trace`: every Run of the tree, parents first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TraceView {
    pub root_run_id: String,
    pub runs: Vec<TraceEntry>,
    /// The tree has more Runs than one trace lists (1000).
    pub truncated: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TraceEntry {
    pub run_id: String,
    pub parent_run_id: Option<String>,
    pub agent: String,
    pub kind: RunKind,
    pub depth: u32,
    pub path: Vec<String>,
    pub state: RunState,
    pub created_at: String,
    pub ended_at: Option<String>,
    pub outstanding_children: u64,
}

/// `GET /v1/runs/{run_id}/children`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChildrenView {
    pub run_id: String,
    pub outstanding_children: u64,
    pub children: Vec<ChildView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChildView {
    pub run_id: String,
    pub agent: String,
    pub kind: RunKind,
    pub round: u32,
    pub call_id: Option<String>,
    /// The child's Run state, `QUEUED` before it exists, or null.
    pub state: Option<String>,
    /// The parent has taken in the child's end.
    pub noted: bool,
    pub error: Option<RunError>,
}

/// `GET /v1/chains/{chain_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChainView {
    pub chain_id: String,
    pub state: ChainState,
    pub steps: Vec<StepView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

/// `200` to a chain's cancel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChainCancelled {
    pub chain_id: String,
    pub cancelled_run_id: String,
    pub state: RunState,
}
