//! `/v1/sandboxes`: a tenant's sandboxes, and their destruction (admin).

use crate::*;

/// Whose sandboxes: a tenant key sees its own; the admin names a tenant.
pub(crate) fn sandbox_tenant(who: &Principal, req: &Request) -> Result<String, ApiError> {
    match who {
        Principal::Tenant(k) => Ok(k.tenant.clone()),
        Principal::Admin => query(req)
            .get("tenant")
            .filter(|t| valid_tenant(t))
            .cloned()
            .ok_or_else(|| {
                ApiError::new(
                    400,
                    "INVALID_FIELD",
                    "tenant: the admin key names the tenant (?tenant=)",
                )
            }),
    }
}

pub(crate) async fn list_sandboxes(svc: &Services, tenant: &str) -> ApiResult {
    let list = svc.sandboxes.list(tenant).await.map_err(store_err)?;
    let views: Vec<Value> = list.iter().map(sandboxing::view).collect();
    Ok((200, json!({"sandboxes": views})))
}

pub(crate) async fn get_sandbox(svc: &Services, tenant: &str, agent: &str) -> ApiResult {
    match svc.sandboxes.get(tenant, agent).await.map_err(store_err)? {
        Some(rec) => Ok((200, sandboxing::view(&rec))),
        None => Err(ApiError::not_found(&format!("sandbox of agent '{agent}'"))),
    }
}

pub(crate) async fn destroy_sandbox(svc: &Services, tenant: &str, agent: &str) -> ApiResult {
    match sandboxing::destroy(svc, tenant, agent, "destroyed by an administrator")
        .await
        .map_err(store_err)?
    {
        Some(rec) => Ok((200, sandboxing::view(&rec))),
        None => Err(ApiError::not_found(&format!("sandbox of agent '{agent}'"))),
    }
}
