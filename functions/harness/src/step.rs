//! One step's work, driven by the domain: [`decide`] says what to do
//! next and this file does it (the model call, the inline calls, holding
//! the sandbox and dispatching to it), bringing each result back to
//! `decide`, until the step ends in one of the commits of [`commit`].

use crate::FaultPoint;
use crate::Harness;
use crate::StepError;
use armada_core::services::sandboxing;
use armada_core::services::sandboxing::SandboxError;
use armada_core::services::secrets::TenantSecrets;
use armada_domain::agent::AgentDefinition;
use armada_domain::chat::ModelReply;
use armada_domain::chat::ToolCall;
use armada_domain::collab::resume::RunIdentity;
use armada_domain::collab::ChildLimits;
use armada_domain::context;
use armada_domain::ledger::ToolCallRecord;
use armada_domain::run::LogEvent;
use armada_domain::run::Payload;
use armada_domain::run::Run;
use armada_domain::run::RunError;
use armada_domain::run::RunEvent;
use armada_domain::run::RunEventRecord;
use armada_domain::run::Stamp;
use armada_domain::sandbox::hand::codes;
use armada_domain::sandbox::lifecycle::Acquired;
use armada_domain::skills;
use armada_domain::step::decide;
use armada_domain::step::invocation;
use armada_domain::step::manifest_for;
use armada_domain::step::record_dispatch;
use armada_domain::step::Decision;
use armada_domain::step::InlineAnswer;
use armada_domain::step::Next;
use armada_domain::step::StepInput;
use std::time::Duration;

impl Harness {
    /// The claimed part of a step.
    pub(crate) async fn execute(&self, mut run: Run, now: i64) -> Result<(), StepError> {
        let prev = run.stamp();
        let Some(agent) = self.agent_or_end(&mut run, prev).await? else {
            return Ok(());
        };
        let d = decide(&mut run, &agent, StepInput::Claimed, now)?;
        self.drive(run, prev, &agent, d).await
    }

    /// Carries out decisions until the step ends.
    pub(crate) async fn drive(
        &self,
        mut run: Run,
        mut prev: Stamp,
        agent: &AgentDefinition,
        mut d: Decision,
    ) -> Result<(), StepError> {
        let svc = &self.svc;
        let mut events = Vec::new();
        // The model's last reply and the input it answered, for `Answer`.
        let mut answered: Option<(String, ModelReply)> = None;
        loop {
            events.append(&mut d.events);
            if d.checkpoint {
                svc.runs.save(prev, &run, &events, vec![]).await?;
                prev = run.stamp();
                events.clear();
            }
            let now = svc.clock.now_ms();
            d = match d.next {
                Next::End(event) => return self.finish(&mut run, prev, event, events).await,
                Next::CallModel { hold_sandbox_first } => {
                    if hold_sandbox_first {
                        if let Some(wait) = self.eager_wait(&mut run, agent, now).await? {
                            events.push(wait);
                            return self.wait(run, prev, events).await;
                        }
                    }
                    let (input, reply) = match self.call_model(&mut run, agent, &mut events).await?
                    {
                        Ok(answer) => answer,
                        Err(event) => return self.finish(&mut run, prev, event, events).await,
                    };
                    self.hooks
                        .after_model_call(&run)
                        .await
                        .map_err(StepError::Aborted)?;
                    self.svc
                        .faults
                        .at(FaultPoint::AfterModelReply, &run.run_id)
                        .await
                        .map_err(StepError::Aborted)?;
                    let now = svc.clock.now_ms();
                    let d = decide(&mut run, agent, StepInput::Replied(&reply), now)?;
                    answered = Some((input, reply));
                    d
                }
                Next::Answer => {
                    let Some((input, reply)) = answered.take() else {
                        return Err(StepError::Illegal(
                            "an answer was decided without a model reply".into(),
                        ));
                    };
                    return self.complete(&mut run, prev, events, &input, reply).await;
                }
                Next::RunInline(calls) => {
                    let mut ran = Vec::with_capacity(calls.len());
                    let secrets = TenantSecrets {
                        svc,
                        tenant: &run.tenant,
                    };
                    for rec in &calls {
                        let call = ToolCall {
                            id: rec.call_id.clone(),
                            name: rec.skill.clone(),
                            args: rec.args.clone(),
                        };
                        let now = svc.clock.now_ms();
                        let mut progress = Vec::new();
                        let outcome = svc
                            .tools
                            .execute(agent, &call, &run.run_id, now, &secrets, &mut progress)
                            .await;
                        let (ok, result) = match outcome {
                            Ok(v) => (true, v),
                            Err(f) => (false, f.to_json()),
                        };
                        ran.push(InlineAnswer {
                            call_id: rec.call_id.clone(),
                            ok,
                            result,
                            progress,
                        });
                    }
                    self.hooks
                        .after_tools_ran(&run)
                        .await
                        .map_err(StepError::Aborted)?;
                    decide(
                        &mut run,
                        agent,
                        StepInput::InlineRan(ran),
                        svc.clock.now_ms(),
                    )?
                }
                Next::AwaitApproval(requests) => {
                    return self
                        .await_approvals(run, prev, agent, requests, events)
                        .await
                }
                Next::Dispatch(planned) => {
                    return self.dispatch(run, prev, agent, &planned, events).await
                }
                Next::Wait => return self.wait(run, prev, events).await,
                Next::Delegate(calls) => {
                    let known = self.known_agents(&run, agent, &calls).await?;
                    let resumes = self.resume_checks(&run, agent, &calls).await?;
                    let limits = ChildLimits {
                        max_depth: svc.cfg.max_delegation_depth,
                        max_children_per_wait: svc.cfg.max_children_per_wait,
                        max_descendants: svc.cfg.max_descendants_per_root,
                    };
                    let input = StepInput::Delegations {
                        known: &known,
                        limits,
                        resumes: &resumes,
                    };
                    decide(&mut run, agent, input, svc.clock.now_ms())?
                }
                Next::AwaitChildren => return self.await_children(run, prev, events).await,
                Next::Continue => {
                    let actions = run.apply(RunEvent::StepContinues, now)?;
                    svc.runs.save(prev, &run, &events, vec![]).await?;
                    svc.faults
                        .at(FaultPoint::AfterCommit, &run.run_id)
                        .await
                        .map_err(StepError::Aborted)?;
                    return self.carry_out(&run, &actions).await;
                }
            };
        }
    }

