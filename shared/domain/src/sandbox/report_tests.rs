use serde_json::json;

use super::*;
use crate::machine::Machine;
use crate::sandbox::lifecycle::{Acquired, SandboxEvent, Start};

fn acquire(run_id: &str) -> SandboxEvent {
    SandboxEvent::Acquire {
        run_id: run_id.into(),
        profile: "workspace".into(),
    }
}

/// acme's coder sandbox as the control plane wrote it: READY, held by a
/// Run, with its task and hand queue.
fn stored() -> SandboxRecord {
    let mut r = SandboxRecord::new("acme", "coder", "workspace", 0);
    r.apply(acquire("run_a"), 1).unwrap();
    let started = SandboxEvent::TaskStarted {
        generation: 1,
        task_arn: "arn:task/acme".into(),
        hand_queue_url: "https://q/hand-acme-g1.fifo".into(),
    };
    r.apply(started, 1).unwrap();
    r.take_reported_state(SandboxState::Ready);
    r.version = 7;
    r
}

fn doc(r: &SandboxRecord) -> String {
    serde_json::to_string(r).unwrap()
}

#[test]
fn a_record_naming_another_identity_than_its_key_is_corrupt() {
    let r = stored();
    let e = SandboxRecord::from_parts("victim#coder", &doc(&r), None, 7).unwrap_err();
    assert!(e.why.contains("acme#coder"), "{e}");
    assert!(SandboxRecord::from_parts("acme#coder", &doc(&r), None, 7).is_ok());
}

#[test]
fn identity_and_routing_never_come_from_the_report() {
    let r = stored();
    // What a task may write: its report, saying whatever it likes.
    let forged = json!({
        "state": "READY", "state_changed_at_ms": 5,
        "tenant": "victim", "agent": "coder", "generation": 99,
        "task_arn": "arn:task/victim", "hand_queue_url": "https://q/hand-victim-g1.fifo",
        "holder_run_id": "run_victim", "waiters": ["run_victim_2"],
        "heartbeat_at_ms": 5,
    })
    .to_string();
    let read = SandboxRecord::from_parts("acme#coder", &doc(&r), Some(&forged), 8).unwrap();
    assert_eq!(
        (read.tenant.as_str(), read.agent.as_str()),
        ("acme", "coder")
    );
    assert_eq!(read.generation, 1);
    assert_eq!(read.task_arn.as_deref(), Some("arn:task/acme"));
    assert_eq!(
        read.hand_queue_url.as_deref(),
        Some("https://q/hand-acme-g1.fifo")
    );
    assert_eq!(read.holder_run_id.as_deref(), Some("run_a"));
    assert!(read.waiters.is_empty());
    assert_eq!((read.heartbeat_at_ms, read.version), (5, 8));
}

#[test]
fn an_unreadable_report_fails_the_sandbox_but_not_the_record() {
    let r = stored();
    let huge = json!({"state": "READY", "state_changed_at_ms": 1,
        "failure": "x".repeat(MAX_REPORT_BYTES)})
    .to_string();
    let many_ports = json!({"state": "READY", "state_changed_at_ms": 1,
        "ports": vec![json!({"container": 1, "host": 2}); MAX_REPORTED_PORTS + 1]})
    .to_string();
    for bad in [
        "{not json",
        "{\"state\": \"SLEEPY\"}",
        "[]",
        &huge,
        &many_ports,
    ] {
        let read = SandboxRecord::from_parts("acme#coder", &doc(&r), Some(bad), 8).unwrap();
        assert_eq!(read.state(), SandboxState::Failed, "{bad:.40}");
        assert!(read.failure.unwrap().contains("report is unreadable"));
        // The control half stands: the holder is still told, the task stopped.
        assert_eq!(read.holder_run_id.as_deref(), Some("run_a"));
        assert_eq!(read.task_arn.as_deref(), Some("arn:task/acme"));
    }
}

#[test]
fn a_long_failure_is_cut_and_a_foreign_snapshot_dropped() {
    let r = stored();
    let report = json!({"state": "HIBERNATED", "state_changed_at_ms": 1,
        "failure": "y".repeat(MAX_FAILURE_CHARS * 2),
        "snapshot_key": "sandboxes/victim/coder/g1/workspace.tar.gz"})
    .to_string();
    let read = SandboxRecord::from_parts("acme#coder", &doc(&r), Some(&report), 8).unwrap();
    assert_eq!(read.failure.unwrap().chars().count(), MAX_FAILURE_CHARS);
    assert_eq!(read.snapshot_key, None);
    let own = json!({"state": "HIBERNATED", "state_changed_at_ms": 1,
        "snapshot_key": "sandboxes/acme/coder/g1/workspace.tar.gz"})
    .to_string();
    let read = SandboxRecord::from_parts("acme#coder", &doc(&r), Some(&own), 8).unwrap();
    assert_eq!(
        read.snapshot_key.as_deref(),
        Some("sandboxes/acme/coder/g1/workspace.tar.gz")
    );
}

#[test]
fn a_sandbox_its_agent_saved_to_a_snapshot_wakes_in_a_new_task() {
    let mut r = stored();
    let released = SandboxEvent::Release {
        run_id: "run_a".into(),
    };
    r.apply(released, 2).unwrap();
    // The agent reports it saved its workspace and its task stops; it
    // cannot write which task the sandbox runs in.
    let mut agent_view = r.clone();
    let idle = SandboxEvent::Hibernate {
        generation: 1,
        idle_ms: 0,
    };
    agent_view.apply(idle, 3).unwrap();
    let saved = SandboxEvent::Snapshotted {
        generation: 1,
        key: "sandboxes/acme/coder/g1/workspace.tar.gz".into(),
    };
    agent_view.apply(saved, 4).unwrap();
    let report = serde_json::to_string(&agent_view.report()).unwrap();
    let mut read = SandboxRecord::from_parts("acme#coder", &doc(&r), Some(&report), 8).unwrap();
    assert_eq!(
        (read.state(), read.task_arn.as_deref()),
        (SandboxState::Hibernated, None)
    );
    read.start_attempts = 2;
    assert_eq!(
        Acquired::of(&read.apply(acquire("run_b"), 5).unwrap()),
        Acquired::Held {
            start: Some(Start::Wake)
        }
    );
    assert_eq!((read.task_arn, read.start_attempts), (None, 1));
}
