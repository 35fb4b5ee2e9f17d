//! `/v1/agents` (admin writes): definitions, their versions, deletion
//! (which destroys the agent's sandboxes in every tenant).

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{Map, Value};

use armada_api::definitions::AgentBody;
use armada_api::registry::{AgentDeleted, AgentList, AgentView, ListToolsAs};
use armada_api::server::{JsonBody, Path, Query};
use armada_api::{ApiError, ErrorBody};
use armada_core::error::StoreError;
use armada_core::services::auth::{AdminKey, Principal};
use armada_core::services::mcp;
use armada_core::services::sandboxing;
use armada_core::services::secrets::TenantSecrets;
use armada_core::Services;
use armada_domain::agent::AgentDefinition;
use armada_domain::secret::Configured;

use super::accept::egress_checked;
use armada_api::error::KeyRefusals;

/// Who sees a definition whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Audience {
    /// The admin key: every field.
    Operator,
    /// A tenant's key. Agents are shared by every tenant, and some fields
    /// are the operator's: the chat webhook URL is a bearer secret
    /// (whoever holds it posts to the channel), the approvers' addresses
    /// are people's, and the model's endpoint and key variable map the
    /// deployment. What a tenant needs to call the agent stays.
    Tenant,
}

impl Audience {
    fn of(who: &Principal) -> Self {
        match who {
            Principal::Admin => Audience::Operator,
            Principal::Tenant(_) => Audience::Tenant,
        }
    }
}

fn agent_view(def: &AgentDefinition, version: u64, audience: Audience) -> AgentView {
    let mut definition = match serde_json::to_value(def) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    definition.remove("name");
    definition.remove("version");
    if audience == Audience::Tenant {
        if let Some(model) = definition.get_mut("model").and_then(Value::as_object_mut) {
            model.remove("base_url");
            model.remove("api_key_env");
        }
        // A server's headers may be literal tokens: the operator's.
        for server in definition
            .get_mut("mcp_servers")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(s) = server.as_object_mut() {
                s.remove("headers");
            }
        }
        if let Some(approvals) = definition
            .get_mut("approvals")
            .and_then(Value::as_object_mut)
        {
            approvals.remove("chat_webhook_url");
            approvals.remove("approvers");
        }
    }
    AgentView {
        name: def.name.clone(),
        version,
        shadowed_profiles: None,
        definition,
    }
}

