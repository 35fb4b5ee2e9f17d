//! The Run records and their event logs.

use std::fmt::Debug;

use async_trait::async_trait;

use armada_domain::approval::Approval;
use armada_domain::chat::Role;
use armada_domain::run::{Payload, Run, RunEventRecord, RunHead, Stamp};
use armada_domain::session::SessionHeader;

use crate::error::StoreError;
use crate::ports::idempotency::IdemRecord;

/// A write that lands in the same transaction as a Run's creation or
/// commit. In a conflict, `Conflict { which: Some(0) }` is the Run itself
/// and `Some(1 + i)` the `i`-th of these.
#[derive(Debug, Clone, PartialEq)]
pub enum Also {
    /// Accepts message `header.next_seq + 1` of a session for `run_id`:
    /// conditional on the counter read (and, for a `reject` session, on no
    /// earlier message being still open).
    SessionMessage {
        header: SessionHeader,
        run_id: String,
    },
    /// A turn of a session's history (its content already in the payload
    /// bucket when large); written once.
    SessionTurn {
        session_id: String,
        turn: u64,
        role: Role,
        content: Payload,
        run_id: String,
    },
    /// The `Idempotency-Key` of the request that created the Run (or the
    /// key of a hook's delivery or a schedule's firing); written once,
    /// remembered `keep_days`.
    IdempotencyKey {
        tenant: String,
        key: String,
        record: IdemRecord,
        now_ms: i64,
        keep_days: u32,
    },
    /// An approval of one of the Run's calls, created with the commit that
    /// parks the Run; written once.
    Approval(Box<Approval>),
    /// The marker of a Run a tenant started through the API (or of the
    /// next step of its relay chain), counted by [`Quotas::active_runs`](super::Quotas::active_runs)
    /// until the Run is settled or `until_ms` passes; written once.
    ActiveRun {
        tenant: String,
        run_id: String,
        until_ms: i64,
    },
}

impl Also {
    /// The marker of `run`, a root the API accepts or a chain's next
    /// step. It expires once the
    /// Run cannot be active any more, as a backstop for a settlement that
    /// never came: its deadline, plus the longest one approval may hold it
    /// (time waiting for a person is given back to its budget). A Run
    /// held past that by approval after approval stops counting, in the
    /// tenant's favour.
    pub fn active_run(run: &Run) -> Also {
        let approval_ms = armada_domain::approval::policy::MAX_EXPIRES_S as i64 * 1000;
        Also::ActiveRun {
            tenant: run.tenant.clone(),
            run_id: run.run_id.clone(),
            until_ms: run.budgets.deadline_ms + approval_ms,
        }
    }
}

/// The Run records: read, created, claimed, leased and committed, every
/// write after creation conditional on the version the writer read.
#[async_trait]
pub trait Runs: Send + Sync + Debug {
    /// Reads a Run (strongly consistent).
    async fn get(&self, run_id: &str) -> Result<Option<Run>, StoreError>;
    /// What a Run's item says outside its document: readable when `get`
    /// finds the document corrupt.
    async fn head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError>;
    /// Creates a Run with its first events and `also`, atomically.
    async fn create(
        &self,
        run: &Run,
        events: &[RunEventRecord],
        also: Vec<Also>,
    ) -> Result<(), StoreError>;
    /// Writes `claimed` if the Run is still as `read` (state, step, epoch)
    /// and its lease has expired by `claimed.updated_at_ms`.
    async fn claim(&self, read: &Run, claimed: &Run) -> Result<(), StoreError>;
    /// Extends a live lease of `epoch`; `false` if it is not ours or ended.
    async fn renew(
        &self,
        run_id: &str,
        epoch: u64,
        lease_until_ms: i64,
    ) -> Result<bool, StoreError>;
    /// Ends the lease of `epoch` now, if `epoch` still owns the Run.
    async fn release(&self, run_id: &str, epoch: u64) -> Result<(), StoreError>;
    /// Commits the new version of a Run, its new events and `also`,
    /// conditional on `prev`; a superseded writer gets `Conflict { which:
    /// Some(0) }`. The lease is never written back as read: only ended (0).
    async fn save(
        &self,
        prev: Stamp,
        run: &Run,
        events: &[RunEventRecord],
        also: Vec<Also>,
    ) -> Result<(), StoreError>;
}

/// A Run's append-only event log.
#[async_trait]
pub trait RunEvents: Send + Sync + Debug {
    /// Events with `seq > after`, oldest first, at most `limit`.
    async fn events(
        &self,
        run_id: &str,
        after: u64,
        limit: i32,
    ) -> Result<Vec<RunEventRecord>, StoreError>;

    /// Every event of a Run, page by page.
    async fn all_events(&self, run_id: &str) -> Result<Vec<RunEventRecord>, StoreError> {
        let mut all: Vec<RunEventRecord> = Vec::new();
        loop {
            let after = all.last().map_or(0, |e| e.seq);
            let page = self.events(run_id, after, 500).await?;
            let done = page.len() < 500;
            all.extend(page);
            if done {
                return Ok(all);
            }
        }
    }
}
