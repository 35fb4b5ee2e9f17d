//! Real skills in real confined processes: each test builds a sandbox the
//! way the data plane does (a directory tree, an unprivileged uid, a cgroup
//! with the task's limits) and runs calls through the jail binary, in both
//! modes of the data plane ([`support::Mode`]): locally, and as on Fargate
//! (no namespaces, no cgroups per call) where the same rules must hold.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;

use armada_domain::sandbox::{ProfileDef, Profiles};
use armada_sandbox::skills::{self, Aftermath, PortGrant};

mod support;

use support::{call, fixture, fixture_in, fixture_of, on_fargate, sh, Mode, N};

both_modes!(
    a_command_runs_in_the_workspace_as_an_unprivileged_user,
    a_write_outside_the_workspace_fails_and_inside_succeeds,
    workspace_holds_tcp_to_egress_ports,
    a_memory_bomb_dies_and_the_sandbox_lives,
    sleep_600_is_killed_at_the_timeout,
    an_escaped_setsid_child_is_reaped,
    syscalls_that_escape_are_denied,
    each_run_has_a_private_tmp_that_goes_with_the_run,
    a_custom_profile_denies_what_it_lists_on_top_of_its_base,
    serve_starts_a_server_reachable_on_its_port,
    file_write_never_replaces_a_file_unless_approved,
    destructive_work_is_judged_by_its_effect,
);

async fn a_command_runs_in_the_workspace_as_an_unprivileged_user(mode: Mode) {
    let f = fixture_of(mode, "workspace");
    let r = sh(&f, "pwd; id -u; echo oops >&2; exit 3").await;
    assert_eq!(r["exit_code"], 3, "{r}");
    let out = r["stdout"].as_str().unwrap();
    let ws = f.runner.env.workspace().display().to_string();
    assert_eq!(out, format!("{ws}\n{}\n", f.runner.env.uid), "{r}");
    assert_eq!(r["stderr"], "oops\n");
    let py = call(&f, "python_exec", json!({"code": "print(6*7)"}), 30).await;
    assert_eq!(py["stdout"], "42\n", "{py}");
}

async fn a_write_outside_the_workspace_fails_and_inside_succeeds(mode: Mode) {
    let f = fixture_of(mode, "workspace");
    // /var/tmp is writable by every uid: only the profile stands in the way.
    let outside = PathBuf::from(format!(
        "/var/tmp/armada-outside-{}-{}.txt",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let write_outside = format!("echo x > {}", outside.display());
    let r = sh(&f, &write_outside).await;
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(!outside.exists());
    // The same command under `off` (nothing applied) does write there.
    let off = fixture_of(mode, "off");
    let r = sh(&off, &write_outside).await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(outside.exists());
    std::fs::remove_file(&outside).unwrap();
    let r = sh(&f, "echo hi > /etc/armada-test && echo wrote").await;
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(!std::path::Path::new("/etc/armada-test").exists());
    let w = call(
        &f,
        "file_write",
        json!({"path": "src/a.txt", "content": "hello"}),
        30,
    )
    .await;
    assert_eq!(w["bytes"], 5, "{w}");
    let r = call(&f, "file_read", json!({"path": "src/a.txt"}), 30).await;
    assert_eq!(r["content"], "hello", "{r}");
    let denied = call(
        &f,
        "file_write",
        json!({"path": "/etc/armada-test", "content": "x"}),
        30,
    )
    .await;
    assert_eq!(denied["error"]["code"], "DENIED", "{denied}");
    let missing = call(&f, "file_read", json!({"path": "nope.txt"}), 30).await;
    assert_eq!(missing["error"]["code"], "NOT_FOUND", "{missing}");
}

mod strict_cannot_read_outside_the_workspace_while_workspace_can {
    #[tokio::test]
    async fn local() {
        super::strict_cannot_read_outside_the_workspace_while_workspace_can(super::Mode::Local)
            .await
    }

    /// Strict restricts the network: on Fargate its tier's task has none.
    #[test]
    fn fargate() {
        super::on_fargate(true, || {
            super::strict_cannot_read_outside_the_workspace_while_workspace_can(
                super::Mode::Fargate,
            )
        })
    }
}

async fn strict_cannot_read_outside_the_workspace_while_workspace_can(mode: Mode) {
    let strict = fixture_of(mode, "strict");
    let ws = fixture_of(mode, "workspace");
    let secret = PathBuf::from(format!(
        "/var/tmp/armada-readable-{}-{:?}.txt",
        std::process::id(),
        mode
    ));
    std::fs::write(&secret, "visible to all uids").unwrap();
    let path = json!({ "path": secret.display().to_string() });
    let w = call(&ws, "file_read", path.clone(), 30).await;
    assert_eq!(w["content"], "visible to all uids", "{w}");
    let s = call(&strict, "file_read", path, 30).await;
    assert_eq!(s["error"]["code"], "DENIED", "{s}");
    let s = sh(&strict, &format!("cat {}", secret.display())).await;
    assert_ne!(s["exit_code"], 0, "{s}");
    // Strict is strict about reading, not writing: the workspace is writable.
    let w = sh(&strict, "echo ok > mine.txt && cat mine.txt").await;
    assert_eq!(w["stdout"], "ok\n", "{w}");
    std::fs::remove_file(&secret).unwrap();
}

fn connect_code(port: u16) -> String {
    format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)\n"
    )
}

