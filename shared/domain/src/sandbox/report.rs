//! The two halves of a sandbox record, by who may write them.
//!
//! A sandbox's task holds AWS credentials that reach its own record, and
//! code that escaped its jail holds them too. So the record is split: the
//! **control** half (who the sandbox is, its generation, its task, its
//! hand queue, who holds it and who waits) is written by the control plane
//! only; the **report** half (the state the agent says it is in, its
//! controls, heartbeat, ports, failure) is what the agent may write, and
//! the control plane reads it as untrusted input: bounded, parsed
//! leniently into a failed sandbox when it cannot be read, and never a
//! source of identity or routing. The worst a task can do through its
//! report is harm its own sandbox.

use serde::{Deserialize, Serialize};

use super::access::snapshot_key;
use super::controls::Controls;
use super::lifecycle::CredentialsInfo;
use super::lifecycle::{sandbox_key, PortLease, SandboxRecord, SandboxState};

/// The longest report the control plane reads, as JSON.
pub const MAX_REPORT_BYTES: usize = 64 * 1024;
/// The most ports a report may list (the pool is smaller).
pub const MAX_REPORTED_PORTS: usize = 64;
/// The longest failure text kept from a report.
pub const MAX_FAILURE_CHARS: usize = 2000;

/// What the sandbox's agent says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxReport {
    pub state: SandboxState,
    pub state_changed_at_ms: i64,
    #[serde(default)]
    pub controls: Option<Controls>,
    #[serde(default)]
    pub heartbeat_at_ms: i64,
    #[serde(default)]
    pub last_used_at_ms: i64,
    #[serde(default)]
    pub failure: Option<String>,
    #[serde(default)]
    pub snapshot_key: Option<String>,
    #[serde(default)]
    pub credentials: Option<CredentialsInfo>,
    #[serde(default)]
    pub ports: Vec<PortLease>,
}

/// A record that cannot be the one stored under its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sandbox record {key}: {why}")]
pub struct CorruptRecord {
    pub key: String,
    pub why: String,
}

impl SandboxRecord {
    /// The half the agent may write.
    pub fn report(&self) -> SandboxReport {
        SandboxReport {
            state: self.state(),
            state_changed_at_ms: self.state_changed_at_ms,
            controls: self.controls.clone(),
            heartbeat_at_ms: self.heartbeat_at_ms,
            last_used_at_ms: self.last_used_at_ms,
            failure: self.failure.clone(),
            snapshot_key: self.snapshot_key.clone(),
            credentials: self.credentials.clone(),
            ports: self.ports.clone(),
        }
    }

    fn take_report(&mut self, r: SandboxReport) {
        self.take_reported_state(r.state);
        self.state_changed_at_ms = r.state_changed_at_ms;
        self.controls = r.controls;
        self.heartbeat_at_ms = r.heartbeat_at_ms;
        self.last_used_at_ms = r.last_used_at_ms;
        self.failure = r.failure;
        self.snapshot_key = r.snapshot_key;
        self.credentials = r.credentials;
        self.ports = r.ports;
    }

    /// The record stored under `key`: the control half as the control
    /// plane wrote it (`control`, which must name the key's identity), with
    /// the report half taken from the agent's `report` when there is one.
    /// A report that cannot be read makes a failed sandbox, not an
    /// unreadable record; what it says is bounded, and a snapshot key
    /// other than the identity's own for this generation is dropped.
    pub fn from_parts(
        key: &str,
        control: &str,
        report: Option<&str>,
        version: u64,
    ) -> Result<SandboxRecord, CorruptRecord> {
        let corrupt = |why: String| CorruptRecord {
            key: key.to_string(),
            why,
        };
        let mut rec: SandboxRecord =
            serde_json::from_str(control).map_err(|e| corrupt(format!("control half: {e}")))?;
        if sandbox_key(&rec.tenant, &rec.agent) != key {
            return Err(corrupt(format!(
                "names {}#{}, not its key",
                rec.tenant, rec.agent
            )));
        }
        rec.version = version;
        if let Some(text) = report {
            let now = rec.state_changed_at_ms;
            match read_report(text) {
                Ok(r) => rec.take_report(r),
                Err(why) => {
                    rec.take_report(SandboxReport {
                        state: SandboxState::Failed,
                        state_changed_at_ms: now,
                        controls: None,
                        heartbeat_at_ms: 0,
                        last_used_at_ms: rec.last_used_at_ms,
                        failure: Some(format!("the sandbox's report is unreadable: {why}")),
                        snapshot_key: None,
                        credentials: None,
                        ports: vec![],
                    });
                }
            }
        }
        let own = snapshot_key(&rec.tenant, &rec.agent, rec.generation);
        if rec.snapshot_key.as_deref().is_some_and(|k| k != own) {
            rec.snapshot_key = None;
        }
        if rec.state() == SandboxState::Hibernated && rec.snapshot_key.is_some() {
            // Saved and stopped, as its agent says: the sandbox has no task
            // (a lie here only costs the liar a second task of its own).
            rec.task_arn = None;
        }
        Ok(rec)
    }
}

/// Parses a report within its bounds.
fn read_report(text: &str) -> Result<SandboxReport, String> {
    if text.len() > MAX_REPORT_BYTES {
        return Err(format!("{} bytes, over {MAX_REPORT_BYTES}", text.len()));
    }
    let mut r: SandboxReport = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if r.ports.len() > MAX_REPORTED_PORTS {
        return Err(format!(
            "{} ports, over {MAX_REPORTED_PORTS}",
            r.ports.len()
        ));
    }
    if let Some(f) = &mut r.failure {
        if f.chars().count() > MAX_FAILURE_CHARS {
            *f = f.chars().take(MAX_FAILURE_CHARS).collect();
        }
    }
    Ok(r)
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
