use serde_json::json;

use super::inbound::{self, Delivery, DeliveryEvent, Headers, Outcome, Verdict};
use super::*;
use crate::machine::Machine;

fn spec(body: Value) -> HookSpec {
    HookSpec::parse(&body).expect("valid").0
}

#[test]
fn a_create_request_is_read_field_by_field() {
    let (s, enabled) = HookSpec::parse(&json!({"kind": "github", "agent": "reviewer",
        "events": ["push", "pull_request"], "callback_url": "https://example.com/cb"}))
    .unwrap();
    assert!(enabled);
    assert_eq!(s.kind, HookKind::Github);
    assert_eq!(s.target, RunTarget::Agent("reviewer".into()));
    assert_eq!(
        s.events.as_deref(),
        Some(&["push".to_string(), "pull_request".to_string()][..])
    );
    assert_eq!(s.max_runs_per_hour, DEFAULT_MAX_RUNS_PER_HOUR);
    let (_, enabled) =
        HookSpec::parse(&json!({"kind": "standard", "team": "ops", "enabled": false})).unwrap();
    assert!(!enabled);
    for (body, field) in [
        (json!({"kind": "gitlab", "agent": "a"}), "kind"),
        (json!({"agent": "a"}), "kind"),
        (json!({"kind": "github"}), "agent"),
        (json!({"kind": "github", "agent": "a", "team": "t"}), "team"),
        (
            json!({"kind": "github", "agent": "a", "secret": "x"}),
            "secret",
        ),
        (
            json!({"kind": "github", "agent": "a", "input_template": "{% if %}"}),
            "input_template",
        ),
        (
            json!({"kind": "github", "agent": "a", "callback_url": "ftp://x"}),
            "callback_url",
        ),
        (
            json!({"kind": "github", "agent": "a", "events": []}),
            "events",
        ),
        (
            json!({"kind": "github", "agent": "a", "events": ["Push!"]}),
            "events",
        ),
        (
            json!({"kind": "standard", "agent": "a", "events": ["push"]}),
            "events",
        ),
        (
            json!({"kind": "github", "agent": "a", "on_resolved": "run"}),
            "on_resolved",
        ),
        (
            json!({"kind": "alertmanager", "agent": "a", "on_resolved": "maybe"}),
            "on_resolved",
        ),
        (
            json!({"kind": "github", "agent": "a", "max_runs_per_hour": 0}),
            "max_runs_per_hour",
        ),
        (
            json!({"kind": "github", "agent": "a", "max_runs_per_hour": 3601}),
            "max_runs_per_hour",
        ),
    ] {
        let e = HookSpec::parse(&body).unwrap_err();
        assert!(e.field.starts_with(field), "{body}: {e}");
    }
}

fn hook(body: Value) -> Hook {
    let (s, enabled) = HookSpec::parse(&body).unwrap();
    Hook::new("hook_1", "acme", "key_1", s, enabled, "", 1_000)
}

#[test]
fn a_hook_changes_only_through_its_machine() {
    let mut h = hook(json!({"kind": "github", "agent": "a", "events": ["push"]}));
    let patch =
        HookPatch::parse(&json!({"team": "ops", "events": null, "enabled": false})).unwrap();
    assert_eq!(h.apply(HookEvent::Update(patch), 2_000), Ok(vec![]));
    assert_eq!(h.spec.target, RunTarget::Team("ops".into()));
    assert_eq!(h.spec.events, None);
    assert_eq!(
        (h.state(), h.version, h.updated_at_ms),
        (HookState::Disabled, 2, 2_000)
    );

    // A patch that does not fit the kind changes nothing.
    let before = h.clone();
    let patch = HookPatch::parse(&json!({"on_resolved": "run"})).unwrap();
    assert!(matches!(
        h.apply(HookEvent::Update(patch), 3_000),
        Err(HookRefusal::Invalid(_))
    ));
    assert_eq!(h, before);
    assert_eq!(
        HookPatch::parse(&json!({"kind": "standard"}))
            .unwrap_err()
            .field,
        "kind"
    );

    assert_eq!(
        h.apply(HookEvent::Rotate { salt: "s1".into() }, 4_000),
        Ok(vec![HookAction::ShowSecret])
    );
    assert_eq!(h.salt, "s1");
    assert_eq!(h.apply(HookEvent::Delete, 5_000), Ok(vec![]));
    assert_eq!(h.state(), HookState::Deleted);
    assert_eq!(h.apply(HookEvent::Delete, 6_000), Err(HookRefusal::Deleted));
    assert_eq!(
        h.apply(HookEvent::Rotate { salt: "s2".into() }, 6_000),
        Err(HookRefusal::Deleted)
    );
}

