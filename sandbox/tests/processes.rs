//! A call sees only its own processes: the jail mounts a procfs of the
//! call's own over /proc with `hidepid=invisible`, so the processes of
//! every other uid (another sandbox's calls, the agent and the host's
//! root) are not listed, while the call's own are, and `/proc/self`
//! works.

#![allow(clippy::unwrap_used)]

use std::os::unix::process::CommandExt;

use serde_json::json;

use armada_domain::sandbox::controls::Enforcement;
use armada_sandbox::call::Call;
use armada_sandbox::jail::Step;

mod support;

use support::{call, fixture, sh};

/// A long-running process of another sandbox's uid, killed on drop.
struct Other(std::process::Child);

impl Drop for Other {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sleeper(uid: u32) -> Other {
    let child = std::process::Command::new("sleep")
        .arg("3141")
        .uid(uid)
        .gid(uid)
        .spawn()
        .unwrap();
    Other(child)
}

/// Whether the kernel gives each procfs mount options of its own.
fn per_instance_proc() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(['.', '-']);
    let major: u32 = parts.next().unwrap().parse().unwrap();
    let minor: u32 = parts.next().unwrap().parse().unwrap();
    (major, minor) >= (5, 8)
}

#[tokio::test]
async fn a_call_lists_its_own_processes_and_no_one_elses() {
    if !per_instance_proc() {
        eprintln!("skipped: Linux < 5.8 shares procfs options with the host");
        return;
    }
    let f = fixture("workspace");
    let neighbour = fixture("workspace");
    let other = sleeper(neighbour.runner.env.uid);
    let other_pid = other.0.id();
    let root_pid = std::process::id();
    // Seen from the host, both are there.
    assert!(std::path::Path::new(&format!("/proc/{other_pid}")).exists());
    let r = sh(
        &f,
        &format!(
            "ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '; echo; echo $$; \
             readlink /proc/self; \
             test -e /proc/{other_pid} && echo other-visible || echo other-hidden; \
             test -e /proc/{root_pid} && echo root-visible || echo root-hidden; \
             ps -eo pid= | tr -d ' ' | tr '\\n' ' '"
        ),
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let out = r["stdout"].as_str().unwrap();
    let lines: Vec<&str> = out.lines().collect();
    let listed: Vec<u32> = lines[0]
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    let shell: u32 = lines[1].parse().unwrap();
    assert!(listed.contains(&shell), "the call sees itself: {r}");
    assert!(!listed.contains(&other_pid), "another uid's process: {r}");
    assert!(!listed.contains(&root_pid), "root's process: {r}");
    assert!(lines[2].parse::<u32>().is_ok(), "/proc/self resolves: {r}");
    assert_eq!(lines[3], "other-hidden", "{r}");
    assert_eq!(lines[4], "root-hidden", "{r}");
    let ps: Vec<u32> = lines[5]
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(ps.contains(&shell), "ps lists the call: {r}");
    assert!(
        !ps.contains(&other_pid) && !ps.contains(&root_pid),
        "ps lists no one else: {r}"
    );
    // Everything the call lists is its own.
    for pid in &listed {
        if let Ok(meta) = std::fs::metadata(format!("/proc/{pid}")) {
            use std::os::unix::fs::MetadataExt;
            assert_eq!(meta.uid(), f.runner.env.uid, "pid {pid}: {r}");
        }
    }
    // Python runs and reads its own /proc entries.
    let code = format!(
        "import json, os\n\
         pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]\n\
         status = open('/proc/self/status').read()\n\
         print(json.dumps({{'self': os.getpid() in pids, 'other': {other_pid} in pids, \
         'root': {root_pid} in pids, 'status': status.startswith('Name:'), 'n': len(pids)}}))\n"
    );
    let py = call(&f, "python_exec", json!({ "code": code }), 30).await;
    let last = py["stdout"].as_str().unwrap().lines().last().unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {py}"));
    assert_eq!(v["self"], true, "{py}");
    assert_eq!(v["other"], false, "{py}");
    assert_eq!(v["root"], false, "{py}");
    assert_eq!(v["status"], true, "{py}");
    drop(other);
}

async fn probe(f: &support::Fixture) -> armada_sandbox::runner::CallRun {
    f.runner.run(Call::probe()).await.unwrap()
}

#[tokio::test]
async fn the_jail_reports_the_calls_own_proc() {
    let run = probe(&fixture("workspace")).await;
    assert_eq!(run.exit_code, Some(0), "{:?}", run.report);
    let (status, detail) = (
        run.report.status(Step::Processes),
        run.report.detail(Step::Processes),
    );
    if per_instance_proc() {
        assert_eq!(status, Enforcement::Enforced, "{detail}");
        assert!(detail.contains("hidepid=invisible"), "{detail}");
    } else {
        assert_eq!(status, Enforcement::NotEnforced, "{detail}");
        assert!(detail.contains("5.8"), "{detail}");
    }
    // Profile off confines nothing, and says so.
    let run = probe(&fixture("off")).await;
    assert_eq!(run.exit_code, Some(0), "{:?}", run.report);
    assert_eq!(
        run.report.status(Step::Processes),
        Enforcement::NotEnforced,
        "{:?}",
        run.report
    );
}
