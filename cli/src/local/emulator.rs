//! The AWS API emulator: the moto server, installed on first use into a
//! project-local venv (`.armada/venv`, pinned version) and started on
//! loopback through our own entry point (`armada_moto.py`, which gives
//! moto's `TransactWriteItems` a rollback that copies only the items it
//! touches). Given a state directory, it keeps what it acknowledged there
//! across restarts and crashes (`moto_state.py`: a journal written before
//! each answer, and snapshots). An `AWS_ENDPOINT_URL` that points elsewhere
//! (a LocalStack, say) is used as it is instead.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The emulator version the project is tested with.
pub const MOTO_VERSION: &str = "5.2.5";

pub fn state_dir(root: &Path) -> PathBuf {
    root.join(".armada")
}

/// Makes the stack's state directory, its owner's alone (0700): it holds
/// keys, the emulator's state and approval links.
pub fn ensure_state_dir(root: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = state_dir(root);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

fn moto_bin(root: &Path) -> PathBuf {
    state_dir(root).join("venv/bin/moto_server")
}

/// The moto server with the project's patches (see the scripts), and the
/// module that keeps its state.
const SCRIPTS: [(&str, &str); 2] = [
    ("armada_moto.py", include_str!("armada_moto.py")),
    ("moto_state.py", include_str!("moto_state.py")),
];

/// Writes the scripts beside the venv (atomically: parallel test binaries
/// start emulators at once) and returns the entry point's path.
fn write_entry_point(root: &Path) -> Result<PathBuf> {
    for (name, text) in SCRIPTS {
        let path = state_dir(root).join(name);
        if std::fs::read_to_string(&path).is_ok_and(|s| s == text) {
            continue;
        }
        // Unique to this call: two threads of one process (the tests of
        // one binary, each starting an emulator) would otherwise rename
        // one temporary file twice, and the second rename fail.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = state_dir(root).join(format!("{name}.{}.{n}", std::process::id()));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(state_dir(root).join(SCRIPTS[0].0))
}

/// Installs moto into `.armada/venv` unless the pinned version is there.
/// A lock file keeps concurrent installers (parallel test binaries) apart.
pub fn install(root: &Path) -> Result<PathBuf> {
    let dir = ensure_state_dir(root)?;
    let marker = dir.join(format!("venv/.moto-{MOTO_VERSION}"));
    let bin = moto_bin(root);
    if marker.exists() && bin.exists() {
        return Ok(bin);
    }
    let lock = dir.join("install.lock");
    let _guard = crate::local::process::FileLock::acquire(&lock)?;
    if marker.exists() && bin.exists() {
        return Ok(bin);
    }
    eprintln!(
        "armada: installing the AWS emulator (moto[server]=={MOTO_VERSION}) into .armada/venv ..."
    );
    let venv = dir.join("venv");
    let python = std::env::var("ARMADA_PYTHON").unwrap_or_else(|_| "python3".into());
    let status = Command::new(&python)
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .with_context(|| format!("running {python} -m venv"))?;
    if !status.success() {
        bail!("{python} -m venv failed; install python3-venv");
    }
    pip_install(&venv, &format!("moto[server]=={MOTO_VERSION}"))?;
    std::fs::write(&marker, MOTO_VERSION)?;
    Ok(bin)
}

fn pip_install(venv: &Path, spec: &str) -> Result<()> {
    let status = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", spec])
        .status()
        .context("running pip")?;
    if !status.success() {
        bail!("pip install {spec} failed");
    }
    Ok(())
}

/// The pinned cfn-lint the tests lint the template with.
pub const CFN_LINT_VERSION: &str = "1.58.0";

/// Installs a pinned PyPI tool into the project venv (created with the
/// emulator) and returns the path of its executable.
pub fn install_tool(root: &Path, package: &str, version: &str, exe: &str) -> Result<PathBuf> {
    install(root)?;
    let dir = state_dir(root);
    let marker = dir.join(format!("venv/.{package}-{version}"));
    let bin = dir.join("venv/bin").join(exe);
    if marker.exists() && bin.exists() {
        return Ok(bin);
    }
    let _guard = crate::local::process::FileLock::acquire(&dir.join("install.lock"))?;
    if !(marker.exists() && bin.exists()) {
        pip_install(&dir.join("venv"), &format!("{package}=={version}"))?;
        std::fs::write(&marker, version)?;
    }
    Ok(bin)
}

/// Installs a pinned PyPI tool into a venv of its own
/// (`.armada/tools/<package>-<version>`), away from the emulator's, whose
/// pinned dependencies it might otherwise move; `requirements` pins the
/// tool's own dependencies too (a `pip freeze` of a clean install).
/// Returns the path of its executable.
pub fn install_isolated_tool(
    root: &Path,
    package: &str,
    version: &str,
    requirements: &str,
    exe: &str,
) -> Result<PathBuf> {
    let dir = ensure_state_dir(root)?.join("tools");
    std::fs::create_dir_all(&dir)?;
    let venv = dir.join(format!("{package}-{version}"));
    let marker = venv.join(".installed");
    let bin = venv.join("bin").join(exe);
    if marker.exists() && bin.exists() {
        return Ok(bin);
    }
    let _guard = crate::local::process::FileLock::acquire(&dir.join("install.lock"))?;
    if marker.exists() && bin.exists() {
        return Ok(bin);
    }
    eprintln!(
        "armada: installing {package}=={version} into {}",
        venv.display()
    );
    let python = std::env::var("ARMADA_PYTHON").unwrap_or_else(|_| "python3".into());
    let status = Command::new(&python)
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .status()
        .with_context(|| format!("running {python} -m venv"))?;
    if !status.success() {
        bail!("{python} -m venv failed; install python3-venv");
    }
    let pins = venv.join("requirements.txt");
    std::fs::write(&pins, requirements)?;
    let status = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
        .arg(&pins)
        .status()
        .context("running pip")?;
    if !status.success() {
        bail!("pip install -r {} failed", pins.display());
    }
    std::fs::write(&marker, version)?;
    Ok(bin)
}

/// Installs pinned npm packages into a folder of their own
/// (`.armada/tools/npm-<name>`), with the machine's Node.js and npm, and
/// returns the folder (scripts placed there resolve its `node_modules`).
/// `packages` are exact `name@version` pins; `--ignore-scripts`: nothing
/// a package brings runs at install time.
pub fn install_npm_tool(root: &Path, name: &str, packages: &[&str]) -> Result<PathBuf> {
    let dir = ensure_state_dir(root)?.join("tools");
    std::fs::create_dir_all(&dir)?;
    let folder = dir.join(format!("npm-{name}"));
    let pins = packages.join(" ");
    let marker = folder.join(".installed");
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == pins) {
        return Ok(folder);
    }
    let _guard = crate::local::process::FileLock::acquire(&dir.join("install.lock"))?;
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == pins) {
        return Ok(folder);
    }
    eprintln!("armada: installing {pins} into {}", folder.display());
    std::fs::create_dir_all(&folder)?;
    std::fs::write(
        folder.join("package.json"),
        format!("{{\"name\": \"armada-{name}\", \"private\": true}}\n"),
    )?;
    let status = Command::new("npm")
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",
            "--save-exact",
            "--loglevel=error",
        ])
        .args(packages)
        .current_dir(&folder)
        .status()
        .context("running npm (install Node.js and npm)")?;
    if !status.success() {
        bail!("npm install {pins} failed");
    }
    std::fs::write(&marker, &pins)?;
    Ok(folder)
}

