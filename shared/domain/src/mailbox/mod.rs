//! Mailboxes (scenario H's email): an address of the deployment's inbound
//! domain whose mail, from senders it allows, starts a Run of an agent or
//! a team, answered by a reply in the same thread; a reply to that reply
//! continues the conversation.
//!
//! - this module: the mailbox record, what creates and changes it, its machine
//! - [`mail`]: an inbound message read, and whether it may start a Run
//! - [`notice`]: what SES (or the local listener) says of a message it
//!   received and stored
//! - [`receipt`]: the record of a received message, and how it was answered
//! - [`reply`]: the threaded reply, and its record

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::{parse_target, RunTarget};
use crate::fields::{FieldError, Fields};
use crate::hook::{DEFAULT_MAX_RUNS_PER_HOUR, MAX_RUNS_PER_HOUR_LIMIT};

pub mod mail;
pub mod notice;
pub mod receipt;
pub mod reply;

/// Stable codes of the mailboxes' vocabulary.
pub mod codes {
    /// Another mailbox (of any tenant) has the address.
    pub const ADDRESS_TAKEN: &str = "ADDRESS_TAKEN";
}

/// The most senders a mailbox may allow.
const MAX_SENDERS: usize = 100;

/// The fields `POST /v1/mailboxes` takes.
pub const MAILBOX_FIELDS: &[&str] = &[
    "name",
    "agent",
    "team",
    "allow_senders",
    "input_template",
    "reply",
    "max_runs_per_hour",
    "enabled",
];

/// What a mailbox does (validated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxSpec {
    /// The address's local part.
    pub name: String,
    pub target: RunTarget,
    /// Addresses (`alice@example.com`) and domains (`@example.com`),
    /// lower-cased.
    pub allow_senders: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_template: Option<String>,
    pub reply: bool,
    pub max_runs_per_hour: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MailboxState {
    Enabled,
    Disabled,
    Deleted,
}

/// A mailbox of a tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mailbox {
    pub mailbox_id: String,
    pub tenant: String,
    /// `<name>@<the deployment's inbound domain>`, unique across tenants.
    pub address: String,
    pub spec: MailboxSpec,
    state: MailboxState,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub version: u64,
}

/// A local part: 1-64 of a-z, 0-9, '.', '-', '_', not starting or ending
/// with '.'.
fn valid_local(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// An allowed sender: an address or `@domain`.
fn valid_sender(s: &str) -> bool {
    match s.split_once('@') {
        Some((local, domain)) => {
            !domain.is_empty()
                && domain.contains('.')
                && !local.contains(char::is_whitespace)
                && !domain.contains(char::is_whitespace)
                && !domain.contains('@')
        }
        None => false,
    }
}

impl MailboxSpec {
    /// A create request, field by field (unknown fields refused).
    pub fn parse(body: &Value) -> Result<(MailboxSpec, bool), FieldError> {
        let f = Fields::new(body)?;
        f.only(MAILBOX_FIELDS)?;
        let name = f.req_str("name")?.to_string();
        if !valid_local(&name) {
            return Err(FieldError::new(
                "name",
                "must be 1-64 characters of a-z, 0-9, '.', '-' or '_' (an address's local part)",
            ));
        }
        if body.get("allow_senders").is_none() {
            return Err(FieldError::new(
                "allow_senders",
                "is required: who may write to it",
            ));
        }
        let patch = MailboxPatch::parse_fields(&f, body, false)?;
        let mut spec = MailboxSpec {
            name,
            target: patch
                .target
                .clone()
                .ok_or_else(|| FieldError::new("agent", "name exactly one of agent or team"))?,
            allow_senders: vec![],
            input_template: None,
            reply: true,
            max_runs_per_hour: DEFAULT_MAX_RUNS_PER_HOUR,
        };
        let enabled = patch.enabled.unwrap_or(true);
        spec.apply(patch);
        Ok((spec, enabled))
    }

    fn apply(&mut self, patch: MailboxPatch) {
        if let Some(t) = patch.target {
            self.target = t;
        }
        if let Some(s) = patch.allow_senders {
            self.allow_senders = s;
        }
        if let Some(t) = patch.input_template {
            self.input_template = t;
        }
        if let Some(r) = patch.reply {
            self.reply = r;
        }
        if let Some(n) = patch.max_runs_per_hour {
            self.max_runs_per_hour = n;
        }
    }

    /// Whether `sender` (an address) may write to the mailbox.
    pub fn allows(&self, sender: &str) -> bool {
        let sender = sender.to_ascii_lowercase();
        let domain = sender.rsplit_once('@').map(|(_, d)| d);
        self.allow_senders
            .iter()
            .any(|a| match a.strip_prefix('@') {
                Some(d) => domain == Some(d),
                None => *a == sender,
            })
    }

    /// The template its mail's inputs are rendered with.
    pub fn template(&self) -> &str {
        self.input_template.as_deref().unwrap_or(DEFAULT_TEMPLATE)
    }
}

/// The input of a mailbox that gives no template: who wrote, about what,
/// what they said, and what they attached.
pub const DEFAULT_TEMPLATE: &str = concat!(
    "Email from {{ mail.from }}, subject: {{ mail.subject }}\n\n",
    "{{ mail.text }}",
    "{% if mail.attachments %}\n\nAttachments (stored with the run):\n",
    "{% for a in mail.attachments %}- {{ a.name }} ({{ a.content_type }}, {{ a.bytes }} bytes): {{ a.key }}\n",
    "{% endfor %}{% endif %}",
);

/// A change to a mailbox (`PATCH /v1/mailboxes/{id}`): any field but
/// `name` (its address); `null` clears `input_template`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MailboxPatch {
    pub target: Option<RunTarget>,
    pub allow_senders: Option<Vec<String>>,
    pub input_template: Option<Option<String>>,
    pub reply: Option<bool>,
    pub max_runs_per_hour: Option<u32>,
    pub enabled: Option<bool>,
}

