//! The model an agent talks to, and how its calls fail.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;

use armada_domain::agent::ModelSpec;
use armada_domain::chat::{ChatMessage, ModelReply, ToolSpec};

/// How a model call failed: worth trying again, or not.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ModelError {
    #[error("model unavailable: {0}")]
    Retryable(String),
    #[error("model error: {0}")]
    Terminal(String),
}

/// The model an agent talks to.
#[async_trait]
pub trait Model: Send + Sync + Debug {
    async fn complete(
        &self,
        spec: &ModelSpec,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> Result<ModelReply, ModelError>;

    /// Retries what is retryable, up to `attempts`; says how many it took.
    async fn complete_with_retry(
        &self,
        spec: &ModelSpec,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        attempts: u32,
    ) -> Result<(ModelReply, u32), (ModelError, u32)> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.complete(spec, messages, tools).await {
                Ok(r) => return Ok((r, attempt)),
                Err(e @ ModelError::Terminal(_)) => return Err((e, attempt)),
                Err(e) if attempt >= attempts => return Err((e, attempt)),
                Err(e) => {
                    tracing::warn!(attempt, error = %e, "model call failed; retrying");
                    let backoff = Duration::from_millis(100 * (1 << attempt.min(6)));
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }
}
