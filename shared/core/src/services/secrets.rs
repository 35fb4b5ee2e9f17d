//! Tenants' secrets put, deleted and used: every change through the
//! secret's machine ([`crate::cas::change`]), every value sealed by the
//! [`Vault`] before it is stored and opened only where a call needs it.

use async_trait::async_trait;

use std::collections::BTreeMap;

use armada_domain::secret::{
    Configured, Scrubber, Secret, SecretEvent, SecretValue, MAX_PER_TENANT,
};

use crate::cas::{change, Changed};
use crate::error::StoreError;
use crate::ports::secrets::{key, OpenSecret};
use crate::Services;

/// Why a secret could not be put or used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// `SECRET_NOT_FOUND`: the tenant has no secret of this name.
    #[error("no secret '{0}'")]
    NotFound(String),
    /// `TOO_MANY_SECRETS`.
    #[error("a tenant holds at most {MAX_PER_TENANT} secrets")]
    TooMany,
    #[error("the secret is changing quickly; retry")]
    Busy,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Puts `value` as the tenant's secret `name` (a new one, or a new value
/// for one it has). `true` when it was new.
pub async fn put(
    svc: &Services,
    tenant: &str,
    name: &str,
    value: &SecretValue,
) -> Result<bool, SecretError> {
    let sealed = svc.vault.seal(tenant, name, value).await?;
    for _ in 0..crate::cas::ATTEMPTS {
        if svc.secrets.get(tenant, name).await?.is_none() {
            // Listed from an index: a burst of creations may pass the
            // bound by a few, never by many.
            let held = svc.secrets.of_tenant(tenant, MAX_PER_TENANT).await?;
            if held.len() >= MAX_PER_TENANT {
                return Err(SecretError::TooMany);
            }
            let secret = Secret::new(tenant, name, sealed.clone(), svc.clock.now_ms());
            match svc.secrets.create(&secret).await {
                Ok(()) => return Ok(true),
                // Created meanwhile: changed below.
                Err(StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let changed = change(
            svc.secrets.as_ref(),
            &key(tenant, name),
            || svc.clock.now_ms(),
            |_: &Secret| Some(SecretEvent::Put(sealed.clone())),
        )
        .await?;
        match changed {
            Some(Changed::Written(..)) => return Ok(false),
            // Deleted meanwhile: created again.
            Some(Changed::Missing | Changed::Refused(..)) => continue,
            Some(Changed::Left(_)) | None => return Err(SecretError::Busy),
        }
    }
    Err(SecretError::Busy)
}

/// Deletes the tenant's secret `name`: what names it fails from now on.
pub async fn delete(svc: &Services, tenant: &str, name: &str) -> Result<(), SecretError> {
    let changed = change(
        svc.secrets.as_ref(),
        &key(tenant, name),
        || svc.clock.now_ms(),
        |_: &Secret| Some(SecretEvent::Delete),
    )
    .await?;
    match changed {
        Some(Changed::Written(..)) => Ok(()),
        Some(Changed::Missing | Changed::Refused(..)) => Err(SecretError::NotFound(name.into())),
        Some(Changed::Left(_)) | None => Err(SecretError::Busy),
    }
}

/// The value of the tenant's secret `name`, opened.
pub async fn open(svc: &Services, tenant: &str, name: &str) -> Result<SecretValue, SecretError> {
    let secret = svc
        .secrets
        .get(tenant, name)
        .await?
        .ok_or_else(|| SecretError::NotFound(name.into()))?;
    Ok(svc.vault.open(tenant, name, secret.sealed()).await?)
}

/// Why configured headers could not be opened for a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// `SECRET_NOT_FOUND`: the tenant has no secret of this name.
    #[error("no secret '{secret}' (header {header})")]
    NotFound { secret: String, header: String },
    /// `SECRET_UNAVAILABLE`: the store or the vault did not answer.
    #[error("secret '{0}' could not be read; retry")]
    Unavailable(String),
}

impl HeaderError {
    pub fn code(&self) -> &'static str {
        match self {
            HeaderError::NotFound { .. } => "SECRET_NOT_FOUND",
            HeaderError::Unavailable(_) => "SECRET_UNAVAILABLE",
        }
    }
}

/// One configured value opened for a call: whose it is (a header's, a
/// variable's), its value, and the secret it came from, if one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedValue {
    pub name: String,
    pub value: String,
    pub secret: Option<String>,
}

/// What configured values come to for a call: each literal as written,
/// each secret opened from `secrets` (the Run's tenant's).
pub async fn open_configured(
    configured: &BTreeMap<String, Configured>,
    secrets: &dyn OpenSecret,
) -> Result<Vec<OpenedValue>, HeaderError> {
    let mut out = Vec::with_capacity(configured.len());
    for (name, value) in configured {
        let (value, secret) = match value {
            Configured::Literal(v) => (v.clone(), None),
            Configured::Secret { secret } => match secrets.open(secret).await {
                Ok(Some(v)) => (v.expose().to_string(), Some(secret.clone())),
                Ok(None) => {
                    return Err(HeaderError::NotFound {
                        secret: secret.clone(),
                        header: name.clone(),
                    })
                }
                Err(e) => {
                    tracing::warn!(secret, error = %e, "a configured secret could not be opened");
                    return Err(HeaderError::Unavailable(secret.clone()));
                }
            },
        };
        out.push(OpenedValue {
            name: name.clone(),
            value,
            secret,
        });
    }
    Ok(out)
}

