//! Approvals end to end on the in-memory ports: the links sent (and sent
//! again with a fresh token when the mail provider fails), a decision
//! applied once however often it is announced, a decision held back while
//! a step is in flight, the watchdog expiring an overdue approval and
//! sending links never sent, and a cancelled Run's approvals cancelled.

use armada_core::memory::fixtures::sqs_event;
use armada_domain::agent::AgentDefinition;
use armada_domain::approval::{Approval, ApprovalEvent, ApprovalState, Decider, Verdict};
use armada_domain::machine::Machine;
use armada_domain::skills::{builtin, Risk, CURRENT_TIME};
use serde_json::json;

use super::test_stack::{Stack, TENANT};
use super::*;
use armada_domain::messages::HarnessMessage;
use armada_domain::run::RunState;

/// A stack with agent `ops`, whose skill `launch` (it tells the time) is
/// high-risk, approved by ops@example.com within `expires_s`.
async fn stack(expires_s: u64) -> Stack {
    stack_with(json!({"approvers": ["ops@example.com"], "expires_s": expires_s})).await
}

/// The same stack, with the agent's `approvals` block `approvals`.
async fn stack_with(approvals: serde_json::Value) -> Stack {
    stack_on(Stack::new(), approvals).await
}

/// Agent `ops` on stack `s`, with the `approvals` block `approvals`.
async fn stack_on(s: Stack, approvals: serde_json::Value) -> Stack {
    let mut def = AgentDefinition::from_json(
        "ops",
        &json!({
            "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
            "system_prompt": "You launch.",
            "skills": ["launch"],
            "approvals": approvals
        }),
    )
    .expect("agent");
    let mut launch = builtin(CURRENT_TIME).expect("built-in");
    launch.name = "launch".into();
    launch.risk = Risk::High;
    launch.executor = Some(CURRENT_TIME.into());
    def.manifests.insert("launch".into(), launch);
    s.svc.registry.put_agent(&def).await.expect("stored");
    s
}

fn approvals(s: &Stack) -> Vec<Approval> {
    s.mem.state().approvals.values().cloned().collect()
}

fn decided(s: &Stack, a: &Approval, verdict: Verdict) -> HarnessMessage {
    let mut next = a.clone();
    let decide = ApprovalEvent::Decide {
        verdict,
        by: Decider::Key {
            key_id: "k_boss".into(),
        },
        from: None,
        comment: None,
    };
    next.apply(decide, s.svc.clock.now_ms()).expect("decidable");
    s.mem
        .state()
        .approvals
        .insert(next.approval_id.clone(), next.clone());
    HarnessMessage::ApprovalDecided {
        run_id: a.run_id.clone(),
        tenant: a.tenant.clone(),
        approval_id: a.approval_id.clone(),
    }
}

fn check(run: &Run) -> DispatchMessage {
    DispatchMessage::CheckRun {
        run_id: run.run_id.clone(),
        tenant: run.tenant.clone(),
        step: run.step,
        epoch: run.epoch,
        n: 0,
    }
}

#[tokio::test]
async fn links_are_sent_again_with_a_fresh_token_and_a_decision_applies_once() {
    let s = stack(3600).await;
    s.mem.state().mail_failures = 1;
    let run = s.start("ops", "/tool launch {}", None).await;
    // Start, step, park; the link's first send fails (set aside here, as
    // SQS would keep it for its retry).
    s.to_harness(&s.mem.take_harness()[0]).await;
    let notices: Vec<DispatchMessage> = s
        .mem
        .take_dispatch()
        .into_iter()
        .filter(|m| matches!(m, DispatchMessage::NotifyApproval { .. }))
        .collect();
    assert_eq!(notices.len(), 1);
    assert_eq!(s.run(&run.run_id).state(), RunState::AwaitingHitl);
    assert_eq!(s.to_dispatcher(&notices[0]).await, 1, "retried");
    let first = approvals(&s)[0].tokens.clone();
    assert_eq!(first.len(), 1, "the failed send's token is stored, hashed");
    assert_eq!(s.to_dispatcher(&notices[0]).await, 0);
    let a = approvals(&s).remove(0);
    assert_ne!(a.tokens[0].sha256, first[0].sha256, "a fresh link");
    let mails = s.mem.state().mails.clone();
    assert_eq!(mails.len(), 1);
    let (to, subject, text) = &mails[0];
    assert_eq!(to, "ops@example.com");
    assert!(subject.contains("ops wants to run launch"), "{subject}");
    let token = text
        .split("token=")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .expect("a link in the mail");
    assert_eq!(a.token_recipient(token), Some("ops@example.com"));

    // Decided, announced twice: one effect.
    let msg = decided(&s, &a, Verdict::Approve);
    s.to_harness(&msg).await;
    s.to_harness(&msg).await;
    s.pump().await;
    let done = s.run(&run.run_id);
    assert!(done.state().is_terminal(), "{:?}", done.state());
    let out = s.output(&run.run_id);
    assert!(out.contains("now"), "{out}");
    let results = s
        .kinds(&run.run_id)
        .iter()
        .filter(|k| *k == "tool_result")
        .count();
    assert_eq!(results, 1);
}

