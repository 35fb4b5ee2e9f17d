//! `/v1/teams` (admin writes): team definitions. Every agent a team names
//! must be registered when the team is written.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::{Map, Value};

use armada_api::definitions::TeamBody;
use armada_api::registry::{TeamDeleted, TeamList, TeamView};
use armada_api::server::{JsonBody, Path};
use armada_api::{ApiError, ErrorBody};
use armada_core::services::auth::{AdminKey, Principal};
use armada_core::Services;
use armada_domain::team::TeamDefinition;

use super::accept::agent_named;
use armada_api::error::KeyRefusals;

fn team_view(def: &TeamDefinition) -> TeamView {
    let mut definition = match serde_json::to_value(def) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    definition.remove("name");
    TeamView {
        name: def.name.clone(),
        definition,
    }
}

/// Every team, by name.
#[utoipa::path(get, path = "/v1/teams", tag = "registry",
    responses((status = 200, description = "The teams.", body = TeamList), KeyRefusals),
    security(("admin_key" = []), ("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn list_teams(
    State(svc): State<Arc<Services>>,
    _: Principal,
) -> Result<Json<TeamList>, ApiError> {
    let mut teams = svc.registry.list_teams().await?;
    teams.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(TeamList {
        teams: teams.iter().map(team_view).collect(),
    }))
}

/// A team's definition.
#[utoipa::path(get, path = "/v1/teams/{name}", tag = "registry",
    params(("name" = String, Path, description = "The team's name.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "The team.", body = TeamView),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = []), ("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn get_team(
    State(svc): State<Arc<Services>>,
    _: Principal,
    Path(name): Path<String>,
) -> Result<Json<TeamView>, ApiError> {
    match svc.registry.team(&name).await? {
        Some(def) => Ok(Json(team_view(&def))),
        None => Err(ApiError::not_found(&format!("team '{name}'"))),
    }
}

/// Defines a team; every agent it names must be registered.
#[utoipa::path(put, path = "/v1/teams/{name}", tag = "registry", request_body = TeamBody,
    params(("name" = String, Path, description = "The team's name.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "Written.", body = TeamView),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: an agent the team names.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = [])))]
pub(crate) async fn put_team(
    State(svc): State<Arc<Services>>,
    _: AdminKey,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<TeamView>, ApiError> {
    let def = TeamDefinition::from_json(&name, &body)?;
    for agent in def.agents() {
        agent_named(&svc, agent).await?;
    }
    svc.registry.put_team(&def).await?;
    Ok(Json(team_view(&def)))
}

/// Deletes a team (its Runs are not touched).
#[utoipa::path(delete, path = "/v1/teams/{name}", tag = "registry",
    params(("name" = String, Path, description = "The team's name.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "Deleted.", body = TeamDeleted),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = [])))]
pub(crate) async fn delete_team(
    State(svc): State<Arc<Services>>,
    _: AdminKey,
    Path(name): Path<String>,
) -> Result<Json<TeamDeleted>, ApiError> {
    if !svc.registry.delete_team(&name).await? {
        return Err(ApiError::not_found(&format!("team '{name}'")));
    }
    Ok(Json(TeamDeleted {
        team: name,
        deleted: true,
    }))
}
