//! The sandbox record's transitions, one case at a time.

use super::*;
use crate::machine::Machine;

fn rec() -> SandboxRecord {
    SandboxRecord::new("t1", "coder", "workspace", 0)
}

#[test]
fn the_first_acquire_creates_and_later_runs_wait_in_order() {
    let mut r = rec();
    assert_eq!(
        r.acquire("a", "workspace", 1),
        Acquired::Held {
            start: Some(Start::Create)
        }
    );
    assert_eq!((r.generation, r.state), (1, SandboxState::Provisioning));
    assert_eq!(
        r.acquire("a", "workspace", 2),
        Acquired::Held { start: None }
    );
    assert_eq!(
        r.acquire("b", "workspace", 3),
        Acquired::Waiting { position: 1 }
    );
    assert_eq!(
        r.acquire("c", "workspace", 3),
        Acquired::Waiting { position: 2 }
    );
    assert_eq!(
        r.acquire("b", "workspace", 4),
        Acquired::Waiting { position: 1 },
        "asking again keeps the place"
    );
    assert_eq!(r.release("c", 5), None, "a waiter leaves the queue");
    assert_eq!(r.release("a", 6), Some("b".into()));
    assert_eq!(r.holder_run_id.as_deref(), Some("b"));
    assert_eq!(r.release("b", 7), None);
    assert_eq!(r.holder_run_id, None);
}

#[test]
fn a_gone_sandbox_comes_back_as_a_new_generation() {
    let mut r = rec();
    r.acquire("a", "workspace", 1);
    r.task_started(1, "arn1", "q1").unwrap();
    r.agent_ready(1, controls(), 2).unwrap();
    assert!(r.destroy("OOM", 3));
    assert!(!r.destroy("again", 3));
    assert!(r.agent_ready(1, controls(), 4).is_err());
    r.stopped(1, 4).unwrap();
    assert_eq!(
        r.acquire("a", "strict", 5),
        Acquired::Held {
            start: Some(Start::Create)
        }
    );
    assert_eq!(r.generation, 2);
    assert_eq!(r.profile, "strict");
    assert!(r.task_arn.is_none() && r.controls.is_none());
    assert!(
        r.stopped(1, 6).is_err(),
        "an old generation cannot stop the new one"
    );
}

#[test]
fn hibernation_needs_idleness_and_a_wake_restarts_nothing_else() {
    let mut r = rec();
    r.acquire("a", "workspace", 0);
    r.agent_ready(1, controls(), 0).unwrap();
    assert!(r.hibernate(1, 100, 500).is_err(), "held");
    r.release("a", 1000);
    assert!(r.hibernate(1, 100, 1050).is_err(), "not idle long enough");
    r.hibernate(1, 100, 1100).unwrap();
    r.hibernated(1, 1200).unwrap();
    assert_eq!(
        r.acquire("b", "workspace", 2000),
        Acquired::Held {
            start: Some(Start::Wake)
        }
    );
    assert_eq!((r.state, r.generation), (SandboxState::Waking, 1));
    r.agent_ready(1, controls(), 2100).unwrap();
    assert_eq!(r.state, SandboxState::Ready);
    // By snapshot: the task goes, the generation stays.
    r.release("b", 3000);
    r.hibernate(1, 100, 3200).unwrap();
    r.snapshotted(1, "snap", 3300).unwrap();
    assert_eq!(
        (r.state, r.task_arn.clone()),
        (SandboxState::Hibernated, None)
    );
    assert_eq!(
        r.acquire("c", "workspace", 4000),
        Acquired::Held {
            start: Some(Start::Wake)
        }
    );
    assert_eq!(r.snapshot_key.as_deref(), Some("snap"));
}

#[test]
fn a_prewarm_creates_without_holding() {
    let mut r = rec();
    assert_eq!(r.prewarm("workspace", 1), Some(Start::Create));
    assert_eq!((r.generation, r.holder_run_id.clone()), (1, None));
    assert_eq!(r.prewarm("workspace", 2), None, "already there");
    assert_eq!(
        r.acquire("a", "workspace", 3),
        Acquired::Held { start: None }
    );
}

#[test]
fn a_start_that_times_out_is_retried_once_then_fails() {
    let mut r = rec();
    r.acquire("a", "workspace", 0);
    assert_eq!(r.start_timed_out(1, 1, 30, 30_000), Ok(true));
    assert!(
        r.start_timed_out(1, 1, 30, 30_001).is_err(),
        "only once per attempt"
    );
    assert_eq!(r.start_timed_out(1, 2, 30, 60_000), Ok(false));
    assert_eq!(r.state, SandboxState::Failed);
    assert!(r.failure.is_some());
}

fn controls() -> Controls {
    Controls::uniform(super::super::controls::Enforcement::Enforced, "test")
}

