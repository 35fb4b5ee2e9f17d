//! One sandbox can act only for itself: an answer posted to the harness
//! queue for a Run's sandbox call is taken only when it is sealed with the
//! key of the sandbox generation the call was sent to. A task that escaped
//! its jail holds its own key only, so it cannot answer for another
//! identity's call. Its AWS credentials are its own too: assumed for its
//! generation (with the session policy `armada_domain`'s unit tests judge,
//! as the emulator does not enforce IAM) and renewed through the
//! dispatcher only for a request its own key sealed.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use armada_domain::messages::{DispatchMessage, HarnessMessage, ResultBody};
use armada_domain::sandbox::credentials::Renewal;
use armada_domain::sandbox::hand::CallOutcome;
use armada_domain::sandbox::seal::{answer_key, Answer};
use armada_tests::sandbox::*;
use armada_tests::{outcome, wait, EventKind, LogEvent, RunState, RunView};

/// The salt of the stack tenant's sandbox record of `agent` (in its
/// generations' keys), as the control plane reads it.
async fn salt_of(t: &armada_tests::TestStack, agent: &str) -> String {
    t.stack
        .svc
        .sandboxes
        .get(&t.stack.tenant, agent)
        .await
        .unwrap()
        .unwrap()
        .salt
}

/// A call the harness sent to a sandbox, as its answer names it.
struct DispatchedCall<'a> {
    run_id: &'a str,
    step: u32,
    call_id: &'a str,
    attempt: u32,
}

/// Posts an answer to `call` to the harness queue, as a task's
/// credentials can: finished with `stdout`, sealed with `key` for
/// `generation`, under the FIFO deduplication id `dedup`.
async fn post_answer(
    t: &armada_tests::TestStack,
    call: &DispatchedCall<'_>,
    stdout: &str,
    key: &str,
    generation: u64,
    dedup: &str,
) {
    let body = ResultBody::Inline {
        outcome: CallOutcome::Finished {
            result: json!({"exit_code": 0, "stdout": stdout, "stderr": ""}),
        },
    };
    let answer = Answer {
        run_id: call.run_id,
        tenant: &t.stack.tenant,
        step: call.step,
        call_id: call.call_id,
        attempt: call.attempt,
        body: &body,
    };
    let msg = HarnessMessage::ToolResult {
        run_id: call.run_id.to_string(),
        tenant: t.stack.tenant.clone(),
        step: call.step,
        call_id: call.call_id.to_string(),
        attempt: call.attempt,
        seal: Some(answer.seal(key, generation)),
        body,
    };
    t.stack
        .aws
        .sqs
        .send_message()
        .queue_url(t.stack.svc.queues.harness_url())
        .message_body(serde_json::to_string(&msg).unwrap())
        .message_group_id(call.run_id)
        .message_deduplication_id(dedup)
        .send()
        .await
        .unwrap();
}

