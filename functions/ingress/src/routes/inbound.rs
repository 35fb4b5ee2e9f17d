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
use serde_json::json;

use armada_api::hooks::DeliveryAnswer;
use armada_api::runs::RunAccepted;
use armada_api::server::{Path, RawBody};
use armada_api::{ApiError, ErrorBody};
use armada_core::clock::new_id;
use armada_core::services::auth::TenantKey;
use armada_core::Services;
use armada_domain::api::{CreateRun, KeyRole};
use armada_domain::hook::inbound::{
    self, Delivery, DeliveryEvent, Headers, Inbound, Outcome, Verdict,
};
use armada_domain::hook::template::{self, Context, HookContext};
use armada_domain::hook::verify::{self, Credentials};
use armada_domain::hook::{codes, Hook};
use armada_domain::machine::Machine;
use armada_domain::run::Trigger;

use super::accept::start_target;
use super::hooks::secret_of;

/// The hour `now_ms` falls in (its start, in seconds) and how many
/// seconds remain of it (at least 1).
fn hour_window(now_ms: i64) -> (i64, u32) {
    let now_s = now_ms.div_euclid(1000);
    let start = now_s - now_s.rem_euclid(3600);
    (
        start,
        u32::try_from(start + 3600 - now_s).unwrap_or(3600).max(1),
    )
}

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
    let (answer, event) = answer(&svc, &hook, &read, &payload, &delivery).await;
    record(&svc, delivery, event).await;
    answer
}

type Answer = Result<(StatusCode, Json<DeliveryAnswer>), ApiError>;

/// How a verified delivery is answered, and what its record says of it.
async fn answer(
    svc: &Services,
    hook: &Hook,
    read: &Inbound,
    payload: &serde_json::Value,
    delivery: &Delivery,
) -> (Answer, Option<DeliveryEvent>) {
    let nothing = |outcome: Outcome| {
        Ok((
            StatusCode::OK,
            Json(DeliveryAnswer {
                outcome,
                run_id: None,
                duplicate: None,
            }),
        ))
    };
    if !hook.enabled() {
        let refused = ApiError::conflict(codes::HOOK_DISABLED, "the hook is disabled");
        return (Err(refused), Some(DeliveryEvent::Disabled));
    }
    match &read.verdict {
        Verdict::Start => {}
        Verdict::Ping => {
            let reason = "a ping: nothing to start".to_string();
            return (
                nothing(Outcome::Filtered),
                Some(DeliveryEvent::Filtered { reason }),
            );
        }
        Verdict::Filtered { reason } => {
            let reason = reason.clone();
            return (
                nothing(Outcome::Filtered),
                Some(DeliveryEvent::Filtered { reason }),
            );
        }
    }
    // A repeat answers the first Run, whatever the budget says now.
    let idem_key = format!("hook:{}:{}", hook.hook_id, read.dedup_key);
    match svc.idempotency.get(&hook.tenant, &idem_key).await {
        Ok(Some(first)) => return duplicate(first.run_id),
        Ok(None) => {}
        Err(e) => return (Err(e.into()), None),
    }
    let (window, retry_after) = hour_window(delivery.received_at_ms);
    let max = hook.spec.max_runs_per_hour;
    match svc.hooks.count_start(&hook.hook_id, window, max).await {
        Ok(true) => {}
        Ok(false) => {
            let refused = ApiError {
                retry_after_s: Some(retry_after),
                ..ApiError::new(
                    429,
                    codes::HOOK_RATE_LIMITED,
                    format!("this hook may start {max} runs an hour; retry after {retry_after} s"),
                )
            };
            return (Err(refused), Some(DeliveryEvent::RateLimited));
        }
        Err(e) => return (Err(e.into()), None),
    }
    let ctx = Context {
        event: &read.event,
        payload,
        hook: HookContext {
            hook_id: &hook.hook_id,
            kind: hook.spec.kind,
        },
    };
    let input = match template::render(hook.spec.template(), &ctx) {
        Ok(input) if !input.trim().is_empty() => input,
        Ok(_) => {
            let reason = format!("{}: the template rendered nothing", codes::TEMPLATE_ERROR);
            let refused = ApiError::new(
                400,
                codes::TEMPLATE_ERROR,
                "the hook's template rendered nothing",
            );
            return (Err(refused), Some(DeliveryEvent::Rejected { reason }));
        }
        Err(e) => {
            let reason = format!("{}: {e}", codes::TEMPLATE_ERROR);
            let refused = ApiError::new(
                400,
                codes::TEMPLATE_ERROR,
                format!("the hook's template failed: {e}"),
            );
            return (Err(refused), Some(DeliveryEvent::Rejected { reason }));
        }
    };
    let started = start(svc, hook, read, input, delivery, idem_key).await;
    match started {
        Ok(accepted) if accepted.replayed == Some(true) => duplicate(accepted.run_id),
        Ok(accepted) => (
            Ok((
                StatusCode::ACCEPTED,
                Json(DeliveryAnswer {
                    outcome: Outcome::Started,
                    run_id: Some(accepted.run_id.clone()),
                    duplicate: None,
                }),
            )),
            Some(DeliveryEvent::Started {
                run_id: accepted.run_id,
            }),
        ),
        // A refusal the sender can fix, or one that passes: recorded; an
        // outage is not (the sender retries it).
        Err(e) if e.status < 500 => {
            let reason = format!("{}: {}", e.code, e.message);
            (Err(e), Some(DeliveryEvent::Rejected { reason }))
        }
        Err(e) => (Err(e), None),
    }
}