/// The Run's decision taken note of once, and its call run once.
fn assert_applied_once(s: &Stack, run: &Run) {
    let kinds = s.kinds(&run.run_id);
    let n = |k: &str| kinds.iter().filter(|x| *x == k).count();
    assert_eq!(
        (n("approval_decided"), n("tool_result")),
        (1, 1),
        "{kinds:?}"
    );
}

/// A Run of `ops` parked for its approval, on a stack whose functions die
/// once at `point`; the approval.
async fn parked_dying_at(point: armada_core::faults::FaultPoint) -> (Stack, Run, Approval) {
    let s = stack_on(
        Stack::dying_at(point),
        json!({"approvers": ["ops@example.com"]}),
    )
    .await;
    let run = s.start("ops", "/tool launch {}", None).await;
    s.to_harness(&s.mem.take_harness()[0]).await;
    let a = approvals(&s).remove(0);
    (s, run, a)
}

#[tokio::test]
async fn a_decision_stored_by_an_approver_that_died_before_telling_the_run_is_applied_once() {
    let (s, run, a) = parked_dying_at(armada_core::faults::FaultPoint::AfterApprovalDecided).await;
    let decide = |verdict| {
        armada_hitl::decide(
            &s.svc,
            &a.approval_id,
            verdict,
            Decider::Key {
                key_id: "k_boss".into(),
            },
            None,
            None,
            Some(TENANT),
        )
    };
    let died = decide(Verdict::Approve)
        .await
        .expect_err("died after storing");
    assert_eq!(died.status, 503, "{died:?}");
    assert_eq!(approvals(&s)[0].state(), ApprovalState::Approved, "stored");
    assert!(s.mem.take_harness().is_empty(), "the Run was not told");
    // The approver's retry finds it decided; the Run's watchdog tells it.
    let again = decide(Verdict::Approve).await.expect_err("decided already");
    assert_eq!(again.status, 409, "{again:?}");
    let waiting = s.run(&run.run_id);
    assert_eq!(waiting.state(), RunState::AwaitingHitl);
    s.to_dispatcher(&check(&waiting)).await;
    s.pump().await;
    assert!(s.run(&run.run_id).state().is_terminal());
    assert_applied_once(&s, &run);
}

#[tokio::test]
async fn a_worker_that_died_after_applying_a_decision_is_followed_by_its_repeat() {
    let (s, run, a) = parked_dying_at(armada_core::faults::FaultPoint::AfterCommit).await;
    let msg = decided(&s, &a, Verdict::Approve);
    s.svc.queues.send_harness(&msg).await.expect("queued");
    // The decision is applied and the call run, then the worker dies
    // before the next step is asked for; the decision's redelivery asks.
    assert_eq!(s.pump_redelivering().await, 1, "died once");
    let done = s.run(&run.run_id);
    assert_eq!(done.state(), RunState::ClosedCompleted, "{:?}", done.error);
    assert_applied_once(&s, &run);
}

