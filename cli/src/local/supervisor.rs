//! Keeps the local stack connected to its emulator. The supervisor notices
//! when the emulator stops answering (or the runs table is gone), restarts
//! the emulator if this stack started it, and makes sure of the template's
//! resources, the default agents and the stack's tenant key. An emulator
//! with a state directory comes back with everything it acknowledged, and
//! the Runs in flight go on; one without comes back empty, and they are
//! gone with it. The pollers and handlers simply retry meanwhile.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use armada_core::adapters::aws::AwsClients;
use armada_core::adapters::dynamo::registry::{Registry, StoredKey};
use armada_core::ports::Registry as _;

use super::template::Template;
use super::{emulator, process, provision};

pub struct Supervisor {
    /// Its own clients, so its checks stay out of the benchmark's call counts.
    pub aws: AwsClients,
    pub endpoint: String,
    pub template: Template,
    pub root: PathBuf,
    pub registry_table: String,
    pub runs_table: String,
    pub tenant_key: StoredKey,
    /// The emulator this stack owns: how it starts, and its current pid
    /// (0 = none).
    pub owned: Option<(emulator::Spawn, Arc<AtomicU32>)>,
    pub pid_file: Option<PathBuf>,
}

impl Supervisor {
    async fn resources_present(&self) -> bool {
        self.aws
            .dynamo
            .describe_table()
            .table_name(&self.runs_table)
            .send()
            .await
            .is_ok()
    }

    async fn restore(&self) -> anyhow::Result<()> {
        emulator::keep_tasks_running(&self.endpoint).await;
        provision::provision(&self.aws, &self.template).await?;
        let registry = Registry::new(self.aws.dynamo.clone(), &self.registry_table);
        provision::load_agents(&registry, &self.root).await?;
        provision::load_teams(&registry, &self.root).await?;
        match registry.put_key(&self.tenant_key, 0).await {
            Ok(()) | Err(armada_core::error::StoreError::Conflict { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut lost = false;
        let mut misses = 0;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {},
                _ = shutdown.changed() => return,
            }
            if !emulator::answers(&self.endpoint).await {
                // A busy emulator can miss one check; three in a row is down.
                misses += 1;
                if misses < 3 {
                    continue;
                }
                if !lost {
                    tracing::warn!(endpoint = %self.endpoint, "the emulator stopped answering");
                    lost = true;
                }
                if let Some((how, pid)) = &self.owned {
                    let current = pid.load(Ordering::Relaxed);
                    if current == 0 || !process::alive(current) {
                        match emulator::spawn(&self.root, how) {
                            Ok(new) => {
                                pid.store(new, Ordering::Relaxed);
                                if let Some(f) = &self.pid_file {
                                    let _ = process::write_pid(f, new);
                                }
                                tracing::warn!(pid = new, "restarted the emulator");
                                let _ = emulator::wait_until_up(
                                    &self.endpoint,
                                    Duration::from_secs(30),
                                )
                                .await;
                            }
                            Err(e) => tracing::error!(error = %e, "could not restart the emulator"),
                        }
                    }
                }
                continue;
            }
            misses = 0;
            if lost || !self.resources_present().await {
                match self.restore().await {
                    Ok(()) => {
                        tracing::warn!(
                            "the emulator is back; the template's resources were re-created"
                        );
                        lost = false;
                    }
                    Err(e) => tracing::warn!(error = %e, "re-creating resources failed; retrying"),
                }
            }
        }
    }
}
