//! Going to sleep when idle: frozen by the host, or the workspace saved to
//! the payload bucket and the task stopped; restored when woken.

mod snapshot;

use crate::agent::chown_tree;
use crate::agent::now_ms;
use crate::agent::Agent;
use crate::agent::Exit;
use crate::agent::Hibernation;
use anyhow::Context;
use anyhow::Result;
use armada_domain::machine::Machine;
use armada_domain::sandbox::lifecycle::SandboxEvent;
use armada_domain::sandbox::lifecycle::SandboxState;
use snapshot::{archive_workspace, extract_snapshot};
use std::time::Duration;

impl Agent {
    /// Resident sandboxes stay warm; one serving a dev server stays up.
    pub(super) fn may_hibernate(&self) -> bool {
        self.cfg.hibernate != Hibernation::Never && !self.cfg.resident && self.services.is_empty()
    }

    /// Idle and held by nobody: go to sleep. Frozen by the host, or saved
    /// to S3 with the task stopping (`Some(Exit::Hibernated)`).
    pub(super) async fn hibernate(&self, idle: Duration) -> Result<Option<Exit>> {
        let (now, g) = (now_ms(), self.cfg.generation);
        let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
        let r = self
            .update(|r| {
                let idle = SandboxEvent::Hibernate {
                    generation: g,
                    idle_ms,
                };
                r.apply(idle, now).is_ok()
            })
            .await?;
        if !r.is_some_and(|r| r.state() == SandboxState::Hibernating) {
            return Ok(None);
        }
        tracing::info!(sandbox = %self.cfg.key(), mode = ?self.cfg.hibernate, "idle: hibernating");
        if self.cfg.hibernate != Hibernation::Snapshot {
            return Ok(None);
        }
        let key = self.snapshot().await?;
        let now = now_ms();
        let after = self
            .update(|r| match r.state() {
                SandboxState::Hibernating => {
                    let saved = SandboxEvent::Snapshotted {
                        generation: g,
                        key: key.clone(),
                    };
                    r.apply(saved, now).is_ok()
                }
                // A Run asked for it meanwhile: stay up.
                SandboxState::Waking => r.apply(SandboxEvent::Woke { generation: g }, now).is_ok(),
                _ => false,
            })
            .await?;
        Ok(match after.map(|r| r.state()) {
            Some(SandboxState::Hibernated) => Some(Exit::Hibernated),
            _ => None,
        })
    }

    pub(super) fn snapshot_key(&self) -> String {
        armada_domain::sandbox::access::snapshot_key(
            &self.cfg.tenant,
            &self.cfg.agent,
            self.cfg.generation,
        )
    }

    /// Saves the workspace and home to the payload bucket.
    pub(super) async fn snapshot(&self) -> Result<String> {
        let file = self.cfg.root.join("snapshot.tar.gz");
        let (uid, gid) = (self.runner.env.uid, self.runner.env.gid);
        archive_workspace(&self.cfg.root, &file, uid, gid).await?;
        let key = self.snapshot_key();
        let body = aws_sdk_s3::primitives::ByteStream::from_path(&file)
            .await
            .context("reading the snapshot")?;
        self.aws
            .s3
            .put_object()
            .bucket(&self.cfg.payload_bucket)
            .key(&key)
            .body(body)
            .send()
            .await
            .context("storing the snapshot")?;
        let _ = std::fs::remove_file(&file);
        Ok(key)
    }

    /// Restores a saved workspace and home, owned by this sandbox's uid.
    pub(super) async fn restore(&self, key: &str) -> Result<()> {
        self.runner.env.prepare()?;
        let out = self
            .aws
            .s3
            .get_object()
            .bucket(&self.cfg.payload_bucket)
            .key(key)
            .send()
            .await
            .context("fetching the snapshot")?;
        let bytes = out.body.collect().await?.into_bytes();
        let file = self.cfg.root.join("restore.tar.gz");
        std::fs::write(&file, &bytes)?;
        let (uid, gid) = (self.runner.env.uid, self.runner.env.gid);
        let restored = extract_snapshot(&file, &self.cfg.root, uid, gid).await;
        let _ = std::fs::remove_file(&file);
        restored?;
        // The new task has a uid of its own.
        for d in [self.runner.env.workspace(), self.runner.env.home()] {
            chown_tree(&d, self.cfg.uid)?;
        }
        tracing::info!(sandbox = %self.cfg.key(), key, "workspace restored");
        Ok(())
    }
}
