//! Schedules (scenario H's cron tick): a tenant's agent, team or chain
//! started at the times an EventBridge Scheduler expression names, in a
//! time zone, each firing one Run at most.
//!
//! - [`expr`]: the expressions and their next firing times
//! - this module: the schedule record, what creates and changes it, its
//!   machine, and how a firing is decided ([`Schedule::fire`])

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::{parse_target, RunTarget, MAX_INPUT_CHARS};
use crate::fields::{FieldError, Fields};

pub mod expr;

pub use expr::{ExprError, Expression};

/// What a firing does while the schedule's previous Run has not ended.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Nothing starts (recorded `skipped`): the default.
    #[default]
    Skip,
    /// Another Run starts beside it.
    Allow,
}

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleState {
    Enabled,
    Disabled,
    /// Deleted: its store removes it with this write.
    Deleted,
}

/// The fields `POST /v1/schedules` takes.
pub const SCHEDULE_FIELDS: &[&str] = &[
    "expression",
    "timezone",
    "agent",
    "team",
    "chain",
    "input",
    "callback_url",
    "start_at",
    "end_at",
    "overlap",
    "enabled",
];

/// What a schedule does (validated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    pub expression: String,
    /// An IANA time zone name.
    pub timezone: String,
    pub target: RunTarget,
    pub input: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at_ms: Option<i64>,
    #[serde(default)]
    pub overlap: Overlap,
}

/// A change to a schedule (`PATCH /v1/schedules/{id}`): any field;
/// `null` clears `callback_url`, `start_at` or `end_at`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulePatch {
    pub expression: Option<String>,
    pub timezone: Option<String>,
    pub target: Option<RunTarget>,
    pub input: Option<String>,
    pub callback_url: Option<Option<String>>,
    pub start_at_ms: Option<Option<i64>>,
    pub end_at_ms: Option<Option<i64>>,
    pub overlap: Option<Overlap>,
    pub enabled: Option<bool>,
}

/// A schedule of a tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub schedule_id: String,
    pub tenant: String,
    pub created_by: String,
    pub spec: ScheduleSpec,
    state: ScheduleState,
    /// The Run of its last firing that started one (for `overlap: skip`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run_id: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Incremented by every write; every write is conditional on it.
    pub version: u64,
}

fn rfc3339_ms(f: &Fields<'_>, key: &str) -> Result<Option<i64>, FieldError> {
    f.opt_str(key)?
        .map(|s| {
            DateTime::parse_from_rfc3339(s)
                .map(|t| t.timestamp_millis())
                .map_err(|_| FieldError::new(key, "must be an RFC 3339 time with its offset"))
        })
        .transpose()
}

fn check_expression(text: &str) -> Result<(), FieldError> {
    Expression::parse(text)
        .map(|_| ())
        .map_err(|e| FieldError::new("expression", &e.to_string()))
}

/// An IANA time zone.
pub fn time_zone(name: &str) -> Result<Tz, FieldError> {
    name.parse::<Tz>()
        .map_err(|_| FieldError::new("timezone", &format!("'{name}' is not an IANA time zone")))
}

fn check_input(input: &str) -> Result<(), FieldError> {
    if input.trim().is_empty() || input.chars().count() > MAX_INPUT_CHARS {
        return Err(FieldError::new(
            "input",
            &format!("must be 1 to {MAX_INPUT_CHARS} characters"),
        ));
    }
    Ok(())
}

fn check_url(url: &str) -> Result<(), FieldError> {
    if !(url.starts_with("https://") || url.starts_with("http://")) || url.len() > 2048 {
        return Err(FieldError::new("callback_url", "must be an http(s) URL"));
    }
    Ok(())
}

impl ScheduleSpec {
    /// A create request, field by field; whether it starts enabled.
    pub fn parse(body: &Value) -> Result<(ScheduleSpec, bool), FieldError> {
        let f = Fields::new(body)?;
        f.only(SCHEDULE_FIELDS)?;
        let expression = f.req_str("expression")?.trim().to_string();
        check_expression(&expression)?;
        let timezone = f.opt_str("timezone")?.unwrap_or("UTC").to_string();
        time_zone(&timezone)?;
        let target = parse_target(&f, &mut String::new())?;
        let input = f.req_str("input")?.to_string();
        check_input(&input)?;
        let callback_url = f.opt_str("callback_url")?.map(str::to_string);
        if let Some(u) = &callback_url {
            check_url(u)?;
        }
        let overlap = match f.opt_str("overlap")? {
            None | Some("skip") => Overlap::Skip,
            Some("allow") => Overlap::Allow,
            Some(_) => return Err(FieldError::new("overlap", "must be \"skip\" or \"allow\"")),
        };
        let spec = ScheduleSpec {
            expression,
            timezone,
            target,
            input,
            callback_url,
            start_at_ms: rfc3339_ms(&f, "start_at")?,
            end_at_ms: rfc3339_ms(&f, "end_at")?,
            overlap,
        };
        spec.check_window()?;
        Ok((spec, f.opt_bool("enabled")?.unwrap_or(true)))
    }

