//! The agent's own AWS credentials: handed over by the provider in the
//! task's environment, narrowed to this identity by a session policy, and
//! renewed before they expire (`armada_domain::sandbox::credentials`): the
//! agent sends a request sealed with its answer key to the dispatch queue,
//! and the new credentials arrive on its hand queue between two calls. They
//! are kept in a root-only file too, so an agent restarted by its
//! supervisor (whose environment holds the first ones) signs with the
//! newest.

use std::os::unix::fs::OpenOptionsExt;

use crate::agent::now_ms;
use crate::agent::Agent;
use crate::agent::AgentConfig;
use armada_core::adapters::aws::AwsClients;
use armada_core::adapters::aws::HeldCredentials;
use armada_domain::messages::DispatchMessage;
use armada_domain::sandbox::credentials::{renewal_due, Renewal, TaskCredentials};
use std::path::Path;
use std::path::PathBuf;

/// While no new credentials have come, the request is sent again this often.
const ASK_AGAIN_MS: i64 = 60_000;

fn file(cfg: &AgentConfig) -> PathBuf {
    cfg.root.join("credentials.json")
}

/// The newest credentials this generation was given: the environment's, or
/// the file's when a previous incarnation was sent later ones.
fn newest(cfg: &AgentConfig) -> Option<TaskCredentials> {
    let saved = std::fs::read_to_string(file(cfg))
        .ok()
        .and_then(|t| serde_json::from_str::<TaskCredentials>(&t).ok());
    match (cfg.credentials.clone(), saved) {
        (Some(env), Some(saved)) if saved.expires_at_ms > env.expires_at_ms => Some(saved),
        (env, saved) => env.or(saved),
    }
}

/// The agent's clients: signing with the task's own credentials when it
/// was given some, else from the default chain (no identity role).
pub(crate) async fn clients(cfg: &AgentConfig) -> (AwsClients, Option<HeldCredentials>) {
    match newest(cfg) {
        Some(c) => {
            let held = HeldCredentials::new(c);
            (AwsClients::load_held(held.clone()).await, Some(held))
        }
        None => (AwsClients::load(None).await, None),
    }
}

impl Agent {
    /// When to ask for new credentials first (`None`: never; there are
    /// none of our own to renew).
    pub(super) fn first_renewal_ms(&self) -> Option<i64> {
        let held = self.held.as_ref()?;
        Some(renewal_due(
            now_ms(),
            held.current().expires_at_ms,
            self.cfg.renew_after_ms,
        ))
    }

    /// Asks for new credentials when they are due (and again every minute
    /// until they come).
    pub(super) async fn renew_credentials_if_due(&mut self) {
        let (Some(due), Some(queue)) = (self.next_renewal_ms, self.cfg.dispatch_queue_url.clone())
        else {
            return;
        };
        let now = now_ms();
        if now < due {
            return;
        }
        self.next_renewal_ms = Some(now + ASK_AGAIN_MS);
        let req = Renewal {
            tenant: &self.cfg.tenant,
            agent: &self.cfg.agent,
            generation: self.cfg.generation,
            requested_at_ms: now,
        };
        let msg = DispatchMessage::RenewCredentials {
            tenant: self.cfg.tenant.clone(),
            agent: self.cfg.agent.clone(),
            generation: self.cfg.generation,
            requested_at_ms: now,
            seal: req.seal(&self.cfg.answer_key),
        };
        let body = match serde_json::to_string(&msg) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "could not write the renewal request");
                return;
            }
        };
        match self
            .aws
            .sqs
            .send_message()
            .queue_url(&queue)
            .message_body(body)
            .send()
            .await
        {
            Ok(_) => tracing::info!("asked for new credentials"),
            Err(e) => {
                tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "could not ask for new credentials")
            }
        }
    }

    /// New credentials arrived: every request from now on is signed with
    /// them. Another generation's are ignored.
    pub(super) fn take_credentials(&mut self, generation: u64, c: TaskCredentials) {
        let Some(held) = &self.held else {
            tracing::warn!("credentials sent to an agent that holds none of its own; ignored");
            return;
        };
        if generation != self.cfg.generation {
            tracing::warn!(generation, "credentials of another generation ignored");
            return;
        }
        if c.expires_at_ms <= held.current().expires_at_ms {
            // A duplicate, or older than what we hold.
            return;
        }
        if let Err(e) = save(&file(&self.cfg), &c) {
            tracing::warn!(error = %e, "could not keep the new credentials for a restart");
        }
        tracing::info!(key = %c.access_key_id, expires_at_ms = c.expires_at_ms, "credentials renewed");
        self.next_renewal_ms = Some(renewal_due(
            now_ms(),
            c.expires_at_ms,
            self.cfg.renew_after_ms,
        ));
        held.replace(c);
    }
}

/// Written readable by root only (a call's uid never reads it).
fn save(path: &Path, c: &TaskCredentials) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    std::io::Write::write_all(&mut f, serde_json::to_string(c)?.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(tmp, path)
}
