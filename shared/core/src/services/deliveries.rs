//! A verified delivery to a hook, answered (from its URL, or from its
//! alarm topic's queue): disabled, filtered, a repeat of one that started
//! a Run, over the hook's hourly budget, a template that fails, or a Run
//! started under the delivery's key; and the delivery recorded, through
//! its machine, with how it was answered.

use armada_domain::api::{CreateRun, KeyRole};
use armada_domain::hook::inbound::{Delivery, DeliveryEvent, Inbound, Verdict};
use armada_domain::hook::template::{self, Context, HookContext};
use armada_domain::hook::{codes, Hook};
use armada_domain::machine::Machine;
use armada_domain::run::Trigger;

use crate::services::auth::TenantKey;
use crate::services::starting::{self, StartRefused};
use crate::Services;

/// How a verified delivery was answered.
#[derive(Debug)]
pub enum Answered {
    Started {
        run_id: String,
    },
    /// A repeat of a delivery that started this Run.
    Duplicate {
        run_id: String,
    },
    /// A ping, or not an event the hook starts Runs for.
    Filtered,
    Disabled,
    /// Over `max` Runs this hour; the next hour starts in `retry_after_s`.
    RateLimited {
        max: u32,
        retry_after_s: u32,
    },
    /// The hook's template failed on it (or rendered nothing, or too much).
    TemplateFailed(String),
    /// The Run was refused (its agent is gone, a quota, a store outage).
    Refused(StartRefused),
}

/// The hour `now_ms` falls in (its start, in seconds) and how many
/// seconds remain of it (at least 1).
pub(crate) fn hour_window(now_ms: i64) -> (i64, u32) {
    let now_s = now_ms.div_euclid(1000);
    let start = now_s - now_s.rem_euclid(3600);
    (
        start,
        u32::try_from(start + 3600 - now_s).unwrap_or(3600).max(1),
    )
}

/// Answers a verified delivery of `hook` and records how (the record is
/// best effort: an answer, and its Run, stand without it). An outage is
/// answered, not recorded: the sender tries again.
pub async fn answer(
    svc: &Services,
    hook: &Hook,
    read: &Inbound,
    payload: &serde_json::Value,
    delivery: Delivery,
) -> Answered {
    let (answered, event) = decide(svc, hook, read, payload, &delivery).await;
    if let Some(event) = event {
        record(svc, delivery, event).await;
    }
    answered
}

async fn decide(
    svc: &Services,
    hook: &Hook,
    read: &Inbound,
    payload: &serde_json::Value,
    delivery: &Delivery,
) -> (Answered, Option<DeliveryEvent>) {
    if !hook.enabled() {
        return (Answered::Disabled, Some(DeliveryEvent::Disabled));
    }
    match &read.verdict {
        Verdict::Start => {}
        Verdict::Ping => {
            let reason = "a ping: nothing to start".to_string();
            return (Answered::Filtered, Some(DeliveryEvent::Filtered { reason }));
        }
        Verdict::Filtered { reason } => {
            let reason = reason.clone();
            return (Answered::Filtered, Some(DeliveryEvent::Filtered { reason }));
        }
    }
    // A repeat answers the first Run, whatever the budget says now.
    let idem_key = format!("hook:{}:{}", hook.hook_id, read.dedup_key);
    match svc.idempotency.get(&hook.tenant, &idem_key).await {
        Ok(Some(first)) => return duplicate(first.run_id),
        Ok(None) => {}
        Err(e) => return (Answered::Refused(e.into()), None),
    }
    let (window, retry_after_s) = hour_window(delivery.received_at_ms);
    let max = hook.spec.max_runs_per_hour;
    match svc.hooks.count_start(&hook.hook_id, window, max).await {
        Ok(true) => {}
        Ok(false) => {
            return (
                Answered::RateLimited { max, retry_after_s },
                Some(DeliveryEvent::RateLimited),
            )
        }
        Err(e) => return (Answered::Refused(e.into()), None),
    }
    let ctx = Context {
        event: &read.event,
        payload,
        hook: HookContext {
            hook_id: &hook.hook_id,
            kind: hook.spec.kind,
        },
    };
    let input = template::render_input(hook.spec.template(), &ctx, "hook");
    let input = match input {
        Ok(input) => input,
        Err(why) => {
            let reason = format!("{}: {why}", codes::TEMPLATE_ERROR);
            return (
                Answered::TemplateFailed(why),
                Some(DeliveryEvent::Rejected { reason }),
            );
        }
    };
    match start(svc, hook, read, input, delivery, idem_key).await {
        Ok(accepted) if accepted.replayed == Some(true) => duplicate(accepted.run_id),
        Ok(accepted) => (
            Answered::Started {
                run_id: accepted.run_id.clone(),
            },
            Some(DeliveryEvent::Started {
                run_id: accepted.run_id,
            }),
        ),
        // An outage is not recorded (the sender retries it); any other
        // refusal is, with its reason.
        Err(
            e @ (StartRefused::Store(_) | StartRefused::NotQueued | StartRefused::Contended(_)),
        ) => (Answered::Refused(e), None),
        Err(e) => {
            let reason = e.to_string();
            (
                Answered::Refused(e),
                Some(DeliveryEvent::Rejected { reason }),
            )
        }
    }
}

fn duplicate(run_id: String) -> (Answered, Option<DeliveryEvent>) {
    (
        Answered::Duplicate {
            run_id: run_id.clone(),
        },
        Some(DeliveryEvent::Duplicate { run_id }),
    )
}

/// Starts the delivery's Run, as a Run the hook asked for: its starter is
/// the hook (so any approver key of the tenant may decide its approvals),
/// and its dedup key is its `Idempotency-Key`.
async fn start(
    svc: &Services,
    hook: &Hook,
    read: &Inbound,
    input: String,
    delivery: &Delivery,
    idem_key: String,
) -> Result<starting::Accepted, StartRefused> {
    let as_hook = TenantKey {
        tenant: hook.tenant.clone(),
        key_id: hook.hook_id.clone(),
        role: KeyRole::Member,
        owner: None,
    };
    let cr = CreateRun {
        target: hook.spec.target.clone(),
        input,
        session_id: None,
        callback_url: hook.spec.callback_url.clone(),
        metadata: serde_json::json!({}),
        started_from: Some(Trigger::Hook {
            hook_id: hook.hook_id.clone(),
            event: read.event.clone(),
            delivery_id: delivery.delivery_id.clone(),
        }),
    };
    // The dedup key is the fingerprint too: a repeat is always the same.
    let idem = Some((idem_key, read.dedup_key.clone()));
    starting::start_target(svc, &as_hook, cr, idem).await
}

/// Records how a verified delivery was answered. The answer stands when
/// the record cannot be written (its Run, if any, is written already).
async fn record(svc: &Services, mut delivery: Delivery, event: DeliveryEvent) {
    if delivery.apply(event, svc.clock.now_ms()).is_err() {
        return;
    }
    if let Err(e) = svc.hooks.record_delivery(&delivery).await {
        tracing::warn!(hook_id = %delivery.hook_id, delivery_id = %delivery.delivery_id, error = %e, "a delivery's record was not written");
    }
}
