//! A Run whose document can no longer be read (written by an older
//! version with a bug, or damaged) must still be readable, cancellable and
//! ended, or its session stays blocked and its sandbox held for good. Its
//! item keeps the attributes the store writes beside the document; from
//! them the Run is rebuilt, in the state they say, with the error
//! [`CORRUPT_RECORD`], and ended through its machine like any other.

use std::collections::BTreeMap;

use super::{Budgets, Payload, Run, RunError, RunState, Usage};
use crate::sandbox::lifecycle::sandbox_key;

/// The error of a Run rebuilt from its head.
pub const CORRUPT_RECORD: &str = "CORRUPT_RECORD";

/// What a Run's item says outside its document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunHead {
    pub run_id: String,
    pub tenant: String,
    pub agent: String,
    pub state: RunState,
    pub step: u32,
    pub epoch: u64,
    pub event_seq: u64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub parent_run_id: Option<String>,
    pub session_id: Option<String>,
    pub session_seq: Option<u64>,
}

impl Run {
    /// The Run `head` describes, readable again: its document's content is
    /// gone (input, ledger, transcript, children), its error says so, and
    /// it names its agent's sandbox, so whatever it held is let go when it
    /// ends. The caller ends it (`apply_from_outside`) unless it already
    /// ended, and writes it conditional on the head's stamp.
    pub fn rebuilt(head: &RunHead, why: &str) -> Run {
        Run {
            run_id: head.run_id.clone(),
            tenant: head.tenant.clone(),
            agent: head.agent.clone(),
            state: head.state,
            step: head.step,
            epoch: head.epoch,
            lease_until_ms: 0,
            event_seq: head.event_seq,
            input: Payload::Inline {
                text: String::new(),
            },
            output: None,
            error: Some(RunError::new(
                CORRUPT_RECORD,
                format!("the run's record could not be read ({why}); it was ended"),
            )),
            session_id: head.session_id.clone(),
            session_seq: head.session_seq,
            parent_run_id: head.parent_run_id.clone(),
            callback_url: None,
            metadata: serde_json::Value::Null,
            created_at_ms: head.created_at_ms,
            updated_at_ms: head.updated_at_ms,
            ended_at_ms: None,
            budgets: Budgets {
                max_model_turns: 0,
                max_tool_calls: 0,
                deadline_ms: head.created_at_ms,
            },
            usage: Usage::default(),
            ledger: BTreeMap::new(),
            sandbox_key: Some(sandbox_key(&head.tenant, &head.agent)),
            prewarm_sandbox: false,
            lineage: None,
            team: None,
            children: None,
            chain: None,
            identity: None,
            resumed: None,
            started_by: None,
            started_by_address: None,
            started_from: None,
            callback: None,
            awaiting_human_since_ms: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::RunEvent;

    fn head(state: RunState) -> RunHead {
        RunHead {
            run_id: "run_1".into(),
            tenant: "acme".into(),
            agent: "coder".into(),
            state,
            step: 3,
            epoch: 4,
            event_seq: 9,
            created_at_ms: 1,
            updated_at_ms: 2,
            parent_run_id: Some("run_0".into()),
            session_id: Some("ses_1".into()),
            session_seq: Some(2),
        }
    }

    #[test]
    fn a_rebuilt_run_ends_through_its_machine_and_reads_back() {
        let h = head(RunState::AwaitingTool);
        let mut run = Run::rebuilt(&h, "attribute doc: recursion limit exceeded");
        assert_eq!(run.stamp().epoch, 4);
        let error = run.error.clone().unwrap();
        run.apply_from_outside(RunEvent::Failed { error }, 10)
            .unwrap();
        let ended = run
            .push_end_event(crate::run::EndNote::default(), 10)
            .unwrap();
        assert_eq!((run.state, run.epoch), (RunState::Failed, 5));
        assert_eq!((ended.kind().as_str(), ended.seq), ("run_failed", 10));
        assert_eq!(run.error.as_ref().unwrap().code, CORRUPT_RECORD);
        // What settlement needs: its sandbox, session and parent.
        assert_eq!(run.sandbox_key.as_deref(), Some("acme#coder"));
        assert_eq!(run.session_id.as_deref(), Some("ses_1"));
        assert_eq!(run.parent_run_id.as_deref(), Some("run_0"));
        let text = serde_json::to_string(&run).unwrap();
        assert_eq!(serde_json::from_str::<Run>(&text).unwrap(), run);
        // A cancel ends it too.
        let mut run = Run::rebuilt(&head(RunState::Pending), "x");
        run.apply_from_outside(RunEvent::CancelRequested, 10)
            .unwrap();
        assert_eq!(run.state, RunState::Cancelled);
    }
}
