//! A sandbox task's own AWS credentials, and their renewal.
//!
//! The task role holds no data permissions: the provider assumes the
//! sandbox identity role for each generation with the session policy of
//! [`super::access`] (its own hand queue, record, marks and objects) and
//! hands the credentials to the task as it starts. Assumed from the control
//! plane's own role session, they are chained credentials, which AWS caps
//! at one hour, so the agent asks for new ones a third of the way through
//! (with a request sealed by its answer key) and the dispatcher sends them
//! to its hand queue, which only that identity can read. A call lasts at
//! most 30 minutes, so credentials asked for 40 minutes before they expire
//! reach the agent between two calls in time.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::crypto::{digest_eq, hmac_sha256_hex};

pub use super::lifecycle::CredentialsInfo;
use super::lifecycle::SandboxRecord;

/// The longest session AWS grants to chained role credentials.
pub const ROLE_CHAIN_MAX_SECONDS: u32 = 3600;

/// A renewal request older than this is dropped (the agent asks again).
pub const RENEWAL_MAX_AGE_MS: i64 = 10 * 60 * 1000;

/// Credentials of one sandbox task.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: String,
    pub expires_at_ms: i64,
}

impl fmt::Debug for TaskCredentials {
    // Never in a log: only the key id, which names them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}

impl TaskCredentials {
    /// What the sandbox record shows of them.
    pub fn info(&self) -> CredentialsInfo {
        CredentialsInfo {
            access_key_id: self.access_key_id.clone(),
            expires_at_ms: self.expires_at_ms,
        }
    }
}

/// When the agent asks for new credentials: a third of the way through
/// their life (20 minutes into an hour), or at `renew_after_ms` when set
/// (tests), and again every minute until new ones arrive.
pub fn renewal_due(received_at_ms: i64, expires_at_ms: i64, renew_after_ms: Option<i64>) -> i64 {
    let life = (expires_at_ms - received_at_ms).max(0);
    received_at_ms + renew_after_ms.unwrap_or(life / 3)
}

/// A renewal request, as sealed by the generation's answer key.
#[derive(Debug, Clone, Copy)]
pub struct Renewal<'a> {
    pub tenant: &'a str,
    pub agent: &'a str,
    pub generation: u64,
    pub requested_at_ms: i64,
}

impl Renewal<'_> {
    fn text(&self) -> String {
        format!(
            "armada-sandbox-renewal\n{}\n{}\n{}\n{}",
            self.tenant, self.agent, self.generation, self.requested_at_ms
        )
    }

    pub fn seal(&self, answer_key: &str) -> String {
        hmac_sha256_hex(answer_key.as_bytes(), self.text().as_bytes())
    }

    pub fn sealed_by(&self, mac: &str, answer_key: &str) -> bool {
        digest_eq(&self.seal(answer_key), mac)
    }
}

/// What the dispatcher does with a renewal request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewalVerdict {
    /// Assume the role again and send the credentials to this hand queue.
    Issue { hand_queue_url: String },
    /// Nothing: why, for the log.
    Drop(&'static str),
}

/// Judges a renewal request against the identity's record: only a sealed,
/// recent request of the generation the record names, while it lives.
pub fn judge_renewal(
    req: &Renewal<'_>,
    sealed: bool,
    record: Option<&SandboxRecord>,
    now_ms: i64,
) -> RenewalVerdict {
    if !sealed {
        return RenewalVerdict::Drop("security: the request is not sealed by the generation's key");
    }
    if now_ms - req.requested_at_ms > RENEWAL_MAX_AGE_MS || req.requested_at_ms - now_ms > 60_000 {
        return RenewalVerdict::Drop("the request is stale");
    }
    let Some(rec) = record else {
        return RenewalVerdict::Drop("the identity has no sandbox");
    };
    if rec.generation != req.generation {
        return RenewalVerdict::Drop("the request is from another generation");
    }
    if rec.state().is_gone() {
        return RenewalVerdict::Drop("the sandbox is gone");
    }
    match &rec.hand_queue_url {
        Some(url) => RenewalVerdict::Issue {
            hand_queue_url: url.clone(),
        },
        None => RenewalVerdict::Drop("the sandbox has no hand queue"),
    }
}

#[cfg(test)]
#[path = "credentials_tests.rs"]
mod tests;
