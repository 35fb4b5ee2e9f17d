//! Schedules, their firings and their timers in memory.

use async_trait::async_trait;

use armada_domain::schedule::{FiringRecord, Schedule, ScheduleState};

use super::{conflict, Memory};
use crate::error::StoreError;
use crate::ports::{Schedules, Timers};

#[async_trait]
impl Schedules for Memory {
    async fn create(&self, schedule: &Schedule) -> Result<(), StoreError> {
        let mut st = self.state();
        if st.schedules.contains_key(&schedule.schedule_id) {
            return Err(conflict(None));
        }
        st.schedules
            .insert(schedule.schedule_id.clone(), schedule.clone());
        Ok(())
    }

    async fn get(&self, schedule_id: &str) -> Result<Option<Schedule>, StoreError> {
        Ok(self.state().schedules.get(schedule_id).cloned())
    }

    async fn update(&self, prev_version: u64, schedule: &Schedule) -> Result<(), StoreError> {
        let mut st = self.state();
        match st.schedules.get(&schedule.schedule_id) {
            Some(s) if s.version == prev_version => {}
            _ => return Err(conflict(None)),
        }
        if schedule.state() == ScheduleState::Deleted {
            st.schedules.remove(&schedule.schedule_id);
        } else {
            st.schedules
                .insert(schedule.schedule_id.clone(), schedule.clone());
        }
        Ok(())
    }

    async fn of_tenant(&self, tenant: &str, limit: usize) -> Result<Vec<Schedule>, StoreError> {
        let mut out: Vec<Schedule> = self
            .state()
            .schedules
            .values()
            .filter(|s| s.tenant == tenant)
            .cloned()
            .collect();
        out.sort_by_key(|s| std::cmp::Reverse((s.created_at_ms, s.schedule_id.clone())));
        out.truncate(limit);
        Ok(out)
    }

    async fn record_firing(&self, firing: &FiringRecord) -> Result<(), StoreError> {
        let mut st = self.state();
        let key = (firing.schedule_id.clone(), firing.scheduled_at_ms);
        if st.firings.contains_key(&key) {
            return Err(conflict(None));
        }
        st.firings.insert(key, firing.clone());
        Ok(())
    }

    async fn firings(
        &self,
        schedule_id: &str,
        limit: usize,
    ) -> Result<Vec<FiringRecord>, StoreError> {
        Ok(self
            .state()
            .firings
            .values()
            .rev()
            .filter(|f| f.schedule_id == schedule_id)
            .take(limit)
            .cloned()
            .collect())
    }
}

#[async_trait]
impl Timers for Memory {
    async fn put(&self, schedule: &Schedule, message: &str) -> Result<(), StoreError> {
        self.state().timers.insert(
            schedule.schedule_id.clone(),
            (schedule.clone(), message.to_string()),
        );
        Ok(())
    }

    async fn remove(&self, schedule_id: &str) -> Result<(), StoreError> {
        self.state().timers.remove(schedule_id);
        Ok(())
    }
}