/// A profile that restricts the network reaches nothing outside: locally
/// each call has a network namespace of its own; on Fargate its tier's
/// task does (`ARMADA_SANDBOX_TASK_NETWORK=isolated`), and the call none.
async fn restrict_network_makes_connects_fail(mode: Mode, port: u16) {
    let ro = fixture_of(mode, "read-only");
    let r = call(
        &ro,
        "python_exec",
        json!({ "code": connect_code(port) }),
        30,
    )
    .await;
    assert!(r["stdout"].as_str().unwrap().starts_with("refused"), "{r}");
    let probe = ro
        .runner
        .run(armada_sandbox::call::Call::probe())
        .await
        .unwrap();
    use armada_domain::sandbox::controls::Enforcement;
    use armada_sandbox::jail::Step;
    assert_eq!(probe.report.status(Step::Network), Enforcement::Enforced);
    let per_task = probe.report.detail(Step::Network).starts_with("per task");
    assert_eq!(per_task, mode == Mode::Fargate, "{:?}", probe.report);
}

mod restrict_network_makes_connects_fail {
    #[tokio::test]
    async fn local() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        super::restrict_network_makes_connects_fail(super::Mode::Local, port).await;
    }

    #[test]
    fn fargate() {
        // Bound outside the task's network: the world the task has no way to.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        super::on_fargate(true, || {
            super::restrict_network_makes_connects_fail(super::Mode::Fargate, port)
        });
    }
}

/// On Fargate a task whose tier has no egress is not told so where it has
/// egress: there the profile cannot hold and the sandbox fails closed.
#[test]
fn on_fargate_restrict_network_without_an_isolated_task_is_refused() {
    on_fargate(false, || async {
        let ro = fixture_of(Mode::Fargate, "read-only");
        let r = sh(&ro, "echo ran").await;
        assert_eq!(r["error"]["code"], "DENIED", "{r}");
        assert!(r["stdout"].as_str().unwrap_or_default().is_empty(), "{r}");
    });
}

