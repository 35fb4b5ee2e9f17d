//! A child's end noted on its parent. The dispatcher settles the child and
//! sends `ChildEnded` into the parent's FIFO group of the harness queue, so
//! the parent's notes are taken one batch at a time, after any step of the
//! parent in flight has committed (never racing it), and never contend with
//! each other: the children of a batch are noted in one write, conditional
//! on the parent as read. The domain decides each one
//! ([`children::child_ended`]): the slot ends, the outstanding counter goes
//! down, the call it answers is answered, a queued sibling is started, and
//! at 0 the parent goes on (round 2, the lead's consolidation, the next
//! step) or ends by its team's failure policy, exactly once.

use armada_domain::collab::children::{self, ChildEnd, EndRefused, Noted};
use armada_domain::collab::SlotState;
use armada_domain::run::RunState;

use crate::FaultPoint;
use crate::Harness;
use crate::StepError;
use armada_core::cas::{until_written, Try};
use armada_core::error::StoreError;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::Run;
use armada_domain::run::RunAction;

impl Harness {
    /// Notes the ends of `child_ids` (a batch of one parent's group) on
    /// the parent `run_id`.
    pub(crate) async fn note_child_ends(
        &self,
        run_id: &str,
        tenant: &str,
        child_ids: &[String],
    ) -> Result<(), StepError> {
        let ends = self.child_ends(tenant, child_ids).await?;
        if ends.is_empty() {
            return Ok(());
        }
        let noted = until_written::<_, StepError, _>(|| async {
            let Some(parent) = self.read(run_id).await? else {
                return Ok(Try::Done(()));
            };
            if parent.tenant != tenant {
                tracing::error!(run_id, tenant, owner = %parent.tenant, "security: a child's end names another tenant's run; dropped");
                return Ok(Try::Done(()));
            }
            if parent.state().is_terminal() {
                // It ended without these children; its settling cancels the rest.
                return Ok(Try::Done(()));
            }
            let now = self.svc.clock.now_ms();
            let noted_before = ends.iter().all(|e| {
                parent
                    .children
                    .as_ref()
                    .and_then(|c| c.slot(&e.run_id))
                    .is_some_and(|s| s.state() == SlotState::Ended)
            });
            if noted_before {
                return self.resend_parent_followup(&parent, now).await.map(Try::Done);
            }
            if parent.state() != RunState::AwaitingChildren {
                let left_ms = (parent.lease_until_ms - now).max(1_000);
                return Err(StepError::Busy {
                    reason: format!("the parent is {}, not waiting", parent.state()),
                    until_s: ((left_ms + 999) / 1000) as u32,
                });
            }
            let mut next = parent.clone();
            let (mut events, mut start, mut actions) = (Vec::new(), Vec::new(), Vec::new());
            // The ends noted before, read once and only when a call or a
            // round completes (for its result or round 2).
            let mut known: Option<Vec<ChildEnd>> = None;
            for end in &ends {
                if known.is_none() && children::needs_earlier(&next, &end.run_id) {
                    let log = self.svc.run_events.all_events(run_id).await?;
                    known = Some(log.iter().filter_map(ChildEnd::from_event).collect());
                }
                let earlier = known.as_deref().unwrap_or(&[]);
                match children::child_ended(&mut next, end.clone(), earlier, now) {
                    Ok(Noted::Duplicate) => continue,
                    Ok(Noted::Recorded {
                        events: e,
                        start: s,
                        actions: a,
                    }) => {
                        events.extend(e);
                        start.extend(s);
                        actions.extend(a);
                        if let Some(k) = known.as_mut() {
                            k.push(end.clone());
                        }
                    }
                    // Ended by its team's policy on an earlier end of this
                    // batch: the rest no longer matter.
                    Err(EndRefused::NotWaiting(_)) => break,
                    Err(EndRefused::UnknownChild(id)) => {
                        tracing::error!(run_id, child = %id, "a child the parent does not list; dropped");
                    }
                    Err(EndRefused::Illegal(e)) => return Err(e.into()),
                }
            }
            if events.is_empty() {
                return self.resend_parent_followup(&parent, now).await.map(Try::Done);
            }
            // A start is harmless to repeat; a record saying "started"
            // about a child that never was would not be: starts go first.
            for id in &start {
                let msg = DispatchMessage::StartRun {
                    run_id: id.clone(),
                    tenant: tenant.to_string(),
                };
                self.svc
                    .queues
                    .send_dispatch(&msg)
                    .await
                    .map_err(|e| StepError::Retry(format!("child not started: {e}")))?;
            }
            match self
                .svc
                .runs
                .save(parent.stamp(), &next, &events, vec![])
                .await
            {
                Ok(()) => {}
                Err(StoreError::Conflict { .. }) => return Ok(Try::Again),
                Err(e) => return Err(e.into()),
            }
            self.svc
                .faults
                .at(FaultPoint::AfterChildEnds, run_id)
                .await
                .map_err(StepError::Aborted)?;
            tracing::info!(run_id, noted = ends.len(), outstanding = next.outstanding_children(), state = %next.state(), "children's ends noted");
            self.carry_out(&next, &actions).await.map(Try::Done)
        })
        .await?;
        noted.ok_or_else(|| StepError::Retry("the parent kept changing".into()))
    }

    /// How the children ended (each read, its output too when it completed).
    async fn child_ends(&self, tenant: &str, ids: &[String]) -> Result<Vec<ChildEnd>, StepError> {
        let mut ends = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(child) = self.svc.runs.get(id).await? else {
                continue;
            };
            if child.tenant != tenant || child.state().is_active() {
                tracing::warn!(child = %id, state = %child.state(), "a child's end for a run that is not an ended child of this tenant; dropped");
                continue;
            }
            let output = match (&child.output, child.state().outcome()) {
                (Some(p), RunState::Completed) => Some(self.svc.payloads.read(p).await?),
                _ => None,
            };
            ends.push(ChildEnd {
                run_id: child.run_id.clone(),
                agent: child.agent.clone(),
                state: child.state().outcome(),
                output,
                error: child.error.clone(),
            });
        }
        Ok(ends)
    }

    /// A duplicate end may be the retry of one whose commit landed and whose
    /// follow-up was lost: the parent's next step is sent again (the
    /// queue's deduplication and the claim make a second copy harmless).
    async fn resend_parent_followup(&self, parent: &Run, now: i64) -> Result<(), StepError> {
        let resting = parent.state() == RunState::Executing
            && parent.lease_until_ms <= now
            && parent.outstanding_children() == 0;
        if resting {
            self.carry_out(parent, &[RunAction::EnqueueNextStep]).await
        } else {
            Ok(())
        }
    }
}
