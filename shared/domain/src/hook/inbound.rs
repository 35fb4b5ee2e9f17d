//! What a verified delivery to a hook is: its event, the key that makes a
//! repeat of it start nothing, and whether it starts a Run at all; then
//! the record of how it was answered ([`Delivery`], with its machine).
//!
//! Dedup keys are the sender's own: GitHub's `X-GitHub-Delivery`, Standard
//! Webhooks' `webhook-id`, and for Alertmanager (which has no delivery id
//! and repeats a notification every `repeat_interval`) its group, status
//! and the `(fingerprint, startsAt)` of every alert: a repeat is the same,
//! while an alert that fires again after resolving starts anew.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::crypto::sha256_hex;
use crate::hook::{HookKind, HookSpec, OnResolved};

/// What a delivery's headers say beside its signature.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers<'a> {
    /// `X-GitHub-Event`.
    pub github_event: Option<&'a str>,
    /// `X-GitHub-Delivery`.
    pub github_delivery: Option<&'a str>,
    /// `webhook-id`.
    pub webhook_id: Option<&'a str>,
}

/// A verified delivery, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    /// The event's name.
    pub event: String,
    /// The sender's key of this delivery (see the module's note).
    pub dedup_key: String,
    /// Whether it starts a Run, and if not why.
    pub verdict: Verdict,
}

/// Whether a verified delivery starts a Run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Start,
    /// GitHub's `ping`, sent when a hook is set up: answered, nothing more.
    Ping,
    /// Not an event the hook starts Runs for (`reason` says which).
    Filtered {
        reason: String,
    },
}

/// A delivery that cannot be read: `400`, with what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unreadable(pub String);

/// The longest dedup key a sender may give (longer ones are hashed).
const MAX_KEY_CHARS: usize = 200;

/// Reads a verified delivery of `spec`'s kind: `payload` is its body.
pub fn read(
    spec: &HookSpec,
    headers: &Headers<'_>,
    payload: &Value,
) -> Result<Inbound, Unreadable> {
    match spec.kind {
        HookKind::Github => {
            let event = header(headers.github_event, "X-GitHub-Event")?;
            let id = header(headers.github_delivery, "X-GitHub-Delivery")?;
            let verdict = if event == "ping" {
                Verdict::Ping
            } else if spec
                .events
                .as_ref()
                .is_some_and(|wanted| !wanted.iter().any(|w| w == "*" || w == event))
            {
                Verdict::Filtered {
                    reason: format!("the hook does not start runs for '{event}' events"),
                }
            } else {
                Verdict::Start
            };
            Ok(Inbound {
                event: event.to_string(),
                dedup_key: key(id),
                verdict,
            })
        }
        HookKind::Standard => {
            let id = header(headers.webhook_id, "webhook-id")?;
            let event = payload
                .get("type")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty() && t.len() <= 200)
                .unwrap_or("webhook");
            Ok(Inbound {
                event: event.to_string(),
                dedup_key: key(id),
                verdict: Verdict::Start,
            })
        }
        HookKind::Alertmanager => alertmanager(spec, payload),
        HookKind::Cloudwatch => alarm(spec, payload),
    }
}

/// A CloudWatch alarm's state change, as its SNS message carries it
/// (docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/AlarmThatSendsEmail.html).
/// Every field but the name, the new state and the time of the change is
/// optional: `AlarmDescription`, for one, is `null` when the alarm has
/// none. The dedup key is the alarm (its ARN, or its account, region and
/// name) and the time of the change: SNS's retries of one change share
/// it, the next change does not.
fn alarm(spec: &HookSpec, payload: &Value) -> Result<Inbound, Unreadable> {
    let text = |name: &str| payload.get(name).and_then(Value::as_str);
    let required = |name: &str| {
        text(name)
            .ok_or_else(|| Unreadable(format!("{name}: must be a string (a CloudWatch alarm)")))
    };
    let name = required("AlarmName")?;
    let state = required("NewStateValue")?;
    let changed = required("StateChangeTime")?;
    let alarm = match text("AlarmArn") {
        Some(arn) => arn.to_string(),
        None => format!(
            "{}:{}:{name}",
            text("AWSAccountId").unwrap_or_default(),
            text("Region").unwrap_or_default()
        ),
    };
    let verdict = if spec
        .alarm_names
        .as_ref()
        .is_some_and(|names| !names.iter().any(|n| n == name))
    {
        Verdict::Filtered {
            reason: format!("the hook does not start runs for the alarm '{name}'"),
        }
    } else {
        match state {
            "ALARM" => Verdict::Start,
            "OK" if spec.on_resolved == OnResolved::Run => Verdict::Start,
            "OK" => Verdict::Filtered {
                reason: "the alarm is OK again (the hook's on_resolved is 'ignore')".into(),
            },
            other => Verdict::Filtered {
                reason: format!("the alarm's state is {other}"),
            },
        }
    };
    Ok(Inbound {
        event: state.to_string(),
        dedup_key: sha256_hex(format!("{alarm}\n{changed}").as_bytes()),
        verdict,
    })
}

fn header<'a>(value: Option<&'a str>, name: &str) -> Result<&'a str, Unreadable> {
    value
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| Unreadable(format!("the {name} header is missing")))
}

/// A sender's id as a key: kept when short and plain, hashed otherwise.
fn key(id: &str) -> String {
    let plain = id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    if plain && id.len() <= MAX_KEY_CHARS {
        id.to_string()
    } else {
        sha256_hex(id.as_bytes())
    }
}

