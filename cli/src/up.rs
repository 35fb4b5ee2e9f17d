//! `armada up` and `armada down`: the local stack in the foreground (until
//! Ctrl-C or `down`), or detached (returning once it is healthy, echoing its
//! progress while it installs the emulator), and stopped by pid.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::client::Client;
use crate::local::dataplane::DataPlaneMode;
use crate::local::{emulator, process, LocalOptions, LocalStack};

/// How long a stopping emulator may take to write its snapshot (a killed
/// one loses nothing either: its journal is replayed at the next start).
const EMULATOR_GRACE: Duration = Duration::from_secs(60);

/// What `armada up` was asked for.
#[derive(Debug, Clone, Default)]
pub struct UpArgs {
    pub demo: bool,
    pub port: u16,
    /// Private targets tenants' outbound requests may reach
    /// (`--allow-egress HOST:PORT`, repeatable).
    pub allow_egress: Vec<String>,
    /// How sandbox tasks run (`--dataplane local|fargate`).
    pub dataplane: DataPlaneMode,
}

/// The template parameter `EgressAllow` for the listed targets, each one
/// checked (`host:port` or `host:*`).
fn egress_parameter(allow: &[String]) -> Result<String> {
    for a in allow {
        if armada_domain::egress::HostPort::parse(a, true).is_none() {
            bail!("--allow-egress {a}: expected HOST:PORT (or HOST:*)");
        }
    }
    Ok(allow.join(","))
}

pub async fn foreground(root: &Path, args: &UpArgs) -> Result<()> {
    let (demo, port) = (args.demo, args.port);
    let state = emulator::ensure_state_dir(root)?;
    let mut opts = LocalOptions::new(root);
    opts.api_port = port;
    opts.parameters
        .insert("EgressAllow".into(), egress_parameter(&args.allow_egress)?);
    opts.emulator_pid_file = Some(state.join("moto.pid"));
    opts.emulator_state = Some(emulator::durable_state(root));
    opts.dataplane = args.dataplane;
    eprintln!("armada: starting the emulator, the stack's resources and its functions ...");
    let stack = LocalStack::start(opts).await?;
    process::write_pid(&state.join("armada.pid"), std::process::id())?;
    // It holds the admin and tenant keys: readable by its owner only.
    process::write_private(&state.join("local.env"), &stack.env_file())?;
    println!("Armada local stack is up.");
    println!("  API       {}", stack.api_url);
    println!("  emulator  {}", stack.endpoint);
    println!("  model     {} (scripted)", stack.model_url);
    println!("  env       {}", state.join("local.env").display());
    if demo {
        if let Err(e) = run_demo(&stack).await {
            eprintln!("demo failed: {e:#}");
        }
    }
    println!("Ctrl-C (or `armada down`) stops it.");
    wait_for_signal().await;
    let pid = stack.emulator_pid();
    stack.stop().await;
    if let Some(pid) = pid {
        // It writes a snapshot of its state as it stops.
        process::stop(pid, EMULATOR_GRACE);
        let _ = std::fs::remove_file(state.join("moto.pid"));
    }
    let _ = std::fs::remove_file(state.join("armada.pid"));
    let _ = std::fs::remove_file(state.join("local.env"));
    Ok(())
}

async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

async fn run_demo(stack: &LocalStack) -> Result<()> {
    let c = Client::new(
        &stack.api_url,
        &stack.tenant_key,
        Some(stack.admin_key.clone()),
    );
    crate::demo::run(&c, stack.mail_outbox.as_deref(), &stack.smtp_addr).await
}

pub async fn detached(root: &Path, args: &UpArgs) -> Result<()> {
    let (demo, port) = (args.demo, args.port);
    egress_parameter(&args.allow_egress)?;
    let state = emulator::ensure_state_dir(root)?;
    let env_path = state.join("local.env");
    let _ = std::fs::remove_file(&env_path);
    let exe = std::env::current_exe()?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.join("armada.log"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("up").arg("--port").arg(port.to_string());
    if demo {
        cmd.arg("--demo");
    }
    for a in &args.allow_egress {
        cmd.arg("--allow-egress").arg(a);
    }
    if args.dataplane == DataPlaneMode::Fargate {
        cmd.arg("--dataplane").arg("fargate");
    }
    cmd.current_dir(root)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    process::detach(&mut cmd, false);
    let mut child = cmd
        .spawn()
        .context("starting the stack in the background")?;
    // Installing the emulator can take a while on a first run: the wait
    // lasts while the stack keeps writing to its log (its progress is
    // echoed here), and gives up only after 120 s of silence.
    let log_path = state.join("armada.log");
    let mut seen = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
    let mut deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let len = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
        if len > seen {
            echo_progress(&log_path, seen);
            seen = len;
            deadline = std::time::Instant::now() + Duration::from_secs(120);
        }
        if let Some(status) = child.try_wait()? {
            bail!(
                "the stack exited ({status}); see {}",
                state.join("armada.log").display()
            );
        }
        if env_path.exists() {
            let c = Client::from_env(Some(root))?;
            if c.get("/v1/health").await.is_ok() {
                println!("Armada local stack is up (pid {}).", child.id());
                println!("  env  {}", env_path.display());
                println!("  logs {}", state.join("armada.log").display());
                return Ok(());
            }
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "the stack wrote nothing for 120 s and is not healthy; see {}",
                state.join("armada.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Prints the stack's own progress lines (`armada: ...`) written to its
/// log after byte `from`.
fn echo_progress(log: &Path, from: u64) {
    use std::io::{Read, Seek, SeekFrom};
    let mut text = String::new();
    let read = std::fs::File::open(log).and_then(|mut f| {
        f.seek(SeekFrom::Start(from))?;
        f.read_to_string(&mut text)
    });
    if read.is_ok() {
        for line in text.lines().filter(|l| l.starts_with("armada:")) {
            println!("{line}");
        }
    }
}

/// Stops the stack; with `wipe`, also removes what its emulator kept, so
/// the next `up` starts afresh.
pub fn down(root: &Path, wipe: bool) -> Result<()> {
    let state = emulator::state_dir(root);
    let mut stopped = false;
    for name in ["armada.pid", "moto.pid"] {
        let path = state.join(name);
        if let Some(pid) = process::read_pid(&path) {
            // Gone before this returns: an `up` right after must not
            // find a stopping emulator still answering.
            if process::alive(pid) {
                if !process::stop(pid, EMULATOR_GRACE) {
                    bail!("{name} (pid {pid}) did not stop");
                }
                println!("stopped {name} (pid {pid})");
                stopped = true;
            }
            let _ = std::fs::remove_file(&path);
        }
    }
    let _ = std::fs::remove_file(state.join("local.env"));
    if !stopped {
        println!("nothing was running");
    }
    if wipe {
        let kept = emulator::durable_state(root);
        match std::fs::remove_dir_all(&kept) {
            Ok(()) => println!("removed {}", kept.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", kept.display())),
        }
    }
    Ok(())
}
