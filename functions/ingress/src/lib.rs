//! T1 ingress: the HTTP API v1. It authenticates, validates, deduplicates,
//! writes the request and enqueues it for the dispatcher; it never runs an
//! agent. The same handler runs under `lambda_http` in AWS and behind the
//! local stack's HTTP server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_http::{Body, Request, Response};
use serde_json::{json, Value};
use tracing::Instrument;

use armada_core::auth::{store_err, Principal, TenantKey};
use armada_core::clock::{new_id, rfc3339};
use armada_core::error::StoreError;
use armada_core::ports::StoredKey;
use armada_core::ports::{Also, IdemRecord};
use armada_core::sandboxing;
use armada_core::unreadable::{self, Ending};
use armada_core::Services;
use armada_domain::agent::AgentDefinition;
use armada_domain::api::{
    minute_window, parse_message, valid_tenant, ApiError, ApiKey, CreateRun, CreateSession,
    RunTarget,
};
use armada_domain::collab::chain::{step_run_id, ChainLink};
use armada_domain::collab::{Lineage, RunKind};
use armada_domain::crypto::sha256_hex;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::{
    NewRun as NewRunRecord, Payload, Run, RunEvent, RunHead, RunState, CORRUPT_RECORD,
};
use armada_domain::sandbox::{ProfileDef, Profiles};
use armada_domain::session::SessionHeader;
use armada_domain::team::{Strategy, TeamDefinition};

mod auth;
mod routes;

use auth::*;
use routes::agents::*;
use routes::collab::*;
use routes::keys::*;
use routes::profiles::*;
use routes::runs::*;
use routes::sandboxes::*;
use routes::sessions::*;
use routes::skills::*;
use routes::teams::*;

/// Bodies above this are refused with 413.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The longest `wait` a caller may ask of the events endpoint.
const MAX_EVENTS_WAIT_S: u64 = 20;

type ApiResult = Result<(u16, Value), ApiError>;

/// Handles one HTTP request and always answers: errors become JSON bodies
/// with a stable code; internals go to the log.
pub async fn handle(svc: Arc<Services>, req: Request) -> Response<Body> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let span = tracing::info_span!("http", %method, %path);
    // The span is attached to the future (not entered across its awaits),
    // so it follows the request wherever the runtime polls it.
    let work = async {
        let result = route(&svc, &req, &method, &path).await;
        let (status, body, retry_after) = match result {
            Ok((status, body)) => (status, body, None),
            Err(e) => {
                let (status, body) = armada_core::auth::error_reply(&e);
                (status, body, e.retry_after_s)
            }
        };
        let mut resp = json_response(status, &body);
        if let Some(s) = retry_after {
            if let Ok(v) = http::HeaderValue::from_str(&s.to_string()) {
                resp.headers_mut().insert(http::header::RETRY_AFTER, v);
            }
        }
        resp
    };
    // The Run a request is for is named once it is known (`start_run`).
    armada_core::calls::on_behalf(None, work.instrument(span)).await
}

pub fn json_response(status: u16, body: &Value) -> Response<Body> {
    let text = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::Text(text))
        .unwrap_or_else(|_| Response::new(Body::Empty))
}

async fn route(svc: &Arc<Services>, req: &Request, method: &str, path: &str) -> ApiResult {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    if segs.first() != Some(&"v1") {
        return Err(ApiError::not_found("route"));
    }
    if req.body().len() > MAX_BODY_BYTES {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    if let (["v1", "health"], "GET") = (segs.as_slice(), method) {
        return Ok((200, json!({"status": "ok"})));
    }
    let who = authenticate(svc, req).await?;
    match (segs.as_slice(), method) {
        (["v1", "runs"], "POST") => create_run(svc, req, who.tenant_key()?).await,
        (["v1", "runs", id], "GET") => get_run(svc, tenant(&who)?, id).await,
        (["v1", "runs", id, "events"], "GET") => run_events(svc, req, tenant(&who)?, id).await,
        (["v1", "runs", id, "cancel"], "POST") => cancel_run(svc, tenant(&who)?, id).await,
        (["v1", "runs", id, "trace"], "GET") => run_trace(svc, tenant(&who)?, id).await,
        (["v1", "runs", id, "children"], "GET") => run_children(svc, tenant(&who)?, id).await,
        (["v1", "chains", id], "GET") => get_chain(svc, tenant(&who)?, id).await,
        (["v1", "chains", id, "cancel"], "POST") => cancel_chain(svc, tenant(&who)?, id).await,
        (["v1", "sessions"], "POST") => create_session(svc, req, tenant(&who)?).await,
        (["v1", "sessions", id], "GET") => get_session(svc, tenant(&who)?, id).await,
        (["v1", "sessions", id, "messages"], "POST") => {
            session_message(svc, req, who.tenant_key()?, id).await
        }
        (["v1", "agents"], "GET") => list_agents(svc, &who).await,
        (["v1", "agents", name], "GET") => get_agent(svc, &who, name).await,
        (["v1", "agents", name], "PUT") => {
            admin(&who)?;
            put_agent(svc, req, name).await
        }
        (["v1", "agents", name], "DELETE") => {
            admin(&who)?;
            delete_agent(svc, name).await
        }
        (["v1", "teams"], "GET") => list_teams(svc).await,
        (["v1", "teams", name], "GET") => get_team(svc, name).await,
        (["v1", "teams", name], "PUT") => {
            admin(&who)?;
            put_team(svc, req, name).await
        }
        (["v1", "teams", name], "DELETE") => {
            admin(&who)?;
            delete_team(svc, name).await
        }
        (["v1", "profiles"], "GET") => list_profiles(svc).await,
        (["v1", "skills"], "GET") => list_skills(svc).await,
        (["v1", "skills", name], "GET") => get_skill(svc, name).await,
        (["v1", "skills", name], "PUT") => {
            admin(&who)?;
            put_skill(svc, req, name).await
        }
        (["v1", "profiles", name], "PUT") => {
            admin(&who)?;
            put_profile(svc, req, name).await
        }
        (["v1", "sandboxes"], "GET") => {
            let t = sandbox_tenant(&who, req)?;
            list_sandboxes(svc, &t).await
        }
        (["v1", "sandboxes", agent], "GET") => {
            let t = sandbox_tenant(&who, req)?;
            get_sandbox(svc, &t, agent).await
        }
        (["v1", "sandboxes", agent], "DELETE") => {
            admin(&who)?;
            let t = sandbox_tenant(&who, req)?;
            destroy_sandbox(svc, &t, agent).await
        }
        (["v1", "tenants", t, "keys"], "POST") => {
            admin(&who)?;
            mint_key(svc, req, t).await
        }
        (["v1", "tenants", t, "callback-secret"], "POST") => {
            rotate_callback_secret(svc, &who, t).await
        }
        (["v1", "keys", key_id], "DELETE") => {
            admin(&who)?;
            revoke_key(svc, key_id).await
        }
        _ => Err(ApiError::not_found("route")),
    }
}

fn body_json(req: &Request) -> Result<Value, ApiError> {
    ApiError::json_body(req.body().as_ref())
}

fn query(req: &Request) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

async fn payload_json(svc: &Services, p: &Payload) -> Value {
    match svc.payloads.read(p).await {
        Ok(t) => json!(t),
        Err(e) => {
            tracing::warn!(error = %e, "stored payload unreadable");
            Value::Null
        }
    }
}

#[cfg(test)]
mod tests;
