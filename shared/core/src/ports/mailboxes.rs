//! Mailboxes: each tenant's addresses (unique across tenants), the mail
//! each received, each one's hourly count of the Runs it started, and the
//! replies sent, by `Message-ID`.

use std::fmt::Debug;

use async_trait::async_trait;

use armada_domain::mailbox::receipt::MailReceipt;
use armada_domain::mailbox::reply::{ReplyRecord, ReplyState};
use armada_domain::mailbox::Mailbox;

use crate::cas::Versioned;
use crate::error::StoreError;

#[async_trait]
pub trait Mailboxes: Send + Sync + Debug {
    /// Writes a new mailbox with its address: a `Conflict` if the address
    /// is any mailbox's already (or the id exists).
    async fn create(&self, mailbox: &Mailbox) -> Result<(), StoreError>;
    /// Reads a mailbox (strongly consistent).
    async fn get(&self, mailbox_id: &str) -> Result<Option<Mailbox>, StoreError>;
    /// The mailbox of an address (lower-case), of any tenant.
    async fn at_address(&self, address: &str) -> Result<Option<Mailbox>, StoreError>;
    /// Writes `mailbox` if the stored one is still at `prev_version`; a
    /// mailbox its machine deleted is removed, and its address freed.
    async fn update(&self, prev_version: u64, mailbox: &Mailbox) -> Result<(), StoreError>;
    /// A tenant's mailboxes, newest first, at most `limit`.
    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Mailbox>, StoreError>;
    /// Records an answered message (kept 30 days).
    async fn record_mail(&self, receipt: &MailReceipt) -> Result<(), StoreError>;
    /// A mailbox's messages, newest first, at most `limit`.
    async fn mail(&self, mailbox_id: &str, limit: usize) -> Result<Vec<MailReceipt>, StoreError>;
    /// Counts one Run started by `mailbox_id` in the hour starting at
    /// `window_s`, unless `limit` were counted already: `false` then.
    async fn count_start(
        &self,
        mailbox_id: &str,
        window_s: i64,
        limit: u32,
    ) -> Result<bool, StoreError>;
    /// The reply with this `Message-ID` (without brackets).
    async fn reply(&self, message_id: &str) -> Result<Option<ReplyRecord>, StoreError>;
    /// Writes a reply about to be sent: a `Conflict` if it is recorded.
    async fn create_reply(&self, reply: &ReplyRecord) -> Result<(), StoreError>;
    /// Writes `reply` if the stored one is still `prev`.
    async fn update_reply(&self, prev: ReplyState, reply: &ReplyRecord) -> Result<(), StoreError>;
}

/// Mailboxes change through their machine with [`crate::cas::change`].
#[async_trait]
impl<T: Mailboxes + ?Sized> Versioned<Mailbox> for T {
    async fn read(&self, mailbox_id: &str) -> Result<Option<Mailbox>, StoreError> {
        self.get(mailbox_id).await
    }

    async fn write_if(&self, read: &u64, mailbox: &Mailbox) -> Result<(), StoreError> {
        self.update(*read, mailbox).await
    }
}

/// Replies change through their machine with [`crate::cas::change`].
#[async_trait]
impl<T: Mailboxes + ?Sized> Versioned<ReplyRecord> for T {
    async fn read(&self, message_id: &str) -> Result<Option<ReplyRecord>, StoreError> {
        self.reply(message_id).await
    }

    async fn write_if(&self, read: &ReplyState, reply: &ReplyRecord) -> Result<(), StoreError> {
        self.update_reply(*read, reply).await
    }
}
