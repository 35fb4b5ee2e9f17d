//! Human approvals (ARCHITECTURE §6, seed 000 §B). One [`Approval`] per
//! gated tool call: created with the commit that parks its Run in
//! `AWAITING_HITL`, decided once (approve, reject, expire or cancel) by
//! [`Approval::decide`] and its siblings, each a conditional write on the
//! version read, then applied once to its call by the Run's harness.
//!
//! - [`policy`]: which calls need approval ([`policy::gate`])
//! - this module: the record, its transitions, its tokens, its view

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::crypto::{digest_eq, sha256_hex};
use crate::skills::Risk;

pub mod notice;
pub mod policy;

pub use policy::{ApprovalPolicy, OnReject};

/// Stable codes of the approval vocabulary.
pub mod codes {
    /// The approval was decided (or expired, or cancelled) before.
    pub const APPROVAL_DECIDED: &str = "APPROVAL_DECIDED";
    /// Its deadline passed: it counts as a rejection.
    pub const APPROVAL_EXPIRED: &str = "APPROVAL_EXPIRED";
    /// A human rejected the call.
    pub const APPROVAL_REJECTED: &str = "APPROVAL_REJECTED";
    /// Its Run ended (cancelled) while it waited.
    pub const APPROVAL_CANCELLED: &str = "APPROVAL_CANCELLED";
    /// The key that started the Run may not let it go on (approve, retry,
    /// happened).
    pub const SELF_APPROVAL: &str = "SELF_APPROVAL_FORBIDDEN";
    /// A verdict this approval does not take (approve on an uncertain call).
    pub const INVALID_DECISION: &str = "INVALID_DECISION";
    /// The Run failed: a call's effect is unknown and a human said so.
    pub const TOOL_INDETERMINATE: &str = "TOOL_INDETERMINATE";
    /// The link's token is not this approval's, was used, or expired.
    pub const TOKEN_INVALID: &str = "APPROVAL_TOKEN_INVALID";
    /// A tenant key without the `approver` role.
    pub const NOT_AN_APPROVER: &str = "NOT_AN_APPROVER";
}

/// The recipient name of the token sent to the chat webhook.
pub const CHAT_RECIPIENT: &str = "chat";

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    Pending,
    Approved,
    Rejected,
    Expired,
    Cancelled,
}

impl ApprovalState {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Rejected => "rejected",
            ApprovalState::Expired => "expired",
            ApprovalState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<ApprovalState> {
        [
            ApprovalState::Pending,
            ApprovalState::Approved,
            ApprovalState::Rejected,
            ApprovalState::Expired,
            ApprovalState::Cancelled,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }
}

/// What an approval asks.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalKind {
    /// May a risky call run? (approve | reject)
    #[default]
    Gate,
    /// A call's sandbox was lost after it was sent: did it happen?
    /// (happened, with its result | retry | fail)
    Indeterminate,
}

/// A human's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Verdict {
    Approve,
    Reject,
    /// The uncertain call did take effect; `result` is what it returned.
    Happened {
        result: Value,
    },
    /// Send the uncertain call again.
    Retry,
    /// Fail the Run (its call's effect stays unknown).
    Fail,
}

impl Verdict {
    /// A verdict by name; `happened` takes the result the human gives.
    pub fn parse(s: &str, result: Option<Value>) -> Option<Verdict> {
        match s {
            "approve" => Some(Verdict::Approve),
            "reject" => Some(Verdict::Reject),
            "happened" => Some(Verdict::Happened {
                result: result.unwrap_or(Value::Null),
            }),
            "retry" => Some(Verdict::Retry),
            "fail" => Some(Verdict::Fail),
            _ => None,
        }
    }

    /// The verdicts an approval of `kind` takes.
    pub fn fits(&self, kind: ApprovalKind) -> bool {
        match self {
            Verdict::Approve | Verdict::Reject => kind == ApprovalKind::Gate,
            Verdict::Happened { .. } | Verdict::Retry | Verdict::Fail => {
                kind == ApprovalKind::Indeterminate
            }
        }
    }

    /// Whether the Run may go on with the call (approved, or settled as
    /// done or to be retried).
    pub fn goes_on(&self) -> bool {
        matches!(
            self,
            Verdict::Approve | Verdict::Happened { .. } | Verdict::Retry
        )
    }
}

/// Who decides, and how they proved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decider {
    /// A tenant key with the `approver` role.
    Key { key_id: String },
    /// The link's token (its plain text, checked against the stored hashes).
    Token { token: String },
}

/// A link token as stored: only its hash, and whom it was sent to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredToken {
    pub recipient: String,
    pub sha256: String,
    pub minted_at_ms: i64,
}

