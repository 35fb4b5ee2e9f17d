//! The sessions table: per session, a header (turn 0), one item per history
//! turn (turn > 0) and one index item per accepted message (turn = -seq,
//! naming its Run), so the dispatcher can find the next message's Run with a
//! strongly consistent read.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{TransactWriteItem, Update};
use aws_sdk_dynamodb::Client;

use armada_domain::chat::Role;
use armada_domain::context::HistoryTurn;
use armada_domain::session::{OnBusy, SessionHeader};

use armada_domain::run::Payload;

use super::item::{get_n, get_s, n, opt_s, s, Item};
use super::runs::put;
use crate::adapters::s3::Payloads;
use crate::error::{classify, StoreError};
use crate::ports::{self, Blobs};

#[derive(Debug, Clone)]
pub struct SessionStore {
    dynamo: Client,
    table: String,
    /// Turns too large for an item live in S3.
    payloads: Payloads,
}

fn role_str(r: Role) -> &'static str {
    match r {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

fn parse_role(s: &str) -> Option<Role> {
    match s {
        "system" => Some(Role::System),
        "user" => Some(Role::User),
        "assistant" => Some(Role::Assistant),
        "tool" => Some(Role::Tool),
        _ => None,
    }
}

impl SessionStore {
    pub fn new(dynamo: Client, table: &str, payloads: Payloads) -> Self {
        SessionStore {
            dynamo,
            table: table.to_string(),
            payloads,
        }
    }
}

/// The transaction items that accept message `seq = header.next_seq + 1`
/// for `run_id`: bump the header (conditional on the counter read, and
/// for `reject` sessions on nothing being active) and index the message.
pub(crate) fn accept_items(table: &str, h: &SessionHeader, run_id: &str) -> Vec<TransactWriteItem> {
    let seq = h.next_seq + 1;
    let mut cond = "next_seq = :prev".to_string();
    if h.on_busy == OnBusy::Reject {
        cond.push_str(" AND done_seq = :prev");
    }
    let update = Update::builder()
        .table_name(table)
        .key("session_id", s(&h.session_id))
        .key("turn", n(0))
        .update_expression("SET next_seq = :seq")
        .condition_expression(cond)
        .expression_attribute_values(":seq", n(seq))
        .expression_attribute_values(":prev", n(h.next_seq))
        .build()
        .expect("table, key and expression are set");
    let mut index = Item::new();
    index.insert("session_id".into(), s(&h.session_id));
    index.insert("turn".into(), n(-(seq as i64)));
    index.insert("run_id".into(), s(run_id));
    vec![
        TransactWriteItem::builder().update(update).build(),
        put(table, index, "attribute_not_exists(turn)"),
    ]
}

/// A history turn, written once, in the same transaction as the Run's
/// commit; large contents are already in S3 (`Payload::Stored`).
pub(crate) fn turn_item(
    table: &str,
    session_id: &str,
    turn: u64,
    role: Role,
    content: &Payload,
    run_id: &str,
) -> TransactWriteItem {
    let mut item = Item::new();
    item.insert("session_id".into(), s(session_id));
    item.insert("turn".into(), n(turn));
    item.insert("role".into(), s(role_str(role)));
    match content {
        Payload::Inline { text } => item.insert("content".into(), s(text)),
        Payload::Stored { key, .. } => item.insert("content_ref".into(), s(key)),
    };
    item.insert("run_id".into(), s(run_id));
    put(table, item, "attribute_not_exists(turn)")
}

#[async_trait]
impl ports::Sessions for SessionStore {
    async fn create(&self, h: &SessionHeader) -> Result<(), StoreError> {
        let mut item = Item::new();
        item.insert("session_id".into(), s(&h.session_id));
        item.insert("turn".into(), n(0));
        item.insert("tenant".into(), s(&h.tenant));
        item.insert("agent".into(), s(&h.agent));
        item.insert("on_busy".into(), s(h.on_busy.as_str()));
        item.insert("next_seq".into(), n(h.next_seq));
        item.insert("done_seq".into(), n(h.done_seq));
        item.insert("created_at".into(), n(h.created_at_ms));
        super::item::put_new(&self.dynamo, &self.table, item, "session_id").await
    }

    async fn header(&self, session_id: &str) -> Result<Option<SessionHeader>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .key("session_id", s(session_id))
            .key("turn", n(0))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        let Some(item) = out.item() else {
            return Ok(None);
        };
        let on_busy = get_s(item, "on_busy")?;
        Ok(Some(SessionHeader {
            session_id: get_s(item, "session_id")?,
            tenant: get_s(item, "tenant")?,
            agent: get_s(item, "agent")?,
            on_busy: OnBusy::parse(&on_busy)
                .ok_or_else(|| StoreError::Corrupt(format!("on_busy {on_busy}")))?,
            next_seq: get_n(item, "next_seq")?,
            done_seq: get_n(item, "done_seq")?,
            created_at_ms: get_n(item, "created_at")?,
        }))
    }

    /// The Run that carries message `seq`.
    async fn message_run(&self, session_id: &str, seq: u64) -> Result<Option<String>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .key("session_id", s(session_id))
            .key("turn", n(-(seq as i64)))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        out.item().map(|i| get_s(i, "run_id")).transpose()
    }

    /// The whole history, oldest first, paging through the table.
    async fn history(&self, session_id: &str) -> Result<Vec<HistoryTurn>, StoreError> {
        let mut turns = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .dynamo
                .query()
                .table_name(&self.table)
                .key_condition_expression("session_id = :s AND turn > :zero")
                .expression_attribute_values(":s", s(session_id))
                .expression_attribute_values(":zero", n(0))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(classify)?;
            for item in out.items() {
                let role = get_s(item, "role")?;
                turns.push(HistoryTurn {
                    role: parse_role(&role)
                        .ok_or_else(|| StoreError::Corrupt(format!("role {role}")))?,
                    content: match opt_s(item, "content_ref") {
                        Some(key) => self.payloads.get_text(&key).await?,
                        None => get_s(item, "content")?,
                    },
                    run_id: get_s(item, "run_id")?,
                });
            }
            match out.last_evaluated_key() {
                Some(k) => start = Some(k.clone()),
                None => return Ok(turns),
            }
        }
    }

    /// Counts message `seq` as done; conditional on the previous one being done.
    async fn mark_done(&self, session_id: &str, seq: u64) -> Result<(), StoreError> {
        self.dynamo
            .update_item()
            .table_name(&self.table)
            .key("session_id", s(session_id))
            .key("turn", n(0))
            .update_expression("SET done_seq = :seq")
            .condition_expression("done_seq = :prev")
            .expression_attribute_values(":seq", n(seq))
            .expression_attribute_values(":prev", n(seq - 1))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }
}
