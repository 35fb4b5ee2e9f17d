//! `/v1/profiles` (admin writes): global custom sandbox profiles.

use crate::*;

pub(crate) async fn list_profiles(svc: &Services) -> ApiResult {
    let profiles = svc.registry.profiles().await.map_err(store_err)?;
    Ok((200, json!({"profiles": profiles})))
}

/// Defines (or redefines) a global custom profile. Global definitions win
/// over any agent's project profile of the same name.
pub(crate) async fn put_profile(svc: &Services, req: &Request, name: &str) -> ApiResult {
    if !armada_domain::agent::valid_name(name) {
        return Err(ApiError::new(
            400,
            "INVALID_FIELD",
            "name: must be 1-64 characters of a-z, 0-9, '-' or '_'",
        ));
    }
    let body = body_json(req)?;
    let def = ProfileDef::parse(&body, "profile").map_err(ApiError::from)?;
    let mut all = svc.registry.profiles().await.map_err(store_err)?;
    all.insert(name.to_string(), def.clone());
    let check = Profiles::load(all, Default::default())
        .and_then(|p| p.resolve(name))
        .map_err(|e| ApiError::new(400, "INVALID_FIELD", format!("profile: {e}")))?;
    svc.registry
        .put_profile(name, &def)
        .await
        .map_err(store_err)?;
    Ok((
        200,
        json!({"name": name, "profile": def, "resolved": check}),
    ))
}
