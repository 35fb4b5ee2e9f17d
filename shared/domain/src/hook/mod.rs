//! Inbound webhooks (scenario H, ARCHITECTURE §7): a [`Hook`] is an
//! address a tenant gives to GitHub, to anything that signs as Standard
//! Webhooks, or to Alertmanager; each verified delivery to it starts one
//! Run of its agent, team or chain, with what the delivery said rendered
//! into the Run's input.
//!
//! - this module: the hook record, what creates and changes it, its machine
//! - [`verify`]: signatures and tokens over the raw body; the secrets
//! - [`inbound`]: what a delivery is (its event, its dedup key, whether it
//!   starts anything) and the record of how it was answered
//! - [`template`]: the input template

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::{parse_target, RunTarget};
use crate::fields::{FieldError, Fields};

pub mod inbound;
pub mod template;
pub mod verify;

/// Stable codes of the hooks' vocabulary.
pub mod codes {
    /// The hook is disabled: deliveries start nothing.
    pub const HOOK_DISABLED: &str = "HOOK_DISABLED";
    /// The input template failed on a delivery.
    pub const TEMPLATE_ERROR: &str = "TEMPLATE_ERROR";
    /// The hook has started its `max_runs_per_hour` this hour.
    pub const HOOK_RATE_LIMITED: &str = "HOOK_RATE_LIMITED";
}

/// Who signs a hook's deliveries, and how.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookKind {
    /// GitHub's webhooks: `X-Hub-Signature-256`.
    Github,
    /// Standard Webhooks (standardwebhooks.com): `webhook-signature`.
    Standard,
    /// Prometheus Alertmanager's webhook receiver: a bearer token.
    Alertmanager,
    /// CloudWatch alarms: an SNS topic of the hook's own that alarms'
    /// actions name, delivered to a queue the stack consumes (no public
    /// endpoint, no secret).
    Cloudwatch,
}

impl HookKind {
    pub const ALL: [HookKind; 4] = [
        HookKind::Github,
        HookKind::Standard,
        HookKind::Alertmanager,
        HookKind::Cloudwatch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HookKind::Github => "github",
            HookKind::Standard => "standard",
            HookKind::Alertmanager => "alertmanager",
            HookKind::Cloudwatch => "cloudwatch",
        }
    }

    pub fn parse(s: &str) -> Option<HookKind> {
        HookKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// What an Alertmanager hook does when a group resolves.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnResolved {
    /// Nothing starts (the default: the alert needs no one any more).
    #[default]
    Ignore,
    /// A Run starts, as for a firing.
    Run,
}

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookState {
    Enabled,
    Disabled,
    /// Deleted: its store removes it with this write.
    Deleted,
}

/// The most Runs a hook may start in an hour, unless it says fewer.
pub const DEFAULT_MAX_RUNS_PER_HOUR: u32 = 60;
/// The most a hook may ask for.
pub const MAX_RUNS_PER_HOUR_LIMIT: u32 = 3600;
/// The most GitHub event names a hook may filter on.
const MAX_EVENTS: usize = 64;

/// The fields `POST /v1/hooks` takes.
pub const HOOK_FIELDS: &[&str] = &[
    "kind",
    "agent",
    "team",
    "chain",
    "input_template",
    "callback_url",
    "events",
    "alarm_names",
    "on_resolved",
    "max_runs_per_hour",
    "enabled",
];

/// What a hook does, as its creator asked (validated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookSpec {
    pub kind: HookKind,
    pub target: RunTarget,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// GitHub events that start a Run (`None`: every event but `ping`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<String>>,
    /// CloudWatch alarms that start a Run (`None`: every alarm whose
    /// actions name the hook's topic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarm_names: Option<Vec<String>>,
    #[serde(default)]
    pub on_resolved: OnResolved,
    pub max_runs_per_hour: u32,
}

/// A hook of a tenant. Its secret is derived, never stored
/// ([`verify::hook_secret`] from `salt`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hook {
    pub hook_id: String,
    pub tenant: String,
    /// The key that created it.
    pub created_by: String,
    pub spec: HookSpec,
    state: HookState,
    /// The salt of the last rotation (`""` before the first).
    pub salt: String,
    /// A cloudwatch hook's SNS topic, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_arn: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Incremented by every write; every write is conditional on it.
    pub version: u64,
}

impl HookSpec {
    /// A create request, field by field (unknown fields refused).
    pub fn parse(body: &Value) -> Result<(HookSpec, bool), FieldError> {
        let f = Fields::new(body)?;
        f.only(HOOK_FIELDS)?;
        let kind = f.req_str("kind")?;
        let kind = HookKind::parse(kind).ok_or_else(|| {
            FieldError::new(
                "kind",
                "must be \"github\", \"standard\" or \"alertmanager\"",
            )
        })?;
        let target = parse_target(&f, &mut String::new())?;
        let mut spec = HookSpec {
            kind,
            target,
            input_template: None,
            callback_url: None,
            events: None,
            alarm_names: None,
            on_resolved: OnResolved::Ignore,
            max_runs_per_hour: DEFAULT_MAX_RUNS_PER_HOUR,
        };
        let patch = HookPatch::parse_fields(&f, body, false)?;
        let enabled = patch.enabled.unwrap_or(true);
        spec.apply(patch)?;
        Ok((spec, enabled))
    }

