//! Runs one call through the jail: a cgroup of its own beneath the
//! sandbox's, the jail process (`armada-sandbox exec`) with piped output, a
//! timeout that freezes and SIGKILLs the whole call (process group and
//! cgroup), and, after the command ends, every process it left behind
//! (`setsid` included) killed too. An OOM kill is read from the call's
//! cgroup.
//!
//! Where the agent may not make cgroups (Fargate: cgroupfs is read-only),
//! a call gets per-process limits instead ([`CallLimits`]), what it left
//! behind is found by its uid (the sandbox's own, which only its calls
//! run as) outside the sessions of its servers, and an OOM kill is read
//! from the task's cgroup.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::call::Call;
use crate::cgroup::Cgroup;
use crate::env::SandboxEnv;
use crate::jail::{Action, CallLimits, JailReport, SPEC_ENV};
use crate::program::Program;

/// Output kept per stream of a command; the rest is counted, not kept.
pub const OUTPUT_CAP: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("preparing the call: {0}")]
    Prepare(String),
    #[error("starting the jail: {0}")]
    Spawn(std::io::Error),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    pub text: String,
    pub bytes: u64,
    pub truncated: bool,
}

#[derive(Debug, Clone)]
pub struct CallRun {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Captured,
    pub stderr: Captured,
    pub timed_out: bool,
    pub oom: bool,
    /// Processes still alive after the command ended, killed by the runner.
    pub reaped: usize,
    pub report: JailReport,
    pub elapsed: Duration,
}

impl CallRun {
    /// The jail refused to run the command (a required control failed).
    pub fn refused(&self) -> Option<&str> {
        self.report.refused.as_deref()
    }
}

/// A call started in the background (`serve`): its cgroup outlives the call.
#[derive(Debug)]
pub struct Detached {
    pub pid: u32,
    pub cgroup: Option<Cgroup>,
    pub log: PathBuf,
}

#[derive(Debug)]
pub struct Runner {
    pub env: SandboxEnv,
    /// The sandbox program, started in its `exec` mode as the jail.
    pub jail: Program,
    /// The task has no egress (`ARMADA_SANDBOX_TASK_NETWORK=isolated`).
    pub task_network_isolated: bool,
    seq: AtomicU64,
    /// Sessions of servers started without a cgroup: their processes are
    /// not a finished call's leftovers.
    servers: Mutex<Vec<i32>>,
}

/// Processes of a sandbox at once where the task says nothing (its pids
/// limit, when readable, is used instead).
const DEFAULT_PROCESSES: u64 = 512;

async fn capture<R: AsyncRead + Unpin>(mut r: R, cap: usize) -> Captured {
    let mut kept = Vec::new();
    let mut total = 0u64;
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                total += n as u64;
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    Captured {
        truncated: total > kept.len() as u64,
        text: String::from_utf8_lossy(&kept).into_owned(),
        bytes: total,
    }
}

impl Runner {
    pub fn new(env: SandboxEnv, jail: Program) -> Self {
        Runner {
            env,
            jail,
            task_network_isolated: std::env::var(
                armada_core::ports::provider::task_env::TASK_NETWORK,
            )
            .as_deref()
                == Ok("isolated"),
            seq: AtomicU64::new(0),
            servers: Mutex::new(Vec::new()),
        }
    }

