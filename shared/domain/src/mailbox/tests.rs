use serde_json::json;

use super::mail::{InboundMail, MailVerdict};
use super::reply::{build, reply_subject};
use super::*;
use crate::machine::Machine;

fn mailbox(body: Value) -> Mailbox {
    let (spec, enabled) = MailboxSpec::parse(&body).unwrap();
    Mailbox::new("mbx_1", "acme", "armada.local", spec, enabled, 1_000)
}

fn support() -> Mailbox {
    mailbox(json!({"name": "support", "agent": "helper",
        "allow_senders": ["alice@example.com", "@partner.example"]}))
}

#[test]
fn a_create_request_is_read_field_by_field() {
    let m = support();
    assert_eq!(m.address, "support@armada.local");
    assert!(m.spec.reply && m.enabled());
    assert!(m.spec.allows("Alice@Example.com"));
    assert!(m.spec.allows("bob@partner.example"));
    assert!(!m.spec.allows("bob@example.com"));
    assert!(!m.spec.allows("eve@evil-partner.example"));
    for (body, field) in [
        (json!({"agent": "a", "allow_senders": ["a@b.c"]}), "name"),
        (
            json!({"name": "Support!", "agent": "a", "allow_senders": ["a@b.c"]}),
            "name",
        ),
        (json!({"name": "s", "agent": "a"}), "allow_senders"),
        (
            json!({"name": "s", "agent": "a", "allow_senders": []}),
            "allow_senders",
        ),
        (
            json!({"name": "s", "agent": "a", "allow_senders": ["nobody"]}),
            "allow_senders",
        ),
        (
            json!({"name": "s", "chain": ["a"], "allow_senders": ["a@b.c"]}),
            "chain",
        ),
        (
            json!({"name": "s", "agent": "a", "allow_senders": ["a@b.c"], "input_template": "{% if %}"}),
            "input_template",
        ),
        (
            json!({"name": "s", "agent": "a", "allow_senders": ["a@b.c"], "cc": "x"}),
            "cc",
        ),
    ] {
        let e = MailboxSpec::parse(&body).unwrap_err();
        assert!(e.field.starts_with(field), "{body}: {e}");
    }
}

/// A multipart message as a mail client sends it: a text part in
/// ISO-8859-1, quoted-printable; an HTML alternative; a base64 attachment.
const MULTIPART: &str = "From: Alice <alice@example.com>\r\n\
To: support@armada.local\r\n\
Subject: =?ISO-8859-1?Q?Gr=FC=DFe_aus_K=F6ln?=\r\n\
Message-ID: <m1@example.com>\r\n\
MIME-Version: 1.0\r\n\
Content-Type: multipart/mixed; boundary=\"outer\"\r\n\
\r\n\
--outer\r\n\
Content-Type: multipart/alternative; boundary=\"inner\"\r\n\
\r\n\
--inner\r\n\
Content-Type: text/plain; charset=ISO-8859-1\r\n\
Content-Transfer-Encoding: quoted-printable\r\n\
\r\n\
Die Rechnung f=FCr M=E4rz fehlt.\r\n\
--inner\r\n\
Content-Type: text/html; charset=utf-8\r\n\
\r\n\
<p>Die Rechnung f\u{fc}r M\u{e4}rz fehlt.</p>\r\n\
--inner--\r\n\
--outer\r\n\
Content-Type: text/csv; name=\"march.csv\"\r\n\
Content-Disposition: attachment; filename=\"march.csv\"\r\n\
Content-Transfer-Encoding: base64\r\n\
\r\n\
aW52b2ljZSx0b3RhbAoxLDQyCg==\r\n\
--outer--\r\n";

#[test]
fn a_multipart_message_is_read_with_its_charset_and_attachment() {
    let mail = InboundMail::parse(MULTIPART.as_bytes(), Some("<alice@example.com>")).unwrap();
    assert_eq!(mail.from, "alice@example.com");
    assert_eq!(mail.envelope_from.as_deref(), Some("alice@example.com"));
    assert_eq!(mail.subject, "Grüße aus Köln");
    assert_eq!(mail.message_id.as_deref(), Some("m1@example.com"));
    assert_eq!(mail.text.trim(), "Die Rechnung für März fehlt.");
    assert_eq!(mail.attachments.len(), 1);
    let a = &mail.attachments[0];
    assert_eq!(
        (a.name.as_str(), a.content_type.as_str()),
        ("march.csv", "text/csv")
    );
    assert_eq!(a.bytes, b"invoice,total\n1,42\n");
    assert!(!mail.automatic);
    assert_eq!(
        mail.verdict(&support(), &["support@armada.local"]),
        MailVerdict::Start
    );
}

