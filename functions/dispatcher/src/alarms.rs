//! Cloudwatch hooks' alarms: each hook's SNS topic delivers CloudWatch's
//! alarm notifications to the alarms queue, and each is answered here as
//! a verified delivery to the hook (the topic is the hook's, and only its
//! owner and CloudWatch may publish to it): the same answers, records and
//! Runs as a delivery to a hook's URL.

use serde::Deserialize;
use serde_json::Value;

use crate::Dispatcher;
use crate::Handled;
use armada_core::batch::Outcome;
use armada_core::clock::new_id;
use armada_core::services::deliveries::{self, Answered};
use armada_core::services::starting::StartRefused;
use armada_domain::hook::inbound::{self, Delivery, Headers};
use armada_domain::hook::HookKind;

/// What SNS puts on an SQS queue (not raw delivery).
#[derive(Debug, Deserialize)]
struct Notification {
    #[serde(rename = "Type")]
    kind: String,
    #[serde(rename = "TopicArn")]
    topic_arn: String,
    #[serde(rename = "Message", default)]
    message: String,
}

impl Dispatcher {
    pub(crate) async fn alarm(&self, body: &str) -> Handled {
        let n: Notification = match serde_json::from_str(body) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "an alarms-queue message that is no SNS notification dropped");
                return Ok(Outcome::Done);
            }
        };
        if n.kind != "Notification" {
            // A same-account SQS subscription needs no confirmation.
            tracing::info!(kind = %n.kind, topic = %n.topic_arn, "an SNS message that is no notification dropped");
            return Ok(Outcome::Done);
        }
        let Some(hook_id) = self.svc.topics.hook_of(&n.topic_arn) else {
            tracing::warn!(topic = %n.topic_arn, "an alarm from a topic that is no hook's dropped");
            return Ok(Outcome::Done);
        };
        let Some(hook) = self.svc.hooks.get(&hook_id).await? else {
            tracing::info!(hook_id, "an alarm for a hook that is gone dropped");
            return Ok(Outcome::Done);
        };
        if hook.spec.kind != HookKind::Cloudwatch || hook.topic_arn.as_deref() != Some(&n.topic_arn)
        {
            tracing::error!(security = true, hook_id, topic = %n.topic_arn, "an alarm from a topic that is not the hook's dropped");
            return Ok(Outcome::Done);
        }
        let payload: Value = match serde_json::from_str(&n.message) {
            Ok(v) if armada_domain::fields::too_deep(&v).is_none() => v,
            _ => {
                tracing::warn!(
                    hook_id,
                    "an alarm whose message is not a CloudWatch alarm dropped"
                );
                return Ok(Outcome::Done);
            }
        };
        let read = match inbound::read(&hook.spec, &Headers::default(), &payload) {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(hook_id, error = %e, "an unreadable alarm dropped");
                return Ok(Outcome::Done);
            }
        };
        let now = self.svc.clock.now_ms();
        let delivery = Delivery::received(
            &new_id("dlv"),
            &hook.hook_id,
            &hook.tenant,
            &read.event,
            now,
        );
        match deliveries::answer(&self.svc, &hook, &read, &payload, delivery).await {
            Answered::Started { run_id } => {
                tracing::info!(hook_id, run_id, event = %read.event, "an alarm started a run");
                Ok(Outcome::Done)
            }
            Answered::Refused(StartRefused::Store(e)) => Err(e.into()),
            // Its tenant's quotas, or contention: the alarm waits its turn.
            Answered::Refused(
                e @ (StartRefused::TooManyActiveRuns { .. }
                | StartRefused::RateLimited { .. }
                | StartRefused::NotQueued
                | StartRefused::Contended(_)),
            ) => Ok(Outcome::retry(e.to_string())),
            other => {
                tracing::info!(hook_id, event = %read.event, answered = ?other, "an alarm answered");
                Ok(Outcome::Done)
            }
        }
    }
}