    fn next_name(&self, prefix: &str) -> String {
        format!(
            "{prefix}-{}-{}",
            std::process::id(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn call_cgroup(&self, name: &str) -> Result<Option<Cgroup>, RunnerError> {
        let Some(parent) = &self.env.cgroup else {
            return Ok(None);
        };
        let cg = parent
            .child(name)
            .map_err(|e| RunnerError::Prepare(e.to_string()))?;
        cg.set_memory_limit(self.env.call_memory_bytes())
            .map_err(|e| RunnerError::Prepare(e.to_string()))?;
        Ok(Some(cg))
    }

    fn command(
        &self,
        call: &Call,
        cg: Option<&Cgroup>,
        name: &str,
        cpu_seconds: u64,
    ) -> Result<(tokio::process::Command, PathBuf), RunnerError> {
        let scratch = self
            .env
            .prepare_scratch(&call.run_id)
            .map_err(|e| RunnerError::Prepare(format!("scratch: {e}")))?;
        let report = self.env.calls_dir().join(format!("{name}.json"));
        let mut spec = self.env.spec(call, &scratch, cg, report.clone());
        spec.task_network_isolated = self.task_network_isolated;
        if spec.fs.is_some() {
            spec.effects = call.effects.clone();
        }
        if let (Action::ApplyChanges { source, .. }, Some(fs)) = (&call.action, spec.fs.as_mut()) {
            fs.read.push(source.clone());
        }
        spec.call_limits = Some(CallLimits {
            address_space_bytes: self.env.call_memory_bytes(),
            cpu_seconds,
            processes: Cgroup::current()
                .ok()
                .and_then(|c| c.pids_max())
                .map_or(DEFAULT_PROCESSES, u64::from),
        });
        let spec = serde_json::to_string(&spec).map_err(|e| RunnerError::Prepare(e.to_string()))?;
        let mut cmd = self.jail.command("exec");
        cmd.env_clear()
            .env(SPEC_ENV, spec)
            .current_dir("/")
            // The jail makes itself a session (and group) leader.
            .kill_on_drop(true);
        Ok((cmd, report))
    }

    fn read_report(path: &Path) -> JailReport {
        let r = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let _ = std::fs::remove_file(path);
        r
    }

    /// Runs a call to its end (or its timeout).
    pub async fn run(&self, call: Call) -> Result<CallRun, RunnerError> {
        let started = Instant::now();
        let name = self.next_name("call");
        let cg = self.call_cgroup(&name)?;
        let cpu_seconds = call.timeout.as_secs().max(1);
        let (mut cmd, report_path) = self.command(&call, cg.as_ref(), &name, cpu_seconds)?;
        let task_ooms = cg.is_none().then(task_oom_kills);
        cmd.stdin(if call.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(RunnerError::Spawn)?;
        let pgid = child.id().map(|p| p as i32);
        // A file read's stdout is the file: it is kept up to its own limit.
        let out_cap = match &call.action {
            Action::ReadFile { max_bytes, .. } => usize::try_from(*max_bytes).unwrap_or(OUTPUT_CAP),
            Action::Exec { .. } | Action::WriteFile { .. } | Action::ApplyChanges { .. } => {
                OUTPUT_CAP
            }
        };
        let out = child
            .stdout
            .take()
            .map(|s| tokio::spawn(capture(s, out_cap)));
        let err = child
            .stderr
            .take()
            .map(|s| tokio::spawn(capture(s, OUTPUT_CAP)));
        if let (Some(input), Some(mut stdin)) = (call.stdin.clone(), child.stdin.take()) {
            tokio::spawn(async move {
                let _ = stdin.write_all(&input).await;
                let _ = stdin.shutdown().await;
            });
        }
        // Returns how many processes were still there to kill.
        let (uid, servers) = (self.env.uid, self.server_sessions());
        let kill_everything = move |cg: Option<&Cgroup>| {
            // The call's own processes: a relay the jail started beside it
            // (another uid's) is the call's plumbing, not its leftover.
            let left = match cg {
                Some(c) => c
                    .all_procs()
                    .into_iter()
                    .filter(|p| {
                        crate::sys::process_uid_and_session(*p).is_some_and(|(u, _)| u == uid)
                    })
                    .count(),
                None => strays(uid, &servers).len(),
            };
            if let Some(pg) = pgid {
                crate::sys::killpg(pg, libc::SIGKILL);
            }
            match cg {
                Some(cg) => {
                    let _ = cg.kill_all();
                }
                None => {
                    kill_strays(uid, &servers);
                }
            }
            left
        };
        let (status, timed_out) = match tokio::time::timeout(call.timeout, child.wait()).await {
            Ok(s) => (s.ok(), false),
            Err(_) => {
                let cg2 = cg.clone();
                let kill = kill_everything.clone();
                let _ = tokio::task::spawn_blocking(move || kill(cg2.as_ref())).await;
                (child.wait().await.ok(), true)
            }
        };
        // Whatever the command left running is killed now; the pipes close
        // once the last holder is gone.
        let cg2 = cg.clone();
        let reaped = tokio::task::spawn_blocking(move || kill_everything(cg2.as_ref()))
            .await
            .unwrap_or(0);
        let stdout = match out {
            Some(h) => h.await.unwrap_or_default(),
            None => Captured::default(),
        };
        let stderr = match err {
            Some(h) => h.await.unwrap_or_default(),
            None => Captured::default(),
        };
        let oom = match (&cg, task_ooms) {
            (Some(c), _) => c.oom_kills() > 0,
            // The task's OOM killer took something during the call: the
            // call (its processes are the likeliest victims, by size and
            // by their oom_score_adj).
            (None, Some(before)) => task_oom_kills() > before,
            (None, None) => false,
        };
        if let Some(cg) = cg {
            let _ = tokio::task::spawn_blocking(move || cg.destroy()).await;
        }
        use std::os::unix::process::ExitStatusExt;
        Ok(CallRun {
            exit_code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            stdout,
            stderr,
            timed_out,
            oom,
            reaped: if timed_out { 0 } else { reaped },
            report: Self::read_report(&report_path),
            elapsed: started.elapsed(),
        })
    }

    /// Starts a call that keeps running after it returns (a server). Its
    /// output goes to a log file in the sandbox.
    pub async fn spawn_detached(&self, call: Call, name: &str) -> Result<Detached, RunnerError> {
        let cg = self.call_cgroup(name)?;
        // A server's CPU is not a call's: no CPU-seconds limit.
        let (mut cmd, report) = self.command(&call, cg.as_ref(), name, libc::RLIM_INFINITY)?;
        let log = self.env.root.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).map_err(|e| RunnerError::Prepare(e.to_string()))?;
        let file2 = file
            .try_clone()
            .map_err(|e| RunnerError::Prepare(e.to_string()))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(file2))
            .kill_on_drop(false);
        let mut child = cmd.spawn().map_err(RunnerError::Spawn)?;
        let pid = child.id().unwrap_or(0);
        self.remember_server(pid, cg.as_ref());
        // Reap it whenever it ends; its cgroup is what the sandbox keeps.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        whole_report(&report).await;
        Ok(Detached {
            pid,
            cgroup: cg,
            log,
        })
    }

    /// Starts `call` in the background with its stdin and stdout piped to
    /// the agent (an MCP server over stdio); its stderr goes to its log.
    /// Like a detached call, its cgroup outlives the call that started it.
    pub async fn spawn_piped(
        &self,
        call: Call,
        name: &str,
    ) -> Result<
        (
            Detached,
            tokio::process::ChildStdin,
            tokio::process::ChildStdout,
        ),
        RunnerError,
    > {
        let cg = self.call_cgroup(name)?;
        let (mut cmd, report) = self.command(&call, cg.as_ref(), name, libc::RLIM_INFINITY)?;
        let log = self.env.root.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).map_err(|e| RunnerError::Prepare(e.to_string()))?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(file))
            .kill_on_drop(false);
        let mut child = cmd.spawn().map_err(RunnerError::Spawn)?;
        let pid = child.id().unwrap_or(0);
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(RunnerError::Prepare(
                "the server's pipes were not made".into(),
            ));
        };
        self.remember_server(pid, cg.as_ref());
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        whole_report(&report).await;
        let detached = Detached {
            pid,
            cgroup: cg,
            log,
        };
        Ok((detached, stdin, stdout))
    }

    /// A server started without a cgroup: the jail makes itself a session
    /// leader, so its pid is the session the sandbox keeps.
    fn remember_server(&self, pid: u32, cg: Option<&Cgroup>) {
        if cg.is_none() {
            if let Ok(mut s) = self.servers.lock() {
                s.push(pid as i32);
            }
        }
    }

    /// Sessions of servers still running.
    fn server_sessions(&self) -> Vec<i32> {
        let Ok(mut s) = self.servers.lock() else {
            return vec![];
        };
        s.retain(|pid| crate::sys::kill(*pid, 0));
        s.clone()
    }

    /// The jail report of a detached call, once written.
    pub fn detached_report(&self, name: &str) -> JailReport {
        Self::read_report(&self.env.calls_dir().join(format!("{name}.json")))
    }
}

