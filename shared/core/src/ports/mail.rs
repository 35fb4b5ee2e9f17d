//! Outbound email.

use std::fmt::Debug;

use async_trait::async_trait;

/// Outbound email.
#[async_trait]
pub trait Mail: Send + Sync + Debug {
    /// Sends one message to `to`; the provider's message id.
    async fn send(&self, to: &str, subject: &str, text: &str) -> Result<String, String>;
    /// Sends a whole message (headers and body, as built) from `from` to
    /// `to`; the provider's message id.
    async fn send_raw(&self, from: &str, to: &str, message: &str) -> Result<String, String>;
}
