//! Schedules: the records of each tenant's, their firings (one per
//! scheduled time), and the timers that fire them (EventBridge Scheduler
//! in AWS; the local stack fires the same timers itself).

use std::fmt::Debug;

use async_trait::async_trait;

use armada_domain::schedule::{FiringRecord, Schedule};

use crate::cas::Versioned;
use crate::error::StoreError;

#[async_trait]
pub trait Schedules: Send + Sync + Debug {
    /// Writes a new schedule; a `Conflict` if its id exists.
    async fn create(&self, schedule: &Schedule) -> Result<(), StoreError>;
    /// Reads a schedule (strongly consistent).
    async fn get(&self, schedule_id: &str) -> Result<Option<Schedule>, StoreError>;
    /// Writes `schedule` if the stored one is still at `prev_version`; a
    /// schedule its machine deleted is removed.
    async fn update(&self, prev_version: u64, schedule: &Schedule) -> Result<(), StoreError>;
    /// A tenant's schedules, newest first, at most `limit`.
    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Schedule>, StoreError>;
    /// Records a firing, once per scheduled time: a `Conflict` when that
    /// time's firing is recorded already (kept 30 days).
    async fn record_firing(&self, firing: &FiringRecord) -> Result<(), StoreError>;
    /// A schedule's firings, newest first, at most `limit`.
    async fn firings(
        &self,
        schedule_id: &str,
        limit: usize,
    ) -> Result<Vec<FiringRecord>, StoreError>;
}

/// Every schedule store is one of versioned records: schedules change
/// through their machine with [`crate::cas::change`].
#[async_trait]
impl<T: Schedules + ?Sized> Versioned<Schedule> for T {
    async fn read(&self, schedule_id: &str) -> Result<Option<Schedule>, StoreError> {
        self.get(schedule_id).await
    }

    async fn write_if(&self, read: &u64, schedule: &Schedule) -> Result<(), StoreError> {
        self.update(*read, schedule).await
    }
}

/// The timers that fire schedules: each sends the schedule's sealed
/// `FireSchedule` to the dispatch queue at its times.
#[async_trait]
pub trait Timers: Send + Sync + Debug {
    /// Makes the timer of `schedule` say what it says now (created,
    /// changed, enabled or disabled), sending `message` (JSON, with the
    /// scheduler's placeholder for the time).
    async fn put(&self, schedule: &Schedule, message: &str) -> Result<(), StoreError>;
    /// Deletes the timer of `schedule_id` (gone already is fine).
    async fn remove(&self, schedule_id: &str) -> Result<(), StoreError>;
}
