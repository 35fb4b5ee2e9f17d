//! Queue message contracts, each defined once and used by its producer and
//! its consumer. Messages carry ids, never bodies: the Run record is the
//! source of truth, so a duplicated or reordered message can be judged against it.

use serde::{Deserialize, Serialize};

use crate::crypto::{digest_eq, hmac_sha256_hex};
pub use crate::sandbox::hand::ResultBody;

/// On the dispatch queue (ingress → dispatcher, harness → dispatcher).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DispatchMessage {
    /// A Run was accepted and waits to be started.
    StartRun { run_id: String, tenant: String },
    /// A Run reached a terminal state; its post-terminal duties are due.
    RunTerminal { run_id: String, tenant: String },
    /// A Run waits for the children of waiting point `round`: create the
    /// ones not yet created and start as many as `max_parallel` allows.
    /// Safe to repeat (children are created once, a start is idempotent).
    SpawnChildren {
        run_id: String,
        tenant: String,
        round: u32,
    },
    /// Send approval `approval_id`'s link to `recipient` (an approver's
    /// address, or the chat webhook): a token is minted for it, its hash
    /// stored, and the message sent. A failure is retried by the queue; the
    /// approval exists before anything is sent.
    ///
    /// Only the control plane sends it: `seal` is [`notice_seal`] under
    /// the deployment's secret, which no sandbox holds (a task's
    /// credentials may send to the dispatch queue, and would otherwise
    /// have links minted and mailed again at will).
    NotifyApproval {
        approval_id: String,
        tenant: String,
        recipient: String,
        #[serde(default)]
        seal: String,
    },
    /// A Run waits on a sandbox at `step` (for the sandbox to be free, to
    /// start, or for a call's answer): check on it. Sent with a delay and
    /// sent again while the Run keeps waiting.
    CheckRun {
        run_id: String,
        tenant: String,
        step: u32,
        /// The epoch that sent it: a later claim ends this chain of checks
        /// (and starts its own if the Run waits again).
        epoch: u64,
        /// Its place in the chain: the wait's first check is 0, each
        /// check sends `n + 1`. A check handled twice (its delete lost)
        /// sends two `n + 1`s; only one of them may go on
        /// ([`check_slot`]), or the chain would fork at every repeat.
        #[serde(default)]
        n: u32,
    },
    /// A sandbox agent asks for new AWS credentials (its own expire within
    /// the hour): sent by the agent, sealed with its generation's answer
    /// key; answered on its hand queue
    /// ([`crate::sandbox::credentials`]).
    RenewCredentials {
        tenant: String,
        agent: String,
        generation: u64,
        requested_at_ms: i64,
        seal: String,
    },
    /// Schedule `schedule_id` fires for `scheduled_at` (RFC 3339, as
    /// EventBridge Scheduler fills in `<aws.scheduler.scheduled-time>`).
    /// Sent by the scheduler with the `Input` the stack gave it when it
    /// made the schedule; `seal` is [`schedule_seal`], so no sandbox can
    /// fire a tenant's schedule.
    FireSchedule {
        schedule_id: String,
        tenant: String,
        scheduled_at: String,
        #[serde(default)]
        seal: String,
    },
    /// Deliver the outcome of closed Run `run_id` to the `callback_url` it
    /// was started with. On the delivery queue, consumed apart from the
    /// dispatch queue: a slow or silent endpoint holds a delivery slot,
    /// never the settling of Runs. Sealed by the control plane
    /// ([`delivery_seal`]): no sandbox can have callbacks sent again.
    DeliverCallback {
        run_id: String,
        tenant: String,
        /// The Run is the last step of a relay chain that ended in this
        /// state: the chain's outcome goes to the chain's callback URL.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chain: Option<crate::collab::chain::ChainState>,
        #[serde(default)]
        seal: String,
    },
    /// Send the reply to the mail that started closed Run `run_id`, from
    /// its mailbox, in its thread. On the delivery queue, as a callback.
    /// Sealed by the control plane ([`reply_seal`]): no sandbox can have
    /// replies sent again.
    SendReply {
        run_id: String,
        tenant: String,
        #[serde(default)]
        seal: String,
    },
}

