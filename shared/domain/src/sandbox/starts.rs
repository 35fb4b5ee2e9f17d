//! A sandbox's task starts: when its record wants a task, and the name
//! of each start. A starter can die between the provider's answer and its
//! write; the start it retries must be the same start, so the provider
//! (ECS, by its client token) answers with the task it already runs
//! instead of starting a second one for the generation.

use sha2::{Digest, Sha256};

use super::lifecycle::{SandboxRecord, SandboxState};

impl SandboxRecord {
    /// A new task is wanted for the generation: a new start, named apart
    /// from every earlier one.
    pub(super) fn want_task(&mut self) {
        self.task_arn = None;
        self.task_starts += 1;
    }

    /// Whether the generation should have a task and none is recorded:
    /// it is starting or waking, or its agent reported ready from a task
    /// whose start was never recorded (the starter died between the
    /// provider's answer and its write). The holder starts it (again).
    pub fn wants_task(&self) -> bool {
        self.task_arn.is_none()
            && matches!(
                self.state(),
                SandboxState::Provisioning | SandboxState::Waking | SandboxState::Ready
            )
    }

    /// The name of the start the record wants: the same for every try of
    /// one start, so the provider starts its task once however often the
    /// start is retried (a starter killed after the provider answered),
    /// and new for each start the machine decides. 64 hex digits (what ECS
    /// takes as a client token).
    pub fn start_token(&self) -> String {
        let mut h = Sha256::new();
        for part in [
            self.tenant.as_str(),
            self.agent.as_str(),
            self.salt.as_str(),
            &self.generation.to_string(),
            &self.task_starts.to_string(),
        ] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        hex::encode(h.finalize())
    }
}
