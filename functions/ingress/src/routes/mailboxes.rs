//! `/v1/mailboxes` (a tenant's key): the tenant's addresses of the
//! deployment's inbound domain, created, read, changed and deleted, and
//! the mail each received. An address is one mailbox's across every
//! tenant.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use armada_api::error::KeyRefusals;
use armada_api::hooks::ListQuery;
use armada_api::mailboxes::{
    CreateMailboxBody, MailPage, MailView, MailboxCreated, MailboxView, MailboxesPage,
    PatchMailboxBody,
};
use armada_api::server::{JsonBody, Path, Query};
use armada_api::{ApiError, ErrorBody};
use armada_core::cas::{change, Changed};
use armada_core::clock::{new_id, rfc3339};
use armada_core::error::StoreError;
use armada_core::services::auth::Principal;
use armada_core::services::starting;
use armada_core::Services;
use armada_domain::api::RunTarget;
use armada_domain::mailbox::receipt::MailReceipt;
use armada_domain::mailbox::{
    codes, Mailbox, MailboxEvent, MailboxPatch, MailboxRefusal, MailboxSpec,
};

use super::accept::refused;
use super::{list_limit, member, tenant_key};

pub(crate) fn mailbox_view(m: &Mailbox) -> MailboxView {
    let s = &m.spec;
    let (agent, team) = match &s.target {
        RunTarget::Agent(a) => (Some(a.clone()), None),
        RunTarget::Team(t) => (None, Some(t.clone())),
        RunTarget::Chain(_) => (None, None),
    };
    MailboxView {
        mailbox_id: m.mailbox_id.clone(),
        address: m.address.clone(),
        agent,
        team,
        allow_senders: s.allow_senders.clone(),
        input_template: s.input_template.clone(),
        reply: s.reply,
        max_runs_per_hour: s.max_runs_per_hour,
        enabled: m.enabled(),
        created_at: rfc3339(m.created_at_ms),
        updated_at: rfc3339(m.updated_at_ms),
        version: m.version,
    }
}

/// A mailbox of the caller's tenant (another tenant's is `404`).
async fn own_mailbox(svc: &Services, tenant: &str, id: &str) -> Result<Mailbox, ApiError> {
    match svc.mailboxes.get(id).await? {
        Some(m) if m.tenant == tenant => Ok(m),
        _ => Err(ApiError::not_found(&format!("mailbox '{id}'"))),
    }
}

/// Changes a mailbox of the caller's tenant through its machine.
async fn change_mailbox(
    svc: &Services,
    tenant: &str,
    id: &str,
    event: MailboxEvent,
) -> Result<Mailbox, ApiError> {
    let changed = change(
        svc.mailboxes.as_ref(),
        id,
        || svc.clock.now_ms(),
        |m: &Mailbox| (m.tenant == tenant).then(|| event.clone()),
    )
    .await?;
    match changed {
        Some(Changed::Written(m, _)) => Ok(m),
        Some(
            Changed::Missing | Changed::Left(_) | Changed::Refused(_, MailboxRefusal::Deleted),
        ) => Err(ApiError::not_found(&format!("mailbox '{id}'"))),
        None => Err(ApiError::unavailable(
            "the mailbox is changing quickly; retry",
        )),
    }
}

