//! The watchdog of a waiting Run (`CheckRun`, sent with a delay and sent
//! again while the Run keeps waiting): its deadline; for a Run waiting on
//! a sandbox, its sandbox's start timeout and the calls whose sandbox died
//! (never started → not run, started → lost).

use crate::Dispatcher;
use crate::Handled;
use armada_core::adapters::dynamo::sandboxes::CallRef;
use armada_core::batch::Outcome;
use armada_core::error::StoreError;
use armada_core::services::ending;
use armada_core::services::sandboxing;
use armada_core::services::sandboxing::CallWatch;
use armada_core::services::sandboxing::SandboxError;
use armada_domain::collab::SlotState;
use armada_domain::ledger::ToolCallState;
use armada_domain::messages::check_slot;
use armada_domain::messages::DispatchMessage;
use armada_domain::messages::HarnessMessage;
use armada_domain::messages::ResultBody;
use armada_domain::run::EndNote;
use armada_domain::run::Run;
use armada_domain::run::RunAction;
use armada_domain::run::RunError;
use armada_domain::run::RunEvent;
use armada_domain::run::RunState;
use armada_domain::sandbox::hand::codes;
use armada_domain::sandbox::hand::CallOutcome;
use armada_domain::sandbox::hand::SANDBOX_LOST;
use armada_domain::sandbox::lifecycle::SandboxRecord;
use armada_domain::sandbox::lifecycle::SandboxState;
use armada_domain::sandbox::seal::{answer_key, Answer};

/// A watchdog check as delivered: what it names and the SQS message that
/// carried it (a redelivery of the same message may take its slot again).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WatchCheck<'a> {
    pub(crate) run_id: &'a str,
    pub(crate) tenant: &'a str,
    pub(crate) step: u32,
    pub(crate) epoch: u64,
    pub(crate) n: u32,
    pub(crate) message_id: &'a str,
}

/// Whether a Run waiting for its sandbox holds it (handed over when the
/// last holder let go, which stamps the record's `last_used_at_ms`) but
/// has not gone on: none of its sandbox calls of this step was sent.
/// A sandbox gone meanwhile (destroyed after its last holder's call was
/// lost, say) counts too: told, the Run starts a new generation, as it
/// would had the hand-over arrived; left alone, it and every Run queued
/// behind it would wait out their deadlines.
fn handed_but_not_told(run: &Run, rec: &SandboxRecord) -> bool {
    rec.holder_run_id.as_deref() == Some(run.run_id.as_str())
        && run
            .ledger
            .values()
            .filter(|c| c.step == run.step && c.sandbox)
            .all(|c| c.state() == ToolCallState::Planned)
}

