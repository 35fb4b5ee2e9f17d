//! Large bodies in S3: inputs and outputs above the inline limit are stored
//! in the payload bucket and referenced by key.

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;

use async_trait::async_trait;

use crate::error::{classify, StoreError};
use crate::ports::Blobs;

#[derive(Debug, Clone)]
pub struct Payloads {
    s3: Client,
    bucket: String,
}

impl Payloads {
    pub fn new(s3: Client, bucket: &str) -> Self {
        Payloads {
            s3,
            bucket: bucket.to_string(),
        }
    }
}

#[async_trait]
impl Blobs for Payloads {
    async fn put_text(&self, key: &str, text: &str) -> Result<(), StoreError> {
        self.s3
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type("text/plain; charset=utf-8")
            .body(ByteStream::from(text.as_bytes().to_vec()))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn get_text(&self, key: &str) -> Result<String, StoreError> {
        let out = self
            .s3
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(classify)?;
        let bytes = out
            .body
            .collect()
            .await
            .map_err(|e| StoreError::Retryable(e.to_string()))?
            .into_bytes();
        String::from_utf8(bytes.to_vec()).map_err(|e| StoreError::Corrupt(e.to_string()))
    }
}