#[test]
fn a_stored_hook_reads_back() {
    let h = hook(json!({"kind": "alertmanager", "chain": ["a", "b"], "on_resolved": "run"}));
    let stored = serde_json::to_value(&h).unwrap();
    assert_eq!(stored["spec"]["target"], json!({"chain": ["a", "b"]}));
    assert_eq!(serde_json::from_value::<Hook>(stored).unwrap(), h);
}

fn github<'a>(event: &'a str, id: &'a str) -> Headers<'a> {
    Headers {
        github_event: Some(event),
        github_delivery: Some(id),
        ..Headers::default()
    }
}

#[test]
fn github_deliveries_are_pings_filtered_or_started_and_keyed_by_their_id() {
    let s = spec(json!({"kind": "github", "agent": "a", "events": ["push"]}));
    let payload = json!({"zen": "Keep it logically awesome."});
    let read = |h: &Headers<'_>| inbound::read(&s, h, &payload).unwrap();
    let id = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    assert_eq!(read(&github("ping", id)).verdict, Verdict::Ping);
    assert!(matches!(
        read(&github("issues", id)).verdict,
        Verdict::Filtered { .. }
    ));
    let push = read(&github("push", id));
    assert_eq!(
        (push.event.as_str(), push.dedup_key.as_str(), push.verdict),
        ("push", id, Verdict::Start)
    );
    let every = spec(json!({"kind": "github", "agent": "a"}));
    assert_eq!(
        inbound::read(&every, &github("issues", id), &payload)
            .unwrap()
            .verdict,
        Verdict::Start
    );
    let missing = Headers {
        github_event: Some("push"),
        ..Headers::default()
    };
    assert!(inbound::read(&s, &missing, &payload)
        .unwrap_err()
        .0
        .contains("X-GitHub-Delivery"));
    // An id that is not plain is hashed, not stored as sent.
    let odd = read(&github("push", "a b/c"));
    assert_eq!(odd.dedup_key.len(), 64);
}

#[test]
fn standard_deliveries_take_their_type_as_the_event() {
    let s = spec(json!({"kind": "standard", "agent": "a"}));
    let h = Headers {
        webhook_id: Some("msg_1"),
        ..Headers::default()
    };
    let typed = inbound::read(&s, &h, &json!({"type": "invoice.paid", "data": {}})).unwrap();
    assert_eq!(
        (typed.event.as_str(), typed.dedup_key.as_str()),
        ("invoice.paid", "msg_1")
    );
    assert_eq!(inbound::read(&s, &h, &json!([1])).unwrap().event, "webhook");
    assert!(inbound::read(&s, &Headers::default(), &json!({})).is_err());
}

fn alert(status: &str, alerts: &[(&str, &str)]) -> Value {
    json!({
        "version": "4", "status": status, "groupKey": "{}:{alertname=\"DiskFull\"}",
        "receiver": "armada", "commonLabels": {"alertname": "DiskFull"},
        "alerts": alerts.iter().map(|(f, s)| json!({"fingerprint": f, "startsAt": s, "status": status})).collect::<Vec<_>>(),
    })
}