/// The seal of a control plane's `SendReply`: an HMAC of the Run under a
/// key of its own.
pub fn reply_seal(secret: &str, run_id: &str, tenant: &str) -> String {
    let key = hmac_sha256_hex(secret.as_bytes(), b"armada-mail-replies");
    hmac_sha256_hex(key.as_bytes(), format!("{run_id}\n{tenant}").as_bytes())
}

/// The seal of a control plane's `DeliverCallback`: an HMAC of the Run
/// under a key of its own (no notice's seal passes for it).
pub fn delivery_seal(
    secret: &str,
    run_id: &str,
    tenant: &str,
    chain: Option<crate::collab::chain::ChainState>,
) -> String {
    let key = hmac_sha256_hex(secret.as_bytes(), b"armada-callback-deliveries");
    let chain = chain.map(|c| format!("{c:?}")).unwrap_or_default();
    hmac_sha256_hex(
        key.as_bytes(),
        format!("{run_id}\n{tenant}\n{chain}").as_bytes(),
    )
}

/// The seal of a schedule's firings: an HMAC of the schedule and its
/// tenant under a key of its own (the scheduled time is the scheduler's
/// to fill in, so it is not sealed; a firing is recorded once per time).
pub fn schedule_seal(secret: &str, schedule_id: &str, tenant: &str) -> String {
    let key = hmac_sha256_hex(secret.as_bytes(), b"armada-schedule-firings");
    hmac_sha256_hex(
        key.as_bytes(),
        format!("{schedule_id}\n{tenant}").as_bytes(),
    )
}

/// The seal of a control plane's `NotifyApproval`: an HMAC of its fields
/// under a key of its own derived from the deployment's secret.
pub fn notice_seal(secret: &str, approval_id: &str, tenant: &str, recipient: &str) -> String {
    let key = hmac_sha256_hex(secret.as_bytes(), b"armada-approval-notices");
    hmac_sha256_hex(
        key.as_bytes(),
        format!("{approval_id}\n{tenant}\n{recipient}").as_bytes(),
    )
}

impl DispatchMessage {
    /// A sealed `NotifyApproval`.
    pub fn notify_approval(secret: &str, approval_id: &str, tenant: &str, recipient: &str) -> Self {
        DispatchMessage::NotifyApproval {
            approval_id: approval_id.to_string(),
            tenant: tenant.to_string(),
            recipient: recipient.to_string(),
            seal: notice_seal(secret, approval_id, tenant, recipient),
        }
    }

    /// The reply to the mail that started closed Run `run_id`.
    pub fn send_reply(secret: &str, run_id: &str, tenant: &str) -> Self {
        DispatchMessage::SendReply {
            run_id: run_id.to_string(),
            tenant: tenant.to_string(),
            seal: reply_seal(secret, run_id, tenant),
        }
    }

    /// The delivery of closed Run `run_id`'s outcome to its callback URL.
    pub fn deliver_callback(secret: &str, run_id: &str, tenant: &str) -> Self {
        Self::deliver(secret, run_id, tenant, None)
    }

    /// The delivery of a relay chain's outcome (`state`), which ended at
    /// its step `run_id`, to the chain's callback URL.
    pub fn deliver_chain_callback(
        secret: &str,
        run_id: &str,
        tenant: &str,
        state: crate::collab::chain::ChainState,
    ) -> Self {
        Self::deliver(secret, run_id, tenant, Some(state))
    }

    fn deliver(
        secret: &str,
        run_id: &str,
        tenant: &str,
        chain: Option<crate::collab::chain::ChainState>,
    ) -> Self {
        DispatchMessage::DeliverCallback {
            run_id: run_id.to_string(),
            tenant: tenant.to_string(),
            chain,
            seal: delivery_seal(secret, run_id, tenant, chain),
        }
    }

    /// Whether the message goes to a tenant's endpoint (a Run's callback,
    /// an approval's chat message, a mail's reply): it travels on the
    /// delivery queue.
    pub fn is_delivery(&self) -> bool {
        match self {
            DispatchMessage::DeliverCallback { .. } | DispatchMessage::SendReply { .. } => true,
            DispatchMessage::NotifyApproval { recipient, .. } => {
                recipient == crate::approval::CHAT_RECIPIENT
            }
            _ => false,
        }
    }