/// Creates a mailbox: `<name>@<the deployment's inbound domain>`, whose
/// mail from the senders it allows starts Runs of its agent or team.
#[utoipa::path(post, path = "/v1/mailboxes", tag = "mailboxes", request_body = CreateMailboxBody,
    responses(
        (status = 201, description = "Created: its address.", body = MailboxCreated,
            links(
                ("GetMailbox" = (operation_id = "get_mailbox", parameters(("mailbox_id" = "$response.body#/mailbox_id")))),
                ("MailboxDeliveries" = (operation_id = "mailbox_deliveries", parameters(("mailbox_id" = "$response.body#/mailbox_id")))),
                ("DeleteMailbox" = (operation_id = "delete_mailbox", parameters(("mailbox_id" = "$response.body#/mailbox_id")))),
            )),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: the agent or team.", body = ErrorBody),
        (status = 409, description = "`ADDRESS_TAKEN`: a mailbox (of any tenant) has the address.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn create_mailbox(
    State(svc): State<Arc<Services>>,
    who: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<MailboxCreated>), ApiError> {
    let key = member(&who)?;
    let (spec, enabled) = MailboxSpec::parse(&body)?;
    starting::target_exists(&svc, &spec.target)
        .await
        .map_err(refused)?;
    let mailbox = Mailbox::new(
        &new_id("mbx"),
        &key.tenant,
        &svc.cfg.inbox.domain,
        spec,
        enabled,
        svc.clock.now_ms(),
    );
    match svc.mailboxes.create(&mailbox).await {
        Ok(()) => {}
        Err(StoreError::Conflict { .. }) => {
            return Err(ApiError::conflict(
                codes::ADDRESS_TAKEN,
                format!("{} is taken", mailbox.address),
            ))
        }
        Err(e) => return Err(e.into()),
    }
    tracing::info!(mailbox_id = %mailbox.mailbox_id, tenant = %mailbox.tenant, "mailbox created");
    Ok((
        StatusCode::CREATED,
        Json(MailboxCreated {
            mailbox_id: mailbox.mailbox_id.clone(),
            address: mailbox.address.clone(),
            mailbox: mailbox_view(&mailbox),
        }),
    ))
}

/// The tenant's mailboxes, newest first.
#[utoipa::path(get, path = "/v1/mailboxes", tag = "mailboxes", params(ListQuery),
    responses(
        (status = 200, description = "The mailboxes.", body = MailboxesPage),
        (status = 400, description = "`INVALID_QUERY`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn list_mailboxes(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Query(q): Query<ListQuery>,
) -> Result<Json<MailboxesPage>, ApiError> {
    let key = tenant_key(&who)?;
    let mailboxes = svc
        .mailboxes
        .of_tenant(&key.tenant, list_limit(&q)?)
        .await?;
    Ok(Json(MailboxesPage {
        mailboxes: mailboxes.iter().map(mailbox_view).collect(),
    }))
}

/// A mailbox.
#[utoipa::path(get, path = "/v1/mailboxes/{mailbox_id}", tag = "mailboxes",
    params(("mailbox_id" = String, Path, description = "The mailbox's id.")),
    responses(
        (status = 200, description = "The mailbox.", body = MailboxView),
        (status = 404, description = "`NOT_FOUND`: no such mailbox in the caller's tenant.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn get_mailbox(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(mailbox_id): Path<String>,
) -> Result<Json<MailboxView>, ApiError> {
    let key = tenant_key(&who)?;
    let m = own_mailbox(&svc, &key.tenant, &mailbox_id).await?;
    Ok(Json(mailbox_view(&m)))
}

/// Changes a mailbox: any field but `name` (`null` clears `input_template`).
#[utoipa::path(patch, path = "/v1/mailboxes/{mailbox_id}", tag = "mailboxes", request_body = PatchMailboxBody,
    params(("mailbox_id" = String, Path, description = "The mailbox's id.")),
    responses(
        (status = 200, description = "The mailbox as changed.", body = MailboxView),
        (status = 400, description = "`INVALID_JSON`, `INVALID_FIELD`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`: the mailbox, or the agent or team it would name.", body = ErrorBody),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn patch_mailbox(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(mailbox_id): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<MailboxView>, ApiError> {
    let key = member(&who)?;
    let patch = MailboxPatch::parse(&body)?;
    own_mailbox(&svc, &key.tenant, &mailbox_id).await?;
    if let Some(t) = &patch.target {
        starting::target_exists(&svc, t).await.map_err(refused)?;
    }
    let m = change_mailbox(&svc, &key.tenant, &mailbox_id, MailboxEvent::Update(patch)).await?;
    Ok(Json(mailbox_view(&m)))
}

/// Deletes a mailbox: its address takes no more mail, and is free.
#[utoipa::path(delete, path = "/v1/mailboxes/{mailbox_id}", tag = "mailboxes",
    params(("mailbox_id" = String, Path, description = "The mailbox's id.")),
    responses(
        (status = 204, description = "Deleted."),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = [])))]
pub(crate) async fn delete_mailbox(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(mailbox_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let key = member(&who)?;
    change_mailbox(&svc, &key.tenant, &mailbox_id, MailboxEvent::Delete).await?;
    tracing::info!(mailbox_id, tenant = %key.tenant, "mailbox deleted");
    Ok(StatusCode::NO_CONTENT)
}

fn mail_view(r: &MailReceipt) -> MailView {
    MailView {
        mail_id: r.mail_id.clone(),
        received_at: rfc3339(r.received_at_ms),
        from: r.from.clone(),
        subject: r.subject.clone(),
        message_id: r.message_id.clone(),
        outcome: r.outcome(),
        run_id: r.run_id.clone(),
        reason: r.reason.clone(),
    }
}

/// The mail a mailbox received, newest first, and how each was answered
/// (kept 30 days; mail for no mailbox is not kept).
#[utoipa::path(get, path = "/v1/mailboxes/{mailbox_id}/deliveries", tag = "mailboxes",
    params(("mailbox_id" = String, Path, description = "The mailbox's id."), ListQuery),
    responses(
        (status = 200, description = "The mail.", body = MailPage),
        (status = 400, description = "`INVALID_QUERY`.", body = ErrorBody),
        (status = 404, description = "`NOT_FOUND`.", body = ErrorBody),
        KeyRefusals,
    ),
    security(("member_key" = []), ("approver_key" = [])))]
pub(crate) async fn mailbox_deliveries(
    State(svc): State<Arc<Services>>,
    who: Principal,
    Path(mailbox_id): Path<String>,
    Query(q): Query<ListQuery>,
) -> Result<Json<MailPage>, ApiError> {
    let key = tenant_key(&who)?;
    let limit = list_limit(&q)?;
    own_mailbox(&svc, &key.tenant, &mailbox_id).await?;
    let mail = svc.mailboxes.mail(&mailbox_id, limit).await?;
    Ok(Json(MailPage {
        deliveries: mail.iter().map(mail_view).collect(),
    }))
}
