//! One sandbox can act only for itself: an answer posted to the harness
//! queue for a Run's sandbox call is taken only when it is sealed with the
//! key of the sandbox generation the call was sent to. A task that escaped
//! its jail holds its own key only, so it cannot answer for another
//! identity's call (the IAM side, one task role, is the README's to tell).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};

use armada_domain::messages::{HarnessMessage, ResultBody};
use armada_domain::sandbox::hand::CallOutcome;
use armada_domain::sandbox::seal::{answer_key, Answer};
use armada_tests::outcome;
use armada_tests::sandbox::*;

/// The dispatched call of a Run that waits on its sandbox.
async fn dispatched(t: &armada_tests::TestStack, run_id: &str) -> (u32, String, u32, u64) {
    for _ in 0..300 {
        let run = t.client.get(&format!("/v1/runs/{run_id}")).await.unwrap();
        let sent = t.event(run_id, "tool_dispatched").await;
        if let (Some(e), "AWAITING_TOOL") = (sent, run["state"].as_str().unwrap_or_default()) {
            return (
                run["step"].as_u64().unwrap() as u32,
                e["call_id"].as_str().unwrap().to_string(),
                e["attempt"].as_u64().unwrap() as u32,
                e["generation"].as_u64().unwrap(),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("run {run_id} never waited on a dispatched call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_not_sealed_by_the_calls_own_sandbox_is_refused() {
    let t = start().await;
    let run_id = t
        .client
        .create_run("coder", &sh("sleep 4; echo real"))
        .await
        .unwrap();
    let (step, call_id, attempt, generation) = dispatched(&t, &run_id).await;
    let secret = t.stack.svc.cfg.callback_signing_secret.clone();
    let forged = ResultBody::Inline {
        outcome: CallOutcome::Finished {
            result: json!({"exit_code": 0, "stdout": "forged\n", "stderr": ""}),
        },
    };
    let answer = Answer {
        run_id: &run_id,
        tenant: &t.stack.tenant,
        step,
        call_id: &call_id,
        attempt,
        body: &forged,
    };
    // Another identity's sandbox (its own key, even of the same generation
    // number), one with no seal, and a right key over another answer.
    let other = answer_key(&secret, "another-tenant", "coder", generation);
    let real_key = answer_key(&secret, &t.stack.tenant, "coder", generation);
    let tampered = ResultBody::Inline {
        outcome: CallOutcome::Finished {
            result: json!({"stdout": "something else"}),
        },
    };
    let seal_of_other_body = Answer {
        body: &tampered,
        ..answer
    }
    .seal(&real_key, generation);
    for (i, seal) in [
        Some(answer.seal(&other, generation)),
        None,
        Some(seal_of_other_body),
    ]
    .into_iter()
    .enumerate()
    {
        let msg = HarnessMessage::ToolResult {
            run_id: run_id.clone(),
            tenant: t.stack.tenant.clone(),
            step,
            call_id: call_id.clone(),
            attempt,
            body: forged.clone(),
            seal,
        };
        // Each forgery in its own FIFO deduplication slot.
        t.stack
            .aws
            .sqs
            .send_message()
            .queue_url(t.stack.svc.queues.harness_url())
            .message_body(serde_json::to_string(&msg).unwrap())
            .message_group_id(&run_id)
            .message_deduplication_id(format!("forged-{i}-{}", msg.dedup_id()))
            .send()
            .await
            .unwrap();
    }
    let run: Value = t
        .client
        .wait_run(&run_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run}");
    assert_eq!(tool_result(&run, "shell_exec")["stdout"], "real\n", "{run}");
    assert_eq!(
        t.stack.svc.counters.forged_drops.load(Ordering::Relaxed),
        3,
        "every forgery was refused"
    );
    t.stack.stop().await;
}
