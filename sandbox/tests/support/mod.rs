//! The fixture the confinement tests share: a sandbox built the way the
//! data plane builds one (a directory tree, an unprivileged uid, a cgroup
//! with the task's limits), and calls run through the jail binary.
//!
//! Each test runs in two modes ([`both_modes!`]): `local`, as the local
//! data plane runs a task (the agent holds every capability and may make
//! namespaces and cgroups), and `fargate`, as Fargate runs one: the test's
//! thread (capabilities are per thread; the jails it starts inherit them)
//! keeps only a Fargate container's capabilities, so no call gets a mount
//! or network namespace, and calls get no cgroup of their own.

#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{json, Value};

use armada_domain::sandbox::{Limits, Profiles};
use armada_sandbox::cgroup::Cgroup;
use armada_sandbox::env::SandboxEnv;
use armada_sandbox::program::Program;
use armada_sandbox::runner::Runner;
use armada_sandbox::skills;

pub static N: AtomicU32 = AtomicU32::new(0);

/// How the sandbox's task is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Local,
    Fargate,
}

/// Runs a test in both modes: `<name>::local` and `<name>::fargate`, each
/// calling `<name>(Mode)`.
#[macro_export]
macro_rules! both_modes {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn local() {
                super::$name($crate::support::Mode::Local).await
            }

            #[test]
            fn fargate() {
                $crate::support::on_fargate(false, || super::$name($crate::support::Mode::Fargate))
            }
        }
    )*};
}

/// Runs `test` on this thread as a Fargate task's agent would: with a
/// Fargate container's capabilities only, and, for a task whose tier has
/// no egress (`isolated`), in a network namespace of the task's own.
pub fn on_fargate<F: std::future::Future<Output = ()>>(isolated: bool, test: impl FnOnce() -> F) {
    if isolated {
        armada_sandbox::sys::unshare(libc::CLONE_NEWNET).unwrap();
        armada_sandbox::sys::loopback_up().unwrap();
    }
    armada_sandbox::fargate::sys::keep_fargate_capabilities().unwrap();
    assert!(!armada_sandbox::fargate::sys::has_capability(
        armada_sandbox::fargate::sys::CAP_SYS_ADMIN
    ));
    ISOLATED.with(|i| i.set(isolated));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(test());
}

thread_local! {
    static ISOLATED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

pub struct Fixture {
    pub runner: Runner,
    pub cgroup: Cgroup,
    pub mode: Mode,
}

impl Fixture {
    /// Processes of the sandbox still alive: its cgroup's, or, without
    /// one, its uid's.
    pub fn leftovers(&self) -> Vec<i32> {
        match self.mode {
            Mode::Local => self.cgroup.all_procs(),
            Mode::Fargate => std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|p| {
                    armada_sandbox::sys::process_uid_and_session(*p)
                        .is_some_and(|(u, _)| u == self.runner.env.uid)
                })
                .collect(),
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.cgroup.destroy();
        let _ = std::fs::remove_dir_all(&self.runner.env.root);
    }
}

pub fn fixture_with(profile: &str, profiles: &Profiles, memory_mb: u32) -> Fixture {
    fixture_in(Mode::Local, profile, profiles, memory_mb)
}

pub fn fixture_in(mode: Mode, profile: &str, profiles: &Profiles, memory_mb: u32) -> Fixture {
    let n = N.fetch_add(1, Ordering::Relaxed);
    let id = format!("armada-test-{}-{n}", std::process::id());
    let root = PathBuf::from("/var/tmp").join(&id);
    let cgroup = Cgroup::current().unwrap().child(&id).unwrap();
    cgroup
        .set_memory_limit(u64::from(memory_mb) * 1024 * 1024)
        .unwrap();
    cgroup.set_pids_max(256).unwrap();
    cgroup.set_cpu_millis(1000).unwrap();
    let env = SandboxEnv {
        root: root.clone(),
        uid: 210_000 + std::process::id() % 1000 * 10 + n,
        gid: 210_000 + std::process::id() % 1000 * 10 + n,
        caps: profiles.resolve(profile).unwrap(),
        limits: Limits {
            memory_mb,
            ..Limits::default()
        },
        egress_ports: vec![443],
        egress_allow: vec![],
        data_root: root.join("data"),
        // On Fargate cgroupfs is read-only: calls get no group of their own.
        cgroup: (mode == Mode::Local).then(|| cgroup.clone()),
        mounts: vec![],
    };
    env.prepare().unwrap();
    let mut runner = Runner::new(env, Program::new(env!("CARGO_BIN_EXE_armada-sandbox"), &[]));
    runner.task_network_isolated = mode == Mode::Fargate && ISOLATED.with(|i| i.get());
    Fixture {
        runner,
        cgroup,
        mode,
    }
}

pub fn fixture(profile: &str) -> Fixture {
    fixture_with(profile, &Profiles::default(), 256)
}

pub fn fixture_of(mode: Mode, profile: &str) -> Fixture {
    fixture_in(mode, profile, &Profiles::default(), 256)
}

pub async fn sh(f: &Fixture, command: &str) -> Value {
    call(f, "shell_exec", json!({ "command": command }), 30).await
}

pub async fn call(f: &Fixture, skill: &str, args: Value, timeout_s: u32) -> Value {
    skills::invoke(&f.runner, skill, &args, "run_1", timeout_s, false)
        .await
        .result
}

/// Runs Python code in the sandbox and parses the JSON it prints last.
pub async fn py_json(f: &Fixture, code: &str) -> Value {
    let r = call(f, "python_exec", json!({ "code": code }), 30).await;
    let out = r["stdout"].as_str().unwrap_or_default();
    let last = out.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {r}"))
}
