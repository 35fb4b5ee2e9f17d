//! The sandbox program's two modes, shared by the `armada-sandbox` binary
//! (the Fargate image's entrypoint) and `armada sandbox` (the local data
//! plane's, so one build serves the whole local stack).
//!
//! - `agent`: the task's entrypoint. A supervisor process runs the agent;
//!   if the agent crashes (a panic) it is restarted once, and a second
//!   crash destroys the sandbox (seed 000 §D).
//! - `exec`: the jail (internal): confines itself as the spec in
//!   `ARMADA_JAIL_SPEC` says, then runs the call.
//! - `task`: the local data plane's Fargate-like task around `agent`
//!   ([`crate::fargate`]).

use std::time::Duration;

use armada_core::adapters::dynamo::sandboxes::{Change, SandboxStore};
use armada_core::ports::SandboxReports as _;
use armada_domain::machine::Machine;
use armada_domain::sandbox::lifecycle::SandboxEvent;

use crate::agent::{Agent, AgentConfig, Exit};
use crate::jail::{self, JailSpec};
use crate::program::Program;

/// Set in the environment of the supervised agent process.
const SUPERVISED: &str = "ARMADA_SANDBOX_SUPERVISED";

/// Runs the program in `mode`; the exit code. Call it before any async
/// runtime exists: the jail (`exec`) must stay single-threaded.
pub fn main(program: Program, mode: &str) -> i32 {
    match mode {
        // The jail must stay single-threaded: no runtime is started for it.
        "exec" => {
            let spec: JailSpec = match std::env::var(jail::SPEC_ENV)
                .map_err(|e| e.to_string())
                .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
            {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("armada-sandbox exec: bad {}: {e}", jail::SPEC_ENV);
                    return jail::REFUSED;
                }
            };
            jail::run(&spec)
        }
        // A task as Fargate would run it, around the agent (the local data
        // plane's fargate mode).
        "task" => crate::fargate::launch(&program),
        "agent" => {
            armada_core::telemetry::init_with("info");
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("armada-sandbox: no runtime: {e}");
                    return 1;
                }
            };
            if std::env::var(SUPERVISED).as_deref() == Ok("1") {
                rt.block_on(agent(program))
            } else {
                rt.block_on(supervise(program))
            }
        }
        other => {
            eprintln!("usage: armada-sandbox agent|exec|task   (unknown mode '{other}')");
            2
        }
    }
}

async fn agent(program: Program) -> i32 {
    let cfg = match AgentConfig::from_env().await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "bad sandbox configuration");
            return 1;
        }
    };
    let (aws, held) = Agent::clients(&cfg).await;
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
            let _ = tx.send(true);
        }
    });
    let agent = Agent::new(cfg, aws, held, program);
    match agent.run(rx).await {
        Ok(Exit::Stopped) => 0,
        Ok(Exit::Hibernated) => {
            tracing::info!("sandbox hibernated to a snapshot; the task stops");
            0
        }
        Ok(Exit::Destroyed(why)) => {
            tracing::warn!(%why, "sandbox destroyed; the task stops");
            0
        }
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "sandbox agent failed");
            1
        }
    }
}

/// Runs the agent; restarts it once after a crash, then destroys the sandbox.
async fn supervise(program: Program) -> i32 {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut crashes = 0;
    loop {
        let mut cmd = program.command("agent");
        cmd.env(SUPERVISED, "1");
        // Spawned from the main thread, which lives as long as we do.
        crate::sys::die_with_parent(&mut cmd);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the agent");
                return 1;
            }
        };
        let status = tokio::select! {
            s = child.wait() => s,
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {
                if let Some(pid) = child.id() {
                    crate::sys::kill(pid as i32, libc::SIGTERM);
                }
                let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
                return 0;
            }
        };
        match status {
            Ok(s) if s.success() => return 0,
            other => {
                crashes += 1;
                tracing::error!(status = ?other, crashes, "the sandbox agent crashed");
                if crashes >= 2 {
                    destroy_after_crashes().await;
                    return 1;
                }
                tracing::warn!("restarting the sandbox agent once");
            }
        }
    }
}

async fn destroy_after_crashes() {
    let Ok(cfg) = AgentConfig::from_env().await else {
        return;
    };
    let (aws, _) = Agent::clients(&cfg).await;
    let store = SandboxStore::new(aws.dynamo.clone(), &cfg.sandboxes_table);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let generation = cfg.generation;
    let r = store
        .modify_report(&cfg.tenant, &cfg.agent, |rec| match rec {
            Some(mut r) if r.generation == generation => {
                let why = "the sandbox agent crashed twice".to_string();
                let _ = r.apply(SandboxEvent::Destroy { why }, now);
                let _ = r.apply(SandboxEvent::Stopped { generation }, now);
                Change::Write(Box::new(r), ())
            }
            _ => Change::Keep(()),
        })
        .await;
    if let Err(e) = r {
        tracing::error!(error = %e, "could not record the destruction");
    }
}
