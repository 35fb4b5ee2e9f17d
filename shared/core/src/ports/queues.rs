//! The work queues.

use std::fmt::Debug;

use async_trait::async_trait;

use armada_domain::messages::{DispatchMessage, HarnessMessage};

use crate::error::StoreError;

/// The work queues: the dispatch queue, the harness FIFO queue, and the
/// visibility of messages being handled.
#[async_trait]
pub trait Queues: Send + Sync + Debug {
    /// Sends to the dispatch queue, delivered after `delay_s` (at most 900).
    async fn send_dispatch_delayed(
        &self,
        msg: &DispatchMessage,
        delay_s: u32,
    ) -> Result<(), StoreError>;
    /// Sends to the harness FIFO queue, grouped by Run and deduplicated per
    /// step.
    async fn send_harness(&self, msg: &HarnessMessage) -> Result<(), StoreError>;
    /// Sends to the delivery queue (callbacks and chat messages to a
    /// tenant's endpoints), delivered after `delay_s` (at most 900).
    async fn send_delivery(&self, msg: &DispatchMessage, delay_s: u32) -> Result<(), StoreError>;
    /// Sends a dispatcher's message that ran out of tries to the dispatch
    /// dead-letter queue (the delivery queue's too), where the dispatcher
    /// records it and operators find it.
    async fn send_dead_letter(&self, msg: &DispatchMessage) -> Result<(), StoreError>;
    /// Hides a message being handled for `seconds` more (a heartbeat).
    async fn keep_hidden(&self, queue_url: &str, receipt_handle: &str, seconds: u32);
    /// Delays the next delivery of a failed message: `base * 2^(receives-1)`
    /// seconds (at least `min_delay_s`), capped at 15 minutes.
    async fn back_off(
        &self,
        queue_url: &str,
        receipt_handle: &str,
        receives: u32,
        base_s: u32,
        min_delay_s: u32,
    );
    /// The URL of a queue from the ARN an SQS event names.
    fn url_for_arn(&self, arn: &str) -> Option<String>;
    /// Whether a queue (by name) is one of the dead-letter queues.
    fn is_dead_letter_queue(&self, name: &str) -> bool;
    /// Where sandboxes send their answers (the harness queue's URL).
    fn harness_url(&self) -> String;
    /// Where sandboxes ask for new credentials (the dispatch queue's URL).
    fn dispatch_url(&self) -> String;

    async fn send_dispatch(&self, msg: &DispatchMessage) -> Result<(), StoreError> {
        self.send_dispatch_delayed(msg, 0).await
    }
    /// Sends a dispatcher's message to the queue of its kind: what goes to
    /// a tenant's endpoint to the delivery queue (a slow endpoint holds a
    /// delivery slot there, never the settling of Runs), the rest to the
    /// dispatch queue.
    async fn send_routed(&self, msg: &DispatchMessage) -> Result<(), StoreError> {
        if msg.is_delivery() {
            self.send_delivery(msg, 0).await
        } else {
            self.send_dispatch(msg).await
        }
    }
}
