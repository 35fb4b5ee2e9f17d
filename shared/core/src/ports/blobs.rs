//! Large bodies in the payload bucket, and the files that come with mail.

use std::fmt::Debug;

use async_trait::async_trait;

use armada_domain::run::Payload;

use crate::error::StoreError;

/// A stored text read no further than a bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bounded {
    Text(String),
    /// Over the bound: `bytes` is its stored size when that was told, or
    /// how much had been read when the bound was passed.
    TooLarge {
        bytes: u64,
    },
}

/// Large bodies (inputs, outputs, turns, results) in the payload bucket.
#[async_trait]
pub trait Blobs: Send + Sync + Debug {
    async fn put_text(&self, key: &str, text: &str) -> Result<(), StoreError>;
    async fn get_text(&self, key: &str) -> Result<String, StoreError>;
    /// Reads at most `max` bytes of the object: for objects someone other
    /// than the platform wrote (a sandbox's outcomes), whose size it does
    /// not control.
    async fn get_text_bounded(&self, key: &str, max: u64) -> Result<Bounded, StoreError>;
    /// Stores bytes that are not text (an email's attachment, the message
    /// itself).
    async fn put_bytes(
        &self,
        key: &str,
        bytes: &[u8],
        content_type: &str,
    ) -> Result<(), StoreError>;
    /// Reads at most `max` bytes of the object: its bytes, or `Err` with
    /// its size (or how much was read) when it is larger.
    async fn get_bytes_bounded(
        &self,
        key: &str,
        max: u64,
    ) -> Result<Result<Vec<u8>, u64>, StoreError>;

    /// Copies the object `from` to `to` unless `to` is there already
    /// (copies of one version, so a copy made twice is the same copy).
    async fn copy_absent(&self, from: &str, to: &str) -> Result<(), StoreError>;

    /// Inline when at most `limit` bytes, else stored under `key`.
    async fn spill(&self, key: &str, text: &str, limit: usize) -> Result<Payload, StoreError> {
        if text.len() <= limit {
            return Ok(Payload::Inline {
                text: text.to_string(),
            });
        }
        self.put_text(key, text).await?;
        Ok(Payload::Stored {
            key: key.to_string(),
            bytes: text.len(),
        })
    }

    async fn read(&self, p: &Payload) -> Result<String, StoreError> {
        match p {
            Payload::Inline { text } => Ok(text.clone()),
            Payload::Stored { key, .. } => self.get_text(key).await,
        }
    }
}
