//! Tenants' secrets in the triggers table, as its other owned records
//! are: one item each (`pk = secret#<tenant>/<name>`), listed by tenant,
//! every write after creation conditional on the version read. Only the
//! sealed value is stored.

use async_trait::async_trait;

use armada_domain::secret::{Secret, SecretState};

use super::TriggerStore;
use crate::error::StoreError;
use crate::ports::secrets::{key, Secrets};

const KIND: &str = "secret";

#[async_trait]
impl Secrets for TriggerStore {
    async fn create(&self, secret: &Secret) -> Result<(), StoreError> {
        self.create_owned(item(secret)).await
    }

    async fn get(&self, tenant: &str, name: &str) -> Result<Option<Secret>, StoreError> {
        self.get_owned(KIND, &key(tenant, name)).await
    }

    async fn update(&self, prev_version: u64, secret: &Secret) -> Result<(), StoreError> {
        let written = (secret.state() != SecretState::Deleted).then(|| item(secret));
        let id = key(&secret.tenant, &secret.name);
        self.write_owned_if(KIND, &id, prev_version, written).await
    }

    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Secret>, StoreError> {
        self.list_owned(KIND, tenant, limit).await
    }
}

fn item(s: &Secret) -> crate::adapters::dynamo::item::Item {
    TriggerStore::owned_item(
        KIND,
        &key(&s.tenant, &s.name),
        &s.tenant,
        s.created_at_ms,
        s.version,
        s,
    )
}