/// The fields `PATCH /v1/mailboxes/{id}` takes.
pub const MAILBOX_PATCH_FIELDS: &[&str] = &[
    "agent",
    "team",
    "allow_senders",
    "input_template",
    "reply",
    "max_runs_per_hour",
    "enabled",
];

impl MailboxPatch {
    pub fn parse(body: &Value) -> Result<MailboxPatch, FieldError> {
        let f = Fields::new(body)?;
        if body.get("name").is_some() {
            return Err(FieldError::new(
                "name",
                "a mailbox's address cannot change: make a new mailbox",
            ));
        }
        f.only(MAILBOX_PATCH_FIELDS)?;
        MailboxPatch::parse_fields(&f, body, true)
    }

    fn parse_fields(f: &Fields<'_>, body: &Value, patch: bool) -> Result<MailboxPatch, FieldError> {
        let named = ["agent", "team", "chain"]
            .iter()
            .any(|k| body.get(*k).is_some_and(|v| !v.is_null()));
        let target = if named || !patch {
            let target = parse_target(f, &mut String::new())?;
            if matches!(target, RunTarget::Chain(_)) {
                return Err(FieldError::new(
                    "chain",
                    "a mailbox starts an agent or a team",
                ));
            }
            Some(target)
        } else {
            None
        };
        let allow_senders = match f.opt_str_list("allow_senders")? {
            None => None,
            Some(list) => {
                let list: Vec<String> = list
                    .into_iter()
                    .map(|s| s.trim().to_ascii_lowercase())
                    .collect();
                if list.is_empty() || list.len() > MAX_SENDERS {
                    return Err(FieldError::new(
                        "allow_senders",
                        &format!("must name between 1 and {MAX_SENDERS} senders"),
                    ));
                }
                if let Some(bad) = list.iter().find(|s| !valid_sender(s)) {
                    return Err(FieldError::new(
                        "allow_senders",
                        &format!("'{bad}' is neither an address nor @domain"),
                    ));
                }
                Some(list)
            }
        };
        let input_template = match f.opt_str("input_template")? {
            Some(t) => {
                crate::hook::template::check(t)
                    .map_err(|e| FieldError::new("input_template", &e.to_string()))?;
                Some(Some(t.to_string()))
            }
            None if patch && body.get("input_template") == Some(&Value::Null) => Some(None),
            None => None,
        };
        let max_runs_per_hour = match f.opt_u64("max_runs_per_hour")? {
            None => None,
            Some(n) if n == 0 || n > u64::from(MAX_RUNS_PER_HOUR_LIMIT) => {
                return Err(FieldError::new(
                    "max_runs_per_hour",
                    &format!("must be between 1 and {MAX_RUNS_PER_HOUR_LIMIT}"),
                ))
            }
            Some(n) => Some(n as u32),
        };
        Ok(MailboxPatch {
            target,
            allow_senders,
            input_template,
            reply: f.opt_bool("reply")?,
            max_runs_per_hour,
            enabled: f.opt_bool("enabled")?,
        })
    }
}

impl Mailbox {
    pub fn new(
        mailbox_id: &str,
        tenant: &str,
        domain: &str,
        spec: MailboxSpec,
        enabled: bool,
        now_ms: i64,
    ) -> Mailbox {
        Mailbox {
            mailbox_id: mailbox_id.to_string(),
            tenant: tenant.to_string(),
            address: format!("{}@{}", spec.name, domain.to_ascii_lowercase()),
            spec,
            state: if enabled {
                MailboxState::Enabled
            } else {
                MailboxState::Disabled
            },
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            version: 1,
        }
    }

    pub fn state(&self) -> MailboxState {
        self.state
    }

    pub fn enabled(&self) -> bool {
        self.state == MailboxState::Enabled
    }
}

/// What a mailbox's machine is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MailboxEvent {
    /// Its fields change (validated already).
    Update(MailboxPatch),
    Delete,
}

/// Why a mailbox refused a change (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MailboxRefusal {
    #[error("the mailbox was deleted")]
    Deleted,
}

impl crate::machine::Machine for Mailbox {
    type Event = MailboxEvent;
    /// Its changes need nothing carried out.
    type Action = std::convert::Infallible;
    type Refusal = MailboxRefusal;
    type Version = u64;

    fn apply(
        &mut self,
        event: MailboxEvent,
        now_ms: i64,
    ) -> Result<Vec<Self::Action>, MailboxRefusal> {
        match (self.state, event) {
            (MailboxState::Deleted, _) => return Err(MailboxRefusal::Deleted),
            (MailboxState::Enabled | MailboxState::Disabled, MailboxEvent::Update(patch)) => {
                match patch.enabled {
                    Some(true) => self.state = MailboxState::Enabled,
                    Some(false) => self.state = MailboxState::Disabled,
                    None => {}
                }
                self.spec.apply(patch);
            }
            (MailboxState::Enabled | MailboxState::Disabled, MailboxEvent::Delete) => {
                self.state = MailboxState::Deleted;
            }
        }
        self.updated_at_ms = now_ms;
        self.version += 1;
        Ok(vec![])
    }

    fn version(&self) -> u64 {
        self.version
    }
}

#[cfg(test)]
mod tests;