async fn workspace_holds_tcp_to_egress_ports(mode: Mode) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    if mode == Mode::Local {
        return a_call_has_a_loopback_of_its_own_and_a_guarded_way_out(listener).await;
    }
    let connect = connect_code(port);
    // Workspace does not restrict the network, but TCP goes only to the
    // egress ports (443 here): the listener's port is not one of them.
    let ws = fixture_of(mode, "workspace");
    let r = call(&ws, "python_exec", json!({ "code": connect }), 30).await;
    assert!(r["stdout"].as_str().unwrap().starts_with("refused"), "{r}");
    // With the port allowed, the same connect goes through.
    let mut open = fixture_of(mode, "workspace");
    open.runner.env.egress_ports = vec![port];
    let r = call(&open, "python_exec", json!({ "code": connect }), 30).await;
    assert_eq!(r["stdout"], "connected\n", "{r}");
}

/// Python that asks the call's egress proxy for `127.0.0.1:port` and
/// prints the proxy's status line, then what the target sent, if anything.
fn via_proxy(port: u16) -> String {
    r#"import os, socket
print(os.environ.get('HTTPS_PROXY'))
s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
s.sendall(b'CONNECT 127.0.0.1:PORT HTTP/1.1\r\nHost: x\r\n\r\n')
got = b''
while b'hello' not in got:
    chunk = s.recv(100)
    if not chunk:
        break
    got += chunk
print(got.split(b'\r\n')[0].decode())
print('hello' in got.decode())
"#
    .replace("PORT", &port.to_string())
}

/// Locally a call has a network namespace of its own: the host's loopback
/// (where the emulator listens) is not its own, even on an egress port,
/// and its way out is the egress proxy, which refuses what is not public
/// unless the operator listed it.
async fn a_call_has_a_loopback_of_its_own_and_a_guarded_way_out(listener: std::net::TcpListener) {
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let _ = std::io::Write::write_all(&mut conn, b"hello");
        }
    });
    let mut direct = fixture_of(Mode::Local, "workspace");
    direct.runner.env.egress_ports = vec![port];
    let r = call(
        &direct,
        "python_exec",
        json!({ "code": connect_code(port) }),
        30,
    )
    .await;
    assert!(
        r["stdout"].as_str().unwrap().starts_with("refused"),
        "the host's loopback is out of reach: {r}"
    );
    assert!(
        r.get("reaped_processes").is_none(),
        "the relay is no leftover: {r}"
    );
    let r = call(
        &direct,
        "python_exec",
        json!({ "code": via_proxy(port) }),
        30,
    )
    .await;
    assert_eq!(
        r["stdout"], "http://127.0.0.1:3128\nHTTP/1.1 403 Forbidden\nFalse\n",
        "loopback is not public: {r}"
    );
    let mut listed = fixture_of(Mode::Local, "workspace");
    listed.runner.env.egress_allow = vec![format!("127.0.0.1:{port}")];
    let r = call(
        &listed,
        "python_exec",
        json!({ "code": via_proxy(port) }),
        30,
    )
    .await;
    assert_eq!(
        r["stdout"], "http://127.0.0.1:3128\nHTTP/1.1 200 Connection established\nTrue\n",
        "an operator-listed target is reached through the proxy: {r}"
    );
}

/// Locally the call's cgroup kills it (OOM, and the sandbox is destroyed);
/// on Fargate the call's RLIMIT_AS makes its allocations fail first (or,
/// failing that, the task's OOM killer takes the call, reported OOM).
async fn a_memory_bomb_dies_and_the_sandbox_lives(mode: Mode) {
    let f = fixture_in(mode, "workspace", &Profiles::default(), 128);
    let bomb = "a = []\nwhile True:\n    a.append(bytearray(8 * 1024 * 1024))\n";
    let answer = skills::invoke(
        &f.runner,
        "python_exec",
        &json!({ "code": bomb }),
        "run_1",
        60,
        false,
    )
    .await;
    let r = &answer.result;
    if mode == Mode::Local || r["error"]["code"] == "OOM" {
        assert_eq!(r["error"]["code"], "OOM", "{r}");
        assert_eq!(answer.aftermath, Aftermath::Destroy);
    } else {
        assert_eq!(r["exit_code"], 1, "{r}");
        assert!(r["stderr"].as_str().unwrap().contains("MemoryError"), "{r}");
    }
    // The sandbox's own group survived its call's OOM.
    let after = sh(&f, "echo alive").await;
    assert_eq!(after["stdout"], "alive\n");
}

