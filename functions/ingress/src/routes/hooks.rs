//! `/v1/hooks` (a tenant's key): the tenant's inbound webhooks, created,
//! read, changed, rotated and deleted, and the deliveries each received.
//! A hook's secret is in the answers to its creation and its rotations
//! only: it is derived, never stored.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use armada_api::error::KeyRefusals;
use armada_api::hooks::{
    CreateHookBody, DeliveriesPage, DeliveryView, HookCreated, HookSecret, HookView, HooksPage,
    ListQuery, PatchHookBody,
};
use armada_api::server::{JsonBody, Path, Query};
use armada_api::{ApiError, ErrorBody};
use armada_core::cas::{change, Changed};
use armada_core::clock::{new_id, rfc3339};
use armada_core::services::auth::Principal;
use armada_core::services::starting;
use armada_core::Services;
use armada_domain::api::RunTarget;
use armada_domain::hook::inbound::Delivery;
use armada_domain::hook::verify::hook_secret;
use armada_domain::hook::{
    Hook, HookAction, HookEvent, HookKind, HookPatch, HookRefusal, HookSpec,
};

use super::accept::{egress_checked, refused};
use super::{list_limit, member, tenant_key};

/// Where a hook's sender posts.
pub(crate) fn hook_url(svc: &Services, hook_id: &str) -> String {
    let base = svc.cfg.public_url.as_deref().unwrap_or("");
    format!("{}/v1/hooks/{hook_id}", base.trim_end_matches('/'))
}

/// A hook's current secret.
pub(crate) fn secret_of(svc: &Services, hook: &Hook) -> String {
    hook_secret(
        &svc.cfg.callback_signing_secret,
        &hook.hook_id,
        &hook.salt,
        hook.spec.kind,
    )
}

pub(crate) fn hook_view(svc: &Services, h: &Hook) -> HookView {
    let s = &h.spec;
    let (agent, team, chain) = match &s.target {
        RunTarget::Agent(a) => (Some(a.clone()), None, None),
        RunTarget::Team(t) => (None, Some(t.clone()), None),
        RunTarget::Chain(c) => (None, None, Some(c.clone())),
    };
    HookView {
        hook_id: h.hook_id.clone(),
        kind: s.kind,
        url: hook_url(svc, &h.hook_id),
        agent,
        team,
        chain,
        input_template: s.input_template.clone(),
        callback_url: s.callback_url.clone(),
        events: s.events.clone(),
        alarm_names: s.alarm_names.clone(),
        topic_arn: h.topic_arn.clone(),
        on_resolved: matches!(s.kind, HookKind::Alertmanager | HookKind::Cloudwatch)
            .then_some(s.on_resolved),
        max_runs_per_hour: s.max_runs_per_hour,
        enabled: h.enabled(),
        created_at: rfc3339(h.created_at_ms),
        updated_at: rfc3339(h.updated_at_ms),
        version: h.version,
    }
}

/// What a hook's Runs would be of exists now (a hook that names nothing
/// would only reject every delivery), and its callback is one the stack
/// may call.
async fn check_spec(svc: &Services, spec: &HookSpec) -> Result<(), ApiError> {
    starting::target_exists(svc, &spec.target)
        .await
        .map_err(refused)?;
    if let Some(url) = &spec.callback_url {
        egress_checked(svc, "callback_url", url)?;
    }
    Ok(())
}

/// A hook of the caller's tenant (another tenant's is `404`, as one that
/// does not exist).
async fn own_hook(svc: &Services, tenant: &str, hook_id: &str) -> Result<Hook, ApiError> {
    match svc.hooks.get(hook_id).await? {
        Some(h) if h.tenant == tenant => Ok(h),
        _ => Err(ApiError::not_found(&format!("hook '{hook_id}'"))),
    }
}

