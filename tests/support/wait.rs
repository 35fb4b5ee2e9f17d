//! Waiting on conditions, never on the clock: a test that asserts that
//! something did *not* happen first waits for positive evidence that the
//! stack is past the point where it would have (a queue drained, another
//! sandbox hibernated), so a slow machine cannot make it pass untested.

use std::time::Duration;

use crate::TestStack;

/// Polls until `f` holds (up to 30 s).
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..300 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Waits until every queue of the stack holds no message, visible or in
/// flight (delayed ones, the watchdogs', are not counted): whatever was
/// sent has been handled, and its effects committed.
pub async fn drained(t: &TestStack) {
    use aws_sdk_sqs::types::QueueAttributeName;
    for _ in 0..300 {
        let mut busy = 0;
        for url in t.stack.provisioned.queue_urls.values() {
            let a = t
                .stack
                .aws
                .sqs
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::All)
                .send()
                .await
                .expect("queue attributes");
            let attrs = a.attributes().cloned().unwrap_or_default();
            for k in [
                QueueAttributeName::ApproximateNumberOfMessages,
                QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            ] {
                busy += attrs
                    .get(&k)
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(0);
            }
        }
        if busy == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("queues did not drain");
}
