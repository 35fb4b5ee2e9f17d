//! Mail on in-memory ports: a message stored and announced starts one Run
//! of its mailbox (a redelivered notice answers the first Run), its reply
//! is sent once, threaded, and an answer to the reply continues the
//! session; what a mailbox refuses is recorded and starts nothing; a
//! forged reply message is dropped. No emulator.

use armada_core::memory::fixtures::{agent, sqs_event};
use armada_domain::mailbox::mail::InboundMail;
use armada_domain::mailbox::notice::ReceivedNotice;
use armada_domain::mailbox::receipt::MailOutcome;
use armada_domain::mailbox::{Mailbox, MailboxSpec};
use serde_json::{json, Value};

use super::*;
use crate::test_stack::{Stack, TENANT};

/// A mailbox of the assistant's, stored.
async fn support(s: &Stack, extra: Value) -> Mailbox {
    agent(&s.svc, "assistant", &[]).await;
    let mut body = json!({"name": "support", "agent": "assistant",
        "allow_senders": ["alice@example.com"], "input_template": "{{ mail.text | trim }}"});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    let (spec, enabled) = MailboxSpec::parse(&body).expect("valid");
    let m = Mailbox::new(
        "mbx_1",
        TENANT,
        "armada.local",
        spec,
        enabled,
        s.svc.clock.now_ms(),
    );
    s.svc.mailboxes.create(&m).await.expect("stored");
    m
}

/// Stores `raw` as SES would and hands its notice to the dispatcher.
async fn deliver(s: &Stack, key: &str, raw: &str, checks: &str) -> usize {
    s.svc
        .payloads
        .put_bytes(key, raw.as_bytes(), "message/rfc822")
        .await
        .expect("stored");
    let notice = ReceivedNotice::unchecked(
        key,
        "alice@example.com",
        &["support@armada.local".to_string()],
        &s.svc.cfg.payload_bucket,
        key,
        "arn:aws:sns:us-east-1:000000000000:mail",
    );
    let body = serde_json::to_string(&notice)
        .expect("json")
        .replace("DISABLED", checks);
    let event = sqs_event(&s.svc.cfg.inbox.queue, &[body]);
    s.dispatcher
        .handle_event(event)
        .await
        .batch_item_failures
        .len()
}

fn mail(id: &str, extra_headers: &str, body: &str) -> String {
    format!("From: Alice <alice@example.com>\r\nTo: support@armada.local\r\nSubject: Invoice\r\nMessage-ID: <{id}>\r\n{extra_headers}\r\n{body}\r\n")
}

fn outcomes(s: &Stack) -> Vec<(MailOutcome, Option<String>)> {
    let mut r: Vec<_> = s.mem.state().mail_receipts.clone();
    r.sort_by_key(|m| m.received_at_ms);
    r.into_iter().map(|m| (m.outcome(), m.run_id)).collect()
}

fn replies(s: &Stack) -> Vec<InboundMail> {
    s.mem
        .state()
        .raw_mails
        .iter()
        .map(|(_, _, raw)| InboundMail::parse(raw.as_bytes(), None).expect("a message"))
        .collect()
}

#[tokio::test]
async fn a_message_starts_one_run_answered_once_in_its_thread() {
    let s = Stack::new();
    support(&s, json!({})).await;
    let first = mail("m1@example.com", "", "where is the invoice?");
    assert_eq!(deliver(&s, "mail/inbound/a", &first, "PASS").await, 0);
    // SQS delivers the notice again: the same Run.
    assert_eq!(deliver(&s, "mail/inbound/a", &first, "PASS").await, 0);
    let seen = outcomes(&s);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].0, MailOutcome::Started);
    assert_eq!(seen[1], (MailOutcome::Duplicate, seen[0].1.clone()));
    let run_id = seen[0].1.clone().expect("a run");
    assert_eq!(s.mem.state().runs.len(), 1);
    s.pump().await;
    let run = s.run(&run_id);
    assert!(run.state().is_closed(), "{:?}", run.state());
    assert!(run.session_id.is_some());
    let sent = replies(&s);
    assert_eq!(sent.len(), 1, "one reply");
    assert_eq!(sent[0].subject, "Re: Invoice");
    assert_eq!(sent[0].in_reply_to, ["m1@example.com"]);
    assert_eq!(sent[0].text.trim(), "echo: where is the invoice?");
    // The reply's message again (a retried settlement): not sent again.
    let again = DispatchMessage::send_reply(&s.svc.cfg.callback_signing_secret, &run_id, TENANT);
    assert_eq!(s.to_dispatcher(&again).await, 0);
    assert_eq!(replies(&s).len(), 1);

    // Alice answers the reply: the session's next message.
    let reply_id = sent[0].message_id.clone().expect("an id");
    let answer = mail(
        "m2@example.com",
        &format!("In-Reply-To: <{reply_id}>\r\nReferences: <m1@example.com> <{reply_id}>\r\n"),
        "/recall",
    );
    assert_eq!(deliver(&s, "mail/inbound/b", &answer, "PASS").await, 0);
    s.pump().await;
    let second = outcomes(&s)[2].1.clone().expect("a run");
    assert_eq!(s.run(&second).session_id, run.session_id);
    assert_eq!(s.output(&second), "where is the invoice?");
    assert_eq!(replies(&s).len(), 2);
}

