//! Callbacks on in-memory ports: each attempt goes through the Run's
//! callback record, a failure is queued again with its backoff, and one
//! that runs out of time is failed and dead-lettered. No emulator.

use armada_core::memory::fixtures::agent;
use armada_domain::run::callback::{CallbackPolicy, CallbackState};

use super::*;
use crate::test_stack::{Stack, TENANT};

/// A Run of `assistant` that completed, with `url` as its callback.
async fn completed_with_callback(s: &Stack, url: &str) -> String {
    agent(&s.svc, "assistant", &[]).await;
    let run = s.start("assistant", "hello", None).await;
    let mut with_url = s.run(&run.run_id);
    let prev = with_url.stamp();
    with_url.callback_url = Some(url.to_string());
    s.svc
        .runs
        .save(prev, &with_url, &[], vec![])
        .await
        .expect("saved");
    run.run_id
}

#[tokio::test]
async fn a_callback_that_never_gets_through_is_retried_then_dead_lettered() {
    // Nothing listens on port 9 of loopback: every attempt fails to connect.
    let s = Stack::with(|cfg| {
        cfg.callback_policy = CallbackPolicy {
            base_s: 1,
            max_age_s: 1,
        }
    });
    let run_id = completed_with_callback(&s, "http://127.0.0.1:9/hook").await;
    s.pump().await;
    let run = s.run(&run_id);
    assert!(run.state().is_closed(), "{:?}", run.state());
    let cb = run.callback.expect("the callback's record");
    assert_eq!(cb.state(), CallbackState::Failed);
    assert!(cb.attempts >= 1, "{cb:?}");
    assert_eq!(cb.last_error.as_deref(), Some("CONNECT_FAILED"));
    assert!(s.kinds(&run_id).contains(&"callback_failed".to_string()));
    let dead = s.mem.state().dead_letters.clone();
    assert!(
        matches!(&dead[..], [DispatchMessage::DeliverCallback { run_id: r, tenant, .. }] if *r == run_id && tenant == TENANT),
        "{dead:?}"
    );
    // The dead letter is recorded, and a repeat of the message changes nothing.
    assert_eq!(s.to_dispatcher(&dead[0]).await, 0);
    assert_eq!(
        s.run(&run_id).callback.map(|c| c.attempts),
        Some(cb.attempts)
    );
}

#[tokio::test]
async fn a_callback_refused_by_the_egress_guard_fails_at_once() {
    let s = Stack::new();
    let run_id = completed_with_callback(&s, "http://169.254.169.254/latest").await;
    s.pump().await;
    let cb = s.run(&run_id).callback.expect("the callback's record");
    assert_eq!((cb.state(), cb.attempts), (CallbackState::Failed, 1));
    assert!(
        s.mem.state().dead_letters.is_empty(),
        "not a matter of time"
    );
}
