//! Human approvals in a step: the wait that parks the Run in
//! `AWAITING_HITL` (its approvals created with that commit, then their
//! links sent), and a decision taken note of. A decision arrives as
//! `ApprovalDecided` in the Run's FIFO group, so it waits for any step in
//! flight to commit; it is judged against the ledger (a decision already
//! applied, or for another Run, changes nothing), the Run is claimed, and
//! every decided approval of the step is handed to [`decide`] at once.

use crate::Harness;
use crate::StepError;
use armada_core::Also;
use armada_domain::agent::AgentDefinition;
use armada_domain::approval::{Approval, ApprovalRequest, ApprovalState};
use armada_domain::messages::DispatchMessage;
use armada_domain::run::Run;
use armada_domain::run::RunEvent;
use armada_domain::run::RunEventRecord;
use armada_domain::run::Stamp;
use armada_domain::step::StepInput;
use std::sync::atomic::Ordering;

impl Harness {
    /// Parks the Run until a human decides, creating `requests`' approvals
    /// with the same commit; their links go out after it.
    pub(crate) async fn await_approvals(
        &self,
        mut run: Run,
        prev: Stamp,
        agent: &AgentDefinition,
        requests: Vec<ApprovalRequest>,
        events: Vec<RunEventRecord>,
    ) -> Result<(), StepError> {
        let svc = &self.svc;
        let now = svc.clock.now_ms();
        let policy = agent.approvals.clone().unwrap_or_default();
        let approvals: Vec<Approval> = requests
            .into_iter()
            .map(|r| {
                let by = run.started_by.clone();
                let mut a = Approval::new(
                    &run.tenant,
                    &run.run_id,
                    &run.agent,
                    run.step,
                    by,
                    &policy,
                    r,
                    now,
                );
                a.requested_by_address = run.started_by_address.clone();
                a
            })
            .collect();
        run.apply(RunEvent::AwaitApproval, now)?;
        let also = approvals
            .iter()
            .map(|a| Also::Approval(Box::new(a.clone())))
            .collect();
        svc.runs.save(prev, &run, &events, also).await?;
        for a in &approvals {
            for recipient in a.recipients() {
                let msg = DispatchMessage::notify_approval(
                    &svc.cfg.callback_signing_secret,
                    &a.approval_id,
                    &a.tenant,
                    &recipient,
                );
                // A link not sent now is sent by the watchdog, which finds
                // a recipient without a token.
                // A chat message goes to the delivery queue, mail to the
                // dispatch queue.
                if let Err(e) = svc.queues.send_routed(&msg).await {
                    tracing::warn!(approval_id = %a.approval_id, error = %e, "approval link not queued; the watchdog will");
                }
            }
        }
        self.check_later(&run).await
    }

    /// Approval `approval_id` of the Run was decided: applies it, with any
    /// other decided approval of the step, to their calls.
    pub(crate) async fn approval_decided(
        &self,
        run_id: &str,
        tenant: &str,
        approval_id: &str,
    ) -> Result<(), StepError> {
        let Some(current) = self.read(run_id).await? else {
            return Ok(());
        };
        let waiting: Vec<String> = current
            .ledger
            .values()
            .filter(|r| r.step == current.step && !r.state().is_settled() && r.awaits_approval())
            .filter_map(|r| r.approval.as_ref().map(|a| a.approval_id.clone()))
            .collect();
        if current.state().is_terminal() || !waiting.iter().any(|id| id == approval_id) {
            self.svc
                .counters
                .stale_drops
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(run_id, approval_id, state = %current.state(), "decision already applied, or for a run that ended; dropped");
            // Applied by a worker that died before sending what follows
            // (the next step, the end's notice): this repeat sends it, as
            // a repeated step message does; nothing else would.
            return self
                .resend_followup(&current, self.svc.clock.now_ms())
                .await;
        }
        let mut decided = Vec::new();
        for id in &waiting {
            match self.svc.approvals.get(id).await? {
                Some(a) if a.state() != ApprovalState::Pending && a.tenant == tenant => {
                    decided.push(a)
                }
                _ => {}
            }
        }
        if decided.is_empty() {
            // Nothing decided yet (a message ahead of its decision's write
            // cannot be: the write comes first); nothing to do.
            return Ok(());
        }
        let step = current.step;
        let input = StepInput::ApprovalsDecided(&decided);
        self.claim_and_decide(current, tenant, step, input).await
    }
}
