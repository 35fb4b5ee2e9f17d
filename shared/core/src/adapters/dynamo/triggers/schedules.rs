//! Schedules and their firings in the triggers table.

use async_trait::async_trait;

use armada_domain::schedule::{FiringRecord, Schedule, ScheduleState};

use super::super::item::{json, put_new, s, ttl_after, Item};
use super::{TriggerStore, KEEP_DAYS};
use crate::error::StoreError;
use crate::ports::Schedules;

const KIND: &str = "schedule";

fn item(sch: &Schedule) -> Item {
    TriggerStore::owned_item(
        KIND,
        &sch.schedule_id,
        &sch.tenant,
        sch.created_at_ms,
        sch.version,
        sch,
    )
}

#[async_trait]
impl Schedules for TriggerStore {
    async fn create(&self, schedule: &Schedule) -> Result<(), StoreError> {
        self.create_owned(item(schedule)).await
    }

    async fn get(&self, schedule_id: &str) -> Result<Option<Schedule>, StoreError> {
        self.get_owned(KIND, schedule_id).await
    }

    async fn update(&self, prev_version: u64, schedule: &Schedule) -> Result<(), StoreError> {
        let written = (schedule.state() != ScheduleState::Deleted).then(|| item(schedule));
        self.write_owned_if(KIND, &schedule.schedule_id, prev_version, written)
            .await
    }

    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Schedule>, StoreError> {
        self.list_owned(KIND, tenant, limit).await
    }

    async fn record_firing(&self, firing: &FiringRecord) -> Result<(), StoreError> {
        let mut item = Item::new();
        item.insert("pk".into(), s(Self::pk(KIND, &firing.schedule_id)));
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
        self.kept(KIND, schedule_id, "firing#", limit).await
    }
}
