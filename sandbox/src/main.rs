//! `armada-sandbox`: the program inside every sandbox task.
//!
//! - `armada-sandbox agent`: the task's entrypoint. A supervisor process
//!   runs the agent; if the agent crashes (a panic) it is restarted once,
//!   and a second crash destroys the sandbox (seed 000 §D).
//! - `armada-sandbox exec`: the jail (internal): confines itself as the
//!   spec in `ARMADA_JAIL_SPEC` says, then runs the call.

use std::time::Duration;

use armada_core::aws::AwsClients;
use armada_core::store::sandboxes::{Change, SandboxStore};
use armada_sandbox::agent::{Agent, AgentConfig, Exit};
use armada_sandbox::jail::{self, JailSpec};

/// Set in the environment of the supervised agent process.
const SUPERVISED: &str = "ARMADA_SANDBOX_SUPERVISED";

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    match mode.as_str() {
        // The jail must stay single-threaded: no runtime is started for it.
        "exec" => {
            let spec: JailSpec = match std::env::var(jail::SPEC_ENV)
                .map_err(|e| e.to_string())
                .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
            {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("armada-sandbox exec: bad {}: {e}", jail::SPEC_ENV);
                    std::process::exit(jail::REFUSED);
                }
            };
            std::process::exit(jail::run(&spec));
        }
        "agent" => {
            armada_core::telemetry::init_with("info");
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("armada-sandbox: no runtime: {e}");
                    std::process::exit(1);
                }
            };
            let code = if std::env::var(SUPERVISED).as_deref() == Ok("1") {
                rt.block_on(agent())
            } else {
                rt.block_on(supervise())
            };
            std::process::exit(code);
        }
        other => {
            eprintln!("usage: armada-sandbox agent|exec   (unknown mode '{other}')");
            std::process::exit(2);
        }
    }
}

async fn agent() -> i32 {
    let cfg = match AgentConfig::from_env().await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "bad sandbox configuration");
            return 1;
        }
    };
    let aws = AwsClients::load(None).await;
    let jail_exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "cannot find my own executable");
            return 1;
        }
    };
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
            let _ = tx.send(true);
        }
    });
    let agent = Agent::new(cfg, aws, jail_exe);
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
async fn supervise() -> i32 {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("armada-sandbox: {e}");
            return 1;
        }
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut crashes = 0;
    loop {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("agent").env(SUPERVISED, "1");
        // Spawned from the main thread, which lives as long as we do.
        armada_sandbox::sys::die_with_parent(&mut cmd);
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
                    armada_sandbox::sys::kill(pid as i32, libc::SIGTERM);
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
    let aws = AwsClients::load(None).await;
    let store = SandboxStore::new(aws.dynamo.clone(), &cfg.sandboxes_table);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let generation = cfg.generation;
    let r = store
        .modify(&cfg.tenant, &cfg.agent, |rec| match rec {
            Some(mut r) if r.generation == generation => {
                r.destroy("the sandbox agent crashed twice", now);
                let _ = r.stopped(generation, now);
                Change::Write(Box::new(r), ())
            }
            _ => Change::Keep(()),
        })
        .await;
    if let Err(e) = r {
        tracing::error!(error = %e, "could not record the destruction");
    }
}
