//! `/v1/tenants/{t}/keys` and `/v1/keys/{id}` (admin): API keys, shown once.

use crate::*;

pub(crate) async fn mint_key(svc: &Services, tenant: &str) -> ApiResult {
    if !valid_tenant(tenant) {
        return Err(ApiError::new(
            400,
            "INVALID_FIELD",
            "tenant: must be 1-64 characters of a-z, 0-9 or '-'",
        ));
    }
    let key = ApiKey::mint();
    svc.registry
        .put_key(
            &StoredKey {
                key_id: key.key_id.clone(),
                tenant: tenant.to_string(),
                secret_sha256: key.secret_hash(),
                revoked: false,
            },
            svc.clock.now_ms(),
        )
        .await
        .map_err(store_err)?;
    Ok((
        201,
        json!({"key": key.token(), "key_id": key.key_id, "tenant": tenant}),
    ))
}

pub(crate) async fn revoke_key(svc: &Services, key_id: &str) -> ApiResult {
    match svc.registry.revoke_key(key_id, svc.clock.now_ms()).await {
        Ok(()) => Ok((200, json!({"key_id": key_id, "revoked": true}))),
        Err(StoreError::Conflict { .. }) => Err(ApiError::not_found(&format!("key '{key_id}'"))),
        Err(e) => Err(store_err(e)),
    }
}
