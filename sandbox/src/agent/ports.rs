//! Pooled host ports for `serve` calls: granted with a conditional write
//! (queueing while the pool is full), released when the server stops.

use crate::agent::Agent;
use crate::agent::PortMode;
use crate::skills;
use crate::skills::Aftermath;
use crate::skills::PortGrant;
use anyhow::Result;
use armada_core::Sandboxes;
use armada_domain::sandbox::hand::codes;
use armada_domain::sandbox::hand::Invocation;
use armada_domain::sandbox::host_port;
use armada_domain::sandbox::CONTAINER_PORTS;
use serde_json::Value;
use std::time::Duration;
use std::time::Instant;

/// Where a pooled host port is probed: loopback, where the server on it is
/// reached (its URL names the public host, loopback unless configured).
/// The probe never listens on every interface, not even for a moment.
const PROBE_HOST: std::net::Ipv4Addr = std::net::Ipv4Addr::LOCALHOST;

/// Whether a host port is free here: nothing listens on it on loopback
/// or on every address (either makes binding it on loopback fail).
fn host_port_free(port: u16) -> bool {
    std::net::TcpListener::bind((PROBE_HOST, port)).is_ok()
}

impl Agent {
    /// Grants a pooled port (waiting while the pool is full: the call
    /// queues), then starts the server on it.
    pub(super) async fn serve_call(&mut self, inv: &Invocation) -> crate::skills::SkillAnswer {
        let wanted = match inv.args.get("port") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().and_then(|p| u16::try_from(p).ok()) {
                Some(p) if CONTAINER_PORTS.contains(&p) => Some(p),
                _ => {
                    return crate::skills::SkillAnswer {
                        result: armada_domain::sandbox::hand::error_json(
                            codes::INVALID_ARGS,
                            "'port' must be a container port from 8081 to 8090",
                        ),
                        aftermath: Aftermath::Keep,
                    }
                }
            },
        };
        let grant = match self.grant_port(wanted, inv.timeout_s).await {
            Ok(g) => g,
            Err(e) => {
                return crate::skills::SkillAnswer {
                    result: e,
                    aftermath: Aftermath::Keep,
                }
            }
        };
        match skills::serve(&self.runner, &inv.args, &inv.run_id, &grant, inv.timeout_s).await {
            Ok((answer, detached)) => {
                self.services.push(detached);
                answer
            }
            Err(answer) => {
                self.release_port(grant.container).await;
                answer
            }
        }
    }

    pub(super) fn pool(&self) -> String {
        match &self.cfg.ports {
            PortMode::Host { pool, .. } => pool.clone(),
            PortMode::Container { .. } => self.cfg.task_arn.clone(),
        }
    }

    pub(super) async fn grant_port(
        &mut self,
        wanted: Option<u16>,
        timeout_s: u32,
    ) -> Result<PortGrant, Value> {
        if let Some(p) = wanted.and_then(|w| self.ports.get(&w)) {
            // Ours already: a server on it is replaced.
            return Ok(p.clone());
        }
        let deadline = Instant::now() + Duration::from_secs(u64::from(timeout_s));
        // Ports are held by the task, so its host can free them when it stops.
        let holder = self.cfg.task_arn.clone();
        let pool = self.pool();
        loop {
            let candidates: Vec<u16> = match wanted {
                Some(w) => vec![w],
                None => CONTAINER_PORTS
                    .clone()
                    .filter(|p| !self.ports.contains_key(p))
                    .collect(),
            };
            for c in candidates {
                let (bind, url) = match &self.cfg.ports {
                    PortMode::Host { public_host, .. } => {
                        let h = host_port(c).unwrap_or(c);
                        // A shared host: a port something else listens on
                        // is not in the pool, whatever the registry says.
                        if !host_port_free(h) {
                            continue;
                        }
                        (h, format!("http://{public_host}:{h}"))
                    }
                    PortMode::Container { public_host } => (c, format!("http://{public_host}:{c}")),
                };
                let taken = match &self.cfg.ports {
                    // The task's own address (and its credentials reach no
                    // registry entry but its own record): nobody to race.
                    PortMode::Container { .. } => Ok(true),
                    PortMode::Host { .. } => {
                        self.store
                            .take_port(&pool, bind, &holder, self.cfg.generation)
                            .await
                    }
                };
                match taken {
                    Ok(true) => {
                        let g = PortGrant {
                            container: c,
                            bind,
                            url,
                        };
                        self.ports.insert(c, g.clone());
                        return Ok(g);
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!(error = %e, "port registry unavailable"),
                }
            }
            if Instant::now() >= deadline {
                return Err(armada_domain::sandbox::hand::error_json(
                    "PORTS_EXHAUSTED",
                    format!("no pooled port became free within {timeout_s} s"),
                ));
            }
            // The pool is full: the call waits its turn (seed 000 §D).
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    pub(super) async fn release_port(&mut self, container: u16) {
        let Some(g) = self.ports.remove(&container) else {
            return;
        };
        if matches!(self.cfg.ports, PortMode::Host { .. }) {
            let _ = self
                .store
                .release_port(&self.pool(), g.bind, &self.cfg.task_arn)
                .await;
        }
    }

    pub(super) fn shutdown_services(&mut self) {
        self.stop_all_mcp();
        for s in self.services.drain(..) {
            if let Some(cg) = s.cgroup {
                let _ = cg.destroy();
            }
        }
    }

    /// Gives back what the sandbox holds outside itself (ports).
    pub async fn release_all(&mut self) {
        self.shutdown_services();
        let held: Vec<u16> = self.ports.keys().copied().collect();
        for c in held {
            self.release_port(c).await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::net::{Ipv4Addr, TcpListener};

    /// A port nothing listens on (for now).
    fn unused() -> u16 {
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn host_ports_are_probed_on_loopback_only() {
        assert!(PROBE_HOST.is_loopback());
        // Taken on loopback, or on every address: not free.
        let p = unused();
        let held = TcpListener::bind((Ipv4Addr::LOCALHOST, p)).unwrap();
        assert!(!host_port_free(p));
        drop(held);
        let p = unused();
        let held = TcpListener::bind((Ipv4Addr::UNSPECIFIED, p)).unwrap();
        assert!(!host_port_free(p));
        drop(held);
        // A listener on another address of the port does not collide with
        // the probe: the probe binds loopback, not the wildcard (which
        // would collide with a listener on any address).
        let p = unused();
        let other = TcpListener::bind((Ipv4Addr::new(127, 0, 0, 2), p)).unwrap();
        assert!(host_port_free(p), "the probe claimed more than 127.0.0.1");
        drop(other);
        assert!(host_port_free(unused()));
    }
}