impl Dispatcher {
    /// The watchdog of a Run waiting at `step`: its deadline, its sandbox's
    /// start, and the calls it dispatched (a sandbox that died with a call
    /// in it is answered for: never started → not run, started → lost).
    pub(crate) async fn check_run(&self, check: &WatchCheck<'_>) -> Handled {
        let WatchCheck {
            run_id,
            tenant,
            step,
            epoch,
            n,
            message_id,
        } = *check;
        let Some(run) = self.load(run_id, tenant).await? else {
            return Ok(Outcome::Done);
        };
        if run.state().is_terminal() && !run.state().is_closed() {
            // Ended (timed out by this very check, say) and not settled:
            // the dispatcher that ended it died before settling.
            return self.settle(run_id, tenant).await;
        }
        let waiting = run.state().is_waiting();
        // Claimed since, at the wait's step: the claim's worker goes on,
        // or dies and its message comes back. Unless that message was no
        // message (a copy of one deleted long ago, which at-least-once
        // delivery allows): the check looks on until the step has moved.
        let claimed_since = run.state() == RunState::Executing && run.step == step;
        if !claimed_since && (run.epoch != epoch || run.step != step || !waiting) {
            // The Run moved on; a later wait has its own check.
            return Ok(Outcome::Done);
        }
        let now = self.svc.clock.now_ms();
        let slot = check_slot(run_id, epoch, step, n);
        if !self
            .svc
            .idempotency
            .take_slot(&slot, message_id, now)
            .await?
        {
            // A copy of a check already handled (a delete lost, a batch
            // handed twice) whose chain went on from its first copy.
            tracing::info!(run_id, step, n, "a repeated watchdog check dropped");
            return Ok(Outcome::Done);
        }
        if run.past_deadline(now) {
            return self.time_out(run).await;
        }
        if claimed_since {
            return self.check_claimed(&run, now, n).await;
        }
        let next = DispatchMessage::CheckRun {
            run_id: run_id.to_string(),
            tenant: tenant.to_string(),
            step,
            epoch,
            n: n + 1,
        };
        if run.state() == RunState::AwaitingHitl {
            // Humans have their own deadlines: the approvals'.
            return self.check_approvals(&run, step, &next).await;
        }
        if let Some(c) = run
            .children
            .as_ref()
            .filter(|_| run.state() == RunState::AwaitingChildren)
        {
            // A safety net for children whose start was lost: starting them
            // again is idempotent, and nothing happens when none is queued.
            let queued = c
                .slots
                .iter()
                .any(|s| s.round == c.round && s.state() == SlotState::Queued);
            if queued && c.running() < c.max_parallel as usize {
                let spawned = self.spawn_children(run_id, tenant, c.round).await?;
                if spawned != Outcome::Done {
                    return Ok(spawned);
                }
            }
        }
        if run.state() == RunState::AwaitingTool && run.sandbox_key.is_some() {
            let agent = self.svc.registry.agent(&run.agent).await?;
            let mut rec = self.svc.sandboxes.get(&run.tenant, &run.agent).await?;
            if let Some(r) = &rec {
                if r.holder_run_id.as_deref() == Some(run_id) {
                    match sandboxing::check_start(&self.svc, r, agent.as_ref()).await {
                        Ok(updated) => rec = Some(updated),
                        Err(SandboxError::Store(e)) => return Err(e.into()),
                        Err(SandboxError::Placement(why)) => {
                            tracing::warn!(run_id, %why, "sandbox restart after a start timeout failed");
                        }
                        // Died there: the redelivery looks again.
                        Err(SandboxError::Aborted(_)) => return Ok(Outcome::Abandoned),
                    }
                }
            }
            if let Some(holder) = rec.as_ref().and_then(|r| r.holder_run_id.as_deref()) {
                if holder != run_id {
                    self.free_from_ended_holder(holder).await?;
                }
            }
            if let Some(r) = rec.as_ref().filter(|r| handed_but_not_told(&run, r)) {
                // Its hand-over message was lost (its sender died after
                // letting go): the same message again.
                tracing::warn!(
                    run_id,
                    "a run holding its sandbox never went on; told again"
                );
                self.svc
                    .queues
                    .send_harness(&sandboxing::handed(&run, r.last_used_at_ms))
                    .await?;
            }
            let dispatched: Vec<_> = run
                .ledger
                .values()
                .filter(|c| c.step == step && c.sandbox && c.state() == ToolCallState::Dispatched)
                .cloned()
                .collect();
            for c in dispatched {
                let generation = c.generation.unwrap_or(0);
                let call = CallRef::of(&run, &c);
                let watch =
                    sandboxing::watch_call(&self.svc, rec.as_ref(), &call, generation).await?;
                let (outcome, why_destroy) = match watch {
                    CallWatch::Wait => continue,
                    CallWatch::NotRun(why) => {
                        // A silent sandbox that never started the call is
                        // replaced; a failed one stays failed.
                        let failed = rec
                            .as_ref()
                            .is_some_and(|r| r.state() == SandboxState::Failed);
                        let code = if failed {
                            codes::SANDBOX_UNAVAILABLE
                        } else {
                            SANDBOX_LOST
                        };
                        let outcome = CallOutcome::NotRun {
                            code: code.to_string(),
                            message: why,
                        };
                        (outcome, Some("the sandbox stopped answering"))
                    }
                    CallWatch::Lost(why) => (
                        CallOutcome::Lost { reason: why },
                        Some("the sandbox stopped answering during a call"),
                    ),
                    // Its effect is as unknown as a lost call's; the
                    // sandbox did its part and stays.
                    CallWatch::Unanswered(why) => (CallOutcome::Lost { reason: why }, None),
                };
                let destroy =
                    why_destroy.filter(|_| rec.as_ref().is_some_and(|r| !r.state().is_gone()));
                if let Some(why_destroy) = destroy {
                    // The Run's own identity: nothing the sandbox wrote decides whose
                    // sandbox goes.
                    sandboxing::destroy(&self.svc, &run.tenant, &run.agent, why_destroy).await?;
                }
                tracing::warn!(run_id, call_id = %c.call_id, ?outcome, "watchdog answers for a sandbox call");
                // The platform speaks for the generation the call went to,
                // sealing with that generation's key as its agent would.
                let body = ResultBody::Inline { outcome };
                let generation = c.generation.unwrap_or_default();
                let salt = rec.as_ref().map(|r| r.salt.as_str()).unwrap_or_default();
                let key = answer_key(
                    &self.svc.cfg.callback_signing_secret,
                    &run.tenant,
                    &run.agent,
                    generation,
                    salt,
                );
                let answer = Answer {
                    run_id: &run.run_id,
                    tenant: &run.tenant,
                    step,
                    call_id: &c.call_id,
                    attempt: c.attempt,
                    body: &body,
                };
                let seal = Some(answer.seal(&key, generation));
                self.svc
                    .queues
                    .send_harness(&HarnessMessage::ToolResult {
                        run_id: run.run_id.clone(),
                        tenant: run.tenant.clone(),
                        step,
                        call_id: c.call_id.clone(),
                        attempt: c.attempt,
                        body,
                        seal,
                    })
                    .await?;
            }
        }
        self.svc
            .queues
            .send_dispatch_delayed(&next, self.svc.cfg.sandbox.check_seconds)
            .await?;
        Ok(Outcome::Done)
    }