/// Changes a hook of the caller's tenant through its machine.
async fn change_hook(
    svc: &Services,
    tenant: &str,
    hook_id: &str,
    event: HookEvent,
) -> Result<Hook, ApiError> {
    let changed = change(
        svc.hooks.as_ref(),
        hook_id,
        || svc.clock.now_ms(),
        |h: &Hook| (h.tenant == tenant).then(|| event.clone()),
    )
    .await?;
    let not_found = || ApiError::not_found(&format!("hook '{hook_id}'"));
    let (hook, actions) = match changed {
        Some(Changed::Written(h, actions)) => (h, actions),
        Some(Changed::Missing | Changed::Left(_)) => return Err(not_found()),
        Some(Changed::Refused(_, HookRefusal::Deleted)) => return Err(not_found()),
        Some(Changed::Refused(_, HookRefusal::Invalid(e))) => return Err(e.into()),
        Some(Changed::Refused(_, e @ HookRefusal::NoSecret)) => {
            return Err(ApiError::conflict("HOOK_HAS_NO_SECRET", e.to_string()))
        }
        None => return Err(ApiError::unavailable("the hook is changing quickly; retry")),
    };
    for action in actions {
        match action {
            HookAction::DeleteTopic(arn) => {
                if let Err(e) = svc.topics.delete(&arn).await {
                    // The hook is gone: an alarm reaching its topic finds none.
                    tracing::warn!(hook_id, topic = %arn, error = %e, "a deleted hook's topic was left");
                }
            }
            HookAction::ShowSecret => {}
        }
    }
    Ok(hook)
}

