//! Sandboxes on the local stack: the harness asks ECS (the emulator's) for
//! a task, the local data plane runs the task's agent as a confined local
//! process, and real skills run in it. Each test drives the HTTP API and
//! looks at what a user would: Runs, their events, the sandbox API, ECS
//! tasks and files on disk.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use armada_cli::client::Client;
use armada_cli::local::dataplane::DataPlaneMode;
use armada_domain::agent::AgentDefinition;
use armada_domain::sandbox::hand::{HandMessage, Invocation};
use armada_domain::skills::MountDecl;
use armada_tests::sandbox::*;
use armada_tests::{dataplane_mode, error_code, error_message, outcome, RunView};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coder_runs_a_command_in_its_own_sandbox() {
    let t = start().await;
    let (run_id, run) = t.ask("coder", &sh("echo hi; id -u")).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let r = tool_result(&run, "shell_exec");
    assert_eq!(r["exit_code"], 0, "{r}");
    let mut lines = r["stdout"].as_str().unwrap().lines();
    assert_eq!(lines.next(), Some("hi"));
    let uid: u32 = lines.next().unwrap().parse().unwrap();
    assert!(
        uid >= 300_000,
        "runs as the sandbox's own uid, not root: {uid}"
    );
    let types = t.event_types(&run_id).await;
    assert!(types.contains(&"tool_dispatched".to_string()), "{types:?}");
    let sb = sandbox_of(&t.client, "coder").await;
    assert_eq!(sb.state, SandboxState::Ready, "{sb:?}");
    assert_eq!(sb.profile, "workspace");
    assert!(sb.task_arn.as_deref().unwrap().contains(":task/"), "{sb:?}");
    for control in [
        "filesystem",
        "network",
        "syscalls",
        "memory",
        "cpu",
        "pids",
        "mounts",
    ] {
        let c = &sb.controls.as_ref().expect("controls")[control];
        assert!(
            c["status"].is_string() && c["reason"].is_string(),
            "{control}: {sb:?}"
        );
    }
    // Per call locally; memory, pids and mounts per task on Fargate.
    let per_task = dataplane_mode() == DataPlaneMode::Fargate;
    for control in ["filesystem", "syscalls", "memory", "pids", "mounts"] {
        let want = match control {
            "memory" | "pids" | "mounts" if per_task => "partial",
            _ => "enforced",
        };
        assert_eq!(
            sb.controls.as_ref().expect("controls")[control]["status"],
            want,
            "{control}: {sb:?}"
        );
    }
    // Workspace does not restrict the network: only TCP ports are held.
    assert_eq!(
        sb.controls.as_ref().expect("controls")["network"]["status"],
        "partial",
        "{sb:?}"
    );
    // Files stay in the workspace between Runs of the agent.
    let (_, run) = t
        .ask(
            "coder",
            r#"/tool file_write {"path": "notes/a.txt", "content": "kept"}"#,
        )
        .await;
    assert_eq!(tool_result(&run, "file_write")["bytes"], 4);
    let (_, run) = t.ask("coder", &sh("cat notes/a.txt")).await;
    assert_eq!(tool_result(&run, "shell_exec")["stdout"], "kept");
    // The run ended: it no longer holds the sandbox, and one task served all.
    t.wait_closed(&run_id).await;
    let sb = sandbox_of(&t.client, "coder").await;
    assert!(sb.holder_run_id.is_none(), "{sb:?}");
    assert_eq!(tasks_of(&t, "local", "coder").await.len(), 1);
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chat_run_of_an_on_tool_use_agent_creates_no_task_and_eager_does() {
    let t = start().await;
    let (_, run) = t.ask("coder", "just talk to me").await;
    assert_eq!(
        run.output.as_deref().unwrap_or_default(),
        "echo: just talk to me"
    );
    let (status, body) = t
        .raw(
            Method::GET,
            "/v1/sandboxes/coder",
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(tasks_of(&t, "local", "coder").await.is_empty());
    put_agent(&t, "eager", json!({"provisioning": "eager"})).await;
    let (_, run) = t.ask("eager", "hello").await;
    assert_eq!(run.output.as_deref().unwrap_or_default(), "echo: hello");
    assert_eq!(
        tasks_of(&t, "local", "eager").await.len(),
        1,
        "eager made one before the model call"
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_of_one_agent_reuse_its_sandbox_one_at_a_time() {
    let t = start().await;
    let a = t
        .client
        .create_run("coder", &sh("sleep 2; echo A"))
        .await
        .unwrap();
    let client = &t.client;
    eventually("the first run's call is dispatched", || async {
        let v = client
            .get(&format!("/v1/runs/{a}/events?after=0"))
            .await
            .unwrap();
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "tool_dispatched")
    })
    .await;
    let b = t.client.create_run("coder", &sh("echo B")).await.unwrap();
    let run_a = t
        .client
        .wait_run(&a, Duration::from_secs(60))
        .await
        .unwrap();
    let run_b = t
        .client
        .wait_run(&b, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(tool_result(&run_a, "shell_exec")["stdout"], "A\n");
    assert_eq!(tool_result(&run_b, "shell_exec")["stdout"], "B\n");
    let types_b = t.event_types(&b).await;
    assert!(
        types_b.contains(&"sandbox_wait".to_string()),
        "the second run waited for the first: {types_b:?}"
    );
    assert_eq!(
        tasks_of(&t, "local", "coder").await.len(),
        1,
        "one sandbox served both"
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agents_and_tenants_never_share_a_sandbox_and_races_create_one() {
    let t = start().await;
    put_agent(&t, "other-coder", json!({})).await;
    let (_, mine) = t.ask("coder", &sh("id -u")).await;
    let (_, theirs) = t.ask("other-coder", &sh("id -u")).await;
    let uid = |r: &RunView| tool_result(r, "shell_exec")["stdout"].clone();
    assert_ne!(
        uid(&mine),
        uid(&theirs),
        "two agents of one user: two sandboxes"
    );
    let list = t.client.get("/v1/sandboxes").await.unwrap();
    let arns: Vec<&str> = list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["task_arn"].as_str().unwrap())
        .collect();
    assert_eq!(arns.len(), 2);
    assert_ne!(arns[0], arns[1]);
    // Another tenant's Run of the same agent gets a sandbox of its own.
    let minted = t
        .admin
        .call(Method::POST, "/v1/tenants/acme/keys", None, true)
        .await
        .unwrap();
    let acme = Client::new(&t.stack.api_url, minted["key"].as_str().unwrap(), None);
    let run_id = acme.create_run("coder", &sh("id -u")).await.unwrap();
    let acme_run = acme
        .wait_run(&run_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_ne!(uid(&acme_run), uid(&mine), "two tenants: two sandboxes");
    let acme_sb = sandbox_of(&acme, "coder").await;
    assert_eq!(acme_sb.tenant, "acme");
    assert_ne!(
        acme_sb.task_arn,
        sandbox_of(&t.client, "coder").await.task_arn
    );
    let listed = acme.get("/v1/sandboxes").await.unwrap();
    assert_eq!(
        listed["sandboxes"].as_array().unwrap().len(),
        1,
        "a tenant sees its own only"
    );
    // Four Runs racing to create one agent's sandbox create one.
    put_agent(&t, "racer", json!({})).await;
    let inputs: Vec<String> = (0..4).map(|i| sh(&format!("echo {i}"))).collect();
    let ids =
        futures::future::join_all(inputs.iter().map(|i| t.client.create_run("racer", i))).await;
    for id in ids {
        let run = t
            .client
            .wait_run(&id.unwrap(), Duration::from_secs(90))
            .await
            .unwrap();
        assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    }
    assert_eq!(
        tasks_of(&t, "local", "racer").await.len(),
        1,
        "one task for the race"
    );
    assert_eq!(sandbox_of(&t.client, "racer").await.generation, 1);
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confinement_limits_and_forced_destruction_hold_on_the_local_stack() {
    let t = start().await;
    put_agent(
        &t,
        "jailed",
        json!({"limits": {"memory_mb": 256, "call_timeout_s": 3}}),
    )
    .await;
    let outside = format!("/var/tmp/armada-outside-{}.txt", t.stack.template.stack());
    let (_, run) = t.ask("jailed", &sh(&format!("echo x > {outside}"))).await;
    assert_ne!(tool_result(&run, "shell_exec")["exit_code"], 0, "{run:?}");
    assert!(!std::path::Path::new(&outside).exists());
    let (_, run) = t
        .ask(
            "jailed",
            &sh("setsid sh -c 'sleep 300' </dev/null >/dev/null 2>&1 & echo started"),
        )
        .await;
    // The escaped shell, and its sleep if it had forked yet.
    let reaped = tool_result(&run, "shell_exec")["reaped_processes"].as_u64();
    assert!(reaped.unwrap_or(0) >= 1, "{run:?}");
    let first = sandbox_of(&t.client, "jailed").await;
    // A memory bomb is killed and reported as OOM; the sandbox is destroyed.
    // On Fargate (no cgroup per call) its RLIMIT_AS fails its allocations
    // first: it dies of MemoryError and the sandbox lives on.
    let per_task = dataplane_mode() == DataPlaneMode::Fargate;
    let (_, run) = t
        .ask(
            "jailed",
            &py("a = []\nwhile True:\n    a.append(bytearray(8 * 1024 * 1024))\n"),
        )
        .await;
    let bomb = tool_result(&run, "python_exec");
    if per_task {
        assert_eq!(bomb["exit_code"], 1, "{run:?}");
        assert!(
            bomb["stderr"].as_str().unwrap().contains("MemoryError"),
            "{run:?}"
        );
    } else {
        assert_eq!(bomb["error"]["code"], "OOM", "{run:?}");
        let client = &t.client;
        eventually("the OOM'd sandbox is destroyed", || async {
            sandbox_of(client, "jailed").await.state == SandboxState::Destroyed
        })
        .await;
        let arn = first.task_arn.clone().unwrap();
        eventually("its task is stopped", || async {
            task_status(&t, &arn).await == "STOPPED"
        })
        .await;
    }
    // `sleep 600` is killed at the call timeout; the next call gets a fresh sandbox.
    let started = std::time::Instant::now();
    let (_, run) = t.ask("jailed", &sh("sleep 600")).await;
    assert_eq!(
        tool_result(&run, "shell_exec")["error"]["code"],
        "TIMEOUT",
        "{run:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let (_, run) = t.ask("jailed", &sh("echo fresh")).await;
    assert_eq!(tool_result(&run, "shell_exec")["stdout"], "fresh\n");
    let sb = sandbox_of(&t.client, "jailed").await;
    assert_eq!(
        sb.generation,
        if per_task { 2 } else { 3 },
        "OOM and timeout each forced a new sandbox: {sb:?}"
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn profiles_decide_reads_and_network_and_a_project_cannot_weaken_a_global_one() {
    let t = start().await;
    let readable = format!("/var/tmp/armada-readable-{}.txt", t.stack.template.stack());
    std::fs::write(&readable, "anyone may read this").unwrap();
    put_agent(&t, "strictbox", json!({"profile": "strict"})).await;
    let (_, run) = t.ask("coder", &sh(&format!("cat {readable}"))).await;
    assert_eq!(
        tool_result(&run, "shell_exec")["stdout"],
        "anyone may read this",
        "workspace reads outside its workspace"
    );
    let (_, run) = t.ask("strictbox", &sh(&format!("cat {readable}"))).await;
    assert_ne!(
        tool_result(&run, "shell_exec")["exit_code"],
        0,
        "strict does not: {run:?}"
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n    print('connected')\nexcept OSError as e:\n    print('refused')\n"
    );
    let (_, run) = t.ask("strictbox", &py(&connect)).await;
    assert_eq!(
        tool_result(&run, "python_exec")["stdout"],
        "refused\n",
        "{run:?}"
    );
    let sb = sandbox_of(&t.client, "strictbox").await;
    assert_eq!(
        sb.controls.as_ref().expect("controls")["network"]["status"],
        "enforced",
        "{sb:?}"
    );
    // A global profile, and an agent whose project defines the same name, weaker.
    t.admin
        .call(
            Method::PUT,
            "/v1/profiles/team",
            Some(&json!({"extends": "strict", "restrict_network": true})),
            true,
        )
        .await
        .unwrap();
    let def = put_agent(
        &t,
        "teamwork",
        json!({"profile": "team", "profiles": {"team": {"extends": "devbox"}}}),
    )
    .await;
    assert_eq!(def["shadowed_profiles"], json!(["team"]), "{def}");
    let (_, run) = t.ask("teamwork", &sh(&format!("cat {readable}"))).await;
    assert_ne!(
        tool_result(&run, "shell_exec")["exit_code"],
        0,
        "the global (strict) definition holds: {run:?}"
    );
    let (_, run) = t.ask("teamwork", &py(&connect)).await;
    assert_eq!(tool_result(&run, "python_exec")["stdout"], "refused\n");
    std::fs::remove_file(&readable).unwrap();
    drop(listener);
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forbidden_mount_is_refused_and_a_rw_mount_needs_approval() {
    let t = start().await;
    let (status, body) = t
        .raw(
            Method::PUT,
            "/v1/agents/mounty",
            Some(&t.stack.admin_key),
            Some(
                &json!({
                    "model": {"provider": "scripted", "model_id": "m", "context_window": 4096},
                    "system_prompt": "x",
                    "skills": ["shell_exec"],
                    "sandbox": {"user": "u1", "mounts": [{"path": "/etc", "mode": "ro"}]}
                })
                .to_string(),
            ),
            &[],
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(error_code(&body).as_deref(), Some("INVALID_FIELD"));
    assert!(error_message(&body).contains("sandbox.mounts[0]"), "{body}");
    // A definition that got past the API (edited in the registry) still
    // cannot start: the sandbox refuses at start and the Run fails closed.
    let mut def = AgentDefinition::from_json(
        "smuggled",
        &json!({
            "model": {"provider": "scripted", "model_id": "m", "context_window": 4096},
            "system_prompt": "x",
            "skills": ["shell_exec"],
            "sandbox": {"user": "u1"}
        }),
    )
    .unwrap();
    def.sandbox.mounts.push(MountDecl {
        path: "/var/run/docker.sock".into(),
        mode: armada_domain::sandbox::MountMode::Rw,
    });
    t.stack.svc.registry.put_agent(&def).await.unwrap();
    let (_, run) = t.ask("smuggled", &sh("echo should not run")).await;
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "SANDBOX_UNAVAILABLE",
        "{run:?}"
    );
    let sb = sandbox_of(&t.client, "smuggled").await;
    assert_eq!(sb.state, SandboxState::Failed);
    assert!(
        sb.failure.as_deref().unwrap().contains("refused at start"),
        "{sb:?}"
    );
    // A read-write sub-path of the user's workspace makes calls destructive.
    put_agent(
        &t,
        "writer",
        json!({"user": "u1", "mounts": [{"path": "/data/users/u1/workspace/repo", "mode": "rw"}]}),
    )
    .await;
    let id = t
        .client
        .create_run("writer", &sh("rm -rf repo"))
        .await
        .unwrap();
    let client = &t.client;
    eventually("the run pauses for approval", || async {
        client.get(&format!("/v1/runs/{id}")).await.unwrap()["state"] == "AWAITING_HITL"
    })
    .await;
    assert!(t
        .event_types(&id)
        .await
        .contains(&"approval_requested".to_string()));
    assert!(
        tasks_of(&t, "local", "writer").await.is_empty(),
        "nothing ran"
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_an_agent_leaves_no_task_or_files_and_admins_destroy_sandboxes() {
    let t = start().await;
    put_agent(&t, "temp", json!({})).await;
    let (_, run) = t.ask("temp", &sh("echo data > kept.txt && ls")).await;
    assert_eq!(tool_result(&run, "shell_exec")["stdout"], "kept.txt\n");
    let arn = sandbox_of(&t.client, "temp").await.task_arn.unwrap();
    let dir = task_dir(&t, &arn);
    // The workspace is the sandbox's own size-limited filesystem (mounted
    // in the agent's mount namespace): its image is what the host sees. On
    // Fargate the agent may not mount: the task's storage is the cap.
    let image = dir.join("sandbox/workspace.img").exists();
    assert_eq!(image, dataplane_mode() == DataPlaneMode::Local);
    let deleted = t
        .admin
        .call(Method::DELETE, "/v1/agents/temp", None, true)
        .await
        .unwrap();
    assert_eq!(deleted["sandboxes_destroyed"], json!(["local"]));
    eventually("the task is stopped", || async {
        task_status(&t, &arn).await == "STOPPED"
    })
    .await;
    eventually("its files are gone", || async { !dir.exists() }).await;
    let (status, _) = t
        .raw(
            Method::GET,
            "/v1/sandboxes/temp",
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 404);
    // Destroying is for admins, who name the tenant.
    t.ask("coder", &sh("true")).await;
    let (status, _) = t
        .raw(
            Method::DELETE,
            "/v1/sandboxes/coder",
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 403);
    let (status, _) = t
        .raw(
            Method::DELETE,
            "/v1/sandboxes/coder",
            Some(&t.stack.admin_key),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 400);
    let gone = destroy_sandbox(&t, "local", "coder").await;
    assert_eq!(gone["state"], "DESTROYED", "{gone}");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_sent_another_tenants_call_is_destroyed_and_it_is_recorded() {
    let t = start().await;
    t.ask("coder", &sh("true")).await;
    let rec = t
        .stack
        .svc
        .sandboxes
        .get("local", "coder")
        .await
        .unwrap()
        .unwrap();
    let intruding = HandMessage::Invoke(Invocation {
        run_id: "run_intruder".into(),
        tenant: "intruder".into(),
        agent: "coder".into(),
        generation: rec.generation,
        step: 0,
        call_id: "c1".into(),
        attempt: 1,
        skill: "shell_exec".into(),
        args: json!({"command": "cat /etc/hostname"}),
        timeout_s: 10,
        approved: false,
        judge_effects: false,
        program: None,
    });
    t.stack
        .svc
        .provider
        .send(rec.hand_queue_url.as_deref().unwrap(), &intruding)
        .await
        .unwrap();
    let client = &t.client;
    eventually("the sandbox is destroyed", || async {
        sandbox_of(client, "coder").await.state == SandboxState::Destroyed
    })
    .await;
    let sb = sandbox_of(&t.client, "coder").await;
    assert!(
        sb.failure.as_deref().unwrap().starts_with("security:"),
        "{sb:?}"
    );
    // The next call of the rightful owner gets a fresh sandbox.
    let (_, run) = t.ask("coder", &sh("echo ok")).await;
    assert_eq!(tool_result(&run, "shell_exec")["stdout"], "ok\n");
    assert_eq!(sandbox_of(&t.client, "coder").await.generation, 2);
    t.stack.stop().await;
}
