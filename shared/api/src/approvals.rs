//! `/v1/approvals`: human decisions on risky or uncertain tool calls.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use armada_domain::approval::{Approval, ApprovalKind, ApprovalState, Verdict};
use armada_domain::skills::Risk;

/// An approval as its tenant sees it (never its links' token hashes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalView {
    pub approval_id: String,
    pub kind: ApprovalKind,
    pub run_id: String,
    pub agent: String,
    pub call_id: String,
    pub tool: String,
    #[schema(value_type = Object)]
    pub args: Value,
    pub risk: Risk,
    pub reasons: Vec<String>,
    pub state: ApprovalState,
    /// The key id that started the Run.
    pub requested_by: Option<String>,
    pub approvers: Vec<String>,
    pub created_at: String,
    pub expires_at: String,
    /// Once decided: the key id, the link's recipient, or `system`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// `key`, `token`, `expiry` or `cancel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_how: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    /// The decider's address, as the gateway saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// For an uncertain call decided `happened`: what it returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

impl ApprovalView {
    /// The approval as the API shows it, times as `rfc3339` writes them.
    pub fn of(a: &Approval, rfc3339: impl Fn(i64) -> String) -> Self {
        let d = a.decision.as_ref();
        ApprovalView {
            approval_id: a.approval_id.clone(),
            kind: a.kind,
            run_id: a.run_id.clone(),
            agent: a.agent.clone(),
            call_id: a.call_id.clone(),
            tool: a.tool.clone(),
            args: a.args.clone(),
            risk: a.risk,
            reasons: a.reasons.clone(),
            state: a.state(),
            requested_by: a.requested_by.clone(),
            approvers: a.approvers.clone(),
            created_at: rfc3339(a.created_at_ms),
            expires_at: rfc3339(a.expires_at_ms),
            decided_by: d.map(|d| d.by.clone()),
            decided_how: d.map(|d| d.how.clone()),
            decided_at: d.map(|d| rfc3339(d.at_ms)),
            decided_from: d.and_then(|d| d.from.clone()),
            comment: d.and_then(|d| d.comment.clone()),
            result: match (&a.verdict, d) {
                (Some(Verdict::Happened { result }), Some(_)) => Some(result.clone()),
                _ => None,
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalList {
    pub approvals: Vec<ApprovalView>,
}

/// `GET /v1/approvals`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ApprovalsQuery {
    /// `pending`, `approved`, `rejected`, `expired` or `cancelled`.
    #[serde(default)]
    pub state: Option<String>,
    /// 1-200; 50 by default.
    #[serde(default)]
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

/// `POST /v1/approvals/{approval_id}/decision`, by an approver's key or by
/// a link's `token` instead of a key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// `approve` or `reject`; for an uncertain call `happened` (with
    /// `result`), `retry` or `fail`.
    #[schema(pattern = "^(approve|reject|happened|retry|fail)$")]
    pub decision: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use armada_domain::approval::policy::ApprovalPolicy;
    use armada_domain::approval::{ApprovalEvent, ApprovalRequest, Decider};
    use armada_domain::machine::Machine;
    use serde_json::json;

    #[test]
    fn the_view_shows_no_token_hashes() {
        let policy = ApprovalPolicy {
            approvers: vec!["ops@example.com".into()],
            expires_s: 60,
            ..ApprovalPolicy::default()
        };
        let req = ApprovalRequest {
            kind: Default::default(),
            call_id: "c1".into(),
            tool: "deploy".into(),
            args: json!({"env": "prod"}),
            risk: Risk::High,
            reasons: vec!["deploy is a high-risk skill".into()],
        };
        let mut a = Approval::new(
            "t",
            "run_1",
            "ops",
            2,
            Some("k".into()),
            &policy,
            req,
            1_000,
        );
        let minted = ApprovalEvent::MintToken {
            recipient: "ops@example.com".into(),
            token: "tok".into(),
        };
        a.apply(minted, 1_000).unwrap();
        let decided = ApprovalEvent::Decide {
            verdict: Verdict::Approve,
            by: Decider::Key {
                key_id: "key_boss".into(),
            },
            from: None,
            comment: Some("ok".into()),
        };
        a.apply(decided, 2_000).unwrap();
        let v = serde_json::to_value(ApprovalView::of(&a, |ms| ms.to_string())).unwrap();
        assert_eq!(v["state"], "approved");
        assert_eq!(v["decided_by"], "key_boss");
        assert_eq!(v["comment"], "ok");
        assert_eq!(v["expires_at"], "61000");
        assert!(!v.to_string().contains(&a.tokens[0].sha256));
    }
}
