//! Real skills in real confined processes: each test builds a sandbox the
//! way the data plane does (a directory tree, an unprivileged uid, a cgroup
//! with the task's limits) and runs calls through the jail binary.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;

use armada_domain::sandbox::{ProfileDef, Profiles};
use armada_sandbox::skills::{self, Aftermath, PortGrant};

mod support;

use support::{call, fixture, fixture_with, sh, N};

#[tokio::test]
async fn a_command_runs_in_the_workspace_as_an_unprivileged_user() {
    let f = fixture("workspace");
    let r = sh(&f, "pwd; id -u; echo oops >&2; exit 3").await;
    assert_eq!(r["exit_code"], 3, "{r}");
    let out = r["stdout"].as_str().unwrap();
    let ws = f.runner.env.workspace().display().to_string();
    assert_eq!(out, format!("{ws}\n{}\n", f.runner.env.uid), "{r}");
    assert_eq!(r["stderr"], "oops\n");
    let py = call(&f, "python_exec", json!({"code": "print(6*7)"}), 30).await;
    assert_eq!(py["stdout"], "42\n", "{py}");
}

#[tokio::test]
async fn a_write_outside_the_workspace_fails_and_inside_succeeds() {
    let f = fixture("workspace");
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
    let off = fixture("off");
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

#[tokio::test]
async fn strict_cannot_read_outside_the_workspace_while_workspace_can() {
    let strict = fixture("strict");
    let ws = fixture("workspace");
    let secret = PathBuf::from(format!(
        "/var/tmp/armada-readable-{}.txt",
        std::process::id()
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

#[tokio::test]
async fn restrict_network_makes_connects_fail_and_workspace_holds_tcp_to_egress_ports() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)\n"
    );
    let ro = fixture("read-only");
    let r = call(&ro, "python_exec", json!({ "code": connect }), 30).await;
    assert!(r["stdout"].as_str().unwrap().starts_with("refused"), "{r}");
    // Workspace does not restrict the network, but TCP goes only to the
    // egress ports (443 here): the listener's port is not one of them.
    let ws = fixture("workspace");
    let r = call(&ws, "python_exec", json!({ "code": connect }), 30).await;
    assert!(r["stdout"].as_str().unwrap().starts_with("refused"), "{r}");
    // With the port allowed, the same connect goes through.
    let mut open = fixture("workspace");
    open.runner.env.egress_ports = vec![port];
    let r = call(&open, "python_exec", json!({ "code": connect }), 30).await;
    assert_eq!(r["stdout"], "connected\n", "{r}");
}

#[tokio::test]
async fn a_memory_bomb_is_killed_and_reported_as_oom() {
    let f = fixture_with("workspace", &Profiles::default(), 128);
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
    assert_eq!(answer.result["error"]["code"], "OOM", "{}", answer.result);
    assert_eq!(answer.aftermath, Aftermath::Destroy);
    // The sandbox's own group survived its call's OOM.
    let after = sh(&f, "echo alive").await;
    assert_eq!(after["stdout"], "alive\n");
}

#[tokio::test]
async fn sleep_600_is_killed_at_the_timeout() {
    let f = fixture("workspace");
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
    assert!(
        f.cgroup.all_procs().is_empty(),
        "nothing of the call survives"
    );
}

#[tokio::test]
async fn an_escaped_setsid_child_is_reaped() {
    let f = fixture("workspace");
    let r = sh(
        &f,
        "setsid sh -c 'sleep 300' </dev/null >/dev/null 2>&1 & echo started",
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    // The escaped shell, and its sleep if it had forked yet.
    assert!(r["reaped_processes"].as_u64().unwrap_or(0) >= 1, "{r}");
    assert!(f.cgroup.all_procs().is_empty(), "the escaped child is gone");
}

#[tokio::test]
async fn syscalls_that_escape_are_denied() {
    let f = fixture("workspace");
    let r = sh(
        &f,
        "unshare -U -r true && echo escaped; unshare -n true && echo escaped2; true",
    )
    .await;
    assert!(!r["stdout"].as_str().unwrap().contains("escaped"), "{r}");
}

#[tokio::test]
async fn each_run_has_a_private_tmp_that_goes_with_the_run() {
    let f = fixture("workspace");
    let a = skills::invoke(
        &f.runner,
        "shell_exec",
        &json!({"command": "echo a > /tmp/mine && ls /tmp"}),
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
        &json!({"command": "ls /tmp | wc -l"}),
        "run_b",
        30,
        false,
    )
    .await
    .result;
    assert_eq!(b["stdout"], "0\n", "{b}");
    assert!(f.runner.env.scratch("run_a").join("mine").exists());
    f.runner.env.drop_scratch("run_a").unwrap();
    assert!(!f.runner.env.scratch("run_a").exists());
}

#[tokio::test]
async fn a_custom_profile_denies_what_it_lists_on_top_of_its_base() {
    let hidden = PathBuf::from(format!("/var/tmp/armada-hidden-{}", std::process::id()));
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
    let f = fixture_with("locked", &profiles, 256);
    let r = sh(&f, &format!("cat {}/f", hidden.display())).await;
    assert_ne!(r["exit_code"], 0, "{r}");
    let ws = fixture("workspace");
    let r = sh(&ws, &format!("cat {}/f", hidden.display())).await;
    assert_eq!(r["stdout"], "secret", "{r}");
    std::fs::remove_dir_all(&hidden).unwrap();
}

#[tokio::test]
async fn serve_starts_a_server_reachable_on_its_port() {
    let f = fixture("workspace");
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
    detached.cgroup.unwrap().destroy().unwrap();
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

#[tokio::test]
async fn file_write_never_replaces_a_file_unless_approved() {
    let f = fixture("workspace");
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
