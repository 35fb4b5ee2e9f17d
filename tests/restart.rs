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

/// A stack named `stack` whose emulator keeps its state in `state`, on
/// `port`.
fn durable_options(stack: &str, port: u16, state: &std::path::Path) -> LocalOptions {
    let mut opts = LocalOptions::new(&root());
    opts.endpoint = None;
    opts.emulator_port = port;
    opts.emulator_dies_with_us = true;
    opts.emulator_state = Some(state.to_path_buf());
    opts.api_port = 0;
    opts.smtp_port = 0;
    opts.poll_wait_seconds = 1;
    opts.data_plane = false;
    opts.stack = stack.to_string();
    opts
}

/// How to start an emulator of the test's own on a free port, with a
/// fresh state directory; and that directory.
fn durable_emulator() -> (armada_cli::local::emulator::Spawn, std::path::PathBuf) {
    let port = free_port();
    let state = fresh_state_dir(port);
    let how = armada_cli::local::emulator::Spawn {
        port,
        die_with_parent: true,
        state: Some(state.clone()),
        slow: None,
    };
    (how, state)
}

fn fresh_state_dir(port: u16) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("armada-emulator-state-{port}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `kill -9` of an emulator with a state directory, while Runs are in
/// flight: it comes back with everything it acknowledged, and every Run
/// accepted before the kill still ends with its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_emulator_killed_mid_run_comes_back_with_what_it_acknowledged() {
    armada_core::telemetry::init_with("error");
    let port = free_port();
    let state = fresh_state_dir(port);
    let name = TestStack::stack_name();
    let stack = LocalStack::start(durable_options(&name, port, &state))
        .await
        .unwrap();
    let client = Client::new(&stack.api_url, &stack.tenant_key, None);
    let done = client.create_run("assistant", "before").await.unwrap();
    client
        .wait_run(&done, Duration::from_secs(30))
        .await
        .unwrap();
    let mut accepted = Vec::new();
    for i in 0..5 {
        accepted.push(
            client
                .create_run("assistant", &format!("in flight {i}"))
                .await
                .unwrap(),
        );
    }
    let first = stack.emulator_pid().unwrap();
    assert!(process::kill(first));

    for (i, run_id) in accepted.iter().enumerate() {
        let what = "a Run accepted before the kill to end";
        let run = wait::until(what, Duration::from_secs(180), || async {
            let run = client.run(run_id).await.ok()?;
            run.state.is_terminal().then_some(run)
        })
        .await;
        assert_eq!(
            run.output.as_deref().unwrap_or_default(),
            format!("echo: in flight {i}"),
            "{run_id}: {run:?}"
        );
    }
    let before = client.run(&done).await.unwrap();
    assert_eq!(before.output.as_deref().unwrap_or_default(), "echo: before");
    let second = stack.emulator_pid().unwrap();
    assert_ne!(first, second, "the stack started its emulator again");
    stack.stop().await;
    process::stop(second, Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&state);
}

/// `armada down` then `armada up`: the emulator stops with a snapshot and
/// the next one starts from it; keys, Runs and their events are all there,
/// and the old key still answers on the new stack.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn down_and_up_keep_keys_runs_and_events() {
    armada_core::telemetry::init_with("error");
    let port = free_port();
    let state = fresh_state_dir(port);
    let name = TestStack::stack_name();
    let stack = LocalStack::start(durable_options(&name, port, &state))
        .await
        .unwrap();
    let old_key = stack.tenant_key.clone();
    let client = Client::new(&stack.api_url, &old_key, None);
    let run_id = client.create_run("assistant", "kept").await.unwrap();
    client
        .wait_run(&run_id, Duration::from_secs(30))
        .await
        .unwrap();
    let events_before = client.events(&run_id, 0, 0).await.unwrap();
    let pid = stack.emulator_pid().unwrap();
    stack.stop().await;
    assert!(process::stop(pid, Duration::from_secs(60)));

    let stack = LocalStack::start(durable_options(&name, port, &state))
        .await
        .unwrap();
    let client = Client::new(&stack.api_url, &old_key, None);
    let run = client.run(&run_id).await.unwrap();
    assert_eq!(run.output.as_deref().unwrap_or_default(), "echo: kept");
    let events_after = client.events(&run_id, 0, 0).await.unwrap();
    assert_eq!(
        serde_json::to_value(&events_before.events).unwrap(),
        serde_json::to_value(&events_after.events).unwrap()
    );
    let again = client.create_run("assistant", "after").await.unwrap();
    let run = client
        .wait_run(&again, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(run.output.as_deref().unwrap_or_default(), "echo: after");
    let pid = stack.emulator_pid().unwrap();
    stack.stop().await;
    process::stop(pid, Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&state);
}

/// Two stop signals, the second while the first is writing the snapshot
/// (a parent-death SIGTERM after `armada down`'s, say): the emulator
/// still ends, with its snapshot written. It used to wait forever for
/// the lock its own first handler held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_stop_signal_during_the_snapshot_does_not_hang_the_emulator() {
    use armada_cli::local::emulator;
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, PutRequest,
        ScalarAttributeType, WriteRequest,
    };
    let (how, state) = durable_emulator();
    let port = how.port;
    let pid = emulator::spawn(&root(), &how).unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    emulator::wait_until_up(&endpoint, Duration::from_secs(60))
        .await
        .unwrap();
    let aws = armada_core::adapters::aws::AwsClients::load_local(&endpoint, "us-east-1").await;
    aws.dynamo
        .create_table()
        .table_name("t")
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    // Enough state that writing the snapshot takes a while.
    let many = AttributeValue::L(vec![AttributeValue::S("x".into()); 200]);
    for batch in 0..200 {
        let puts = (0..25)
            .map(|i| {
                let item = PutRequest::builder()
                    .item("pk", AttributeValue::S(format!("k{batch}-{i}")))
                    .item("v", many.clone())
                    .build()
                    .unwrap();
                WriteRequest::builder().put_request(item).build()
            })
            .collect();
        aws.dynamo
            .batch_write_item()
            .request_items("t", puts)
            .send()
            .await
            .unwrap();
    }
    assert!(process::terminate(pid));
    // The second signal comes while the snapshot is being written (or, if
    // that was over before it could be seen, after it).
    let writing = state.join("snapshot.pickle.tmp");
    wait::until(
        "the snapshot to be written",
        Duration::from_secs(60),
        || {
            let seen = writing.exists() || !process::alive(pid);
            async move { seen.then_some(()) }
        },
    )
    .await;
    process::terminate(pid);
    wait::until("the emulator to end", Duration::from_secs(60), || async {
        (!process::alive(pid)).then_some(())
    })
    .await;
    assert!(state.join("snapshot.pickle").exists());
    let _ = std::fs::remove_dir_all(&state);
}

