//! The emulator as the project runs it (`cli/src/local/armada_moto.py`):
//! moto with a transaction rollback that copies only the items a
//! `TransactWriteItems` touches (a cancelled transaction must still leave
//! no trace; a committed one must still write everything), a query that
//! reads only its partition, and a FIFO long poll that waits rather than
//! spins while its group is in flight and takes the group as soon as it is
//! free.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, ConditionCheck, Delete, KeySchemaElement,
    KeyType, Put, ScalarAttributeType, TransactWriteItem, Update,
};

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;

use armada_core::adapters::aws::AwsClients;
use armada_tests::{emulator_endpoint, TestStack};

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_string())
}

fn key(pk: &str, sk: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([("pk".to_string(), s(pk)), ("sk".to_string(), s(sk))])
}

fn item(pk: &str, sk: &str, v: &str) -> HashMap<String, AttributeValue> {
    let mut k = key(pk, sk);
    k.insert("v".into(), s(v));
    k
}

async fn table(aws: &AwsClients) -> String {
    let name = format!("{}-txn", TestStack::stack_name());
    let attr = |n: &str| {
        AttributeDefinition::builder()
            .attribute_name(n)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .unwrap()
    };
    let schema = |n: &str, t| {
        KeySchemaElement::builder()
            .attribute_name(n)
            .key_type(t)
            .build()
            .unwrap()
    };
    aws.dynamo
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr("pk"))
        .attribute_definitions(attr("sk"))
        .key_schema(schema("pk", KeyType::Hash))
        .key_schema(schema("sk", KeyType::Range))
        .send()
        .await
        .unwrap();
    name
}

async fn get(aws: &AwsClients, t: &str, pk: &str, sk: &str) -> Option<String> {
    aws.dynamo
        .get_item()
        .table_name(t)
        .set_key(Some(key(pk, sk)))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .map(|i| i["v"].as_s().unwrap().clone())
}

async fn count(aws: &AwsClients, t: &str) -> i32 {
    aws.dynamo.scan().table_name(t).send().await.unwrap().count
}

/// Put a new item, update, delete, a failing condition, then more writes:
/// everything the transaction did before and after the failure is undone.
fn transaction(t: &str, condition_holds: bool) -> Vec<TransactWriteItem> {
    let put_new = Put::builder()
        .table_name(t)
        .set_item(Some(item("a", "1", "new")))
        .build()
        .unwrap();
    let update = Update::builder()
        .table_name(t)
        .set_key(Some(key("b", "1")))
        .update_expression("SET v = :v")
        .expression_attribute_values(":v", s("changed"))
        .build()
        .unwrap();
    let delete = Delete::builder()
        .table_name(t)
        .set_key(Some(key("c", "1")))
        .build()
        .unwrap();
    let check = ConditionCheck::builder()
        .table_name(t)
        .set_key(Some(key("guard", "1")))
        .condition_expression("v = :want")
        .expression_attribute_values(":want", s(if condition_holds { "on" } else { "off" }))
        .build()
        .unwrap();
    let put_after = Put::builder()
        .table_name(t)
        .set_item(Some(item("d", "1", "after")))
        .build()
        .unwrap();
    let overwrite = Put::builder()
        .table_name(t)
        .set_item(Some(item("b", "2", "overwritten")))
        .build()
        .unwrap();
    vec![
        TransactWriteItem::builder().put(put_new).build(),
        TransactWriteItem::builder().update(update).build(),
        TransactWriteItem::builder().delete(delete).build(),
        TransactWriteItem::builder().condition_check(check).build(),
        TransactWriteItem::builder().put(put_after).build(),
        TransactWriteItem::builder().put(overwrite).build(),
    ]
}

