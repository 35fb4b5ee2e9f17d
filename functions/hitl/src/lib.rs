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
//! that send fails, from its watchdog). Like ingress, one axum router,
//! built with its part of the OpenAPI document.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::{Json, Router};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use armada_api::approvals::{ApprovalList, ApprovalView, ApprovalsQuery, DecisionBody};
use armada_api::error::KeyRefusals;
use armada_api::server::{Path, Query, RawBody};
use armada_api::{ApiError, ErrorBody};
use armada_core::clock::rfc3339;
use armada_core::services::auth::{authenticate, Principal};
use armada_core::Services;
use armada_domain::api::KeyRole;
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

fn api() -> OpenApiRouter<Arc<Services>> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(get_approval))
        .routes(routes!(decision))
        .routes(routes!(page::show, page::submit))
}

/// The approvals' router, ready to serve.
pub fn app(svc: Arc<Services>) -> Router {
    armada_core::http::serve(api(), svc)
}

/// This function's part of the OpenAPI document.
pub fn openapi() -> utoipa::openapi::OpenApi {
    armada_core::http::document(api())
}

/// The tenant's approvals, newest first, optionally in one state.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals", params(ApprovalsQuery),
    responses(
        (status = 200, description = "The approvals.", body = ApprovalList,
            links(
                ("GetApproval" = (operation_id = "get_approval", parameters(("approval_id" = "$response.body#/approvals/0/approval_id")))),
                ("Decide" = (operation_id = "decision", parameters(("approval_id" = "$response.body#/approvals/0/approval_id")))),
            )),
        (status = 400, description = "`INVALID_FIELD`, `INVALID_QUERY`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
async fn list(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Query(q): Query<ApprovalsQuery>,
) -> Result<Json<ApprovalList>, ApiError> {
    let tenant = who.tenant()?;
    let state = match q.state.as_deref() {
        None | Some("") => None,
        Some(s) => Some(ApprovalState::parse(s).ok_or_else(|| {
            ApiError::new(
                400,
                "INVALID_FIELD",
                "state: must be pending, approved, rejected, expired or cancelled",
            )
        })?),
    };
    let limit = match q.limit {
        None => 50,
        Some(l) => usize::try_from(l)
            .ok()
            .filter(|n| (1..=MAX_LIST).contains(n))
            .ok_or_else(|| {
                ApiError::new(400, "INVALID_FIELD", format!("limit: must be 1-{MAX_LIST}"))
            })?,
    };
    let found = svc.approvals.of_tenant(tenant, state, limit).await?;
    Ok(Json(ApprovalList {
        approvals: found.iter().map(|a| ApprovalView::of(a, rfc3339)).collect(),
    }))
}

/// One of the tenant's approvals.
#[utoipa::path(get, path = "/v1/approvals/{approval_id}", tag = "approvals",
    params(("approval_id" = String, Path, description = "The approval's id (`apv_…`).")),
    responses(
        (status = 200, description = "The approval.", body = ApprovalView),
        (status = 404, description = "`NOT_FOUND`: no such approval in the caller's tenant.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
async fn get_approval(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(approval_id): Path<String>,
) -> Result<Json<ApprovalView>, ApiError> {
    let a = decide::load(&svc, &approval_id, Some(who.tenant()?)).await?;
    Ok(Json(ApprovalView::of(&a, rfc3339)))
}

/// Decides an approval: by an approver key, or by a link's token (in the
/// body) instead of a key.
#[utoipa::path(post, path = "/v1/approvals/{approval_id}/decision", tag = "approvals",
    request_body = DecisionBody,
    params(("approval_id" = String, Path, description = "The approval's id (`apv_…`).")),
    responses(
        (status = 200, description = "Decided.", body = ApprovalView,
            links(("GetApproval" = (operation_id = "get_approval", parameters(("approval_id" = "$response.body#/approval_id")))))),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`.", body = ErrorBody),
        (status = 401, description = "`UNAUTHORIZED`: neither a key nor a token.", body = ErrorBody),
        (status = 403, description = "`NOT_AN_APPROVER`, `TOKEN_INVALID`, `SELF_APPROVAL`, `FORBIDDEN`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: no such approval in the caller's tenant.", body = ErrorBody),
        (status = 409, description = "`ALREADY_DECIDED`, `EXPIRED`, `CANCELLED`.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`.", body = ErrorBody),
    ),
    security(("approver_key" = []), ()))]
async fn decision(
    State(svc): State<Arc<Services>>,
    Path(id): Path<String>,
    source: SourceIp,
    headers: HeaderMap,
    RawBody(raw): RawBody,
) -> Result<Json<ApprovalView>, ApiError> {
    if raw.len() > MAX_BODY_BYTES {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    let body = ApiError::json_body(&raw)?;
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
            let header = headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            let who = authenticate(&svc, header).await?;
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
    let a = decide(&svc, &id, verdict, by, source.0, comment, tenant.as_deref()).await?;
    Ok(Json(ApprovalView::of(&a, rfc3339)))
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
struct SourceIp(Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for SourceIp {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        use lambda_http::request::RequestContext;
        Ok(SourceIp(match parts.extensions.get::<RequestContext>() {
            Some(RequestContext::ApiGatewayV2(ctx)) => ctx.http.source_ip.clone(),
            _ => None,
        }))
    }
}

/// Decodes `application/x-www-form-urlencoded` (a form body).
fn form(s: &str) -> HashMap<String, String> {
    form_urlencoded::parse(s.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}