/// What configured headers come to for a call ([`open_configured`]),
/// and a [`Scrubber`] of the opened secrets for what the call answers.
///
/// [`Scrubber`]: armada_domain::secret::Scrubber
pub async fn open_headers(
    headers: &BTreeMap<String, Configured>,
    secrets: &dyn OpenSecret,
) -> Result<(Vec<(String, String)>, Scrubber), HeaderError> {
    let opened = open_configured(headers, secrets).await?;
    let scrubber = Scrubber::new(opened.iter().filter_map(|o| {
        let secret = o.secret.clone()?;
        Some((secret, SecretValue::new(o.value.clone())))
    }));
    let pairs = opened.into_iter().map(|o| (o.name, o.value)).collect();
    Ok((pairs, scrubber))
}

/// The secrets of one tenant, as a call made for one of its Runs opens
/// them.
#[derive(Debug)]
pub struct TenantSecrets<'a> {
    pub svc: &'a Services,
    pub tenant: &'a str,
}

#[async_trait]
impl OpenSecret for TenantSecrets<'_> {
    fn tenant(&self) -> &str {
        self.tenant
    }

    async fn open(&self, name: &str) -> Result<Option<SecretValue>, StoreError> {
        match open(self.svc, self.tenant, name).await {
            Ok(v) => Ok(Some(v)),
            Err(SecretError::NotFound(_)) => Ok(None),
            Err(SecretError::Store(e)) => Err(e),
            Err(e) => Err(StoreError::Retryable(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::test_config;

    #[tokio::test]
    async fn a_secret_is_stored_sealed_replaced_and_deleted() {
        let (svc, mem) = Services::in_memory(test_config());
        let v1 = SecretValue::new("tok-111111".into());
        assert!(put(&svc, "acme", "crm", &v1).await.unwrap());
        let stored = mem.state().secrets.get("acme/crm").cloned().unwrap();
        let raw = serde_json::to_string(&stored).unwrap();
        assert!(!raw.contains("tok-111111"), "{raw}");
        assert_eq!(open(&svc, "acme", "crm").await.unwrap(), v1);
        // Another tenant has none of that name; a value moved to it
        // does not open there.
        assert!(matches!(
            open(&svc, "other", "crm").await,
            Err(SecretError::NotFound(n)) if n == "crm"
        ));
        let moved = svc.vault.open("other", "crm", stored.sealed()).await;
        assert!(matches!(moved, Err(StoreError::Corrupt(_))));
        let v2 = SecretValue::new("tok-222222".into());
        assert!(!put(&svc, "acme", "crm", &v2).await.unwrap());
        assert_eq!(open(&svc, "acme", "crm").await.unwrap(), v2);
        assert_eq!(
            svc.secrets
                .get("acme", "crm")
                .await
                .unwrap()
                .unwrap()
                .version,
            2
        );
        delete(&svc, "acme", "crm").await.unwrap();
        assert!(matches!(
            delete(&svc, "acme", "crm").await,
            Err(SecretError::NotFound(_))
        ));
        assert!(mem.state().secrets.is_empty());
        // Put again after the delete: a new secret.
        assert!(put(&svc, "acme", "crm", &v1).await.unwrap());
    }

    #[tokio::test]
    async fn configured_headers_open_and_are_remembered_for_scrubbing() {
        let (svc, _) = Services::in_memory(test_config());
        put(&svc, "acme", "crm", &SecretValue::new("tok-333333".into()))
            .await
            .unwrap();
        let secret = |n: &str| Configured::Secret { secret: n.into() };
        let mut headers = BTreeMap::new();
        headers.insert("X-Plain".to_string(), Configured::Literal("plain".into()));
        headers.insert("Authorization".to_string(), secret("crm"));
        let acme = TenantSecrets {
            svc: &svc,
            tenant: "acme",
        };
        let (sent, scrubber) = open_headers(&headers, &acme).await.unwrap();
        assert_eq!(
            sent,
            [
                ("Authorization".to_string(), "tok-333333".to_string()),
                ("X-Plain".to_string(), "plain".to_string())
            ]
        );
        assert_eq!(
            scrubber.scrub_str("Bearer tok-333333"),
            "Bearer [secret:crm]"
        );
        headers.insert("X-Other".to_string(), secret("nope"));
        let e = open_headers(&headers, &acme).await.unwrap_err();
        assert_eq!(e.code(), "SECRET_NOT_FOUND");
        assert_eq!(e.to_string(), "no secret 'nope' (header X-Other)");
        // Another tenant's secrets are not the Run's.
        let other = TenantSecrets {
            svc: &svc,
            tenant: "other",
        };
        headers.remove("X-Other");
        assert!(open_headers(&headers, &other).await.is_err());
    }

    #[tokio::test]
    async fn a_tenant_holds_a_bounded_number_of_secrets() {
        let (svc, _) = Services::in_memory(test_config());
        let v = SecretValue::new("value".into());
        for i in 0..MAX_PER_TENANT {
            put(&svc, "acme", &format!("s{i}"), &v).await.unwrap();
        }
        assert!(matches!(
            put(&svc, "acme", "one-more", &v).await,
            Err(SecretError::TooMany)
        ));
        // A new value for one it holds is no new secret.
        put(&svc, "acme", "s0", &v).await.unwrap();
        put(&svc, "other", "s0", &v).await.unwrap();
    }
}
