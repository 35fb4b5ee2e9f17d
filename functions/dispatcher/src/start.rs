//! Starting Runs: a direct Run gets its first harness step; a session
//! Run starts only when every earlier message of its session has ended,
//! and one still waiting for them at its deadline times out then.

use crate::Dispatcher;
use crate::Handled;
use armada_core::batch::Outcome;
use armada_core::error::StoreError;
use armada_core::services::sandboxing;
use armada_domain::messages::{DispatchMessage, HarnessMessage};
use armada_domain::run::Run;
use armada_domain::run::RunState;

impl Dispatcher {
    pub(crate) async fn start(&self, run_id: &str, tenant: &str) -> Handled {
        let Some(run) = self.load(run_id, tenant).await? else {
            return Ok(Outcome::Done);
        };
        if run.state() == RunState::AwaitingChildren && Self::fans_out(&run) {
            // A start retried after its expansion committed: the spawn
            // that may not have happened is safe to do again.
            return self.spawn_children(run_id, tenant, 1).await;
        }
        if run.state() != RunState::Pending {
            tracing::info!(run_id, state = %run.state(), "already started; duplicate dropped");
            return Ok(Outcome::Done);
        }
        if run.session_id.is_some() && run.past_deadline(self.svc.clock.now_ms()) {
            // A message that waited behind its session's earlier ones
            // past its deadline: it ends now, and the session moves on.
            return self.time_out(run).await;
        }
        if !self.parent_still_waits(&run).await? {
            return self.cancel_orphan(run).await;
        }
        if Self::fans_out(&run) {
            return self.expand(run).await;
        }
        if run.prewarm_sandbox {
            // A resident agent: its sandbox is made warm now, not at the
            // first call. A failure here only costs the warm start.
            if let Ok(Some(agent)) = self.svc.registry.agent(&run.agent).await {
                if let Err(e) = sandboxing::prewarm(&self.svc, &run.tenant, &agent).await {
                    tracing::warn!(run_id, error = %e, "could not prewarm the sandbox");
                }
            }
        }
        match &run.session_id {
            Some(sid) => self.advance_session(sid, &run).await,
            None => self.send_first_step(&run).await,
        }
    }

    pub(crate) async fn send_first_step(&self, run: &Run) -> Handled {
        self.svc
            .queues
            .send_harness(&HarnessMessage::Step {
                run_id: run.run_id.clone(),
                tenant: run.tenant.clone(),
                step: 0,
                epoch: run.epoch,
            })
            .await?;
        tracing::info!(run_id = %run.run_id, "run started");
        Ok(Outcome::Done)
    }

    /// Passes over ended messages at the head of the session and starts the
    /// first one still PENDING. Safe to repeat: it only moves forward, with
    /// conditional writes, and a second start of the same Run is dropped by
    /// the harness.
    ///
    /// `known` is a Run of this session the caller has just read; it is not
    /// read again when it is the head.
    pub(crate) async fn advance_session(&self, session_id: &str, known: &Run) -> Handled {
        let Some(mut h) = self.svc.sessions.header(session_id).await? else {
            tracing::error!(session_id, "session of a run is missing");
            return Ok(Outcome::Done);
        };
        // Whether `h.next_seq` is as read (not carried over a local update).
        let mut fresh = true;
        for _ in 0..1000 {
            let next = h.done_seq + 1;
            if next > h.next_seq {
                if fresh {
                    return Ok(Outcome::Done);
                }
                // A message may have been accepted since the header was read.
                h = match self.svc.sessions.header(session_id).await? {
                    Some(h) => h,
                    None => return Ok(Outcome::Done),
                };
                fresh = true;
                continue;
            }
            let run = if known.session_seq == Some(next) {
                known.clone()
            } else {
                let Some(rid) = self.svc.sessions.message_run(session_id, next).await? else {
                    tracing::error!(session_id, seq = next, "session message index missing");
                    return Ok(Outcome::Done);
                };
                let Some(run) = self.svc.runs.get(&rid).await? else {
                    return Ok(Outcome::Done);
                };
                run
            };
            if run.state().is_terminal() {
                match self.svc.sessions.mark_done(session_id, next).await {
                    // We moved the session on: no need to read it again.
                    Ok(()) => {
                        h.done_seq = next;
                        fresh = false;
                    }
                    // Someone else did: see where it is now.
                    Err(StoreError::Conflict { .. }) => {
                        h = match self.svc.sessions.header(session_id).await? {
                            Some(h) => h,
                            None => return Ok(Outcome::Done),
                        };
                        fresh = true;
                    }
                    Err(e) => return Err(e.into()),
                }
                continue;
            }
            if known.state() == RunState::Pending && known.session_seq > Some(next) {
                self.start_again_at_deadline(known).await?;
            }
            if run.state() == RunState::Pending {
                return self.send_first_step(&run).await;
            }
            // The head is running: it will advance the session when it ends.
            return Ok(Outcome::Done);
        }
        Ok(Outcome::retry("session advance did not converge"))
    }

    /// A message queued behind its session's head is started again at its
    /// deadline (SQS delays a message 15 minutes at most: sooner, and then
    /// again), so that one still waiting then times out on time, not when
    /// the messages before it are done.
    async fn start_again_at_deadline(&self, run: &Run) -> Result<(), StoreError> {
        let left_ms = run.budgets.deadline_ms - self.svc.clock.now_ms();
        let delay_s = (left_ms / 1000 + 1).clamp(1, 900) as u32;
        let again = DispatchMessage::StartRun {
            run_id: run.run_id.clone(),
            tenant: run.tenant.clone(),
        };
        self.svc.queues.send_dispatch_delayed(&again, delay_s).await
    }
}
