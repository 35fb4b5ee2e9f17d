//! One step's work: budgets and deadline, the model call, the requested
//! tool calls recorded, inline skills run, sandbox calls dispatched.

use super::*;

impl Harness {
    /// The claimed part of a step.
    pub(crate) async fn execute(&self, mut run: Run, now: i64) -> Result<(), StepError> {
        let svc = &self.svc;
        let mut prev = run.stamp();
        if run.past_deadline(now) {
            let err = RunError::new("TIMED_OUT", "the run exceeded its wall-clock budget");
            return self
                .finish(
                    &mut run,
                    prev,
                    RunEvent::DeadlineExceeded,
                    Some(err),
                    vec![],
                )
                .await;
        }
        let Some(agent) = self.agent_or_end(&mut run, prev).await? else {
            return Ok(());
        };
        let mut events = Vec::new();

        // Calls of this step still open: sandbox calls may be waiting (for
        // the sandbox, or for their answer); an inline call left DISPATCHED
        // means a previous worker died before committing its result.
        let pending: Vec<ToolCallRecord> = run
            .ledger
            .values()
            .filter(|r| r.step == run.step && !r.state.is_settled())
            .cloned()
            .collect();
        let fresh = pending.is_empty();
        if fresh {
            // `eager`: the sandbox is there before the first model call.
            if agent.sandbox.provisioning == Provisioning::Eager
                && run.sandbox_key.is_none()
                && agent.uses_sandbox()
            {
                run.sandbox_key = Some(sandbox_key(&run.tenant, &run.agent));
                svc.runs.save(prev, &run, &[], vec![]).await?;
                prev = run.stamp();
            }
            if let Some(wait) = self.eager_wait(&mut run, &agent, now).await? {
                events.push(wait);
                return self.wait(run, prev, events).await;
            }
            if run.usage.model_turns >= run.budgets.max_model_turns {
                let err = RunError::new(
                    "BUDGET_EXCEEDED",
                    format!(
                        "the run used its {} model turns",
                        run.budgets.max_model_turns
                    ),
                );
                return self
                    .finish(&mut run, prev, RunEvent::Failed, Some(err), vec![])
                    .await;
            }
            let input = match &run.input {
                Payload::Inline { text } => text.clone(),
                Payload::Stored { key, .. } => svc.payloads.get_text(key).await?,
            };
            let history = match &run.session_id {
                Some(sid) => svc.sessions.history(sid).await?,
                None => vec![],
            };
            let log = svc.runs.all_events(&run.run_id).await?;
            let transcript = transcript(&input, &log);
            let assembled = context::assemble(
                &agent.system_prompt,
                &history,
                &transcript,
                agent.model.context_window,
            );
            if let Some(c) = assembled.compaction {
                events.push(run.push_event(
                    "history_compacted",
                    json!({"dropped_turns": c.dropped_turns, "kept_turns": c.kept_turns}),
                    now,
                ));
            }
            let specs: Vec<_> = agent
                .skills
                .iter()
                .filter_map(|s| agent.manifest(s).map(|m| m.tool_spec()))
                .collect();
            let reply = match svc
                .models
                .complete_with_retry(
                    &agent.model,
                    &assembled.messages,
                    &specs,
                    svc.cfg.model_attempts,
                )
                .await
            {
                Ok((reply, attempts)) => {
                    if attempts > 1 {
                        events.push(run.push_event(
                            "model_retried",
                            json!({"attempts": attempts}),
                            now,
                        ));
                    }
                    reply
                }
                Err((e, attempts)) => {
                    let err = RunError::new(
                        "MODEL_ERROR",
                        format!("the model failed after {attempts} attempt(s): {e}"),
                    );
                    return self
                        .finish(&mut run, prev, RunEvent::Failed, Some(err), events)
                        .await;
                }
            };
            self.hooks
                .after_model_call(&run)
                .await
                .map_err(StepError::Aborted)?;
            let now = svc.clock.now_ms();
            run.usage.model_turns += 1;
            run.usage.input_tokens += reply.usage.input_tokens;
            run.usage.output_tokens += reply.usage.output_tokens;
            let (preview, truncated) = clip(&reply.content, EVENT_PREVIEW_BYTES);
            events.push(run.push_event(
                "model_reply",
                json!({"content": preview, "truncated": truncated, "tool_calls": reply.tool_calls}),
                now,
            ));
            if reply.tool_calls.is_empty() {
                return self.complete(&mut run, prev, events, &input, reply).await;
            }
            let total = run.usage.tool_calls as usize + reply.tool_calls.len();
            if total > run.budgets.max_tool_calls as usize {
                let err = RunError::new(
                    "BUDGET_EXCEEDED",
                    format!(
                        "the run would exceed its {} tool calls",
                        run.budgets.max_tool_calls
                    ),
                );
                return self
                    .finish(&mut run, prev, RunEvent::Failed, Some(err), events)
                    .await;
            }
            // Record every call before running any: inline calls as
            // dispatched, sandbox calls as planned (they are dispatched
            // once the sandbox is held).
            for c in &reply.tool_calls {
                let manifest = agent.manifest(&c.name);
                let in_sandbox = manifest.as_ref().is_some_and(|m| m.in_sandbox());
                if in_sandbox {
                    run.sandbox_key = Some(sandbox_key(&run.tenant, &run.agent));
                }
                run.ledger.insert(
                    c.id.clone(),
                    ToolCallRecord {
                        call_id: c.id.clone(),
                        skill: c.name.clone(),
                        args: c.args.clone(),
                        step: run.step,
                        state: if in_sandbox {
                            ToolCallState::Planned
                        } else {
                            ToolCallState::Dispatched
                        },
                        idempotent: manifest
                            .as_ref()
                            .is_some_and(|m| skills::call_is_idempotent(m, &c.args)),
                        result: None,
                        sandbox: in_sandbox,
                        attempt: 1,
                    },
                );
                events.push(run.push_event(
                    "tool_call",
                    json!({"call_id": c.id, "name": c.name, "args": c.args}),
                    now,
                ));
            }
            run.usage.tool_calls += reply.tool_calls.len() as u32;
            run.updated_at_ms = now;
            svc.runs.save(prev, &run, &events, vec![]).await?;
            prev = run.stamp();
            events.clear();
        }

        // Inline calls run here, in the step.
        let inline: Vec<ToolCallRecord> = run
            .ledger
            .values()
            .filter(|r| r.step == run.step && !r.sandbox && !r.state.is_settled())
            .cloned()
            .collect();
        let mut indeterminate = Vec::new();
        for rec in &inline {
            if !fresh && ledger::recover(rec) == Some(Recovery::Indeterminate) {
                indeterminate.push(rec.call_id.clone());
                if let Some(r) = run.ledger.get_mut(&rec.call_id) {
                    r.state = ToolCallState::Indeterminate;
                }
                events.push(run.push_event(
                    "tool_indeterminate",
                    json!({"call_id": rec.call_id, "name": rec.skill}),
                    now,
                ));
            }
        }
        if !indeterminate.is_empty() {
            let err = RunError::new(
                "TOOL_INDETERMINATE",
                format!(
                    "tool calls {} were dispatched but their results were lost; they are not idempotent, so they were not repeated",
                    indeterminate.join(", ")
                ),
            );
            return self
                .finish(&mut run, prev, RunEvent::Failed, Some(err), events)
                .await;
        }
        for rec in &inline {
            let call = ToolCall {
                id: rec.call_id.clone(),
                name: rec.skill.clone(),
                args: rec.args.clone(),
            };
            let outcome = svc.tools.execute(&agent, &call, svc.clock.now_ms()).await;
            let (state, result) = match outcome {
                Ok(v) => (ToolCallState::Done, v),
                Err(f) => (ToolCallState::Failed, f.to_json()),
            };
            if let Some(r) = run.ledger.get_mut(&rec.call_id) {
                r.state = state;
                r.result = Some(ledger_copy(&result));
            }
            events.push(run.push_event(
                "tool_result",
                json!({"call_id": rec.call_id, "name": rec.skill, "state": state, "result": event_result(&result)}),
                svc.clock.now_ms(),
            ));
        }
        self.hooks
            .after_tools_ran(&run)
            .await
            .map_err(StepError::Aborted)?;
        self.advance(run, prev, &agent, events).await
    }