/// How the decision was made (audited in the Run's events).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// The key id, the token's recipient, or `system`.
    pub by: String,
    /// `key`, `token`, `expiry` or `cancel`.
    pub how: String,
    /// The caller's address, when a person decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    pub at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// One gated tool call waiting for (or having had) a human's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub approval_id: String,
    #[serde(default)]
    pub kind: ApprovalKind,
    pub tenant: String,
    pub run_id: String,
    pub agent: String,
    pub call_id: String,
    /// The Run step that planned the call.
    pub step: u32,
    pub tool: String,
    pub args: Value,
    pub risk: Risk,
    pub reasons: Vec<String>,
    /// Changed only by its machine ([`Approval::apply`]).
    state: ApprovalState,
    /// The key id that started the Run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// The address of the person who started the Run, when known: its
    /// link lets them stop their own work, never let it go on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by_address: Option<String>,
    pub approvers: Vec<String>,
    pub allow_self_approval: bool,
    pub on_reject: OnReject,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_webhook_url: Option<String>,
    #[serde(default)]
    pub tokens: Vec<StoredToken>,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<DecisionRecord>,
    /// The verdict, once decided by a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// Incremented by every write; every write is conditional on it.
    pub version: u64,
}

/// Why an approval refused an event (nothing changed): the domain's
/// reasons, each with its stable code; what a caller answers over HTTP is
/// the caller's to say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalRefusal {
    #[error("the approval expired before it was decided")]
    Expired,
    #[error("the run was cancelled; nothing is left to decide")]
    Cancelled,
    #[error("the approval was already decided: {0}")]
    AlreadyDecided(&'static str),
    /// A verdict of the other kind of approval.
    #[error("decision: this approval takes {0}")]
    WrongDecision(&'static str),
    #[error("this link is not valid for this approval")]
    LinkInvalid,
    /// The key that started the Run, or its starter's own link, would let
    /// it go on.
    #[error("{}", if *.0 { "this link is its run's starter's own: another approver must decide" } else { "the key that started the run cannot let its own run go on: another approver must decide" })]
    SelfApproval(bool),
    #[error("not overdue")]
    NotOverdue,
}

impl ApprovalRefusal {
    /// The stable code of the refusal.
    pub fn code(&self) -> &'static str {
        match self {
            ApprovalRefusal::Expired => codes::APPROVAL_EXPIRED,
            ApprovalRefusal::NotOverdue => codes::APPROVAL_DECIDED,
            ApprovalRefusal::Cancelled => codes::APPROVAL_CANCELLED,
            ApprovalRefusal::AlreadyDecided(_) => codes::APPROVAL_DECIDED,
            ApprovalRefusal::WrongDecision(_) => codes::INVALID_DECISION,
            ApprovalRefusal::LinkInvalid => codes::TOKEN_INVALID,
            ApprovalRefusal::SelfApproval(_) => codes::SELF_APPROVAL,
        }
    }
}

/// What an approval's machine is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalEvent {
    /// A link token was minted for `recipient` (the plain token: only
    /// its hash is kept; a link whose sending failed is void).
    MintToken { recipient: String, token: String },
    /// A person decided.
    Decide {
        verdict: Verdict,
        by: Decider,
        from: Option<String>,
        comment: Option<String>,
    },
    /// Its deadline passed with no decision.
    Expire,
    /// Its Run ended while it waited.
    Cancel,
}

/// What the handler does after an approval's event is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalAction {
    /// Send the link with `token` to `recipient`.
    SendLink { recipient: String, token: String },
    /// Tell the Run (its harness applies decided approvals, each once).
    ResumeRun,
}

impl crate::machine::Machine for Approval {
    type Event = ApprovalEvent;
    type Action = ApprovalAction;
    type Refusal = ApprovalRefusal;
    type Version = u64;

    fn apply(
        &mut self,
        event: ApprovalEvent,
        now_ms: i64,
    ) -> Result<Vec<ApprovalAction>, ApprovalRefusal> {
        match event {
            ApprovalEvent::MintToken { recipient, token } => {
                self.mint_token(&recipient, &token, now_ms)?;
                Ok(vec![ApprovalAction::SendLink { recipient, token }])
            }
            ApprovalEvent::Decide {
                verdict,
                by,
                from,
                comment,
            } => {
                self.decide(verdict, &by, from, comment, now_ms)?;
                Ok(vec![ApprovalAction::ResumeRun])
            }
            ApprovalEvent::Expire => {
                self.expire(now_ms)?;
                Ok(vec![ApprovalAction::ResumeRun])
            }
            ApprovalEvent::Cancel => {
                self.cancel(now_ms)?;
                Ok(vec![])
            }
        }
    }

