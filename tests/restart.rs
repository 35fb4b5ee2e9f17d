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