#[test]
fn an_html_only_message_is_read_as_text() {
    let raw = "From: alice@example.com\r\nSubject: hi\r\nContent-Type: text/html\r\n\r\n<p>Hello <b>there</b></p>\r\n";
    let mail = InboundMail::parse(raw.as_bytes(), None).unwrap();
    assert!(mail.text.contains("Hello there"), "{:?}", mail.text);
}

#[test]
fn strangers_automatic_mail_and_the_stacks_own_start_nothing() {
    let m = support();
    let own = ["support@armada.local", "approvals@example.com"];
    let with = |headers: &str, envelope: Option<&str>| {
        let raw = format!("{headers}Subject: x\r\n\r\nbody\r\n");
        InboundMail::parse(raw.as_bytes(), envelope)
            .unwrap()
            .verdict(&m, &own)
    };
    let refused = |v: MailVerdict| matches!(v, MailVerdict::Refused(_));
    assert_eq!(
        with("From: alice@example.com\r\n", None),
        MailVerdict::Start
    );
    assert!(refused(with("From: mallory@example.com\r\n", None)));
    // A forged From: the envelope sender must be allowed too.
    assert!(refused(with(
        "From: alice@example.com\r\n",
        Some("mallory@evil.example")
    )));
    assert!(refused(with(
        "From: alice@example.com\r\nAuto-Submitted: auto-replied\r\n",
        None
    )));
    assert!(refused(with(
        "From: alice@example.com\r\nPrecedence: bulk\r\n",
        None
    )));
    assert_eq!(
        with("From: alice@example.com\r\nAuto-Submitted: no\r\n", None),
        MailVerdict::Start
    );
    assert!(refused(with("From: support@armada.local\r\n", None)));
}

#[test]
fn a_reply_is_threaded_automatic_and_re_once() {
    assert_eq!(reply_subject("Invoice"), "Re: Invoice");
    assert_eq!(reply_subject("Re: RE: re:Invoice"), "Re: Invoice");
    let first = InboundMail::parse(MULTIPART.as_bytes(), None).unwrap();
    let eml = build(
        &first,
        "support@armada.local",
        "r1@armada.local",
        "It is attached now.",
    );
    let reply = InboundMail::parse(eml.as_bytes(), None).unwrap();
    assert_eq!(reply.from, "support@armada.local");
    assert_eq!(reply.subject, "Re: Grüße aus Köln");
    assert_eq!(reply.in_reply_to, ["m1@example.com"]);
    assert_eq!(reply.references, ["m1@example.com"]);
    assert_eq!(reply.message_id.as_deref(), Some("r1@armada.local"));
    assert!(reply.automatic, "Auto-Submitted: auto-replied");
    assert_eq!(reply.text.trim(), "It is attached now.");
    // Alice answers the reply: her mail names the whole thread.
    let answer = "From: alice@example.com\r\nSubject: Re: Re: Grüße aus Köln\r\nMessage-ID: <m2@example.com>\r\nIn-Reply-To: <r1@armada.local>\r\nReferences: <m1@example.com> <r1@armada.local>\r\n\r\nThanks!\r\n";
    let answer = InboundMail::parse(answer.as_bytes(), None).unwrap();
    assert_eq!(
        answer.thread(),
        ["m1@example.com", "r1@armada.local", "m2@example.com"]
    );
    let next = build(
        &answer,
        "support@armada.local",
        "r2@armada.local",
        "You are welcome.",
    );
    let next = InboundMail::parse(next.as_bytes(), None).unwrap();
    assert_eq!(next.subject, "Re: Grüße aus Köln");
    assert_eq!(
        next.references,
        ["m1@example.com", "r1@armada.local", "m2@example.com"]
    );
}

#[test]
fn a_mailbox_changes_only_through_its_machine() {
    let mut m = support();
    assert_eq!(m.apply(MailboxEvent::Enable(false), 2_000), Ok(vec![]));
    assert!(!m.enabled());
    m.apply(
        MailboxEvent::AllowSenders(vec!["@example.com".into()]),
        3_000,
    )
    .unwrap();
    assert!(m.spec.allows("bob@example.com"));
    assert_eq!(m.version, 3);
    m.apply(MailboxEvent::Delete, 4_000).unwrap();
    assert_eq!(
        m.apply(MailboxEvent::Enable(true), 5_000),
        Err(MailboxRefusal::Deleted)
    );
}
