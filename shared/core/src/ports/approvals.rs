//! Approval records.

use std::fmt::Debug;

use async_trait::async_trait;

use armada_domain::approval::{Approval, ApprovalState};

use crate::cas::Versioned;
use crate::error::StoreError;

/// Human approvals: created with their Run's commit ([`Also::Approval`](super::Also::Approval)),
/// then changed only by writes conditional on the version read.
#[async_trait]
pub trait Approvals: Send + Sync + Debug {
    /// Reads an approval (strongly consistent).
    async fn get(&self, approval_id: &str) -> Result<Option<Approval>, StoreError>;
    /// Writes `approval` if the stored one is still at `prev_version`.
    async fn update(&self, prev_version: u64, approval: &Approval) -> Result<(), StoreError>;
    /// Every approval of a Run.
    async fn of_run(&self, run_id: &str) -> Result<Vec<Approval>, StoreError>;
    /// A tenant's approvals, newest first, at most `limit`, of one state
    /// when given.
    async fn of_tenant(
        &self,
        tenant: &str,
        state: Option<ApprovalState>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError>;
}

/// Every approval store is one of versioned records: approvals change
/// through their machine with [`crate::cas::change`].
#[async_trait]
impl<T: Approvals + ?Sized> Versioned<Approval> for T {
    async fn read(&self, approval_id: &str) -> Result<Option<Approval>, StoreError> {
        self.get(approval_id).await
    }

    async fn write_if(&self, read: &u64, approval: &Approval) -> Result<(), StoreError> {
        self.update(*read, approval).await
    }
}
