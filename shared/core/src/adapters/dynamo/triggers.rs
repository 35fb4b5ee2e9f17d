//! The triggers table: what starts Runs without an API key. One
//! partition per hook (`pk = hook#<id>`): the hook itself (`sk = hook`), its
//! answered deliveries (`sk = delivery#<received at>#<id>`, newest last,
//! kept 30 days) and its hourly start counters (`sk = count#<hour>`).
//! Hooks carry `list_key = hook#<tenant>` and `created_at` for the
//! `by_owner` index (GET /v1/hooks); nothing else does, so the index holds
//! hooks only. Every hook write after creation is conditional on the
//! version its writer read.

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;

use armada_domain::hook::inbound::Delivery;
use armada_domain::hook::{Hook, HookState};

use super::item::{get_json, json, n, put_new, s, ttl_after, written, Item};
use crate::error::{classify, StoreError};
use crate::ports::Hooks;

/// How long an answered delivery is kept.
const DELIVERY_DAYS: i64 = 30;

#[derive(Debug, Clone)]
pub struct TriggerStore {
    dynamo: Client,
    table: String,
}

fn hook_pk(hook_id: &str) -> String {
    format!("hook#{hook_id}")
}

impl TriggerStore {
    pub fn new(dynamo: Client, table: &str) -> Self {
        TriggerStore {
            dynamo,
            table: table.to_string(),
        }
    }

    fn hook_item(h: &Hook) -> Item {
        let mut item = Item::new();
        item.insert("pk".into(), s(hook_pk(&h.hook_id)));
        item.insert("sk".into(), s("hook"));
        item.insert("list_key".into(), s(format!("hook#{}", h.tenant)));
        item.insert("created_at".into(), n(h.created_at_ms));
        item.insert("version".into(), n(h.version));
        item.insert("doc".into(), json(h));
        item
    }

    /// Reads every page of a query, as documents in `doc`, up to `limit`.
    async fn documents<T: serde::de::DeserializeOwned>(
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
}

#[async_trait]
impl Hooks for TriggerStore {
    async fn create(&self, hook: &Hook) -> Result<(), StoreError> {
        put_new(&self.dynamo, &self.table, Self::hook_item(hook), "pk").await
    }

    async fn get(&self, hook_id: &str) -> Result<Option<Hook>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .key("pk", s(hook_pk(hook_id)))
            .key("sk", s("hook"))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        out.item().map(|i| get_json(i, "doc")).transpose()
    }

    async fn update(&self, prev_version: u64, hook: &Hook) -> Result<(), StoreError> {
        let condition = "attribute_exists(pk) AND version = :v";
        if hook.state() == HookState::Deleted {
            self.dynamo
                .delete_item()
                .table_name(&self.table)
                .key("pk", s(hook_pk(&hook.hook_id)))
                .key("sk", s("hook"))
                .condition_expression(condition)
                .expression_attribute_values(":v", n(prev_version))
                .send()
                .await
                .map_err(classify)?;
            return Ok(());
        }
        self.dynamo
            .put_item()
            .table_name(&self.table)
            .set_item(Some(Self::hook_item(hook)))
            .condition_expression(condition)
            .expression_attribute_values(":v", n(prev_version))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Hook>, StoreError> {
        let query = self
            .dynamo
            .query()
            .table_name(&self.table)
            .index_name("by_owner")
            .key_condition_expression("list_key = :k")
            .expression_attribute_values(":k", s(format!("hook#{tenant}")))
            .scan_index_forward(false);
        self.documents(query, limit).await
    }

    async fn record_delivery(&self, d: &Delivery) -> Result<(), StoreError> {
        let mut item = Item::new();
        item.insert("pk".into(), s(hook_pk(&d.hook_id)));
        item.insert(
            "sk".into(),
            s(format!(
                "delivery#{:015}#{}",
                d.received_at_ms, d.delivery_id
            )),
        );
        item.insert("doc".into(), json(d));
        item.insert(
            "purge_at".into(),
            ttl_after(d.received_at_ms, DELIVERY_DAYS),
        );
        put_new(&self.dynamo, &self.table, item, "pk").await
    }

    async fn deliveries(&self, hook_id: &str, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        let query = self
            .dynamo
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :d)")
            .expression_attribute_values(":pk", s(hook_pk(hook_id)))
            .expression_attribute_values(":d", s("delivery#"))
            .scan_index_forward(false)
            .limit(limit.clamp(1, 1000) as i32);
        self.documents(query, limit).await
    }

    async fn count_start(
        &self,
        hook_id: &str,
        window_s: i64,
        limit: u32,
    ) -> Result<bool, StoreError> {
        written(
            self.dynamo
                .update_item()
                .table_name(&self.table)
                .key("pk", s(hook_pk(hook_id)))
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
                .map_err(classify),
        )
    }
}
