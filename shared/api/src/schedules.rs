//! Schedules: a tenant's agent, team or chain started at the times an
//! EventBridge Scheduler expression names, and the record of each firing.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use armada_domain::schedule::{FiringOutcome, Overlap};

/// `POST /v1/schedules`: exactly one of `agent`, `team` and `chain`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"expression": "cron(0 10 ? * MON-FRI *)", "timezone": "Europe/Berlin", "agent": "reporter", "input": "the daily report"}))]
pub struct CreateScheduleBody {
    /// `cron(minutes hours day-of-month month day-of-week year)`,
    /// `rate(5 minutes)` or `at(yyyy-mm-ddThh:mm:ss)`, as EventBridge
    /// Scheduler takes them.
    pub expression: String,
    /// An IANA time zone (default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    pub team: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1, max_items = 16)]
    pub chain: Option<Vec<String>>,
    /// What each firing's Run is asked (the same every time).
    #[schema(min_length = 1)]
    pub input: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// RFC 3339: no firing before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    /// RFC 3339: no firing after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
    /// `skip` (the default): a firing while the last Run is active starts
    /// nothing; `allow`: it starts another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<Overlap>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `PATCH /v1/schedules/{schedule_id}`: any field; `null` clears
/// `callback_url`, `start_at` or `end_at`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchScheduleBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable)]
    pub callback_url: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable)]
    pub start_at: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable)]
    pub end_at: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<Overlap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// A schedule, with its next firing times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ScheduleView {
    pub schedule_id: String,
    pub expression: String,
    pub timezone: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<Vec<String>>,
    pub input: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
    pub overlap: Overlap,
    pub enabled: bool,
    /// The next five firings (fewer when it ends), RFC 3339 in the
    /// schedule's time zone with its offset; none while it is disabled.
    pub next: Vec<String>,
    pub created_at: String,
    pub updated_at: String,
    pub version: u64,
}

/// `201`: the schedule and its next firings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ScheduleCreated {
    pub schedule_id: String,
    pub next: Vec<String>,
    pub schedule: ScheduleView,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SchedulesPage {
    pub schedules: Vec<ScheduleView>,
}

/// One firing of a schedule and how it went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FiringView {
    pub scheduled_at: String,
    pub fired_at: String,
    pub outcome: FiringOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FiringsPage {
    pub firings: Vec<FiringView>,
}
