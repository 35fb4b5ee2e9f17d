//! Claiming a step: the Run read, the delivery judged against it, the
//! conditional claim (lease + epoch), the lease kept alive while the step
//! works and given back when it fails for a retryable reason.

use crate::FaultPoint;
use crate::Harness;
use crate::StepError;
use armada_core::error::StoreError;
use armada_domain::run::Delivery;
use armada_domain::run::Run;
use armada_domain::run::RunEvent;
use armada_domain::step::decide;
use armada_domain::step::StepInput;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Harness {
    /// Reads the Run a message names (`None`: unknown, and the message is
    /// dropped).
    pub(crate) async fn read(&self, run_id: &str) -> Result<Option<Run>, StepError> {
        let run = self.svc.runs.get(run_id).await?;
        if run.is_none() {
            tracing::warn!(run_id, "message for an unknown run dropped");
        }
        Ok(run)
    }

    /// Claims `step` of the Run as read, or says why not (`None`: the
    /// message is stale, forged or lost the race, and is dropped).
    pub(crate) async fn claim(
        &self,
        run: Run,
        tenant: &str,
        step: u32,
    ) -> Result<Option<(Run, i64)>, StepError> {
        let svc = &self.svc;
        let run_id = run.run_id.as_str();
        if run.tenant != tenant {
            tracing::error!(run_id, tenant, owner = %run.tenant, "security: message tenant does not own the run; dropped");
            return Ok(None);
        }
        let now = svc.clock.now_ms();
        match run.classify_delivery(step, now) {
            Delivery::Stale { reason } => {
                self.svc
                    .counters
                    .stale_drops
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(run_id, step, current = run.step, state = %run.state(), reason = reason.as_str(), "stale message dropped");
                self.resend_followup(&run, now).await?;
                return Ok(None);
            }
            Delivery::LeaseHeld { until_ms } => {
                let left_ms = until_ms - now;
                return Err(StepError::Busy {
                    reason: format!("step {step} is held by another worker for {left_ms} ms"),
                    until_s: ((left_ms + 999) / 1000) as u32,
                });
            }
            Delivery::Claimable => {}
        }
        let mut claimed = run.clone();
        let lease_until_ms = now + svc.cfg.step_lease_ms;
        claimed.apply(RunEvent::Claimed { lease_until_ms }, now)?;
        match svc.runs.claim(&run, &claimed).await {
            Ok(()) => {
                tracing::info!(run_id, step, epoch = claimed.epoch, "claimed");
                self.svc
                    .faults
                    .at(FaultPoint::AfterClaim, &claimed.run_id)
                    .await
                    .map_err(StepError::Aborted)?;
                Ok(Some((claimed, now)))
            }
            Err(StoreError::Conflict { .. }) => {
                // Another worker got there between our read and our claim
                // (a duplicate delivery).
                self.rejudge(run_id, step, "a worker that claimed it first")
                    .await
                    .map(|()| None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Judges again a message for `step` whose claim or commit another
    /// worker's claim beat. That claim is no promise that its worker will
    /// finish (it may die holding the step), so the message goes only
    /// once the step is done (`Ok`), and meanwhile waits out the other's
    /// lease (`Busy`) or, the lease given up, comes back to claim.
    pub(crate) async fn rejudge(&self, run_id: &str, step: u32, by: &str) -> Result<(), StepError> {
        let Some(run) = self.read(run_id).await? else {
            return Ok(());
        };
        let now = self.svc.clock.now_ms();
        match run.classify_delivery(step, now) {
            Delivery::Stale { .. } => {
                self.svc
                    .counters
                    .stale_drops
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(run_id, step, by, "the step is done; message dropped");
                Ok(())
            }
            Delivery::LeaseHeld { until_ms } => Err(StepError::Busy {
                reason: format!("step {step} is held by {by}"),
                until_s: ((until_ms - now + 999) / 1000) as u32,
            }),
            Delivery::Claimable => Err(StepError::Retry(format!("step {step} was left by {by}"))),
        }
    }

    /// Claims `step` of the Run as read and hands `input` (what arrived
    /// for it: a sandbox's answer, decided approvals) to the domain, then
    /// carries out the decision; a claimed step that fails is given back.
    pub(crate) async fn claim_and_decide(
        &self,
        current: Run,
        tenant: &str,
        step: u32,
        input: StepInput<'_>,
    ) -> Result<(), StepError> {
        let run_id = current.run_id.clone();
        let Some((mut run, now)) = self.claim(current, tenant, step).await? else {
            return Ok(());
        };
        let epoch = run.epoch;
        let result = async {
            let prev = run.stamp();
            let Some(agent) = self.agent_or_end(&mut run, prev).await? else {
                return Ok(());
            };
            let d = decide(&mut run, &agent, input, now)?;
            self.drive(run, prev, &agent, d).await
        }
        .await;
        self.give_back(&run_id, epoch, &result).await;
        result
    }

    /// Gives a claimed step back early when it failed for a retryable reason
    /// (so the redelivery can claim it) or was refused (so the next message
    /// need not wait for the lease); fenced: only if still ours.
    pub(crate) async fn give_back(&self, run_id: &str, epoch: u64, result: &Result<(), StepError>) {
        if let Err(StepError::Retry(_) | StepError::Illegal(_)) = result {
            if let Err(e) = self.svc.runs.release(run_id, epoch).await {
                tracing::warn!(run_id, error = %e, "could not release the lease; it will expire");
            }
        }
    }

    pub(crate) async fn step(
        &self,
        run_id: &str,
        tenant: &str,
        step: u32,
    ) -> Result<(), StepError> {
        let Some(run) = self.read(run_id).await? else {
            return Ok(());
        };
        let Some((run, now)) = self.claim(run, tenant, step).await? else {
            return Ok(());
        };
        let epoch = run.epoch;
        let result = tokio::select! {
            result = self.execute(run, now) => result,
            never = self.keep_lease(run_id, epoch) => match never {},
        };
        self.give_back(run_id, epoch, &result).await;
        result
    }

    /// Renews the claimed step's lease every third of it while the step
    /// works, so the lease can be short: a worker that dies stops renewing,
    /// and its Run is claimable again within one lease. Runs until dropped
    /// (the step ended); once the lease is no longer ours it only waits.
    pub(crate) async fn keep_lease(&self, run_id: &str, epoch: u64) -> std::convert::Infallible {
        let lease_ms = self.svc.cfg.step_lease_ms.max(3);
        let every = Duration::from_millis((lease_ms / 3) as u64);
        loop {
            tokio::time::sleep(every).await;
            let until = self.svc.clock.now_ms() + lease_ms;
            match self.svc.runs.renew(run_id, epoch, until).await {
                Ok(true) => tracing::debug!(run_id, epoch, until, "lease renewed"),
                Ok(false) => return futures::future::pending().await,
                Err(e) => {
                    tracing::warn!(run_id, error = %e, "could not renew the lease; trying again")
                }
            }
        }
    }
}
