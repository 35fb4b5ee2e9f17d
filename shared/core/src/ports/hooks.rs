//! Inbound webhooks: the hooks of each tenant, the record of each
//! verified delivery, and each hook's hourly count of the Runs it started.

use std::fmt::Debug;

use async_trait::async_trait;

use armada_domain::hook::inbound::Delivery;
use armada_domain::hook::Hook;

use crate::cas::Versioned;
use crate::error::StoreError;

#[async_trait]
pub trait Hooks: Send + Sync + Debug {
    /// Writes a new hook; a `Conflict` if its id exists.
    async fn create(&self, hook: &Hook) -> Result<(), StoreError>;
    /// Reads a hook (strongly consistent).
    async fn get(&self, hook_id: &str) -> Result<Option<Hook>, StoreError>;
    /// Writes `hook` if the stored one is still at `prev_version`; a hook
    /// its machine deleted is removed.
    async fn update(&self, prev_version: u64, hook: &Hook) -> Result<(), StoreError>;
    /// A tenant's hooks, newest first, at most `limit`.
    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Hook>, StoreError>;
    /// Records an answered delivery (kept 30 days).
    async fn record_delivery(&self, delivery: &Delivery) -> Result<(), StoreError>;
    /// A hook's deliveries, newest first, at most `limit`.
    async fn deliveries(&self, hook_id: &str, limit: usize) -> Result<Vec<Delivery>, StoreError>;
    /// Counts one Run started by `hook_id` in the hour starting at
    /// `window_s`, unless `limit` were counted already: `false` then, and
    /// nothing is counted (one conditional write; the counter expires).
    async fn count_start(
        &self,
        hook_id: &str,
        window_s: i64,
        limit: u32,
    ) -> Result<bool, StoreError>;
}

/// Every hook store is one of versioned records: hooks change through
/// their machine with [`crate::cas::change`].
#[async_trait]
impl<T: Hooks + ?Sized> Versioned<Hook> for T {
    async fn read(&self, hook_id: &str) -> Result<Option<Hook>, StoreError> {
        self.get(hook_id).await
    }

    async fn write_if(&self, read: &u64, hook: &Hook) -> Result<(), StoreError> {
        self.update(*read, hook).await
    }
}

/// The alarm topics of cloudwatch hooks: one SNS topic per hook, which
/// alarms' actions name, delivering to the stack's alarms queue.
#[async_trait]
pub trait Topics: Send + Sync + Debug {
    /// Makes hook `hook_id`'s topic, subscribed to the alarms queue and
    /// open to CloudWatch; its ARN.
    async fn create(&self, hook_id: &str) -> Result<String, StoreError>;
    /// Deletes a topic (gone already is fine).
    async fn delete(&self, topic_arn: &str) -> Result<(), StoreError>;
    /// The hook a topic of this stack is for.
    fn hook_of(&self, topic_arn: &str) -> Option<String>;
}
