//! `Idempotency-Key` records.

use std::fmt::Debug;

use async_trait::async_trait;

use crate::error::StoreError;

/// What an `Idempotency-Key` was first used for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdemRecord {
    pub fingerprint: String,
    pub run_id: String,
}

/// `Idempotency-Key` records (written through [`Also::IdempotencyKey`](super::Also::IdempotencyKey)).
#[async_trait]
pub trait Idempotency: Send + Sync + Debug {
    async fn get(&self, tenant: &str, key: &str) -> Result<Option<IdemRecord>, StoreError>;
    /// Counts one Run started by `tenant` in the minute starting at
    /// `window_s`, unless `limit` were counted already: `false` then, and
    /// nothing is counted (one conditional write; the counter expires).
    async fn count_run_start(
        &self,
        tenant: &str,
        window_s: i64,
        limit: u32,
    ) -> Result<bool, StoreError>;
    /// Takes `slot` for `holder` (an SQS message id): `true` when it was
    /// free or is `holder`'s already (a redelivery of the same message),
    /// `false` when another message took it first. Kept a day.
    async fn take_slot(&self, slot: &str, holder: &str, now_ms: i64) -> Result<bool, StoreError>;
}