#[test]
fn alertmanager_repeats_share_a_key_and_a_new_firing_does_not() {
    let s = spec(json!({"kind": "alertmanager", "agent": "a"}));
    let read = |v: &Value| inbound::read(&s, &Headers::default(), v).unwrap();
    let first = read(&alert(
        "firing",
        &[
            ("b2", "2026-12-05T10:00:00Z"),
            ("a1", "2026-12-05T10:00:00Z"),
        ],
    ));
    assert_eq!(first.verdict, Verdict::Start);
    // The same group repeated, its alerts in another order: the same key.
    let repeat = read(&alert(
        "firing",
        &[
            ("a1", "2026-12-05T10:00:00Z"),
            ("b2", "2026-12-05T10:00:00Z"),
        ],
    ));
    assert_eq!(repeat.dedup_key, first.dedup_key);
    // Resolved: another key, and it starts nothing unless asked to.
    let resolved = read(&alert(
        "resolved",
        &[
            ("a1", "2026-12-05T10:00:00Z"),
            ("b2", "2026-12-05T10:00:00Z"),
        ],
    ));
    assert_ne!(resolved.dedup_key, first.dedup_key);
    assert!(matches!(resolved.verdict, Verdict::Filtered { .. }));
    let runs = spec(json!({"kind": "alertmanager", "agent": "a", "on_resolved": "run"}));
    let v = alert("resolved", &[("a1", "2026-12-05T10:00:00Z")]);
    assert_eq!(
        inbound::read(&runs, &Headers::default(), &v)
            .unwrap()
            .verdict,
        Verdict::Start
    );
    // Firing again after resolving: a new startsAt, a new key.
    let again = read(&alert(
        "firing",
        &[
            ("a1", "2026-12-05T11:00:00Z"),
            ("b2", "2026-12-05T10:00:00Z"),
        ],
    ));
    assert_ne!(again.dedup_key, first.dedup_key);
    for bad in [
        json!({"version": "3", "status": "firing"}),
        json!({"version": "4"}),
        json!([]),
    ] {
        assert!(
            inbound::read(&s, &Headers::default(), &bad).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn a_delivery_is_answered_once() {
    let mut d = Delivery::received("dlv_1", "hook_1", "acme", "push", 1_000);
    assert_eq!(d.outcome(), Outcome::Received);
    assert_eq!(
        d.apply(
            DeliveryEvent::Started {
                run_id: "run_1".into()
            },
            1_001
        ),
        Ok(vec![])
    );
    assert_eq!(
        (d.outcome(), d.run_id.as_deref()),
        (Outcome::Started, Some("run_1"))
    );
    assert_eq!(
        d.apply(DeliveryEvent::Disabled, 1_002),
        Err(inbound::Answered(Outcome::Started))
    );
    let mut limited = Delivery::received("dlv_2", "hook_1", "acme", "push", 1_000);
    limited.apply(DeliveryEvent::RateLimited, 1_001).unwrap();
    assert!(limited
        .reason
        .as_deref()
        .unwrap()
        .starts_with(codes::HOOK_RATE_LIMITED));
}

/// A CloudWatch alarm's SNS message as AWS documents it, its description
/// `null` (as for an alarm that has none).
fn cloudwatch_alarm(state: &str, changed: &str) -> Value {
    json!({
        "AlarmName": "Example alarm name",
        "AlarmDescription": null,
        "AWSAccountId": "000000000000",
        "AlarmConfigurationUpdatedTimestamp": "2023-08-01T12:00:00.000+0000",
        "NewStateValue": state,
        "NewStateReason": "Threshold Crossed: 1 datapoint [10.0 (01/08/23 12:00:00)] was greater than the threshold (1.0) (minimum 1 datapoint for OK -> ALARM transition).",
        "StateChangeTime": changed,
        "Region": "US East (N. Virginia)",
        "AlarmArn": "arn:aws:cloudwatch:us-east-1:000000000000:alarm:Example alarm name",
        "OldStateValue": "OK",
        "OKActions": [],
        "AlarmActions": ["arn:aws:sns:us-east-1:000000000000:example-topic"],
        "InsufficientDataActions": [],
        "Trigger": {"MetricName": "CPUUtilization", "Namespace": "AWS/EC2", "StatisticType": "Statistic",
                    "Statistic": "AVERAGE", "Unit": null, "Dimensions": [], "Period": 60,
                    "EvaluationPeriods": 1, "ComparisonOperator": "GreaterThanThreshold",
                    "Threshold": 1.0, "TreatMissingData": "missing", "EvaluateLowSampleCountPercentile": ""}
    })
}

#[test]
fn cloudwatch_alarms_start_on_alarm_and_repeat_nothing_for_one_change() {
    let s = spec(json!({"kind": "cloudwatch", "agent": "a"}));
    let read = |v: &Value| inbound::read(&s, &Headers::default(), v).unwrap();
    let first = read(&cloudwatch_alarm("ALARM", "2023-08-01T12:00:00.000+0000"));
    assert_eq!(
        (first.event.as_str(), first.verdict.clone()),
        ("ALARM", Verdict::Start)
    );
    // SNS delivering the same change again: the same key.
    let again = read(&cloudwatch_alarm("ALARM", "2023-08-01T12:00:00.000+0000"));
    assert_eq!(again.dedup_key, first.dedup_key);
    // OK again: nothing, unless asked; the next change is another key.
    let ok = read(&cloudwatch_alarm("OK", "2023-08-01T12:05:00.000+0000"));
    assert!(matches!(ok.verdict, Verdict::Filtered { .. }));
    assert_ne!(ok.dedup_key, first.dedup_key);
    let runs = spec(json!({"kind": "cloudwatch", "agent": "a", "on_resolved": "run"}));
    let v = cloudwatch_alarm("OK", "2023-08-01T12:05:00.000+0000");
    assert_eq!(
        inbound::read(&runs, &Headers::default(), &v)
            .unwrap()
            .verdict,
        Verdict::Start
    );
    let v = cloudwatch_alarm("INSUFFICIENT_DATA", "2023-08-01T12:06:00.000+0000");
    assert!(matches!(read(&v).verdict, Verdict::Filtered { .. }));
    // Only the alarms it names, when it names some.
    let named = spec(json!({"kind": "cloudwatch", "agent": "a", "alarm_names": ["Disk full"]}));
    let v = cloudwatch_alarm("ALARM", "2023-08-01T12:00:00.000+0000");
    assert!(matches!(
        inbound::read(&named, &Headers::default(), &v)
            .unwrap()
            .verdict,
        Verdict::Filtered { .. }
    ));
    assert!(inbound::read(&s, &Headers::default(), &json!({"AlarmName": "x"})).is_err());
    // The default template reads it, its null description and all.
    let out = template::render(
        s.template(),
        &template::Context {
            event: "ALARM",
            payload: &cloudwatch_alarm("ALARM", "2023-08-01T12:00:00.000+0000"),
            hook: template::HookContext {
                hook_id: "hook_1",
                kind: HookKind::Cloudwatch,
            },
        },
    )
    .unwrap();
    assert!(
        out.starts_with("CloudWatch alarm Example alarm name is ALARM: Threshold Crossed"),
        "{out}"
    );
    // Its URL takes nothing: alarms come through its topic.
    let sent = verify::Credentials::default();
    assert!(verify::verify(HookKind::Cloudwatch, "x", b"{}", &sent, 0).is_err());
    for (body, field) in [
        (
            json!({"kind": "github", "agent": "a", "alarm_names": ["x"]}),
            "alarm_names",
        ),
        (
            json!({"kind": "cloudwatch", "agent": "a", "alarm_names": []}),
            "alarm_names",
        ),
    ] {
        assert!(
            HookSpec::parse(&body).unwrap_err().field.starts_with(field),
            "{body}"
        );
    }
}

#[test]
fn a_cloudwatch_hook_has_no_secret_and_takes_its_topic_with_it() {
    let mut h = hook(json!({"kind": "cloudwatch", "agent": "a", "alarm_names": ["DiskFull"]}));
    h.topic_arn = Some("arn:aws:sns:us-east-1:000000000000:stack-alarms-hook_1".into());
    assert_eq!(
        h.apply(HookEvent::Rotate { salt: "s".into() }, 2_000),
        Err(HookRefusal::NoSecret)
    );
    assert_eq!(
        h.apply(HookEvent::Delete, 3_000),
        Ok(vec![HookAction::DeleteTopic(
            "arn:aws:sns:us-east-1:000000000000:stack-alarms-hook_1".into()
        )])
    );
}
