//! The triggers table: what starts Runs without an API key. One
//! partition per hook (`pk = hook#<id>`): the hook itself (`sk = hook`), its
//! answered deliveries (`sk = delivery#<received at>#<id>`, newest last,
//! kept 30 days) and its hourly start counters (`sk = count#<hour>`); one
//! per schedule (`pk = schedule#<id>`): the schedule (`sk = schedule`) and
//! its firings (`sk = firing#<scheduled at>`, one per time, kept 30 days).
//! Hooks and schedules carry `list_key = <kind>#<tenant>` and `created_at`
//! for the `by_owner` index (their lists); nothing else does. Mailboxes
//! live here too ([`mailboxes`]: their mail, their addresses, their replies), and
//! tenants' secrets, sealed ([`secrets`]). Every write
//! of a hook or schedule after creation is conditional on the version its
//! writer read.

use aws_sdk_dynamodb::Client;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::item::{get_json, json, n, put_new, s, Item};
use crate::error::{classify, StoreError};

mod hooks;
mod mailboxes;
mod schedules;
mod secrets;

/// How long a hook's answered delivery or a schedule's firing is kept.
const KEEP_DAYS: i64 = 30;

#[derive(Debug, Clone)]
pub struct TriggerStore {
    dynamo: Client,
    table: String,
}

impl TriggerStore {
    pub fn new(dynamo: Client, table: &str) -> Self {
        TriggerStore {
            dynamo,
            table: table.to_string(),
        }
    }

    /// Reads every page of a query, as documents in `doc`, up to `limit`.
    pub(super) async fn documents<T: serde::de::DeserializeOwned>(
        &self,
        query: aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
        limit: usize,
    ) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::new();
        let mut pages = query.into_paginator().send();
        while let Some(page) = pages.next().await {
            for item in page.map_err(classify)?.items() {
                out.push(get_json(item, "doc")?);
                if out.len() >= limit {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// The partition of a hook or schedule: `<kind>#<id>`.
    fn pk(kind: &str, id: &str) -> String {
        format!("{kind}#{id}")
    }

    /// The item of a hook or schedule (`sk = <kind>`), listed by its tenant.
    fn owned_item<T: Serialize>(
        kind: &str,
        id: &str,
        tenant: &str,
        created_at_ms: i64,
        version: u64,
        doc: &T,
    ) -> Item {
        let mut item = Item::new();
        item.insert("pk".into(), s(Self::pk(kind, id)));
        item.insert("sk".into(), s(kind));
        item.insert("list_key".into(), s(format!("{kind}#{tenant}")));
        item.insert("created_at".into(), n(created_at_ms));
        item.insert("version".into(), n(version));
        item.insert("doc".into(), json(doc));
        item
    }

    async fn create_owned(&self, item: Item) -> Result<(), StoreError> {
        put_new(&self.dynamo, &self.table, item, "pk").await
    }

    async fn get_owned<T: DeserializeOwned>(
        &self,
        kind: &str,
        id: &str,
    ) -> Result<Option<T>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .key("pk", s(Self::pk(kind, id)))
            .key("sk", s(kind))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        out.item().map(|i| get_json(i, "doc")).transpose()
    }

    /// Writes `item` (or, `None`, deletes the record) if the stored one is
    /// still at `prev_version`.
    async fn write_owned_if(
        &self,
        kind: &str,
        id: &str,
        prev_version: u64,
        item: Option<Item>,
    ) -> Result<(), StoreError> {
        let condition = "attribute_exists(pk) AND version = :v";
        match item {
            None => {
                self.dynamo
                    .delete_item()
                    .table_name(&self.table)
                    .key("pk", s(Self::pk(kind, id)))
                    .key("sk", s(kind))
                    .condition_expression(condition)
                    .expression_attribute_values(":v", n(prev_version))
                    .send()
                    .await
                    .map_err(classify)?;
            }
            Some(item) => {
                self.dynamo
                    .put_item()
                    .table_name(&self.table)
                    .set_item(Some(item))
                    .condition_expression(condition)
                    .expression_attribute_values(":v", n(prev_version))
                    .send()
                    .await
                    .map_err(classify)?;
            }
        }
        Ok(())
    }

    /// A tenant's hooks or schedules, newest first.
    async fn list_owned<T: DeserializeOwned>(
        &self,
        kind: &str,
        tenant: &str,
        limit: usize,
    ) -> Result<Vec<T>, StoreError> {
        let query = self
            .dynamo
            .query()
            .table_name(&self.table)
            .index_name("by_owner")
            .key_condition_expression("list_key = :k")
            .expression_attribute_values(":k", s(format!("{kind}#{tenant}")))
            .scan_index_forward(false);
        self.documents(query, limit).await
    }

    /// What a hook or schedule keeps beside it (`sk = <prefix>…`: its
    /// deliveries, its firings), newest first.
    async fn kept<T: DeserializeOwned>(
        &self,
        kind: &str,
        id: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<T>, StoreError> {
        let query = self
            .dynamo
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :p)")
            .expression_attribute_values(":pk", s(Self::pk(kind, id)))
            .expression_attribute_values(":p", s(prefix))
            .scan_index_forward(false)
            .limit(limit.clamp(1, 1000) as i32);
        self.documents(query, limit).await
    }

    /// Counts one start of a hook or mailbox in the hour at `window_s`
    /// (`sk = count#<hour>`), unless `limit` were counted: a `Conflict`
    /// then. One conditional write; the counter expires.
    async fn count_owned(
        &self,
        kind: &str,
        id: &str,
        window_s: i64,
        limit: u32,
    ) -> Result<(), StoreError> {
        self.dynamo
            .update_item()
            .table_name(&self.table)
            .key("pk", s(Self::pk(kind, id)))
            .key("sk", s(format!("count#{window_s}")))
            .update_expression("ADD #n :one SET purge_at = :exp")
            .condition_expression("attribute_not_exists(#n) OR #n < :limit")
            .expression_attribute_names("#n", "started")
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":limit", n(limit))
            // Kept a little past its hour, then TTL removes it.
            .expression_attribute_values(":exp", n(window_s + 3600 + 600))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }
}
