//! The local stack's stand-in for EventBridge Scheduler's firing: the
//! emulator stores schedules but never fires them, so this reads them back
//! through the Scheduler API, as the functions wrote them, and at each due
//! time sends the schedule's target `Input` (the time filled in where
//! `<aws.scheduler.scheduled-time>` stands) to its target queue, as the
//! scheduler would. The functions take it from there, on the same code
//! path as in AWS. After the stack was down, the times it missed are sent
//! late (the last few only): the dispatcher records those past the maximum
//! event age as missed and runs nothing for them, and a time whose firing
//! was recorded already starts nothing again.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_scheduler::types::ScheduleState;
use chrono::{DateTime, SecondsFormat, Utc};
use tokio::sync::watch;

use armada_core::adapters::aws::AwsClients;
use armada_domain::schedule::Expression;

/// What the scheduler fills in with each firing's time.
const SCHEDULED_TIME: &str = "<aws.scheduler.scheduled-time>";
/// The most past times one schedule sends at once after an outage.
const MAX_LATE: usize = 5;

/// What this stand-in fires: the stack's schedule group, and the queues
/// targets may name (by the name the local template gives an ARN).
pub struct LocalTimers {
    pub aws: AwsClients,
    pub group: String,
    /// Queue ARN → URL.
    pub queues: HashMap<String, String>,
    pub poll: Duration,
}

fn time_of(t: &aws_smithy_types::DateTime) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(t.to_millis().ok()?)
}

impl LocalTimers {
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        // Schedule name → the last time sent.
        let mut sent: HashMap<String, DateTime<Utc>> = HashMap::new();
        loop {
            if let Err(e) = self.tick(&mut sent).await {
                tracing::debug!(error = %e, "local timers' tick failed");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.poll) => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    async fn tick(&self, sent: &mut HashMap<String, DateTime<Utc>>) -> anyhow::Result<()> {
        let listed = self
            .aws
            .scheduler
            .list_schedules()
            .group_name(&self.group)
            .send()
            .await?;
        let now = Utc::now();
        for summary in listed.schedules() {
            let Some(name) = summary.name() else {
                continue;
            };
            let s = self
                .aws
                .scheduler
                .get_schedule()
                .group_name(&self.group)
                .name(name)
                .send()
                .await?;
            if s.state() != Some(&ScheduleState::Enabled) {
                continue;
            }
            let (Some(expr), Some(target)) = (s.schedule_expression(), s.target()) else {
                continue;
            };
            let Ok(expression) = Expression::parse(expr) else {
                tracing::warn!(
                    schedule = name,
                    expr,
                    "a schedule the local timers cannot read"
                );
                continue;
            };
            let tz = s
                .schedule_expression_timezone()
                .and_then(|z| z.parse().ok())
                .unwrap_or(chrono_tz::UTC);
            let created = s.creation_date().and_then(time_of).unwrap_or(now);
            let start = s.start_date().and_then(time_of);
            let end = s.end_date().and_then(time_of);
            let anchor = start.unwrap_or(created);
            let from = match (sent.get(name), start) {
                (Some(last), _) => *last,
                (None, Some(start)) if start > created => start - chrono::Duration::milliseconds(1),
                (None, _) => created,
            };
            let mut due = Vec::new();
            let mut at = from;
            while let Some(next) = expression.next_after(tz, at, anchor) {
                if next > now || end.is_some_and(|e| next > e) {
                    break;
                }
                due.push(next);
                at = next;
                if due.len() > 10_000 {
                    break;
                }
            }
            let Some(last) = due.last().copied() else {
                continue;
            };
            let Some(url) = self.queues.get(target.arn()) else {
                tracing::warn!(
                    schedule = name,
                    arn = target.arn(),
                    "a schedule's target is not a queue of this stack"
                );
                continue;
            };
            let input = target.input().unwrap_or_default();
            for t in due.iter().rev().take(MAX_LATE).rev() {
                let body = input.replace(
                    SCHEDULED_TIME,
                    &t.to_rfc3339_opts(SecondsFormat::Secs, true),
                );
                self.aws
                    .sqs
                    .send_message()
                    .queue_url(url)
                    .message_body(body)
                    .send()
                    .await?;
                tracing::info!(schedule = name, at = %t, "local timer fired");
            }
            sent.insert(name.to_string(), last);
        }
        Ok(())
    }
}