/// A worker claims the Run with a decision and dies there, its lease
/// still running when the decision comes back: the decision stays until
/// the lease is out, then asks for the step again under a deduplication
/// id of its own (the step's first message had the same step, and FIFO
/// would drop a repeat of it). (Found by `armada chaos`: an approved Run
/// left EXECUTING at epoch 2 with no message to carry it on.)
#[tokio::test]
async fn a_decision_whose_worker_died_after_claiming_stays_until_the_step_is_taken() {
    let s = stack(3600).await;
    let run = s.start("ops", "/tool launch {}", None).await;
    let first = s.mem.take_harness().remove(0);
    s.to_harness(&first).await;
    let a = approvals(&s).remove(0);
    let msg = decided(&s, &a, Verdict::Approve);
    let body = serde_json::to_string(&msg).expect("json");
    let batch = || sqs_event(&s.svc.cfg.harness_queue, std::slice::from_ref(&body));
    let mut dying = (*s.svc).clone();
    dying.faults = Arc::new(armada_core::faults::DiesOnceAt::new(
        armada_core::faults::FaultPoint::AfterClaim,
    ));
    let died = armada_harness::Harness::new(Arc::new(dying))
        .handle_event(batch())
        .await;
    assert!(died.is_err(), "the worker died after its claim");
    // It had got as far as its checkpoint: the decision applied, the call
    // recorded as dispatched before it runs (the ledger's rule).
    let mut claimed = s.run(&run.run_id);
    let prev = claimed.stamp();
    let def = s
        .svc
        .registry
        .agent("ops")
        .await
        .expect("read")
        .expect("ops");
    let now = s.svc.clock.now_ms();
    let approval = approvals(&s).remove(0);
    let input = armada_domain::step::StepInput::ApprovalsDecided(std::slice::from_ref(&approval));
    let d = armada_domain::step::decide(&mut claimed, &def, input, now).expect("decided");
    assert!(d.checkpoint);
    s.svc
        .runs
        .save(prev, &claimed, &d.events, vec![])
        .await
        .expect("saved");
    let claimed = s.run(&run.run_id);
    assert_eq!(claimed.state(), RunState::Executing);
    // Back while the dead worker's lease runs: kept, nothing changed.
    let resp = s.harness.handle_event(batch()).await.expect("handled");
    assert_eq!(
        resp.batch_item_failures.len(),
        1,
        "kept for after the lease"
    );
    assert_eq!(s.run(&run.run_id), claimed);
    assert!(s.mem.take_harness().is_empty());
    // After it: the step is asked for again, as a message of its own.
    s.svc.clock.advance(s.svc.cfg.step_lease_ms + 1);
    let resp = s.harness.handle_event(batch()).await.expect("handled");
    assert!(resp.batch_item_failures.is_empty());
    let again = s.mem.take_harness();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_ne!(again[0].dedup_id(), first.dedup_id());
    s.to_harness(&again[0]).await;
    s.pump().await;
    let done = s.run(&run.run_id);
    assert!(done.state().is_terminal(), "{:?}", done.state());
    assert_eq!(
        s.kinds(&run.run_id)
            .iter()
            .filter(|k| *k == "approval_decided")
            .count(),
        1
    );
}

/// A Run waiting for its approval is claimed by a message that was no
/// message (a copy of one deleted long ago) whose worker then dies: the
/// wait's watchdog looks on while the claim's lease runs, and once it
/// has lapsed for as long as a dead worker's message takes to come back,
/// asks for the step again. (Found by `armada chaos` on sandbox Runs:
/// left `EXECUTING` at epoch 2 with no message and no watchdog.)
#[tokio::test]
async fn a_step_claimed_by_a_phantom_whose_worker_died_is_asked_for_again() {
    let s = stack(3600).await;
    let run = s.start("ops", "/tool launch {}", None).await;
    s.to_harness(&s.mem.take_harness()[0]).await;
    let parked = s.run(&run.run_id);
    assert_eq!(parked.state(), RunState::AwaitingHitl);
    s.mem.take_dispatch();
    let lease_ms = s.svc.cfg.step_lease_ms;
    let claimed = {
        let mut st = s.mem.state();
        let r = st.runs.get_mut(&run.run_id).expect("run");
        let until = s.svc.clock.now_ms() + lease_ms;
        r.apply(
            RunEvent::Claimed {
                lease_until_ms: until,
            },
            s.svc.clock.now_ms(),
        )
        .expect("claimed");
        r.clone()
    };
    assert_eq!(s.to_dispatcher(&check(&parked)).await, 0);
    assert!(s.mem.take_harness().is_empty(), "held: nothing asked yet");
    // Looked at again later, again and again while the lease runs (each
    // check a new one of the chain: one sent again as itself would be
    // dropped for a copy, and the chain end there).
    let mut next = check(&claimed);
    for n in 1..=3 {
        if let DispatchMessage::CheckRun { n: k, .. } = &mut next {
            *k = n;
        }
        let again = s.mem.take_dispatch();
        assert_eq!(again, [next.clone()], "looked at again later");
        assert_eq!(s.to_dispatcher(&again[0]).await, 0);
        assert!(s.mem.take_harness().is_empty(), "held: nothing asked yet");
    }
    let again = s.mem.take_dispatch();
    assert_eq!(again.len(), 1, "the chain goes on: {again:?}");
    let back_ms = i64::from(s.svc.cfg.crash_return_s) * 1000;
    s.svc.clock.advance(lease_ms + back_ms + 1);
    assert_eq!(s.to_dispatcher(&again[0]).await, 0);
    let asked = s.mem.take_harness();
    assert_eq!(
        asked,
        [HarnessMessage::Step {
            run_id: run.run_id.clone(),
            tenant: TENANT.into(),
            step: claimed.step,
            epoch: claimed.epoch,
        }]
    );
    s.to_harness(&asked[0]).await;
    let after = s.run(&run.run_id);
    assert_eq!(
        after.state(),
        RunState::AwaitingHitl,
        "waiting for its human again"
    );
    assert!(after.epoch > claimed.epoch);
}

