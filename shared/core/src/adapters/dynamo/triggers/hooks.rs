//! Hooks, their deliveries and their hourly counters in the triggers table.

use async_trait::async_trait;

use armada_domain::hook::inbound::Delivery;
use armada_domain::hook::{Hook, HookState};

use super::super::item::{get_json, json, n, put_new, s, ttl_after, written, Item};
use super::{TriggerStore, KEEP_DAYS};
use crate::error::{classify, StoreError};
use crate::ports::Hooks;

fn hook_pk(hook_id: &str) -> String {
    format!("hook#{hook_id}")
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

#[async_trait]
impl Hooks for TriggerStore {
    async fn create(&self, hook: &Hook) -> Result<(), StoreError> {
        put_new(&self.dynamo, &self.table, hook_item(hook), "pk").await
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
            .set_item(Some(hook_item(hook)))
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
        item.insert("purge_at".into(), ttl_after(d.received_at_ms, KEEP_DAYS));
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
