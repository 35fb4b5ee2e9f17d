//! `/v1/skills` (admin writes): skill manifests.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::{Map, Value};

use armada_api::definitions::SkillBody;
use armada_api::registry::{SkillList, SkillView};
use armada_api::server::{BodyUpTo, JsonBody, Path};
use armada_api::{ApiError, ErrorBody};
use armada_core::services::auth::{AdminKey, Principal};
use armada_core::Services;
use armada_domain::skill_files::{judge_upload, stored_key, MAX_UPLOAD_BYTES};
use armada_domain::skills::{builtin, SkillManifest, BUILTIN};

use armada_api::error::KeyRefusals;

fn skill_view(m: &SkillManifest) -> SkillView {
    let mut manifest = match serde_json::to_value(m) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    manifest.remove("name");
    SkillView {
        name: m.name.clone(),
        manifest,
    }
}

/// Every skill: the built-ins, then the registry's (which may reuse a
/// built-in's name to change its manifest, within the same rules).
#[utoipa::path(get, path = "/v1/skills", tag = "registry",
    responses((status = 200, description = "The skills.", body = SkillList), KeyRefusals),
    security(("admin_key" = []), ("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn list_skills(
    State(svc): State<Arc<Services>>,
    _: Principal,
) -> Result<Json<SkillList>, ApiError> {
    let custom = svc.registry.list_skills().await?;
    let mut skills: Vec<SkillView> = BUILTIN
        .iter()
        .filter(|b| !custom.iter().any(|c| c.name == **b))
        .filter_map(|b| builtin(b))
        .map(|m| skill_view(&m))
        .collect();
    skills.extend(custom.iter().map(skill_view));
    Ok(Json(SkillList { skills }))
}

/// A skill's manifest.
#[utoipa::path(get, path = "/v1/skills/{name}", tag = "registry",
    params(("name" = String, Path, description = "The skill's name.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "The manifest.", body = SkillView),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = []), ("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn get_skill(
    State(svc): State<Arc<Services>>,
    _: Principal,
    Path(name): Path<String>,
) -> Result<Json<SkillView>, ApiError> {
    match svc.registry.skill(&name).await? {
        Some(m) => Ok(Json(skill_view(&m))),
        None => builtin(&name)
            .map(|m| Json(skill_view(&m)))
            .ok_or_else(|| ApiError::not_found(&format!("skill '{name}'"))),
    }
}

/// Defines a skill manifest. Agents registered afterwards freeze it; those
/// registered before keep the manifest they froze.
#[utoipa::path(put, path = "/v1/skills/{name}", tag = "registry", request_body = SkillBody,
    params(("name" = String, Path, description = "The skill's name.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "Written.", body = SkillView),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = [])))]
pub(crate) async fn put_skill(
    State(svc): State<Arc<Services>>,
    _: AdminKey,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<SkillView>, ApiError> {
    let mut m = SkillManifest::from_json(&name, &body)?;
    // Its files are uploaded on their own: a new manifest keeps them.
    let uploaded = svc
        .registry
        .skill(&name)
        .await?
        .and_then(|old| old.program)
        .and_then(|p| p.files);
    if let Some(p) = m.program.as_mut() {
        p.files = uploaded;
    }
    svc.registry.put_skill(&m).await?;
    Ok(Json(skill_view(&m)))
}

/// Uploads the files of a skill's program: a tar, or a gzip of one, of
/// directories and regular files (relative names, no `..`, no links).
/// They are staged into `.skills/<name>/` of each sandbox that runs the
/// program, where its `install` steps run once per version. Agents
/// registered afterwards freeze this version; those registered before
/// keep theirs.
#[utoipa::path(put, path = "/v1/skills/{name}/files", tag = "registry",
    request_body(content = Vec<u8>, content_type = "application/octet-stream",
        description = "A tar (or a gzip of one) of at most 4 MiB, unpacking to at most 32 MiB, sent as it is (`application/octet-stream`; the bytes decide, not the type)."),
    params(("name" = String, Path, description = "The skill's name.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "Stored; the manifest now names this version.", body = SkillView),
        (status = 400, description = "`INVALID_ARCHIVE` (naming the member), `NO_PROGRAM` (the skill brings no program).", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: no such skill.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = [])))]
pub(crate) async fn put_skill_files(
    State(svc): State<Arc<Services>>,
    _: AdminKey,
    Path(name): Path<String>,
    BodyUpTo(body): BodyUpTo<MAX_UPLOAD_BYTES>,
) -> Result<Json<SkillView>, ApiError> {
    let Some(mut m) = svc.registry.skill(&name).await? else {
        return Err(ApiError::not_found(&format!("skill '{name}'")));
    };
    let Some(program) = m.program.as_mut() else {
        return Err(ApiError::new(
            400,
            "NO_PROGRAM",
            format!("skill '{name}' brings no program to give files to"),
        ));
    };
    let judged = judge_upload(&body).map_err(|e| {
        let status = if e.code == "PAYLOAD_TOO_LARGE" {
            413
        } else {
            400
        };
        ApiError::new(status, e.code, e.message)
    })?;
    let key = stored_key(&name, &judged.files.sha256);
    svc.payloads
        .put_bytes(&key, &judged.tar, "application/x-tar")
        .await?;
    tracing::info!(skill = %name, sha256 = %judged.files.sha256, bytes = judged.files.bytes, "skill files stored");
    program.files = Some(judged.files);
    svc.registry.put_skill(&m).await?;
    Ok(Json(skill_view(&m)))
}
