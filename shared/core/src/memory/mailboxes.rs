//! Mailboxes, their mail, their hourly counters and their replies in
//! memory.

use async_trait::async_trait;

use armada_domain::mailbox::receipt::MailReceipt;
use armada_domain::mailbox::reply::{ReplyRecord, ReplyState};
use armada_domain::mailbox::{Mailbox, MailboxState};

use super::{conflict, Memory};
use crate::error::StoreError;
use crate::ports::Mailboxes;

#[async_trait]
impl Mailboxes for Memory {
    async fn create(&self, mailbox: &Mailbox) -> Result<(), StoreError> {
        let mut st = self.state();
        let taken = st
            .mailboxes
            .values()
            .any(|m| m.address == mailbox.address || m.mailbox_id == mailbox.mailbox_id);
        if taken {
            return Err(conflict(None));
        }
        st.mailboxes
            .insert(mailbox.mailbox_id.clone(), mailbox.clone());
        Ok(())
    }

    async fn get(&self, mailbox_id: &str) -> Result<Option<Mailbox>, StoreError> {
        Ok(self.state().mailboxes.get(mailbox_id).cloned())
    }

    async fn at_address(&self, address: &str) -> Result<Option<Mailbox>, StoreError> {
        Ok(self
            .state()
            .mailboxes
            .values()
            .find(|m| m.address == address)
            .cloned())
    }

    async fn update(&self, prev_version: u64, mailbox: &Mailbox) -> Result<(), StoreError> {
        let mut st = self.state();
        match st.mailboxes.get(&mailbox.mailbox_id) {
            Some(m) if m.version == prev_version => {}
            _ => return Err(conflict(None)),
        }
        if mailbox.state() == MailboxState::Deleted {
            st.mailboxes.remove(&mailbox.mailbox_id);
        } else {
            st.mailboxes
                .insert(mailbox.mailbox_id.clone(), mailbox.clone());
        }
        Ok(())
    }

    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Mailbox>, StoreError> {
        let mut out: Vec<Mailbox> = self
            .state()
            .mailboxes
            .values()
            .filter(|m| m.tenant == tenant)
            .cloned()
            .collect();
        out.sort_by_key(|m| std::cmp::Reverse((m.created_at_ms, m.mailbox_id.clone())));
        out.truncate(limit);
        Ok(out)
    }

    async fn record_mail(&self, receipt: &MailReceipt) -> Result<(), StoreError> {
        self.state().mail_receipts.push(receipt.clone());
        Ok(())
    }

    async fn mail(&self, mailbox_id: &str, limit: usize) -> Result<Vec<MailReceipt>, StoreError> {
        let mut out: Vec<MailReceipt> = self
            .state()
            .mail_receipts
            .iter()
            .filter(|r| r.mailbox_id == mailbox_id)
            .cloned()
            .collect();
        out.sort_by_key(|r| std::cmp::Reverse((r.received_at_ms, r.mail_id.clone())));
        out.truncate(limit);
        Ok(out)
    }

    async fn count_start(
        &self,
        mailbox_id: &str,
        window_s: i64,
        limit: u32,
    ) -> Result<bool, StoreError> {
        let mut st = self.state();
        let n = st
            .mailbox_starts
            .entry((mailbox_id.to_string(), window_s))
            .or_default();
        if *n >= limit {
            return Ok(false);
        }
        *n += 1;
        Ok(true)
    }

    async fn reply(&self, message_id: &str) -> Result<Option<ReplyRecord>, StoreError> {
        Ok(self.state().replies.get(message_id).cloned())
    }

    async fn create_reply(&self, reply: &ReplyRecord) -> Result<(), StoreError> {
        let mut st = self.state();
        if st.replies.contains_key(&reply.message_id) {
            return Err(conflict(None));
        }
        st.replies.insert(reply.message_id.clone(), reply.clone());
        Ok(())
    }

    async fn update_reply(&self, prev: ReplyState, reply: &ReplyRecord) -> Result<(), StoreError> {
        let mut st = self.state();
        match st.replies.get(&reply.message_id) {
            Some(r) if r.state() == prev => {}
            _ => return Err(conflict(None)),
        }
        st.replies.insert(reply.message_id.clone(), reply.clone());
        Ok(())
    }
}