    fn version(&self) -> u64 {
        self.version
    }
}

/// A call to approve, as the harness asks for it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    pub kind: ApprovalKind,
    pub call_id: String,
    pub tool: String,
    pub args: Value,
    pub risk: Risk,
    pub reasons: Vec<String>,
}

/// A fresh link token: 256 random bits, hex. Only its hash is stored.
pub fn new_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The approval id of a Run's call: derived, so a redelivered step that
/// asks again names the same approval.
pub fn approval_id(run_id: &str, call_id: &str) -> String {
    let h = sha256_hex(format!("{run_id}\n{call_id}").as_bytes());
    format!("apv_{}", &h[..24])
}

impl Approval {
    /// Where the approval is: pending until decided, expired or cancelled.
    pub fn state(&self) -> ApprovalState {
        self.state
    }

    /// A pending approval of `req`, made by the Run `run_id` of `tenant`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        tenant: &str,
        run_id: &str,
        agent: &str,
        step: u32,
        requested_by: Option<String>,
        policy: &ApprovalPolicy,
        req: ApprovalRequest,
        now_ms: i64,
    ) -> Approval {
        let id = match req.kind {
            ApprovalKind::Gate => approval_id(run_id, &req.call_id),
            ApprovalKind::Indeterminate => approval_id(run_id, &format!("{}#lost", req.call_id)),
        };
        Approval {
            approval_id: id,
            kind: req.kind,
            tenant: tenant.to_string(),
            run_id: run_id.to_string(),
            agent: agent.to_string(),
            call_id: req.call_id,
            step,
            tool: req.tool,
            args: req.args,
            risk: req.risk,
            reasons: req.reasons,
            state: ApprovalState::Pending,
            requested_by,
            requested_by_address: None,
            approvers: policy.approvers.clone(),
            allow_self_approval: policy.allow_self_approval,
            on_reject: policy.on_reject,
            chat_webhook_url: policy.chat_webhook_url.clone(),
            tokens: vec![],
            created_at_ms: now_ms,
            expires_at_ms: now_ms + policy.expires_s as i64 * 1000,
            decision: None,
            verdict: None,
            version: 0,
        }
    }

    /// Whom a link is sent to: every approver, and the chat webhook.
    pub fn recipients(&self) -> Vec<String> {
        let mut r = self.approvers.clone();
        if self.chat_webhook_url.is_some() {
            r.push(CHAT_RECIPIENT.to_string());
        }
        r
    }

    /// Whether the deadline has passed (a pending approval then only
    /// expires).
    pub fn is_overdue(&self, now_ms: i64) -> bool {
        now_ms >= self.expires_at_ms
    }

    /// Records the hash of a freshly minted link token for `recipient`
    /// (replacing any earlier one: a link whose sending failed is void).
    pub(crate) fn mint_token(
        &mut self,
        recipient: &str,
        token: &str,
        now_ms: i64,
    ) -> Result<(), ApprovalRefusal> {
        self.pending(now_ms)?;
        self.tokens.retain(|t| t.recipient != recipient);
        self.tokens.push(StoredToken {
            recipient: recipient.to_string(),
            sha256: sha256_hex(token.as_bytes()),
            minted_at_ms: now_ms,
        });
        self.version += 1;
        Ok(())
    }

    /// The recipient a link token was sent to, if it is one of this
    /// approval's (compared in constant time).
    pub fn token_recipient(&self, token: &str) -> Option<&str> {
        let h = sha256_hex(token.as_bytes());
        let mut found = None;
        for t in &self.tokens {
            if digest_eq(&t.sha256, &h) {
                found = Some(t.recipient.as_str());
            }
        }
        found
    }

    fn pending(&self, now_ms: i64) -> Result<(), ApprovalRefusal> {
        match self.state {
            ApprovalState::Pending if self.is_overdue(now_ms) => Err(ApprovalRefusal::Expired),
            ApprovalState::Pending => Ok(()),
            ApprovalState::Cancelled => Err(ApprovalRefusal::Cancelled),
            ApprovalState::Expired => Err(ApprovalRefusal::Expired),
            decided => Err(ApprovalRefusal::AlreadyDecided(decided.as_str())),
        }
    }

    /// A human's decision. A token must be one of this approval's (a used
    /// one matches, but the approval is decided); a key is checked for its
    /// role by the caller, and here for self-approval: the key that started
    /// the Run may reject or fail its own calls, never approve, retry or
    /// settle them as happened (unless the agent allows self-approval).
    pub(crate) fn decide(
        &mut self,
        verdict: Verdict,
        by: &Decider,
        from: Option<String>,
        comment: Option<String>,
        now_ms: i64,
    ) -> Result<(), ApprovalRefusal> {
        if !verdict.fits(self.kind) {
            let what = match self.kind {
                ApprovalKind::Gate => "approve or reject",
                ApprovalKind::Indeterminate => "happened (with its result), retry or fail",
            };
            return Err(ApprovalRefusal::WrongDecision(what));
        }
        let (who, how) = match by {
            Decider::Token { token } => {
                let Some(r) = self.token_recipient(token) else {
                    return Err(ApprovalRefusal::LinkInvalid);
                };
                // Four eyes through links too: the starter's own address
                // (among the approvers) may stop its Run, not let it go on.
                let own = self
                    .requested_by_address
                    .as_deref()
                    .is_some_and(|a| a.eq_ignore_ascii_case(r));
                if own && verdict.goes_on() && !self.allow_self_approval {
                    return Err(ApprovalRefusal::SelfApproval(true));
                }
                (r.to_string(), "token")
            }
            Decider::Key { key_id } => {
                // Four eyes: whatever made the Run ask (a risk, `medium:
                // approve`, `require`, an unknown outcome), the key that
                // started it gets what it wanted only from a second
                // person, unless the agent allows it. Stopping one's own
                // work (reject, fail) is always allowed.
                let own = self.requested_by.as_deref() == Some(key_id.as_str());
                if own && verdict.goes_on() && !self.allow_self_approval {
                    return Err(ApprovalRefusal::SelfApproval(false));
                }
                (key_id.clone(), "key")
            }
        };
        self.pending(now_ms)?;
        self.state = if verdict.goes_on() {
            ApprovalState::Approved
        } else {
            ApprovalState::Rejected
        };
        self.verdict = Some(verdict);
        self.close(who, how, from, comment, now_ms);
        Ok(())
    }

    /// The deadline passed with no decision.
    pub(crate) fn expire(&mut self, now_ms: i64) -> Result<(), ApprovalRefusal> {
        if self.state != ApprovalState::Pending || !self.is_overdue(now_ms) {
            return Err(ApprovalRefusal::NotOverdue);
        }
        self.state = ApprovalState::Expired;
        self.close("system".into(), "expiry", None, None, now_ms);
        Ok(())
    }

    /// Its Run ended while it waited.
    pub(crate) fn cancel(&mut self, now_ms: i64) -> Result<(), ApprovalRefusal> {
        if self.state != ApprovalState::Pending {
            return Err(ApprovalRefusal::AlreadyDecided(self.state.as_str()));
        }
        self.state = ApprovalState::Cancelled;
        self.close("system".into(), "cancel", None, None, now_ms);
        Ok(())
    }

    fn close(
        &mut self,
        by: String,
        how: &str,
        from: Option<String>,
        comment: Option<String>,
        at_ms: i64,
    ) {
        self.decision = Some(DecisionRecord {
            by,
            how: how.to_string(),
            from,
            at_ms,
            comment,
        });
        self.version += 1;
    }

    /// The call's error result when it will not run (rejected, expired,
    /// cancelled), else `None`.
    pub fn refusal(&self) -> Option<(&'static str, String)> {
        let comment = self
            .decision
            .as_ref()
            .and_then(|d| d.comment.as_deref())
            .map(|c| format!(" (comment: {c})"))
            .unwrap_or_default();
        if self.kind == ApprovalKind::Indeterminate {
            return match self.state {
                ApprovalState::Pending | ApprovalState::Approved => None,
                other => Some((
                    codes::TOOL_INDETERMINATE,
                    format!(
                        "the sandbox running {} was lost and its effect is unknown; the question was {}{comment}",
                        self.tool,
                        match other {
                            ApprovalState::Expired => "not answered in time",
                            ApprovalState::Cancelled => "dropped with the run",
                            _ => "answered: fail",
                        }
                    ),
                )),
            };
        }
        match self.state {
            ApprovalState::Pending | ApprovalState::Approved => None,
            ApprovalState::Rejected => Some((
                codes::APPROVAL_REJECTED,
                format!("a human rejected the call to {}{comment}", self.tool),
            )),
            ApprovalState::Expired => Some((
                codes::APPROVAL_EXPIRED,
                format!(
                    "no one decided on the call to {} before its approval expired",
                    self.tool
                ),
            )),
            ApprovalState::Cancelled => Some((
                codes::APPROVAL_CANCELLED,
                "the run was cancelled".to_string(),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
