//! `/v1/teams` (admin writes): team definitions. Every agent a team names
//! must be registered when the team is written.

use armada_domain::team::TeamDefinition;

use crate::*;

fn team_json(def: &TeamDefinition) -> Value {
    serde_json::to_value(def).unwrap_or(Value::Null)
}

pub(crate) async fn list_teams(svc: &Services) -> ApiResult {
    let mut teams = svc.registry.list_teams().await.map_err(store_err)?;
    teams.sort_by(|a, b| a.name.cmp(&b.name));
    let list: Vec<Value> = teams.iter().map(team_json).collect();
    Ok((200, json!({"teams": list})))
}

pub(crate) async fn get_team(svc: &Services, name: &str) -> ApiResult {
    match svc.registry.team(name).await.map_err(store_err)? {
        Some(def) => Ok((200, team_json(&def))),
        None => Err(ApiError::not_found(&format!("team '{name}'"))),
    }
}

pub(crate) async fn put_team(svc: &Services, req: &Request, name: &str) -> ApiResult {
    let body = body_json(req)?;
    let def = TeamDefinition::from_json(name, &body)?;
    for agent in def.agents() {
        agent_named(svc, agent).await?;
    }
    svc.registry.put_team(&def).await.map_err(store_err)?;
    Ok((200, team_json(&def)))
}

pub(crate) async fn delete_team(svc: &Services, name: &str) -> ApiResult {
    if !svc.registry.delete_team(name).await.map_err(store_err)? {
        return Err(ApiError::not_found(&format!("team '{name}'")));
    }
    Ok((200, json!({"team": name, "deleted": true})))
}
