//! Mailboxes: a tenant's addresses of the deployment's inbound domain
//! (created, read, changed and deleted with a key), and the mail each
//! received (no key: SES, or the local listener, stored it).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use armada_domain::mailbox::receipt::MailOutcome;

/// `POST /v1/mailboxes`: exactly one of `agent` and `team`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "support", "agent": "helper", "allow_senders": ["alice@example.com", "@example.com"]}))]
pub struct CreateMailboxBody {
    /// The address's local part: `<name>@<the deployment's inbound domain>`.
    #[schema(pattern = "^[a-z0-9_-][a-z0-9._-]{0,63}$")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    pub team: Option<String>,
    /// Who may write: addresses and `@domain`s. Both `From` and the
    /// envelope sender must be allowed.
    #[schema(min_items = 1, max_items = 100)]
    pub allow_senders: Vec<String>,
    /// MiniJinja over `{mail: {from, subject, text, message_id,
    /// attachments}, mailbox: {mailbox_id, address}}`. Without one: the
    /// sender, the subject, the text and the attachments listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 16384)]
    pub input_template: Option<String>,
    /// Whether the Run's answer is mailed back (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<bool>,
    /// Default 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 3600)]
    pub max_runs_per_hour: Option<u32>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `PATCH /v1/mailboxes/{mailbox_id}`: any field but `name`; `null`
/// clears `input_template`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchMailboxBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_senders: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable)]
    pub input_template: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runs_per_hour: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// A mailbox, as its tenant reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MailboxView {
    pub mailbox_id: String,
    /// Where to write: unique across the deployment.
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    pub allow_senders: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_template: Option<String>,
    pub reply: bool,
    pub max_runs_per_hour: u32,
    pub enabled: bool,
    pub created_at: String,
    pub updated_at: String,
    pub version: u64,
}

/// `201`: the mailbox and its address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MailboxCreated {
    pub mailbox_id: String,
    pub address: String,
    pub mailbox: MailboxView,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MailboxesPage {
    pub mailboxes: Vec<MailboxView>,
}

/// A message a mailbox received and how it was answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MailView {
    pub mail_id: String,
    pub received_at: String,
    pub from: String,
    pub subject: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    pub outcome: MailOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MailPage {
    pub deliveries: Vec<MailView>,
}
