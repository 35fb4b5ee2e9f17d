//! What the functions serving the API share (feature `server`): the
//! extractors, whose refusals are [`ApiError`]s like every other (axum's
//! own answer in plain text), and the answers to an unknown route or
//! method.

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::ApiError;

/// The most bytes a JSON body may have, unless a router says less.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// A JSON body within [`MAX_BODY_BYTES`] and the domain's depth limit.
/// It stays a `Value`: the domain's parsers validate it field by field,
/// with the field's name in every refusal.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonBody(pub Value);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = RawBody::from_request(req, state).await?.0;
        ApiError::json_body(&bytes).map(JsonBody)
    }
}

/// A body's bytes, within [`MAX_BODY_BYTES`] (possibly empty).
#[derive(Debug, Clone, PartialEq)]
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let limit = MAX_BODY_BYTES;
        let bytes = axum::body::to_bytes(req.into_body(), limit)
            .await
            .map_err(|_| ApiError::too_large(limit))?;
        Ok(RawBody(bytes))
    }
}

/// A body's bytes, within `LIMIT` (an upload larger than a JSON body may
/// be).
#[derive(Debug, Clone, PartialEq)]
pub struct BodyUpTo<const LIMIT: usize>(pub Bytes);

impl<S: Send + Sync, const LIMIT: usize> FromRequest<S> for BodyUpTo<LIMIT> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let bytes = axum::body::to_bytes(req.into_body(), LIMIT)
            .await
            .map_err(|_| ApiError::too_large(LIMIT))?;
        Ok(BodyUpTo(bytes))
    }
}

/// A query string, percent-decoded, as `T`; a bad one is `INVALID_QUERY`.
#[derive(Debug, Clone, PartialEq)]
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|e: QueryRejection| ApiError::new(400, "INVALID_QUERY", e.body_text()))
    }
}

/// Path parameters, percent-decoded, as `T`.
#[derive(Debug, Clone, PartialEq)]
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Path(p.0))
            .map_err(|e: PathRejection| ApiError::new(400, "INVALID_PATH", e.body_text()))
    }
}

/// A header's value, if the request has one that is text.
pub fn header<'a>(parts: &'a axum::http::HeaderMap, name: &str) -> Option<&'a str> {
    parts.get(name).and_then(|v| v.to_str().ok())
}

/// The answer to a path no route has.
pub async fn no_route() -> ApiError {
    ApiError::not_found("route")
}

/// The answer to a method a route does not take (axum adds `Allow`).
pub async fn wrong_method() -> ApiError {
    ApiError::new(
        405,
        "METHOD_NOT_ALLOWED",
        "this route does not take this method; see Allow",
    )
}
