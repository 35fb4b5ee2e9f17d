//! Sandbox figures: cold start, warm reuse, wake from hibernation, and the
//! per-call cost of confinement.

use crate::bench::pct;
use crate::bench::sorted;
use crate::client::Client;
use crate::local::LocalStack;
use anyhow::anyhow;
use anyhow::Result;
use armada_domain::run::EventKind;
use armada_domain::run::RunState;
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;

/// A sandbox call's own time in a Run: from the harness dispatching it to
/// the harness recording its result (the model's turns are not in it).
async fn call_interval_ms(stack: &LocalStack, run_id: &str) -> Result<f64> {
    let events = stack.svc.run_events.all_events(run_id).await?;
    let at = |kind: EventKind| {
        events
            .iter()
            .find(|e| e.kind() == kind)
            .map(|e| e.at_ms)
            .ok_or_else(|| anyhow!("run {run_id} has no {kind} event"))
    };
    Ok((at(EventKind::ToolResult)? - at(EventKind::ToolDispatched)?) as f64)
}

async fn put_bench_agent(stack: &LocalStack, name: &str, idle_s: u32) -> Result<()> {
    let admin = Client::new(
        &stack.api_url,
        &stack.admin_key,
        Some(stack.admin_key.clone()),
    );
    admin
        .call(
            reqwest::Method::PUT,
            &format!("/v1/agents/{name}"),
            Some(&json!({
                "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
                "system_prompt": "bench",
                "skills": ["shell_exec"],
                "sandbox": {"idle_hibernate_s": idle_s},
                "limits": {"timeout_s": 300}
            })),
            true,
        )
        .await?;
    Ok(())
}

