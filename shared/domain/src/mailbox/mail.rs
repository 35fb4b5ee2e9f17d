//! An inbound message, as a real MIME parser reads it (`mail-parser`:
//! multipart, quoted-printable, base64, charsets, HTML turned to text when
//! there is no text part), and whether it may start a Run: its sender must
//! be one the mailbox allows (both `From` and the envelope sender), and
//! mail that is automatic (RFC 3834) or the stack's own starts nothing, so
//! two auto-responders never answer each other forever.

use mail_parser::{MessageParser, MimeHeaders};

use super::Mailbox;

/// A message that cannot be read as mail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unreadable(pub String);

/// An attachment: stored as the Run's artifact and listed in its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub name: String,
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// What a message says, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundMail {
    /// `From`'s address, lower-cased.
    pub from: String,
    /// The envelope sender (SMTP `MAIL FROM`), lower-cased, when known.
    pub envelope_from: Option<String>,
    pub subject: String,
    /// Without its angle brackets.
    pub message_id: Option<String>,
    pub in_reply_to: Vec<String>,
    pub references: Vec<String>,
    /// The text part, or the HTML part as text.
    pub text: String,
    pub attachments: Vec<Attachment>,
    /// `Auto-Submitted` other than `no`, or `Precedence: bulk|junk|list`.
    pub automatic: bool,
}

/// Whether a message starts a Run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MailVerdict {
    Start,
    /// Nothing runs; why (recorded, never answered: a reply to a refused
    /// sender would be backscatter).
    Refused(String),
}

fn ids(v: &mail_parser::HeaderValue<'_>) -> Vec<String> {
    match v {
        mail_parser::HeaderValue::Text(t) => vec![t.to_string()],
        mail_parser::HeaderValue::TextList(l) => l.iter().map(|t| t.to_string()).collect(),
        _ => vec![],
    }
}

impl InboundMail {
    pub fn parse(raw: &[u8], envelope_from: Option<&str>) -> Result<InboundMail, Unreadable> {
        let msg = MessageParser::default()
            .parse(raw)
            .ok_or_else(|| Unreadable("not a message".into()))?;
        let from = msg
            .from()
            .and_then(|a| a.first())
            .and_then(|a| a.address())
            .map(str::to_ascii_lowercase)
            .ok_or_else(|| Unreadable("the message has no From address".into()))?;
        let header = |name: &str| msg.header_raw(name).map(|v| v.trim().to_ascii_lowercase());
        let automatic = header("Auto-Submitted").is_some_and(|v| v != "no")
            || header("Precedence").is_some_and(|v| matches!(v.as_str(), "bulk" | "junk" | "list"));
        let attachments = msg
            .attachments()
            .map(|part| Attachment {
                name: part.attachment_name().unwrap_or("attachment").to_string(),
                content_type: part
                    .content_type()
                    .map(|ct| match ct.subtype() {
                        Some(sub) => format!("{}/{sub}", ct.ctype()),
                        None => ct.ctype().to_string(),
                    })
                    .unwrap_or_else(|| "application/octet-stream".into()),
                bytes: part.contents().to_vec(),
            })
            .collect();
        Ok(InboundMail {
            from,
            envelope_from: envelope_from
                .map(|e| e.trim().trim_matches(['<', '>']).to_ascii_lowercase())
                .filter(|e| !e.is_empty()),
            subject: msg.subject().unwrap_or_default().to_string(),
            message_id: msg.message_id().map(str::to_string),
            in_reply_to: ids(msg.in_reply_to()),
            references: ids(msg.references()),
            text: msg.body_text(0).map(|t| t.into_owned()).unwrap_or_default(),
            attachments,
            automatic,
        })
    }

    /// Whether it starts a Run of `mailbox`, whose own addresses (and
    /// domains, as `@domain`) are `own`: mail from them would be a loop.
    pub fn verdict(&self, mailbox: &Mailbox, own: &[&str]) -> MailVerdict {
        let is_own = |a: &str| {
            own.iter().any(|o| match o.strip_prefix('@') {
                Some(domain) => a
                    .rsplit_once('@')
                    .is_some_and(|(_, d)| d.eq_ignore_ascii_case(domain)),
                None => o.eq_ignore_ascii_case(a),
            })
        };
        if is_own(&self.from) || self.envelope_from.as_deref().is_some_and(is_own) {
            return MailVerdict::Refused("mail from the stack itself".into());
        }
        if self.automatic {
            return MailVerdict::Refused("automatic mail (RFC 3834): nothing answers it".into());
        }
        let senders = [Some(self.from.as_str()), self.envelope_from.as_deref()];
        if let Some(stranger) = senders
            .into_iter()
            .flatten()
            .find(|s| !mailbox.spec.allows(s))
        {
            return MailVerdict::Refused(format!("{stranger} is not an allowed sender"));
        }
        MailVerdict::Start
    }

    /// The ids a reply to it names: its own, after those it names.
    pub fn thread(&self) -> Vec<String> {
        let mut refs = self.references.clone();
        if refs.is_empty() {
            refs.extend(self.in_reply_to.iter().cloned());
        }
        refs.extend(self.message_id.iter().cloned());
        refs
    }
}