    /// Applies a patch's fields, checking what only makes sense together.
    fn apply(&mut self, patch: HookPatch) -> Result<(), FieldError> {
        if let Some(t) = patch.target {
            self.target = t;
        }
        if let Some(t) = patch.input_template {
            self.input_template = t;
        }
        if let Some(u) = patch.callback_url {
            self.callback_url = u;
        }
        if let Some(e) = patch.events {
            if e.is_some() && self.kind != HookKind::Github {
                return Err(FieldError::new(
                    "events",
                    "only a github hook filters events",
                ));
            }
            self.events = e;
        }
        if let Some(a) = patch.alarm_names {
            if a.is_some() && self.kind != HookKind::Cloudwatch {
                return Err(FieldError::new(
                    "alarm_names",
                    "only a cloudwatch hook filters alarms",
                ));
            }
            self.alarm_names = a;
        }
        if let Some(r) = patch.on_resolved {
            if !matches!(self.kind, HookKind::Alertmanager | HookKind::Cloudwatch) {
                return Err(FieldError::new(
                    "on_resolved",
                    "only an alertmanager or cloudwatch hook has resolved notifications",
                ));
            }
            self.on_resolved = r;
        }
        if let Some(n) = patch.max_runs_per_hour {
            self.max_runs_per_hour = n;
        }
        Ok(())
    }

    /// The template its deliveries' inputs are rendered with.
    pub fn template(&self) -> &str {
        self.input_template
            .as_deref()
            .unwrap_or_else(|| template::default_template(self.kind))
    }
}

/// A change to a hook (`PATCH /v1/hooks/{id}`): any field but `kind`;
/// `null` clears an optional one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookPatch {
    pub target: Option<RunTarget>,
    pub input_template: Option<Option<String>>,
    pub callback_url: Option<Option<String>>,
    pub events: Option<Option<Vec<String>>>,
    pub alarm_names: Option<Option<Vec<String>>>,
    pub on_resolved: Option<OnResolved>,
    pub max_runs_per_hour: Option<u32>,
    pub enabled: Option<bool>,
}

/// The fields `PATCH /v1/hooks/{id}` takes.
pub const HOOK_PATCH_FIELDS: &[&str] = &[
    "agent",
    "team",
    "chain",
    "input_template",
    "callback_url",
    "events",
    "alarm_names",
    "on_resolved",
    "max_runs_per_hour",
    "enabled",
];

impl HookPatch {
    pub fn parse(body: &Value) -> Result<HookPatch, FieldError> {
        let f = Fields::new(body)?;
        if body.get("kind").is_some() {
            return Err(FieldError::new("kind", "a hook's kind cannot change"));
        }
        f.only(HOOK_PATCH_FIELDS)?;
        HookPatch::parse_fields(&f, body, true)
    }

    fn parse_fields(f: &Fields<'_>, body: &Value, patch: bool) -> Result<HookPatch, FieldError> {
        // `null` clears an optional field of a patch; absent leaves it.
        let cleared = |key: &str| patch && body.get(key) == Some(&Value::Null);
        let named = ["agent", "team", "chain"]
            .iter()
            .any(|k| body.get(*k).is_some_and(|v| !v.is_null()));
        let target = if named {
            Some(parse_target(f, &mut String::new())?)
        } else {
            None
        };
        let input_template = match f.opt_str("input_template")? {
            Some(t) => {
                template::check(t)
                    .map_err(|e| FieldError::new("input_template", &e.to_string()))?;
                Some(Some(t.to_string()))
            }
            None if cleared("input_template") => Some(None),
            None => None,
        };
        let callback_url = match f.opt_str("callback_url")? {
            Some(u) => {
                if !(u.starts_with("https://") || u.starts_with("http://")) || u.len() > 2048 {
                    return Err(FieldError::new("callback_url", "must be an http(s) URL"));
                }
                Some(Some(u.to_string()))
            }
            None if cleared("callback_url") => Some(None),
            None => None,
        };
        let events = match f.opt_str_list("events")? {
            Some(list) => {
                if list.is_empty() || list.len() > MAX_EVENTS {
                    return Err(FieldError::new(
                        "events",
                        &format!("must name between 1 and {MAX_EVENTS} events"),
                    ));
                }
                if let Some(bad) = list.iter().find(|e| !valid_event(e)) {
                    return Err(FieldError::new(
                        "events",
                        &format!("'{bad}' is not an event name (a-z, 0-9, '_', or '*')"),
                    ));
                }
                Some(Some(list))
            }
            None if cleared("events") => Some(None),
            None => None,
        };
        let alarm_names = match f.opt_str_list("alarm_names")? {
            Some(list) => {
                if list.is_empty() || list.len() > MAX_EVENTS {
                    return Err(FieldError::new(
                        "alarm_names",
                        &format!("must name between 1 and {MAX_EVENTS} alarms"),
                    ));
                }
                if let Some(bad) = list.iter().find(|n| n.is_empty() || n.len() > 255) {
                    return Err(FieldError::new(
                        "alarm_names",
                        &format!("'{bad}' is not an alarm name (1-255 characters)"),
                    ));
                }
                Some(Some(list))
            }
            None if cleared("alarm_names") => Some(None),
            None => None,
        };
        let on_resolved = match f.opt_str("on_resolved")? {
            Some("ignore") => Some(OnResolved::Ignore),
            Some("run") => Some(OnResolved::Run),
            Some(_) => {
                return Err(FieldError::new(
                    "on_resolved",
                    "must be \"ignore\" or \"run\"",
                ));
            }
            None => None,
        };
        let max_runs_per_hour = match f.opt_u64("max_runs_per_hour")? {
            Some(n) if n == 0 || n > u64::from(MAX_RUNS_PER_HOUR_LIMIT) => {
                return Err(FieldError::new(
                    "max_runs_per_hour",
                    &format!("must be between 1 and {MAX_RUNS_PER_HOUR_LIMIT}"),
                ));
            }
            Some(n) => Some(n as u32),
            None => None,
        };
        Ok(HookPatch {
            target,
            input_template,
            callback_url,
            events,
            alarm_names,
            on_resolved,
            max_runs_per_hour,
            enabled: f.opt_bool("enabled")?,
        })
    }
}

