//! Schedules and their firings in the triggers table.

use async_trait::async_trait;

use armada_domain::schedule::{FiringRecord, Schedule, ScheduleState};

use super::super::item::{get_json, json, n, put_new, s, ttl_after, Item};
use super::{TriggerStore, KEEP_DAYS};
use crate::error::{classify, StoreError};
use crate::ports::Schedules;

fn schedule_pk(schedule_id: &str) -> String {
    format!("schedule#{schedule_id}")
}

fn schedule_item(sch: &Schedule) -> Item {
    let mut item = Item::new();
    item.insert("pk".into(), s(schedule_pk(&sch.schedule_id)));
    item.insert("sk".into(), s("schedule"));
    item.insert("list_key".into(), s(format!("schedule#{}", sch.tenant)));
    item.insert("created_at".into(), n(sch.created_at_ms));
    item.insert("version".into(), n(sch.version));
    item.insert("doc".into(), json(sch));
    item
}

#[async_trait]
impl Schedules for TriggerStore {
    async fn create(&self, schedule: &Schedule) -> Result<(), StoreError> {
        put_new(&self.dynamo, &self.table, schedule_item(schedule), "pk").await
    }

    async fn get(&self, schedule_id: &str) -> Result<Option<Schedule>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .key("pk", s(schedule_pk(schedule_id)))
            .key("sk", s("schedule"))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        out.item().map(|i| get_json(i, "doc")).transpose()
    }

    async fn update(&self, prev_version: u64, schedule: &Schedule) -> Result<(), StoreError> {
        let condition = "attribute_exists(pk) AND version = :v";
        if schedule.state() == ScheduleState::Deleted {
            self.dynamo
                .delete_item()
                .table_name(&self.table)
                .key("pk", s(schedule_pk(&schedule.schedule_id)))
                .key("sk", s("schedule"))
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
            .set_item(Some(schedule_item(schedule)))
            .condition_expression(condition)
            .expression_attribute_values(":v", n(prev_version))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Schedule>, StoreError> {
        let query = self
            .dynamo
            .query()
            .table_name(&self.table)
            .index_name("by_owner")
            .key_condition_expression("list_key = :k")
            .expression_attribute_values(":k", s(format!("schedule#{tenant}")))
            .scan_index_forward(false);
        self.documents(query, limit).await
    }

    async fn record_firing(&self, firing: &FiringRecord) -> Result<(), StoreError> {
        let mut item = Item::new();
        item.insert("pk".into(), s(schedule_pk(&firing.schedule_id)));
        item.insert(
            "sk".into(),
            s(format!("firing#{:015}", firing.scheduled_at_ms)),
        );
        item.insert("doc".into(), json(firing));
        item.insert("purge_at".into(), ttl_after(firing.fired_at_ms, KEEP_DAYS));
        put_new(&self.dynamo, &self.table, item, "pk").await
    }

    async fn firings(
        &self,
        schedule_id: &str,
        limit: usize,
    ) -> Result<Vec<FiringRecord>, StoreError> {
        let query = self
            .dynamo
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :f)")
            .expression_attribute_values(":pk", s(schedule_pk(schedule_id)))
            .expression_attribute_values(":f", s("firing#"))
            .scan_index_forward(false)
            .limit(limit.clamp(1, 1000) as i32);
        self.documents(query, limit).await
    }
}
