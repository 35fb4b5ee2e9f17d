//! Sandboxes that fail and recover on the local stack: a sandbox that dies
//! mid-call, one that never starts, an agent that crashes, a full port
//! pool; and the lifecycle around them (serve, hibernation, prewarming,
//! registry manifests, results through S3). Same setting as `sandboxes.rs`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use armada_tests::sandbox::*;
use armada_tests::{error_message, outcome, TestStack};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_whose_sandbox_dies_is_never_sent_again() {
    let t = start().await;
    let id = t.client.create_run("coder", &sh("sleep 30")).await.unwrap();
    let svc = &t.stack.svc;
    eventually("the call has started", || async {
        let run = svc.runs.get(&id).await.unwrap().unwrap();
        let Some(call) = run.ledger.values().next() else {
            return false;
        };
        let mark = svc
            .sandboxes
            .mark(&armada_core::adapters::dynamo::sandboxes::CallRef {
                tenant: run.tenant.clone(),
                agent: run.agent.clone(),
                run_id: id.clone(),
                call_id: call.call_id.clone(),
                attempt: 1,
            })
            .await
            .unwrap();
        mark.is_some()
    })
    .await;
    destroy_sandbox(&t, "local", "coder").await;
    let run = t
        .client
        .wait_run(&id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "TOOL_INDETERMINATE",
        "{run:?}"
    );
    let types = t.event_types(&id).await;
    assert_eq!(
        types.iter().filter(|t| *t == "tool_dispatched").count(),
        1,
        "dispatched once, never again: {types:?}"
    );
    assert!(types.contains(&"tool_indeterminate".to_string()));
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_starts_a_server_reachable_from_the_host() {
    let t = start().await;
    let (_, run) = t
        .ask(
            "coder",
            r#"/tool file_write {"path": "site/index.html", "content": "hello from the sandbox"}"#,
        )
        .await;
    assert_eq!(outcome(&run), "COMPLETED");
    let (_, run) = t
        .ask(
            "coder",
            // Listening on every address, as servers do by default.
            r#"/tool serve {"command": "cd site && exec python3 -m http.server $PORT"}"#,
        )
        .await;
    let r = tool_result(&run, "serve");
    let url = r["url"].as_str().unwrap_or_else(|| panic!("{r}"));
    assert!(url.starts_with("http://127.0.0.1:391"), "{url}");
    let body = reqwest::get(format!("{url}/index.html"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "hello from the sandbox");
    let sb = sandbox_of(&t.client, "coder").await;
    assert_eq!(sb.ports[0]["container"], 8081, "{sb:?}");
    // The published port on loopback is the only way in: the host's other
    // addresses do not answer, and a call may not bind them.
    let host_ip = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .find(|a| {
                    a.parse::<std::net::Ipv4Addr>()
                        .is_ok_and(|ip| !ip.is_loopback())
                })
                .map(str::to_string)
        });
    if let Some(ip) = host_ip {
        let port = url.rsplit(':').next().unwrap();
        let direct = std::net::TcpStream::connect_timeout(
            &format!("{ip}:{port}").parse().unwrap(),
            Duration::from_secs(2),
        );
        assert!(direct.is_err(), "the server answered on {ip}:{port}");
        let (_, run) = t
            .ask(
                "coder",
                &py(&format!(
                    "import socket\ntry:\n    socket.socket().bind(('{ip}', 0)); print('bound')\nexcept OSError as e:\n    print('refused', e.errno)"
                )),
            )
            .await;
        // EPERM from the bind guard, or EACCES where Landlock holds binds
        // to the granted ports first.
        let said = tool_result(&run, "python_exec")["stdout"].clone();
        assert!(said == "refused 1\n" || said == "refused 13\n", "{run:?}");
    }
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_sandbox_hibernates_frozen_and_wakes_with_its_state() {
    let t = start().await;
    put_agent(&t, "sleepy", json!({"idle_hibernate_s": 2})).await;
    let (_, run) = t.ask("sleepy", &sh("echo remembered > state.txt")).await;
    assert_eq!(outcome(&run), "COMPLETED");
    let before = sandbox_of(&t.client, "sleepy").await;
    let client = &t.client;
    eventually("the idle sandbox hibernates", || async {
        sandbox_of(client, "sleepy").await.state == SandboxState::Hibernated
    })
    .await;
    let arn = before.task_arn.as_deref().unwrap();
    let task_group = armada_sandbox::cgroup::Cgroup::current()
        .unwrap()
        .child(&format!("armada-{}", t.stack.template.stack()))
        .unwrap()
        .child(arn.rsplit('/').next().unwrap())
        .unwrap();
    assert!(task_group.frozen(), "its processes are frozen");
    assert!(!task_group.all_procs().is_empty(), "and still there");
    let (_, run) = t.ask("sleepy", &sh("cat state.txt")).await;
    assert_eq!(tool_result(&run, "shell_exec")["stdout"], "remembered\n");
    let after = sandbox_of(&t.client, "sleepy").await;
    assert_eq!(after.task_arn, before.task_arn, "the same task woke");
    assert_eq!(after.generation, before.generation);
    assert!(!task_group.frozen());
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resident_agents_sandbox_is_prewarmed_and_never_hibernates() {
    let t = start().await;
    put_agent(
        &t,
        "resident",
        json!({"resident": true, "idle_hibernate_s": 1}),
    )
    .await;
    // The same idle time, not resident: once it has hibernated, the
    // resident one has been idle as long and judged the same way.
    put_agent(&t, "idler", json!({"idle_hibernate_s": 1})).await;
    let (_, run) = t.ask("resident", "hello").await;
    assert_eq!(
        run.output.as_deref().unwrap_or_default(),
        "echo: hello",
        "a chat run"
    );
    let client = &t.client;
    eventually("the sandbox is warm", || async {
        client
            .get("/v1/sandboxes/resident")
            .await
            .is_ok_and(|s| s["state"] == "READY")
    })
    .await;
    let (_, run) = t.ask("idler", &sh("echo idle")).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    eventually("the non-resident sandbox hibernates", || async {
        sandbox_of(client, "idler").await.state == SandboxState::Hibernated
    })
    .await;
    assert_eq!(
        sandbox_of(&t.client, "resident").await.state,
        SandboxState::Ready
    );
    let (_, run) = t.ask("resident", &sh("echo warm")).await;
    assert_eq!(tool_result(&run, "shell_exec")["stdout"], "warm\n");
    assert_eq!(tasks_of(&t, "local", "resident").await.len(), 1);
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_that_does_not_start_is_retried_once_then_the_run_fails() {
    let mut p = fast();
    p.insert("SandboxStartTimeoutSeconds".into(), "2".into());
    let t = TestStack::start_full(
        p,
        None,
        vec![("ARMADA_TEST_STALL_AGENT".into(), "stuck".into())],
    )
    .await;
    put_agent(&t, "stuck", json!({})).await;
    let (_, run) = t.ask("stuck", &sh("echo never")).await;
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "SANDBOX_UNAVAILABLE",
        "{run:?}"
    );
    let sb = sandbox_of(&t.client, "stuck").await;
    assert_eq!(sb.state, SandboxState::Failed, "{sb:?}");
    assert!(
        sb.failure
            .as_deref()
            .unwrap()
            .contains("did not start within 2 s, twice"),
        "{sb:?}"
    );
    let tasks = tasks_of(&t, "local", "stuck").await;
    assert_eq!(tasks.len(), 2, "started, then started again once");
    for arn in &tasks {
        assert_eq!(task_status(&t, arn).await, "STOPPED");
    }
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crashing_agent_is_restarted_once_then_destroyed() {
    let t = TestStack::start_full(
        fast(),
        None,
        vec![("ARMADA_TEST_PANIC_ON".into(), "PANIC-MARK".into())],
    )
    .await;
    let (_, run) = t.ask("coder", &sh("echo PANIC-MARK")).await;
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    assert_eq!(
        run.error.as_ref().map_or("", |e| e.code.as_str()),
        "TOOL_INDETERMINATE",
        "the call it crashed in is not repeated: {run:?}"
    );
    let first = sandbox_of(&t.client, "coder").await;
    assert_eq!(
        first.state,
        SandboxState::Ready,
        "restarted once: {first:?}"
    );
    let (_, run) = t.ask("coder", &sh("echo still here")).await;
    assert_eq!(tool_result(&run, "shell_exec")["stdout"], "still here\n");
    let (_, run) = t.ask("coder", &sh("echo PANIC-MARK again")).await;
    assert_eq!(outcome(&run), "FAILED", "{run:?}");
    let sb = sandbox_of(&t.client, "coder").await;
    assert_eq!(sb.state, SandboxState::Destroyed, "{sb:?}");
    assert!(
        sb.failure.as_deref().unwrap().contains("crashed twice"),
        "{sb:?}"
    );
    assert_eq!(sb.task_arn, first.task_arn, "one task crashed twice");
    let arn = first.task_arn.clone().unwrap();
    eventually("its task is stopped", || async {
        task_status(&t, &arn).await == "STOPPED"
    })
    .await;
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_serve_call_waits_while_the_port_pool_is_full() {
    let t = start().await;
    let store = &t.stack.svc.sandboxes;
    let hosts: Vec<u16> = (39137..=39146).collect();
    for h in &hosts {
        assert!(store
            .take_port("local", *h, "arn:other-task", 1)
            .await
            .unwrap());
    }
    put_agent(&t, "impatient", json!({"limits": {"call_timeout_s": 2}})).await;
    let serve = r#"/tool serve {"command": "exec python3 -m http.server $PORT --bind 127.0.0.1"}"#;
    let (_, run) = t.ask("impatient", serve).await;
    assert_eq!(
        tool_result(&run, "serve")["error"]["code"],
        "PORTS_EXHAUSTED",
        "it waited its call's time for a port: {run:?}"
    );
    let id = t.client.create_run("coder", serve).await.unwrap();
    let client = &t.client;
    eventually("the serve call is dispatched", || async {
        client
            .get(&format!("/v1/runs/{id}"))
            .await
            .is_ok_and(|r| r["state"] == "AWAITING_TOOL")
    })
    .await;
    // It queues for a port (the Run completes once one is given back,
    // below) rather than fail at once as the impatient one did.
    // Host ports are shared by every stack on the machine (and every test
    // running beside this one), so the pool is given back whole and the
    // call may get whichever port is free on the host.
    for h in &hosts {
        store
            .release_port("local", *h, "arn:other-task")
            .await
            .unwrap();
    }
    let run = t
        .client
        .wait_run(&id, Duration::from_secs(60))
        .await
        .unwrap();
    let r = tool_result(&run, "serve");
    let port = r["port"].as_u64().unwrap_or_default() as u16;
    assert!((8081..=8090).contains(&port), "{r}");
    let host = armada_domain::sandbox::host_port(port).unwrap();
    assert_eq!(r["url"], format!("http://127.0.0.1:{host}"), "{r}");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn skill_manifests_in_the_registry_place_stricter_never_weaker() {
    let t = start().await;
    let (status, body) = t
        .raw(
            Method::PUT,
            "/v1/skills/summarise",
            Some(&t.stack.admin_key),
            Some(r#"{"executor": "shell_exec", "kind": "text_processing"}"#),
            &[],
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(error_message(&body).starts_with("kind:"), "{body}");
    // A web search through a headless tool: its kind alone would not need
    // a sandbox; the manifest asks for one, with a 2 s timeout.
    let m = t
        .admin
        .call(
            Method::PUT,
            "/v1/skills/browse",
            Some(&json!({"executor": "shell_exec", "kind": "web_search",
                         "requires_sandbox": true, "timeout_s": 2, "risk": "low"})),
            true,
        )
        .await
        .unwrap();
    assert_eq!(m["executor"], "shell_exec");
    let listed = t.client.get("/v1/skills").await.unwrap();
    assert!(listed["skills"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["name"] == "browse"));
    let def = t
        .admin
        .call(
            Method::PUT,
            "/v1/agents/browser",
            Some(&json!({
                "model": {"provider": "scripted", "model_id": "m", "context_window": 4096},
                "system_prompt": "x",
                "skills": ["browse"]
            })),
            true,
        )
        .await
        .unwrap();
    assert_eq!(
        def["manifests"]["browse"]["timeout_s"], 2,
        "frozen with the definition"
    );
    let (_, run) = t
        .ask(
            "browser",
            r#"/tool browse {"command": "echo in a sandbox; sleep 30"}"#,
        )
        .await;
    let r = tool_result(&run, "browse");
    assert_eq!(
        r["error"]["code"], "TIMEOUT",
        "the manifest's timeout holds: {r}"
    );
    assert_eq!(r["stdout"], "in a sandbox\n");
    assert_eq!(
        tasks_of(&t, "local", "browser").await.len(),
        1,
        "it ran in a sandbox"
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_fargate_an_idle_sandbox_saves_its_workspace_stops_and_wakes_from_it() {
    // The data plane in Fargate's mode: no freezing, tasks stop.
    let t = TestStack::start_full(
        fast(),
        None,
        vec![("ARMADA_HIBERNATE_MODE".into(), "snapshot".into())],
    )
    .await;
    put_agent(&t, "napper", json!({"idle_hibernate_s": 2})).await;
    let (_, run) = t
        .ask("napper", &sh("mkdir -p src && echo kept > src/state.txt"))
        .await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let before = sandbox_of(&t.client, "napper").await;
    let first_task = before.task_arn.clone().unwrap();
    let client = &t.client;
    eventually("the idle sandbox hibernates to a snapshot", || async {
        let sb = sandbox_of(client, "napper").await;
        sb.state == SandboxState::Hibernated && sb.task_arn.is_none()
    })
    .await;
    eventually("its task is stopped", || async {
        task_status(&t, &first_task).await == "STOPPED"
    })
    .await;
    let (_, run) = t
        .ask(
            "napper",
            &sh("cat src/state.txt; touch src/new && echo writable"),
        )
        .await;
    assert_eq!(
        tool_result(&run, "shell_exec")["stdout"],
        "kept\nwritable\n",
        "{run:?}"
    );
    let after = sandbox_of(&t.client, "napper").await;
    assert_eq!(after.state, SandboxState::Ready);
    assert_eq!(after.generation, before.generation, "the same sandbox woke");
    assert_ne!(
        after.task_arn.as_deref().unwrap(),
        first_task,
        "in a new task"
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_result_larger_than_a_queue_message_travels_through_s3() {
    let t = start().await;
    // 200 KiB of quotes: its JSON (escaped) is twice that, over SQS's limit.
    let (_, run) = t
        .ask(
            "coder",
            &py("open('quotes.txt', 'w').write('\"' * 200 * 1024)\nprint('written')"),
        )
        .await;
    assert_eq!(
        tool_result(&run, "python_exec")["stdout"],
        "written\n",
        "{run:?}"
    );
    let (run_id, run) = t
        .ask("coder", r#"/tool file_read {"path": "quotes.txt"}"#)
        .await;
    assert_eq!(outcome(&run), "COMPLETED", "{}", run.state.as_str());
    let r = tool_result(&run, "file_read");
    let keys: Vec<&String> = r.as_object().unwrap().keys().collect();
    assert_eq!(
        r["truncated"], true,
        "the model sees the start of it: {keys:?}"
    );
    assert!(r["bytes"].as_u64().unwrap() > 400 * 1024);
    let keys = t
        .stack
        .aws
        .s3
        .list_objects_v2()
        .bucket(&t.stack.svc.cfg.payload_bucket)
        .prefix(format!("sandboxes/local/coder/outcomes/{run_id}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        keys.contents().len(),
        1,
        "the outcome went through the bucket"
    );
    t.stack.stop().await;
}
