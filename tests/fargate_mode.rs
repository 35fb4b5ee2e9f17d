//! Profiles on Fargate, end to end: a stack whose data plane runs every
//! sandbox task as Fargate would (`armada up --dataplane fargate`: no
//! CAP_SYS_ADMIN/NET_ADMIN, read-only root and cgroupfs but for the task's
//! directory, its own pid namespace, and for a tier without egress its own
//! network namespace whose only way out is the AWS endpoint, for the agent
//! alone). Every built-in profile starts and holds there, and its controls
//! say `partial` where per call became per task; what needs per-call
//! namespaces (declared mounts) fails closed.

#![allow(clippy::unwrap_used)]

use serde_json::{json, Value};

use armada_cli::local::dataplane::DataPlaneMode;
use armada_tests::outcome;
use armada_tests::sandbox::*;
use armada_tests::TestStack;

/// A Run's `shell_exec` (or `python_exec`) answer.
async fn run_sh(t: &TestStack, agent: &str, command: &str) -> Value {
    let (_, run) = t.ask(agent, &sh(command)).await;
    assert_eq!(outcome(&run), "COMPLETED", "{agent:?}: {run:?}");
    tool_result(&run, "shell_exec")
}

async fn run_py(t: &TestStack, agent: &str, code: &str) -> Value {
    let (_, run) = t.ask(agent, &py(code)).await;
    assert_eq!(outcome(&run), "COMPLETED", "{agent:?}: {run:?}");
    tool_result(&run, "python_exec")
}

