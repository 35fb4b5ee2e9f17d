//! The contract between the harness and a sandbox's agent (the "Hand"):
//! what goes on a sandbox's hand queue and what comes back on the harness
//! queue. Defined once, used by both sides.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// On a sandbox's hand queue (FIFO, grouped by Run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HandMessage {
    /// Run one skill call.
    Invoke(Invocation),
    /// The Run let go of the sandbox: its scratch directory is destroyed.
    EndRun { run_id: String, tenant: String },
    /// New AWS credentials for the generation's agent (it asked for them:
    /// [`super::credentials`]).
    Credentials {
        generation: u64,
        credentials: super::credentials::TaskCredentials,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Invocation {
    pub run_id: String,
    pub tenant: String,
    pub agent: String,
    /// The sandbox generation the call was dispatched to; another
    /// generation's agent never runs it.
    pub generation: u64,
    /// The Run step that dispatched the call.
    pub step: u32,
    pub call_id: String,
    /// Attempts of this call (an idempotent call whose sandbox was lost is
    /// tried again under a new attempt number).
    pub attempt: u32,
    /// The built-in executor (`shell_exec`, `python_exec`, ...).
    pub skill: String,
    pub args: Value,
    /// Already capped by the manifest and the sandbox limits.
    pub timeout_s: u32,
    /// A human approved the call: a `file_write` may overwrite a file.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub approved: bool,
    /// The call's changes to the workspace are judged by their effect
    /// before they are kept (`approvals.destructive: effect`, unapproved).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub judge_effects: bool,
    /// The program the call's skill brings (executor `program`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<Box<crate::program::ProgramCall>>,
}

impl Invocation {
    /// The FIFO deduplication id of the call on the hand queue.
    pub fn dedup_id(&self) -> String {
        format!("{}-{}-{}", self.run_id, self.call_id, self.attempt)
    }
}

/// What became of a dispatched call, as the harness learns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CallOutcome {
    /// The skill ran and answered. `result` may itself be an error object
    /// (`{"error": {"code": "OOM" | "TIMEOUT" | "DENIED" | ..}}`).
    Finished { result: Value },
    /// The call never started, so nothing happened: it fails plainly.
    NotRun { code: String, message: String },
    /// The call was dispatched and its channel lost (the sandbox died before
    /// answering): its effect is unknown and it is never re-sent silently.
    Lost { reason: String },
}

impl CallOutcome {
    pub fn error(code: &str, message: impl Into<String>) -> CallOutcome {
        CallOutcome::Finished {
            result: error_json(code, message),
        }
    }

    /// Whether the skill's answer is an error object.
    pub fn failed(&self) -> bool {
        match self {
            CallOutcome::Finished { result } => result.get("error").is_some(),
            CallOutcome::NotRun { .. } | CallOutcome::Lost { .. } => true,
        }
    }
}

pub fn error_json(code: &str, message: impl Into<String>) -> Value {
    json!({"error": {"code": code, "message": message.into()}})
}

/// Where a call stands in the sandbox's own record of it. The start is one
/// conditional write, so a call runs at most once across agent restarts,
/// and a call the control plane gave up on (never started) cannot start late.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CallMark {
    Started,
    Finished,
    /// Given up before it started (start timeout, sandbox destroyed).
    Abandoned,
}

/// A call never started because its sandbox died or went silent first:
/// the harness may send it again, to a new sandbox.
pub const SANDBOX_LOST: &str = "SANDBOX_LOST";
/// A sandbox was sent a call of another identity: it refused and was destroyed.
pub const SECURITY_VIOLATION: &str = "SECURITY_VIOLATION";

/// How long a hand message a sandbox agent took stays hidden; the agent
/// extends it while the call runs ([`HAND_VISIBILITY_EXTEND_SECONDS`]).
/// Short, because a taken message whose receive answer never reached the
/// agent (the connection dropped) blocks the Run's FIFO group meanwhile,
/// and the sandbox looks alive to the watchdog, which waits: with the
/// 30 minutes a call may run, its Run would wait out its deadline.
pub const HAND_VISIBILITY_SECONDS: i32 = 60;
/// How often the agent extends the hand message of the call it runs.
pub const HAND_VISIBILITY_EXTEND_SECONDS: u64 = 20;

/// Stable error codes a sandbox skill may answer with.
/// The largest outcome the harness reads back from the payload bucket. An
/// outcome there was written by the sandbox, whose size no one else set:
/// a bigger one fails its call ([`codes::RESULT_TOO_LARGE`]) rather than
/// fill the harness's memory. Far above what a skill answers (their
/// outputs are cut to a few hundred KiB).
pub const MAX_STORED_OUTCOME_BYTES: u64 = 8 * 1024 * 1024;

pub mod codes {
    pub const OOM: &str = "OOM";
    pub const TIMEOUT: &str = "TIMEOUT";
    pub const DENIED: &str = "DENIED";
    pub const SANDBOX_UNAVAILABLE: &str = "SANDBOX_UNAVAILABLE";
    pub const INVALID_ARGS: &str = "INVALID_ARGS";
    pub const NOT_FOUND: &str = "NOT_FOUND";
    pub const TOO_LARGE: &str = "TOO_LARGE";
    /// The call's outcome, stored in the bucket, is over
    /// [`super::MAX_STORED_OUTCOME_BYTES`]: it was not read.
    pub const RESULT_TOO_LARGE: &str = "RESULT_TOO_LARGE";
    pub const IO: &str = "IO_ERROR";
    /// The call would be destructive (a `file_write` over an existing file
    /// with other content) and was not approved: it did not run.
    pub const APPROVAL_REQUIRED: &str = "APPROVAL_REQUIRED";
}

/// A call's outcome, inline or (when larger than a queue message allows)
/// in the payload bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "where", rename_all = "snake_case")]
pub enum ResultBody {
    Inline {
        outcome: CallOutcome,
    },
    /// `sha256` (hex) of the stored text, so a stored answer changed
    /// after it was sealed is refused.
    Stored {
        key: String,
        #[serde(default)]
        sha256: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_with_their_tags() {
        let inv = Invocation {
            run_id: "r".into(),
            tenant: "t".into(),
            agent: "coder".into(),
            generation: 2,
            step: 1,
            call_id: "c".into(),
            attempt: 1,
            skill: "shell_exec".into(),
            args: json!({"command": "true"}),
            timeout_s: 5,
            approved: false,
            judge_effects: false,
            program: None,
        };
        let m = HandMessage::Invoke(inv.clone());
        let text = serde_json::to_string(&m).unwrap();
        assert!(text.contains(r#""type":"invoke""#), "{text}");
        assert_eq!(serde_json::from_str::<HandMessage>(&text).unwrap(), m);
        let o = CallOutcome::error(codes::OOM, "killed");
        assert!(o.failed());
        let text = serde_json::to_string(&o).unwrap();
        assert!(text.contains(r#""kind":"finished""#));
        assert!(!CallOutcome::Finished {
            result: json!({"exit_code": 1})
        }
        .failed());
    }
}
