//! The HTTP API's vocabulary, shared by the functions that serve it, the
//! CLI and the tests that call it: every request and response body as a
//! type, and the error every refusal is. The OpenAPI document is built
//! from these types and the routers' `#[utoipa::path]` attributes
//! (`armada_ingress::openapi`); `docs/openapi.json` is its committed copy.

pub mod approvals;
pub mod collab;
pub mod definitions;
pub mod error;
pub mod hooks;
pub mod keys;
pub mod mailboxes;
pub mod registry;
pub mod runs;
pub mod sandboxes;
pub mod schedules;
pub mod secrets;
#[cfg(feature = "server")]
pub mod server;
pub mod sessions;

pub use error::{ApiError, ErrorBody, ErrorDetail};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: String,
}