/// Python that connects to 127.0.0.1:`port` and sends a request: prints
/// `refused` (no connection), `closed` (closed unanswered), `connected`
/// (open, silent) or `answered`.
fn connect_and_ask(port: u16) -> String {
    format!(
        "import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n    s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\nexcept OSError:\n    print('refused')\nelse:\n    try:\n        print('answered' if s.recv(64) else 'closed')\n    except socket.timeout:\n        print('connected')\n    except OSError:\n        print('closed')\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_built_in_profile_starts_and_holds_on_fargate() {
    let t = TestStack::start_in(DataPlaneMode::Fargate, fast()).await;
    let emulator_port: u16 = t
        .stack
        .endpoint
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let stack = t.stack.template.stack().to_string();
    for profile in ["workspace", "devbox", "read-only", "strict", "off"] {
        let agent = format!("on-fargate-{}", profile.replace('-', ""));
        put_agent(
            &t,
            &agent,
            json!({"profile": profile, "limits": {"memory_mb": 256}}),
        )
        .await;
        // It starts, and its calls run as its own uid.
        let r = run_sh(&t, &agent, "id -u").await;
        let uid: u32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
        assert!(uid >= 300_000, "{agent}: {r}");
        let sb = sandbox_of(&t.client, &agent).await;
        assert_eq!(sb.state, SandboxState::Ready, "{sb:?}");
        // The task's pid 1 (its agent's supervisor) holds no CAP_SYS_ADMIN
        // (strict reads nothing of /proc).
        let r = run_sh(&t, &agent, "grep CapBnd /proc/1/status").await;
        let line = r["stdout"].as_str().unwrap().trim();
        if profile == "strict" {
            assert_eq!(line, "", "{r}");
        } else {
            let bounding =
                u64::from_str_radix(line.trim_start_matches("CapBnd:").trim(), 16).unwrap();
            assert_eq!(bounding & (1 << 21), 0, "{agent}: CAP_SYS_ADMIN in {r}");
            assert_eq!(bounding & (1 << 12), 0, "{agent}: CAP_NET_ADMIN in {r}");
        }
        // A write outside the sandbox's own directories fails (for `off`
        // too: the root is read-only); inside them (its home: read-only
        // does not write its workspace) it works.
        let outside = format!("/var/tmp/armada-fargate-{stack}-{profile}.txt");
        let r = run_sh(&t, &agent, &format!("echo x > {outside}")).await;
        assert_ne!(r["exit_code"], 0, "{agent}: {r}");
        assert!(!std::path::Path::new(&outside).exists(), "{agent}");
        let r = run_sh(
            &t,
            &agent,
            "echo kept > \"$HOME/mine\" && cat \"$HOME/mine\"",
        )
        .await;
        assert_eq!(r["stdout"], "kept\n", "{agent}: {r}");
        // The credentials: none in the call's environment, and the agent's
        // environment is not the call's to read.
        let r = run_sh(
            &t,
            &agent,
            "env | grep -c '^AWS_' ; cat /proc/1/environ >/dev/null && echo read",
        )
        .await;
        assert_eq!(r["stdout"], "0\n", "{agent}: {r}");
        // The tier's network rule: no way out for restricted profiles (not
        // even to the emulator beside the agent's endpoint), TCP to the
        // egress ports only for the others.
        for (target, off_gets) in [(port, "connected\n"), (emulator_port, "answered\n")] {
            let r = run_py(&t, &agent, &connect_and_ask(target)).await;
            let got = r["stdout"].as_str().unwrap();
            if profile == "off" {
                assert_eq!(got, off_gets, "{agent} to {target}: {r}");
            } else {
                assert!(
                    matches!(got, "refused\n" | "closed\n"),
                    "{agent} to {target}: {r}"
                );
            }
        }
        let sb = sandbox_of(&t.client, &agent).await;
        let status = |c: &str| {
            sb.controls.as_ref().expect("controls")[c]["status"]
                .as_str()
                .unwrap()
                .to_string()
        };
        if profile == "off" {
            assert_eq!(status("filesystem"), "not_enforced", "{sb:?}");
        } else {
            // What is measured (the README's table).
            for (control, want) in [
                ("filesystem", "enforced"),
                ("syscalls", "enforced"),
                ("mounts", "partial"),
                ("processes", "partial"),
                ("memory", "partial"),
                ("cpu", "partial"),
                ("pids", "partial"),
                ("disk", "partial"),
            ] {
                assert_eq!(status(control), want, "{agent} {control}: {sb:?}");
            }
            let restricted = matches!(profile, "read-only" | "strict");
            assert_eq!(
                status("network"),
                if restricted { "enforced" } else { "partial" },
                "{sb:?}"
            );
            if restricted {
                let why = sb.controls.as_ref().expect("controls")["network"]["reason"]
                    .as_str()
                    .unwrap();
                assert!(why.starts_with("per task"), "{sb:?}");
            }
            println!("{profile}: {}", sb.controls.as_ref().expect("controls"));
        }
        // A memory bomb dies (its allocations fail at RLIMIT_AS, or the
        // task's OOM killer takes it); the sandbox lives on unless OOM'd.
        let r = run_py(
            &t,
            &agent,
            "a = []\nwhile True:\n    a.append(bytearray(8 * 1024 * 1024))\n",
        )
        .await;
        let died = r["error"]["code"] == "OOM"
            || (r["exit_code"] == 1 && r["stderr"].as_str().unwrap().contains("MemoryError"));
        assert!(died, "{agent}: {r}");
    }
    drop(listener);
    t.stack.stop().await;
}

/// A declared mount is a bind mount in the call's own mount namespace: on
/// Fargate a sandbox that declares one fails closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_fargate_declared_mounts_fail_closed() {
    let t = TestStack::start_in(DataPlaneMode::Fargate, fast()).await;
    put_agent(
        &t,
        "mounted",
        json!({"user": "u1", "mounts": [{"path": "/data/users/u1/workspace", "mode": "ro"}]}),
    )
    .await;
    let (_, run) = t.ask("mounted", &sh("echo should not run")).await;
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "SANDBOX_UNAVAILABLE",
        "{run:?}"
    );
    let sb = sandbox_of(&t.client, "mounted").await;
    assert_eq!(sb.state, SandboxState::Failed, "{sb:?}");
    t.stack.stop().await;
}
