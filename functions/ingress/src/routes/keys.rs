//! `/v1/tenants/{t}/keys` and `/v1/keys/{id}` (admin): API keys, shown once.

use armada_domain::api::KeyRole;
use armada_domain::fields::Fields;

use crate::*;

/// `POST /v1/tenants/{t}/keys {"role"?: "member" | "approver"}` (the
/// body is optional; `member` by default). An `approver` key also decides
/// the tenant's approvals.
pub(crate) async fn mint_key(svc: &Services, req: &Request, tenant: &str) -> ApiResult {
    if !valid_tenant(tenant) {
        return Err(ApiError::new(
            400,
            "INVALID_FIELD",
            "tenant: must be 1-64 characters of a-z, 0-9 or '-'",
        ));
    }
    let role = if req.body().is_empty() {
        KeyRole::Member
    } else {
        let body = body_json(req)?;
        let f = Fields::new(&body)?;
        f.only(&["role"])?;
        match f.opt_str("role")? {
            None => KeyRole::Member,
            Some(r) => KeyRole::parse(r).ok_or_else(|| {
                ApiError::new(400, "INVALID_FIELD", "role: must be member or approver")
            })?,
        }
    };
    let key = ApiKey::mint();
    svc.registry
        .put_key(
            &StoredKey {
                key_id: key.key_id.clone(),
                tenant: tenant.to_string(),
                secret_sha256: key.secret_hash(),
                revoked: false,
                role,
            },
            svc.clock.now_ms(),
        )
        .await
        .map_err(store_err)?;
    Ok((
        201,
        json!({"key": key.token(), "key_id": key.key_id, "tenant": tenant, "role": role.as_str()}),
    ))
}

pub(crate) async fn revoke_key(svc: &Services, key_id: &str) -> ApiResult {
    match svc.registry.revoke_key(key_id, svc.clock.now_ms()).await {
        Ok(()) => Ok((200, json!({"key_id": key_id, "revoked": true}))),
        Err(StoreError::Conflict { .. }) => Err(ApiError::not_found(&format!("key '{key_id}'"))),
        Err(e) => Err(store_err(e)),
    }
}
