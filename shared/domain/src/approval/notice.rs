//! What an approver is sent: the review link, an email's subject and text,
//! a chat message (Slack-compatible `{"text": ...}`). Every notice says who
//! wants to do what, at what risk, and until when it can be decided.

use serde_json::{json, Value};

use super::{Approval, ApprovalKind};

/// The review page of `approval_id` for the holder of `token`. Without a
/// public URL (not configured) the link is the path alone.
pub fn review_link(public_url: Option<&str>, approval_id: &str, token: &str) -> String {
    format!(
        "{}/v1/approvals/{approval_id}/review?token={token}",
        public_url.unwrap_or_default()
    )
}

/// The subject line of an approval email (no line breaks, whatever the
/// agent and tool are called).
pub fn subject(a: &Approval) -> String {
    let s = match a.kind {
        ApprovalKind::Gate => format!("Approval needed: {} wants to run {}", a.agent, a.tool),
        ApprovalKind::Indeterminate => format!(
            "Did it happen? {}'s call to {} has an unknown outcome",
            a.agent, a.tool
        ),
    };
    s.chars().filter(|c| !c.is_control()).collect()
}

/// The plain-text body of an approval email.
pub fn email_text(a: &Approval, link: &str, rfc3339: impl Fn(i64) -> String) -> String {
    let args = serde_json::to_string_pretty(&a.args).unwrap_or_default();
    let ask = match a.kind {
        ApprovalKind::Gate => "asks to run",
        ApprovalKind::Indeterminate => "lost its sandbox while running (did it take effect?)",
    };
    format!(
        "The agent {agent} {ask} the tool {tool} in run {run}.\n\n\
         Risk: {risk:?}\nWhy it needs approval: {why}\nArguments:\n{args}\n\n\
         Started by: {by}\nDecide before: {until}\n\n\
         Review and decide:\n{link}\n\n\
         The link works once and only for this approval. Opening it changes nothing until you press a button.\n",
        agent = a.agent,
        tool = a.tool,
        run = a.run_id,
        risk = a.risk,
        why = a.reasons.join("; "),
        by = a.requested_by.as_deref().unwrap_or("(unknown)"),
        until = rfc3339(a.expires_at_ms),
    )
}

/// A chat webhook's message (Slack-compatible).
pub fn chat_message(a: &Approval, link: &str, rfc3339: impl Fn(i64) -> String) -> Value {
    json!({
        "text": format!(
            "Approval needed: agent *{}* wants to run *{}* (risk {:?}) in run {}. Decide before {}: {}",
            a.agent, a.tool, a.risk, a.run_id, rfc3339(a.expires_at_ms), link
        ),
        "approval_id": a.approval_id,
        "run_id": a.run_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::{ApprovalPolicy, ApprovalRequest};
    use crate::skills::Risk;

    #[test]
    fn a_notice_says_who_wants_what_and_links_once() {
        let req = ApprovalRequest {
            kind: Default::default(),
            call_id: "c1".into(),
            tool: "deploy\r\nBcc: x@y.z".into(),
            args: json!({"env": "prod"}),
            risk: Risk::High,
            reasons: vec!["deploy is a high-risk skill".into()],
        };
        let a = Approval::new(
            "t",
            "run_1",
            "ops",
            0,
            Some("key1".into()),
            &ApprovalPolicy::default(),
            req,
            0,
        );
        let link = review_link(Some("https://api.example.com"), &a.approval_id, "tok");
        assert_eq!(
            link,
            format!(
                "https://api.example.com/v1/approvals/{}/review?token=tok",
                a.approval_id
            )
        );
        assert!(!subject(&a).contains('\n') && !subject(&a).contains('\r'));
        let text = email_text(&a, &link, |ms| ms.to_string());
        for part in [
            "ops",
            "run_1",
            "High",
            "\"env\": \"prod\"",
            "key1",
            "86400000",
            &link,
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
        assert!(chat_message(&a, &link, |ms| ms.to_string())["text"]
            .as_str()
            .unwrap()
            .contains(&link));
    }
}