#[tokio::test]
async fn a_decision_waits_for_a_step_in_flight() {
    let s = stack(3600).await;
    let run = s.start("ops", "/tool launch {}", None).await;
    s.to_harness(&s.mem.take_harness()[0]).await;
    let a = approvals(&s).remove(0);
    let msg = decided(&s, &a, Verdict::Approve);
    // A worker holds the Run (a step in flight): the decision is retried.
    let held = {
        let mut st = s.mem.state();
        let r = st.runs.get_mut(&run.run_id).expect("run");
        r.lease_until_ms = s.svc.clock.now_ms() + 60_000;
        r.clone()
    };
    let body = serde_json::to_string(&msg).expect("json");
    let resp = s
        .harness
        .handle_event(sqs_event(&s.svc.cfg.harness_queue, &[body]))
        .await
        .expect("handled");
    assert_eq!(resp.batch_item_failures.len(), 1, "retried after the lease");
    assert_eq!(s.run(&run.run_id), held, "nothing changed");
    s.mem
        .state()
        .runs
        .get_mut(&run.run_id)
        .expect("run")
        .lease_until_ms = 0;
    s.to_harness(&msg).await;
    s.pump().await;
    assert!(s.run(&run.run_id).state().is_terminal());
}

#[tokio::test]
async fn the_watchdog_expires_what_no_one_decided_and_sends_unsent_links() {
    let s = stack(60).await;
    let run = s.start("ops", "/tool launch {}", None).await;
    s.to_harness(&s.mem.take_harness()[0]).await;
    s.mem.take_dispatch();
    let parked = s.run(&run.run_id);
    // Not due: a link never sent is sent, and the next check is no later
    // than the deadline.
    assert_eq!(s.to_dispatcher(&check(&parked)).await, 0);
    let queued = s.mem.state().dispatch.clone();
    assert!(queued
        .iter()
        .any(|(m, _)| matches!(m, DispatchMessage::NotifyApproval { recipient, .. } if recipient == "ops@example.com")));
    let (_, delay) = queued
        .iter()
        .find(|(m, _)| matches!(m, DispatchMessage::CheckRun { .. }))
        .expect("the next check");
    assert!((1..=60).contains(delay), "{delay}");
    s.mem.take_dispatch();
    // Due: it expires, and the Run hears of it.
    s.svc.clock.advance(61_000);
    assert_eq!(s.to_dispatcher(&check(&parked)).await, 0);
    assert_eq!(approvals(&s)[0].state(), ApprovalState::Expired);
    s.pump().await;
    assert!(s.output(&run.run_id).contains("APPROVAL_EXPIRED"));
    assert!(s
        .kinds(&run.run_id)
        .contains(&"approval_expired".to_string()));
}

#[tokio::test]
async fn a_cancelled_runs_pending_approvals_are_cancelled() {
    let s = stack(3600).await;
    let run = s.start("ops", "/tool launch {}", None).await;
    s.to_harness(&s.mem.take_harness()[0]).await;
    s.mem.take_dispatch();
    let now = s.svc.clock.now_ms();
    {
        let mut st = s.mem.state();
        let r = st.runs.get_mut(&run.run_id).expect("run");
        r.apply_from_outside(RunEvent::CancelRequested, now)
            .expect("cancellable");
    }
    s.to_dispatcher(&DispatchMessage::RunTerminal {
        run_id: run.run_id.clone(),
        tenant: TENANT.into(),
    })
    .await;
    assert_eq!(approvals(&s)[0].state(), ApprovalState::Cancelled);
    assert_eq!(
        approvals(&s)[0].decision.as_ref().map(|d| d.how.as_str()),
        Some("cancel")
    );
}

