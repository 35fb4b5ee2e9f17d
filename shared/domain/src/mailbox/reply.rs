//! The reply to a mail that started a Run: built by a real message builder
//! (`mail-builder`), threaded (`In-Reply-To`, `References`), marked
//! `Auto-Submitted: auto-replied` (RFC 3834: nothing automatic answers
//! it), its subject `Re: ` once.

use mail_builder::headers::raw::Raw;
use mail_builder::MessageBuilder;

use super::mail::InboundMail;

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

/// The reply to `original` from `from`, saying `body`, with the id
/// `message_id` (without brackets): the message as sent (`.eml`).
pub fn build(original: &InboundMail, from: &str, message_id: &str, body: &str) -> String {
    let thread = original.thread();
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
    if !thread.is_empty() {
        let refs: Vec<&str> = thread.iter().map(String::as_str).collect();
        m = m.references(refs.as_slice());
    }
    // Writing to memory cannot fail.
    m.write_to_string().unwrap_or_default()
}
