//! Mail to the deployment's mailboxes: SES (or the local listener) stored
//! a message in the payload bucket and said so on the mail topic; each
//! recipient that is a mailbox answers it once: disabled, refused (SES's
//! checks, a sender it does not allow, automatic mail, the stack's own),
//! a repeat of a message that started a Run, over its hourly budget, or a
//! Run started with the message as its input and its attachments stored
//! with it. A message answering one of the mailbox's replies continues
//! that conversation: it is the next message of the reply's session.
//! Each answer is recorded through its machine.

use serde::Serialize;

use armada_domain::api::{CreateRun, KeyRole, RunTarget};
use armada_domain::hook::template;
use armada_domain::machine::Machine;
use armada_domain::mailbox::mail::{InboundMail, MailVerdict};
use armada_domain::mailbox::notice::ReceivedNotice;
use armada_domain::mailbox::receipt::{MailReceipt, ReceiptEvent};
use armada_domain::mailbox::Mailbox;
use armada_domain::run::{Artifact, Trigger};
use armada_domain::session::{OnBusy, SessionHeader};

use crate::clock::new_id;
use crate::error::StoreError;
use crate::services::auth::TenantKey;
use crate::services::deliveries::hour_window;
use crate::services::starting::{self, NewRun, StartRefused};
use crate::Services;

/// The largest message read: SES's own limit for received mail.
pub const MAX_MESSAGE_BYTES: u64 = 40 * 1024 * 1024;
/// The most ids of a thread looked up for its conversation.
const MAX_THREAD_LOOKUPS: usize = 20;

/// What a mailbox's template sees.
#[derive(Debug, Serialize)]
struct MailContext<'a> {
    mail: MailFields<'a>,
    mailbox: MailboxFields<'a>,
}

#[derive(Debug, Serialize)]
struct MailFields<'a> {
    from: &'a str,
    subject: &'a str,
    text: &'a str,
    message_id: &'a str,
    attachments: &'a [Artifact],
}

#[derive(Debug, Serialize)]
struct MailboxFields<'a> {
    mailbox_id: &'a str,
    address: &'a str,
}

/// Answers a notice from the mail queue. An outage is an error (the
/// notice is retried; what was answered before answers as a repeat); a
/// notice that is not one, or names no mailbox, is dropped with a log.
pub async fn receive(svc: &Services, body: &str) -> Result<(), StoreError> {
    let notice = match ReceivedNotice::parse(body) {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(error = %e, "a mail-queue message that is no SES notice dropped");
            return Ok(());
        }
    };
    let stored = match notice.stored() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, ses_id = %notice.mail.message_id, "a mail notice without its message dropped");
            return Ok(());
        }
    };
    if stored.bucket != svc.cfg.payload_bucket {
        tracing::error!(security = true, bucket = %stored.bucket, "a mail notice naming another bucket dropped");
        return Ok(());
    }
    let mut recipients: Vec<String> = notice
        .receipt
        .recipients
        .iter()
        .map(|r| r.trim().to_ascii_lowercase())
        .filter(|r| r.rsplit_once('@').map(|(_, d)| d) == Some(svc.cfg.inbox.domain.as_str()))
        .collect();
    recipients.sort();
    recipients.dedup();
    let mut raw: Option<Vec<u8>> = None;
    for address in recipients {
        let Some(mailbox) = svc.mailboxes.at_address(&address).await? else {
            tracing::info!(address, ses_id = %notice.mail.message_id, "mail for an address that is no mailbox dropped");
            continue;
        };
        if raw.is_none() {
            raw = Some(
                match svc
                    .payloads
                    .get_bytes_bounded(&stored.key, MAX_MESSAGE_BYTES)
                    .await?
                {
                    Ok(bytes) => bytes,
                    Err(size) => {
                        tracing::warn!(size, key = %stored.key, "a received message over 40 MiB dropped");
                        return Ok(());
                    }
                },
            );
        }
        let raw = raw.as_deref().unwrap_or_default();
        answer(svc, &mailbox, &notice, raw).await?;
    }
    Ok(())
}