async fn seed(aws: &AwsClients, t: &str) {
    for (pk, sk, v) in [
        ("b", "1", "old"),
        ("b", "2", "old"),
        ("c", "1", "doomed"),
        ("guard", "1", "on"),
    ] {
        aws.dynamo
            .put_item()
            .table_name(t)
            .set_item(Some(item(pk, sk, v)))
            .send()
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_cancelled_transaction_leaves_no_trace() {
    let aws = AwsClients::load_local(&emulator_endpoint(), "us-east-1").await;
    let t = table(&aws).await;
    seed(&aws, &t).await;

    let err = aws
        .dynamo
        .transact_write_items()
        .set_transact_items(Some(transaction(&t, false)))
        .send()
        .await
        .unwrap_err();
    let reasons: Vec<String> = err
        .as_service_error()
        .and_then(|e| match e {
            TransactWriteItemsError::TransactionCanceledException(c) => Some(c),
            _ => None,
        })
        .map(|e| {
            e.cancellation_reasons()
                .iter()
                .map(|r| r.code().unwrap_or_default().to_string())
                .collect()
        })
        .expect("the transaction is cancelled");
    assert_eq!(reasons[3], "ConditionalCheckFailed", "{reasons:?}");

    assert_eq!(get(&aws, &t, "a", "1").await, None, "a new item is removed");
    assert_eq!(get(&aws, &t, "b", "1").await.as_deref(), Some("old"));
    assert_eq!(get(&aws, &t, "b", "2").await.as_deref(), Some("old"));
    assert_eq!(get(&aws, &t, "c", "1").await.as_deref(), Some("doomed"));
    assert_eq!(
        get(&aws, &t, "d", "1").await,
        None,
        "writes after the failure too"
    );
    assert_eq!(count(&aws, &t).await, 4);

    // The same transaction with its condition met writes all of it.
    aws.dynamo
        .transact_write_items()
        .set_transact_items(Some(transaction(&t, true)))
        .send()
        .await
        .unwrap();
    assert_eq!(get(&aws, &t, "a", "1").await.as_deref(), Some("new"));
    assert_eq!(get(&aws, &t, "b", "1").await.as_deref(), Some("changed"));
    assert_eq!(
        get(&aws, &t, "b", "2").await.as_deref(),
        Some("overwritten")
    );
    assert_eq!(get(&aws, &t, "c", "1").await, None);
    assert_eq!(get(&aws, &t, "d", "1").await.as_deref(), Some("after"));
    assert_eq!(count(&aws, &t).await, 5);
}

/// A query reads one partition (the entry point reads only that partition):
/// exactly its items, in key order either way, page by page.
#[tokio::test]
async fn a_query_returns_its_partition_in_order_page_by_page() {
    let aws = AwsClients::load_local(&emulator_endpoint(), "us-east-1").await;
    let t = table(&aws).await;
    for pk in ["p", "q", "r"] {
        for sk in ["3", "1", "5", "2", "4"] {
            aws.dynamo
                .put_item()
                .table_name(&t)
                .set_item(Some(item(pk, sk, &format!("{pk}{sk}"))))
                .send()
                .await
                .unwrap();
        }
    }
    for (forward, want) in [(true, "q1 q2 q3 q4 q5"), (false, "q5 q4 q3 q2 q1")] {
        let mut got = Vec::new();
        let mut start = None;
        loop {
            let page = aws
                .dynamo
                .query()
                .table_name(&t)
                .key_condition_expression("pk = :p")
                .expression_attribute_values(":p", s("q"))
                .scan_index_forward(forward)
                .limit(2)
                .set_exclusive_start_key(start)
                .send()
                .await
                .unwrap();
            got.extend(page.items().iter().map(|i| i["v"].as_s().unwrap().clone()));
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                break;
            }
        }
        assert_eq!(got.join(" "), want);
    }
    let none = aws
        .dynamo
        .query()
        .table_name(&t)
        .key_condition_expression("pk = :p AND sk > :s")
        .expression_attribute_values(":p", s("absent"))
        .expression_attribute_values(":s", s("0"))
        .send()
        .await
        .unwrap();
    assert_eq!(none.count, 0);
}

/// CPU seconds a process has used (user + system, at Linux's 100 ticks/s).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which ends with the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// A FIFO queue of this test's own; its URL.
async fn fifo_queue(aws: &AwsClients, what: &str) -> String {
    let name = format!("{}-{what}.fifo", TestStack::stack_name());
    aws.sqs
        .create_queue()
        .queue_name(&name)
        .attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_poll_on_a_fifo_group_in_flight_waits_instead_of_spinning() {
    let ep = emulator_endpoint();
    armada_cli::local::emulator::wait_until_up(&ep, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let Some(pid) = armada_tests::emulator_pid() else {
        return; // An emulator that is not ours (ARMADA_TEST_ENDPOINT).
    };
    let aws = AwsClients::load_local(&ep, "us-east-1").await;
    let url = fifo_queue(&aws, "group").await;
    for i in 0..3 {
        aws.sqs
            .send_message()
            .queue_url(&url)
            .message_body(format!("m{i}"))
            .message_group_id("parent")
            .message_deduplication_id(format!("d{i}"))
            .send()
            .await
            .unwrap();
    }
    // The first is in flight: the other two wait behind it, visible.
    let first = aws
        .sqs
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(1)
        .send()
        .await
        .unwrap();
    assert_eq!(first.messages().len(), 1);
    let before = cpu_seconds(pid);
    let polls = (0..3).map(|_| {
        aws.sqs
            .receive_message()
            .queue_url(&url)
            .wait_time_seconds(4)
            .send()
    });
    for got in futures::future::join_all(polls).await {
        assert!(got.unwrap().messages().is_empty(), "the group is held");
    }
    let used = cpu_seconds(pid) - before;
    eprintln!("emulator CPU during the polls: {used:.2} s");
    // Spinning, three polls of 4 s took about 4 s of CPU (a core, the GIL);
    // waiting, next to nothing (the other tests here share the emulator).
    assert!(
        used < 2.0,
        "the emulator used {used:.2} s of CPU for three idle polls"
    );

    // A poll that began while the group was held gets the next message as
    // soon as the one in flight is deleted, not when its wait ends.
    let began = std::time::Instant::now();
    let poll = aws
        .sqs
        .receive_message()
        .queue_url(&url)
        .wait_time_seconds(10)
        .send();
    let free = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let receipt = first.messages()[0].receipt_handle().unwrap();
        aws.sqs
            .delete_message()
            .queue_url(&url)
            .receipt_handle(receipt)
            .send()
            .await
            .unwrap();
    };
    let (got, ()) = tokio::join!(poll, free);
    let got = got.unwrap();
    assert_eq!(got.messages()[0].body(), Some("m1"));
    let waited = began.elapsed();
    assert!(
        waited.as_secs_f64() < 3.0,
        "the freed group waited {waited:?}"
    );
}

/// SQS drops a FIFO message whose deduplication id was sent in the last
/// five minutes, received and deleted or not; an AWS-faithful emulator is
/// what shows a resend that would be lost in AWS (a sandbox's hand-over
/// was one: it reused its step's id).
#[tokio::test]
async fn a_fifo_queue_drops_a_repeat_of_a_message_already_consumed() {
    let ep = emulator_endpoint();
    armada_cli::local::emulator::wait_until_up(&ep, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let aws = AwsClients::load_local(&ep, "us-east-1").await;
    let url = fifo_queue(&aws, "dedup").await;
    let send = |body: &'static str, dedup: &'static str| {
        aws.sqs
            .send_message()
            .queue_url(&url)
            .message_body(body)
            .message_group_id("run_1")
            .message_deduplication_id(dedup)
            .send()
    };
    let take = || async {
        let got = aws
            .sqs
            .receive_message()
            .queue_url(&url)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        let mut bodies = Vec::new();
        for m in got.messages() {
            bodies.push(m.body().unwrap_or_default().to_string());
            aws.sqs
                .delete_message()
                .queue_url(&url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
        bodies
    };
    send("step 3", "run_1-step-3").await.unwrap();
    assert_eq!(take().await, ["step 3"]);
    // Consumed and deleted: a repeat of its id is still a repeat.
    send("step 3 again", "run_1-step-3").await.unwrap();
    send("handed over", "run_1-step-3-handed-7").await.unwrap();
    assert_eq!(take().await, ["handed over"]);
    assert!(take().await.is_empty());
}

/// A consumer whose visibility ran out and whose message another consumer
/// has received since cannot delete it with its old receipt handle (the
/// request succeeds and deletes nothing, as SQS documents); the latest
/// handle does. (moto deleted it given any handle it ever had: a
/// consumer killed mid-step took the live copy's message with it.)
#[tokio::test]
async fn only_the_latest_receipt_handle_deletes_a_message() {
    let ep = emulator_endpoint();
    armada_cli::local::emulator::wait_until_up(&ep, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let aws = AwsClients::load_local(&ep, "us-east-1").await;
    let url = fifo_queue(&aws, "receipts").await;
    aws.sqs
        .send_message()
        .queue_url(&url)
        .message_body("step 0")
        .message_group_id("run_1")
        .message_deduplication_id("run_1-step-0-0")
        .send()
        .await
        .unwrap();
    let receive = |hidden_s: i32| {
        aws.sqs
            .receive_message()
            .queue_url(&url)
            .visibility_timeout(hidden_s)
            .wait_time_seconds(2)
            .send()
    };
    let delete = |handle: String| {
        aws.sqs
            .delete_message()
            .queue_url(&url)
            .receipt_handle(handle)
            .send()
    };
    let handle = |out: &aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput| {
        out.messages()
            .first()
            .and_then(|m| m.receipt_handle())
            .map(str::to_string)
    };
    // Taken for a second only, then taken again by another consumer.
    let first = handle(&receive(1).await.unwrap()).expect("received");
    let second = armada_tests::wait::until(
        "the message to show again",
        std::time::Duration::from_secs(10),
        || async { handle(&receive(30).await.unwrap()) },
    )
    .await;
    assert_ne!(first, second);
    delete(first).await.expect("an old handle is no error");
    // Still there: held by the second consumer until it deletes it.
    aws.sqs
        .change_message_visibility()
        .queue_url(&url)
        .receipt_handle(&second)
        .visibility_timeout(0)
        .send()
        .await
        .expect("the second consumer still holds it");
    let third = handle(&receive(30).await.unwrap()).expect("still on the queue");
    delete(third).await.unwrap();
    assert!(receive(30).await.unwrap().messages().is_empty());
}
