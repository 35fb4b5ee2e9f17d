//! A sandbox's answer to a dispatched call: the Run claimed for it, the
//! outcome applied to the call's ledger record (done, failed, lost and
//! redone or indeterminate, never started and re-sent).

use super::*;

impl Harness {
    /// A sandbox call's outcome arrived.
    pub(crate) async fn tool_result(
        &self,
        run_id: &str,
        tenant: &str,
        step: u32,
        call_id: &str,
        attempt: u32,
        body: ResultBody,
    ) -> Result<(), StepError> {
        let svc = &self.svc;
        let outcome = match body {
            ResultBody::Inline { outcome } => outcome,
            ResultBody::Stored { key } => {
                let text = svc.payloads.get_text(&key).await?;
                serde_json::from_str(&text)
                    .map_err(|e| StepError::Retry(format!("stored outcome {key}: {e}")))?
            }
        };
        // Judge the answer against the ledger before claiming anything.
        let Some(current) = self.read(run_id).await? else {
            return Ok(());
        };
        let fresh = current.ledger.get(call_id).is_some_and(|r| {
            r.sandbox && !r.state.is_settled() && r.attempt == attempt && r.step == step
        });
        if !fresh || current.state.is_terminal() {
            self.svc
                .counters
                .stale_drops
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(run_id, call_id, attempt, state = %current.state, "outcome for a settled call, an old attempt or an ended run dropped");
            return Ok(());
        }
        // The answer belongs to the Run as just read: claim that version.
        let Some((mut run, now)) = self.claim(current, tenant, step).await? else {
            return Ok(());
        };
        let epoch = run.epoch;
        let result = async {
            let prev = run.stamp();
            let Some(agent) = self.agent_or_end(&mut run, prev).await? else {
                return Ok(());
            };
            let mut events = Vec::new();
            if let Some(err) = self.apply_outcome(&mut run, call_id, outcome, &mut events, now) {
                return self
                    .finish(&mut run, prev, RunEvent::Failed, Some(err), events)
                    .await;
            }
            self.advance(run, prev, &agent, events).await
        }
        .await;
        self.give_back(run_id, epoch, &result).await;
        result
    }

    /// Records a sandbox call's outcome in the ledger. Returns the error
    /// that ends the Run, if the outcome ends it.
    pub(crate) fn apply_outcome(
        &self,
        run: &mut Run,
        call_id: &str,
        outcome: CallOutcome,
        events: &mut Vec<RunEventRecord>,
        now: i64,
    ) -> Option<RunError> {
        let rec = run.ledger.get(call_id)?.clone();
        let (state, result, ends_run) = match outcome {
            CallOutcome::Finished { result } => {
                let state = if result.get("error").is_some() {
                    ToolCallState::Failed
                } else {
                    ToolCallState::Done
                };
                (state, result, None)
            }
            CallOutcome::NotRun { code, message } => {
                if code == SANDBOX_LOST && rec.attempt < MAX_SANDBOX_ATTEMPTS {
                    // It never ran: safe to send again, to a new sandbox.
                    plan_again(run, &rec, &message, events, now);
                    return None;
                }
                let ends = match code.as_str() {
                    SANDBOX_LOST | codes::SANDBOX_UNAVAILABLE => Some(RunError::new(
                        codes::SANDBOX_UNAVAILABLE,
                        format!("tool call {call_id} could not run: {message}"),
                    )),
                    SECURITY_VIOLATION => {
                        events.push(run.push_event(
                            "security_violation",
                            json!({"call_id": call_id, "message": message}),
                            now,
                        ));
                        Some(RunError::new(SECURITY_VIOLATION, message.clone()))
                    }
                    _ => None,
                };
                (ToolCallState::Failed, error_json(&code, message), ends)
            }
            CallOutcome::Lost { reason } => {
                if ledger::recover(&rec) == Some(Recovery::Redo) {
                    plan_again(run, &rec, &reason, events, now);
                    return None;
                }
                if let Some(r) = run.ledger.get_mut(call_id) {
                    r.state = ToolCallState::Indeterminate;
                }
                events.push(run.push_event(
                    "tool_indeterminate",
                    json!({"call_id": call_id, "name": rec.skill, "reason": reason}),
                    now,
                ));
                return Some(RunError::new(
                    "TOOL_INDETERMINATE",
                    format!(
                        "tool call {call_id} was dispatched but its sandbox was lost ({reason}); it is not idempotent, so it was not repeated"
                    ),
                ));
            }
        };
        if let Some(r) = run.ledger.get_mut(call_id) {
            r.state = state;
            r.result = Some(ledger_copy(&result));
        }
        events.push(run.push_event(
            "tool_result",
            json!({"call_id": call_id, "name": rec.skill, "state": state, "result": event_result(&result)}),
            now,
        ));
        ends_run
    }
}
