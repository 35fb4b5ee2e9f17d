//! Sandbox records, call marks and pooled ports, and the one
//! compare-and-set loop over them.

use std::fmt::Debug;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

use armada_domain::sandbox::hand::CallMark;
use armada_domain::sandbox::lifecycle::SandboxRecord;

use crate::cas::{until_written, Try, ATTEMPTS};
use crate::error::StoreError;

/// What a read-modify-write of a sandbox record decided.
#[derive(Debug)]
pub enum Change<T> {
    /// Write this record (conditional on the version read) and return `T`.
    Write(Box<SandboxRecord>, T),
    /// Leave the record as it is.
    Keep(T),
}

/// Identifies one attempt of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRef {
    /// The identity the call was sent to (its mark lives under it).
    pub tenant: String,
    pub agent: String,
    pub run_id: String,
    pub call_id: String,
    pub attempt: u32,
}

impl CallRef {
    /// The attempt of `call` the ledger of `run` holds now.
    pub fn of(
        run: &armada_domain::run::Run,
        call: &armada_domain::ledger::ToolCallRecord,
    ) -> CallRef {
        CallRef {
            tenant: run.tenant.clone(),
            agent: run.agent.clone(),
            run_id: run.run_id.clone(),
            call_id: call.call_id.clone(),
            attempt: call.attempt,
        }
    }
}

/// The mark of a call, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMark {
    pub mark: CallMark,
    pub generation: u64,
    pub at_ms: i64,
}

/// The first uid [`Sandboxes::identity_uid`] hands out (the ones below
/// are the host's own users').
pub const FIRST_SANDBOX_UID: u32 = 300_000;

/// Sandbox records (one per agent identity), call marks and pooled ports.
#[async_trait]
pub trait Sandboxes: Send + Sync + Debug {
    async fn get(&self, tenant: &str, agent: &str) -> Result<Option<SandboxRecord>, StoreError>;
    async fn list(&self, tenant: &str) -> Result<Vec<SandboxRecord>, StoreError>;
    /// Every tenant's record of one agent.
    async fn list_agent(&self, agent: &str) -> Result<Vec<SandboxRecord>, StoreError>;
    /// Writes `rec` with version `read_version + 1` if the stored version is
    /// still `read_version` (`None`: if there is no record yet).
    async fn put_if_version(
        &self,
        rec: &SandboxRecord,
        read_version: Option<u64>,
    ) -> Result<(), StoreError>;
    /// The sandbox agent's write: the report half of `rec` only, with
    /// version `read_version + 1`, if the stored version is still
    /// `read_version`. (The control half is the control plane's.)
    async fn put_report_if_version(
        &self,
        rec: &SandboxRecord,
        read_version: u64,
    ) -> Result<(), StoreError>;
    /// Removes a record, if unchanged since read.
    async fn delete(&self, rec: &SandboxRecord) -> Result<(), StoreError>;
    /// Marks a call once: `None` if this mark was written, else the mark
    /// already there.
    async fn mark_first(
        &self,
        call: &CallRef,
        mark: CallMark,
        generation: u64,
        now_ms: i64,
    ) -> Result<Option<StoredMark>, StoreError>;
    async fn mark_finished(&self, call: &CallRef, now_ms: i64) -> Result<(), StoreError>;
    async fn mark(&self, call: &CallRef) -> Result<Option<StoredMark>, StoreError>;
    /// Takes a pooled port for `holder`; `false` if someone holds it.
    async fn take_port(
        &self,
        host: &str,
        port: u16,
        holder: &str,
        generation: u64,
    ) -> Result<bool, StoreError>;
    async fn release_port(&self, host: &str, port: u16, holder: &str) -> Result<(), StoreError>;
    async fn port_holder(&self, host: &str, port: u16) -> Result<Option<String>, StoreError>;
    /// The host uid of an identity's sandboxes (the local data plane's):
    /// taken once from a counter, so no two identities ever share one
    /// (the first is [`FIRST_SANDBOX_UID`]), and kept for every later
    /// generation of the identity, whose files under `/data` stay its own.
    async fn identity_uid(&self, tenant: &str, agent: &str) -> Result<u32, StoreError>;
}

/// Read-modify-write over any [`Sandboxes`].
#[async_trait]
pub trait SandboxesExt: Sandboxes {
    /// Reads the record of an identity, lets `f` decide, and writes what it
    /// decided conditional on the version read (or on the key's absence).
    /// A conflicting writer makes it read and decide again.
    async fn modify<T: Send>(
        &self,
        tenant: &str,
        agent: &str,
        f: impl FnMut(Option<SandboxRecord>) -> Change<T> + Send,
    ) -> Result<T, StoreError> {
        read_modify_write(self, tenant, agent, Half::Whole, f).await
    }
}

impl<S: Sandboxes + ?Sized> SandboxesExt for S {}

/// The sandbox agent's read-modify-write: as [`SandboxesExt::modify`], but
/// what is written is the record's report half only (whatever `f` did to
/// the control half is not the agent's to write), and never a new record.
#[async_trait]
pub trait SandboxReports: Sandboxes {
    async fn modify_report<T: Send>(
        &self,
        tenant: &str,
        agent: &str,
        f: impl FnMut(Option<SandboxRecord>) -> Change<T> + Send,
    ) -> Result<T, StoreError> {
        read_modify_write(self, tenant, agent, Half::Report, f).await
    }
}

/// Which half of a sandbox record a read-modify-write writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Half {
    /// The whole record (the control plane).
    Whole,
    /// The report half only (the sandbox's agent), of a record that exists.
    Report,
}

/// A read-modify-write of a sandbox record: read, let `f` decide, write
/// what it decided conditional on the version read. It runs in the one
/// compare-and-set loop ([`until_written`]): a conflicting writer makes
/// it read and decide again.
async fn read_modify_write<S, T>(
    store: &S,
    tenant: &str,
    agent: &str,
    half: Half,
    f: impl FnMut(Option<SandboxRecord>) -> Change<T> + Send,
) -> Result<T, StoreError>
where
    S: Sandboxes + ?Sized,
    T: Send,
{
    // Each try's future borrows the decision; a lock lends it to one try
    // at a time (never held across an await).
    let decide = Mutex::new(f);
    let written = until_written(|| async {
        let read = store.get(tenant, agent).await?;
        let read_version = read.as_ref().map(|r| r.version);
        let decided = {
            let mut f = decide.lock().unwrap_or_else(PoisonError::into_inner);
            f(read)
        };
        let (mut rec, out) = match decided {
            Change::Keep(out) => return Ok(Try::Done(out)),
            Change::Write(rec, out) => (rec, out),
        };
        rec.version = read_version.map_or(1, |v| v + 1);
        let written = match (half, read_version) {
            (Half::Whole, _) => store.put_if_version(&rec, read_version).await,
            (Half::Report, Some(v)) => store.put_report_if_version(&rec, v).await,
            (Half::Report, None) => {
                return Err(StoreError::Terminal(format!(
                    "sandbox {tenant}#{agent}: an agent cannot create its record"
                )))
            }
        };
        match written {
            Ok(()) => Ok(Try::Done(out)),
            Err(StoreError::Conflict { .. }) => Ok(Try::Again),
            Err(e) => Err(e),
        }
    })
    .await?;
    written.ok_or_else(|| {
        StoreError::Retryable(format!(
            "sandbox {tenant}#{agent} kept changing under {ATTEMPTS} attempts"
        ))
    })
}

impl<S: Sandboxes + ?Sized> SandboxReports for S {}
