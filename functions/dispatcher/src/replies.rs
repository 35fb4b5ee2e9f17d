//! Replies: when a Run a mail started has ended, its answer goes back to
//! the sender from the mailbox, in the sender's thread. The reply's
//! record, by its `Message-ID` (the same each try), is written before it
//! is sent and marked sent after: a retried message sends it at most
//! again with the same id, never once more after it was marked, and a
//! mail answering it finds its conversation. A relay team's mail is
//! answered once its chain has ended, with how it ended.

use crate::Dispatcher;
use crate::Handled;
use armada_core::batch::Outcome;
use armada_core::cas::{change, Changed};
use armada_core::error::StoreError;
use armada_domain::mailbox::reply::{
    build, reply_body, reply_message_id, Original, ReplyEvent, ReplyRecord, ReplyState,
};
use armada_domain::run::{RunState, Trigger};

impl Dispatcher {
    pub(crate) async fn send_reply(&self, run_id: &str, tenant: &str) -> Handled {
        let Some(run) = self.load(run_id, tenant).await? else {
            return Ok(Outcome::Done);
        };
        // A relay team's mail is answered by its last step, with the
        // trigger of its first.
        let Some(Trigger::Email {
            mailbox_id,
            message_id,
            from,
            subject,
            thread,
            ..
        }) = &self.mail_of(&run).await?
        else {
            tracing::warn!(run_id, "a reply for a run no mail started dropped");
            return Ok(Outcome::Done);
        };
        let mailbox = match self.svc.mailboxes.get(mailbox_id).await? {
            Some(m) if m.tenant == run.tenant => m,
            _ => {
                tracing::info!(run_id, mailbox_id, "no reply: the mailbox is gone");
                return Ok(Outcome::Done);
            }
        };
        if !mailbox.spec.reply {
            return Ok(Outcome::Done);
        }
        let now = self.svc.clock.now_ms();
        let reply_id = reply_message_id(run_id, &self.svc.cfg.inbox.domain);
        let record = ReplyRecord::sending(
            &reply_id,
            &mailbox.mailbox_id,
            &run.tenant,
            run_id,
            run.session_id.as_deref(),
            from,
            now,
        );
        match self.svc.mailboxes.create_reply(&record).await {
            Ok(()) => {}
            Err(StoreError::Conflict { .. }) => {
                let sent = self.svc.mailboxes.reply(&reply_id).await?;
                if sent.is_some_and(|r| r.state() == ReplyState::Sent) {
                    tracing::info!(run_id, "the reply was sent already");
                    return Ok(Outcome::Done);
                }
            }
            Err(e) => return Err(e.into()),
        }
        let completed = run.state().outcome() == RunState::Completed;
        let output = match (&run.output, completed) {
            (Some(p), true) => self.svc.payloads.read(p).await?,
            _ => String::new(),
        };
        let body = reply_body(
            run_id,
            completed,
            &output,
            run.error.as_ref().map(|e| e.code.as_str()),
        );
        let original = Original {
            from: from.clone(),
            subject: subject.clone(),
            message_id: Some(message_id.clone()),
            thread: thread.clone(),
        };
        let message = build(&original, &mailbox.address, &reply_id, &body);
        if let Err(e) = self
            .svc
            .mail
            .send_raw(&mailbox.address, from, &message)
            .await
        {
            tracing::warn!(run_id, error = %e, "a reply was not sent; retrying");
            return Ok(Outcome::retry(format!("the reply was not sent: {e}")));
        }
        let marked = change(
            self.svc.mailboxes.as_ref(),
            &reply_id,
            || self.svc.clock.now_ms(),
            |_: &ReplyRecord| Some(ReplyEvent::Sent),
        )
        .await?;
        if !matches!(marked, Some(Changed::Written(..) | Changed::Refused(..))) {
            tracing::warn!(run_id, "a sent reply was not marked sent");
        }
        tracing::info!(run_id, mailbox_id = %mailbox.mailbox_id, "reply sent");
        Ok(Outcome::Done)
    }
}
