//! A sandbox's answer to a dispatched call: judged against the ledger,
//! the Run claimed for it, and the answer handed to [`decide`]
//! (done, failed, lost and redone or indeterminate, never started and
//! re-sent), whose decision the step then carries out. An answer must be
//! sealed by the generation the call was sent to
//! (`armada_domain::sandbox::seal`): one sandbox cannot answer for another.

use crate::Harness;
use crate::StepError;
use armada_core::ports::Bounded;
use armada_domain::crypto::{digest_eq, sha256_hex};
use armada_domain::messages::ResultBody;
use armada_domain::run::RunState;
use armada_domain::sandbox::access::object_prefix;
use armada_domain::sandbox::hand::codes;
use armada_domain::sandbox::hand::{CallOutcome, MAX_STORED_OUTCOME_BYTES};
use armada_domain::sandbox::seal::{answer_key, Answer, Seal};
use armada_domain::step::StepInput;
use std::sync::atomic::Ordering;

impl Harness {
    /// A sandbox call's outcome arrived.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn tool_result(
        &self,
        run_id: &str,
        tenant: &str,
        step: u32,
        call_id: &str,
        attempt: u32,
        body: ResultBody,
        seal: Option<Seal>,
    ) -> Result<(), StepError> {
        let svc = &self.svc;
        // Judge the answer against the ledger before claiming anything.
        let Some(current) = self.read(run_id).await? else {
            return Ok(());
        };
        let open = current
            .ledger
            .get(call_id)
            .filter(|r| r.sandbox && !r.state().is_settled() && r.step == step);
        if let Some(r) = open.filter(|r| attempt > r.attempt && !current.state().is_terminal()) {
            // Ahead of the ledger: a step sends a call's next attempt
            // before it commits the retry and the dispatch, and the
            // sandbox answered first. The answer waits for the commit (or
            // for the step carried out again, after its worker died)
            // rather than being taken for an old attempt and lost.
            let now = svc.clock.now_ms();
            let left_s = (current.lease_until_ms - now + 999) / 1000;
            let until_s = if current.state() == RunState::Executing && left_s > 0 {
                left_s as u32
            } else {
                svc.cfg.crash_return_s
            };
            return Err(StepError::Busy {
                reason: format!(
                    "the answer to attempt {attempt} of {call_id} came before the ledger's attempt {} moved on",
                    r.attempt
                ),
                until_s,
            });
        }
        let record = open.filter(|r| r.attempt == attempt);
        let Some(record) = record.filter(|_| !current.state().is_terminal()) else {
            self.svc
                .counters
                .stale_drops
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(run_id, call_id, attempt, state = %current.state(), "outcome for a settled call, an old attempt or an ended run dropped");
            // Taken by a worker that died before its step's follow-up:
            // this repeat sends it, as a repeated step message does. (A
            // Run waiting again waits for another answer: nothing to send.)
            if current.state().is_waiting() {
                return Ok(());
            }
            return self
                .resend_followup(&current, self.svc.clock.now_ms())
                .await;
        };
        // Only the generation the call went to (or the platform speaking
        // for it) can seal its answer; the key comes from the Run's own
        // tenant and agent, never from the message.
        // The sandbox record's salt is in the key (a deleted identity's
        // new generation 1 has another); no record, no key that holds.
        let sandbox = svc.sandboxes.get(&current.tenant, &current.agent).await?;
        // A call whose dispatch is not committed yet (still planned) went
        // to the generation the sandbox has now.
        let generation = record
            .generation
            .or(sandbox.as_ref().map(|r| r.generation))
            .unwrap_or_default();
        let salt = sandbox.map(|r| r.salt).unwrap_or_default();
        let key = answer_key(
            &svc.cfg.callback_signing_secret,
            &current.tenant,
            &current.agent,
            generation,
            &salt,
        );
        let answer = Answer {
            run_id,
            tenant,
            step,
            call_id,
            attempt,
            body: &body,
        };
        let sealed = seal
            .as_ref()
            .is_some_and(|s| s.generation == generation && answer.sealed_by(s, &key));
        if !sealed || tenant != current.tenant {
            svc.counters.forged_drops.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                security = true,
                run_id,
                call_id,
                attempt,
                generation,
                "an answer not sealed by the call's own sandbox was refused"
            );
            return Ok(());
        }
        let outcome = match body {
            ResultBody::Inline { outcome } => outcome,
            ResultBody::Stored { key, sha256 } => {
                // Only from where the identity's own credentials can write.
                let own = object_prefix(&current.tenant, &current.agent);
                if !key.starts_with(&own) || key.contains("..") {
                    svc.counters.forged_drops.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(security = true, run_id, call_id, %key, "a stored answer outside its sandbox's own prefix was refused");
                    return Ok(());
                }
                match svc
                    .payloads
                    .get_text_bounded(&key, MAX_STORED_OUTCOME_BYTES)
                    .await?
                {
                    Bounded::Text(text) => {
                        if !digest_eq(&sha256_hex(text.as_bytes()), &sha256) {
                            svc.counters.forged_drops.fetch_add(1, Ordering::Relaxed);
                            tracing::error!(security = true, run_id, call_id, %key, "a stored answer changed after it was sealed was refused");
                            return Ok(());
                        }
                        serde_json::from_str(&text)
                            .map_err(|e| StepError::Retry(format!("stored outcome {key}: {e}")))?
                    }
                    // The call ran (its effects stand); only its answer is
                    // refused, as a failed result the Run reads and goes on
                    // from. Its digest is not checked: it was never read.
                    Bounded::TooLarge { bytes } => {
                        tracing::warn!(run_id, call_id, %key, bytes, "a stored outcome over the bound was not read");
                        CallOutcome::error(
                            codes::RESULT_TOO_LARGE,
                            format!(
                                "the call's result is {bytes} bytes, over the limit of {MAX_STORED_OUTCOME_BYTES}; ask for less output (write it to a file and read parts of it)"
                            ),
                        )
                    }
                }
            }
        };
        // The answer belongs to the Run as just read: claim that version.
        let input = StepInput::SandboxAnswered { call_id, outcome };
        self.claim_and_decide(current, tenant, step, input).await
    }
}
