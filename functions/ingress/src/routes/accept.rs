//! Accepting a Run at the API: the starting itself is
//! [`armada_core::services::starting`]'s (shared with hooks and
//! schedules); here its answers become the API's (`202`, or the error a
//! refusal is), and a request's `Idempotency-Key` and URLs are read.

use axum::http::HeaderMap;
use serde_json::Value;

use armada_api::runs::RunAccepted;
use armada_api::ApiError;
use armada_core::services::auth::TenantKey;
use armada_core::services::starting::{self, Accepted, StartRefused};
use armada_core::Services;
use armada_domain::agent::AgentDefinition;
use armada_domain::api::CreateRun;
use armada_domain::crypto::sha256_hex;

pub(crate) use armada_core::services::starting::NewRun;

/// A refusal to start, as the API answers it.
pub(crate) fn refused(e: StartRefused) -> ApiError {
    match e {
        StartRefused::NotFound(what) => ApiError::not_found(&what),
        StartRefused::TooManyActiveRuns { active } => ApiError::too_many_active_runs(active),
        StartRefused::RateLimited {
            per_minute,
            retry_after_s,
        } => ApiError::rate_limited(per_minute, retry_after_s),
        StartRefused::TooManyDescendants(why) => {
            ApiError::new(400, armada_domain::collab::codes::TOO_MANY_DESCENDANTS, why)
        }
        e @ StartRefused::SessionBusy => ApiError::conflict("SESSION_BUSY", e.to_string()),
        e @ StartRefused::IdempotencyKeyReused => {
            ApiError::conflict("IDEMPOTENCY_KEY_REUSED", e.to_string())
        }
        e @ (StartRefused::NotQueued | StartRefused::Contended(_)) => {
            ApiError::unavailable(e.to_string())
        }
        StartRefused::Store(e) => e.into(),
    }
}

/// A started Run, as the API answers it.
pub(crate) fn accepted(a: Accepted) -> RunAccepted {
    RunAccepted {
        run_id: a.run_id,
        state: a.state,
        chain_id: a.chain_id,
        session_id: a.session_id,
        seq: a.seq,
        replayed: a.replayed,
    }
}

/// A registered agent, or `404` naming it.
pub(crate) async fn agent_named(svc: &Services, name: &str) -> Result<AgentDefinition, ApiError> {
    starting::agent_named(svc, name).await.map_err(refused)
}

pub(crate) async fn start_run(svc: &Services, new: NewRun<'_>) -> Result<RunAccepted, ApiError> {
    starting::start_run(svc, new)
        .await
        .map(accepted)
        .map_err(refused)
}

/// Starts what `cr` asks for: an agent's Run, a team's, or a relay chain.
pub(crate) async fn start_target(
    svc: &Services,
    key: &TenantKey,
    cr: CreateRun,
    idempotency: Option<(String, String)>,
) -> Result<RunAccepted, ApiError> {
    starting::start_target(svc, key, cr, idempotency)
        .await
        .map(accepted)
        .map_err(refused)
}

pub(crate) fn idempotency(
    headers: &HeaderMap,
    route: &str,
    body: &Value,
) -> Result<Option<(String, String)>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = v
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| {
            ApiError::new(
                400,
                "INVALID_HEADER",
                "Idempotency-Key must be 1-255 visible characters",
            )
        })?;
    // serde_json's maps are ordered, so this is a canonical fingerprint.
    let fp = sha256_hex(format!("{route}\n{body}").as_bytes());
    Ok(Some((key.to_string(), fp)))
}

/// A URL the stack will call on the tenant's behalf, refused now if the
/// egress guard would refuse it anyway (a name is judged again when sent).
pub(crate) fn egress_checked(svc: &Services, field: &str, url: &str) -> Result<(), ApiError> {
    svc.tools.egress().check(url).map_err(|e| {
        ApiError::new(
            400,
            "INVALID_FIELD",
            format!(
                "{field}: {} (the stack does not call this target)",
                e.code()
            ),
        )
    })
}
