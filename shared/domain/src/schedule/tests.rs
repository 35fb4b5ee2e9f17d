use serde_json::json;

use super::*;
use crate::machine::Machine;

const NOW: i64 = 1_780_000_000_000; // 2026-05-28T20:26:40Z

fn schedule(body: Value) -> Schedule {
    let (spec, enabled) = ScheduleSpec::parse(&body).unwrap();
    Schedule::new("sch_1", "acme", "key_1", spec, enabled, NOW)
}

#[test]
fn a_create_request_is_read_field_by_field() {
    let (s, enabled) = ScheduleSpec::parse(&json!({"expression": "cron(0 10 ? * MON *)",
        "timezone": "Europe/Berlin", "agent": "reporter", "input": "the weekly report"}))
    .unwrap();
    assert!(enabled);
    assert_eq!(
        (s.timezone.as_str(), s.overlap),
        ("Europe/Berlin", Overlap::Skip)
    );
    let (s, _) =
        ScheduleSpec::parse(&json!({"expression": "rate(1 hour)", "team": "ops", "input": "x"}))
            .unwrap();
    assert_eq!(s.timezone, "UTC");
    for (body, field) in [
        (json!({"agent": "a", "input": "x"}), "expression"),
        (
            json!({"expression": "rate(1 hours)", "agent": "a", "input": "x"}),
            "expression",
        ),
        (
            json!({"expression": "rate(1 hour)", "timezone": "Mars/Olympus", "agent": "a", "input": "x"}),
            "timezone",
        ),
        (json!({"expression": "rate(1 hour)", "input": "x"}), "agent"),
        (json!({"expression": "rate(1 hour)", "agent": "a"}), "input"),
        (
            json!({"expression": "rate(1 hour)", "agent": "a", "input": " "}),
            "input",
        ),
        (
            json!({"expression": "rate(1 hour)", "agent": "a", "input": "x", "overlap": "queue"}),
            "overlap",
        ),
        (
            json!({"expression": "rate(1 hour)", "agent": "a", "input": "x", "start_at": "tomorrow"}),
            "start_at",
        ),
        (
            json!({"expression": "rate(1 hour)", "agent": "a", "input": "x",
                "start_at": "2027-01-02T00:00:00Z", "end_at": "2027-01-01T00:00:00Z"}),
            "end_at",
        ),
        (
            json!({"expression": "rate(1 hour)", "agent": "a", "input": "x", "every": 5}),
            "every",
        ),
    ] {
        let e = ScheduleSpec::parse(&body).unwrap_err();
        assert!(e.field.starts_with(field), "{body}: {e}");
    }
}

#[test]
fn the_next_firings_start_at_the_start_and_stop_at_the_end() {
    let s = schedule(
        json!({"expression": "cron(0 10 * * ? *)", "agent": "a", "input": "x",
        "timezone": "Europe/Berlin", "start_at": "2027-01-01T10:00:00+01:00",
        "end_at": "2027-01-03T10:00:00+01:00"}),
    );
    let times: Vec<String> = s
        .spec
        .next_firings(NOW, NOW, 5)
        .iter()
        .map(|t| t.with_timezone(&s.spec.tz()).to_rfc3339())
        .collect();
    assert_eq!(
        times,
        [
            "2027-01-01T10:00:00+01:00",
            "2027-01-02T10:00:00+01:00",
            "2027-01-03T10:00:00+01:00"
        ]
    );
}

#[test]
fn a_firing_starts_one_run_skips_while_one_runs_and_is_missed_when_late() {
    let mut s = schedule(json!({"expression": "rate(5 minutes)", "agent": "a", "input": "x"}));
    let at = NOW + 300_000;
    assert_eq!(s.fire(at, at + 2_000, 3600, false), Firing::Start);
    s.apply(
        ScheduleEvent::Started {
            run_id: "run_1".into(),
        },
        at + 2_000,
    )
    .unwrap();
    assert_eq!(
        s.fire(at + 300_000, at + 300_500, 3600, true),
        Firing::Skipped {
            previous_run_id: "run_1".into()
        }
    );
    assert_eq!(
        s.fire(at + 300_000, at + 300_500, 3600, false),
        Firing::Start
    );
    // Down for two hours: the firing from then is missed, not run.
    assert_eq!(
        s.fire(at, at + 7_200_000, 3600, false),
        Firing::Missed { late_s: 7200 }
    );
    let patch = SchedulePatch::parse(&json!({"overlap": "allow"})).unwrap();
    s.apply(ScheduleEvent::Update(patch), at).unwrap();
    assert_eq!(
        s.fire(at + 300_000, at + 300_500, 3600, true),
        Firing::Start
    );
    let off = SchedulePatch::parse(&json!({"enabled": false})).unwrap();
    s.apply(ScheduleEvent::Update(off), at).unwrap();
    assert_eq!(
        s.fire(at + 300_000, at + 300_500, 3600, false),
        Firing::Ignored
    );
}

#[test]
fn a_schedule_changes_only_through_its_machine() {
    let mut s = schedule(json!({"expression": "rate(5 minutes)", "agent": "a", "input": "x"}));
    let patch = SchedulePatch::parse(&json!({"expression": "cron(0 9 ? * MON-FRI *)",
        "timezone": "America/New_York", "chain": ["a", "b"], "callback_url": null}))
    .unwrap();
    assert_eq!(
        s.apply(ScheduleEvent::Update(patch), NOW + 1),
        Ok(vec![ScheduleAction::Sync])
    );
    assert_eq!(
        s.spec.target,
        RunTarget::Chain(vec!["a".into(), "b".into()])
    );
    assert_eq!((s.version, s.updated_at_ms), (2, NOW + 1));
    let bad = SchedulePatch::parse(
        &json!({"start_at": "2027-02-01T00:00:00Z", "end_at": "2027-01-01T00:00:00Z"}),
    )
    .unwrap();
    let before = s.clone();
    assert!(matches!(
        s.apply(ScheduleEvent::Update(bad), NOW + 2),
        Err(ScheduleRefusal::Invalid(_))
    ));
    assert_eq!(s, before);
    assert!(SchedulePatch::parse(&json!({"expression": "cron(* * * * * *)"})).is_err());
    assert_eq!(
        s.apply(ScheduleEvent::Delete, NOW + 3),
        Ok(vec![ScheduleAction::Remove])
    );
    assert_eq!(s.state(), ScheduleState::Deleted);
    assert_eq!(
        s.apply(ScheduleEvent::Delete, NOW + 4),
        Err(ScheduleRefusal::Deleted)
    );
    let stored = serde_json::to_value(&before).unwrap();
    assert_eq!(serde_json::from_value::<Schedule>(stored).unwrap(), before);
}
