//! Hooks, their deliveries and their hourly counters in the triggers table.

use async_trait::async_trait;

use armada_domain::hook::inbound::Delivery;
use armada_domain::hook::{Hook, HookState};

use super::super::item::{json, put_new, s, ttl_after, written, Item};
use super::{TriggerStore, KEEP_DAYS};
use crate::error::StoreError;
use crate::ports::Hooks;

const KIND: &str = "hook";

fn item(h: &Hook) -> Item {
    TriggerStore::owned_item(KIND, &h.hook_id, &h.tenant, h.created_at_ms, h.version, h)
}

#[async_trait]
impl Hooks for TriggerStore {
    async fn create(&self, hook: &Hook) -> Result<(), StoreError> {
        self.create_owned(item(hook)).await
    }

    async fn get(&self, hook_id: &str) -> Result<Option<Hook>, StoreError> {
        self.get_owned(KIND, hook_id).await
    }

    async fn update(&self, prev_version: u64, hook: &Hook) -> Result<(), StoreError> {
        let written = (hook.state() != HookState::Deleted).then(|| item(hook));
        self.write_owned_if(KIND, &hook.hook_id, prev_version, written)
            .await
    }

    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Hook>, StoreError> {
        self.list_owned(KIND, tenant, limit).await
    }

    async fn record_delivery(&self, d: &Delivery) -> Result<(), StoreError> {
        let mut item = Item::new();
        item.insert("pk".into(), s(Self::pk(KIND, &d.hook_id)));
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
        self.kept(KIND, hook_id, "delivery#", limit).await
    }
    async fn count_start(
        &self,
        hook_id: &str,
        window_s: i64,
        limit: u32,
    ) -> Result<bool, StoreError> {
        written(self.count_owned(KIND, hook_id, window_s, limit).await)
    }
}
