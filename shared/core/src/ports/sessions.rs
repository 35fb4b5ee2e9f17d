//! AgentSession headers and turns.

use std::fmt::Debug;

use async_trait::async_trait;

use armada_domain::context::HistoryTurn;
use armada_domain::session::SessionHeader;

use crate::error::StoreError;

/// Session headers, their message index and their history.
#[async_trait]
pub trait Sessions: Send + Sync + Debug {
    /// Creates a session; an existing id is a `Conflict`.
    async fn create(&self, h: &SessionHeader) -> Result<(), StoreError>;
    async fn header(&self, session_id: &str) -> Result<Option<SessionHeader>, StoreError>;
    /// The Run that carries message `seq`.
    async fn message_run(&self, session_id: &str, seq: u64) -> Result<Option<String>, StoreError>;
    /// The whole history, oldest first, with stored contents read back.
    async fn history(&self, session_id: &str) -> Result<Vec<HistoryTurn>, StoreError>;
    /// Counts message `seq` as done, if `seq - 1` is the last one done.
    async fn mark_done(&self, session_id: &str, seq: u64) -> Result<(), StoreError>;
}
