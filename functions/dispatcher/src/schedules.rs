//! A schedule's firing (`FireSchedule`, from EventBridge Scheduler, or
//! the local stack's stand-in): the schedule decides (start, skipped while
//! its last Run is active, missed when too late, ignored when disabled),
//! the Run is started under the firing's key (so a repeated message finds
//! the same Run), and the firing is recorded once per scheduled time.

use chrono::DateTime;

use crate::Dispatcher;
use crate::Handled;
use armada_core::batch::Outcome;
use armada_core::cas::change;
use armada_core::error::StoreError;
use armada_core::services::auth::TenantKey;
use armada_core::services::starting::{self, StartRefused};
use armada_domain::api::{CreateRun, KeyRole};
use armada_domain::run::Trigger;
use armada_domain::schedule::{Firing, FiringOutcome, FiringRecord, Schedule, ScheduleEvent};

impl Dispatcher {
    pub(crate) async fn fire_schedule(
        &self,
        schedule_id: &str,
        tenant: &str,
        scheduled_at: &str,
    ) -> Handled {
        let Some(schedule) = self.svc.schedules.get(schedule_id).await? else {
            tracing::info!(schedule_id, "a firing of a schedule that is gone dropped");
            return Ok(Outcome::Done);
        };
        if schedule.tenant != tenant {
            tracing::error!(
                security = true,
                schedule_id,
                tenant,
                "a firing naming another tenant's schedule was dropped"
            );
            return Ok(Outcome::Done);
        }
        let Ok(at) = DateTime::parse_from_rfc3339(scheduled_at) else {
            tracing::error!(
                schedule_id,
                scheduled_at,
                "a firing with an unreadable time dropped"
            );
            return Ok(Outcome::Done);
        };
        let at_ms = at.timestamp_millis();
        let now = self.svc.clock.now_ms();
        let previous_active = match &schedule.last_run_id {
            Some(id) => self
                .svc
                .runs
                .get(id)
                .await?
                .is_some_and(|r| !r.state().is_terminal()),
            None => false,
        };
        let max_age = self.svc.cfg.timers.max_event_age_s;
        let (outcome, run_id) = match schedule.fire(at_ms, now, max_age, previous_active) {
            Firing::Ignored => {
                tracing::info!(
                    schedule_id,
                    scheduled_at,
                    "firing ignored: disabled, or outside its window"
                );
                return Ok(Outcome::Done);
            }
            Firing::Missed { late_s } => {
                tracing::warn!(
                    schedule_id,
                    scheduled_at,
                    late_s,
                    "firing missed: too late to run"
                );
                (FiringOutcome::Missed, None)
            }
            Firing::Skipped { previous_run_id } => {
                tracing::info!(
                    schedule_id,
                    scheduled_at,
                    previous_run_id,
                    "firing skipped: the last run is still active"
                );
                (FiringOutcome::Skipped, None)
            }
            Firing::Start => match self.start_firing(&schedule, scheduled_at, at_ms).await? {
                Some(run_id) => (FiringOutcome::Started, Some(run_id)),
                // Refused for good (its agent is gone): recorded as missed.
                None => (FiringOutcome::Missed, None),
            },
        };
        let record = FiringRecord {
            schedule_id: schedule_id.to_string(),
            scheduled_at_ms: at_ms,
            fired_at_ms: now,
            outcome,
            run_id: run_id.clone(),
        };
        match self.svc.schedules.record_firing(&record).await {
            Ok(()) => {}
            // This time's firing is recorded already: a repeated message.
            Err(StoreError::Conflict { .. }) => return Ok(Outcome::Done),
            Err(e) => return Err(e.into()),
        }
        if let Some(run_id) = run_id {
            let started = ScheduleEvent::Started { run_id };
            change(
                self.svc.schedules.as_ref(),
                schedule_id,
                || self.svc.clock.now_ms(),
                |_: &Schedule| Some(started.clone()),
            )
            .await?;
        }
        Ok(Outcome::Done)
    }

    /// Starts the firing's Run as the schedule (any approver key of its
    /// tenant may decide its approvals), keyed by the firing: a repeated
    /// message gets the same Run. `None` when it cannot start for good.
    async fn start_firing(
        &self,
        schedule: &Schedule,
        scheduled_at: &str,
        at_ms: i64,
    ) -> Result<Option<String>, StoreError> {
        let as_schedule = TenantKey {
            tenant: schedule.tenant.clone(),
            key_id: schedule.schedule_id.clone(),
            role: KeyRole::Member,
            owner: None,
        };
        let cr = CreateRun {
            target: schedule.spec.target.clone(),
            input: schedule.spec.input.clone(),
            session_id: None,
            callback_url: schedule.spec.callback_url.clone(),
            metadata: serde_json::json!({}),
            started_from: Some(Trigger::Schedule {
                schedule_id: schedule.schedule_id.clone(),
                scheduled_at: scheduled_at.to_string(),
            }),
        };
        let key = format!("schedule:{}:{at_ms}", schedule.schedule_id);
        let idem = Some((key.clone(), key));
        match starting::start_target(self.svc.as_ref(), &as_schedule, cr, idem).await {
            Ok(accepted) => Ok(Some(accepted.run_id)),
            Err(StartRefused::Store(e)) => Err(e),
            // Quotas and contention pass: the firing is tried again.
            Err(
                e @ (StartRefused::TooManyActiveRuns { .. }
                | StartRefused::RateLimited { .. }
                | StartRefused::NotQueued
                | StartRefused::Contended(_)),
            ) => Err(StoreError::Retryable(e.to_string())),
            Err(e) => {
                tracing::warn!(schedule_id = %schedule.schedule_id, error = %e, "a firing could not start its run");
                Ok(None)
            }
        }
    }
}
