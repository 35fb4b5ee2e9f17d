//! A cloudwatch hook against the emulator's SNS: the hook's own topic,
//! subscribed to the stack's alarms queue, carries a CloudWatch alarm's
//! notification (the example AWS documents, its description `null`) to
//! the dispatcher, which starts one Run per state change; SNS delivering
//! the same change again starts nothing, nor does the alarm's return to
//! OK. The hook has no secret and its URL takes nothing.

#![allow(clippy::unwrap_used)]

use reqwest::Method;
use serde_json::{json, Value};

use armada_api::hooks::HookCreated;
use armada_domain::hook::inbound::Outcome;
use armada_domain::run::Trigger;
use armada_tests::{error_code, wait, RunState, TestStack};

const ALARM: &str = include_str!("fixtures/aws/cloudwatch-alarm.json");

async fn publish(t: &TestStack, topic: &str, alarm: &Value) {
    t.stack
        .aws
        .sns
        .publish()
        .topic_arn(topic)
        .subject("ALARM: \"Example alarm name\" in US East (N. Virginia)")
        .message(alarm.to_string())
        .send()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_alarm_on_the_hooks_topic_starts_one_run_per_state_change() {
    let t = TestStack::start().await;
    let (s, v) = t
        .raw(
            Method::POST,
            "/v1/hooks",
            Some(&t.stack.tenant_key),
            Some(r#"{"kind": "cloudwatch", "agent": "assistant"}"#),
            &[],
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let hook: HookCreated = serde_json::from_value(v).unwrap();
    assert!(hook.secret.is_none(), "no secret: {hook:?}");
    let topic = hook.topic_arn.clone().unwrap();
    let id = hook.hook_id.clone();

    let alarm: Value = serde_json::from_str(ALARM).unwrap();
    publish(&t, &topic, &alarm).await;
    let seen = wait::until("the alarm to start a run", wait::PATIENCE, || async {
        let seen = t.hook_deliveries(&id).await;
        (!seen.is_empty()).then_some(seen)
    })
    .await;
    let (Outcome::Started, Some(run_id)) = seen[0].clone() else {
        panic!("{seen:?}")
    };
    let run = t.wait_closed(&run_id).await;
    assert_eq!(run.state.outcome(), RunState::Completed, "{run:?}");
    assert!(
        run.input
            .as_deref()
            .unwrap()
            .starts_with("CloudWatch alarm Example alarm name is ALARM: Threshold Crossed"),
        "{run:?}"
    );
    assert!(matches!(&run.trigger, Some(Trigger::Hook { event, .. }) if event == "ALARM"));

    // SNS delivering the same change again, then the alarm back to OK.
    publish(&t, &topic, &alarm).await;
    let mut ok = alarm.clone();
    ok["NewStateValue"] = json!("OK");
    ok["OldStateValue"] = json!("ALARM");
    ok["StateChangeTime"] = json!("2023-08-01T12:05:00.000+0000");
    publish(&t, &topic, &ok).await;
    let seen = wait::until(
        "the repeat and the OK to be answered",
        wait::PATIENCE,
        || async {
            let seen = t.hook_deliveries(&id).await;
            (seen.len() >= 3).then_some(seen)
        },
    )
    .await;
    let mut answered: Vec<Outcome> = seen.iter().map(|(o, _)| *o).collect();
    answered.sort_by_key(|o| o.as_str());
    assert_eq!(
        answered,
        [Outcome::Duplicate, Outcome::Filtered, Outcome::Started]
    );

    // Its URL takes nothing; it has no secret to rotate.
    let (s, _) = t
        .raw(
            Method::POST,
            &format!("/v1/hooks/{id}"),
            None,
            Some(ALARM),
            &[],
        )
        .await;
    assert_eq!(s, 401);
    let (s, v) = t
        .raw(
            Method::POST,
            &format!("/v1/hooks/{id}/rotate"),
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(
        (s, error_code(&v).as_deref()),
        (409, Some("HOOK_HAS_NO_SECRET")),
        "{v}"
    );

    // Deleted: its topic goes with it.
    let (s, _) = t
        .raw(
            Method::DELETE,
            &format!("/v1/hooks/{id}"),
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(s, 204);
    let topics = t.stack.aws.sns.list_topics().send().await.unwrap();
    assert!(
        !topics
            .topics()
            .iter()
            .any(|tp| tp.topic_arn() == Some(topic.as_str())),
        "{topics:?}"
    );
    t.stack.stop().await;
}