    /// Assembles the context and asks the model, for no longer than the
    /// Run has left. `Ok(Err(_))`: the Run ends with that event (the model
    /// failed for good, or the deadline came first).
    async fn call_model(
        &self,
        run: &mut Run,
        agent: &AgentDefinition,
        events: &mut Vec<RunEventRecord>,
    ) -> Result<Result<(String, ModelReply), RunEvent>, StepError> {
        let svc = &self.svc;
        let input = match &run.input {
            Payload::Inline { text } => text.clone(),
            Payload::Stored { key, .. } => svc.payloads.get_text(key).await?,
        };
        let history = match &run.session_id {
            Some(sid) => svc.sessions.history(sid).await?,
            None => vec![],
        };
        let log = svc.run_events.all_events(&run.run_id).await?;
        // A resumed Run starts from its source's conversation.
        let mut transcript = match self.resumed_transcript(run).await? {
            Ok(copied) => copied,
            Err(error) => return Ok(Err(RunEvent::Failed { error })),
        };
        transcript.extend(context::transcript(&input, &log));
        // Who the Run runs as is fixed at its first model call: it keeps
        // its model even if its agent is redefined meanwhile.
        let identity = run
            .identity
            .get_or_insert_with(|| RunIdentity::of(agent))
            .clone();
        let assembled = context::assemble(
            &agent.system_prompt,
            &history,
            &transcript,
            identity.model.context_window,
        );
        let now = svc.clock.now_ms();
        if let Some(c) = assembled.compaction {
            let compacted = LogEvent::HistoryCompacted {
                dropped_turns: c.dropped_turns as u64,
                kept_turns: c.kept_turns as u64,
            };
            events.push(run.push_event(compacted, now));
        }
        let mut specs: Vec<_> = agent
            .tool_names()
            .iter()
            .filter_map(|s| agent.manifest(s).map(|m| m.tool_spec()))
            .collect();
        // A lead team's Run plans: the team gives its lead the tool.
        if !agent.skills.iter().any(|s| s == skills::PLAN) {
            specs.extend(manifest_for(run, agent, skills::PLAN).map(|m| m.tool_spec()));
        }
        let attempts = svc.cfg.model_attempts;
        let call =
            svc.models
                .complete_with_retry(&identity.model, &assembled.messages, &specs, attempts);
        // A Run (a child most of all: its deadline is its root's) never
        // outlives its wall-clock budget waiting on a model.
        let left_ms = (run.budgets.deadline_ms - now).max(0) as u64;
        let Ok(answer) = tokio::time::timeout(Duration::from_millis(left_ms), call).await else {
            let error = RunError::new(
                "TIMED_OUT",
                "the run exceeded its wall-clock budget waiting for the model",
            );
            return Ok(Err(RunEvent::DeadlineExceeded { error }));
        };
        match answer {
            Ok((reply, attempts)) => {
                if attempts > 1 {
                    let retried = LogEvent::ModelRetried { attempts };
                    events.push(run.push_event(retried, now));
                }
                Ok(Ok((input, reply)))
            }
            Err((e, attempts)) => Ok(Err(RunEvent::Failed {
                error: RunError::new(
                    "MODEL_ERROR",
                    format!("the model failed after {attempts} attempt(s): {e}"),
                ),
            })),
        }
    }

