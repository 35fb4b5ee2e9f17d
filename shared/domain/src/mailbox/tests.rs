use serde_json::json;

use super::mail::{InboundMail, MailVerdict};
use super::notice::ReceivedNotice;
use super::receipt::{MailOutcome, MailReceipt, ReceiptEvent};
use super::reply::{
    build, reply_subject, Original, ReplyEvent, ReplyRecord, ReplyState, SentAlready,
};
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
    let own = [
        "support@armada.local",
        "approvals@example.com",
        "@armada.local",
    ];
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
    // Another mailbox of the stack: its own domain.
    assert!(matches!(
        with("From: sales@Armada.Local\r\n", None),
        MailVerdict::Refused(r) if r.contains("the stack itself")
    ));
}

#[test]
fn a_reply_is_threaded_automatic_and_re_once() {
    assert_eq!(reply_subject("Invoice"), "Re: Invoice");
    assert_eq!(reply_subject("Re: RE: re:Invoice"), "Re: Invoice");
    let first = InboundMail::parse(MULTIPART.as_bytes(), None).unwrap();
    let eml = build(
        &Original::from(&first),
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
        &Original::from(&answer),
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
    let off = MailboxPatch::parse(&json!({"enabled": false})).unwrap();
    assert_eq!(m.apply(MailboxEvent::Update(off), 2_000), Ok(vec![]));
    assert!(!m.enabled());
    let senders =
        MailboxPatch::parse(&json!({"allow_senders": ["@Example.com"], "input_template": null}))
            .unwrap();
    m.apply(MailboxEvent::Update(senders), 3_000).unwrap();
    assert!(m.spec.allows("bob@example.com"));
    assert!(!m.spec.allows("alice@partner.example"));
    assert_eq!(m.version, 3);
    assert_eq!(m.spec.name, "support", "the address stays");
    m.apply(MailboxEvent::Delete, 4_000).unwrap();
    assert_eq!(
        m.apply(MailboxEvent::Update(MailboxPatch::default()), 5_000),
        Err(MailboxRefusal::Deleted)
    );
    for (body, field) in [
        (json!({"name": "other"}), "name"),
        (json!({"chain": ["a", "b"]}), "chain"),
        (json!({"allow_senders": []}), "allow_senders"),
        (json!({"max_runs_per_hour": 0}), "max_runs_per_hour"),
        (json!({"input_template": "{% for %}"}), "input_template"),
    ] {
        let e = MailboxPatch::parse(&body).unwrap_err();
        assert!(e.field.starts_with(field), "{body}: {e}");
    }
}

#[test]
fn a_message_is_answered_once() {
    let mut r = MailReceipt::received(
        "mail_1",
        "mbx_1",
        "acme",
        "alice@example.com",
        "Hi",
        Some("m1@example.com"),
        1_000,
    );
    r.apply(
        ReceiptEvent::Started {
            run_id: "run_1".into(),
        },
        2_000,
    )
    .unwrap();
    assert_eq!(r.outcome(), MailOutcome::Started);
    assert_eq!(r.run_id.as_deref(), Some("run_1"));
    assert!(r.apply(ReceiptEvent::Disabled, 3_000).is_err());
    assert_eq!(r.outcome(), MailOutcome::Started);
}

#[test]
fn a_reply_is_sent_once() {
    let mut r = ReplyRecord::sending(
        "run_1@armada.local",
        "mbx_1",
        "acme",
        "run_1",
        Some("ses_1"),
        "Alice@example.com",
        1_000,
    );
    assert_eq!(r.to, "alice@example.com");
    assert_eq!(r.version(), ReplyState::Sending);
    r.apply(ReplyEvent::Sent, 2_000).unwrap();
    assert_eq!((r.state(), r.sent_at_ms), (ReplyState::Sent, Some(2_000)));
    assert_eq!(r.apply(ReplyEvent::Sent, 3_000), Err(SentAlready));
}

/// What SES publishes for a message its receipt rule stored (AWS's
/// documented example of a notice for an S3 action, trimmed).
const SES_NOTICE: &str = r#"{
  "notificationType": "Received",
  "receipt": {
    "timestamp": "2015-09-11T20:32:33.936Z",
    "processingTimeMillis": 406,
    "recipients": ["recipient@example.com"],
    "spamVerdict": {"status": "PASS"},
    "virusVerdict": {"status": "PASS"},
    "spfVerdict": {"status": "PASS"},
    "dkimVerdict": {"status": "PASS"},
    "dmarcVerdict": {"status": "GRAY"},
    "action": {
      "type": "S3",
      "topicArn": "arn:aws:sns:us-east-1:012345678912:example-topic",
      "bucketName": "amzn-s3-demo-bucket",
      "objectKey": "email"
    }
  },
  "mail": {
    "timestamp": "2015-09-11T20:32:33.936Z",
    "source": "61967230-7A45-4A9D-BEC9-87CBCF2211C9@example.com",
    "messageId": "d6iitobk75ur44p8kdnnp7g2n800",
    "destination": ["recipient@example.com"],
    "headersTruncated": false
  }
}"#;

#[test]
fn an_ses_notice_says_where_the_message_is_and_how_its_checks_went() {
    let n = ReceivedNotice::parse(SES_NOTICE).unwrap();
    let stored = n.stored().unwrap();
    assert_eq!(stored.bucket, "amzn-s3-demo-bucket");
    assert_eq!(n.receipt.recipients, ["recipient@example.com"]);
    assert_eq!(n.mail.message_id, "d6iitobk75ur44p8kdnnp7g2n800");
    assert_eq!(
        n.failed_checks().as_deref(),
        Some("SES's checks did not pass: DMARC GRAY")
    );
    // Through SNS without raw delivery: the notice is the envelope's Message.
    let wrapped = json!({"Type": "Notification", "TopicArn": "arn:aws:sns:us-east-1:1:t", "Message": SES_NOTICE.replace("GRAY", "PASS")});
    let n = ReceivedNotice::parse(&wrapped.to_string()).unwrap();
    assert_eq!(n.failed_checks(), None);
    // Not checked at all (the local listener) is not a failure.
    let unchecked = SES_NOTICE
        .replace("GRAY", "DISABLED")
        .replace("PASS", "DISABLED");
    assert_eq!(
        ReceivedNotice::parse(&unchecked).unwrap().failed_checks(),
        None
    );
    let bounce = json!({"notificationType": "Bounce"}).to_string();
    assert!(ReceivedNotice::parse(&bounce).unwrap().stored().is_err());
    assert!(ReceivedNotice::parse("{").is_err());
}