/// Every agent, each at its current version.
#[utoipa::path(get, path = "/v1/agents", tag = "registry",
    responses((status = 200, description = "The agents.", body = AgentList), KeyRefusals),
    security(("admin_key" = []), ("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn list_agents(
    State(svc): State<Arc<Services>>,
    who: Principal,
) -> Result<Json<AgentList>, ApiError> {
    let agents = svc.registry.list_agents().await?;
    let audience = Audience::of(&who);
    Ok(Json(AgentList {
        agents: agents
            .iter()
            .map(|(d, v)| agent_view(d, *v, audience))
            .collect(),
    }))
}

/// An agent's definition and version (what `PUT` takes back as it is).
#[utoipa::path(get, path = "/v1/agents/{name}", tag = "registry",
    params(("name" = String, Path, description = "The agent's name.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "The agent.", body = AgentView),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = []), ("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn get_agent(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(name): Path<String>,
) -> Result<Json<AgentView>, ApiError> {
    match svc.registry.agent_version(&name).await? {
        Some((def, v)) => Ok(Json(agent_view(&def, v, Audience::of(&who)))),
        None => Err(ApiError::not_found(&format!("agent '{name}'"))),
    }
}

/// Defines an agent, or its next version. With `If-Match: <version>`,
/// only if it is still at that version.
#[utoipa::path(put, path = "/v1/agents/{name}", tag = "registry", request_body = AgentBody,
    params(
        ("name" = String, Path, description = "The agent's name.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
        ("If-Match" = Option<String>, Header, description = "The version the change was made to (`7` or `\"7\"`)."),
        ListToolsAs,
    ),
    responses(
        (status = 200, description = "Written: the definition at its new version, its MCP servers' tools frozen into it.", body = AgentView),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`, `INVALID_HEADER`, `INVALID_QUERY`; an MCP server's listing failed: `MCP_UNREACHABLE`, `MCP_ERROR`, `TIMED_OUT`, `EGRESS_REFUSED`, `SECRET_NOT_FOUND`, naming the server.", body = ErrorBody),
        (status = 412, description = "`PRECONDITION_FAILED`: changed since the version in `If-Match`.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = [])))]
pub(crate) async fn put_agent(
    State(svc): State<Arc<Services>>,
    _: AdminKey,
    Path(name): Path<String>,
    Query(q): Query<ListToolsAs>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Json<AgentView>, ApiError> {
    let mut def = AgentDefinition::from_json(&name, &body)?;
    if let Some(url) = def
        .approvals
        .as_ref()
        .and_then(|a| a.chat_webhook_url.as_deref())
    {
        egress_checked(&svc, "approvals.chat_webhook_url", url)?;
    }
    svc.registry.resolve_manifests(&mut def).await??;
    list_mcp_tools(&svc, &mut def, q.tenant.as_deref()).await?;
    // The profile must resolve now, global profiles first: a placement that
    // could never be met is refused here rather than at the first call.
    let global = svc.registry.profiles().await?;
    let (_, shadowed) = def
        .sandbox
        .resolve(global)
        .map_err(|e| ApiError::new(400, "INVALID_FIELD", format!("sandbox.profile: {e}")))?;
    let version = match if_match(&headers)? {
        None => svc.registry.put_agent(&def).await?,
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
            Err(e) => return Err(e.into()),
        },
    };
    let mut view = agent_view(&def, version, Audience::Operator);
    // Reported, not silently dropped: the global definitions hold.
    view.shadowed_profiles = (!shadowed.is_empty()).then_some(shadowed);
    Ok(Json(view))
}

/// Lists the tools of the definition's MCP servers and freezes them into
/// it, the headers' secrets opened as `tenant`'s. A server that cannot be
/// listed is refused naming it.
async fn list_mcp_tools(
    svc: &Services,
    def: &mut AgentDefinition,
    tenant: Option<&str>,
) -> Result<(), ApiError> {
    let mut listed = Vec::with_capacity(def.mcp_servers.len());
    for (i, server) in def.mcp_servers.iter().enumerate() {
        let at = format!("mcp_servers[{i}]");
        let names_secret = server
            .headers
            .values()
            .any(|v| matches!(v, Configured::Secret { .. }));
        if names_secret && tenant.is_none() {
            return Err(ApiError::new(
                400,
                "INVALID_FIELD",
                format!(
                    "{at}.headers: a header names a tenant's secret: say whose secrets list \
                     the tools (?tenant=<tenant>)"
                ),
            ));
        }
        // With no secret named, no tenant's secret is ever opened.
        let secrets = TenantSecrets {
            svc,
            tenant: tenant.unwrap_or_default(),
        };
        let tools = mcp::list_tools(svc.tools.egress(), server, &secrets)
            .await
            .map_err(|e| ApiError::new(400, e.code(), format!("{at}: {e}")))?;
        listed.push(tools);
    }
    def.freeze_mcp_tools(&listed)?;
    Ok(())
}

/// Lists the agent's MCP servers' tools again into its next version (a
/// server changed what it offers; nothing else of the agent changes).
#[utoipa::path(post, path = "/v1/agents/{name}/refresh-tools", tag = "registry",
    params(
        ("name" = String, Path, description = "The agent's name.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
        ListToolsAs,
    ),
    responses(
        (status = 200, description = "Written: the definition at its new version.", body = AgentView),
        (status = 400, description = "`INVALID_QUERY`, `INVALID_FIELD`; a server's listing failed: `MCP_UNREACHABLE`, `MCP_ERROR`, `TIMED_OUT`, `EGRESS_REFUSED`, `SECRET_NOT_FOUND`, naming the server.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        (status = 412, description = "`PRECONDITION_FAILED`: the agent changed while its tools were listed.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = [])))]
pub(crate) async fn refresh_tools(
    State(svc): State<Arc<Services>>,
    _: AdminKey,
    Path(name): Path<String>,
    Query(q): Query<ListToolsAs>,
) -> Result<Json<AgentView>, ApiError> {
    let Some((mut def, version)) = svc.registry.agent_version(&name).await? else {
        return Err(ApiError::not_found(&format!("agent '{name}'")));
    };
    list_mcp_tools(&svc, &mut def, q.tenant.as_deref()).await?;
    match svc.registry.put_agent_if(&def, version).await {
        Ok(v) => Ok(Json(agent_view(&def, v, Audience::Operator))),
        Err(StoreError::Conflict { .. }) => Err(ApiError::new(
            412,
            "PRECONDITION_FAILED",
            format!("agent '{name}' changed while its tools were listed: refresh again"),
        )),
        Err(e) => Err(e.into()),
    }
}

/// The version an `If-Match` header names (`7` or the entity tag
/// `"7"`), if the request has one: the write then happens only at it.
fn if_match(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(h) = headers.get(axum::http::header::IF_MATCH) else {
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
#[utoipa::path(delete, path = "/v1/agents/{name}", tag = "registry",
    params(("name" = String, Path, description = "The agent's name.", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "Deleted, with its sandboxes.", body = AgentDeleted),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("admin_key" = [])))]
pub(crate) async fn delete_agent(
    State(svc): State<Arc<Services>>,
    _: AdminKey,
    Path(name): Path<String>,
) -> Result<Json<AgentDeleted>, ApiError> {
    let sandboxes = svc.sandboxes.list_agent(&name).await?;
    let mut destroyed = Vec::new();
    for rec in sandboxes {
        sandboxing::destroy(&svc, &rec.tenant, &rec.agent, "the agent was deleted").await?;
        if let Some(gone) = svc.sandboxes.get(&rec.tenant, &rec.agent).await? {
            match svc.sandboxes.delete(&gone).await {
                Ok(()) => {}
                // Changed since it was read (its task reported in): the
                // destroyed record stays until the next delete.
                Err(StoreError::Conflict { .. }) => {
                    tracing::warn!(sandbox = %gone.key(), "destroyed sandbox record changed meanwhile; kept");
                }
                Err(e) => return Err(e.into()),
            }
        }
        destroyed.push(rec.tenant);
    }
    if !svc.registry.delete_agent(&name).await? && destroyed.is_empty() {
        return Err(ApiError::not_found(&format!("agent '{name}'")));
    }
    Ok(Json(AgentDeleted {
        agent: name,
        deleted: true,
        sandboxes_destroyed: destroyed,
    }))
}
