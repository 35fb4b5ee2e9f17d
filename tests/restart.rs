//! The emulator restarted under a running stack: the stack reconnects. This
//! test owns its emulator (a separate process per test binary), so killing
//! it disturbs no other test.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use armada_cli::client::Client;
use armada_cli::local::{process, LocalOptions, LocalStack};
use armada_tests::{free_port, root, TestStack};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_stack_reconnects_after_the_emulator_restarts() {
    armada_core::telemetry::init_with("warn");
    let mut opts = LocalOptions::new(&root());
    opts.endpoint = None;
    opts.emulator_port = free_port();
    opts.emulator_dies_with_us = true;
    opts.api_port = 0;
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
    let mut answered = None;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Ok(run_id) = client.create_run("assistant", "after").await else {
            continue;
        };
        if let Ok(run) = client.wait_run(&run_id, Duration::from_secs(15)).await {
            answered = Some(run);
            break;
        }
    }
    let run = answered.expect("the stack answers after the emulator restarted");
    assert_eq!(run.output.as_deref().unwrap_or_default(), "echo: after");
    let second = stack.emulator_pid().unwrap();
    assert_ne!(first, second);
    stack.stop().await;
    process::terminate(second);
}
