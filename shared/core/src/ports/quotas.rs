//! Per-tenant counters: rate limits, active Runs, long polls.

use std::fmt::Debug;

use async_trait::async_trait;

use crate::error::StoreError;

/// What a tenant holds at once, across every Lambda instance: a marker
/// per active Run it started through the API (written with the Run,
/// [`Also::ActiveRun`](super::Also::ActiveRun), removed when the Run is settled) and a slot per
/// long-poll waiting. Every item expires, so what a lost settlement or a
/// crashed instance leaves behind stops counting.
#[async_trait]
pub trait Quotas: Send + Sync + Debug {
    /// The tenant's active Runs, counted no further than `limit`; a marker
    /// whose expiry passed by `now_ms` is not counted.
    async fn active_runs(&self, tenant: &str, limit: u32, now_ms: i64) -> Result<u32, StoreError>;
    /// Removes the marker of a Run that ended; one already gone (removed
    /// before, expired, or never written: a child) is no error.
    async fn run_ended(&self, tenant: &str, run_id: &str) -> Result<(), StoreError>;
    /// Takes one of the tenant's `limit` long-poll slots for `holder`
    /// until `until_ms`: its number, or `None` when every one is held. A
    /// slot whose holder's time passed by `now_ms` is free again.
    async fn take_poll_slot(
        &self,
        tenant: &str,
        limit: u32,
        holder: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Option<u32>, StoreError>;
    /// Gives a slot back, if `holder` still holds it (one taken over
    /// since, its time having passed, is left to its new holder).
    async fn release_poll_slot(
        &self,
        tenant: &str,
        slot: u32,
        holder: &str,
    ) -> Result<(), StoreError>;
}