/// The dispatched call of a Run that waits on its sandbox.
async fn dispatched(t: &armada_tests::TestStack, run_id: &str) -> (u32, String, u32, u64) {
    let what = format!("run {run_id} to wait on a dispatched call");
    wait::until(&what, wait::PATIENCE, || async {
        let run = t.client.run(run_id).await.unwrap();
        if run.state != RunState::AwaitingTool {
            return None;
        }
        match t.event(run_id, EventKind::ToolDispatched).await? {
            LogEvent::ToolDispatched {
                call_id,
                attempt,
                generation,
                ..
            } => Some((run.step, call_id, attempt, generation)),
            _ => None,
        }
    })
    .await
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
    let salt = salt_of(&t, "coder").await;
    let other = answer_key(&secret, "another-tenant", "coder", generation, &salt);
    let real_key = answer_key(&secret, &t.stack.tenant, "coder", generation, &salt);
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
    // The right key over a stored answer the identity could not have
    // written: an object outside its own prefix (another Run's payload).
    let elsewhere = "payloads/someone-else/input.json";
    let text = serde_json::to_string(&CallOutcome::Finished {
        result: json!({"stdout": "read from elsewhere\n"}),
    })
    .unwrap();
    t.stack
        .aws
        .s3
        .put_object()
        .bucket(&t.stack.svc.cfg.payload_bucket)
        .key(elsewhere)
        .body(text.clone().into_bytes().into())
        .send()
        .await
        .unwrap();
    let outside = ResultBody::Stored {
        key: elsewhere.into(),
        sha256: armada_domain::crypto::sha256_hex(text.as_bytes()),
    };
    let seal_outside = Answer {
        body: &outside,
        ..answer
    }
    .seal(&real_key, generation);
    for (i, (body, seal)) in [
        (&forged, Some(answer.seal(&other, generation))),
        (&forged, None),
        (&forged, Some(seal_of_other_body)),
        (&outside, Some(seal_outside)),
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
            body: body.clone(),
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
    let run: RunView = t
        .client
        .wait_run(&run_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert_eq!(
        tool_result(&run, "shell_exec")["stdout"],
        "real\n",
        "{run:?}"
    );
    assert_eq!(
        t.stack.svc.counters.forged_drops.load(Ordering::Relaxed),
        4,
        "every forgery was refused"
    );
    t.stack.stop().await;
}

/// The sandbox record's credentials as its agent last reported them.
async fn held_key(t: &armada_tests::TestStack) -> Option<String> {
    let rec = sandbox_of(&t.client, "coder").await;
    rec.credentials.map(|c| c.access_key_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_signs_with_credentials_of_its_own_which_only_its_key_renews() {
    let env = vec![(
        "ARMADA_SANDBOX_RENEW_AFTER_SECONDS".to_string(),
        "3".to_string(),
    )];
    let t = armada_tests::TestStack::start_full(fast(), None, env).await;
    let first: RunView = ask_as(&t.client, "coder", &sh("echo one")).await;
    assert_eq!(outcome(&first), "COMPLETED", "{first:?}");
    // The task was handed credentials assumed for it (and no others), in
    // its bootstrap file: its overrides, which any reader of ECS sees,
    // hold no secret, only the file's name.
    let arns = tasks_of(&t, &t.stack.tenant, "coder").await;
    let task = describe_task(&t, &arns[0]).await;
    let container = &task.overrides().unwrap().container_overrides()[0];
    let mut env: std::collections::HashMap<String, String> = container
        .environment()
        .iter()
        .map(|kv| {
            (
                kv.name().unwrap().to_string(),
                kv.value().unwrap().to_string(),
            )
        })
        .collect();
    for secret in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "ARMADA_SANDBOX_ANSWER_KEY",
    ] {
        assert!(
            !env.contains_key(secret),
            "{secret} in the task's overrides"
        );
    }
    let file = container.environment_files()[0].value().to_string();
    let key = file.split_once(":::").unwrap().1.split_once('/').unwrap().1;
    assert!(key.starts_with("bootstrap/"), "{file}");
    let text = t
        .stack
        .aws
        .s3
        .get_object()
        .bucket(&t.stack.svc.cfg.payload_bucket)
        .key(key)
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes();
    env.extend(armada_core::adapters::ecs::parse_env_file(
        &String::from_utf8_lossy(&text),
    ));
    assert!(env.contains_key("ARMADA_SANDBOX_ANSWER_KEY"));
    let given = env["AWS_ACCESS_KEY_ID"].clone();
    assert!(given.starts_with("ASIA"), "temporary credentials: {given}");
    assert!(!env["AWS_SESSION_TOKEN"].is_empty());
    assert!(
        env["ARMADA_SANDBOX_CREDENTIALS_EXPIRE_MS"]
            .parse::<i64>()
            .unwrap()
            > 0
    );
    assert!(env.contains_key("ARMADA_DISPATCH_QUEUE_URL"));
    // The agent asks for new ones (after 3 s here, 20 min in AWS); the
    // dispatcher sends them to its hand queue; it signs with them after.
    eventually("the agent holds renewed credentials", || async {
        held_key(&t)
            .await
            .is_some_and(|k| k != given && k.starts_with("ASIA"))
    })
    .await;
    let second: RunView = ask_as(&t.client, "coder", &sh("echo two")).await;
    assert_eq!(outcome(&second), "COMPLETED", "{second:?}");
    assert_eq!(tool_result(&second, "shell_exec")["stdout"], "two\n");

    // A request nobody's key sealed, or sealed by another identity's key,
    // gets nothing: the dispatcher counts it and sends no credentials.
    let generation = sandbox_of(&t.client, "coder").await.generation;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let secret = t.stack.svc.cfg.callback_signing_secret.clone();
    let salt = salt_of(&t, "coder").await;
    let other_key = answer_key(&secret, "another-tenant", "coder", generation, &salt);
    let req = Renewal {
        tenant: &t.stack.tenant,
        agent: "coder",
        generation,
        requested_at_ms: now,
    };
    let counted = &t.stack.dispatcher_svc.counters.forged_drops;
    let before = counted.load(Ordering::Relaxed);
    for seal in [req.seal(&other_key), "0".repeat(64)] {
        let msg = DispatchMessage::RenewCredentials {
            tenant: t.stack.tenant.clone(),
            agent: "coder".into(),
            generation,
            requested_at_ms: now,
            seal,
        };
        t.stack
            .aws
            .sqs
            .send_message()
            .queue_url(t.stack.svc.queues.dispatch_url())
            .message_body(serde_json::to_string(&msg).unwrap())
            .send()
            .await
            .unwrap();
    }
    eventually("both forged renewals are refused", || async {
        counted.load(Ordering::Relaxed) >= before + 2
    })
    .await;

    // The generation's secrets go with its sandbox.
    destroy_sandbox(&t, &t.stack.tenant, "coder").await;
    let bucket = t.stack.svc.cfg.payload_bucket.clone();
    let listed = t
        .stack
        .aws
        .s3
        .list_objects_v2()
        .bucket(&bucket)
        .prefix("bootstrap/")
        .send()
        .await
        .unwrap();
    assert!(
        listed.contents().is_empty(),
        "left: {:?}",
        listed
            .contents()
            .iter()
            .map(|o| o.key())
            .collect::<Vec<_>>()
    );
    t.stack.stop().await;
}

/// A task's credentials reach its own record, and there only what its
/// session policy names: its report and the version
/// (`armada_domain::sandbox::access::REPORT_ATTRIBUTES`; the emulator does
/// not enforce IAM, so this test writes exactly that). Written as an
/// escaped task would — naming another tenant's sandbox, its generation,
/// task and hand queue, and saying its own sandbox is being destroyed —
/// it harms only itself: the watchdog answers its call and destroys its
/// own sandbox, while the other tenant's stays READY at its generation
/// and serves its next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_writing_its_own_record_reaches_no_other_identity() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let t = start().await;
    let acme = tenant_client(&t, "acme").await;
    let first = ask_as(&acme, "coder", &sh("echo victim")).await;
    assert_eq!(outcome(&first), "COMPLETED", "{first:?}");
    let victim = sandbox_of(&acme, "coder").await;
    assert_eq!(victim.state, SandboxState::Ready, "{victim:?}");
    let victim_task = tasks_of(&t, "acme", "coder").await;

    // The attacker's sandbox, busy with a call.
    let run_id = t
        .client
        .create_run("coder", &sh("sleep 30; echo late"))
        .await
        .unwrap();
    let (_, call_id, _, _) = dispatched(&t, &run_id).await;
    eventually("the attacker's call runs", || async {
        sandbox_of(&t.client, "coder").await.state == SandboxState::Ready
            && matches!(
                t.event(&run_id, EventKind::ToolDispatched).await,
                Some(LogEvent::ToolDispatched { call_id: sent, .. }) if sent == call_id
            )
    })
    .await;
    let table = t.stack.svc.cfg.sandboxes_table.clone();
    let key = format!("{}#coder", t.stack.tenant);
    let item = t
        .stack
        .aws
        .dynamo
        .get_item()
        .table_name(&table)
        .key("sandbox_key", AttributeValue::S(key.clone()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item()
        .cloned()
        .unwrap();
    let version: u64 = item["version"].as_n().unwrap().parse().unwrap();
    let forged = json!({
        "state": "DESTROYING", "state_changed_at_ms": 1, "failure": "forged",
        "tenant": "acme", "agent": "coder",
        "generation": victim.generation + 1,
        "task_arn": victim_task[0], "hand_queue_url": "https://forged/acme-hand.fifo",
        "holder_run_id": run_id, "waiters": [],
    });
    t.stack
        .aws
        .dynamo
        .update_item()
        .table_name(&table)
        .key("sandbox_key", AttributeValue::S(key))
        .update_expression("SET report = :r, version = :nv")
        .condition_expression("version = :v")
        .expression_attribute_values(":r", AttributeValue::S(forged.to_string()))
        .expression_attribute_values(":nv", AttributeValue::N((version + 1).to_string()))
        .expression_attribute_values(":v", AttributeValue::N(version.to_string()))
        .send()
        .await
        .unwrap();

    // The control plane took it as the attacker's own sandbox going: its
    // Run's call is answered for and the Run ends.
    let ended = t
        .client
        .wait_run(&run_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_ne!(outcome(&ended), "COMPLETED", "{ended:?}");
    let own = sandbox_of(&t.client, "coder").await;
    assert_eq!(own.tenant, t.stack.tenant.as_str(), "{own:?}");

    // The other tenant's sandbox is as it was, and works.
    let after = sandbox_of(&acme, "coder").await;
    assert_eq!(after.state, SandboxState::Ready, "{after:?}");
    assert_eq!(after.generation, victim.generation, "{after:?}");
    assert_eq!(task_status(&t, &victim_task[0]).await, "RUNNING");
    let next = ask_as(&acme, "coder", &sh("echo still")).await;
    assert_eq!(outcome(&next), "COMPLETED", "{next:?}");
    assert_eq!(tool_result(&next, "shell_exec")["stdout"], "still\n");
    assert_eq!(
        sandbox_of(&acme, "coder").await.generation,
        victim.generation
    );
}

/// A sandbox learns its Runs' ids and steps, and its credentials may send
/// to the harness queue with any deduplication id. Its (sealed, genuine)
/// answer sent with the id of its Run's next step (`<run>-step-<n+1>`),
/// which the control plane sends while that answer is being handled, once
/// made SQS drop the step as a duplicate and the Run stall. The control
/// plane's ids are keyed now: the step goes out and the Run completes.
/// (The emulator forgets an id once its message is deleted, where SQS
/// keeps it five minutes; an answer still in flight shows it here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_cannot_squat_the_next_step_of_its_run() {
    let t = start().await;
    let run_id = t
        .client
        .create_run("coder", &sh("sleep 20; echo late"))
        .await
        .unwrap();
    let (step, call_id, attempt, generation) = dispatched(&t, &run_id).await;
    let secret = t.stack.svc.cfg.callback_signing_secret.clone();
    let key = answer_key(
        &secret,
        &t.stack.tenant,
        "coder",
        generation,
        &salt_of(&t, "coder").await,
    );
    let call = DispatchedCall {
        run_id: &run_id,
        step,
        call_id: &call_id,
        attempt,
    };
    let dedup = format!("{run_id}-step-{}", step + 1);
    post_answer(&t, &call, "early\n", &key, generation, &dedup).await;
    let run = t
        .client
        .wait_run(&run_id, Duration::from_secs(15))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert_eq!(tool_result(&run, "shell_exec")["stdout"], "early\n");
}

/// Deleting an agent deletes its sandbox records, so its identity starts
/// again at generation 1. The record's salt makes that generation 1 a new
/// one: its hand queue has another name, and an answer sealed with the
/// key the old generation 1's task held is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recreated_identitys_generation_one_is_not_the_old_one() {
    let t = start().await;
    put_agent(&t, "twice", json!({})).await;
    let first = ask_as(&t.client, "twice", &sh("echo one")).await;
    assert_eq!(outcome(&first), "COMPLETED", "{first:?}");
    let old = t
        .stack
        .svc
        .sandboxes
        .get(&t.stack.tenant, "twice")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(old.generation, 1);
    t.admin
        .call(reqwest::Method::DELETE, "/v1/agents/twice", None, true)
        .await
        .unwrap();
    put_agent(&t, "twice", json!({})).await;
    let run_id = t
        .client
        .create_run("twice", &sh("sleep 3; echo new"))
        .await
        .unwrap();
    let (step, call_id, attempt, generation) = dispatched(&t, &run_id).await;
    assert_eq!(generation, 1, "a new record starts at generation 1 again");
    let new = salt_of(&t, "twice").await;
    assert_ne!(new, old.salt);
    let now_queue = t
        .stack
        .svc
        .sandboxes
        .get(&t.stack.tenant, "twice")
        .await
        .unwrap()
        .unwrap()
        .hand_queue_url;
    assert_ne!(now_queue, old.hand_queue_url);
    let secret = t.stack.svc.cfg.callback_signing_secret.clone();
    let old_key = answer_key(&secret, &t.stack.tenant, "twice", 1, &old.salt);
    let counted = &t.stack.svc.counters.forged_drops;
    let before = counted.load(Ordering::Relaxed);
    let call = DispatchedCall {
        run_id: &run_id,
        step,
        call_id: &call_id,
        attempt,
    };
    let dedup = format!("old-generation-{run_id}-{call_id}");
    post_answer(&t, &call, "old\n", &old_key, 1, &dedup).await;
    eventually("the old generation's answer is refused", || async {
        counted.load(Ordering::Relaxed) > before
    })
    .await;
    let run = t
        .client
        .wait_run(&run_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        tool_result(&run, "shell_exec")["stdout"],
        "new\n",
        "{run:?}"
    );
}