/// Alertmanager's webhook payload, version 4
/// (prometheus.io/docs/alerting/latest/configuration/#webhook_config).
fn alertmanager(spec: &HookSpec, payload: &Value) -> Result<Inbound, Unreadable> {
    let field = |name: &str| {
        payload.get(name).and_then(Value::as_str).ok_or_else(|| {
            Unreadable(format!(
                "{name}: must be a string (Alertmanager's payload version 4)"
            ))
        })
    };
    let version = field("version")?;
    if version != "4" {
        return Err(Unreadable(format!(
            "version: '{version}' is not Alertmanager's payload version 4"
        )));
    }
    let status = field("status")?;
    let group = field("groupKey")?;
    let alerts = payload
        .get("alerts")
        .and_then(Value::as_array)
        .ok_or_else(|| Unreadable("alerts: must be an array".into()))?;
    let mut firing: Vec<(String, String)> = alerts
        .iter()
        .map(|a| {
            let s = |k: &str| a.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            (s("fingerprint"), s("startsAt"))
        })
        .collect();
    firing.sort();
    let mut material = format!("{group}\n{status}");
    for (fingerprint, starts_at) in &firing {
        material.push_str(&format!("\n{fingerprint} {starts_at}"));
    }
    let verdict = match status {
        "firing" => Verdict::Start,
        "resolved" if spec.on_resolved == OnResolved::Run => Verdict::Start,
        "resolved" => Verdict::Filtered {
            reason: "a resolved notification (the hook's on_resolved is 'ignore')".into(),
        },
        other => {
            return Err(Unreadable(format!(
                "status: '{other}' is not firing or resolved"
            )))
        }
    };
    Ok(Inbound {
        event: status.to_string(),
        dedup_key: sha256_hex(material.as_bytes()),
        verdict,
    })
}

/// How a delivery was answered.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Received and verified; not answered yet.
    Received,
    /// A Run started.
    Started,
    /// A repeat of a delivery that started a Run: the first Run.
    Duplicate,
    /// Not an event the hook starts Runs for (a `ping` too).
    Filtered,
    /// Over the hook's `max_runs_per_hour`.
    RateLimited,
    /// The hook is disabled.
    Disabled,
    /// Verified but refused (its template failed; the Run was refused).
    Rejected,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Received => "received",
            Outcome::Started => "started",
            Outcome::Duplicate => "duplicate",
            Outcome::Filtered => "filtered",
            Outcome::RateLimited => "rate_limited",
            Outcome::Disabled => "disabled",
            Outcome::Rejected => "rejected",
        }
    }
}

/// The record of one verified delivery to a hook, kept for
/// `GET /v1/hooks/{id}/deliveries` (its body is not: a Run that started
/// has it in its input).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub delivery_id: String,
    pub hook_id: String,
    pub tenant: String,
    pub received_at_ms: i64,
    pub event: String,
    outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Why it started nothing (a code and what it means).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How a received delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryEvent {
    Started { run_id: String },
    Duplicate { run_id: String },
    Filtered { reason: String },
    RateLimited,
    Disabled,
    Rejected { reason: String },
}

/// A delivery is answered once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the delivery was answered already ({0:?})")]
pub struct Answered(pub Outcome);

impl Delivery {
    /// A verified delivery, just received.
    pub fn received(
        delivery_id: &str,
        hook_id: &str,
        tenant: &str,
        event: &str,
        now_ms: i64,
    ) -> Delivery {
        Delivery {
            delivery_id: delivery_id.to_string(),
            hook_id: hook_id.to_string(),
            tenant: tenant.to_string(),
            received_at_ms: now_ms,
            event: event.to_string(),
            outcome: Outcome::Received,
            run_id: None,
            reason: None,
        }
    }

    pub fn outcome(&self) -> Outcome {
        self.outcome
    }
}

impl crate::machine::Machine for Delivery {
    type Event = DeliveryEvent;
    /// A delivery's answer is the handler's reply; nothing follows it.
    type Action = std::convert::Infallible;
    type Refusal = Answered;
    /// Written once, when answered.
    type Version = ();

    fn apply(&mut self, event: DeliveryEvent, _now_ms: i64) -> Result<Vec<Self::Action>, Answered> {
        if self.outcome != Outcome::Received {
            return Err(Answered(self.outcome));
        }
        let (outcome, run_id, reason) = match event {
            DeliveryEvent::Started { run_id } => (Outcome::Started, Some(run_id), None),
            DeliveryEvent::Duplicate { run_id } => (Outcome::Duplicate, Some(run_id), None),
            DeliveryEvent::Filtered { reason } => (Outcome::Filtered, None, Some(reason)),
            DeliveryEvent::RateLimited => (
                Outcome::RateLimited,
                None,
                Some(format!(
                    "{}: over the hook's max_runs_per_hour",
                    super::codes::HOOK_RATE_LIMITED
                )),
            ),
            DeliveryEvent::Disabled => (
                Outcome::Disabled,
                None,
                Some(format!(
                    "{}: the hook is disabled",
                    super::codes::HOOK_DISABLED
                )),
            ),
            DeliveryEvent::Rejected { reason } => (Outcome::Rejected, None, Some(reason)),
        };
        self.outcome = outcome;
        self.run_id = run_id;
        self.reason = reason;
        Ok(vec![])
    }

    fn version(&self) {}
}
