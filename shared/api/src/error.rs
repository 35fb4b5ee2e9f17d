//! Errors as a caller sees them: a status, a stable code, a message.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use armada_domain::fields::FieldError;

/// How long a start refused `TOO_MANY_ACTIVE_RUNS` is told to wait: a Run
/// of the tenant's may end any time, so a guess, and a short one.
pub const ACTIVE_RUNS_RETRY_S: u32 = 30;
/// How long a long-poll refused `TOO_MANY_LONG_POLLS` is told to wait:
/// the tenant's other polls end within their own wait (at most 20 s).
pub const LONG_POLLS_RETRY_S: u32 = 5;

/// An error as answered to a caller: a status, a stable code, a message.
/// Details that would expose internals go to the log, not here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// Seconds a refused caller should wait (`Retry-After`), when known.
    pub retry_after_s: Option<u32>,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }
    /// A tenant started more Runs this minute than its quota allows.
    pub fn rate_limited(per_minute: u32, retry_after_s: u32) -> Self {
        ApiError {
            retry_after_s: Some(retry_after_s),
            ..Self::new(
                429,
                "RATE_LIMITED",
                format!("this tenant may start {per_minute} runs a minute; retry after {retry_after_s} s"),
            )
        }
    }
    /// A tenant has as many Runs active as its quota allows.
    pub fn too_many_active_runs(active: u32) -> Self {
        ApiError {
            retry_after_s: Some(ACTIVE_RUNS_RETRY_S),
            ..Self::new(
                429,
                "TOO_MANY_ACTIVE_RUNS",
                format!(
                    "this tenant may have {active} runs active at once; retry once one has ended"
                ),
            )
        }
    }
    /// A tenant has as many long-polls waiting as its quota allows.
    pub fn too_many_long_polls(polls: u32) -> Self {
        ApiError {
            retry_after_s: Some(LONG_POLLS_RETRY_S),
            ..Self::new(
                429,
                "TOO_MANY_LONG_POLLS",
                format!("this tenant may have {polls} long-polls waiting at once; retry later, or poll without wait"),
            )
        }
    }
    pub fn invalid_json(detail: impl std::fmt::Display) -> Self {
        Self::new(
            400,
            "INVALID_JSON",
            format!("the body is not valid JSON: {detail}"),
        )
    }
    /// A request body as JSON within [`armada_domain::fields::MAX_JSON_DEPTH`]
    /// levels: whatever a body holds may end up in a Run's record.
    pub fn json_body(bytes: &[u8]) -> Result<serde_json::Value, Self> {
        if bytes.is_empty() {
            return Err(Self::invalid_json("the body is empty"));
        }
        let v: serde_json::Value = serde_json::from_slice(bytes).map_err(Self::invalid_json)?;
        match armada_domain::fields::too_deep(&v) {
            Some(why) => Err(Self::invalid_json(why)),
            None => Ok(v),
        }
    }
    pub fn unauthorized() -> Self {
        Self::new(
            401,
            "UNAUTHORIZED",
            "a valid API key is required (Authorization: Bearer <key>)",
        )
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "FORBIDDEN", message)
    }
    pub fn not_found(what: &str) -> Self {
        Self::new(404, "NOT_FOUND", format!("{what} not found"))
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(409, code, message)
    }
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "PAYLOAD_TOO_LARGE",
            format!("the body exceeds {limit} bytes"),
        )
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "UNAVAILABLE", message)
    }
    pub fn internal() -> Self {
        Self::new(500, "INTERNAL", "internal error; it has been logged")
    }
    /// The body this error is answered with.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message.clone(),
            },
        }
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::new(400, "INVALID_FIELD", e.to_string())
    }
}

/// Every error's body: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable: callers branch on it (`NOT_FOUND`, `INVALID_FIELD`, ...).
    pub code: String,
    /// For people; it may change between versions.
    pub message: String,
}

/// The refusals of every operation that takes a key.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum KeyRefusals {
    /// `UNAUTHORIZED`: no key, or not a valid one.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// `FORBIDDEN`: this kind of key may not do this.
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// `UNAVAILABLE`: the store is briefly unavailable; retry.
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

#[cfg(feature = "server")]
impl axum::response::IntoResponse for ApiError {
    /// Logged here, once: a 5xx as an error (its detail stays in the log),
    /// a 4xx as a refusal.
    fn into_response(self) -> axum::response::Response {
        if self.status >= 500 {
            tracing::error!(code = self.code, message = %self.message, "request failed");
        } else {
            tracing::info!(status = self.status, code = self.code, "request refused");
        }
        let status = axum::http::StatusCode::from_u16(self.status)
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after_s {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(s),
            );
        }
        resp
    }
}
