//! The one shape of every record's machine: it is told an event and the
//! time, changes the record or refuses (changing nothing), and says what
//! the handler must do once the change is committed. Handlers load a
//! record, apply, write it conditional on the version they read, and
//! carry out the actions; the decisions are the machine's alone.
//!
//! A record's state is private to its machine: it is read with `state()`
//! and cannot be assigned anywhere else. These do not compile:
//!
//! ```compile_fail
//! fn assign(run: &mut armada_domain::run::Run) {
//!     run.state = armada_domain::run::RunState::Completed;
//! }
//! ```
//! ```compile_fail
//! fn assign(call: &mut armada_domain::ledger::ToolCallRecord) {
//!     call.state = armada_domain::ledger::ToolCallState::Done;
//! }
//! ```
//! ```compile_fail
//! fn assign(sandbox: &mut armada_domain::sandbox::lifecycle::SandboxRecord) {
//!     sandbox.state = armada_domain::sandbox::lifecycle::SandboxState::Ready;
//! }
//! ```
//! ```compile_fail
//! fn assign(approval: &mut armada_domain::approval::Approval) {
//!     approval.state = armada_domain::approval::ApprovalState::Approved;
//! }
//! ```
//! ```compile_fail
//! fn assign(slot: &mut armada_domain::collab::ChildSlot) {
//!     slot.state = armada_domain::collab::SlotState::Ended;
//! }
//! ```
//!
//! while reading them does:
//!
//! ```
//! use armada_domain::{approval, collab, ledger, run, sandbox::lifecycle};
//! fn read(
//!     r: &run::Run,
//!     c: &ledger::ToolCallRecord,
//!     s: &lifecycle::SandboxRecord,
//!     a: &approval::Approval,
//!     k: &collab::ChildSlot,
//! ) -> String {
//!     format!("{:?} {:?} {:?} {:?} {:?}", r.state(), c.state(), s.state(), a.state(), k.state())
//! }
//! ```

/// A record that changes only through its transitions.
pub trait Machine {
    /// What the record is told.
    type Event;
    /// What the handler does after the change is committed.
    type Action;
    /// Why the record refused an event (it did not change).
    type Refusal;
    /// What a write of the record is conditional on.
    type Version;

    /// Applies `event` at `now_ms`.
    fn apply(
        &mut self,
        event: Self::Event,
        now_ms: i64,
    ) -> Result<Vec<Self::Action>, Self::Refusal>;

    /// The version every write of the record is conditional on.
    fn version(&self) -> Self::Version;
}
