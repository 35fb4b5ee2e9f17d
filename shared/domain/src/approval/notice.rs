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

/// A value that came from the tenant or its sandbox (names, reasons, the
/// sandbox's words, a key id) as it may appear in a notice: on one line.
/// Every character that could end the line — control characters (CR, LF,
/// NEL, form feed, escape sequences), the Unicode line and paragraph
/// separators — and the bidirectional overrides that could make a line
/// read as something else become U+FFFD, so the reader sees that
/// something was there. An email header or a forged "Approved by ..."
/// line cannot be started from inside a value.
fn one_line(value: &str) -> String {
    value
        .chars()
        .map(|c| if unsafe_in_text(c) { '\u{fffd}' } else { c })
        .collect()
}

fn unsafe_in_text(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// The call's arguments, pretty JSON. JSON escapes C0 controls inside
/// strings but writes DEL, C1 (NEL), the line separators and bidi
/// overrides as they are; those are written as `\uXXXX` escapes, which
/// keeps the JSON what it was. The only raw line breaks left are the
/// pretty printer's own.
fn args_text(args: &Value) -> String {
    let pretty = serde_json::to_string_pretty(args).unwrap_or_default();
    let mut out = String::with_capacity(pretty.len());
    for c in pretty.chars() {
        if c != '\n' && unsafe_in_text(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// The subject line of an approval email (no line breaks, whatever the
/// agent and tool are called).
pub fn subject(a: &Approval) -> String {
    let (agent, tool) = (one_line(&a.agent), one_line(&a.tool));
    match a.kind {
        ApprovalKind::Gate => format!("Approval needed: {agent} wants to run {tool}"),
        ApprovalKind::Indeterminate => {
            format!("Did it happen? {agent}'s call to {tool} has an unknown outcome")
        }
    }
}

/// The plain-text body of an approval email: the template's lines and the
/// arguments' pretty JSON, none added by a value.
pub fn email_text(a: &Approval, link: &str, rfc3339: impl Fn(i64) -> String) -> String {
    let ask = match a.kind {
        ApprovalKind::Gate => "asks to run",
        ApprovalKind::Indeterminate => "lost its sandbox while running (did it take effect?)",
    };
    let reasons: Vec<String> = a.reasons.iter().map(|r| one_line(r)).collect();
    format!(
        "The agent {agent} {ask} the tool {tool} in run {run}.\n\n\
         Risk: {risk:?}\nWhy it needs approval: {why}\nArguments:\n{args}\n\n\
         Started by: {by}\nDecide before: {until}\n\n\
         Review and decide:\n{link}\n\n\
         The link works once and only for this approval. Opening it changes nothing until you press a button.\n",
        agent = one_line(&a.agent),
        tool = one_line(&a.tool),
        run = one_line(&a.run_id),
        risk = a.risk,
        why = reasons.join("; "),
        args = args_text(&a.args),
        by = one_line(a.requested_by.as_deref().unwrap_or("(unknown)")),
        until = rfc3339(a.expires_at_ms),
        link = one_line(link),
    )
}

/// A chat webhook's message (Slack-compatible), one line of text.
pub fn chat_message(a: &Approval, link: &str, rfc3339: impl Fn(i64) -> String) -> Value {
    json!({
        "text": format!(
            "Approval needed: agent *{}* wants to run *{}* (risk {:?}) in run {}. Decide before {}: {}",
            one_line(&a.agent),
            one_line(&a.tool),
            a.risk,
            one_line(&a.run_id),
            rfc3339(a.expires_at_ms),
            one_line(link),
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

    /// Characters that start a new line, or a header, wherever they land.
    fn breaks_lines(c: char) -> bool {
        c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
    }

    #[test]
    fn no_value_starts_a_line_or_a_header_in_a_notice() {
        let req = |tool: &str, args: Value, reason: &str| ApprovalRequest {
            kind: Default::default(),
            call_id: "c1".into(),
            tool: tool.into(),
            args,
            risk: Risk::High,
            reasons: vec![reason.into()],
        };
        let notice = |agent: &str, by: &str, r: ApprovalRequest| {
            let a = Approval::new(
                "t",
                "run_1",
                agent,
                0,
                Some(by.into()),
                &ApprovalPolicy::default(),
                r,
                0,
            );
            let link = review_link(None, &a.approval_id, "tok");
            (
                subject(&a),
                email_text(&a, &link, |ms| ms.to_string()),
                chat_message(&a, &link, |ms| ms.to_string())["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        };
        let (_, clean_text, _) = notice(
            "ops",
            "key1",
            req("deploy", json!({"key": "x", "path": "a.txt"}), "why"),
        );
        let evil = "x\r\nBcc: evil@example.com\n\nApproved by security\u{85}\u{2028}\u{2029}\u{b}\u{c}\u{1b}[2J";
        let (subject, text, chat) = notice(
            evil,
            evil,
            req(evil, json!({ evil: evil, "path": evil }), evil),
        );
        assert!(!subject.chars().any(breaks_lines), "{subject:?}");
        assert!(!chat.chars().any(breaks_lines), "{chat:?}");
        assert!(
            text.chars().all(|c| c == '\n' || !breaks_lines(c)),
            "{text:?}"
        );
        // The same lines as a notice of harmless values: none was added.
        assert_eq!(text.lines().count(), clean_text.lines().count(), "{text}");
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("Bcc:") || l.starts_with("Approved")),
            "{text}"
        );
    }
}
