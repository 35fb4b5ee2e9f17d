//! Mailboxes (scenario H's email): an address of the deployment's inbound
//! domain whose mail, from senders it allows, starts a Run of an agent or
//! a team, answered by a reply in the same thread; a reply to that reply
//! continues the conversation.
//!
//! - this module: the mailbox record, what creates and changes it, its machine
//! - [`mail`]: an inbound message read, and whether it may start a Run
//! - [`reply`]: the threaded reply

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::{parse_target, RunTarget};
use crate::fields::{FieldError, Fields};

pub mod mail;
pub mod reply;

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
        let target = parse_target(&f, &mut String::new())?;
        if matches!(target, RunTarget::Chain(_)) {
            return Err(FieldError::new(
                "chain",
                "a mailbox starts an agent or a team",
            ));
        }
        let allow_senders: Vec<String> = f
            .opt_str_list("allow_senders")?
            .ok_or_else(|| FieldError::new("allow_senders", "is required: who may write to it"))?
            .into_iter()
            .map(|s| s.trim().to_ascii_lowercase())
            .collect();
        if allow_senders.is_empty() || allow_senders.len() > MAX_SENDERS {
            return Err(FieldError::new(
                "allow_senders",
                &format!("must name between 1 and {MAX_SENDERS} senders"),
            ));
        }
        if let Some(bad) = allow_senders.iter().find(|s| !valid_sender(s)) {
            return Err(FieldError::new(
                "allow_senders",
                &format!("'{bad}' is neither an address nor @domain"),
            ));
        }
        let input_template = f.opt_str("input_template")?.map(str::to_string);
        if let Some(t) = &input_template {
            crate::hook::template::check(t)
                .map_err(|e| FieldError::new("input_template", &e.to_string()))?;
        }
        let max_runs_per_hour = match f.opt_u64("max_runs_per_hour")? {
            None => crate::hook::DEFAULT_MAX_RUNS_PER_HOUR,
            Some(n @ 1..=3600) => n as u32,
            Some(_) => {
                return Err(FieldError::new(
                    "max_runs_per_hour",
                    "must be between 1 and 3600",
                ))
            }
        };
        Ok((
            MailboxSpec {
                name,
                target,
                allow_senders,
                input_template,
                reply: f.opt_bool("reply")?.unwrap_or(true),
                max_runs_per_hour,
            },
            f.opt_bool("enabled")?.unwrap_or(true),
        ))
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
    Enable(bool),
    AllowSenders(Vec<String>),
    Delete,
}

/// Why a mailbox refused a change.
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
            (MailboxState::Enabled | MailboxState::Disabled, MailboxEvent::Enable(on)) => {
                self.state = if on {
                    MailboxState::Enabled
                } else {
                    MailboxState::Disabled
                };
            }
            (MailboxState::Enabled | MailboxState::Disabled, MailboxEvent::AllowSenders(s)) => {
                self.spec.allow_senders = s;
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