    /// A schedule's firing message, sealed, with the scheduler's
    /// placeholder for the time (or a time, when the stack fires it).
    pub fn fire_schedule(
        secret: &str,
        schedule_id: &str,
        tenant: &str,
        scheduled_at: &str,
    ) -> Self {
        DispatchMessage::FireSchedule {
            schedule_id: schedule_id.to_string(),
            tenant: tenant.to_string(),
            scheduled_at: scheduled_at.to_string(),
            seal: schedule_seal(secret, schedule_id, tenant),
        }
    }

    /// Whether a `NotifyApproval`, `DeliverCallback` or `FireSchedule` was sealed by the
    /// control plane (any other message: true, it is judged on its own
    /// terms).
    pub fn sealed_by_control_plane(&self, secret: &str) -> bool {
        match self {
            DispatchMessage::DeliverCallback {
                run_id,
                tenant,
                chain,
                seal,
            } => digest_eq(seal, &delivery_seal(secret, run_id, tenant, *chain)),
            DispatchMessage::NotifyApproval {
                approval_id,
                tenant,
                recipient,
                seal,
            } => digest_eq(seal, &notice_seal(secret, approval_id, tenant, recipient)),
            DispatchMessage::FireSchedule {
                schedule_id,
                tenant,
                seal,
                ..
            } => digest_eq(seal, &schedule_seal(secret, schedule_id, tenant)),
            DispatchMessage::SendReply {
                run_id,
                tenant,
                seal,
            } => digest_eq(seal, &reply_seal(secret, run_id, tenant)),
            DispatchMessage::StartRun { .. }
            | DispatchMessage::RunTerminal { .. }
            | DispatchMessage::SpawnChildren { .. }
            | DispatchMessage::CheckRun { .. }
            | DispatchMessage::RenewCredentials { .. } => true,
        }
    }

    /// What the message is about: its Run, or for `NotifyApproval` the
    /// approval and for `RenewCredentials` the agent (it names the
    /// handling's log span and call accounting).
    pub fn subject(&self) -> &str {
        match self {
            DispatchMessage::StartRun { run_id, .. }
            | DispatchMessage::RunTerminal { run_id, .. }
            | DispatchMessage::SpawnChildren { run_id, .. }
            | DispatchMessage::CheckRun { run_id, .. }
            | DispatchMessage::DeliverCallback { run_id, .. }
            | DispatchMessage::SendReply { run_id, .. } => run_id,
            DispatchMessage::NotifyApproval { approval_id, .. } => approval_id,
            DispatchMessage::RenewCredentials { agent, .. } => agent,
            DispatchMessage::FireSchedule { schedule_id, .. } => schedule_id,
        }
    }
}

/// The name of the `n`th check of a Run's wait at `step` under `epoch`:
/// the first copy of that check to take it goes on, the other copies are
/// dropped, so a chain of checks stays one chain under at-least-once
/// delivery.
pub fn check_slot(run_id: &str, epoch: u64, step: u32, n: u32) -> String {
    format!("check#{run_id}#{epoch}#{step}#{n}")
}

