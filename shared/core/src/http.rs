//! What the functions that serve the HTTP API (ingress, hitl) share: a
//! router made ready to serve, and each request's span.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::Router;
use utoipa::openapi::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::adapters::calls::on_behalf;
use crate::Services;

/// A function's routes, ready to serve: a method a route does not take is
/// `405` with `Allow` and an unknown path `404`, both in the API's error
/// body; bodies are read whole and measured by the extractors
/// (`JsonBody`, `RawBody`); each request runs in a span of its own.
pub fn serve(routes: OpenApiRouter<Arc<Services>>, svc: Arc<Services>) -> Router {
    let (router, _) = routes.split_for_parts();
    router
        .method_not_allowed_fallback(armada_api::server::wrong_method)
        .fallback(armada_api::server::no_route)
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn(request_span))
        .with_state(svc)
}

/// The OpenAPI document of a function's routes.
pub fn document(routes: OpenApiRouter<Arc<Services>>) -> OpenApi {
    routes.split_for_parts().1
}

/// An HTTP request in a span of its own (method, path), on no Run's
/// behalf until one is named (`name_run`): the API routers' middleware.
pub async fn request_span(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use tracing::Instrument;
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let span = tracing::info_span!("http", %method, %path);
    on_behalf(None, next.run(req).instrument(span)).await
}
