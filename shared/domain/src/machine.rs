//! The one shape of every record's machine: it is told an event and the
//! time, changes the record or refuses (changing nothing), and says what
//! the handler must do once the change is committed. Handlers load a
//! record, apply, write it conditional on the version they read, and
//! carry out the actions; the decisions are the machine's alone.

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
