//! Mailboxes against a real SMTP client: Debian's `swaks` (scripts/test
//! installs it) sends to the local stack's listener, which stores each
//! message and announces it as SES would. A multipart message with an
//! ISO-8859-1 part and an attachment starts a Run whose reply is threaded;
//! a reply to that reply continues the same session; a stranger, an
//! automatic message and an unknown address start nothing.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::Method;
use serde_json::json;

use armada_api::mailboxes::{MailView, MailboxCreated};
use armada_domain::mailbox::mail::InboundMail;
use armada_domain::mailbox::receipt::MailOutcome;
use armada_domain::run::Trigger;
use armada_tests::{wait, RunState, TestStack};

/// Sends one message with swaks; its exit status and what it printed.
fn swaks(server: &str, from: &str, to: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("swaks")
        .args(["--server", server, "--from", from, "--to", to])
        .args(["--helo", "client.example.com", "--hide-informational"])
        .args(args)
        .output()
        .expect("swaks runs (scripts/test installs Debian's package)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The mailbox's message whose `Message-ID` is `id`, once answered.
async fn answered(t: &TestStack, mailbox_id: &str, id: &str) -> MailView {
    wait::until(
        &format!("mail {id} to be answered"),
        wait::PATIENCE,
        || async {
            t.mailbox_deliveries(mailbox_id)
                .await
                .into_iter()
                .find(|m| m.message_id.as_deref() == Some(id))
        },
    )
    .await
}

/// The reply in the outbox that answers `id`.
async fn reply_to(outbox: &Path, id: &str) -> InboundMail {
    wait::until(
        &format!("a reply to {id} in the outbox"),
        wait::PATIENCE,
        || async {
            let entries = std::fs::read_dir(outbox).ok()?;
            let files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            files
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == "eml"))
                .filter_map(|p| std::fs::read(p).ok())
                .filter_map(|b| InboundMail::parse(&b, None).ok())
                .find(|m| m.in_reply_to.iter().any(|r| r == id))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mail_from_swaks_starts_a_run_whose_threaded_reply_continues_the_session() {
    let t = TestStack::start().await;
    let server = t.stack.smtp_addr.clone();
    let (s, v) = t
        .raw(
            Method::POST,
            "/v1/mailboxes",
            Some(&t.stack.tenant_key),
            Some(
                &json!({
                    "name": "billing",
                    "agent": "assistant",
                    "allow_senders": ["alice@example.com"],
                    "input_template": "{{ mail.text | trim }}{% for a in mail.attachments %} [{{ a.name }}, {{ a.bytes }} bytes]{% endfor %}",
                })
                .to_string(),
            ),
            &[],
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let mailbox: MailboxCreated = serde_json::from_value(v).unwrap();
    assert_eq!(mailbox.address, "billing@armada.local");
    let id = mailbox.mailbox_id.clone();

    // The same address again, by anyone: taken.
    let (s, v) = t
        .raw(
            Method::POST,
            "/v1/mailboxes",
            Some(&t.stack.tenant_key),
            Some(&json!({"name": "billing", "agent": "assistant", "allow_senders": ["@example.com"]}).to_string()),
            &[],
        )
        .await;
    assert_eq!(
        (s, armada_tests::error_code(&v).as_deref()),
        (409, Some("ADDRESS_TAKEN")),
        "{v}"
    );

    // A multipart message: its text part in ISO-8859-1, a CSV attached.
    let dir = std::env::temp_dir().join(format!("armada-mail-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let latin1 = dir.join("body.txt");
    std::fs::write(&latin1, b"Die Rechnung f\xfcr M\xe4rz fehlt.\n").unwrap();
    let csv = dir.join("march.csv");
    std::fs::write(&csv, b"invoice,total\n1,42\n").unwrap();
    let (ok, said) = swaks(
        &server,
        "alice@example.com",
        "billing@armada.local",
        &[
            "--header",
            "Subject: Rechnung",
            "--header",
            "Message-ID: <m1@example.com>",
            "--attach-type",
            "text/plain; charset=ISO-8859-1",
            "--attach-body",
            &format!("@{}", latin1.display()),
            "--attach-type",
            "text/csv",
            "--attach",
            &format!("@{}", csv.display()),
        ],
    );
    assert!(ok, "{said}");
    let first = answered(&t, &id, "m1@example.com").await;
    assert_eq!(first.outcome, MailOutcome::Started, "{first:?}");
    let run = t.wait_closed(first.run_id.as_deref().unwrap()).await;
    assert_eq!(run.state.outcome(), RunState::Completed, "{run:?}");
    assert_eq!(
        run.input.as_deref(),
        Some("Die Rechnung für März fehlt. [march.csv, 19 bytes]")
    );
    let Some(Trigger::Email {
        ref from,
        ref subject,
        ref attachments,
        ..
    }) = run.trigger
    else {
        panic!("{:?}", run.trigger)
    };
    assert_eq!(
        (from.as_str(), subject.as_str()),
        ("alice@example.com", "Rechnung")
    );
    // The attachment is stored with the Run, as sent.
    let stored = t
        .stack
        .svc
        .payloads
        .get_bytes_bounded(&attachments[0].key, 1024)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, b"invoice,total\n1,42\n");
    let session = run.session_id.clone().unwrap();

    // The reply: threaded, automatic, its subject `Re:` once, the answer.
    let reply = reply_to(&t.outbox, "m1@example.com").await;
    assert_eq!(reply.from, "billing@armada.local");
    assert_eq!(reply.subject, "Re: Rechnung");
    assert_eq!(reply.references, ["m1@example.com"]);
    assert!(reply.automatic, "Auto-Submitted: auto-replied");
    assert_eq!(reply.text.trim(), run.output.as_deref().unwrap().trim());
    let reply_id = reply.message_id.clone().unwrap();

    // Alice answers the reply: the next message of the same session,
    // which sees her first message.
    let (ok, said) = swaks(
        &server,
        "alice@example.com",
        "billing@armada.local",
        &[
            "--header",
            "Subject: Re: Rechnung",
            "--header",
            "Message-ID: <m2@example.com>",
            "--header",
            &format!("In-Reply-To: <{reply_id}>"),
            "--header",
            &format!("References: <m1@example.com> <{reply_id}>"),
            "--body",
            "/recall",
        ],
    );
    assert!(ok, "{said}");
    let second = answered(&t, &id, "m2@example.com").await;
    assert_eq!(second.outcome, MailOutcome::Started, "{second:?}");
    let next = t.wait_closed(second.run_id.as_deref().unwrap()).await;
    assert_eq!(next.session_id.as_deref(), Some(session.as_str()));
    assert!(
        next.output
            .as_deref()
            .unwrap()
            .contains("Die Rechnung für März fehlt."),
        "{next:?}"
    );
    let threaded = reply_to(&t.outbox, "m2@example.com").await;
    assert_eq!(threaded.subject, "Re: Rechnung");
    assert_eq!(
        threaded.references,
        ["m1@example.com", reply_id.as_str(), "m2@example.com"]
    );

    // A stranger and an automatic message are recorded and start nothing.
    let (ok, said) = swaks(
        &server,
        "eve@evil.example",
        "billing@armada.local",
        &["--header", "Message-ID: <e1@evil.example>", "--body", "hi"],
    );
    assert!(ok, "{said}");
    let (ok, said) = swaks(
        &server,
        "alice@example.com",
        "billing@armada.local",
        &[
            "--header",
            "Message-ID: <ooo@example.com>",
            "--header",
            "Auto-Submitted: auto-replied",
            "--body",
            "I am out of the office.",
        ],
    );
    assert!(ok, "{said}");
    for mid in ["e1@evil.example", "ooo@example.com"] {
        let m = answered(&t, &id, mid).await;
        assert_eq!(
            (m.outcome, m.run_id.as_deref()),
            (MailOutcome::Refused, None),
            "{m:?}"
        );
    }

    // An address that is no mailbox is refused in the SMTP dialogue.
    let (ok, said) = swaks(
        &server,
        "alice@example.com",
        "nobody@armada.local",
        &["--body", "hi"],
    );
    assert!(!ok && said.contains("550"), "{said}");

    let _ = std::fs::remove_dir_all(&dir);
    t.stack.stop().await;
}