    /// An `eager` agent holds its sandbox before its first model call; the
    /// event to record when the Run has to wait for it.
    pub(crate) async fn eager_wait(
        &self,
        run: &mut Run,
        agent: &AgentDefinition,
        now: i64,
    ) -> Result<Option<RunEventRecord>, StepError> {
        if agent.sandbox.provisioning != Provisioning::Eager || !agent.uses_sandbox() {
            return Ok(None);
        }
        let holding = match sandboxing::acquire(&self.svc, &run.tenant, &run.run_id, agent).await {
            Ok(h) => h,
            Err(SandboxError::Store(e)) => return Err(e.into()),
            // A placement that cannot be met fails when a call needs it.
            Err(SandboxError::Placement(why)) => {
                tracing::warn!(%why, "eager sandbox could not be placed");
                return Ok(None);
            }
        };
        Ok(match holding.acquired {
            Acquired::Held { .. } => None,
            Acquired::Waiting { position } => Some(run.push_event(
                "sandbox_wait",
                json!({"position": position, "holder_run_id": holding.record.holder_run_id}),
                now,
            )),
        })
    }

    /// After a step's inline calls and any sandbox outcome: dispatch the
    /// planned sandbox calls (when the sandbox is held), then either wait
    /// for their answers or go on to the next step.
    pub(crate) async fn advance(
        &self,
        mut run: Run,
        prev: Stamp,
        agent: &AgentDefinition,
        mut events: Vec<RunEventRecord>,
    ) -> Result<(), StepError> {
        let svc = &self.svc;
        let now = svc.clock.now_ms();
        let planned: Vec<ToolCallRecord> = run
            .ledger
            .values()
            .filter(|r| r.step == run.step && r.sandbox && r.state == ToolCallState::Planned)
            .cloned()
            .collect();
        if !planned.is_empty() {
            if agent.destructive() {
                // A read-write sub-path of the user's workspace: every call
                // needs a human's approval (seed 000 §F).
                events.push(run.push_event(
                    "approval_required",
                    json!({
                        "calls": planned.iter().map(|c| &c.call_id).collect::<Vec<_>>(),
                        "reason": "the agent's sandbox mounts a read-write sub-path of the user's workspace: its calls are destructive and need a human's approval",
                    }),
                    now,
                ));
                run.apply(&RunEvent::AwaitApproval, now)
                    .map_err(|e| StepError::Retry(e.to_string()))?;
                run.lease_until_ms = 0;
                svc.runs.save(prev, &run, &events, vec![]).await?;
                return self.check_later(&run).await;
            }
            let holding = match sandboxing::acquire(svc, &run.tenant, &run.run_id, agent).await {
                Ok(h) => h,
                Err(SandboxError::Store(e)) => return Err(e.into()),
                Err(SandboxError::Placement(why)) => {
                    let err = RunError::new(codes::SANDBOX_UNAVAILABLE, why);
                    let mut run = run;
                    return self
                        .finish(&mut run, prev, RunEvent::Failed, Some(err), events)
                        .await;
                }
            };
            match holding.acquired {
                Acquired::Held { .. } => {
                    let rec = &holding.record;
                    for c in &planned {
                        let inv = Invocation {
                            run_id: run.run_id.clone(),
                            tenant: run.tenant.clone(),
                            agent: run.agent.clone(),
                            generation: rec.generation,
                            step: run.step,
                            call_id: c.call_id.clone(),
                            attempt: c.attempt,
                            skill: executor(agent, &c.skill),
                            args: c.args.clone(),
                            timeout_s: call_timeout(agent, &c.skill),
                        };
                        sandboxing::dispatch(svc, rec, &inv)
                            .await
                            .map_err(|e| StepError::Retry(e.to_string()))?;
                        if let Some(r) = run.ledger.get_mut(&c.call_id) {
                            r.state = ToolCallState::Dispatched;
                            r.result = Some(json!({"generation": rec.generation}));
                        }
                        events.push(run.push_event(
                            "tool_dispatched",
                            json!({"call_id": c.call_id, "name": c.skill, "attempt": c.attempt, "sandbox": rec.key(), "generation": rec.generation}),
                            now,
                        ));
                    }
                }
                Acquired::Waiting { position } => {
                    events.push(run.push_event(
                        "sandbox_wait",
                        json!({"position": position, "holder_run_id": holding.record.holder_run_id}),
                        now,
                    ));
                }
            }
        }
        let open = run
            .ledger
            .values()
            .any(|r| r.step == run.step && !r.state.is_settled());
        if open {
            return self.wait(run, prev, events).await;
        }
        let actions = run
            .apply(&RunEvent::StepContinues, now)
            .map_err(|e| StepError::Retry(e.to_string()))?;
        run.step += 1;
        run.lease_until_ms = 0;
        svc.runs.save(prev, &run, &events, vec![]).await?;
        self.carry_out(&run, &actions).await
    }
}