/// Answers one message for one mailbox and records how; an outage is
/// returned unrecorded (the notice is retried).
async fn answer(
    svc: &Services,
    mailbox: &Mailbox,
    notice: &ReceivedNotice,
    raw: &[u8],
) -> Result<(), StoreError> {
    let now = svc.clock.now_ms();
    let envelope = notice.mail.source.as_deref();
    let parsed = InboundMail::parse(raw, envelope);
    let (from, subject, message_id) = match &parsed {
        Ok(m) => (
            m.from.clone(),
            m.subject.clone(),
            m.message_id
                .clone()
                .unwrap_or_else(|| notice.mail.message_id.clone()),
        ),
        Err(_) => (
            envelope.unwrap_or_default().to_ascii_lowercase(),
            String::new(),
            notice.mail.message_id.clone(),
        ),
    };
    let mut receipt = MailReceipt::received(
        &new_id("mail"),
        &mailbox.mailbox_id,
        &mailbox.tenant,
        &from,
        &subject,
        Some(&message_id),
        now,
    );
    let event = match decide(svc, mailbox, notice, parsed, &message_id, &receipt).await {
        Ok(event) => event,
        Err(Outage(e)) => return Err(e),
    };
    tracing::info!(mailbox_id = %mailbox.mailbox_id, mail_id = %receipt.mail_id, event = ?event, "mail answered");
    if receipt.apply(event, now).is_ok() {
        if let Err(e) = svc.mailboxes.record_mail(&receipt).await {
            tracing::warn!(mailbox_id = %mailbox.mailbox_id, mail_id = %receipt.mail_id, error = %e, "a message's record was not written");
        }
    }
    Ok(())
}

/// An outage: nothing is recorded, the notice is retried.
struct Outage(StoreError);

impl From<StoreError> for Outage {
    fn from(e: StoreError) -> Self {
        Outage(e)
    }
}

async fn decide(
    svc: &Services,
    mailbox: &Mailbox,
    notice: &ReceivedNotice,
    parsed: Result<InboundMail, armada_domain::mailbox::mail::Unreadable>,
    message_id: &str,
    receipt: &MailReceipt,
) -> Result<ReceiptEvent, Outage> {
    if !mailbox.enabled() {
        return Ok(ReceiptEvent::Disabled);
    }
    if let Some(reason) = notice.failed_checks() {
        return Ok(ReceiptEvent::Refused { reason });
    }
    let mail = match parsed {
        Ok(m) => m,
        Err(e) => {
            return Ok(ReceiptEvent::Rejected {
                reason: format!("UNREADABLE_MAIL: {e}"),
            })
        }
    };
    // Every address of the inbound domain is the stack's own: mailboxes
    // never start each other.
    let own_domain = format!("@{}", svc.cfg.inbox.domain);
    let own = [
        mailbox.address.as_str(),
        svc.cfg.approval_sender.as_str(),
        own_domain.as_str(),
    ];
    if let MailVerdict::Refused(reason) = mail.verdict(mailbox, &own) {
        return Ok(ReceiptEvent::Refused { reason });
    }
    // A repeat answers the first Run, whatever the budget says now.
    let idem_key = format!("mail:{}:{message_id}", mailbox.mailbox_id);
    if let Some(first) = svc.idempotency.get(&mailbox.tenant, &idem_key).await? {
        return Ok(ReceiptEvent::Duplicate {
            run_id: first.run_id,
        });
    }
    let (window, _) = hour_window(receipt.received_at_ms);
    let max = mailbox.spec.max_runs_per_hour;
    if !svc
        .mailboxes
        .count_start(&mailbox.mailbox_id, window, max)
        .await?
    {
        return Ok(ReceiptEvent::RateLimited);
    }
    let attachments = store_attachments(svc, mailbox, receipt, &mail).await?;
    let ctx = MailContext {
        mail: MailFields {
            from: &mail.from,
            subject: &mail.subject,
            text: &mail.text,
            message_id,
            attachments: &attachments,
        },
        mailbox: MailboxFields {
            mailbox_id: &mailbox.mailbox_id,
            address: &mailbox.address,
        },
    };
    let input = template::render_input(mailbox.spec.template(), &ctx, "mailbox");
    let input = match input {
        Ok(input) => input,
        Err(why) => {
            return Ok(ReceiptEvent::Rejected {
                reason: format!("TEMPLATE_ERROR: {why}"),
            })
        }
    };
    let trigger = Trigger::Email {
        mailbox_id: mailbox.mailbox_id.clone(),
        message_id: message_id.to_string(),
        from: mail.from.clone(),
        subject: mail.subject.clone(),
        thread: mail.thread(),
        attachments,
    };
    let idem = (idem_key, message_id.to_string());
    match start(svc, mailbox, &mail, input, trigger, idem).await {
        Ok(accepted) if accepted.replayed == Some(true) => Ok(ReceiptEvent::Duplicate {
            run_id: accepted.run_id,
        }),
        Ok(accepted) => Ok(ReceiptEvent::Started {
            run_id: accepted.run_id,
        }),
        Err(StartRefused::Store(e)) => Err(Outage(e)),
        Err(e @ (StartRefused::NotQueued | StartRefused::Contended(_))) => {
            Err(Outage(StoreError::Retryable(e.to_string())))
        }
        Err(e) => Ok(ReceiptEvent::Rejected {
            reason: e.to_string(),
        }),
    }
}

