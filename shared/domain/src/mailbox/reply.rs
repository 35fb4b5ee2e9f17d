//! The reply to a mail that started a Run: built by a real message builder
//! (`mail-builder`), threaded (`In-Reply-To`, `References`), marked
//! `Auto-Submitted: auto-replied` (RFC 3834: nothing automatic answers
//! it), its subject `Re: ` once; and the record of each reply sent, by
//! its `Message-ID`: how a mail answering it finds its conversation, and
//! how a reply is sent once when its sending is retried.

use mail_builder::headers::raw::Raw;
use mail_builder::MessageBuilder;
use serde::{Deserialize, Serialize};

use super::mail::InboundMail;

/// What a reply needs of the mail it answers (a Run keeps it in its
/// trigger).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Original {
    pub from: String,
    pub subject: String,
    pub message_id: Option<String>,
    /// The ids a reply names in `References`.
    pub thread: Vec<String>,
}

impl From<&InboundMail> for Original {
    fn from(m: &InboundMail) -> Original {
        Original {
            from: m.from.clone(),
            subject: m.subject.clone(),
            message_id: m.message_id.clone(),
            thread: m.thread(),
        }
    }
}

/// `Re: <subject>`, never `Re: Re:` (nor `RE:`, `re:` …).
pub fn reply_subject(subject: &str) -> String {
    let mut rest = subject.trim();
    loop {
        let lower = rest.to_ascii_lowercase();
        match lower.strip_prefix("re:") {
            Some(_) => rest = rest[3..].trim_start(),
            None => break,
        }
    }
    format!("Re: {rest}")
}

/// The `Message-ID` of the reply to Run `run_id`'s mail (without
/// brackets): the same each time its sending is tried, so a receiver sees
/// a retried reply as the same message.
pub fn reply_message_id(run_id: &str, domain: &str) -> String {
    format!("{run_id}@{domain}")
}

/// The reply to `original` from `from`, saying `body`, with the id
/// `message_id` (without brackets): the message as sent (`.eml`).
pub fn build(original: &Original, from: &str, message_id: &str, body: &str) -> String {
    let mut m = MessageBuilder::new()
        .from(from)
        .to(original.from.as_str())
        .subject(reply_subject(&original.subject))
        .message_id(message_id)
        .header("Auto-Submitted", Raw::new("auto-replied"))
        .text_body(body);
    if let Some(id) = &original.message_id {
        m = m.in_reply_to(id.as_str());
    }
    if !original.thread.is_empty() {
        let refs: Vec<&str> = original.thread.iter().map(String::as_str).collect();
        m = m.references(refs.as_slice());
    }
    // Writing to memory cannot fail.
    m.write_to_string().unwrap_or_default()
}

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplyState {
    /// Claimed: being sent (a retry sends it again, with the same id).
    Sending,
    Sent,
}

/// A reply of a mailbox, by its `Message-ID`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyRecord {
    /// Without brackets.
    pub message_id: String,
    pub mailbox_id: String,
    pub tenant: String,
    pub run_id: String,
    /// The conversation a mail answering it continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Whom it went to: only they continue the conversation.
    pub to: String,
    state: ReplyState,
    pub created_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at_ms: Option<i64>,
}

/// What a reply's machine is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyEvent {
    /// The mail provider accepted it.
    Sent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the reply was sent already")]
pub struct SentAlready;

impl ReplyRecord {
    /// A reply about to be sent.
    pub fn sending(
        message_id: &str,
        mailbox_id: &str,
        tenant: &str,
        run_id: &str,
        session_id: Option<&str>,
        to: &str,
        now_ms: i64,
    ) -> ReplyRecord {
        ReplyRecord {
            message_id: message_id.to_string(),
            mailbox_id: mailbox_id.to_string(),
            tenant: tenant.to_string(),
            run_id: run_id.to_string(),
            session_id: session_id.map(str::to_string),
            to: to.to_ascii_lowercase(),
            state: ReplyState::Sending,
            created_at_ms: now_ms,
            sent_at_ms: None,
        }
    }

    pub fn state(&self) -> ReplyState {
        self.state
    }
}

impl crate::machine::Machine for ReplyRecord {
    type Event = ReplyEvent;
    type Action = std::convert::Infallible;
    type Refusal = SentAlready;
    /// Written while it is still being sent.
    type Version = ReplyState;

    fn apply(&mut self, event: ReplyEvent, now_ms: i64) -> Result<Vec<Self::Action>, SentAlready> {
        match (self.state, event) {
            (ReplyState::Sent, ReplyEvent::Sent) => Err(SentAlready),
            (ReplyState::Sending, ReplyEvent::Sent) => {
                self.state = ReplyState::Sent;
                self.sent_at_ms = Some(now_ms);
                Ok(vec![])
            }
        }
    }

    fn version(&self) -> ReplyState {
        self.state
    }
}

/// What a reply says: the Run's output, or, when it did not complete, a
/// short note naming the Run (its error's code, never its detail: the
/// sender is outside the tenant).
pub fn reply_body(run_id: &str, completed: bool, output: &str, error_code: Option<&str>) -> String {
    if completed {
        return output.to_string();
    }
    match error_code {
        Some(code) => format!(
            "Your message could not be answered (run {run_id} ended: {code}). Please try again later."
        ),
        None => format!("Your message could not be answered (run {run_id} did not complete)."),
    }
}