async fn sleep_600_is_killed_at_the_timeout(mode: Mode) {
    let f = fixture_of(mode, "workspace");
    let started = Instant::now();
    let answer = skills::invoke(
        &f.runner,
        "shell_exec",
        &json!({"command": "echo before; sleep 600", "timeout_s": 2}),
        "run_1",
        30,
        false,
    )
    .await;
    assert_eq!(
        answer.result["error"]["code"], "TIMEOUT",
        "{}",
        answer.result
    );
    assert_eq!(answer.result["stdout"], "before\n");
    assert_eq!(answer.aftermath, Aftermath::Destroy);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(f.leftovers().is_empty(), "nothing of the call survives");
}

async fn an_escaped_setsid_child_is_reaped(mode: Mode) {
    let f = fixture_of(mode, "workspace");
    let r = sh(
        &f,
        "setsid sh -c 'sleep 300' </dev/null >/dev/null 2>&1 & echo started",
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    // The escaped shell, and its sleep if it had forked yet.
    assert!(r["reaped_processes"].as_u64().unwrap_or(0) >= 1, "{r}");
    assert!(f.leftovers().is_empty(), "the escaped child is gone");
}

async fn syscalls_that_escape_are_denied(mode: Mode) {
    let f = fixture_of(mode, "workspace");
    let r = sh(
        &f,
        "unshare -U -r true && echo escaped; unshare -n true && echo escaped2; true",
    )
    .await;
    assert!(!r["stdout"].as_str().unwrap().contains("escaped"), "{r}");
}

/// Locally /tmp is the Run's own (a mount); on Fargate `$TMPDIR` is, and
/// /tmp (read-only there) is not the call's to write.
async fn each_run_has_a_private_tmp_that_goes_with_the_run(mode: Mode) {
    let f = fixture_of(mode, "workspace");
    let a = skills::invoke(
        &f.runner,
        "shell_exec",
        &json!({"command": "echo a > \"$TMPDIR/mine\" && ls \"$TMPDIR\""}),
        "run_a",
        30,
        false,
    )
    .await
    .result;
    assert_eq!(a["stdout"], "mine\n", "{a}");
    let b = skills::invoke(
        &f.runner,
        "shell_exec",
        &json!({"command": "ls \"$TMPDIR\" | wc -l"}),
        "run_b",
        30,
        false,
    )
    .await
    .result;
    assert_eq!(b["stdout"], "0\n", "{b}");
    assert!(f.runner.env.scratch("run_a").join("mine").exists());
    let own_tmp = sh(&f, "echo x > /tmp/armada-shared-tmp && echo wrote").await;
    match mode {
        Mode::Local => assert_eq!(own_tmp["stdout"], "wrote\n", "{own_tmp}"),
        Mode::Fargate => assert_ne!(own_tmp["exit_code"], 0, "{own_tmp}"),
    }
    assert!(!std::path::Path::new("/tmp/armada-shared-tmp").exists());
    f.runner.env.drop_scratch("run_a").unwrap();
    assert!(!f.runner.env.scratch("run_a").exists());
}

async fn a_custom_profile_denies_what_it_lists_on_top_of_its_base(mode: Mode) {
    let hidden = PathBuf::from(format!(
        "/var/tmp/armada-hidden-{}-{mode:?}",
        std::process::id()
    ));
    std::fs::create_dir_all(&hidden).unwrap();
    std::fs::write(hidden.join("f"), "secret").unwrap();
    let profiles = Profiles::load(
        [(
            "locked".to_string(),
            ProfileDef {
                deny: vec![hidden.display().to_string()],
                ..ProfileDef::default()
            },
        )]
        .into(),
        Default::default(),
    )
    .unwrap();
    let f = fixture_in(mode, "locked", &profiles, 256);
    let r = sh(&f, &format!("cat {}/f", hidden.display())).await;
    assert_ne!(r["exit_code"], 0, "{r}");
    let ws = fixture_of(mode, "workspace");
    let r = sh(&ws, &format!("cat {}/f", hidden.display())).await;
    assert_eq!(r["stdout"], "secret", "{r}");
    std::fs::remove_dir_all(&hidden).unwrap();
}

async fn serve_starts_a_server_reachable_on_its_port(mode: Mode) {
    let f = fixture_of(mode, "workspace");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let grant = PortGrant {
        container: 8081,
        bind: port,
        url: format!("http://127.0.0.1:{port}"),
    };
    std::fs::write(f.runner.env.workspace().join("index.html"), "served").unwrap();
    let (answer, detached) = skills::serve(
        &f.runner,
        &json!({"command": "exec python3 -m http.server $PORT --bind 127.0.0.1"}),
        "run_1",
        &grant,
        30,
    )
    .await
    .unwrap();
    assert_eq!(answer.result["url"], grant.url);
    let body = reqwest_get(&format!("{}/index.html", grant.url)).await;
    assert_eq!(body, "served");
    // A call after it leaves the server running (it is not a leftover).
    let r = sh(&f, "echo next").await;
    assert_eq!(r["stdout"], "next\n", "{r}");
    let body = reqwest_get(&format!("{}/index.html", grant.url)).await;
    assert_eq!(body, "served");
    match detached.cgroup {
        Some(cg) => cg.destroy().unwrap(),
        None => {
            armada_sandbox::runner::kill_strays(f.runner.env.uid, &[]);
        }
    }
}

async fn reqwest_get(url: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let (hostport, path) = addr.split_once('/').unwrap();
    let mut s = tokio::net::TcpStream::connect(hostport).await.unwrap();
    s.write_all(format!("GET /{path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_string()
}

#[tokio::test]
async fn only_declared_mounts_of_the_data_root_are_visible_and_ro_stays_ro() {
    use armada_domain::sandbox::MountMode;
    use armada_domain::skills::MountDecl;
    let mut f = fixture("workspace");
    let data = f.runner.env.data_root.clone();
    let repo = data.join("users/u1/workspace/repo");
    let other = data.join("users/u2/workspace");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(repo.join("README"), "the repo").unwrap();
    std::fs::write(other.join("secret"), "u2's").unwrap();
    for d in [&data, &repo, &other] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let r = sh(&f, &format!("cat {}/README", repo.display())).await;
    assert_ne!(r["exit_code"], 0, "zero mounts by default: {r}");
    f.runner.env.mounts = vec![MountDecl {
        path: "/data/users/u1/workspace/repo".into(),
        mode: MountMode::Ro,
    }];
    let r = sh(&f, &format!("cat {}/README", repo.display())).await;
    assert_eq!(r["stdout"], "the repo", "{r}");
    let r = sh(&f, &format!("echo x > {}/new", repo.display())).await;
    assert_ne!(r["exit_code"], 0, "read-only: {r}");
    let r = sh(&f, &format!("cat {}/secret", other.display())).await;
    assert_ne!(r["exit_code"], 0, "another user's data stays hidden: {r}");
    let r = sh(&f, &format!("ls {}", data.display())).await;
    assert_eq!(r["stdout"], "users\n", "nothing else of /data shows: {r}");
}

async fn file_write_never_replaces_a_file_unless_approved(mode: Mode) {
    let f = fixture_of(mode, "workspace");
    let write = |content: &str, approved: bool| {
        let args = json!({"path": "notes/a.txt", "content": content});
        let runner = &f.runner;
        async move {
            skills::invoke(runner, "file_write", &args, "run_1", 30, approved)
                .await
                .result
        }
    };
    assert_eq!(write("one", false).await["bytes"], 3);
    // The same content again changes nothing: it is written.
    assert_eq!(write("one", false).await["bytes"], 3);
    let refused = write("two", false).await;
    assert_eq!(refused["error"]["code"], "APPROVAL_REQUIRED", "{refused}");
    let read = call(&f, "file_read", json!({"path": "notes/a.txt"}), 30).await;
    assert_eq!(read["content"], "one", "nothing was lost");
    assert_eq!(write("two", true).await["bytes"], 3);
    let read = call(&f, "file_read", json!({"path": "notes/a.txt"}), 30).await;
    assert_eq!(read["content"], "two");
}

/// Runs `skill` under call id `id` as the agent runs every call of a Run
/// whose agent judges destructive work by effect: unapproved, its changes
/// are judged; approved, what was held for it is applied.
async fn as_agent(
    f: &support::Fixture,
    skill: &str,
    args: serde_json::Value,
    id: &str,
    approved: bool,
) -> serde_json::Value {
    let key = armada_sandbox::effects::held_key("run_1", id);
    let j = skills::Judged {
        key: Some(&key),
        approved,
    };
    skills::invoke_judged(&f.runner, skill, &args, "run_1", 30, j, None)
        .await
        .result
}

async fn judged(
    f: &support::Fixture,
    skill: &str,
    args: serde_json::Value,
    id: &str,
) -> serde_json::Value {
    as_agent(f, skill, args, id, false).await
}

async fn approved(
    f: &support::Fixture,
    skill: &str,
    args: serde_json::Value,
    id: &str,
) -> serde_json::Value {
    as_agent(f, skill, args, id, true).await
}

/// Every way past a list of command words (issue 19) deletes, truncates or
/// rewrites what the workspace held: none of them changes it unapproved.
/// Locally the changes are held and applied once approved; as on Fargate
/// (no overlay), Landlock denies them and the failed call asks for an
/// approval. A call that only creates files goes through.
async fn destructive_work_is_judged_by_its_effect(mode: Mode) {
    let f = fixture_of(mode, "workspace");
    let ws = f.runner.env.workspace();
    let seed = |ws: &std::path::Path| {
        let _ = std::fs::remove_dir_all(ws.join("build"));
        std::fs::create_dir_all(ws.join("build/sub")).unwrap();
        std::fs::write(ws.join("build/sub/out.o"), "object").unwrap();
        std::fs::write(ws.join("existing.txt"), "keep me").unwrap();
        for p in ["build", "build/sub", "build/sub/out.o", "existing.txt"] {
            std::os::unix::fs::chown(ws.join(p), Some(f.runner.env.uid), Some(f.runner.env.gid))
                .unwrap();
        }
    };
    let shells = [
        "bash -c \"rm -rf build\"",
        "\\rm -rf build",
        "{ rm -rf build; }",
        "find build -exec rm -rf {} +",
        "rm --recur -f build",
        "timeout 5 rm -rf build",
        "R=rm; $R -rf build",
        "echo x > existing.txt",
        "mv build/sub/out.o existing.txt",
    ];
    let mut cases: Vec<(String, serde_json::Value)> = shells
        .iter()
        .map(|c| ("shell_exec".to_string(), json!({"command": c})))
        .collect();
    cases.push((
        "python_exec".into(),
        json!({"code": "import shutil\nshutil.rmtree('build')"}),
    ));
    for (i, (skill, args)) in cases.iter().enumerate() {
        seed(&ws);
        let id = format!("c{i}");
        let r = judged(&f, skill, args.clone(), &id).await;
        assert_eq!(r["error"]["code"], "APPROVAL_REQUIRED", "{args}: {r}");
        assert_eq!(
            std::fs::read_to_string(ws.join("build/sub/out.o")).unwrap(),
            "object",
            "{args}: nothing deleted before the approval"
        );
        assert_eq!(
            std::fs::read_to_string(ws.join("existing.txt")).unwrap(),
            "keep me",
            "{args}: nothing rewritten before the approval"
        );
        if mode == Mode::Local {
            let message = r["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("build") || message.contains("existing.txt"),
                "{args}: the approval lists what changes: {message}"
            );
        }
    }
    // Approved, what was held is applied (locally) or the call runs again
    // with removal allowed (as on Fargate): either way the build is gone.
    seed(&ws);
    let rm = json!({"command": "rm -rf build && echo removed"});
    let r = judged(&f, "shell_exec", rm.clone(), "rm").await;
    assert_eq!(r["error"]["code"], "APPROVAL_REQUIRED", "{r}");
    if mode == Mode::Local {
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("deletes build (6 bytes)"),
            "{r}"
        );
    }
    let r = approved(&f, "shell_exec", rm, "rm").await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "removed\n", "{r}");
    assert!(!ws.join("build").exists(), "the approved deletion happened");
    // A call that only creates files goes through.
    let r = judged(
        &f,
        "shell_exec",
        json!({"command": "mkdir -p out/deep && echo two > out/deep/a && ln -s a out/deep/l"}),
        "create",
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(
        std::fs::read_to_string(ws.join("out/deep/a")).unwrap(),
        "two\n"
    );
    assert_eq!(
        std::fs::read_link(ws.join("out/deep/l")).unwrap(),
        PathBuf::from("a")
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(ws.join("out/deep/a")).unwrap().uid(),
        f.runner.env.uid,
        "created files are the sandbox's"
    );
    // Rewriting a file it made in an earlier call is a change: judged.
    let r = judged(
        &f,
        "shell_exec",
        json!({"command": "echo three > out/deep/a"}),
        "again",
    )
    .await;
    assert_eq!(r["error"]["code"], "APPROVAL_REQUIRED", "{r}");
    assert_eq!(
        std::fs::read_to_string(ws.join("out/deep/a")).unwrap(),
        "two\n"
    );
}

/// A declared mount is a bind mount in the call's own namespace: on
/// Fargate, where a call gets none, a sandbox with one fails closed.
#[test]
fn on_fargate_declared_mounts_are_refused() {
    use armada_domain::sandbox::MountMode;
    use armada_domain::skills::MountDecl;
    on_fargate(false, || async {
        let mut f = fixture_of(Mode::Fargate, "workspace");
        std::fs::create_dir_all(f.runner.env.data_root.join("users/u1/workspace/repo")).unwrap();
        f.runner.env.mounts = vec![MountDecl {
            path: "/data/users/u1/workspace/repo".into(),
            mode: MountMode::Ro,
        }];
        let r = sh(&f, "echo ran").await;
        assert_eq!(r["error"]["code"], "DENIED", "{r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("declared mounts"),
            "{r}"
        );
    });
}

/// What the jail reports on Fargate: per call became per task, and says so.
#[test]
fn on_fargate_the_jail_reports_partial_where_per_call_became_per_task() {
    use armada_domain::sandbox::controls::Enforcement::{Enforced, NotEnforced, Partial};
    use armada_sandbox::jail::Step;
    on_fargate(false, || async {
        let f = fixture_of(Mode::Fargate, "workspace");
        let run = f
            .runner
            .run(armada_sandbox::call::Call::probe())
            .await
            .unwrap();
        let r = &run.report;
        assert_eq!(run.refused(), None, "{r:?}");
        for (step, want) in [
            (Step::Filesystem, Enforced),
            (Step::Uid, Enforced),
            (Step::Syscalls, Enforced),
            (Step::Tcp, Enforced),
            (Step::Mounts, Partial),
            (Step::Cgroups, Partial),
            (Step::Processes, NotEnforced),
        ] {
            assert_eq!(r.status(step), want, "{step:?}: {r:?}");
        }
        assert!(r.detail(Step::Cgroups).contains("RLIMIT_AS"), "{r:?}");
        assert!(r.detail(Step::Mounts).contains("$TMPDIR"), "{r:?}");
    });
}
