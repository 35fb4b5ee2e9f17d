//! `/v1/health` and `/v1/openapi.json`: the two routes that take no key.

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::Json;

use armada_api::Health;

/// Whether the API answers.
#[utoipa::path(get, path = "/v1/health", tag = "meta",
    responses((status = 200, description = "The API answers.", body = Health)))]
pub(crate) async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// This document: every route of the API (ingress and approvals), as
/// committed in `docs/openapi.json` (a test keeps the two the same).
#[utoipa::path(get, path = "/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "The OpenAPI 3.1 document.", content_type = "application/json")))]
pub(crate) async fn openapi_json() -> impl IntoResponse {
    (
        [(CONTENT_TYPE, "application/json")],
        include_str!("../../../../docs/openapi.json"),
    )
}
