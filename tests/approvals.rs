//! Human approvals on the real emulator (issue 9, scenario B): a gated
//! call parks its Run in AWAITING_HITL without being dispatched; the link
//! in the `.eml` (and the chat message) opens a page that changes nothing;
//! its form decides once; keys decide only as approvers of their tenant,
//! never their own high-risk call unless allowed; rejections, expiry,
//! cancel and two approvals of one turn. (Sandbox work that waits, and
//! calls lost with their sandbox: `approvals_sandbox.rs`.)

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use armada_domain::skills::Risk;
use armada_tests::approvals::*;
use armada_tests::sandbox::{fast, tool_result};
use armada_tests::{callback_receiver, outcome, RunState, TestStack};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_link_from_the_email_shows_the_action_and_approving_runs_it_once() {
    let t = TestStack::start_with(fast(), None).await;
    // The chat webhook fails every attempt of the first delivery; the
    // queue's retry sends a new link that arrives.
    let (hook, mut heard) = callback_receiver(vec![500, 500, 500, 200]).await;
    put_launch(&t).await;
    put_agent(
        &t,
        "ops",
        &["launch"],
        json!({"approvers": ["ops@example.com"], "chat_webhook_url": hook}),
        json!({}),
    )
    .await;
    let id = t.client.create_run("ops", "/tool launch {}").await.unwrap();
    let paused = wait_state(&t.client, &id, "AWAITING_HITL").await;
    let ids = approvals_of(&t.client, &id).await;
    assert_eq!(ids.len(), 1);
    let approval_id = &ids[0];
    let ev = t.events(&id).await;
    assert!(kinds(&ev).contains(&"tool_call"));
    assert!(
        !kinds(&ev).contains(&"tool_dispatched") && !kinds(&ev).contains(&"tool_result"),
        "no decision, no execution: {ev:?}"
    );

    // The email's link.
    let link = eml_link(&t.outbox, approval_id).await;
    assert!(link.starts_with(&t.stack.api_url), "{link}");
    let token = token_of(&link);
    assert!(token.len() >= 32, "at least 128 random bits");

    // The chat message: three failed attempts, then a new link that works.
    let mut chat = Vec::new();
    while chat.len() < 4 {
        let request = tokio::time::timeout(Duration::from_secs(60), heard.recv())
            .await
            .expect("the chat webhook is retried")
            .unwrap();
        chat.push(serde_json::from_str::<Value>(&request.body).unwrap());
    }
    let chat_link = |v: &Value| {
        let text = v["text"].as_str().unwrap();
        text[text.find("http").unwrap()..].to_string()
    };
    assert_ne!(
        chat_link(&chat[0]),
        chat_link(&chat[3]),
        "a retried notice mints a new link"
    );
    let (status, _) = get_page(&chat_link(&chat[0])).await;
    assert_eq!(status, 403, "the undelivered link is void");

    // Opening the page (twice: mail scanners prefetch) changes nothing.
    for _ in 0..2 {
        let (status, html) = get_page(&link).await;
        assert_eq!(status, 200, "{html}");
        for part in [
            "ops",
            "launch",
            id.as_str(),
            "high",
            "Approve",
            "Reject",
            "Decide before",
        ] {
            assert!(html.contains(part), "{part} missing from the page: {html}");
        }
    }
    let view = approval(&t.client, approval_id).await;
    assert_eq!(view.state, ApprovalState::Pending, "{view:?}");
    assert_eq!(view.tool, "launch");
    assert_eq!(view.risk, Risk::High);

    // A forged token, or this token on another path: a clear 403 page.
    let forged = link.replace(&token, &"0".repeat(64));
    assert_eq!(get_page(&forged).await.0, 403);

    // Approve through the page's form.
    let (status, html) = submit(&t.stack.api_url, approval_id, &token, "approve").await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("Approved"), "{html}");
    let run = t
        .client
        .wait_run(&id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert!(
        tool_result(&run, "launch")["now"].is_string(),
        "the real result: {run:?}"
    );
    assert!(run.epoch > paused.epoch, "resumed by a later claim");

    // The link is used: replayed, it decides nothing and says so.
    let (status, html) = submit(&t.stack.api_url, approval_id, &token, "reject").await;
    assert_eq!(status, 409, "{html}");
    assert!(html.contains("already decided: approved"), "{html}");
    assert_eq!(get_page(&link).await.0, 409);

    let view = approval(&t.client, approval_id).await;
    assert_eq!(view.state, ApprovalState::Approved);
    assert_eq!(view.decided_how.as_deref(), Some("token"));
    assert_eq!(view.decided_by.as_deref(), Some("ops@example.com"));
    assert_eq!(view.decided_from.as_deref(), Some("127.0.0.1"));
    let ev = t.events(&id).await;
    let k = kinds(&ev);
    let decided = k.iter().position(|e| *e == "approval_decided").unwrap();
    let result = k.iter().position(|e| *e == "tool_result").unwrap();
    assert!(decided < result, "executed only after the decision: {k:?}");
    assert_eq!(k.iter().filter(|e| **e == "tool_result").count(), 1, "once");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_decide_as_approvers_of_their_tenant_once_each_and_never_their_own_high_risk_call() {
    let t = TestStack::start_with(fast(), None).await;
    put_launch(&t).await;
    put_agent(&t, "ops", &["launch"], json!({}), json!({})).await;
    put_agent(
        &t,
        "ops-self",
        &["launch"],
        json!({"allow_self_approval": true}),
        json!({}),
    )
    .await;
    let (approver, _) = key(&t, "local", "approver").await;
    let (stranger, _) = key(&t, "other", "approver").await;

    // Two gated calls in one turn: two approvals, decided independently.
    let two = r#"/tools [{"name":"launch","args":{"n":1}},{"name":"launch","args":{"n":2}}]"#;
    let id = t.client.create_run("ops", two).await.unwrap();
    wait_state(&t.client, &id, "AWAITING_HITL").await;
    let ids = approvals_of(&t.client, &id).await;
    assert_eq!(ids.len(), 2);
    let listed = approvals_in(&t.client, "pending").await;
    let pending: Vec<&str> = listed
        .iter()
        .filter(|a| a.run_id == id)
        .map(|a| a.approval_id.as_str())
        .collect();
    assert_eq!(pending.len(), 2, "{listed:?}");

    // A member key is no approver; another tenant's key sees nothing.
    assert_eq!(
        decide(&t.client, &ids[0], "approve", "").await.unwrap_err(),
        403
    );
    assert_eq!(
        decide(&stranger, &ids[0], "approve", "").await.unwrap_err(),
        404
    );
    let (status, _) = t
        .raw(
            Method::GET,
            &format!("/v1/approvals/{}", ids[0]),
            None,
            None,
            &[],
        )
        .await;
    assert_eq!(status, 401);
    assert!(stranger
        .get(&format!("/v1/approvals/{}", ids[0]))
        .await
        .is_err());

    // The second first, rejected: the Run still waits for the first.
    decide(&approver, &ids[1], "reject", "not twice")
        .await
        .unwrap();
    // The decision has reached the Run once its queues are drained.
    armada_tests::wait::drained(&t).await;
    let run = t.client.run(&id).await.unwrap();
    assert_eq!(run.state, RunState::AwaitingHitl, "{run:?}");

    // Approve and reject the first at once: one wins, the other hears 409.
    let (a, r) = tokio::join!(
        decide(&approver, &ids[0], "approve", ""),
        decide(&approver, &ids[0], "reject", "")
    );
    let codes = [a.as_ref().err().copied(), r.as_ref().err().copied()];
    assert_eq!(
        codes.iter().filter(|c| c.is_none()).count(),
        1,
        "{a:?} {r:?}"
    );
    assert!(codes.contains(&Some(409)), "{a:?} {r:?}");
    let approved_first = a.is_ok();
    let run = t
        .client
        .wait_run(&id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let out = run.output.as_deref().unwrap();
    assert_eq!(
        out.matches("APPROVAL_REJECTED").count(),
        if approved_first { 1 } else { 2 },
        "{out}"
    );
    assert!(
        out.contains("not twice"),
        "the comment reaches the model: {out}"
    );
    assert_eq!(out.contains("\"now\""), approved_first, "{out}");
    // A decision after the fact: 409, nothing changes.
    assert_eq!(
        decide(&approver, &ids[1], "approve", "").await.unwrap_err(),
        409
    );

    // The key that started a Run cannot approve its high-risk call...
    let own = approver.create_run("ops", "/tool launch {}").await.unwrap();
    wait_state(&approver, &own, "AWAITING_HITL").await;
    let own_ids = approvals_of(&approver, &own).await;
    assert_eq!(
        decide(&approver, &own_ids[0], "approve", "")
            .await
            .unwrap_err(),
        403
    );
    // ...but may reject it, and may approve where the agent allows it.
    decide(&approver, &own_ids[0], "reject", "").await.unwrap();
    let allowed = approver
        .create_run("ops-self", "/tool launch {}")
        .await
        .unwrap();
    wait_state(&approver, &allowed, "AWAITING_HITL").await;
    let allowed_ids = approvals_of(&approver, &allowed).await;
    decide(&approver, &allowed_ids[0], "approve", "mine")
        .await
        .unwrap();
    let run = approver
        .wait_run(&allowed, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rejection_can_fail_the_run_expiry_rejects_and_cancel_ends_the_approvals() {
    let t = TestStack::start_with(fast(), None).await;
    put_launch(&t).await;
    put_agent(
        &t,
        "strict",
        &["launch"],
        json!({"on_reject": "fail", "approvers": ["ops@example.com"]}),
        json!({}),
    )
    .await;
    put_agent(
        &t,
        "hasty",
        &["launch"],
        json!({"expires_s": 10}),
        json!({}),
    )
    .await;
    put_agent(
        &t,
        "ops",
        &["launch"],
        json!({"approvers": ["ops@example.com"]}),
        json!({}),
    )
    .await;
    let (approver, _) = key(&t, "local", "approver").await;

    // on_reject: fail.
    let id = t
        .client
        .create_run("strict", "/tool launch {}")
        .await
        .unwrap();
    wait_state(&t.client, &id, "AWAITING_HITL").await;
    let ids = approvals_of(&t.client, &id).await;
    decide(&approver, &ids[0], "reject", "no").await.unwrap();
    let run = t
        .client
        .wait_run(&id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "APPROVAL_REJECTED"
    );

    // No decision before the deadline: APPROVAL_EXPIRED as the tool's result.
    let id = t
        .client
        .create_run("hasty", "/tool launch {}")
        .await
        .unwrap();
    wait_state(&t.client, &id, "AWAITING_HITL").await;
    let ids = approvals_of(&t.client, &id).await;
    let run = t
        .client
        .wait_run(&id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert!(
        run.output.as_deref().unwrap().contains("APPROVAL_EXPIRED"),
        "{run:?}"
    );
    assert!(kinds(&t.events(&id).await).contains(&"approval_expired"));
    let view = approval(&t.client, &ids[0]).await;
    assert_eq!(view.state, ApprovalState::Expired);
    assert_eq!(
        decide(&approver, &ids[0], "approve", "").await.unwrap_err(),
        409
    );

    // Cancelled while pending: the approval ends cancelled; its link says so.
    let id = t.client.create_run("ops", "/tool launch {}").await.unwrap();
    wait_state(&t.client, &id, "AWAITING_HITL").await;
    let ids = approvals_of(&t.client, &id).await;
    let link = eml_link(&t.outbox, &ids[0]).await;
    t.client
        .post(&format!("/v1/runs/{id}/cancel"), &json!({}))
        .await
        .unwrap();
    t.wait_closed(&id).await;
    let view = approval(&t.client, &ids[0]).await;
    assert_eq!(view.state, ApprovalState::Cancelled, "{view:?}");
    let (status, html) = get_page(&link).await;
    assert_eq!(status, 409);
    assert!(html.contains("cancelled"), "{html}");
    let (status, _) = submit(&t.stack.api_url, &ids[0], &token_of(&link), "approve").await;
    assert_eq!(status, 409);
    let listed = approvals_in(&t.client, "cancelled").await;
    assert!(listed.iter().any(|a| a.approval_id == ids[0]));
    t.stack.stop().await;
}
