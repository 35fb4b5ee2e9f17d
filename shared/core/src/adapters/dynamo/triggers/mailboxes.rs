//! Mailboxes in the triggers table: the mailbox (`pk = mailbox#<id>`,
//! `sk = mailbox`) with its mail (`sk = mail#<received at>#<id>`, kept 30
//! days) and hourly counters (`sk = count#<hour>`); its address's claim
//! (`pk = address#<address>`, `sk = address`), written and removed in one
//! transaction with the mailbox, so an address is one mailbox's across
//! every tenant; and each reply sent (`pk = reply#<Message-ID>`,
//! `sk = reply`, kept 180 days: how long a conversation may be answered).

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Delete, Put, TransactWriteItem};

use armada_domain::mailbox::receipt::MailReceipt;
use armada_domain::mailbox::reply::{ReplyRecord, ReplyState};
use armada_domain::mailbox::{Mailbox, MailboxState};

use super::super::item::{
    get_json, get_s, json, n, put_new, s, transact, ttl_after, written, Item,
};
use super::{TriggerStore, KEEP_DAYS};
use crate::error::{classify, StoreError};
use crate::ports::Mailboxes;

const KIND: &str = "mailbox";
const ADDRESS: &str = "address";
const REPLY: &str = "reply";
/// How long a reply is remembered: an answer to it after that starts a
/// new conversation.
const REPLY_KEEP_DAYS: i64 = 180;

fn item(m: &Mailbox) -> Item {
    TriggerStore::owned_item(
        KIND,
        &m.mailbox_id,
        &m.tenant,
        m.created_at_ms,
        m.version,
        m,
    )
}

fn address_key(address: &str) -> (String, String) {
    (TriggerStore::pk(ADDRESS, address), ADDRESS.to_string())
}

fn reply_item(r: &ReplyRecord) -> Item {
    let mut item = Item::new();
    item.insert("pk".into(), s(TriggerStore::pk(REPLY, &r.message_id)));
    item.insert("sk".into(), s(REPLY));
    item.insert("state".into(), s(state_name(r.state())));
    item.insert("doc".into(), json(r));
    item.insert(
        "purge_at".into(),
        ttl_after(r.created_at_ms, REPLY_KEEP_DAYS),
    );
    item
}

fn state_name(state: ReplyState) -> &'static str {
    match state {
        ReplyState::Sending => "sending",
        ReplyState::Sent => "sent",
    }
}

impl TriggerStore {
    /// Writes every item or none; a failed condition is a `Conflict`
    /// naming its item (1-based, as [`StoreError::Conflict`] does).
    async fn transact(&self, items: Vec<TransactWriteItem>) -> Result<(), StoreError> {
        let owners: Vec<Option<usize>> = (1..=items.len()).map(Some).collect();
        transact(&self.dynamo, items, &owners).await
    }

    fn put(&self, item: Item, condition: &str) -> Result<TransactWriteItem, StoreError> {
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression(condition)
            .build()
            .map_err(|e| StoreError::Terminal(e.to_string()))?;
        Ok(TransactWriteItem::builder().put(put).build())
    }
}

#[async_trait]
impl Mailboxes for TriggerStore {
    async fn create(&self, m: &Mailbox) -> Result<(), StoreError> {
        let (pk, sk) = address_key(&m.address);
        let mut claim = Item::new();
        claim.insert("pk".into(), s(pk));
        claim.insert("sk".into(), s(sk));
        claim.insert("mailbox_id".into(), s(&m.mailbox_id));
        self.transact(vec![
            self.put(item(m), "attribute_not_exists(pk)")?,
            self.put(claim, "attribute_not_exists(pk)")?,
        ])
        .await
    }

    async fn get(&self, mailbox_id: &str) -> Result<Option<Mailbox>, StoreError> {
        self.get_owned(KIND, mailbox_id).await
    }

    async fn at_address(&self, address: &str) -> Result<Option<Mailbox>, StoreError> {
        let (pk, sk) = address_key(address);
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .key("pk", s(pk))
            .key("sk", s(sk))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        match out.item() {
            Some(claim) => self.get(&get_s(claim, "mailbox_id")?).await,
            None => Ok(None),
        }
    }

    async fn update(&self, prev_version: u64, m: &Mailbox) -> Result<(), StoreError> {
        if m.state() != MailboxState::Deleted {
            return self
                .write_owned_if(KIND, &m.mailbox_id, prev_version, Some(item(m)))
                .await;
        }
        // Deleted: the mailbox and its address's claim go together.
        let (pk, sk) = address_key(&m.address);
        let mailbox = Delete::builder()
            .table_name(&self.table)
            .key("pk", s(Self::pk(KIND, &m.mailbox_id)))
            .key("sk", s(KIND))
            .condition_expression("attribute_exists(pk) AND version = :v")
            .expression_attribute_values(":v", n(prev_version))
            .build()
            .map_err(|e| StoreError::Terminal(e.to_string()))?;
        let claim = Delete::builder()
            .table_name(&self.table)
            .key("pk", s(pk))
            .key("sk", s(sk))
            .build()
            .map_err(|e| StoreError::Terminal(e.to_string()))?;
        self.transact(vec![
            TransactWriteItem::builder().delete(mailbox).build(),
            TransactWriteItem::builder().delete(claim).build(),
        ])
        .await
    }

    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Mailbox>, StoreError> {
        self.list_owned(KIND, tenant, limit).await
    }

    async fn record_mail(&self, r: &MailReceipt) -> Result<(), StoreError> {
        let mut item = Item::new();
        item.insert("pk".into(), s(Self::pk(KIND, &r.mailbox_id)));
        item.insert(
            "sk".into(),
            s(format!("mail#{:015}#{}", r.received_at_ms, r.mail_id)),
        );
        item.insert("doc".into(), json(r));
        item.insert("purge_at".into(), ttl_after(r.received_at_ms, KEEP_DAYS));
        put_new(&self.dynamo, &self.table, item, "pk").await
    }

    async fn mail(&self, mailbox_id: &str, limit: usize) -> Result<Vec<MailReceipt>, StoreError> {
        self.kept(KIND, mailbox_id, "mail#", limit).await
    }

    async fn count_start(
        &self,
        mailbox_id: &str,
        window_s: i64,
        limit: u32,
    ) -> Result<bool, StoreError> {
        written(self.count_owned(KIND, mailbox_id, window_s, limit).await)
    }

    async fn reply(&self, message_id: &str) -> Result<Option<ReplyRecord>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .key("pk", s(Self::pk(REPLY, message_id)))
            .key("sk", s(REPLY))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        out.item().map(|i| get_json(i, "doc")).transpose()
    }

    async fn create_reply(&self, r: &ReplyRecord) -> Result<(), StoreError> {
        put_new(&self.dynamo, &self.table, reply_item(r), "pk").await
    }

    async fn update_reply(&self, prev: ReplyState, r: &ReplyRecord) -> Result<(), StoreError> {
        self.dynamo
            .put_item()
            .table_name(&self.table)
            .set_item(Some(reply_item(r)))
            .condition_expression("#s = :prev")
            .expression_attribute_names("#s", "state")
            .expression_attribute_values(":prev", s(state_name(prev)))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }
}