/// Every event in every state, through the machine: a refused event
/// changes nothing, and a stale generation is always refused.
#[test]
fn through_the_machine_a_refusal_changes_nothing() {
    use crate::machine::Machine;
    let events = |g: u64| {
        vec![
            SandboxEvent::Acquire {
                run_id: "a".into(),
                profile: "workspace".into(),
            },
            SandboxEvent::Release { run_id: "a".into() },
            SandboxEvent::Prewarm {
                profile: "workspace".into(),
            },
            SandboxEvent::TaskStarted {
                generation: g,
                task_arn: "arn".into(),
                hand_queue_url: "q".into(),
            },
            SandboxEvent::AgentReady {
                generation: g,
                controls: Box::new(controls()),
            },
            SandboxEvent::Fail {
                generation: g,
                why: "x".into(),
            },
            SandboxEvent::Heartbeat {
                generation: g,
                credentials: None,
            },
            SandboxEvent::Touch { generation: g },
            SandboxEvent::Destroy { why: "x".into() },
            SandboxEvent::Stopped { generation: g },
            SandboxEvent::Hibernate {
                generation: g,
                idle_ms: 0,
            },
            SandboxEvent::Hibernated { generation: g },
            SandboxEvent::Snapshotted {
                generation: g,
                key: "k".into(),
            },
            SandboxEvent::Woke { generation: g },
            SandboxEvent::StartTimedOut {
                generation: g,
                attempt: 1,
                timeout_s: 1,
            },
        ]
    };
    let mut start = rec();
    start.acquire("a", "workspace", 1);
    for state in [
        SandboxState::Provisioning,
        SandboxState::Ready,
        SandboxState::Hibernating,
        SandboxState::Hibernated,
        SandboxState::Waking,
        SandboxState::Destroying,
        SandboxState::Destroyed,
        SandboxState::Failed,
    ] {
        let mut at = start.clone();
        at.state = state;
        for (i, event) in events(at.generation).into_iter().enumerate() {
            let mut r = at.clone();
            if r.apply(event, 5).is_err() {
                assert_eq!(r, at, "event {i} refused in {state} changed the record");
            }
        }
        for event in events(at.generation + 7) {
            let mut r = at.clone();
            let generational = !matches!(
                event,
                SandboxEvent::Acquire { .. }
                    | SandboxEvent::Release { .. }
                    | SandboxEvent::Prewarm { .. }
                    | SandboxEvent::Destroy { .. }
            );
            if generational {
                assert!(r.apply(event, 5).is_err(), "a stale generation in {state}");
                assert_eq!(r, at);
            }
        }
    }
}

#[test]
fn an_agent_ready_before_its_start_was_recorded_still_wants_its_task() {
    let mut r = rec();
    r.acquire("a", "workspace", 1);
    let first = r.start_token();
    assert!(r.wants_task(), "a new generation wants a task");
    // The starter died after the provider answered and before it wrote
    // the task down; the task's agent reported in meanwhile.
    r.apply(
        SandboxEvent::AgentReady {
            generation: 1,
            controls: Box::new(controls()),
        },
        2,
    )
    .unwrap();
    assert_eq!(r.state(), SandboxState::Ready);
    assert!(r.wants_task(), "ready, but with no task on record");
    assert_eq!(r.start_token(), first, "the retry is the same start");
    r.apply(
        SandboxEvent::TaskStarted {
            generation: 1,
            task_arn: "arn:task/1".into(),
            hand_queue_url: "q1".into(),
        },
        3,
    )
    .unwrap();
    assert!(!r.wants_task());
}

#[test]
fn every_start_the_machine_decides_has_a_token_of_its_own() {
    let mut r = rec();
    r.acquire("a", "workspace", 1);
    let created = r.start_token();
    assert_eq!(created.len(), 64, "what ECS takes as a client token");
    // A start that timed out is retried under a new name.
    r.apply(
        SandboxEvent::StartTimedOut {
            generation: 1,
            attempt: 1,
            timeout_s: 30,
        },
        40_000,
    )
    .unwrap();
    let retried = r.start_token();
    assert_ne!(retried, created);
    // So is a new generation, and another identity's first start.
    r.apply(SandboxEvent::Destroy { why: "test".into() }, 50_000)
        .unwrap();
    r.apply(SandboxEvent::Stopped { generation: 1 }, 50_001)
        .unwrap();
    r.release("a", 55_000);
    r.acquire("b", "workspace", 60_000);
    assert_eq!(r.generation, 2);
    assert!(![created.clone(), retried].contains(&r.start_token()));
    let mut other = SandboxRecord::new("t2", "coder", "workspace", 0);
    other.acquire("a", "workspace", 1);
    assert_ne!(other.start_token(), created);
}
