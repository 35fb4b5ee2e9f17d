//! DynamoDB adapters, one per table. They own the attribute mapping and
//! turn failed conditions into [`StoreError::Conflict`](crate::error::StoreError).

pub mod approvals;
pub mod idempotency;
pub mod item;
pub mod quotas;
pub mod registry;
pub mod runs;
pub mod sandboxes;
pub mod sessions;
pub mod triggers;