/// A FIFO message moved to its dead-letter queue, then the emulator killed:
/// once it has replayed its journal, the message's group hands out the
/// next message. (The replay once left the moved message counted as in
/// flight, which held its group, and so its Run's later messages, for
/// good: `armada chaos` found harness messages that nobody received.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_fifo_message_frees_its_group_after_a_restart() {
    use armada_cli::local::emulator;
    use aws_sdk_sqs::types::QueueAttributeName as Attr;
    let (how, state) = durable_emulator();
    let port = how.port;
    let endpoint = format!("http://127.0.0.1:{port}");
    let first = emulator::spawn(&root(), &how).unwrap();
    emulator::wait_until_up(&endpoint, Duration::from_secs(300))
        .await
        .unwrap();
    let aws = armada_core::adapters::aws::AwsClients::load_local(&endpoint, "us-east-1").await;
    let sqs = &aws.sqs;
    let fifo = |name: &str| {
        sqs.create_queue()
            .queue_name(name)
            .attributes(Attr::FifoQueue, "true")
    };
    let dlq = fifo("held-dlq.fifo").send().await.unwrap();
    let dlq_arn = sqs
        .get_queue_attributes()
        .queue_url(dlq.queue_url().unwrap())
        .attribute_names(Attr::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes()
        .unwrap()[&Attr::QueueArn]
        .clone();
    let redrive = format!(r#"{{"deadLetterTargetArn": "{dlq_arn}", "maxReceiveCount": "1"}}"#);
    let queue = fifo("held.fifo")
        .attributes(Attr::RedrivePolicy, redrive)
        .send()
        .await
        .unwrap();
    let url = queue.queue_url().unwrap().to_string();
    let send = |body: &'static str| {
        sqs.send_message()
            .queue_url(&url)
            .message_body(body)
            .message_group_id("run_1")
            .message_deduplication_id(body)
            .send()
    };
    let receive = |wait: i32| {
        sqs.receive_message()
            .queue_url(&url)
            .wait_time_seconds(wait)
            .send()
    };
    // Received once, handed back at once, then moved on the next receive.
    send("first").await.unwrap();
    let got = receive(1).await.unwrap();
    let handle = got.messages()[0].receipt_handle().unwrap();
    sqs.change_message_visibility()
        .queue_url(&url)
        .receipt_handle(handle)
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    assert!(receive(1).await.unwrap().messages().is_empty(), "moved");
    send("second").await.unwrap();

    assert!(process::kill(first));
    wait::until(
        "the killed emulator to end",
        Duration::from_secs(30),
        || {
            let gone = !process::alive(first);
            async move { gone.then_some(()) }
        },
    )
    .await;
    let second = emulator::spawn(&root(), &how).unwrap();
    emulator::wait_until_up(&endpoint, Duration::from_secs(300))
        .await
        .unwrap();
    let got = receive(5).await.unwrap();
    let bodies: Vec<&str> = got.messages().iter().filter_map(|m| m.body()).collect();
    assert_eq!(bodies, ["second"], "the group hands out its next message");
    process::stop(second, Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&state);
}

/// A sandbox task's network names the emulator's default subnet and
/// security group: after a `kill -9` they have the same ids, whichever
/// request first touched EC2 (here a read, which is not journaled), so a
/// journaled `RunTask` replays and a later `StopTask` finds its task.
/// They came out at random once, and an emulator restarted under a
/// `sandbox-kill` chaos run never came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_network_keeps_its_ids_across_a_kill() {
    use armada_cli::local::{emulator, provision};
    let (how, state) = durable_emulator();
    let endpoint = format!("http://127.0.0.1:{}", how.port);
    let first = emulator::spawn(&root(), &how).unwrap();
    emulator::wait_until_up(&endpoint, Duration::from_secs(60))
        .await
        .unwrap();
    let network = provision::default_network(&endpoint, "us-east-1")
        .await
        .unwrap();
    // A journaled write after it: the kill leaves a record to replay.
    let isolated = provision::isolated_security_group(&endpoint, "us-east-1")
        .await
        .unwrap();
    assert!(process::kill(first));
    wait::until(
        "the killed emulator to be gone",
        Duration::from_secs(30),
        || async { (!process::alive(first)).then_some(()) },
    )
    .await;
    let second = emulator::spawn(&root(), &how).unwrap();
    emulator::wait_until_up(&endpoint, Duration::from_secs(60))
        .await
        .unwrap();
    let again = provision::default_network(&endpoint, "us-east-1")
        .await
        .unwrap();
    assert_eq!(again, network);
    let isolated_again = provision::isolated_security_group(&endpoint, "us-east-1")
        .await
        .unwrap();
    assert_eq!(isolated_again, isolated);
    process::stop(second, Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&state);
}
