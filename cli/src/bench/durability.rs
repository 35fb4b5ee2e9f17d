//! The local emulator's durability, measured: what its journal costs per
//! request (the same requests against an emulator that keeps its state and
//! one that does not, started side by side and taken in turns), and how
//! long the bench's own emulator, holding everything the phases and the
//! fill left, takes to answer again after `kill -9` (its journal replayed)
//! and after a stop (the snapshot written, then loaded).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};

use armada_core::adapters::aws::AwsClients;

use crate::local::{emulator, process};

struct Target {
    name: &'static str,
    aws: AwsClients,
    queue: String,
    pid: u32,
    took: Duration,
    requests: u64,
}

async fn start(root: &Path, name: &'static str, state: Option<PathBuf>) -> Result<Target> {
    let how = emulator::Spawn {
        port: process::free_port()?,
        die_with_parent: true,
        state,
        slow: None,
    };
    let pid = emulator::spawn(root, &how)?;
    let endpoint = format!("http://127.0.0.1:{}", how.port);
    emulator::wait_until_up(&endpoint, Duration::from_secs(60)).await?;
    let aws = AwsClients::load_local(&endpoint, "us-east-1").await;
    aws.dynamo
        .create_table()
        .table_name("cost")
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()?,
        )
        .send()
        .await?;
    let queue = aws
        .sqs
        .create_queue()
        .queue_name("cost")
        .send()
        .await?
        .queue_url
        .context("no queue url")?;
    Ok(Target {
        name,
        aws,
        queue,
        pid,
        took: Duration::ZERO,
        requests: 0,
    })
}

/// One round of the mix a Run's step makes: a conditional write, a read,
/// and a message sent, received and deleted.
async fn round(t: &mut Target, i: usize) -> Result<()> {
    let at = Instant::now();
    let pk = AttributeValue::S(format!("item-{i}"));
    t.aws
        .dynamo
        .put_item()
        .table_name("cost")
        .item("pk", pk.clone())
        .item("body", AttributeValue::S("x".repeat(512)))
        .condition_expression("attribute_not_exists(pk)")
        .send()
        .await?;
    t.aws
        .dynamo
        .get_item()
        .table_name("cost")
        .key("pk", pk)
        .send()
        .await?;
    t.aws
        .sqs
        .send_message()
        .queue_url(&t.queue)
        .message_body(format!("message {i}"))
        .send()
        .await?;
    let got = t
        .aws
        .sqs
        .receive_message()
        .queue_url(&t.queue)
        .send()
        .await?;
    for m in got.messages() {
        if let Some(h) = m.receipt_handle() {
            t.aws
                .sqs
                .delete_message()
                .queue_url(&t.queue)
                .receipt_handle(h)
                .send()
                .await?;
            t.requests += 1;
        }
    }
    t.requests += 4;
    t.took += at.elapsed();
    Ok(())
}

/// The same `rounds` of requests against an in-memory emulator and a
/// durable one, in alternating turns of 50; prints ms per request of each.
pub async fn journal_cost(root: &Path, rounds: usize) -> Result<()> {
    let state =
        emulator::ensure_state_dir(root)?.join(format!("bench-journal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let mut memory = start(root, "in memory", None).await?;
    let mut durable = start(root, "durable", Some(state.clone())).await?;
    let turn = 50;
    let mut i = 0;
    while i < rounds {
        let (a, b) = if (i / turn) % 2 == 0 {
            (&mut memory, &mut durable)
        } else {
            (&mut durable, &mut memory)
        };
        for j in i..(i + turn).min(rounds) {
            round(a, j).await?;
        }
        for j in i..(i + turn).min(rounds) {
            round(b, j).await?;
        }
        i += turn;
    }
    println!("\nEmulator journal: the same {rounds} rounds (put, get, send, receive, delete) against each");
    let per = |t: &Target| t.took.as_secs_f64() * 1000.0 / t.requests.max(1) as f64;
    for t in [&memory, &durable] {
        println!("  {:<10} {:.2} ms per request", t.name, per(t));
    }
    println!(
        "  durable / in memory: {:.2}x",
        per(&durable) / per(&memory)
    );
    for t in [&memory, &durable] {
        process::stop(t.pid, Duration::from_secs(30));
    }
    let _ = std::fs::remove_dir_all(&state);
    Ok(())
}

/// The bench's own emulator (its stack stopped), killed and started again,
/// then stopped and started again: how long each start takes to answer,
/// and how long the stop took (it writes the snapshot).
pub async fn restart_times(root: &Path, how: &emulator::Spawn, pid: u32) -> Result<u32> {
    let endpoint = format!("http://127.0.0.1:{}", how.port);
    let size = |name: &str| {
        how.state
            .as_ref()
            .map(|d| {
                std::fs::read_dir(d)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(name))
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum::<u64>()
            })
            .unwrap_or(0) as f64
            / (1 << 20) as f64
    };
    println!("\nEmulator restarts, holding everything above");
    println!(
        "  state: snapshot {:.1} MB, journal {:.1} MB",
        size("snapshot"),
        size("journal-")
    );
    process::kill(pid);
    while process::alive(pid) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let at = Instant::now();
    let pid = emulator::spawn(root, how)?;
    emulator::wait_until_up(&endpoint, Duration::from_secs(600)).await?;
    println!(
        "  after kill -9: answering in {:.1} s (snapshot loaded, journal replayed)",
        at.elapsed().as_secs_f64()
    );
    let at = Instant::now();
    process::stop(pid, Duration::from_secs(300));
    let stop = at.elapsed();
    let at = Instant::now();
    let pid = emulator::spawn(root, how)?;
    emulator::wait_until_up(&endpoint, Duration::from_secs(600)).await?;
    println!(
        "  after a stop ({:.1} s, writing a snapshot of {:.1} MB): answering in {:.1} s",
        stop.as_secs_f64(),
        size("snapshot"),
        at.elapsed().as_secs_f64()
    );
    Ok(pid)
}
