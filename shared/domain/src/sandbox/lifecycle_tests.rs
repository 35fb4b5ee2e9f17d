//! The sandbox record's transitions, one case at a time.

use super::*;

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