/// Whether something answers HTTP at `endpoint`.
pub async fn answers(endpoint: &str) -> bool {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(800))
        .build()
        .unwrap_or_default();
    client
        .get(format!("{endpoint}/moto-api/"))
        .send()
        .await
        .is_ok()
        || client.get(endpoint).send().await.is_ok()
}

/// moto moves an ECS task one status further at every DescribeTasks; this
/// keeps tasks where RunTask and StopTask put them, as ECS does. Other
/// emulators do not have the switch; for them it is a no-op.
pub async fn keep_tasks_running(endpoint: &str) {
    let body =
        r#"{"model_name":"ecs::task","transition":{"progression":"manual","times":1000000}}"#;
    let _ = reqwest::Client::new()
        .post(format!("{endpoint}/moto-api/state-manager/set-transition"))
        .body(body)
        .timeout(Duration::from_secs(5))
        .send()
        .await;
}

pub async fn wait_until_up(endpoint: &str, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if answers(endpoint).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the emulator at {endpoint} did not answer within {timeout:?}")
}

/// How the stack starts its emulator.
#[derive(Debug, Clone)]
pub struct Spawn {
    pub port: u16,
    /// Killed when the process that started it ends (tests).
    pub die_with_parent: bool,
    /// Where it keeps its state; `None`: in memory only.
    pub state: Option<PathBuf>,
    /// Answers this percent of requests up to this many ms late (fault
    /// injection: a slow or throttled AWS).
    pub slow: Option<(u32, u32)>,
}

/// Where `armada up` keeps the emulator's state (`armada down --wipe`
/// removes it).
pub fn durable_state(root: &Path) -> PathBuf {
    state_dir(root).join("emulator")
}

/// Starts moto on 127.0.0.1:`port` as a process of its own (it outlives
/// this one under `up --detach`); returns its pid. With a state directory
/// it answers only once it has recovered what is there.
pub fn spawn(root: &Path, how: &Spawn) -> Result<u32> {
    let Spawn {
        port,
        die_with_parent,
        ..
    } = *how;
    install(root)?;
    let python = state_dir(root).join("venv/bin/python");
    let entry = write_entry_point(root)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state_dir(root).join(format!("moto-{port}.log")))?;
    let mut cmd = Command::new(python);
    cmd.arg(entry)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(dir) = &how.state {
        cmd.arg("--state-dir").arg(dir);
    }
    if let Some((percent, ms)) = how.slow {
        cmd.arg("--slow").arg(format!("{percent}:{ms}"));
    }
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    crate::local::process::detach(&mut cmd, die_with_parent);
    let child = cmd.spawn().context("starting the moto server")?;
    Ok(child.id())
}