/// A file name as a key's last part: its letters, digits, `.`, `-`, `_`.
fn safe_name(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    match cleaned.trim_matches('.') {
        "" => "attachment".into(),
        n => n.to_string(),
    }
}

/// Stores a message's attachments in the payload bucket, beside its record.
async fn store_attachments(
    svc: &Services,
    mailbox: &Mailbox,
    receipt: &MailReceipt,
    mail: &InboundMail,
) -> Result<Vec<Artifact>, StoreError> {
    let mut out = Vec::new();
    for (i, a) in mail.attachments.iter().enumerate() {
        let key = format!(
            "mail/{}/{}/{}/{i}-{}",
            mailbox.tenant,
            mailbox.mailbox_id,
            receipt.mail_id,
            safe_name(&a.name)
        );
        svc.payloads
            .put_bytes(&key, &a.bytes, &a.content_type)
            .await?;
        out.push(Artifact {
            name: a.name.clone(),
            content_type: a.content_type.clone(),
            bytes: a.bytes.len() as u64,
            key,
        });
    }
    Ok(out)
}

/// The conversation a message continues: the session of a reply of this
/// mailbox it answers, sent to its sender.
async fn conversation(
    svc: &Services,
    mailbox: &Mailbox,
    mail: &InboundMail,
) -> Result<Option<SessionHeader>, StoreError> {
    let mut ids: Vec<&String> = mail.in_reply_to.iter().chain(&mail.references).collect();
    ids.dedup();
    for id in ids.into_iter().rev().take(MAX_THREAD_LOOKUPS) {
        let Some(reply) = svc.mailboxes.reply(id).await? else {
            continue;
        };
        if reply.mailbox_id != mailbox.mailbox_id
            || reply.tenant != mailbox.tenant
            || reply.to != mail.from
        {
            continue;
        }
        if let Some(sid) = &reply.session_id {
            if let Some(h) = svc.sessions.header(sid).await? {
                if h.tenant == mailbox.tenant {
                    return Ok(Some(h));
                }
            }
        }
    }
    Ok(None)
}

/// Starts the message's Run as one the mailbox asked for: the next
/// message of the conversation it answers, or the first of a new one (an
/// agent's; a team's Run has no session).
async fn start(
    svc: &Services,
    mailbox: &Mailbox,
    mail: &InboundMail,
    input: String,
    trigger: Trigger,
    idem: (String, String),
) -> Result<starting::Accepted, StartRefused> {
    let as_mailbox = TenantKey {
        tenant: mailbox.tenant.clone(),
        key_id: mailbox.mailbox_id.clone(),
        role: KeyRole::Member,
        owner: None,
    };
    let session = match conversation(svc, mailbox, mail).await? {
        Some(h) => Some(h),
        None => match &mailbox.spec.target {
            RunTarget::Agent(agent) => {
                let agent = starting::agent_named(svc, agent).await?;
                let header = SessionHeader {
                    session_id: new_id("ses"),
                    tenant: mailbox.tenant.clone(),
                    agent: agent.name.clone(),
                    on_busy: OnBusy::Queue,
                    next_seq: 0,
                    done_seq: 0,
                    created_at_ms: svc.clock.now_ms(),
                };
                svc.sessions.create(&header).await?;
                Some(header)
            }
            _ => None,
        },
    };
    let cr = CreateRun {
        target: mailbox.spec.target.clone(),
        input,
        session_id: None,
        callback_url: None,
        metadata: serde_json::json!({}),
        started_from: Some(trigger),
    };
    match session {
        Some(header) => {
            let agent = starting::agent_named(svc, &header.agent).await?;
            let new = NewRun {
                session: Some(header),
                ..NewRun::of(&as_mailbox, &agent, cr, Some(idem))
            };
            starting::start_run(svc, new).await
        }
        None => starting::start_target(svc, &as_mailbox, cr, Some(idem)).await,
    }
}