/// Creates a hook: where GitHub, a Standard Webhooks sender or
/// Alertmanager posts, and the secret it signs with, shown once.
#[utoipa::path(post, path = "/v1/hooks", tag = "hooks", request_body = CreateHookBody,
    responses(
        (status = 201, description = "Created: its URL and its secret, shown this once.", body = HookCreated,
            links(
                ("GetHook" = (operation_id = "get_hook", parameters(("hook_id" = "$response.body#/hook_id")))),
                ("HookDeliveries" = (operation_id = "hook_deliveries", parameters(("hook_id" = "$response.body#/hook_id")))),
                ("RotateHook" = (operation_id = "rotate_hook", parameters(("hook_id" = "$response.body#/hook_id")))),
                ("DeleteHook" = (operation_id = "delete_hook", parameters(("hook_id" = "$response.body#/hook_id")))),
            )),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD` (a template that does not compile names its line).", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: the agent or team.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn create_hook(
    State(svc): State<Arc<Services>>,
    who: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<HookCreated>), ApiError> {
    let key = member(&who)?;
    let (spec, enabled) = HookSpec::parse(&body)?;
    check_spec(&svc, &spec).await?;
    let mut hook = Hook::new(
        &new_id("hook"),
        &key.tenant,
        &key.key_id,
        spec,
        enabled,
        "",
        svc.clock.now_ms(),
    );
    if hook.spec.kind == HookKind::Cloudwatch {
        // Its topic first: a hook whose topic was never made is not kept.
        hook.topic_arn = Some(svc.topics.create(&hook.hook_id).await?);
    }
    svc.hooks.create(&hook).await?;
    tracing::info!(hook_id = %hook.hook_id, tenant = %hook.tenant, kind = hook.spec.kind.as_str(), "hook created");
    Ok((
        StatusCode::CREATED,
        Json(HookCreated {
            hook_id: hook.hook_id.clone(),
            url: hook_url(&svc, &hook.hook_id),
            secret: (hook.spec.kind != HookKind::Cloudwatch).then(|| secret_of(&svc, &hook)),
            topic_arn: hook.topic_arn.clone(),
            hook: hook_view(&svc, &hook),
        }),
    ))
}

/// The tenant's hooks, newest first.
#[utoipa::path(get, path = "/v1/hooks", tag = "hooks", params(ListQuery),
    responses(
        (status = 200, description = "The hooks (never their secrets).", body = HooksPage),
        (status = 400, description = "`INVALID_QUERY`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn list_hooks(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Query(q): Query<ListQuery>,
) -> Result<Json<HooksPage>, ApiError> {
    let key = tenant_key(&who)?;
    let hooks = svc.hooks.of_tenant(&key.tenant, list_limit(&q)?).await?;
    Ok(Json(HooksPage {
        hooks: hooks.iter().map(|h| hook_view(&svc, h)).collect(),
    }))
}

/// A hook (never its secret).
#[utoipa::path(get, path = "/v1/hooks/{hook_id}", tag = "hooks",
    params(("hook_id" = String, Path, description = "The hook's id.")),
    responses(
        (status = 200, description = "The hook.", body = HookView),
        (status = 404, description = "`NOT_FOUND`: no such hook in the caller's tenant.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn get_hook(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(hook_id): Path<String>,
) -> Result<Json<HookView>, ApiError> {
    let key = tenant_key(&who)?;
    let hook = own_hook(&svc, &key.tenant, &hook_id).await?;
    Ok(Json(hook_view(&svc, &hook)))
}

/// Changes a hook: any field but `kind` (`null` clears an optional one).
#[utoipa::path(patch, path = "/v1/hooks/{hook_id}", tag = "hooks", request_body = PatchHookBody,
    params(("hook_id" = String, Path, description = "The hook's id.")),
    responses(
        (status = 200, description = "The hook as changed.", body = HookView),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: the hook, or the agent or team it would name.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn patch_hook(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(hook_id): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<HookView>, ApiError> {
    let key = member(&who)?;
    let patch = HookPatch::parse(&body)?;
    let current = own_hook(&svc, &key.tenant, &hook_id).await?;
    let mut wanted = current.spec.clone();
    if let Some(t) = &patch.target {
        wanted.target = t.clone();
    }
    if let Some(u) = &patch.callback_url {
        wanted.callback_url = u.clone();
    }
    check_spec(&svc, &wanted).await?;
    let hook = change_hook(&svc, &key.tenant, &hook_id, HookEvent::Update(patch)).await?;
    Ok(Json(hook_view(&svc, &hook)))
}

/// Deletes a hook: its URL answers `404` from now on.
#[utoipa::path(delete, path = "/v1/hooks/{hook_id}", tag = "hooks",
    params(("hook_id" = String, Path, description = "The hook's id.")),
    responses(
        (status = 204, description = "Deleted."),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn delete_hook(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(hook_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let key = member(&who)?;
    change_hook(&svc, &key.tenant, &hook_id, HookEvent::Delete).await?;
    tracing::info!(hook_id, tenant = %key.tenant, "hook deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// A new secret for a hook, shown this once; the old one stops verifying.
#[utoipa::path(post, path = "/v1/hooks/{hook_id}/rotate", tag = "hooks",
    params(("hook_id" = String, Path, description = "The hook's id.")),
    responses(
        (status = 200, description = "Rotated: the new secret.", body = HookSecret),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        (status = 409, description = "`HOOK_HAS_NO_SECRET`: a cloudwatch hook.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn rotate_hook(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(hook_id): Path<String>,
) -> Result<Json<HookSecret>, ApiError> {
    let key = member(&who)?;
    let salt = armada_domain::approval::new_token();
    let hook = change_hook(&svc, &key.tenant, &hook_id, HookEvent::Rotate { salt }).await?;
    tracing::info!(hook_id, tenant = %key.tenant, "hook secret rotated");
    Ok(Json(HookSecret {
        hook_id: hook.hook_id.clone(),
        secret: secret_of(&svc, &hook),
    }))
}

pub(crate) fn delivery_view(d: &Delivery) -> DeliveryView {
    DeliveryView {
        delivery_id: d.delivery_id.clone(),
        received_at: rfc3339(d.received_at_ms),
        event: d.event.clone(),
        outcome: d.outcome(),
        run_id: d.run_id.clone(),
        reason: d.reason.clone(),
    }
}

/// A hook's verified deliveries, newest first, and how each was answered
/// (kept 30 days; deliveries that did not verify are counted, not kept).
#[utoipa::path(get, path = "/v1/hooks/{hook_id}/deliveries", tag = "hooks",
    params(("hook_id" = String, Path, description = "The hook's id."), ListQuery),
    responses(
        (status = 200, description = "The deliveries.", body = DeliveriesPage),
        (status = 400, description = "`INVALID_QUERY`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn hook_deliveries(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(hook_id): Path<String>,
    Query(q): Query<ListQuery>,
) -> Result<Json<DeliveriesPage>, ApiError> {
    let key = tenant_key(&who)?;
    let limit = list_limit(&q)?;
    own_hook(&svc, &key.tenant, &hook_id).await?;
    let deliveries = svc.hooks.deliveries(&hook_id, limit).await?;
    Ok(Json(DeliveriesPage {
        deliveries: deliveries.iter().map(delivery_view).collect(),
    }))
}