    /// A Run waiting behind `holder` for their agent's sandbox: should the
    /// holder have ended without letting go (its step asked for the
    /// sandbox after its end let go, a step whose commit the end then
    /// fenced), it lets go now, and the next in line is told. Letting go
    /// twice is nothing: the end's own release finds it gone.
    async fn free_from_ended_holder(&self, holder: &str) -> Result<(), StoreError> {
        let Some(ended) = self.svc.runs.get(holder).await? else {
            return Ok(());
        };
        if !ended.state().is_terminal() {
            return Ok(());
        }
        if ended.state().is_closed() {
            tracing::warn!(
                run_id = holder,
                "a run that ended still held its sandbox; let go"
            );
        } else {
            // Its own settling lets go too, and finds it done.
            tracing::info!(run_id = holder, "a run ending holds its sandbox; let go");
        }
        sandboxing::release_and_wake(&self.svc, &ended).await
    }

    /// A Run claimed at the step its wait was checked at: once its lease
    /// has lapsed for as long as a dead worker's message takes to come
    /// back, and it is still `EXECUTING` there, nothing carries it on,
    /// and its step is asked for again (a claim makes a second carrier
    /// harmless); until then it is looked at again later, as check `n + 1`
    /// of the claim's epoch (each check of a chain takes a slot of its own:
    /// sent again as `n` it would be taken for a copy and dropped, ending
    /// the chain while the claim's lease ran).
    async fn check_claimed(&self, run: &Run, now: i64, n: u32) -> Handled {
        let back_ms = i64::from(self.svc.cfg.crash_return_s) * 1000;
        if run.lease_until_ms + back_ms <= now {
            tracing::warn!(run_id = %run.run_id, step = run.step, epoch = run.epoch, "a claimed step with nothing to carry it on; asked for again");
            ending::carry_out(&self.svc, run, &[RunAction::EnqueueNextStep]).await?;
            return Ok(Outcome::Done);
        }
        let again = DispatchMessage::CheckRun {
            run_id: run.run_id.clone(),
            tenant: run.tenant.clone(),
            step: run.step,
            epoch: run.epoch,
            n: n + 1,
        };
        self.svc
            .queues
            .send_dispatch_delayed(&again, self.svc.cfg.sandbox.check_seconds)
            .await?;
        Ok(Outcome::Done)
    }

    /// A waiting Run ran out of wall-clock time: it ends TIMED_OUT.
    pub(crate) async fn time_out(&self, run: Run) -> Handled {
        let error = RunError::new(
            "TIMED_OUT",
            "the run exceeded its wall-clock budget while waiting",
        );
        let (run_id, tenant) = (run.run_id.clone(), run.tenant.clone());
        let event = RunEvent::DeadlineExceeded { error };
        match self.end_from_outside(run, event, EndNote::default()).await {
            Ok(Ok(_)) => self.settle(&run_id, &tenant).await,
            Ok(Err(e)) => Ok(self.illegal(&run_id, &e)),
            Err(StoreError::Conflict { .. }) => Ok(Outcome::Done),
            Err(e) => Err(e.into()),
        }
    }
}
