//! Schedules at the API on in-memory ports: each change reaches its
//! timer (what EventBridge Scheduler would hold), an approver key reads
//! but does not write, and another tenant's schedule is not there.

use serde_json::json;

use armada_domain::api::KeyRole;
use armada_domain::messages::DispatchMessage;

use crate::tests::{code, Api};

#[tokio::test]
async fn every_change_of_a_schedule_reaches_its_timer() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    let body = json!({"expression": "rate(1 hour)", "agent": "assistant", "input": "sweep"});
    let (s, v) = api
        .call("POST", "/v1/schedules", Some(&key), &[], Some(body))
        .await;
    assert_eq!(s, 201, "{v}");
    let id = v["schedule_id"].as_str().unwrap_or_default().to_string();
    assert_eq!(v["next"].as_array().map(Vec::len), Some(5));
    let (timer, message) = api.mem.state().timers[&id].clone();
    assert!(timer.enabled());
    // What the scheduler sends: sealed for this schedule, its time left to it.
    let sent: DispatchMessage = serde_json::from_str(&message).expect("a dispatch message");
    assert!(sent.sealed_by_control_plane(&api.svc.cfg.callback_signing_secret));
    assert!(
        matches!(&sent, DispatchMessage::FireSchedule { scheduled_at, .. }
        if scheduled_at == "<aws.scheduler.scheduled-time>")
    );

    let path = format!("/v1/schedules/{id}");
    let (s, v) = api
        .call(
            "PATCH",
            &path,
            Some(&key),
            &[],
            Some(json!({"enabled": false})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["next"], json!([]));
    assert!(!api.mem.state().timers[&id].0.enabled());

    let approver = api.key_with_role("acme", KeyRole::Approver).await;
    let (s, _) = api.call("GET", &path, Some(&approver), &[], None).await;
    assert_eq!(s, 200);
    let (s, v) = api.call("DELETE", &path, Some(&approver), &[], None).await;
    assert_eq!((s, code(&v)), (403, "FORBIDDEN"));
    let other = api.key("globex").await;
    let (s, _) = api.call("DELETE", &path, Some(&other), &[], None).await;
    assert_eq!(s, 404);

    let (s, _) = api.call("DELETE", &path, Some(&key), &[], None).await;
    assert_eq!(s, 204);
    assert!(!api.mem.state().timers.contains_key(&id));
    assert!(api.mem.state().schedules.is_empty());
    let (s, _) = api.call("GET", &path, Some(&key), &[], None).await;
    assert_eq!(s, 404);
}
