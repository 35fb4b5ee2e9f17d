//! Schedules' timers on EventBridge Scheduler: one schedule of the stack's
//! group per Armada schedule, named by its id, whose target is the dispatch
//! queue and whose input is the schedule's sealed `FireSchedule` with
//! `<aws.scheduler.scheduled-time>` in it. The scheduler retries a firing
//! it could not send for up to the maximum event age, then dead-letters
//! it; it never sends a catch-up burst. The local stack reads these same
//! schedules back and fires them itself (the emulator stores them only).

use async_trait::async_trait;
use aws_sdk_scheduler::types::{
    DeadLetterConfig, FlexibleTimeWindow, FlexibleTimeWindowMode, RetryPolicy, ScheduleState,
    Target,
};
use aws_sdk_scheduler::Client;
use aws_smithy_types::DateTime;

use armada_domain::schedule::Schedule;

use crate::config::{Config, TimerConfig};
use crate::error::{classify, StoreError};
use crate::ports::Timers;

/// How many times the scheduler tries to send one firing (its maximum),
/// within the maximum event age.
const SEND_ATTEMPTS: i32 = 185;

#[derive(Debug, Clone)]
pub struct EventBridgeTimers {
    client: Client,
    cfg: TimerConfig,
}

impl EventBridgeTimers {
    pub fn new(client: Client, cfg: &Config) -> Self {
        EventBridgeTimers {
            client,
            cfg: cfg.timers.clone(),
        }
    }

    fn target(&self, message: &str) -> Result<Target, StoreError> {
        let retry = RetryPolicy::builder()
            .maximum_event_age_in_seconds(self.cfg.max_event_age_s as i32)
            .maximum_retry_attempts(SEND_ATTEMPTS);
        let mut target = Target::builder()
            .arn(&self.cfg.dispatch_queue_arn)
            .role_arn(&self.cfg.role_arn)
            .input(message)
            .retry_policy(retry.build());
        if !self.cfg.dead_letter_arn.is_empty() {
            target = target.dead_letter_config(
                DeadLetterConfig::builder()
                    .arn(&self.cfg.dead_letter_arn)
                    .build(),
            );
        }
        target
            .build()
            .map_err(|e| StoreError::Terminal(format!("a schedule's target: {e}")))
    }
}

fn off() -> Result<FlexibleTimeWindow, StoreError> {
    FlexibleTimeWindow::builder()
        .mode(FlexibleTimeWindowMode::Off)
        .build()
        .map_err(|e| StoreError::Terminal(e.to_string()))
}

fn state(s: &Schedule) -> ScheduleState {
    if s.enabled() {
        ScheduleState::Enabled
    } else {
        ScheduleState::Disabled
    }
}

#[async_trait]
impl Timers for EventBridgeTimers {
    async fn put(&self, s: &Schedule, message: &str) -> Result<(), StoreError> {
        let spec = &s.spec;
        let start = spec.start_at_ms.map(DateTime::from_millis);
        let end = spec.end_at_ms.map(DateTime::from_millis);
        let updated = self
            .client
            .update_schedule()
            .group_name(&self.cfg.group)
            .name(&s.schedule_id)
            .schedule_expression(&spec.expression)
            .schedule_expression_timezone(&spec.timezone)
            .set_start_date(start)
            .set_end_date(end)
            .state(state(s))
            .flexible_time_window(off()?)
            .target(self.target(message)?)
            .send()
            .await;
        match updated {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|se| se.is_resource_not_found_exception()) =>
            {
                self.client
                    .create_schedule()
                    .group_name(&self.cfg.group)
                    .name(&s.schedule_id)
                    .description(format!("armada schedule of tenant {}", s.tenant))
                    .schedule_expression(&spec.expression)
                    .schedule_expression_timezone(&spec.timezone)
                    .set_start_date(start)
                    .set_end_date(end)
                    .state(state(s))
                    .flexible_time_window(off()?)
                    .target(self.target(message)?)
                    .send()
                    .await
                    .map_err(classify)?;
                Ok(())
            }
            Err(e) => Err(classify(e)),
        }
    }

    async fn remove(&self, schedule_id: &str) -> Result<(), StoreError> {
        match self
            .client
            .delete_schedule()
            .group_name(&self.cfg.group)
            .name(schedule_id)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|se| se.is_resource_not_found_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(classify(e)),
        }
    }
}
