//! The jail: a fresh, single-threaded process (`armada-sandbox exec`) that
//! confines itself and then executes the skill's command. Doing it in a
//! process of its own (as firecracker's jailer does) keeps every step out of
//! the agent's multi-threaded runtime and gives each call the same order:
//!
//! 1. join the call's cgroups (memory, cpu, pids, freezer);
//! 2. a new session, so the call is one process group;
//! 3. namespaces: a mount namespace with a private /tmp, the denied paths
//!    covered and a procfs of its own that lists the call's processes only
//!    (`hidepid=invisible`, Linux 5.8 and later), and a network namespace:
//!    loopback only when the network is restricted, else with an egress
//!    proxy and its server's port relayed ([`relay`]);
//! 4. rlimits (no core dumps, the disk limit as the largest file; the
//!    workspace's total is held by its own filesystem, which the agent
//!    mounts where it may: `agent::disk`);
//! 5. a Landlock ruleset over the filesystem (and TCP ports), built while
//!    still root, then privileges dropped to the sandbox's unprivileged uid;
//! 6. the ruleset applied, then a seccomp deny-list;
//! 7. exec.
//!
//! What each step achieved is written to the report file before exec; a
//! step the spec requires that fails aborts the call (exit 126) instead of
//! running it weaker. Paths the spec names inside trees the calls write
//! (declared mounts, Landlock rules beneath the workspace or the data
//! root) are opened without following links: one that became a link
//! aborts the call whatever the spec requires ([`beneath`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use armada_domain::sandbox::controls::Enforcement;

mod beneath;
mod confine;
mod mounts;
mod pertask;
pub mod relay;
mod rules;

use confine::confine;

/// The environment variable that carries the spec to the jail process.
pub const SPEC_ENV: &str = "ARMADA_JAIL_SPEC";
/// The exit code of a jail that refused to run its command.
pub const REFUSED: i32 = 126;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsRules {
    /// Read (and execute) everything.
    pub read_all: bool,
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    /// Trees in which files may be made and written but not removed,
    /// renamed or truncated (the workspace of an unapproved call where
    /// the jail cannot make it an overlay).
    #[serde(default)]
    pub keep: Vec<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpRules {
    /// Ports the call may bind; empty denies every bind.
    pub bind: Vec<u16>,
    /// Ports the call may connect to; empty denies every connect.
    pub connect: Vec<u16>,
}

/// A path kept visible beneath a covered one, read-only unless `writable`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    pub path: PathBuf,
    pub writable: bool,
}

/// What the jail does once confined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    /// Execute a command.
    Exec { argv: Vec<String> },
    /// Copy a file to stdout (at most `max_bytes`); done by the confined
    /// jail itself, so the same rules decide what it may read.
    ReadFile { path: PathBuf, max_bytes: u64 },
    /// Write stdin to a file, creating its parent directories. Without
    /// `overwrite`, an existing file with other content is left alone
    /// (exit [`file_exit::EXISTS`]): replacing it needs an approval.
    WriteFile {
        path: PathBuf,
        #[serde(default)]
        overwrite: bool,
    },
    /// Apply a call's changes, read from `source` (its overlay's upper
    /// layer, or its held changes), to the workspace (`cwd`): done as the
    /// sandbox's uid, confined like a call ([`crate::effects::apply`]).
    ApplyChanges {
        source: PathBuf,
        changes: crate::effects::ChangeSet,
    },
}

