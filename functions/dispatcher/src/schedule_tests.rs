//! Schedules' firings on in-memory ports: one Run per scheduled time,
//! skipped while the last one runs, missed when too late, and a forged
//! firing dropped. No emulator.

use armada_core::memory::fixtures::agent;
use armada_domain::run::Trigger;
use armada_domain::schedule::{FiringOutcome, Schedule, ScheduleSpec};
use serde_json::json;

use super::*;
use crate::test_stack::{Stack, TENANT};

/// A schedule of the assistant, every five minutes, stored.
async fn every_five_minutes(s: &Stack, overlap: &str) -> Schedule {
    agent(&s.svc, "assistant", &[]).await;
    let (spec, enabled) = ScheduleSpec::parse(&json!({"expression": "rate(5 minutes)",
        "agent": "assistant", "input": "the report", "overlap": overlap}))
    .expect("valid");
    let sch = Schedule::new(
        "sch_1",
        TENANT,
        "key_1",
        spec,
        enabled,
        s.svc.clock.now_ms(),
    );
    s.svc.schedules.create(&sch).await.expect("stored");
    sch
}

fn fire(s: &Stack, at_ms: i64) -> DispatchMessage {
    let at = armada_core::clock::rfc3339(at_ms);
    DispatchMessage::fire_schedule(&s.svc.cfg.callback_signing_secret, "sch_1", TENANT, &at)
}

fn firings(s: &Stack) -> Vec<(FiringOutcome, Option<String>)> {
    s.mem
        .state()
        .firings
        .values()
        .map(|f| (f.outcome, f.run_id.clone()))
        .collect()
}

#[tokio::test]
async fn a_firing_starts_one_run_and_its_repeat_starts_nothing() {
    let s = Stack::new();
    every_five_minutes(&s, "allow").await;
    let at = s.svc.clock.now_ms() - 1_000;
    assert_eq!(s.to_dispatcher(&fire(&s, at)).await, 0);
    assert_eq!(s.to_dispatcher(&fire(&s, at)).await, 0);
    let recorded = firings(&s);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let (outcome, Some(run_id)) = recorded[0].clone() else {
        panic!("{recorded:?}")
    };
    assert_eq!(outcome, FiringOutcome::Started);
    assert_eq!(s.mem.state().runs.len(), 1);
    let run = s.run(&run_id);
    assert!(
        matches!(run.trigger(), Trigger::Schedule { ref schedule_id, .. } if schedule_id == "sch_1")
    );
    assert_eq!(
        s.svc
            .schedules
            .get("sch_1")
            .await
            .unwrap()
            .unwrap()
            .last_run_id,
        Some(run_id)
    );
}

#[tokio::test]
async fn a_firing_while_the_last_run_is_active_is_skipped() {
    let s = Stack::new();
    every_five_minutes(&s, "skip").await;
    let now = s.svc.clock.now_ms();
    s.to_dispatcher(&fire(&s, now - 300_000)).await;
    // The first Run has not ended (nothing pumped it): the next is skipped.
    s.to_dispatcher(&fire(&s, now)).await;
    let outcomes: Vec<FiringOutcome> = firings(&s).into_iter().map(|(o, _)| o).collect();
    assert_eq!(outcomes, [FiringOutcome::Started, FiringOutcome::Skipped]);
    assert_eq!(s.mem.state().runs.len(), 1);
}

#[tokio::test]
async fn a_firing_older_than_the_maximum_event_age_is_missed_not_run() {
    let s = Stack::new();
    every_five_minutes(&s, "allow").await;
    let two_hours_ago = s.svc.clock.now_ms() - 7_200_000;
    s.to_dispatcher(&fire(&s, two_hours_ago)).await;
    assert_eq!(firings(&s), [(FiringOutcome::Missed, None)]);
    assert!(s.mem.state().runs.is_empty());
}

#[tokio::test]
async fn a_firing_not_sealed_by_the_stack_is_dropped() {
    let s = Stack::new();
    every_five_minutes(&s, "allow").await;
    let forged = DispatchMessage::FireSchedule {
        schedule_id: "sch_1".into(),
        tenant: TENANT.into(),
        scheduled_at: armada_core::clock::rfc3339(s.svc.clock.now_ms()),
        seal: "made up".into(),
    };
    s.to_dispatcher(&forged).await;
    assert!(firings(&s).is_empty());
    assert!(s.mem.state().runs.is_empty());
}