/// Sandbox cold start (a new agent identity's first call), warm reuse (its
/// next call), and wake from hibernation, each as the call's own time and
/// as the whole Run.
pub(super) async fn sandboxes(stack: &LocalStack, client: &Client, n: usize) -> Result<()> {
    let call = r#"/tool shell_exec {"command": "true"}"#;
    let (mut cold, mut warm, mut wake) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cold_run, mut warm_run, mut wake_run) = (Vec::new(), Vec::new(), Vec::new());
    // A Run of `agent` that makes the call: its id and its latency.
    let timed = |agent: String| async move {
        let t0 = Instant::now();
        let id = client.create_run(&agent, call).await?;
        let run = client.wait_run(&id, Duration::from_secs(300)).await?;
        if run.state.outcome() != RunState::Completed {
            return Err(anyhow!("run {id} ended {}: {:?}", run.state, run.error));
        }
        Ok::<_, anyhow::Error>((id, t0.elapsed().as_secs_f64() * 1000.0))
    };
    for i in 0..n {
        let agent = format!("bench-sb-{i}");
        put_bench_agent(stack, &agent, 2).await?;
        let (id, ms) = timed(agent.clone()).await?;
        cold.push(call_interval_ms(stack, &id).await?);
        cold_run.push(ms);
        let (id, ms) = timed(agent.clone()).await?;
        warm.push(call_interval_ms(stack, &id).await?);
        warm_run.push(ms);
        // Idle for 2 s: the sandbox hibernates (its processes are frozen).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let sb = client.get(&format!("/v1/sandboxes/{agent}")).await?;
            if sb["state"] == "HIBERNATED" {
                break;
            }
            if Instant::now() > deadline {
                return Err(anyhow!("sandbox {agent} did not hibernate"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (id, ms) = timed(agent.clone()).await?;
        wake.push(call_interval_ms(stack, &id).await?);
        wake_run.push(ms);
    }
    let (cold, warm, wake) = (sorted(cold), sorted(warm), sorted(wake));
    let (cold_run, warm_run, wake_run) = (sorted(cold_run), sorted(warm_run), sorted(wake_run));
    println!(
        "\nSandboxes ({n} agents; a `true` call; call = harness dispatch to result, run = POST to answer):"
    );
    for (name, c, r) in [
        ("cold start (new sandbox)", &cold, &cold_run),
        ("warm reuse", &warm, &warm_run),
        ("wake from hibernation", &wake, &wake_run),
    ] {
        println!(
            "  {name:<26} call p50 {:>7.1} ms  p95 {:>7.1} ms   run p50 {:>7.1} ms",
            pct(c, 0.5),
            pct(c, 0.95),
            pct(r, 0.5)
        );
    }
    println!(
        "  warm reuse / cold start: call {:.1}%  run {:.1}%",
        100.0 * pct(&warm, 0.5) / pct(&cold, 0.5),
        100.0 * pct(&warm_run, 0.5) / pct(&cold_run, 0.5)
    );
    Ok(())
}

/// The per-call cost of confinement: `true` spawned directly, through the
/// jail with nothing applied (profile off, no cgroup), and fully confined
/// (workspace profile: cgroup, namespaces, Landlock, uid, seccomp).
pub(super) async fn confinement_overhead(stack: &LocalStack, n: usize) -> Result<()> {
    use armada_domain::sandbox::{Limits, Profiles};
    use armada_sandbox::call::Call;
    use armada_sandbox::cgroup::Cgroup;
    use armada_sandbox::env::SandboxEnv;
    use armada_sandbox::jail::Action;
    use armada_sandbox::runner::Runner;
    let jail = crate::local::dataplane::sandbox_program()?;
    let root = PathBuf::from("/var/tmp/armada")
        .join(stack.template.stack())
        .join("bench-jail");
    let profiles = Profiles::default();
    let group = Cgroup::current()
        .and_then(|c| c.child(&format!("armada-bench-{}", std::process::id())))
        .ok();
    if let Some(g) = &group {
        g.set_memory_limit(512 * 1024 * 1024)?;
        g.set_pids_max(256)?;
    }
    let env = |profile: &str, cgroup: Option<Cgroup>, dir: &str| -> Result<SandboxEnv> {
        let e = SandboxEnv {
            root: root.join(dir),
            uid: 299_999,
            gid: 299_999,
            caps: profiles.resolve(profile)?,
            limits: Limits::default(),
            egress_ports: vec![443],
            egress_allow: vec![],
            data_root: root.join("data"),
            cgroup,
            mounts: vec![],
        };
        e.prepare()?;
        Ok(e)
    };
    let bare = Runner::new(env("off", None, "off")?, jail.clone());
    let full = Runner::new(env("workspace", group.clone(), "full")?, jail);
    let call = || Call {
        action: Action::Exec {
            argv: vec!["/bin/true".into()],
        },
        run_id: "bench".into(),
        stdin: None,
        timeout: Duration::from_secs(10),
        bind_ports: vec![],
        env: vec![],
        effects: None,
    };
    let (mut direct, mut off, mut confined) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        tokio::process::Command::new("/bin/true").status().await?;
        direct.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        bare.run(call()).await?;
        off.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        let r = full.run(call()).await?;
        confined.push(t.elapsed().as_secs_f64() * 1000.0);
        if let Some(why) = r.refused() {
            return Err(anyhow!("the confined call was refused: {why}"));
        }
    }
    let (direct, off, confined) = (sorted(direct), sorted(off), sorted(confined));
    println!("\nConfinement, per call of `true` ({n} each, p50 / p95):");
    println!(
        "  spawned directly          {:>6.2} / {:>6.2} ms",
        pct(&direct, 0.5),
        pct(&direct, 0.95)
    );
    println!(
        "  through the jail, nothing {:>6.2} / {:>6.2} ms",
        pct(&off, 0.5),
        pct(&off, 0.95)
    );
    println!(
        "  fully confined            {:>6.2} / {:>6.2} ms",
        pct(&confined, 0.5),
        pct(&confined, 0.95)
    );
    println!(
        "  confinement adds {:.2} ms per call over a direct spawn ({:.2} ms over the bare jail)",
        pct(&confined, 0.5) - pct(&direct, 0.5),
        pct(&confined, 0.5) - pct(&off, 0.5)
    );
    if let Some(g) = group {
        let _ = g.destroy();
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}