/// A GitHub event name (`push`, `pull_request`), or `*` for all.
fn valid_event(e: &str) -> bool {
    e == "*"
        || (!e.is_empty()
            && e.len() <= 64
            && e.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'))
}

impl Hook {
    /// A new hook, enabled or not.
    pub fn new(
        hook_id: &str,
        tenant: &str,
        created_by: &str,
        spec: HookSpec,
        enabled: bool,
        salt: &str,
        now_ms: i64,
    ) -> Hook {
        Hook {
            hook_id: hook_id.to_string(),
            tenant: tenant.to_string(),
            created_by: created_by.to_string(),
            spec,
            state: if enabled {
                HookState::Enabled
            } else {
                HookState::Disabled
            },
            salt: salt.to_string(),
            topic_arn: None,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            version: 1,
        }
    }

    pub fn state(&self) -> HookState {
        self.state
    }

    pub fn enabled(&self) -> bool {
        self.state == HookState::Enabled
    }
}

/// What a hook's machine is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookEvent {
    /// Its fields change (validated already, but for what only makes
    /// sense together with its kind).
    Update(HookPatch),
    /// A new secret: the old one stops verifying.
    Rotate {
        salt: String,
    },
    Delete,
}

/// What the handler does once a hook's change is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookAction {
    /// Show the new secret, once.
    ShowSecret,
    /// Delete the hook's alarm topic.
    DeleteTopic(String),
}

/// Why a hook refused a change (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookRefusal {
    #[error("the hook was deleted")]
    Deleted,
    /// A cloudwatch hook has no secret: its alarms come through its topic.
    #[error("a cloudwatch hook has no secret to rotate: its alarms come through its topic")]
    NoSecret,
    #[error("{0}")]
    Invalid(FieldError),
}

impl crate::machine::Machine for Hook {
    type Event = HookEvent;
    type Action = HookAction;
    type Refusal = HookRefusal;
    type Version = u64;

    fn apply(&mut self, event: HookEvent, now_ms: i64) -> Result<Vec<HookAction>, HookRefusal> {
        let actions = match (self.state, event) {
            (HookState::Deleted, _) => return Err(HookRefusal::Deleted),
            (HookState::Enabled | HookState::Disabled, HookEvent::Update(patch)) => {
                let enabled = patch.enabled;
                let mut spec = self.spec.clone();
                spec.apply(patch).map_err(HookRefusal::Invalid)?;
                self.spec = spec;
                match enabled {
                    Some(true) => self.state = HookState::Enabled,
                    Some(false) => self.state = HookState::Disabled,
                    None => {}
                }
                vec![]
            }
            (HookState::Enabled | HookState::Disabled, HookEvent::Rotate { .. })
                if self.spec.kind == HookKind::Cloudwatch =>
            {
                return Err(HookRefusal::NoSecret);
            }
            (HookState::Enabled | HookState::Disabled, HookEvent::Rotate { salt }) => {
                self.salt = salt;
                vec![HookAction::ShowSecret]
            }
            (HookState::Enabled | HookState::Disabled, HookEvent::Delete) => {
                self.state = HookState::Deleted;
                self.topic_arn
                    .clone()
                    .map(HookAction::DeleteTopic)
                    .into_iter()
                    .collect()
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
