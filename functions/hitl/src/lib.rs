//! T1 hitl: human approvals on the HTTP API (ARCHITECTURE §6).
//!
//! - `GET /v1/approvals[?state=]`, `GET /v1/approvals/{id}` (tenant key):
//!   the tenant's approvals;
//! - `POST /v1/approvals/{id}/decision {"decision", "comment"?, "token"?}`:
//!   a decision, by a tenant key with the `approver` role or by a link's
//!   token;
//! - `GET /v1/approvals/{id}/review?token=` and `POST` of its form: the
//!   review page ([`page`]), which a GET never changes.
//!
//! A decision is one conditional write of the approval ([`decide`]); the
//! Run hears of it through its FIFO group on the harness queue (and, if
//! that send fails, from its watchdog).

use std::collections::HashMap;
use std::sync::Arc;

use lambda_http::{Body, Request, RequestExt, Response};
use serde_json::{json, Value};
use tracing::Instrument;

use armada_core::auth::{authenticate, error_reply, store_err, Principal};
use armada_core::clock::rfc3339;
use armada_core::Services;
use armada_domain::api::{ApiError, KeyRole};
use armada_domain::approval::{codes, ApprovalState, Decider, Verdict};
use armada_domain::fields::Fields;

mod decide;
mod page;

pub use decide::decide;

/// Bodies above this are refused (a decision is a few hundred bytes).
const MAX_BODY_BYTES: usize = 64 * 1024;
/// A comment is kept whole up to this many bytes.
const MAX_COMMENT_BYTES: usize = 2048;
/// The most approvals one list returns.
const MAX_LIST: usize = 200;

type ApiResult = Result<(u16, Value), ApiError>;

/// Handles one HTTP request and always answers: JSON for the API, HTML
/// for the review page.
pub async fn handle(svc: Arc<Services>, req: Request) -> Response<Body> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let span = tracing::info_span!("http", %method, %path);
    async {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        if req.body().len() > MAX_BODY_BYTES {
            return json_response(413, &ApiError::too_large(MAX_BODY_BYTES).body());
        }
        match (segs.as_slice(), method.as_str()) {
            (["v1", "approvals", id, "review"], "GET") => page::show(&svc, &req, id).await,
            (["v1", "approvals", id, "review"], "POST") => page::submit(&svc, &req, id).await,
            _ => {
                let (status, body) = match api(&svc, &req, &segs, &method).await {
                    Ok(ok) => ok,
                    Err(e) => error_reply(&e),
                };
                json_response(status, &body)
            }
        }
    }
    .instrument(span)
    .await
}

async fn api(svc: &Services, req: &Request, segs: &[&str], method: &str) -> ApiResult {
    match (segs, method) {
        (["v1", "approvals", id, "decision"], "POST") => decision(svc, req, id).await,
        (["v1", "approvals"], "GET") => {
            let who = who(svc, req).await?;
            list(svc, req, who.tenant()?).await
        }
        (["v1", "approvals", id], "GET") => {
            let who = who(svc, req).await?;
            let a = decide::load(svc, id, Some(who.tenant()?)).await?;
            Ok((200, a.view(rfc3339)))
        }
        _ => Err(ApiError::not_found("route")),
    }
}

async fn who(svc: &Services, req: &Request) -> Result<Principal, ApiError> {
    let header = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    authenticate(svc, header).await
}

async fn list(svc: &Services, req: &Request, tenant: &str) -> ApiResult {
    let q = query(req);
    let state = match q.get("state").map(String::as_str) {
        None | Some("") => None,
        Some(s) => Some(ApprovalState::parse(s).ok_or_else(|| {
            ApiError::new(
                400,
                "INVALID_FIELD",
                "state: must be pending, approved, rejected, expired or cancelled",
            )
        })?),
    };
    let limit = match q.get("limit") {
        None => 50,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_LIST).contains(n))
            .ok_or_else(|| {
                ApiError::new(400, "INVALID_FIELD", format!("limit: must be 1-{MAX_LIST}"))
            })?,
    };
    let found = svc
        .approvals
        .of_tenant(tenant, state, limit)
        .await
        .map_err(store_err)?;
    let views: Vec<Value> = found.iter().map(|a| a.view(rfc3339)).collect();
    Ok((200, json!({"approvals": views})))
}

/// `POST /v1/approvals/{id}/decision`: by an approver key, or by a link's
/// token (in the body) instead of a key.
async fn decision(svc: &Services, req: &Request, id: &str) -> ApiResult {
    let body = ApiError::json_body(req.body().as_ref())?;
    let f = Fields::new(&body)?;
    f.only(&["decision", "comment", "token", "result"])?;
    let verdict = Verdict::parse(f.req_str("decision")?, body.get("result").cloned())
        .ok_or_else(|| {
            ApiError::new(
                400,
                "INVALID_FIELD",
                "decision: must be approve or reject (or, for an uncertain call, happened, retry or fail)",
            )
        })?;
    let comment = comment(f.opt_str("comment")?)?;
    let (by, tenant) = match f.opt_str("token")? {
        Some(token) => (
            Decider::Token {
                token: token.to_string(),
            },
            None,
        ),
        None => {
            let who = who(svc, req).await?;
            let key = who.tenant_key()?;
            if key.role != KeyRole::Approver {
                return Err(ApiError::new(
                    403,
                    codes::NOT_AN_APPROVER,
                    "this key cannot decide approvals: mint one with the approver role",
                ));
            }
            (
                Decider::Key {
                    key_id: key.key_id.clone(),
                },
                Some(key.tenant.clone()),
            )
        }
    };
    let a = decide(
        svc,
        id,
        verdict,
        by,
        source_ip(req),
        comment,
        tenant.as_deref(),
    )
    .await?;
    Ok((200, a.view(rfc3339)))
}

/// A comment as kept: trimmed, at most [`MAX_COMMENT_BYTES`].
fn comment(c: Option<&str>) -> Result<Option<String>, ApiError> {
    match c.map(str::trim).filter(|c| !c.is_empty()) {
        None => Ok(None),
        Some(c) if c.len() > MAX_COMMENT_BYTES => Err(ApiError::new(
            400,
            "INVALID_FIELD",
            format!("comment: at most {MAX_COMMENT_BYTES} bytes"),
        )),
        Some(c) => Ok(Some(c.to_string())),
    }
}

/// The caller's address as API Gateway saw it.
fn source_ip(req: &Request) -> Option<String> {
    match req.request_context_ref()? {
        lambda_http::request::RequestContext::ApiGatewayV2(ctx) => ctx.http.source_ip.clone(),
        _ => None,
    }
}

fn query(req: &Request) -> HashMap<String, String> {
    form(req.uri().query().unwrap_or_default())
}

/// Decodes `application/x-www-form-urlencoded` (a query or a form body).
fn form(s: &str) -> HashMap<String, String> {
    form_urlencoded::parse(s.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

pub fn json_response(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::Text(body.to_string()))
        .unwrap_or_else(|_| Response::new(Body::Empty))
}
