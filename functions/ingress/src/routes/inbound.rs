//! `POST /v1/hooks/{hook_id}` (no key): a sender's delivery to a hook.
//! The raw body is verified with the hook's secret before anything is
//! parsed; a verified delivery starts one Run of the hook's agent, team or
//! chain, once per dedup key (a repeat answers the first Run), within the
//! hook's hourly budget, with its input rendered from the hook's template.
//! Every verified delivery is recorded with how it was answered.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;

use armada_api::hooks::DeliveryAnswer;
use armada_api::server::{Path, RawBody};
use armada_api::{ApiError, ErrorBody};
use armada_core::clock::new_id;
use armada_core::services::deliveries::{self, Answered};
use armada_core::Services;
use armada_domain::hook::codes;
use armada_domain::hook::inbound::{self, Delivery, Headers, Outcome};
use armada_domain::hook::verify::{self, Credentials};

use super::accept::refused;
use super::hooks::secret_of;

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A sender's delivery to a hook.
///
/// GitHub signs with `X-Hub-Signature-256`, Standard Webhooks senders
/// with `webhook-id`, `webhook-timestamp` and `webhook-signature`,
/// Alertmanager with `Authorization: Bearer <secret>`. Each is checked
/// over the body exactly as received.
#[utoipa::path(post, path = "/v1/hooks/{hook_id}", tag = "hooks",
    request_body(content = serde_json::Value, description = "What the sender sends, as it sends it (at most 1 MiB of JSON)."),
    params(
        ("hook_id" = String, Path, description = "The hook's id."),
        ("X-Hub-Signature-256" = Option<String>, Header, description = "github: `sha256=<hex HMAC-SHA256 of the body>`."),
        ("X-GitHub-Event" = Option<String>, Header, description = "github: the event's name."),
        ("X-GitHub-Delivery" = Option<String>, Header, description = "github: the delivery's id (repeats start nothing)."),
        ("webhook-id" = Option<String>, Header, description = "standard: the message id (repeats start nothing)."),
        ("webhook-timestamp" = Option<String>, Header, description = "standard: seconds since the epoch, within 5 minutes of now."),
        ("webhook-signature" = Option<String>, Header, description = "standard: `v1,<base64>`, space-separated."),
    ),
    responses(
        (status = 202, description = "A Run started.", body = DeliveryAnswer),
        (status = 200, description = "Nothing new started: a repeat (with the first Run), a `ping` or a filtered event.", body = DeliveryAnswer),
        (status = 400, description = "`INVALID_JSON`, `INVALID_DELIVERY` (a header or field the sender always sends is missing), `TEMPLATE_ERROR`, `INVALID_FIELD`.", body = ErrorBody),
        (status = 401, description = "`UNAUTHORIZED`: a missing or wrong signature, token or timestamp.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: no such hook (or the agent or team it names).", body = ErrorBody),
        (status = 409, description = "`HOOK_DISABLED`.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        (status = 429, description = "`HOOK_RATE_LIMITED`, `RATE_LIMITED`, `TOO_MANY_ACTIVE_RUNS` (with `Retry-After`).", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: retry.", body = ErrorBody),
    ),
    security(()))]
pub(crate) async fn deliver(
    State(svc): State<Arc<Services>>,
    Path(hook_id): Path<String>,
    headers: HeaderMap,
    RawBody(raw): RawBody,
) -> Result<(StatusCode, Json<DeliveryAnswer>), ApiError> {
    let not_found = || ApiError::not_found(&format!("hook '{hook_id}'"));
    let hook = svc.hooks.get(&hook_id).await?.ok_or_else(not_found)?;
    let now = svc.clock.now_ms();
    let sent = Credentials {
        hub_signature: header(&headers, "x-hub-signature-256"),
        webhook_id: header(&headers, "webhook-id"),
        webhook_timestamp: header(&headers, "webhook-timestamp"),
        webhook_signature: header(&headers, "webhook-signature"),
        authorization: header(&headers, "authorization"),
    };
    let secret = secret_of(&svc, &hook);
    if verify::verify(hook.spec.kind, &secret, &raw, &sent, now.div_euclid(1000)).is_err() {
        svc.counters
            .unverified_deliveries
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(hook_id, tenant = %hook.tenant, "a delivery that did not verify was refused");
        return Err(ApiError::new(
            401,
            "UNAUTHORIZED",
            "the delivery's signature, token or timestamp is missing or wrong",
        ));
    }
    let payload = ApiError::json_body(&raw)?;
    let said = Headers {
        github_event: header(&headers, "x-github-event"),
        github_delivery: header(&headers, "x-github-delivery"),
        webhook_id: sent.webhook_id,
    };
    let read = inbound::read(&hook.spec, &said, &payload)
        .map_err(|e| ApiError::new(400, "INVALID_DELIVERY", e.to_string()))?;
    let delivery = Delivery::received(
        &new_id("dlv"),
        &hook.hook_id,
        &hook.tenant,
        &read.event,
        now,
    );
    let answered = deliveries::answer(&svc, &hook, &read, &payload, delivery).await;
    respond(answered)
}

/// A delivery's answer, as its sender hears it.
fn respond(answered: Answered) -> Result<(StatusCode, Json<DeliveryAnswer>), ApiError> {
    let body = |outcome, run_id: Option<String>, duplicate| {
        Json(DeliveryAnswer {
            outcome,
            run_id,
            duplicate,
        })
    };
    match answered {
        Answered::Started { run_id } => Ok((
            StatusCode::ACCEPTED,
            body(Outcome::Started, Some(run_id), None),
        )),
        Answered::Duplicate { run_id } => Ok((
            StatusCode::OK,
            body(Outcome::Duplicate, Some(run_id), Some(true)),
        )),
        Answered::Filtered => Ok((StatusCode::OK, body(Outcome::Filtered, None, None))),
        Answered::Disabled => Err(ApiError::conflict(
            codes::HOOK_DISABLED,
            "the hook is disabled",
        )),
        Answered::RateLimited { max, retry_after_s } => Err(ApiError {
            retry_after_s: Some(retry_after_s),
            ..ApiError::new(
                429,
                codes::HOOK_RATE_LIMITED,
                format!("this hook may start {max} runs an hour; retry after {retry_after_s} s"),
            )
        }),
        Answered::TemplateFailed(why) => Err(ApiError::new(400, codes::TEMPLATE_ERROR, why)),
        Answered::Refused(e) => Err(refused(e)),
    }
}
