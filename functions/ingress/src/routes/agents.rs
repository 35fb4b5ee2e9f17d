//! `/v1/agents` (admin writes): definitions, their versions, deletion
//! (which destroys the agent's sandboxes in every tenant).

use crate::*;

pub(crate) async fn agent_named(svc: &Services, name: &str) -> Result<AgentDefinition, ApiError> {
    svc.registry
        .agent(name)
        .await
        .map_err(store_err)?
        .ok_or_else(|| ApiError::not_found(&format!("agent '{name}'")))
}

pub(crate) fn agent_json(def: &AgentDefinition, version: u64) -> Value {
    let mut v = serde_json::to_value(def).unwrap_or(Value::Null);
    v["version"] = json!(version);
    v
}

/// The definition as a tenant's key sees it. Agents are shared by every
/// tenant, and some fields are the operator's: the chat webhook URL is a
/// bearer secret (whoever holds it posts to the channel), the approvers'
/// addresses are people's, and the model's endpoint and key variable map
/// the deployment. What a tenant needs to call the agent stays.
pub(crate) fn tenant_agent_json(def: &AgentDefinition, version: u64) -> Value {
    let mut v = agent_json(def, version);
    if let Some(model) = v.get_mut("model").and_then(Value::as_object_mut) {
        model.remove("base_url");
        model.remove("api_key_env");
    }
    if let Some(approvals) = v.get_mut("approvals").and_then(Value::as_object_mut) {
        approvals.remove("chat_webhook_url");
        approvals.remove("approvers");
    }
    v
}

/// The whole definition for the admin key, the tenant's view otherwise.
fn view(who: &Principal) -> fn(&AgentDefinition, u64) -> Value {
    match who {
        Principal::Admin => agent_json,
        Principal::Tenant(_) => tenant_agent_json,
    }
}

pub(crate) async fn list_agents(svc: &Services, who: &Principal) -> ApiResult {
    let agents = svc.registry.list_agents().await.map_err(store_err)?;
    let json = view(who);
    let list: Vec<Value> = agents.iter().map(|(d, v)| json(d, *v)).collect();
    Ok((200, json!({"agents": list})))
}

pub(crate) async fn get_agent(svc: &Services, who: &Principal, name: &str) -> ApiResult {
    match svc.registry.agent_version(name).await.map_err(store_err)? {
        Some((def, v)) => Ok((200, view(who)(&def, v))),
        None => Err(ApiError::not_found(&format!("agent '{name}'"))),
    }
}

pub(crate) async fn put_agent(svc: &Services, req: &Request, name: &str) -> ApiResult {
    let body = body_json(req)?;
    let mut def = AgentDefinition::from_json(name, &body)?;
    if let Some(url) = def
        .approvals
        .as_ref()
        .and_then(|a| a.chat_webhook_url.as_deref())
    {
        crate::routes::runs::egress_checked(svc, "approvals.chat_webhook_url", url)?;
    }
    svc.registry
        .resolve_manifests(&mut def)
        .await
        .map_err(store_err)??;
    // The profile must resolve now, global profiles first: a placement that
    // could never be met is refused here rather than at the first call.
    let global = svc.registry.profiles().await.map_err(store_err)?;
    let (_, shadowed) = def
        .sandbox
        .resolve(global)
        .map_err(|e| ApiError::new(400, "INVALID_FIELD", format!("sandbox.profile: {e}")))?;
    let version = match if_match(req)? {
        None => svc.registry.put_agent(&def).await.map_err(store_err)?,
        Some(expected) => match svc.registry.put_agent_if(&def, expected).await {
            Ok(v) => v,
            Err(StoreError::Conflict { .. }) => {
                return Err(ApiError::new(
                    412,
                    "PRECONDITION_FAILED",
                    format!(
                        "agent '{name}' is no longer at version {expected}: read it again \
                         and apply your change to what is there now"
                    ),
                ))
            }
            Err(e) => return Err(store_err(e)),
        },
    };
    let mut v = agent_json(&def, version);
    if !shadowed.is_empty() {
        // Reported, not silently dropped: the global definitions hold.
        v["shadowed_profiles"] = json!(shadowed);
    }
    Ok((200, v))
}

/// The version an `If-Match` header names (`7` or the entity tag
/// `"7"`), if the request has one: the write then happens only at it.
fn if_match(req: &Request) -> Result<Option<u64>, ApiError> {
    let Some(h) = req.headers().get(http::header::IF_MATCH) else {
        return Ok(None);
    };
    h.to_str()
        .ok()
        .map(|v| v.trim().trim_start_matches("W/").trim_matches('"'))
        .and_then(|v| v.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| {
            ApiError::new(
                400,
                "INVALID_HEADER",
                "If-Match: must be the definition's version, as GET returns it (\"version\": 7)",
            )
        })
}

/// Deletes an agent and, with it, every sandbox it has in any tenant: no
/// task and no file of it is left (seed 000 §E).
pub(crate) async fn delete_agent(svc: &Services, name: &str) -> ApiResult {
    let sandboxes = svc.sandboxes.list_agent(name).await.map_err(store_err)?;
    let mut destroyed = Vec::new();
    for rec in sandboxes {
        sandboxing::destroy(svc, &rec.tenant, &rec.agent, "the agent was deleted")
            .await
            .map_err(store_err)?;
        if let Some(gone) = svc
            .sandboxes
            .get(&rec.tenant, &rec.agent)
            .await
            .map_err(store_err)?
        {
            match svc.sandboxes.delete(&gone).await {
                Ok(()) => {}
                // Changed since it was read (its task reported in): the
                // destroyed record stays until the next delete.
                Err(StoreError::Conflict { .. }) => {
                    tracing::warn!(sandbox = %gone.key(), "destroyed sandbox record changed meanwhile; kept");
                }
                Err(e) => return Err(store_err(e)),
            }
        }
        destroyed.push(rec.tenant);
    }
    if !svc.registry.delete_agent(name).await.map_err(store_err)? && destroyed.is_empty() {
        return Err(ApiError::not_found(&format!("agent '{name}'")));
    }
    Ok((
        200,
        json!({"agent": name, "deleted": true, "sandboxes_destroyed": destroyed}),
    ))
}
