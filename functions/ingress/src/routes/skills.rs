//! `/v1/skills` (admin writes): skill manifests.

use crate::*;

/// Every skill: the built-ins, then the registry's (which may reuse a
/// built-in's name to change its manifest, within the same rules).
pub(crate) async fn list_skills(svc: &Services) -> ApiResult {
    let custom = svc.registry.list_skills().await.map_err(store_err)?;
    let mut all: Vec<Value> = armada_domain::skills::BUILTIN
        .iter()
        .filter(|b| !custom.iter().any(|c| c.name == **b))
        .filter_map(|b| armada_domain::skills::builtin(b))
        .map(|m| json!(m))
        .collect();
    all.extend(custom.iter().map(|m| json!(m)));
    Ok((200, json!({"skills": all})))
}

pub(crate) async fn get_skill(svc: &Services, name: &str) -> ApiResult {
    match svc.registry.skill(name).await.map_err(store_err)? {
        Some(m) => Ok((200, json!(m))),
        None => armada_domain::skills::builtin(name)
            .map(|m| (200, json!(m)))
            .ok_or_else(|| ApiError::not_found(&format!("skill '{name}'"))),
    }
}

/// Defines a skill manifest. Agents registered afterwards freeze it; those
/// registered before keep the manifest they froze.
pub(crate) async fn put_skill(svc: &Services, req: &Request, name: &str) -> ApiResult {
    let body = body_json(req)?;
    let m = armada_domain::skills::SkillManifest::from_json(name, &body)?;
    svc.registry.put_skill(&m).await.map_err(store_err)?;
    Ok((200, json!(m)))
}
