//! `/v1/tenants/{t}/keys` and `/v1/keys/{id}` (admin): API keys, shown
//! once; `/v1/tenants/{t}/callback-secret`: the tenant's callback signing
//! secret, rotated and shown once.

use armada_domain::api::KeyRole;
use armada_domain::fields::Fields;

use crate::*;

/// `POST /v1/tenants/{t}/keys {"role"?: "member" | "approver", "owner"?:
/// address}` (the body is optional; `member` by default). An `approver`
/// key also decides the tenant's approvals. `owner`, the address of the
/// person the key is for, holds four eyes across keys and links: a Run
/// the key starts is not let go on through that address's approval link.
pub(crate) async fn mint_key(svc: &Services, req: &Request, tenant: &str) -> ApiResult {
    if !valid_tenant(tenant) {
        return Err(ApiError::new(
            400,
            "INVALID_FIELD",
            "tenant: must be 1-64 characters of a-z, 0-9 or '-'",
        ));
    }
    let (role, owner) = if req.body().is_empty() {
        (KeyRole::Member, None)
    } else {
        let body = body_json(req)?;
        let f = Fields::new(&body)?;
        f.only(&["role", "owner"])?;
        let role = match f.opt_str("role")? {
            None => KeyRole::Member,
            Some(r) => KeyRole::parse(r).ok_or_else(|| {
                ApiError::new(400, "INVALID_FIELD", "role: must be member or approver")
            })?,
        };
        let owner = match f.opt_str("owner")? {
            None => None,
            Some(o) if armada_domain::approval::policy::valid_email(o) => {
                Some(o.to_ascii_lowercase())
            }
            Some(_) => {
                return Err(ApiError::new(
                    400,
                    "INVALID_FIELD",
                    "owner: must be an email address",
                ))
            }
        };
        (role, owner)
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
                owner: owner.clone(),
            },
            svc.clock.now_ms(),
        )
        .await
        .map_err(store_err)?;
    Ok((
        201,
        json!({"key": key.token(), "key_id": key.key_id, "tenant": tenant, "role": role.as_str(), "owner": owner}),
    ))
}

pub(crate) async fn revoke_key(svc: &Services, key_id: &str) -> ApiResult {
    match svc.registry.revoke_key(key_id, svc.clock.now_ms()).await {
        Ok(()) => Ok((200, json!({"key_id": key_id, "revoked": true}))),
        Err(StoreError::Conflict { .. }) => Err(ApiError::not_found(&format!("key '{key_id}'"))),
        Err(e) => Err(store_err(e)),
    }
}

/// `POST /v1/tenants/{t}/callback-secret`: a new salt, so a new secret,
/// shown in this answer only (it is derived, never stored). The admin, or
/// a member key of the tenant itself; another tenant's is 404.
pub(crate) async fn rotate_callback_secret(
    svc: &Services,
    who: &Principal,
    tenant: &str,
) -> ApiResult {
    match who {
        Principal::Admin => {}
        Principal::Tenant(k) if k.tenant == tenant && k.role == KeyRole::Member => {}
        Principal::Tenant(k) if k.tenant == tenant => {
            return Err(ApiError::new(
                403,
                "FORBIDDEN",
                "an approver key cannot rotate secrets",
            ))
        }
        Principal::Tenant(_) => return Err(ApiError::not_found(&format!("tenant '{tenant}'"))),
    }
    if !valid_tenant(tenant) {
        return Err(ApiError::new(
            400,
            "INVALID_FIELD",
            "tenant: must be 1-64 characters of a-z, 0-9 or '-'",
        ));
    }
    let salt = armada_domain::approval::new_token();
    let now = svc.clock.now_ms();
    svc.registry
        .put_callback_salt(tenant, &salt, now)
        .await
        .map_err(store_err)?;
    let secret = svc
        .callbacks
        .tenant_secret(svc.registry.as_ref(), tenant)
        .await
        .map_err(store_err)?;
    Ok((
        201,
        json!({"tenant": tenant, "secret": secret, "rotated_at": armada_core::clock::rfc3339(now)}),
    ))
}
