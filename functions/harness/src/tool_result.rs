//! A sandbox's answer to a dispatched call: judged against the ledger,
//! the Run claimed for it, and the answer handed to [`decide`]
//! (done, failed, lost and redone or indeterminate, never started and
//! re-sent), whose decision the step then carries out.

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
        let input = StepInput::SandboxAnswered { call_id, outcome };
        self.claim_and_decide(current, tenant, step, input).await
    }
}