    fn check_window(&self) -> Result<(), FieldError> {
        match (self.start_at_ms, self.end_at_ms) {
            (Some(s), Some(e)) if e <= s => {
                Err(FieldError::new("end_at", "must be after start_at"))
            }
            _ => Ok(()),
        }
    }

    pub fn expression(&self) -> Expression {
        // Checked when it was written: a stored one always parses.
        Expression::parse(&self.expression).unwrap_or(Expression::Rate { every_s: 86_400 })
    }

    pub fn tz(&self) -> Tz {
        self.timezone.parse().unwrap_or(chrono_tz::UTC)
    }

    /// The next `n` firings after `now`: from `start_at` when it is later,
    /// never past `end_at`. A rate counts from `start_at`, or from
    /// `anchor_ms` (when the schedule was made).
    pub fn next_firings(&self, now_ms: i64, anchor_ms: i64, n: usize) -> Vec<DateTime<Utc>> {
        let ms = |m: i64| DateTime::<Utc>::from_timestamp_millis(m).unwrap_or_default();
        let anchor = ms(self.start_at_ms.unwrap_or(anchor_ms));
        // The first firing may be at `start_at` itself.
        let from = match self.start_at_ms {
            Some(s) if s > now_ms => ms(s - 1),
            _ => ms(now_ms),
        };
        self.expression()
            .next_n(self.tz(), from, anchor, n)
            .into_iter()
            .filter(|t| self.end_at_ms.is_none_or(|e| t.timestamp_millis() <= e))
            .collect()
    }
}

impl SchedulePatch {
    pub fn parse(body: &Value) -> Result<SchedulePatch, FieldError> {
        let f = Fields::new(body)?;
        f.only(SCHEDULE_FIELDS)?;
        let cleared = |key: &str| body.get(key) == Some(&Value::Null);
        let expression = f.opt_str("expression")?.map(|e| e.trim().to_string());
        if let Some(e) = &expression {
            check_expression(e)?;
        }
        let timezone = f.opt_str("timezone")?.map(str::to_string);
        if let Some(t) = &timezone {
            time_zone(t)?;
        }
        let named = ["agent", "team", "chain"]
            .iter()
            .any(|k| body.get(*k).is_some_and(|v| !v.is_null()));
        let target = if named {
            Some(parse_target(&f, &mut String::new())?)
        } else {
            None
        };
        let input = f.opt_str("input")?.map(str::to_string);
        if let Some(i) = &input {
            check_input(i)?;
        }
        let callback_url = match f.opt_str("callback_url")? {
            Some(u) => {
                check_url(u)?;
                Some(Some(u.to_string()))
            }
            None if cleared("callback_url") => Some(None),
            None => None,
        };
        let time = |key: &str| -> Result<Option<Option<i64>>, FieldError> {
            match rfc3339_ms(&f, key)? {
                Some(t) => Ok(Some(Some(t))),
                None if cleared(key) => Ok(Some(None)),
                None => Ok(None),
            }
        };
        let overlap = match f.opt_str("overlap")? {
            None => None,
            Some("skip") => Some(Overlap::Skip),
            Some("allow") => Some(Overlap::Allow),
            Some(_) => return Err(FieldError::new("overlap", "must be \"skip\" or \"allow\"")),
        };
        Ok(SchedulePatch {
            expression,
            timezone,
            target,
            input,
            callback_url,
            start_at_ms: time("start_at")?,
            end_at_ms: time("end_at")?,
            overlap,
            enabled: f.opt_bool("enabled")?,
        })
    }
}

/// How a firing was answered.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FiringOutcome {
    Started,
    Skipped,
    Missed,
}

/// The record of one firing of a schedule: written once per scheduled
/// time (a second message for the same time finds it and starts nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FiringRecord {
    pub schedule_id: String,
    pub scheduled_at_ms: i64,
    pub fired_at_ms: i64,
    pub outcome: FiringOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// How a firing at `scheduled_at` was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Firing {
    /// Start a Run.
    Start,
    /// The previous Run has not ended and overlap is `skip`.
    Skipped { previous_run_id: String },
    /// Older than the age a firing may be run at: never a burst of
    /// catch-up Runs after the stack was down.
    Missed { late_s: i64 },
    /// The schedule is disabled, or the time is outside its window.
    Ignored,
}

