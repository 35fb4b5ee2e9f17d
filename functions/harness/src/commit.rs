//! Ending a step: waiting (for a sandbox, or its answer), completing or
//! failing the Run with one fenced commit, and the messages that follow.

use crate::FaultPoint;
use crate::Harness;
use crate::StepError;
use armada_core::services::ending;
use armada_core::Also;
use armada_domain::agent::AgentDefinition;
use armada_domain::chat::ModelReply;
use armada_domain::chat::Role;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::clip;
use armada_domain::run::EndNote;
use armada_domain::run::Run;
use armada_domain::run::RunAction;
use armada_domain::run::RunError;
use armada_domain::run::RunEvent;
use armada_domain::run::RunEventRecord;
use armada_domain::run::RunState;
use armada_domain::run::Stamp;
use armada_domain::session;
use armada_domain::step::EVENT_PREVIEW_BYTES;

impl Harness {
    /// The Run's agent; a Run whose agent was deleted ends here.
    pub(crate) async fn agent_or_end(
        &self,
        run: &mut Run,
        prev: Stamp,
    ) -> Result<Option<AgentDefinition>, StepError> {
        if let Some(agent) = self.svc.registry.agent(&run.agent).await? {
            return Ok(Some(agent));
        }
        let error = RunError::new(
            "AGENT_NOT_FOUND",
            format!("agent '{}' no longer exists", run.agent),
        );
        self.finish(run, prev, RunEvent::Failed { error }, vec![])
            .await?;
        Ok(None)
    }

    /// The Run waits for its sandbox: AWAITING_TOOL, with a watchdog.
    pub(crate) async fn wait(
        &self,
        mut run: Run,
        prev: Stamp,
        events: Vec<RunEventRecord>,
    ) -> Result<(), StepError> {
        let now = self.svc.clock.now_ms();
        run.apply(RunEvent::AwaitTool, now)?;
        self.svc.runs.save(prev, &run, &events, vec![]).await?;
        self.check_later(&run).await
    }

    /// Asks the dispatcher to check on a waiting Run after a while.
    pub(crate) async fn check_later(&self, run: &Run) -> Result<(), StepError> {
        self.svc
            .queues
            .send_dispatch_delayed(
                &DispatchMessage::CheckRun {
                    run_id: run.run_id.clone(),
                    tenant: run.tenant.clone(),
                    step: run.step,
                    epoch: run.epoch,
                    n: 0,
                },
                self.svc.cfg.sandbox.check_seconds,
            )
            .await
            .map_err(|e| StepError::Retry(format!("watchdog not scheduled: {e}")))
    }

    pub(crate) async fn complete(
        &self,
        run: &mut Run,
        prev: Stamp,
        mut events: Vec<RunEventRecord>,
        input: &str,
        reply: ModelReply,
    ) -> Result<(), StepError> {
        let svc = &self.svc;
        let key = format!("outputs/{}/{}", run.tenant, run.run_id);
        let output = svc
            .payloads
            .spill(&key, &reply.content, svc.cfg.inline_limit_bytes)
            .await?;
        let now = svc.clock.now_ms();
        let actions = run.apply(RunEvent::Answered { output }, now)?;
        let (preview, truncated) = clip(&reply.content, EVENT_PREVIEW_BYTES);
        let note = EndNote {
            output: Some((preview.to_string(), truncated)),
            ..EndNote::default()
        };
        events.extend(run.push_end_event(note, now));
        let mut also = Vec::new();
        if let (Some(sid), Some(seq)) = (&run.session_id, run.session_seq) {
            let (user_turn, assistant_turn) = session::turn_numbers(seq);
            for (turn, role, text) in [
                (user_turn, Role::User, input),
                (assistant_turn, Role::Assistant, reply.content.as_str()),
            ] {
                // A large turn goes to S3 first, under a key fixed by session
                // and turn, so a retried commit overwrites the same object.
                let key = format!("turns/{sid}/{turn}");
                let content = svc
                    .payloads
                    .spill(&key, text, svc.cfg.inline_limit_bytes)
                    .await?;
                also.push(Also::SessionTurn {
                    session_id: sid.clone(),
                    turn,
                    role,
                    content,
                    run_id: run.run_id.clone(),
                });
            }
        }
        self.svc.runs.save(prev, run, &events, also).await?;
        tracing::info!(run_id = %run.run_id, epoch = run.epoch, "run completed");
        self.carry_out(run, &actions).await
    }

    /// Ends the Run in a terminal state other than COMPLETED.
    pub(crate) async fn finish(
        &self,
        run: &mut Run,
        prev: Stamp,
        event: RunEvent,
        mut events: Vec<RunEventRecord>,
    ) -> Result<(), StepError> {
        let now = self.svc.clock.now_ms();
        let actions = run.apply(event, now)?;
        events.extend(run.push_end_event(EndNote::default(), now));
        self.svc.runs.save(prev, run, &events, vec![]).await?;
        tracing::warn!(run_id = %run.run_id, state = %run.state(), error = ?run.error, "run ended");
        self.carry_out(run, &actions).await
    }

    /// What the machine decided, carried out ([`ending::carry_out`]); a
    /// message not sent makes the step retry.
    pub(crate) async fn carry_out(
        &self,
        run: &Run,
        actions: &[RunAction],
    ) -> Result<(), StepError> {
        self.svc
            .faults
            .at(FaultPoint::AfterCommit, &run.run_id)
            .await
            .map_err(StepError::Aborted)?;
        ending::carry_out(&self.svc, run, actions)
            .await
            .map_err(|e| StepError::Retry(format!("{actions:?} not carried out: {e}")))
    }

    /// A stale message may be the redelivery of a step whose commit landed
    /// but whose follow-up message was lost: send the follow-up again (the
    /// FIFO deduplication id and the claim make a second copy harmless).
    /// While a worker holds the step, the message stays: it may be what
    /// that worker claimed with (a decision, an answer), and if the worker
    /// dies it is all that carries the step.
    pub(crate) async fn resend_followup(&self, run: &Run, now: i64) -> Result<(), StepError> {
        if run.state() == RunState::Executing && run.lease_until_ms > now {
            let left_ms = run.lease_until_ms - now;
            Err(StepError::Busy {
                reason: format!("step {} is held by a worker for {left_ms} ms", run.step),
                until_s: ((left_ms + 999) / 1000) as u32,
            })
        } else if run.state().is_active() && run.lease_until_ms <= now {
            self.carry_out(run, &[RunAction::EnqueueNextStep]).await
        } else if run.state().is_terminal() && !run.state().is_closed() {
            self.carry_out(run, &[RunAction::AnnounceTerminal]).await
        } else {
            Ok(())
        }
    }
}