    /// An `eager` agent holds its sandbox before its first model call; the
    /// event to record when the Run has to wait for it.
    pub(crate) async fn eager_wait(
        &self,
        run: &mut Run,
        agent: &AgentDefinition,
        now: i64,
    ) -> Result<Option<RunEventRecord>, StepError> {
        let holding = match sandboxing::acquire(&self.svc, &run.tenant, &run.run_id, agent).await {
            Ok(h) => h,
            Err(SandboxError::Store(e)) => return Err(e.into()),
            Err(SandboxError::Aborted(a)) => return Err(StepError::Aborted(a)),
            // A placement that cannot be met fails when a call needs it.
            Err(SandboxError::Placement(why)) => {
                tracing::warn!(%why, "eager sandbox could not be placed");
                return Ok(None);
            }
        };
        Ok(match holding.acquired {
            Acquired::Held { .. } => None,
            Acquired::Waiting { position } => Some(sandbox_wait(run, &holding, position, now)),
        })
    }

    /// Holds the agent's sandbox and sends it the planned calls (or joins
    /// the queue for it), then waits for their answers.
    async fn dispatch(
        &self,
        mut run: Run,
        prev: Stamp,
        agent: &AgentDefinition,
        planned: &[ToolCallRecord],
        mut events: Vec<RunEventRecord>,
    ) -> Result<(), StepError> {
        let svc = &self.svc;
        let now = svc.clock.now_ms();
        let holding = match sandboxing::acquire(svc, &run.tenant, &run.run_id, agent).await {
            Ok(h) => h,
            Err(SandboxError::Store(e)) => return Err(e.into()),
            Err(SandboxError::Aborted(a)) => return Err(StepError::Aborted(a)),
            Err(SandboxError::Placement(why)) => {
                let error = RunError::new(codes::SANDBOX_UNAVAILABLE, why);
                let event = RunEvent::Failed { error };
                return self.finish(&mut run, prev, event, events).await;
            }
        };
        match holding.acquired {
            Acquired::Held { .. } => {
                let rec = &holding.record;
                for c in planned {
                    let inv = invocation(&run, agent, c, rec.generation);
                    let inv = self.with_program_env(agent, inv, &c.skill, rec).await?;
                    sandboxing::dispatch(svc, rec, &inv)
                        .await
                        .map_err(|e| StepError::Retry(e.to_string()))?;
                    self.svc
                        .faults
                        .at(FaultPoint::AfterSandboxDispatch, &run.run_id)
                        .await
                        .map_err(StepError::Aborted)?;
                    let ev =
                        record_dispatch(&mut run, &c.call_id, rec.generation, &rec.key(), now)?;
                    events.push(ev);
                }
            }
            Acquired::Waiting { position } => {
                events.push(sandbox_wait(&mut run, &holding, position, now));
            }
        }
        self.wait(run, prev, events).await
    }
}

/// The event of a Run queued behind the sandbox's holder.
fn sandbox_wait(
    run: &mut Run,
    holding: &sandboxing::Holding,
    position: usize,
    now: i64,
) -> RunEventRecord {
    let wait = LogEvent::SandboxWait {
        position: position as u64,
        holder_run_id: holding.record.holder_run_id.clone(),
    };
    run.push_event(wait, now)
}