impl Schedule {
    pub fn new(
        schedule_id: &str,
        tenant: &str,
        created_by: &str,
        spec: ScheduleSpec,
        enabled: bool,
        now_ms: i64,
    ) -> Schedule {
        Schedule {
            schedule_id: schedule_id.to_string(),
            tenant: tenant.to_string(),
            created_by: created_by.to_string(),
            spec,
            state: if enabled {
                ScheduleState::Enabled
            } else {
                ScheduleState::Disabled
            },
            last_run_id: None,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            version: 1,
        }
    }

    pub fn state(&self) -> ScheduleState {
        self.state
    }

    pub fn enabled(&self) -> bool {
        self.state == ScheduleState::Enabled
    }

    /// Decides the firing at `scheduled_at_ms`, received at `now_ms`:
    /// `previous_active` says whether its last Run has not ended yet.
    pub fn fire(
        &self,
        scheduled_at_ms: i64,
        now_ms: i64,
        max_event_age_s: u32,
        previous_active: bool,
    ) -> Firing {
        let outside = self.spec.start_at_ms.is_some_and(|s| scheduled_at_ms < s)
            || self.spec.end_at_ms.is_some_and(|e| scheduled_at_ms > e);
        if !self.enabled() || outside {
            return Firing::Ignored;
        }
        let late_s = (now_ms - scheduled_at_ms).div_euclid(1000);
        if late_s > i64::from(max_event_age_s) {
            return Firing::Missed { late_s };
        }
        match (&self.last_run_id, self.spec.overlap) {
            (Some(previous), Overlap::Skip) if previous_active => Firing::Skipped {
                previous_run_id: previous.clone(),
            },
            _ => Firing::Start,
        }
    }
}

/// What a schedule's machine is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleEvent {
    Update(SchedulePatch),
    /// A firing started this Run.
    Started {
        run_id: String,
    },
    Delete,
}

/// What the handler does once a schedule's change is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleAction {
    /// Make the EventBridge schedule say what this one says now.
    Sync,
    /// Delete the EventBridge schedule.
    Remove,
}

/// Why a schedule refused a change (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleRefusal {
    #[error("the schedule was deleted")]
    Deleted,
    #[error("{0}")]
    Invalid(FieldError),
}

impl crate::machine::Machine for Schedule {
    type Event = ScheduleEvent;
    type Action = ScheduleAction;
    type Refusal = ScheduleRefusal;
    type Version = u64;

    fn apply(
        &mut self,
        event: ScheduleEvent,
        now_ms: i64,
    ) -> Result<Vec<ScheduleAction>, ScheduleRefusal> {
        let actions = match (self.state, event) {
            (ScheduleState::Deleted, _) => return Err(ScheduleRefusal::Deleted),
            (ScheduleState::Enabled | ScheduleState::Disabled, ScheduleEvent::Update(p)) => {
                let mut spec = self.spec.clone();
                if let Some(e) = p.expression {
                    spec.expression = e;
                }
                if let Some(t) = p.timezone {
                    spec.timezone = t;
                }
                if let Some(t) = p.target {
                    spec.target = t;
                }
                if let Some(i) = p.input {
                    spec.input = i;
                }
                if let Some(u) = p.callback_url {
                    spec.callback_url = u;
                }
                if let Some(s) = p.start_at_ms {
                    spec.start_at_ms = s;
                }
                if let Some(e) = p.end_at_ms {
                    spec.end_at_ms = e;
                }
                if let Some(o) = p.overlap {
                    spec.overlap = o;
                }
                spec.check_window().map_err(ScheduleRefusal::Invalid)?;
                self.spec = spec;
                match p.enabled {
                    Some(true) => self.state = ScheduleState::Enabled,
                    Some(false) => self.state = ScheduleState::Disabled,
                    None => {}
                }
                vec![ScheduleAction::Sync]
            }
            (
                ScheduleState::Enabled | ScheduleState::Disabled,
                ScheduleEvent::Started { run_id },
            ) => {
                self.last_run_id = Some(run_id);
                vec![]
            }
            (ScheduleState::Enabled | ScheduleState::Disabled, ScheduleEvent::Delete) => {
                self.state = ScheduleState::Deleted;
                vec![ScheduleAction::Remove]
            }
        };
        self.updated_at_ms = now_ms;
        self.version += 1;
        Ok(actions)
    }

    fn version(&self) -> u64 {
        self.version
    }
}

#[cfg(test)]
mod tests;
