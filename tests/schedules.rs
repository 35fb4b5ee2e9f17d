//! Schedules against the emulator's EventBridge Scheduler: a schedule is
//! stored there as a timer whose target is the dispatch queue, the local
//! stack fires it as the scheduler would, and each firing is recorded
//! once. An `at` schedule a few seconds ahead fires once and its Run
//! completes; a disabled one due at the same time does not fire.

#![allow(clippy::unwrap_used)]

use reqwest::Method;
use serde_json::{json, Value};

use armada_api::schedules::{FiringsPage, ScheduleCreated, ScheduleView};
use armada_domain::run::Trigger;
use armada_domain::schedule::FiringOutcome;
use armada_tests::{error_code, error_message, wait, RunState, TestStack};

async fn create(t: &TestStack, body: Value) -> ScheduleCreated {
    let (s, v) = t
        .raw(
            Method::POST,
            "/v1/schedules",
            Some(&t.stack.tenant_key),
            Some(&body.to_string()),
            &[],
        )
        .await;
    assert_eq!(s, 201, "{v}");
    serde_json::from_value(v).unwrap()
}

async fn firings(t: &TestStack, id: &str) -> FiringsPage {
    let (s, v) = t
        .raw(
            Method::GET,
            &format!("/v1/schedules/{id}/firings"),
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(s, 200, "{v}");
    serde_json::from_value(v).unwrap()
}

/// `at(...)` a few seconds from now, in UTC.
fn soon(seconds: i64) -> String {
    let at = chrono::Utc::now() + chrono::Duration::seconds(seconds);
    format!("at({})", at.format("%Y-%m-%dT%H:%M:%S"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_at_schedule_fires_once_and_a_disabled_one_does_not() {
    let t = TestStack::start().await;
    let at = soon(3);
    let on = create(
        &t,
        json!({"expression": at, "agent": "assistant", "input": "the nightly report"}),
    )
    .await;
    let off = create(
        &t,
        json!({"expression": at, "agent": "assistant", "input": "never", "enabled": false}),
    )
    .await;
    assert_eq!(on.next.len(), 1, "once: {:?}", on.next);
    assert!(
        off.next.is_empty(),
        "a disabled schedule has no next firing"
    );

    // The timer is EventBridge Scheduler's, in the stack's group.
    let group = format!("{}-schedules", t.stack.template.stack());
    let stored = t
        .stack
        .aws
        .scheduler
        .get_schedule()
        .group_name(&group)
        .name(&on.schedule_id)
        .send()
        .await
        .unwrap();
    assert_eq!(stored.schedule_expression(), Some(at.as_str()));
    let input = stored.target().and_then(|t| t.input()).unwrap_or_default();
    assert!(input.contains("<aws.scheduler.scheduled-time>"), "{input}");

    let fired = wait::until("the schedule to fire", wait::PATIENCE, || async {
        let page = firings(&t, &on.schedule_id).await;
        (!page.firings.is_empty()).then_some(page)
    })
    .await;
    assert_eq!(fired.firings.len(), 1, "{fired:?}");
    assert_eq!(fired.firings[0].outcome, FiringOutcome::Started);
    let run_id = fired.firings[0].run_id.clone().unwrap();
    let run = t.wait_closed(&run_id).await;
    assert_eq!(run.state.outcome(), RunState::Completed, "{run:?}");
    assert_eq!(run.input.as_deref(), Some("the nightly report"));
    assert!(
        matches!(&run.trigger, Some(Trigger::Schedule { schedule_id, .. }) if *schedule_id == on.schedule_id),
        "{run:?}"
    );
    // Due at the same time, and never fired: it is disabled.
    assert!(firings(&t, &off.schedule_id).await.firings.is_empty());
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schedules_say_when_they_fire_in_their_time_zone_and_refuse_what_aws_would() {
    let t = TestStack::start().await;
    let created = create(
        &t,
        json!({"expression": "cron(0 10 ? * MON-FRI *)", "timezone": "Europe/Berlin",
               "agent": "assistant", "input": "stand-up notes", "start_at": "2027-01-04T00:00:00+01:00"}),
    )
    .await;
    assert_eq!(
        created.next,
        [
            "2027-01-04T10:00:00+01:00",
            "2027-01-05T10:00:00+01:00",
            "2027-01-06T10:00:00+01:00",
            "2027-01-07T10:00:00+01:00",
            "2027-01-08T10:00:00+01:00"
        ]
    );
    for (expression, says) in [
        ("rate(1 minutes)", "singular only for 1"),
        ("cron(0 10 * * * *)", "cannot both be given"),
        ("every day", "cron(...), rate(...) or at(...)"),
    ] {
        let body = json!({"expression": expression, "agent": "assistant", "input": "x"});
        let (s, v) = t
            .raw(
                Method::POST,
                "/v1/schedules",
                Some(&t.stack.tenant_key),
                Some(&body.to_string()),
                &[],
            )
            .await;
        assert_eq!(
            (s, error_code(&v).as_deref()),
            (400, Some("INVALID_FIELD")),
            "{v}"
        );
        let message = error_message(&v);
        assert!(
            message.starts_with("expression:") && message.contains(says),
            "{message}"
        );
    }
    // Changed: its timer follows; deleted: its timer goes.
    let id = &created.schedule_id;
    let (s, v) = t
        .raw(
            Method::PATCH,
            &format!("/v1/schedules/{id}"),
            Some(&t.stack.tenant_key),
            Some(r#"{"expression": "cron(30 7 ? * SAT *)"}"#),
            &[],
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let view: ScheduleView = serde_json::from_value(v).unwrap();
    assert_eq!(view.next[0], "2027-01-09T07:30:00+01:00");
    let group = format!("{}-schedules", t.stack.template.stack());
    let timer = t
        .stack
        .aws
        .scheduler
        .get_schedule()
        .group_name(&group)
        .name(id)
        .send()
        .await
        .unwrap();
    assert_eq!(timer.schedule_expression(), Some("cron(30 7 ? * SAT *)"));
    let (s, _) = t
        .raw(
            Method::DELETE,
            &format!("/v1/schedules/{id}"),
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(s, 204);
    let gone = t
        .stack
        .aws
        .scheduler
        .get_schedule()
        .group_name(&group)
        .name(id)
        .send()
        .await;
    assert!(gone.is_err(), "the timer is deleted with it");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_firing_due_while_the_stack_was_down_fires_once_when_it_is_back() {
    let name = TestStack::stack_name();
    // The deployment keeps its secret across restarts, as a deployed
    // stack keeps its parameter: the timers' sealed messages stay valid.
    let deployment =
        armada_tests::params(&[("CallbackSigningSecret", "a secret kept across restarts")]);
    let first = TestStack::start_as(name.clone(), deployment.clone(), None, vec![]).await;
    let at = chrono::Utc::now() + chrono::Duration::seconds(4);
    let expression = format!("at({})", at.format("%Y-%m-%dT%H:%M:%S"));
    let created = create(
        &first,
        json!({"expression": expression, "agent": "assistant", "input": "catch up"}),
    )
    .await;
    // Down, as `kill -9` of the functions host, before its time comes.
    first.stack.kill();
    wait::until("the firing's time to pass", wait::PATIENCE, || async {
        (chrono::Utc::now() > at + chrono::Duration::seconds(1)).then_some(())
    })
    .await;

    let second = TestStack::start_as(name, deployment, None, vec![]).await;
    let fired = wait::until("the late firing", wait::PATIENCE, || async {
        let page = firings(&second, &created.schedule_id).await;
        (!page.firings.is_empty()).then_some(page)
    })
    .await;
    assert_eq!(fired.firings.len(), 1, "once: {fired:?}");
    let firing = &fired.firings[0];
    assert_eq!(firing.outcome, FiringOutcome::Started, "{firing:?}");
    assert!(firing.fired_at > firing.scheduled_at, "late: {firing:?}");
    let run = second.wait_closed(firing.run_id.as_deref().unwrap()).await;
    assert_eq!(run.state.outcome(), RunState::Completed, "{run:?}");
    second.stack.stop().await;
}