fn duplicate(run_id: String) -> (Answer, Option<DeliveryEvent>) {
    (
        Ok((
            StatusCode::OK,
            Json(DeliveryAnswer {
                outcome: Outcome::Duplicate,
                run_id: Some(run_id.clone()),
                duplicate: Some(true),
            }),
        )),
        Some(DeliveryEvent::Duplicate { run_id }),
    )
}

/// Starts the delivery's Run, as a Run the hook asked for: its starter is
/// the hook (so any approver key of the tenant may decide its approvals),
/// and its dedup key is its `Idempotency-Key`.
async fn start(
    svc: &Services,
    hook: &Hook,
    read: &Inbound,
    input: String,
    delivery: &Delivery,
    idem_key: String,
) -> Result<RunAccepted, ApiError> {
    let as_hook = TenantKey {
        tenant: hook.tenant.clone(),
        key_id: hook.hook_id.clone(),
        role: KeyRole::Member,
        owner: None,
    };
    if input.chars().count() > armada_domain::api::MAX_INPUT_CHARS {
        return Err(ApiError::new(
            400,
            codes::TEMPLATE_ERROR,
            format!(
                "the rendered input is over {} characters",
                armada_domain::api::MAX_INPUT_CHARS
            ),
        ));
    }
    let cr = CreateRun {
        target: hook.spec.target.clone(),
        input,
        session_id: None,
        callback_url: hook.spec.callback_url.clone(),
        metadata: json!({}),
        started_from: Some(Trigger::Hook {
            hook_id: hook.hook_id.clone(),
            event: read.event.clone(),
            delivery_id: delivery.delivery_id.clone(),
        }),
    };
    // The dedup key is the fingerprint too: a repeat is always the same.
    let idem = Some((idem_key, read.dedup_key.clone()));
    start_target(svc, &as_hook, cr, idem).await
}

/// Records how a verified delivery was answered. The answer stands when
/// the record cannot be written (its Run, if any, is written already).
async fn record(svc: &Services, mut delivery: Delivery, event: Option<DeliveryEvent>) {
    let Some(event) = event else {
        return;
    };
    if delivery.apply(event, svc.clock.now_ms()).is_err() {
        return;
    }
    if let Err(e) = svc.hooks.record_delivery(&delivery).await {
        tracing::warn!(hook_id = %delivery.hook_id, delivery_id = %delivery.delivery_id, error = %e, "a delivery's record was not written");
    }
}
