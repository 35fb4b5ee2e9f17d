//! Who is calling: the bearer key checked (the admin key by its hash, tenant
//! keys by their stored hash, in constant time) and what each may do.

use crate::*;

pub(crate) fn tenant(who: &Principal) -> Result<&str, ApiError> {
    match who {
        Principal::Tenant(t) => Ok(t),
        Principal::Admin => Err(ApiError::forbidden(
            "the admin key manages agents and keys; use a tenant key for runs and sessions",
        )),
    }
}

pub(crate) fn admin(who: &Principal) -> Result<(), ApiError> {
    match who {
        Principal::Admin => Ok(()),
        Principal::Tenant(_) => Err(ApiError::forbidden("this operation needs the admin key")),
    }
}

pub(crate) async fn authenticate(svc: &Services, req: &Request) -> Result<Principal, ApiError> {
    let header = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(ApiError::unauthorized)?;
    let token = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
        .ok_or_else(ApiError::unauthorized)?
        .trim();
    if digest_eq(&sha256_hex(token.as_bytes()), &svc.cfg.admin_key_sha256) {
        return Ok(Principal::Admin);
    }
    let key = ApiKey::parse(token).ok_or_else(ApiError::unauthorized)?;
    let stored = svc
        .registry
        .key(&key.key_id)
        .await
        .map_err(store_err)?
        .ok_or_else(ApiError::unauthorized)?;
    if stored.revoked || !digest_eq(&stored.secret_sha256, &key.secret_hash()) {
        return Err(ApiError::unauthorized());
    }
    Ok(Principal::Tenant(stored.tenant))
}
