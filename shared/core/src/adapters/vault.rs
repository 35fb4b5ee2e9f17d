//! The vault of the local stack (and of a deployment that names no KMS
//! key): AES-256-GCM under a key derived from the deployment secret.

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use armada_domain::crypto::{aead_open, aead_seal, derive_key};
use armada_domain::secret::{binding, Sealed, SecretValue, DERIVED_KEY};

use crate::config::Config;
use crate::error::StoreError;
use crate::ports::Vault;

/// Seals with AES-256-GCM under a key derived from the deployment secret:
/// whoever holds that secret can open every value, so it is the local
/// stack's vault (and a deployment's until it names a KMS key).
pub struct DerivedVault {
    key: [u8; 32],
}

impl DerivedVault {
    pub fn of(cfg: &Config) -> DerivedVault {
        DerivedVault::new(&cfg.callback_signing_secret)
    }

    pub fn new(deployment_secret: &str) -> DerivedVault {
        DerivedVault {
            key: derive_key(deployment_secret, "armada-secrets v1"),
        }
    }
}

impl std::fmt::Debug for DerivedVault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DerivedVault(..)")
    }
}

/// `value` sealed under `key`, bound to its secret's `context`
/// ([`binding`]): the nonce, ciphertext and tag, in base64.
pub(crate) fn seal_under(
    key: &[u8; 32],
    context: &str,
    value: &SecretValue,
) -> Result<String, StoreError> {
    let sealed = aead_seal(key, context.as_bytes(), value.expose().as_bytes())
        .ok_or_else(|| StoreError::Retryable("no randomness to seal with".into()))?;
    Ok(BASE64.encode(sealed))
}

/// What [`seal_under`] sealed, if `key` and `context` are the ones it was
/// sealed with; `Corrupt` (naming secret `name`) otherwise.
pub(crate) fn open_under(
    key: &[u8; 32],
    context: &str,
    sealed: &str,
    name: &str,
) -> Result<SecretValue, StoreError> {
    let corrupt = || StoreError::Corrupt(format!("secret '{name}' does not open"));
    let bytes = BASE64.decode(sealed).map_err(|_| corrupt())?;
    let plain = aead_open(key, context.as_bytes(), &bytes).ok_or_else(corrupt)?;
    String::from_utf8(plain)
        .map(SecretValue::new)
        .map_err(|_| corrupt())
}

#[async_trait]
impl Vault for DerivedVault {
    async fn seal(
        &self,
        tenant: &str,
        name: &str,
        value: &SecretValue,
    ) -> Result<Sealed, StoreError> {
        Ok(Sealed {
            key: DERIVED_KEY.into(),
            wrapped_key: None,
            value: seal_under(&self.key, &binding(tenant, name), value)?,
        })
    }

    async fn open(
        &self,
        tenant: &str,
        name: &str,
        sealed: &Sealed,
    ) -> Result<SecretValue, StoreError> {
        if sealed.key != DERIVED_KEY {
            return Err(StoreError::Corrupt(format!(
                "secret '{name}' does not open"
            )));
        }
        open_under(&self.key, &binding(tenant, name), &sealed.value, name)
    }
}