#[tokio::test]
async fn what_a_mailbox_refuses_is_recorded_and_starts_nothing() {
    let s = Stack::new();
    support(&s, json!({"max_runs_per_hour": 1})).await;
    // SES's checks failed.
    deliver(&s, "k1", &mail("a@example.com", "", "hi"), "FAIL").await;
    // A stranger.
    let stranger = mail("b@example.com", "", "hi").replace("alice@", "eve@");
    deliver(&s, "k2", &stranger, "PASS").await;
    // An out-of-office answer.
    deliver(
        &s,
        "k3",
        &mail("c@example.com", "Auto-Submitted: auto-replied\r\n", "away"),
        "PASS",
    )
    .await;
    // One Run this hour, then the budget.
    deliver(&s, "k4", &mail("d@example.com", "", "one"), "PASS").await;
    deliver(&s, "k5", &mail("e@example.com", "", "two"), "PASS").await;
    let seen: Vec<MailOutcome> = outcomes(&s).into_iter().map(|(o, _)| o).collect();
    assert_eq!(
        seen,
        [
            MailOutcome::Refused,
            MailOutcome::Refused,
            MailOutcome::Refused,
            MailOutcome::Started,
            MailOutcome::RateLimited
        ]
    );
    assert_eq!(s.mem.state().runs.len(), 1);
    // Disabled: recorded as such.
    let off =
        armada_domain::mailbox::MailboxPatch::parse(&json!({"enabled": false})).expect("valid");
    armada_core::cas::change(
        s.svc.mailboxes.as_ref(),
        "mbx_1",
        || 0,
        |_: &Mailbox| Some(armada_domain::mailbox::MailboxEvent::Update(off.clone())),
    )
    .await
    .expect("changed");
    deliver(&s, "k6", &mail("f@example.com", "", "three"), "PASS").await;
    assert_eq!(
        outcomes(&s).last().map(|(o, _)| *o),
        Some(MailOutcome::Disabled)
    );
}

#[tokio::test]
async fn a_forged_reply_and_a_notice_for_another_bucket_are_dropped() {
    let s = Stack::new();
    support(&s, json!({})).await;
    let forged = DispatchMessage::SendReply {
        run_id: "run_x".into(),
        tenant: TENANT.into(),
        seal: "0".repeat(64),
    };
    assert_eq!(s.to_dispatcher(&forged).await, 0);
    assert!(replies(&s).is_empty());
    s.svc
        .payloads
        .put_bytes(
            "k",
            mail("a@example.com", "", "hi").as_bytes(),
            "message/rfc822",
        )
        .await
        .expect("stored");
    let notice = ReceivedNotice::unchecked(
        "k",
        "alice@example.com",
        &["support@armada.local".to_string()],
        "someone-elses-bucket",
        "k",
        "t",
    );
    let event = sqs_event(
        &s.svc.cfg.inbox.queue,
        &[serde_json::to_string(&notice).expect("json")],
    );
    assert!(s
        .dispatcher
        .handle_event(event)
        .await
        .batch_item_failures
        .is_empty());
    assert!(outcomes(&s).is_empty());
}

#[tokio::test]
async fn a_relay_teams_mail_is_answered_by_its_last_step() {
    let s = Stack::new();
    agent(&s.svc, "assistant", &[]).await;
    agent(&s.svc, "editor", &[]).await;
    let team = armada_domain::team::TeamDefinition::from_json(
        "desk",
        &json!({"members": ["assistant", "editor"], "strategy": "relay"}),
    )
    .expect("valid");
    s.svc.registry.put_team(&team).await.expect("stored");
    let (spec, enabled) = MailboxSpec::parse(&json!({"name": "support", "team": "desk",
        "allow_senders": ["alice@example.com"], "input_template": "{{ mail.text | trim }}"}))
    .expect("valid");
    let m = Mailbox::new("mbx_1", TENANT, "armada.local", spec, enabled, 0);
    s.svc.mailboxes.create(&m).await.expect("stored");
    deliver(&s, "k", &mail("m1@example.com", "", "draft it"), "PASS").await;
    s.pump().await;
    let sent = replies(&s);
    assert_eq!(sent.len(), 1, "one reply, at the chain's end");
    assert_eq!(sent[0].text.trim(), "echo: echo: draft it");
    assert_eq!(sent[0].in_reply_to, ["m1@example.com"]);
}
