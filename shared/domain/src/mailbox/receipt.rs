//! The record of a message a mailbox received, and how it was answered:
//! kept for `GET /v1/mailboxes/{id}/deliveries` (its body is not: a Run
//! that started has it in its input, its attachments as its artifacts).

use serde::{Deserialize, Serialize};

/// How a received message was answered.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MailOutcome {
    /// Received; not answered yet.
    Received,
    /// A Run started (a new conversation, or the next message of one).
    Started,
    /// A repeat of a message that started a Run: the first Run.
    Duplicate,
    /// Nothing runs and nothing is answered: a sender the mailbox does
    /// not allow, automatic mail, the stack's own, or mail SES's checks
    /// did not pass.
    Refused,
    /// Over the mailbox's `max_runs_per_hour`.
    RateLimited,
    /// The mailbox is disabled.
    Disabled,
    /// Allowed but not started (unreadable, its template failed, the Run
    /// was refused).
    Rejected,
}

/// One message a mailbox received.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailReceipt {
    pub mail_id: String,
    pub mailbox_id: String,
    pub tenant: String,
    pub received_at_ms: i64,
    /// `From`'s address (or the envelope sender's, when unreadable).
    pub from: String,
    pub subject: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    outcome: MailOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Why it started nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How a received message ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiptEvent {
    Started { run_id: String },
    Duplicate { run_id: String },
    Refused { reason: String },
    RateLimited,
    Disabled,
    Rejected { reason: String },
}

/// A message is answered once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the message was answered already ({0:?})")]
pub struct AnsweredAlready(pub MailOutcome);

impl MailReceipt {
    pub fn received(
        mail_id: &str,
        mailbox_id: &str,
        tenant: &str,
        from: &str,
        subject: &str,
        message_id: Option<&str>,
        now_ms: i64,
    ) -> MailReceipt {
        MailReceipt {
            mail_id: mail_id.to_string(),
            mailbox_id: mailbox_id.to_string(),
            tenant: tenant.to_string(),
            received_at_ms: now_ms,
            from: from.to_string(),
            subject: subject.to_string(),
            message_id: message_id.map(str::to_string),
            outcome: MailOutcome::Received,
            run_id: None,
            reason: None,
        }
    }

    pub fn outcome(&self) -> MailOutcome {
        self.outcome
    }
}

impl crate::machine::Machine for MailReceipt {
    type Event = ReceiptEvent;
    /// The answer is a record; nothing follows it.
    type Action = std::convert::Infallible;
    type Refusal = AnsweredAlready;
    /// Written once, when answered.
    type Version = ();

    fn apply(
        &mut self,
        event: ReceiptEvent,
        _now_ms: i64,
    ) -> Result<Vec<Self::Action>, AnsweredAlready> {
        if self.outcome != MailOutcome::Received {
            return Err(AnsweredAlready(self.outcome));
        }
        let (outcome, run_id, reason) = match event {
            ReceiptEvent::Started { run_id } => (MailOutcome::Started, Some(run_id), None),
            ReceiptEvent::Duplicate { run_id } => (MailOutcome::Duplicate, Some(run_id), None),
            ReceiptEvent::Refused { reason } => (MailOutcome::Refused, None, Some(reason)),
            ReceiptEvent::RateLimited => (
                MailOutcome::RateLimited,
                None,
                Some("MAILBOX_RATE_LIMITED: over the mailbox's max_runs_per_hour".into()),
            ),
            ReceiptEvent::Disabled => (
                MailOutcome::Disabled,
                None,
                Some("MAILBOX_DISABLED: the mailbox is disabled".into()),
            ),
            ReceiptEvent::Rejected { reason } => (MailOutcome::Rejected, None, Some(reason)),
        };
        self.outcome = outcome;
        self.run_id = run_id;
        self.reason = reason;
        Ok(vec![])
    }

    fn version(&self) {}
}