/// The layers of an overlay the call sees over the workspace (`cwd`): its
/// changes go to `upper`, and the workspace is left as it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverlayLayers {
    pub upper: PathBuf,
    pub work: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailSpec {
    pub action: Action,
    pub cwd: PathBuf,
    /// The complete environment of the command.
    pub env: Vec<(String, String)>,
    /// Dropped to when the jail runs as root.
    pub uid: u32,
    pub gid: u32,
    /// `cgroup.procs` files to join.
    pub cgroup_procs: Vec<PathBuf>,
    /// `None` applies no filesystem rules (profile `off`).
    pub fs: Option<FsRules>,
    /// Paths covered by an empty read-only filesystem (deny).
    pub hide: Vec<PathBuf>,
    /// Paths under a hidden one that stay visible (declared mounts).
    #[serde(default)]
    pub binds: Vec<Bind>,
    /// Bound over /tmp in a mount namespace of the call's own.
    pub private_tmp: Option<PathBuf>,
    /// Only a loopback interface (restrict_network).
    pub isolate_network: bool,
    pub tcp: Option<TcpRules>,
    pub seccomp: bool,
    /// Largest file the call may write, in bytes.
    pub max_file_bytes: Option<u64>,
    /// Where the jail writes its [`JailReport`].
    pub report: PathBuf,
    /// Controls whose failure refuses the call instead of weakening it.
    pub require: Vec<Step>,
    /// The task as a whole has no egress (`ARMADA_SANDBOX_TASK_NETWORK=
    /// isolated`: a security group without egress on Fargate, a network
    /// namespace of the task's own locally): where a call cannot get a
    /// network namespace of its own, this holds the network rule.
    #[serde(default)]
    pub task_network_isolated: bool,
    /// Limits on each process of a call that has no cgroup of its own
    /// (where cgroupfs is not the agent's to write, as on Fargate).
    #[serde(default)]
    pub call_limits: Option<CallLimits>,
    /// The call's changes to the workspace are judged before they are
    /// kept: an overlay over it where the jail can mount, Landlock keeping
    /// its files where it cannot ([`crate::effects`]).
    #[serde(default)]
    pub effects: Option<OverlayLayers>,
    /// A network namespace of the call's own whose only ways out are an
    /// egress proxy and its server's port ([`relay`]): where the jail can
    /// make one (not on Fargate, where the task's network is the rule).
    #[serde(default)]
    pub egress_relay: Option<relay::EgressRelay>,
}

/// Per-process limits of a call without a cgroup (`setrlimit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallLimits {
    /// RLIMIT_AS: an allocation past it fails (ENOMEM).
    pub address_space_bytes: u64,
    /// RLIMIT_CPU: CPU seconds, then SIGKILL.
    pub cpu_seconds: u64,
    /// RLIMIT_NPROC: processes of the call's uid (the sandbox's) at once.
    pub processes: u64,
}

