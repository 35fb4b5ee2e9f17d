//! The fixture the confinement tests share: a sandbox built the way the
//! data plane builds one (a directory tree, an unprivileged uid, a cgroup
//! with the task's limits), and calls run through the jail binary.

#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{json, Value};

use armada_domain::sandbox::{Limits, Profiles};
use armada_sandbox::cgroup::Cgroup;
use armada_sandbox::entry::Program;
use armada_sandbox::env::SandboxEnv;
use armada_sandbox::runner::Runner;
use armada_sandbox::skills;

pub static N: AtomicU32 = AtomicU32::new(0);

pub struct Fixture {
    pub runner: Runner,
    pub cgroup: Cgroup,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.cgroup.destroy();
        let _ = std::fs::remove_dir_all(&self.runner.env.root);
    }
}

pub fn fixture_with(profile: &str, profiles: &Profiles, memory_mb: u32) -> Fixture {
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
        data_root: root.join("data"),
        cgroup: Some(cgroup.clone()),
        mounts: vec![],
    };
    env.prepare().unwrap();
    Fixture {
        runner: Runner::new(env, Program::new(env!("CARGO_BIN_EXE_armada-sandbox"), &[])),
        cgroup,
    }
}

pub fn fixture(profile: &str) -> Fixture {
    fixture_with(profile, &Profiles::default(), 256)
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
