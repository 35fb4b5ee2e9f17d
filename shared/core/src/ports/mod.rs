//! The ports: what the handlers need from the outside world, one module
//! per table or concern, each owning its vocabulary and named by what the
//! domain asks of it. The adapters in [`crate::adapters`] implement them
//! over AWS; `crate::memory` (feature `test-support`) implements every
//! one in memory for unit tests. No SDK type crosses a port: writes that
//! must land with a Run's commit are named by [`Also`], failed conditions
//! are [`StoreError::Conflict`](crate::error::StoreError::Conflict), and
//! the adapters own the attribute mapping. Nothing here imports an
//! adapter.

pub mod approvals;
pub mod blobs;
pub mod hooks;
pub mod idempotency;
pub mod mail;
pub mod mailboxes;
pub mod model;
pub mod provider;
pub mod queues;
pub mod quotas;
pub mod registry;
pub mod runs;
pub mod sandboxes;
pub mod schedules;
pub mod secrets;
pub mod sessions;

pub use approvals::Approvals;
pub use blobs::{Blobs, Bounded};
pub use hooks::{Hooks, Topics};
pub use idempotency::{IdemRecord, Idempotency};
pub use mail::Mail;
pub use mailboxes::Mailboxes;
pub use model::Model;
pub use provider::Provider;
pub use queues::Queues;
pub use quotas::Quotas;
pub use registry::{Registry, StoredKey};
pub use runs::{Also, RunEvents, Runs};
pub use sandboxes::{
    CallRef, Change, SandboxReports, Sandboxes, SandboxesExt, StoredMark, FIRST_SANDBOX_UID,
};
pub use schedules::{Schedules, Timers};
pub use secrets::{Secrets, Vault};
pub use sessions::Sessions;