/// The confinement steps, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Cgroups,
    Mounts,
    Network,
    Filesystem,
    Tcp,
    Uid,
    Syscalls,
    /// A procfs of the call's own over /proc, listing only its processes.
    Processes,
    /// How the call's changes to the workspace are judged: `enforced`, an
    /// overlay holds them; `partial`, Landlock keeps the workspace's files
    /// from removal and truncation.
    Effects,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepReport {
    pub status: Enforcement,
    pub detail: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailReport {
    pub steps: BTreeMap<Step, StepReport>,
    /// Set when the jail refused to run the command.
    pub refused: Option<String>,
}

impl JailReport {
    fn note(&mut self, step: Step, status: Enforcement, detail: impl Into<String>) {
        self.steps.insert(
            step,
            StepReport {
                status,
                detail: detail.into(),
            },
        );
    }

    pub fn status(&self, step: Step) -> Enforcement {
        self.steps
            .get(&step)
            .map_or(Enforcement::NotEnforced, |s| s.status)
    }

    pub fn detail(&self, step: Step) -> &str {
        self.steps.get(&step).map_or("", |s| s.detail.as_str())
    }
}

/// Runs the jail; returns only if the command could not be executed.
pub fn run(spec: &JailSpec) -> i32 {
    // Confinement may change what the command gets (its $TMPDIR where the
    // call has no /tmp of its own).
    let mut spec = spec.clone();
    let spec = &mut spec;
    let mut report = JailReport::default();
    // Opened now: once confined, the jail may not reach the directory.
    // Readers take the report as written once it parses.
    let mut out = match std::fs::File::create(&spec.report) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("armada-sandbox: cannot write the jail report: {e}");
            return REFUSED;
        }
    };
    // Changes to apply are read through a descriptor opened while root:
    // the sandbox's uid cannot reach where they are kept.
    let source = match &spec.action {
        Action::ApplyChanges { source, .. } => match crate::sys::open_path(source) {
            Ok(fd) => Some(fd),
            Err(e) => {
                eprintln!("armada-sandbox: the changes to apply: {e}");
                return REFUSED;
            }
        },
        _ => None,
    };
    let result = confine(spec, &mut report);
    if let Err(why) = &result {
        report.refused = Some(why.clone());
    }
    let _ = out.write_all(
        serde_json::to_string(&report)
            .unwrap_or_default()
            .as_bytes(),
    );
    let _ = out.flush();
    drop(out);
    if let Err(why) = result {
        eprintln!("armada-sandbox: refused to run: {why}");
        return REFUSED;
    }
    match &spec.action {
        Action::Exec { argv } => {
            let err = exec(spec, argv);
            eprintln!("armada-sandbox: cannot execute {:?}: {err}", argv.first());
            127
        }
        Action::ReadFile { path, max_bytes } => file_op(read_file(&spec.cwd, path, *max_bytes)),
        Action::WriteFile { path, overwrite } => file_op(write_file(&spec.cwd, path, *overwrite)),
        Action::ApplyChanges { changes, .. } => {
            use std::os::fd::AsRawFd;
            let Some(fd) = &source else {
                return REFUSED;
            };
            let from = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
            file_op(crate::effects::apply(&from, &spec.cwd, changes))
        }
    }
}

/// Exit codes of the file actions, read by the runner.
pub mod file_exit {
    pub const NOT_FOUND: i32 = 2;
    pub const DENIED: i32 = 3;
    pub const TOO_LARGE: i32 = 4;
    pub const IO: i32 = 5;
    pub const EXISTS: i32 = 6;
}

fn file_op(r: std::io::Result<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            match e.kind() {
                std::io::ErrorKind::NotFound => file_exit::NOT_FOUND,
                std::io::ErrorKind::PermissionDenied => file_exit::DENIED,
                std::io::ErrorKind::FileTooLarge => file_exit::TOO_LARGE,
                std::io::ErrorKind::AlreadyExists => file_exit::EXISTS,
                _ => file_exit::IO,
            }
        }
    }
}

fn read_file(cwd: &Path, path: &Path, max_bytes: u64) -> std::io::Result<()> {
    use std::io::Read;
    let f = std::fs::File::open(cwd.join(path))?;
    if f.metadata()?.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "is a directory",
        ));
    }
    let mut buf = Vec::new();
    f.take(max_bytes + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max_bytes {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("the file is larger than {max_bytes} bytes"),
        ));
    }
    std::io::stdout().write_all(&buf)?;
    std::io::stdout().flush()
}

fn write_file(cwd: &Path, path: &Path, overwrite: bool) -> std::io::Result<()> {
    use std::io::Read;
    let target = cwd.join(path);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut content = Vec::new();
    std::io::stdin().read_to_end(&mut content)?;
    if overwrite {
        std::fs::write(&target, &content)?;
    } else {
        // Created here, or already holding exactly this content (a call
        // written again): anything else would be lost, so it is refused.
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&target)
        {
            Ok(mut f) => f.write_all(&content)?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if std::fs::read(&target).ok().as_deref() != Some(content.as_slice()) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "the file exists with other content",
                    ));
                }
            }
            Err(e) => return Err(e),
        }
    }
    println!("{}", content.len());
    Ok(())
}

fn exec(spec: &JailSpec, argv: &[String]) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let Some((prog, args)) = argv.split_first() else {
        return std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty argv");
    };
    std::process::Command::new(prog)
        .args(args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd)
        .exec()
}
