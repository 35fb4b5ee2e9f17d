//! Waiting on conditions, never on the clock: a test that asserts that
//! something did *not* happen first waits for positive evidence that the
//! stack is past the point where it would have (a queue drained, another
//! sandbox hibernated), so a slow machine cannot make it pass untested.

use std::time::Duration;

use crate::TestStack;

/// How long a condition is given before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(30);
/// How often it is asked again.
const POLL: Duration = Duration::from_millis(100);

/// Polls until `f` holds (up to [`PATIENCE`]).
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    until(what, PATIENCE, || {
        let holds = f();
        async move { holds.await.then_some(()) }
    })
    .await
}

/// Polls `f` until it yields a value, and returns it; fails the test
/// after `within`, naming `what` it waited for.
pub async fn until<T, F, Fut>(what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(found) = f().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until every queue of the stack holds no message, visible or in
/// flight (delayed ones, the watchdogs', are not counted): whatever was
/// sent has been handled, and its effects committed.
pub async fn drained(t: &TestStack) {
    until("the queues to drain", PATIENCE, || queued(t)).await
}

/// `Some` when no queue of the stack holds a message.
async fn queued(t: &TestStack) -> Option<()> {
    use aws_sdk_sqs::types::QueueAttributeName;
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
    (busy == 0).then_some(())
}

/// Until something accepts connections on the loopback `port` (a server
/// the test started, up to a minute).
pub async fn listening(what: &str, port: u16) {
    until(what, Duration::from_secs(60), || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ())
    })
    .await
}