/// Waits until the jail's report of a background call is whole (it is
/// written before exec).
async fn whole_report(report: &Path) {
    for _ in 0..400 {
        let whole = std::fs::read_to_string(report)
            .ok()
            .is_some_and(|t| serde_json::from_str::<JailReport>(&t).is_ok());
        if whole {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// OOM kills in the task's cgroup (the agent's own) so far.
fn task_oom_kills() -> u64 {
    Cgroup::current().map_or(0, |c| c.oom_kills())
}

/// Kills every process of `uid` outside the `servers`' sessions: a call
/// without a cgroup leaves nothing else behind (the uid is the sandbox's
/// alone, and only its calls run as it). Repeated until none is left, as
/// a process may fork while the list is read (RLIMIT_NPROC bounds how
/// many it can make); how many there were.
pub fn kill_strays(uid: u32, servers: &[i32]) -> usize {
    let mut killed = std::collections::BTreeSet::new();
    for _ in 0..50 {
        let strays = strays(uid, servers);
        if strays.is_empty() {
            break;
        }
        for pid in strays {
            crate::sys::kill(pid, libc::SIGKILL);
            killed.insert(pid);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    killed.len()
}

/// Live processes of `uid` outside the `servers`' sessions.
fn strays(uid: u32, servers: &[i32]) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            crate::sys::process_uid_and_session(*pid)
                .is_some_and(|(u, sid)| u == uid && !servers.contains(&sid))
        })
        .collect()
}