/// A loopback chat endpoint: answers one POST with 200 and hands over its
/// `X-Armada-Signature` and body.
async fn chat_endpoint() -> (String, tokio::sync::oneshot::Receiver<(String, String)>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bound");
    let url = format!("http://{}/hook", l.local_addr().expect("an address"));
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut conn, _)) = l.accept().await else {
            return;
        };
        let mut seen = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = conn.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            seen.extend_from_slice(&chunk[..n]);
            let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&seen[..end]).to_string();
            let header = |name: &str| {
                head.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim()
                        .eq_ignore_ascii_case(name)
                        .then(|| v.trim().to_string())
                })
            };
            let len: usize = header("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if seen.len() < end + 4 + len {
                continue;
            }
            let body = String::from_utf8_lossy(&seen[end + 4..end + 4 + len]).to_string();
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await;
            let _ = tx.send((header("x-armada-signature").unwrap_or_default(), body));
            return;
        }
    });
    (url, rx)
}

#[tokio::test]
async fn a_chat_message_is_signed_so_no_callback_receiver_accepts_it() {
    use armada_domain::api::chat_signing_secret;
    use armada_domain::crypto::{digest_eq, hmac_sha256_hex};
    let (url, received) = chat_endpoint().await;
    let s = stack_with(json!({"chat_webhook_url": url})).await;
    s.start("ops", "/tool launch {}", None).await;
    s.to_harness(&s.mem.take_harness()[0]).await;
    let chat: Vec<DispatchMessage> = s
        .mem
        .take_dispatch()
        .into_iter()
        .filter(|m| matches!(m, DispatchMessage::NotifyApproval { recipient, .. } if recipient == "chat"))
        .collect();
    assert_eq!(chat.len(), 1);
    assert_eq!(s.to_dispatcher(&chat[0]).await, 0, "delivered");
    let (sig, body) = received.await.expect("the chat message arrived");
    assert!(body.contains("review?token="), "{body}");
    let (t, mac) = sig
        .strip_prefix("t=")
        .and_then(|h| h.split_once(",v1="))
        .expect("t=<seconds>,v1=<hex>");
    let mac_with = |key: &str| hmac_sha256_hex(key.as_bytes(), format!("{t}.{body}").as_bytes());
    let secret = s
        .svc
        .callbacks
        .tenant_secret(s.svc.registry.as_ref(), TENANT)
        .await
        .expect("the tenant's secret");
    // What the tenant's callback receiver checks: it must say no.
    assert!(
        !digest_eq(mac, &mac_with(&secret)),
        "a chat message verifies as a callback"
    );
    assert_eq!(mac, mac_with(&chat_signing_secret(&secret)));
}

/// A task's credentials may send to the dispatch queue: a notice it
/// forges (unsealed, or sealed for another recipient) mints no link and
/// mails nothing; the control plane's own notice does.
#[tokio::test]
async fn only_the_control_planes_notices_mint_links() {
    let s = stack(3600).await;
    let run = s.start("ops", "/tool launch {}", None).await;
    s.to_harness(&s.mem.take_harness()[0]).await;
    let sealed: Vec<DispatchMessage> = s
        .mem
        .take_dispatch()
        .into_iter()
        .filter(|m| matches!(m, DispatchMessage::NotifyApproval { .. }))
        .collect();
    assert_eq!(s.run(&run.run_id).state(), RunState::AwaitingHitl);
    let a = approvals(&s).remove(0);
    let forged_seal = armada_domain::messages::notice_seal(
        &s.svc.cfg.callback_signing_secret,
        &a.approval_id,
        &a.tenant,
        "someone-else@example.com",
    );
    for seal in [String::new(), "0".repeat(64), forged_seal] {
        let forged = DispatchMessage::NotifyApproval {
            approval_id: a.approval_id.clone(),
            tenant: a.tenant.clone(),
            recipient: "ops@example.com".into(),
            seal,
        };
        assert_eq!(s.to_dispatcher(&forged).await, 0, "dropped, not retried");
    }
    assert!(approvals(&s)[0].tokens.is_empty(), "no link minted");
    assert_eq!(s.to_dispatcher(&sealed[0]).await, 0);
    assert_eq!(
        approvals(&s)[0].tokens.len(),
        1,
        "the sealed notice mints one"
    );
}
