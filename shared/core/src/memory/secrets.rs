//! Tenants' secrets in memory, sealed as they are stored in DynamoDB.

use async_trait::async_trait;

use armada_domain::secret::{Secret, SecretState};

use super::{conflict, Memory};
use crate::error::StoreError;
use crate::ports::secrets::{key, Secrets};

#[async_trait]
impl Secrets for Memory {
    async fn create(&self, secret: &Secret) -> Result<(), StoreError> {
        let mut st = self.state();
        let k = key(&secret.tenant, &secret.name);
        if st.secrets.contains_key(&k) {
            return Err(conflict(None));
        }
        st.secrets.insert(k, secret.clone());
        Ok(())
    }

    async fn get(&self, tenant: &str, name: &str) -> Result<Option<Secret>, StoreError> {
        Ok(self.state().secrets.get(&key(tenant, name)).cloned())
    }

    async fn update(&self, prev_version: u64, secret: &Secret) -> Result<(), StoreError> {
        let mut st = self.state();
        let k = key(&secret.tenant, &secret.name);
        match st.secrets.get(&k) {
            Some(s) if s.version == prev_version => {}
            _ => return Err(conflict(None)),
        }
        if secret.state() == SecretState::Deleted {
            st.secrets.remove(&k);
        } else {
            st.secrets.insert(k, secret.clone());
        }
        Ok(())
    }

    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Secret>, StoreError> {
        let mut of: Vec<Secret> = self
            .state()
            .secrets
            .values()
            .filter(|s| s.tenant == tenant)
            .cloned()
            .collect();
        of.sort_by_key(|s| std::cmp::Reverse((s.created_at_ms, s.name.clone())));
        of.truncate(limit);
        Ok(of)
    }
}
