//! The vault of a deployment that names a KMS key (`SecretsKmsKey`):
//! envelope encryption. Each value gets a data key of its own
//! (`GenerateDataKey`, AES-256, under the key) with the value's binding as
//! the encryption context; the value is sealed with AES-256-GCM under that
//! data key, which is then dropped, and only KMS's wrapping of it is kept.
//! Opening asks KMS to unwrap it under the same context, so a value moved
//! to another tenant or name does not open, and every opening is one
//! CloudTrail entry. Values sealed before the key was named (under the
//! derived key) still open.

use async_trait::async_trait;
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::DataKeySpec;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use armada_domain::secret::{binding, Sealed, SecretValue, DERIVED_KEY};

use super::vault::{open_under, seal_under, DerivedVault};
use crate::error::{classify, StoreError};
use crate::ports::Vault;

/// The encryption context's one key.
const CONTEXT_KEY: &str = "armada-secret";

#[derive(Debug)]
pub struct KmsVault {
    kms: aws_sdk_kms::Client,
    key_id: String,
    derived: DerivedVault,
}

impl KmsVault {
    /// Seals under `key_id` (an ARN, id or alias); `derived` opens what
    /// was sealed before.
    pub fn new(kms: aws_sdk_kms::Client, key_id: &str, derived: DerivedVault) -> KmsVault {
        KmsVault {
            kms,
            key_id: key_id.to_string(),
            derived,
        }
    }
}

fn data_key(bytes: &[u8]) -> Result<[u8; 32], StoreError> {
    bytes
        .try_into()
        .map_err(|_| StoreError::Corrupt("KMS gave a data key that is not 256 bits".into()))
}

#[async_trait]
impl Vault for KmsVault {
    async fn seal(
        &self,
        tenant: &str,
        name: &str,
        value: &SecretValue,
    ) -> Result<Sealed, StoreError> {
        let context = binding(tenant, name);
        let out = self
            .kms
            .generate_data_key()
            .key_id(&self.key_id)
            .key_spec(DataKeySpec::Aes256)
            .encryption_context(CONTEXT_KEY, &context)
            .send()
            .await
            .map_err(classify)?;
        let (Some(plain), Some(wrapped)) = (out.plaintext(), out.ciphertext_blob()) else {
            return Err(StoreError::Corrupt("KMS gave no data key".into()));
        };
        let key = data_key(plain.as_ref())?;
        Ok(Sealed {
            key: out.key_id().unwrap_or(&self.key_id).to_string(),
            wrapped_key: Some(BASE64.encode(wrapped.as_ref())),
            value: seal_under(&key, &context, value)?,
        })
    }

    async fn open(
        &self,
        tenant: &str,
        name: &str,
        sealed: &Sealed,
    ) -> Result<SecretValue, StoreError> {
        if sealed.key == DERIVED_KEY {
            return self.derived.open(tenant, name, sealed).await;
        }
        let corrupt = || StoreError::Corrupt(format!("secret '{name}' does not open"));
        let wrapped = sealed.wrapped_key.as_deref().ok_or_else(corrupt)?;
        let wrapped = BASE64.decode(wrapped).map_err(|_| corrupt())?;
        let context = binding(tenant, name);
        let out = self
            .kms
            .decrypt()
            .key_id(&sealed.key)
            .ciphertext_blob(Blob::new(wrapped))
            .encryption_context(CONTEXT_KEY, &context)
            .send()
            .await
            .map_err(|e| {
                // Another context or key: this value is not this secret.
                // A refusal (access denied, a disabled key) is not the
                // value's fault: the secret is unavailable, not corrupt.
                let foreign = e.as_service_error().is_some_and(|se| {
                    se.is_invalid_ciphertext_exception() || se.is_incorrect_key_exception()
                });
                if foreign {
                    corrupt()
                } else {
                    classify(e)
                }
            })?;
        let key = data_key(out.plaintext().ok_or_else(corrupt)?.as_ref())?;
        open_under(&key, &context, &sealed.value, name)
    }
}
