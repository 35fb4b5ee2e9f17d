//! Agents working together (seed 000 §C, D, G; ARCHITECTURE §4): where a
//! Run sits in a tree of Runs, the children a Run waits for, and what each
//! child's end means for its parent. Everything here is pure; the harness
//! plans children from a step, the dispatcher creates and starts them and
//! records their ends, both through these functions.
//!
//! - this file: [`Lineage`] (root, depth, path, kind) and the error codes
//! - [`children`]: the waiting point on the parent ([`Children`], its slots,
//!   the outstanding counter), starting within `max_parallel`, a child's end
//!   (tool result, round 2, the failure policy), fan-out expansion
//! - [`delegate`]: the `delegate` and `plan` tool calls checked (arguments,
//!   unknown agents, cycles, depth) and turned into slots
//! - [`round`]: a team's failure policy and its round-2 message
//! - [`resume`]: a `delegate` that resumes a finished peer (identity,
//!   pinned model, the transcript copied, fail-closed checks)
//! - [`chain`]: sequential relay chains (the link each step carries, what
//!   a step's end means, the next input, the chain's view)
//! - [`descendants`]: the bound on every Run one root's tree may have, as
//!   an allowance each Run carries and shares with its children

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::fields::FieldError;

pub mod chain;
pub mod children;
pub mod delegate;
pub mod descendants;
pub mod resume;
pub mod round;

pub use crate::run::family::{
    ChildEnd, ChildOutcome, ChildSlot, Children, Lineage, RunKind, SlotState,
};

/// Delegation deeper than this is refused unless the deployment says
/// otherwise (`ARMADA_MAX_DELEGATION_DEPTH`).
pub const DEFAULT_MAX_DEPTH: u32 = 4;
/// Children of one waiting point running at once, unless a team says.
pub const DEFAULT_MAX_PARALLEL: u32 = crate::team::DEFAULT_MAX_PARALLEL;
/// A delegated task travels in the parent's record: it is kept short.
pub const MAX_TASK_BYTES: usize = 16 * 1024;
/// The most tasks one `plan` call may hand out.
pub const MAX_PLAN_TASKS: usize = crate::team::MAX_MEMBERS;
/// Children one waiting point may have unless the deployment says
/// otherwise (`ARMADA_MAX_CHILDREN_PER_WAIT`): one full `plan`. The limit
/// of one call alone would let a step of many calls start thousands.
pub const DEFAULT_MAX_CHILDREN_PER_WAIT: u32 = MAX_PLAN_TASKS as u32;
/// Runs one root's tree may have below the root, unless the deployment
/// says otherwise (`ARMADA_MAX_DESCENDANTS_PER_ROOT`): the limits per step
/// and per level alone would let one start grow, step by step and level by
/// level, to millions.
pub const DEFAULT_MAX_DESCENDANTS: u32 = 256;

/// The deployment's bounds on the children a step may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildLimits {
    /// How deep below its root a child may be.
    pub max_depth: u32,
    /// How many children one waiting point (one step's `delegate` and
    /// `plan` calls together) may have.
    pub max_children_per_wait: u32,
    /// How many Runs one root's tree may have below the root (children,
    /// theirs, team members, relay steps), all levels and steps together.
    pub max_descendants: u32,
}

impl Default for ChildLimits {
    fn default() -> Self {
        ChildLimits {
            max_depth: DEFAULT_MAX_DEPTH,
            max_children_per_wait: DEFAULT_MAX_CHILDREN_PER_WAIT,
            max_descendants: DEFAULT_MAX_DESCENDANTS,
        }
    }
}

/// Stable codes of collaboration errors (tool results and Run errors).
pub mod codes {
    pub const DELEGATION_CYCLE: &str = "DELEGATION_CYCLE";
    pub const DELEGATION_DEPTH: &str = "DELEGATION_DEPTH";
    pub const AGENT_NOT_FOUND: &str = "AGENT_NOT_FOUND";
    pub const NOT_A_MEMBER: &str = "NOT_A_MEMBER";
    pub const PLAN_NOT_ALLOWED: &str = "PLAN_NOT_ALLOWED";
    pub const TOO_MANY_CHILDREN: &str = "TOO_MANY_CHILDREN";
    pub const TOO_MANY_DESCENDANTS: &str = "TOO_MANY_DESCENDANTS";
    pub const INVALID_ARGS: &str = "INVALID_ARGS";
    pub const CHILD_FAILED: &str = "CHILD_FAILED";
    pub const CHILD_CANCELLED: &str = "CHILD_CANCELLED";
    pub const CHILD_TIMED_OUT: &str = "CHILD_TIMED_OUT";
    pub const MEMBERS_FAILED: &str = "MEMBERS_FAILED";
    pub const QUORUM_NOT_MET: &str = "QUORUM_NOT_MET";
    pub const PARENT_ENDED: &str = "PARENT_ENDED";
}

/// Why a `delegate` or `plan` call was refused: its tool result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub code: &'static str,
    pub message: String,
}

impl CallError {
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> Self {
        CallError {
            code,
            message: message.into(),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"error": {"code": self.code, "message": self.message}})
    }
}

impl From<FieldError> for CallError {
    fn from(e: FieldError) -> Self {
        CallError::new(codes::INVALID_ARGS, e.to_string())
    }
}

/// The id of a parent's child for `call_id` (or a team member), `index`
/// within it: derived, so planning the same children twice (a redelivered
/// step) names the same Runs and creating one is create-once.
pub fn child_run_id(parent_run_id: &str, call_id: &str, index: usize) -> String {
    let mut h = Sha256::new();
    h.update(parent_run_id.as_bytes());
    h.update([0]);
    h.update(call_id.as_bytes());
    h.update([0]);
    h.update(index.to_le_bytes());
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("run_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_one_deeper_with_its_agent_on_the_path() {
        let root = Lineage::root("run_1", "a");
        let c = root.child("b", RunKind::Delegation);
        assert_eq!((c.depth, c.path.clone()), (1, vec!["a".into(), "b".into()]));
        assert_eq!(c.root_run_id, "run_1");
        assert_eq!(c.path_text(Some("a")), "a → b → a");
    }

    #[test]
    fn child_ids_are_stable_and_distinct() {
        let a = child_run_id("run_p", "call_1", 0);
        assert_eq!(a, child_run_id("run_p", "call_1", 0));
        assert_ne!(a, child_run_id("run_p", "call_1", 1));
        assert_ne!(a, child_run_id("run_p", "call_2", 0));
        assert_ne!(a, child_run_id("run_q", "call_1", 0));
        assert_eq!(a.len(), "run_".len() + 32);
    }
}
