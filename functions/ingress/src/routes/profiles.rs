//! `/v1/profiles` (admin writes): global custom sandbox profiles.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;

use armada_api::definitions::ProfileBody;
use armada_api::registry::{ProfileList, ProfilePut};
use armada_api::server::{JsonBody, Path};
use armada_api::{ApiError, ErrorBody};
use armada_core::services::auth::{AdminKey, Principal};
use armada_core::Services;
use armada_domain::sandbox::{ProfileDef, Profiles};

use armada_api::error::KeyRefusals;

/// The global custom profiles, by name.
#[utoipa::path(get, path = "/v1/profiles", tag = "registry",
    responses((status = 200, description = "The profiles.", body = ProfileList), KeyRefusals),
    security(("admin_key" = []), ("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn list_profiles(
    State(svc): State<Arc<Services>>,
    _: Principal,
) -> Result<Json<ProfileList>, ApiError> {
    let profiles = svc.registry.profiles().await?;
    Ok(Json(ProfileList {
        profiles: profiles
            .into_iter()
            .map(|(k, v)| (k, serde_json::to_value(v).unwrap_or_default()))
            .collect(),
    }))
}

/// Defines (or redefines) a global custom profile. Global definitions win
/// over any agent's project profile of the same name.
#[utoipa::path(put, path = "/v1/profiles/{name}", tag = "registry", request_body = ProfileBody,
    params(("name" = String, Path, description = "The profile's name.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "Written, and as it resolves.", body = ProfilePut),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = [])))]
pub(crate) async fn put_profile(
    State(svc): State<Arc<Services>>,
    _: AdminKey,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<ProfilePut>, ApiError> {
    if !armada_domain::names::valid_name(&name) {
        return Err(ApiError::new(
            400,
            "INVALID_FIELD",
            "name: must be 1-64 characters of a-z, 0-9, '-' or '_'",
        ));
    }
    let def = ProfileDef::parse(&body, "profile")?;
    let mut all = svc.registry.profiles().await?;
    all.insert(name.clone(), def.clone());
    let check = Profiles::load(all, Default::default())
        .and_then(|p| p.resolve(&name))
        .map_err(|e| ApiError::new(400, "INVALID_FIELD", format!("profile: {e}")))?;
    svc.registry.put_profile(&name, &def).await?;
    Ok(Json(ProfilePut {
        name,
        profile: serde_json::to_value(&def).unwrap_or_default(),
        resolved: serde_json::to_value(&check).unwrap_or_default(),
    }))
}
