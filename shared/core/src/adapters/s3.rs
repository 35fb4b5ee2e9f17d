//! Large bodies in S3: inputs and outputs above the inline limit are stored
//! in the payload bucket and referenced by key.

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;

use async_trait::async_trait;

use crate::error::{classify, StoreError};
use crate::ports::{Blobs, Bounded};

/// An object's whole body.
pub(crate) async fn object_bytes(
    s3: &Client,
    bucket: &str,
    key: &str,
) -> Result<Vec<u8>, StoreError> {
    let out = s3
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(classify)?;
    Ok(out
        .body
        .collect()
        .await
        .map_err(|e| StoreError::Retryable(e.to_string()))?
        .into_bytes()
        .to_vec())
}

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
        let bytes = object_bytes(&self.s3, &self.bucket, key).await?;
        String::from_utf8(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
    }

    async fn get_text_bounded(&self, key: &str, max: u64) -> Result<Bounded, StoreError> {
        match self.get_bytes_bounded(key, max).await? {
            Ok(bytes) => String::from_utf8(bytes)
                .map_err(|e| StoreError::Corrupt(e.to_string()))
                .map(Bounded::Text),
            Err(bytes) => Ok(Bounded::TooLarge { bytes }),
        }
    }

    async fn put_bytes(
        &self,
        key: &str,
        bytes: &[u8],
        content_type: &str,
    ) -> Result<(), StoreError> {
        self.s3
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type(content_type)
            .body(ByteStream::from(bytes.to_vec()))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn copy_absent(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let head = self
            .s3
            .head_object()
            .bucket(&self.bucket)
            .key(to)
            .send()
            .await;
        match head {
            Ok(_) => return Ok(()),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => {}
            Err(e) => return Err(classify(e)),
        }
        self.s3
            .copy_object()
            .bucket(&self.bucket)
            .key(to)
            .copy_source(format!("{}/{from}", self.bucket))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn get_bytes_bounded(
        &self,
        key: &str,
        max: u64,
    ) -> Result<Result<Vec<u8>, u64>, StoreError> {
        let out = self
            .s3
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(classify)?;
        // The stored length refuses most oversized objects before a byte
        // of them is read; the count below holds when it is absent or
        // wrong (the body is what is read, not what was announced).
        if let Some(len) = out.content_length().and_then(|l| u64::try_from(l).ok()) {
            if len > max {
                return Ok(Err(len));
            }
        }
        let mut body = out.body;
        let mut buf = Vec::new();
        while let Some(chunk) = body
            .try_next()
            .await
            .map_err(|e| StoreError::Retryable(e.to_string()))?
        {
            let read = (buf.len() + chunk.len()) as u64;
            if read > max {
                return Ok(Err(read));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Ok(buf))
    }
}
