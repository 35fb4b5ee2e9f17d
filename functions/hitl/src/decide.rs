//! One decision of one approval: changed through its machine
//! ([`change`]: read, decided by the domain, written conditional on the
//! version read — so of two deciders at once one wins and the other is
//! told it was decided), then announced to the Run in its FIFO group.

use armada_api::ApiError;
use armada_core::cas::{change, Changed};
use armada_core::faults::FaultPoint;
use armada_core::Services;
use armada_domain::approval::{
    Approval, ApprovalAction, ApprovalEvent, ApprovalRefusal, Decider, Verdict,
};
use armada_domain::messages::HarnessMessage;

/// Reads approval `id`; another tenant's is not found.
pub(crate) async fn load(
    svc: &Services,
    id: &str,
    tenant: Option<&str>,
) -> Result<Approval, ApiError> {
    let found = svc.approvals.get(id).await?;
    match found {
        Some(a) if tenant.is_none_or(|t| t == a.tenant) => Ok(a),
        _ => Err(ApiError::not_found(&format!("approval '{id}'"))),
    }
}

/// Decides approval `id` as `by` (a key of `tenant`, or a token).
pub async fn decide(
    svc: &Services,
    id: &str,
    verdict: Verdict,
    by: Decider,
    from: Option<String>,
    comment: Option<String>,
    tenant: Option<&str>,
) -> Result<Approval, ApiError> {
    // Another tenant's approval is not found; someone else deciding first
    // makes it read again, and the domain says whether anything is left.
    let visible = |a: &Approval| tenant.is_none_or(|t| t == a.tenant);
    let decided = change(
        svc.approvals.as_ref(),
        id,
        || svc.clock.now_ms(),
        |a: &Approval| {
            visible(a).then(|| ApprovalEvent::Decide {
                verdict: verdict.clone(),
                by: by.clone(),
                from: from.clone(),
                comment: comment.clone(),
            })
        },
    )
    .await?;
    let (next, actions) = match decided {
        Some(Changed::Written(next, actions)) => (next, actions),
        Some(Changed::Refused(_, r)) => {
            return Err(ApiError::new(status_of(&r), r.code(), r.to_string()))
        }
        Some(Changed::Missing | Changed::Left(_)) => {
            return Err(ApiError::not_found(&format!("approval '{id}'")))
        }
        None => return Err(ApiError::unavailable("the approval kept changing; retry")),
    };
    svc.faults
        .at(FaultPoint::AfterApprovalDecided, &next.run_id)
        .await
        .map_err(|_| ApiError::unavailable("the decision is stored; the Run is told later"))?;
    if actions.contains(&ApprovalAction::ResumeRun) {
        announce(svc, &next).await;
    }
    tracing::info!(
        approval_id = id,
        state = next.state().as_str(),
        "approval decided"
    );
    Ok(next)
}

/// Tells the Run; if the message is lost, the Run's watchdog sends it.
async fn announce(svc: &Services, a: &Approval) {
    let msg = HarnessMessage::ApprovalDecided {
        run_id: a.run_id.clone(),
        tenant: a.tenant.clone(),
        approval_id: a.approval_id.clone(),
    };
    if let Err(e) = svc.queues.send_harness(&msg).await {
        tracing::warn!(approval_id = %a.approval_id, error = %e, "decision stored but not announced; the watchdog will");
    }
}

/// How an approval's refusal is answered over HTTP.
fn status_of(r: &ApprovalRefusal) -> u16 {
    match r {
        ApprovalRefusal::WrongDecision(_) => 400,
        ApprovalRefusal::LinkInvalid | ApprovalRefusal::SelfApproval(_) => 403,
        ApprovalRefusal::Expired
        | ApprovalRefusal::Cancelled
        | ApprovalRefusal::AlreadyDecided(_)
        | ApprovalRefusal::NotOverdue => 409,
    }
}
