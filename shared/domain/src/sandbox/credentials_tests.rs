//! Renewal: when it is due, and which requests the dispatcher honours.

use super::*;
use crate::sandbox::lifecycle::{SandboxRecord, SandboxState};

const KEY_A: &str = "key-of-acme-coder-g3";
const NOW: i64 = 1_000_000_000;

fn live(generation: u64) -> SandboxRecord {
    let mut r = SandboxRecord::new("acme", "coder", "workspace", 0);
    r.generation = generation;
    r.take_reported_state(SandboxState::Ready);
    r.hand_queue_url = Some("https://sqs/armada-hand-aaaa-g3.fifo".into());
    r
}

fn req(generation: u64, at: i64) -> Renewal<'static> {
    Renewal {
        tenant: "acme",
        agent: "coder",
        generation,
        requested_at_ms: at,
    }
}

#[test]
fn renewal_is_due_a_third_of_the_way_through() {
    let hour = 3_600_000;
    assert_eq!(renewal_due(NOW, NOW + hour, None), NOW + hour / 3);
    assert_eq!(renewal_due(NOW, NOW + hour, Some(2_000)), NOW + 2_000);
    // Already expired: at once.
    assert_eq!(renewal_due(NOW, NOW - 5, None), NOW);
}

#[test]
fn a_sealed_recent_request_of_the_live_generation_gets_credentials() {
    let r = req(3, NOW - 1_000);
    let mac = r.seal(KEY_A);
    assert!(r.sealed_by(&mac, KEY_A));
    assert_eq!(
        judge_renewal(&r, r.sealed_by(&mac, KEY_A), Some(&live(3)), NOW),
        RenewalVerdict::Issue {
            hand_queue_url: "https://sqs/armada-hand-aaaa-g3.fifo".into()
        }
    );
}

#[test]
fn another_key_another_generation_or_a_changed_field_is_refused() {
    let r = req(3, NOW);
    let mac = r.seal("key-of-beta-coder-g1");
    assert!(!r.sealed_by(&mac, KEY_A));
    let mac = r.seal(KEY_A);
    let later = req(3, NOW + 1);
    assert!(!later.sealed_by(&mac, KEY_A), "the time is sealed too");
    let other = Renewal {
        agent: "coder2",
        ..r
    };
    assert!(!other.sealed_by(&mac, KEY_A));
    assert!(matches!(
        judge_renewal(&r, false, Some(&live(3)), NOW),
        RenewalVerdict::Drop(why) if why.starts_with("security")
    ));
}

#[test]
fn stale_future_foreign_or_dead_requests_are_dropped() {
    let drop = |r: Renewal<'_>, rec: Option<&SandboxRecord>| judge_renewal(&r, true, rec, NOW);
    let old = NOW - RENEWAL_MAX_AGE_MS - 1;
    assert_eq!(
        drop(req(3, old), Some(&live(3))),
        RenewalVerdict::Drop("the request is stale")
    );
    assert_eq!(
        drop(req(3, NOW + 120_000), Some(&live(3))),
        RenewalVerdict::Drop("the request is stale")
    );
    assert_eq!(
        drop(req(3, NOW), None),
        RenewalVerdict::Drop("the identity has no sandbox")
    );
    assert_eq!(
        drop(req(2, NOW), Some(&live(3))),
        RenewalVerdict::Drop("the request is from another generation")
    );
    let mut gone = live(3);
    gone.take_reported_state(SandboxState::Destroyed);
    assert_eq!(
        drop(req(3, NOW), Some(&gone)),
        RenewalVerdict::Drop("the sandbox is gone")
    );
    let mut queueless = live(3);
    queueless.hand_queue_url = None;
    assert!(matches!(
        drop(req(3, NOW), Some(&queueless)),
        RenewalVerdict::Drop(_)
    ));
}

#[test]
fn credentials_never_print_their_secrets() {
    let c = TaskCredentials {
        access_key_id: "ASIAEXAMPLE".into(),
        secret_access_key: "s3cr3t".into(),
        session_token: "t0k3n".into(),
        expires_at_ms: NOW,
    };
    let shown = format!("{c:?}");
    assert!(shown.contains("ASIAEXAMPLE"));
    assert!(
        !shown.contains("s3cr3t") && !shown.contains("t0k3n"),
        "{shown}"
    );
    assert_eq!(c.info().access_key_id, "ASIAEXAMPLE");
}
