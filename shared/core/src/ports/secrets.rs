//! Tenants' secrets: stored sealed ([`Secrets`]), sealed and opened by the
//! [`Vault`] (KMS's data keys in AWS, the deployment's derived key on the
//! local stack) only in the function that needs a value.

use std::fmt::Debug;

use async_trait::async_trait;

use armada_domain::secret::{Sealed, Secret, SecretValue};

use crate::cas::Versioned;
use crate::error::StoreError;

#[async_trait]
pub trait Secrets: Send + Sync + Debug {
    /// Writes a new secret; a `Conflict` if the tenant has one of its name.
    async fn create(&self, secret: &Secret) -> Result<(), StoreError>;
    /// Reads a tenant's secret (strongly consistent).
    async fn get(&self, tenant: &str, name: &str) -> Result<Option<Secret>, StoreError>;
    /// Writes `secret` if the stored one is still at `prev_version`; one
    /// its machine deleted is removed.
    async fn update(&self, prev_version: u64, secret: &Secret) -> Result<(), StoreError>;
    /// A tenant's secrets, newest first, at most `limit`.
    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Secret>, StoreError>;
}

/// The key [`crate::cas::change`] reads a secret by.
pub fn key(tenant: &str, name: &str) -> String {
    format!("{tenant}/{name}")
}

/// Every secret store is one of versioned records: secrets change through
/// their machine with [`crate::cas::change`], by [`key`].
#[async_trait]
impl<T: Secrets + ?Sized> Versioned<Secret> for T {
    async fn read(&self, key: &str) -> Result<Option<Secret>, StoreError> {
        let Some((tenant, name)) = key.split_once('/') else {
            return Ok(None);
        };
        self.get(tenant, name).await
    }

    async fn write_if(&self, read: &u64, secret: &Secret) -> Result<(), StoreError> {
        self.update(*read, secret).await
    }
}

/// Opens the secrets of the tenant a call is made for; `None` for a name
/// it has none of.
#[async_trait]
pub trait OpenSecret: Send + Sync + Debug {
    /// Whose secrets these are.
    fn tenant(&self) -> &str;
    async fn open(&self, name: &str) -> Result<Option<SecretValue>, StoreError>;
}

/// Seals values and opens them, each bound to its tenant and name
/// ([`armada_domain::secret::binding`]).
#[async_trait]
pub trait Vault: Send + Sync + Debug {
    async fn seal(
        &self,
        tenant: &str,
        name: &str,
        value: &SecretValue,
    ) -> Result<Sealed, StoreError>;
    /// The value; `Corrupt` when it does not open under this binding.
    async fn open(
        &self,
        tenant: &str,
        name: &str,
        sealed: &Sealed,
    ) -> Result<SecretValue, StoreError>;
}