/// On the harness FIFO queue, grouped by run id so one Run's steps never overlap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HarnessMessage {
    /// Execute step `step` of the Run.
    Step {
        run_id: String,
        tenant: String,
        step: u32,
        /// The Run's epoch when this was sent: a resend for a step whose
        /// worker died after claiming it (a later epoch) is a new message,
        /// not a repeat FIFO deduplication would drop.
        #[serde(default)]
        epoch: u64,
    },
    /// The Run's agent's sandbox was handed to it (its holder let go) at
    /// `handed_at_ms`, while it waited at `step`: the step goes on. Not a
    /// `Step`: the FIFO queue would take it for a repeat of the message
    /// that began the step (the same deduplication id, within SQS's five
    /// minutes) and drop it.
    SandboxHanded {
        run_id: String,
        tenant: String,
        step: u32,
        handed_at_ms: i64,
    },
    /// A child of the Run ended: the parent takes note (in the parent's
    /// FIFO group, so notes never race its steps nor each other, and a
    /// batch of them is one write).
    ChildEnded {
        /// The parent.
        run_id: String,
        tenant: String,
        child_run_id: String,
    },
    /// An approval of one of the Run's calls was decided (approved,
    /// rejected, expired): the Run takes note, in its FIFO group, so the
    /// decision waits for any step in flight to commit and never races it.
    ApprovalDecided {
        run_id: String,
        tenant: String,
        approval_id: String,
    },
    /// What became of a sandbox call dispatched at `step`.
    ToolResult {
        run_id: String,
        tenant: String,
        step: u32,
        call_id: String,
        attempt: u32,
        body: ResultBody,
        /// Proof that the answer comes from the sandbox generation the call
        /// was sent to (or the platform's watchdog speaking for it); the
        /// harness refuses an answer without a valid one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seal: Option<crate::sandbox::seal::Seal>,
    },
}

impl HarnessMessage {
    pub fn run_id(&self) -> &str {
        match self {
            HarnessMessage::Step { run_id, .. }
            | HarnessMessage::SandboxHanded { run_id, .. }
            | HarnessMessage::ChildEnded { run_id, .. }
            | HarnessMessage::ApprovalDecided { run_id, .. }
            | HarnessMessage::ToolResult { run_id, .. } => run_id,
        }
    }

    /// The FIFO deduplication id: one per Run step and epoch (and per hand-over,
    /// child's end, decision and result).
    pub fn dedup_id(&self) -> String {
        match self {
            HarnessMessage::Step {
                run_id,
                step,
                epoch,
                ..
            } => format!("{run_id}-step-{step}-{epoch}"),
            // One per hand-over: the watchdog's resend of a lost one is
            // the same message.
            HarnessMessage::SandboxHanded {
                run_id,
                step,
                handed_at_ms,
                ..
            } => format!("{run_id}-step-{step}-handed-{handed_at_ms}"),
            HarnessMessage::ChildEnded {
                run_id,
                child_run_id,
                ..
            } => format!("{run_id}-child-{child_run_id}"),
            HarnessMessage::ApprovalDecided {
                run_id,
                approval_id,
                ..
            } => format!("{run_id}-approval-{approval_id}"),
            HarnessMessage::ToolResult {
                run_id,
                call_id,
                attempt,
                ..
            } => format!("{run_id}-result-{call_id}-{attempt}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What goes to a tenant's endpoint travels on the delivery queue, and
    /// a callback delivery counts only with the control plane's seal.
    #[test]
    fn deliveries_are_told_apart_and_sealed() {
        let cb = DispatchMessage::deliver_callback("secret", "run_1", "acme");
        assert!(cb.is_delivery());
        assert!(cb.sealed_by_control_plane("secret"));
        assert!(!cb.sealed_by_control_plane("another"));
        let forged = DispatchMessage::DeliverCallback {
            run_id: "run_1".into(),
            tenant: "acme".into(),
            chain: None,
            seal: String::new(),
        };
        assert!(!forged.sealed_by_control_plane("secret"));
        let chat = DispatchMessage::notify_approval("secret", "apv_1", "acme", "chat");
        let mail = DispatchMessage::notify_approval("secret", "apv_1", "acme", "ops@example.com");
        assert!(chat.is_delivery() && !mail.is_delivery());
        let start = DispatchMessage::StartRun {
            run_id: "run_1".into(),
            tenant: "acme".into(),
        };
        assert!(!start.is_delivery());
        // A notice's seal does not pass for a callback's.
        let notice = DispatchMessage::notify_approval("secret", "run_1", "acme", "callback");
        let DispatchMessage::NotifyApproval { seal, .. } = notice else {
            unreachable!()
        };
        let cb = DispatchMessage::DeliverCallback {
            run_id: "run_1".into(),
            tenant: "acme".into(),
            chain: None,
            seal,
        };
        assert!(!cb.sealed_by_control_plane("secret"));
    }
}
