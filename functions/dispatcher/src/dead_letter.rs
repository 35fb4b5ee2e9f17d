//! Dead letters (from either DLQ): the Run whose message kept failing is
//! failed with the reason, so no Run stays non-terminal forever.

use crate::Dispatcher;
use crate::Handled;
use armada_core::batch::Outcome;
use armada_core::services::ending::{self, EndOutcome};
use armada_core::services::unreadable::Ending;
use armada_domain::dead_letter::{judge, watch, DeadLetter, Verdict};
use armada_domain::messages::DispatchMessage;
use armada_domain::messages::HarnessMessage;
use armada_domain::run::EndNote;
use armada_domain::run::RunError;
use armada_domain::run::RunEvent;

impl Dispatcher {
    /// A message that kept failing: fail its Run with the reason, then settle it.
    pub(crate) async fn dead_letter(&self, queue: &str, body: &str, receives: u32) -> Handled {
        let harness = serde_json::from_str::<HarnessMessage>(body).ok();
        let dispatch = harness
            .is_none()
            .then(|| serde_json::from_str::<DispatchMessage>(body).ok())
            .flatten();
        let (run_id, tenant, what) = if let Some(m) = harness.clone() {
            match m {
                HarnessMessage::Step {
                    run_id,
                    tenant,
                    step,
                    ..
                } => (run_id, tenant, format!("step {step}")),
                HarnessMessage::SandboxHanded {
                    run_id,
                    tenant,
                    step,
                    ..
                } => (run_id, tenant, format!("sandbox hand-over at step {step}")),
                HarnessMessage::ToolResult {
                    run_id,
                    tenant,
                    call_id,
                    ..
                } => (run_id, tenant, format!("tool result of {call_id}")),
                HarnessMessage::ChildEnded {
                    run_id,
                    tenant,
                    child_run_id,
                } => (run_id, tenant, format!("end of child {child_run_id}")),
                HarnessMessage::ApprovalDecided {
                    run_id,
                    tenant,
                    approval_id,
                } => (
                    run_id,
                    tenant,
                    format!("decision of approval {approval_id}"),
                ),
            }
        } else if let Some(m) = dispatch.clone() {
            match m {
                DispatchMessage::StartRun { run_id, tenant } => {
                    (run_id, tenant, "start".to_string())
                }
                DispatchMessage::RunTerminal { run_id, tenant } => {
                    (run_id, tenant, "settlement".to_string())
                }
                DispatchMessage::CheckRun { run_id, tenant, .. } => {
                    (run_id, tenant, "watchdog".to_string())
                }
                DispatchMessage::SpawnChildren { run_id, tenant, .. } => {
                    (run_id, tenant, "children's start".to_string())
                }
                DispatchMessage::FireSchedule {
                    schedule_id,
                    scheduled_at,
                    ..
                } => {
                    tracing::error!(
                        schedule_id,
                        scheduled_at,
                        queue,
                        "a schedule's firing failed on every delivery"
                    );
                    return Ok(Outcome::Done);
                }
                DispatchMessage::SendReply { run_id, .. } => {
                    // The Run is closed: its answer stands, its reply is lost.
                    tracing::error!(
                        run_id,
                        queue,
                        "a mail reply could not be sent on any attempt"
                    );
                    return Ok(Outcome::Done);
                }
                DispatchMessage::DeliverCallback { run_id, .. } => {
                    tracing::error!(
                        run_id,
                        queue,
                        "a callback could not be delivered on any attempt"
                    );
                    return Ok(Outcome::Done);
                }
                DispatchMessage::NotifyApproval {
                    approval_id,
                    recipient,
                    ..
                } => {
                    // The approval stays pending: an approver key can still
                    // decide it, and its deadline still expires it.
                    tracing::error!(
                        approval_id,
                        recipient,
                        queue,
                        "an approval link could not be sent on any attempt"
                    );
                    return Ok(Outcome::Done);
                }
                DispatchMessage::RenewCredentials {
                    tenant,
                    agent,
                    generation,
                    ..
                } => {
                    // The agent asks again every minute until it has them.
                    tracing::error!(
                        tenant,
                        agent,
                        generation,
                        queue,
                        "a credentials renewal failed on every attempt"
                    );
                    return Ok(Outcome::Done);
                }
            }
        } else {
            tracing::error!(queue, "unreadable dead letter dropped");
            return Ok(Outcome::Done);
        };
        let letter = match (&harness, &dispatch) {
            (Some(m), _) => Some(DeadLetter::Harness(m)),
            (None, Some(m)) => Some(DeadLetter::Dispatch(m)),
            (None, None) => None,
        };
        // A copy of a message the Run is past ran out of deliveries: the
        // Run never waited for it. (A Run that cannot be read is failed.)
        if let (Ok(Some(run)), Some(letter)) = (self.svc.runs.get(&run_id).await, letter) {
            let now = self.svc.clock.now_ms();
            match judge(&run, letter, now) {
                _ if run.tenant != tenant => {}
                Verdict::Past => {
                    tracing::warn!(
                        run_id,
                        queue,
                        what,
                        "a dead letter the run is past; the run goes on"
                    );
                    return Ok(Outcome::Done);
                }
                Verdict::Watch => {
                    // Its watchdog looks (again), and starts what was lost.
                    tracing::warn!(
                        run_id,
                        queue,
                        what,
                        "a dead letter of a waiting run; its watchdog looks"
                    );
                    let check = watch(&run, letter);
                    self.svc
                        .queues
                        .send_dispatch_delayed(&check, self.svc.cfg.sandbox.check_seconds)
                        .await?;
                    return Ok(Outcome::Done);
                }
                Verdict::Fail => {}
            }
        }
        tracing::error!(run_id, queue, what, "dead letter received");
        let error = RunError::new(
            "DEAD_LETTERED",
            format!("the run's {what} message failed on every delivery and was moved to {queue}"),
        );
        let note = EndNote {
            receives: Some(receives),
            ..EndNote::default()
        };
        // A Run whose document cannot be read (which is likely why every
        // delivery failed) is rebuilt from its head and failed.
        let event = RunEvent::Failed { error };
        match ending::end(&self.svc, &run_id, &tenant, event, note, Ending::Fail).await? {
            // Announcing its end is settling it, next.
            Some(EndOutcome::Ended(_) | EndOutcome::AlreadyEnded(_)) => {
                self.settle(&run_id, &tenant).await
            }
            Some(EndOutcome::Missing) => Ok(Outcome::Done),
            Some(EndOutcome::Refused(e)) => Ok(self.illegal(&run_id, &e)),
            None => Ok(Outcome::retry("the run kept changing")),
        }
    }
}
