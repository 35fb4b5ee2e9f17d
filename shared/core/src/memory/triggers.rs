//! Hooks, their deliveries and their hourly counters in memory.

use async_trait::async_trait;

use armada_domain::hook::inbound::Delivery;
use armada_domain::hook::{Hook, HookState};

use super::{conflict, Memory};
use crate::error::StoreError;
use crate::ports::{Hooks, Topics};

#[async_trait]
impl Hooks for Memory {
    async fn create(&self, hook: &Hook) -> Result<(), StoreError> {
        let mut st = self.state();
        if st.hooks.contains_key(&hook.hook_id) {
            return Err(conflict(None));
        }
        st.hooks.insert(hook.hook_id.clone(), hook.clone());
        Ok(())
    }

    async fn get(&self, hook_id: &str) -> Result<Option<Hook>, StoreError> {
        Ok(self.state().hooks.get(hook_id).cloned())
    }

    async fn update(&self, prev_version: u64, hook: &Hook) -> Result<(), StoreError> {
        let mut st = self.state();
        match st.hooks.get(&hook.hook_id) {
            Some(h) if h.version == prev_version => {}
            _ => return Err(conflict(None)),
        }
        if hook.state() == HookState::Deleted {
            st.hooks.remove(&hook.hook_id);
        } else {
            st.hooks.insert(hook.hook_id.clone(), hook.clone());
        }
        Ok(())
    }

    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Hook>, StoreError> {
        let mut hooks: Vec<Hook> = self
            .state()
            .hooks
            .values()
            .filter(|h| h.tenant == tenant)
            .cloned()
            .collect();
        hooks.sort_by_key(|h| std::cmp::Reverse((h.created_at_ms, h.hook_id.clone())));
        hooks.truncate(limit);
        Ok(hooks)
    }

    async fn record_delivery(&self, delivery: &Delivery) -> Result<(), StoreError> {
        self.state().deliveries.push(delivery.clone());
        Ok(())
    }

    async fn deliveries(&self, hook_id: &str, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        let st = self.state();
        let mut of_hook: Vec<Delivery> = st
            .deliveries
            .iter()
            .filter(|d| d.hook_id == hook_id)
            .cloned()
            .collect();
        of_hook.sort_by_key(|d| std::cmp::Reverse((d.received_at_ms, d.delivery_id.clone())));
        of_hook.truncate(limit);
        Ok(of_hook)
    }

    async fn count_start(
        &self,
        hook_id: &str,
        window_s: i64,
        limit: u32,
    ) -> Result<bool, StoreError> {
        let mut st = self.state();
        let n = st
            .hook_starts
            .entry((hook_id.to_string(), window_s))
            .or_default();
        if *n >= limit {
            return Ok(false);
        }
        *n += 1;
        Ok(true)
    }
}

/// Topics in memory: `arn:memory:sns:alarms-<hook_id>`.
#[async_trait]
impl Topics for Memory {
    async fn create(&self, hook_id: &str) -> Result<String, StoreError> {
        let arn = format!("arn:memory:sns:alarms-{hook_id}");
        self.state().topics.insert(arn.clone());
        Ok(arn)
    }

    async fn delete(&self, topic_arn: &str) -> Result<(), StoreError> {
        self.state().topics.remove(topic_arn);
        Ok(())
    }

    fn hook_of(&self, topic_arn: &str) -> Option<String> {
        topic_arn
            .strip_prefix("arn:memory:sns:alarms-")
            .map(str::to_string)
    }
}
