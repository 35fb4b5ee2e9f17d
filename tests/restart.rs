//! The emulator restarted under a running stack: the stack reconnects. This
//! test owns its emulator (a separate process per test binary), so killing
//! it disturbs no other test.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use armada_cli::client::Client;
use armada_cli::local::{process, LocalOptions, LocalStack};
use armada_tests::{free_port, root, wait, TestStack};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_stack_reconnects_after_the_emulator_restarts() {
    armada_core::telemetry::init_with("warn");
    let mut opts = LocalOptions::new(&root());
    opts.endpoint = None;
    opts.emulator_port = free_port();
    opts.emulator_dies_with_us = true;
    opts.api_port = 0;
    opts.smtp_port = 0;
    opts.poll_wait_seconds = 1;
    opts.stack = TestStack::stack_name();
    let stack = LocalStack::start(opts).await.unwrap();
    let client = Client::new(&stack.api_url, &stack.tenant_key, None);
    let run_id = client.create_run("assistant", "before").await.unwrap();
    let run = client
        .wait_run(&run_id, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(run.output.as_deref().unwrap_or_default(), "echo: before");

    let first = stack.emulator_pid().unwrap();
    assert!(process::terminate(first));
    // The emulator comes back empty; the stack restarts it, re-creates its
    // resources and its key, and answers again.
    let what = "the stack to answer after the emulator restarted";
    let run = wait::until(what, Duration::from_secs(120), || async {
        let run_id = client.create_run("assistant", "after").await.ok()?;
        client.wait_run(&run_id, Duration::from_secs(15)).await.ok()
    })
    .await;
    assert_eq!(run.output.as_deref().unwrap_or_default(), "echo: after");
    let second = stack.emulator_pid().unwrap();
    assert_ne!(first, second);
    stack.stop().await;
    process::terminate(second);
}

/// `armada down` then `armada up` at once: the new stack may first meet the
/// emulator that is still stopping, which answers and then goes away under
/// it. It starts all the same (it starts an emulator of its own and
/// prepares again), every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stack_started_as_its_emulator_stops_starts_all_the_same() {
    armada_core::telemetry::init_with("warn");
    let port = free_port();
    let options = || {
        let mut opts = LocalOptions::new(&root());
        opts.endpoint = None;
        opts.emulator_port = port;
        opts.emulator_dies_with_us = true;
        opts.api_port = 0;
        opts.smtp_port = 0;
        opts.poll_wait_seconds = 1;
        opts.data_plane = false;
        opts.stack = TestStack::stack_name();
        opts
    };
    let mut stack = LocalStack::start(options()).await.unwrap();
    for round in 0..3 {
        // The stack's emulator: one it started, or the one it adopted and
        // started again once that one went.
        let pid = wait::until("the stack's emulator", Duration::from_secs(60), || async {
            stack.emulator_pid()
        })
        .await;
        stack.stop().await;
        // Stopped, not waited for: the next stack starts while it goes.
        assert!(process::terminate(pid));
        stack = LocalStack::start(options())
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e:#}"));
        let client = Client::new(&stack.api_url, &stack.tenant_key, None);
        let run_id = client.create_run("assistant", "again").await.unwrap();
        let run = client
            .wait_run(&run_id, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(run.output.as_deref().unwrap_or_default(), "echo: again");
    }
    let last = stack.emulator_pid();
    stack.stop().await;
    if let Some(pid) = last {
        process::terminate(pid);
    }
}
