//! What started a Run: a caller with a key, a session's message, a hook's
//! delivery, a mail, a parent, or the step before it in a relay chain. Recorded
//! on the Run and in its `run_created`, and shown in its view.

use serde::{Deserialize, Serialize};

/// What started a Run.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Trigger {
    /// `POST /v1/runs` with a key.
    Api,
    /// A message of a session.
    Session { session_id: String },
    /// A verified delivery to a hook.
    Hook {
        hook_id: String,
        /// The event's name (`push`, `firing`, a payload's `type`).
        event: String,
        delivery_id: String,
    },
    /// A schedule's firing for `scheduled_at` (RFC 3339).
    Schedule {
        schedule_id: String,
        scheduled_at: String,
    },
    /// A message to a mailbox.
    Email {
        mailbox_id: String,
        /// Its `Message-ID` (without brackets; SES's id when it has none).
        message_id: String,
        from: String,
        subject: String,
        /// The ids its reply names in `References`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        thread: Vec<String>,
        /// Its attachments, stored with the Run.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        attachments: Vec<Artifact>,
    },
    /// A parent's delegation, team or plan.
    Child { parent_run_id: String },
    /// The step before it in a relay chain.
    Chain { chain_id: String },
}

/// A file that came with what started a Run (an email's attachment),
/// stored in the payload bucket.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    pub name: String,
    pub content_type: String,
    pub bytes: u64,
    /// Its key in the payload bucket.
    pub key: String,
}

impl Trigger {
    pub fn kind(&self) -> &'static str {
        match self {
            Trigger::Api => "api",
            Trigger::Session { .. } => "session",
            Trigger::Hook { .. } => "hook",
            Trigger::Schedule { .. } => "schedule",
            Trigger::Email { .. } => "email",
            Trigger::Child { .. } => "child",
            Trigger::Chain { .. } => "chain",
        }
    }
}
