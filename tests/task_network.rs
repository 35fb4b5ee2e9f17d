//! The network rule per task, for where calls cannot get network namespaces
//! of their own (Fargate): a sandbox whose profile restricts the network is
//! started in the isolated security groups (no egress) and told so; any
//! other in the ordinary ones. Checked on the emulator's ECS and EC2: the
//! task's network interface carries the group.

#![allow(clippy::unwrap_used)]

use serde_json::json;

use armada_core::ports::provider::task_env;
use armada_tests::sandbox::*;
use armada_tests::TestStack;

/// The security groups and environment of an agent's (first) task.
async fn task_of(t: &TestStack, agent: &str) -> (Vec<String>, String) {
    let arn = tasks_of(t, "local", agent).await.remove(0);
    let task = describe_task(t, &arn).await;
    let eni = task.attachments()[0]
        .details()
        .iter()
        .find(|d| d.name() == Some("networkInterfaceId"))
        .and_then(|d| d.value())
        .unwrap()
        .to_string();
    let network = task
        .overrides()
        .unwrap()
        .container_overrides()
        .iter()
        .flat_map(|c| c.environment())
        .find(|kv| kv.name() == Some(task_env::TASK_NETWORK))
        .and_then(|kv| kv.value())
        .unwrap_or_default()
        .to_string();
    let xml = armada_cli::local::provision::ec2_query(
        &t.stack.endpoint,
        "us-east-1",
        &format!("Action=DescribeNetworkInterfaces&NetworkInterfaceId.1={eni}"),
    )
    .await
    .unwrap();
    let groups = xml
        .split("<groupId>")
        .skip(1)
        .filter_map(|rest| rest.split("</groupId>").next())
        .map(str::to_string)
        .collect();
    (groups, network)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_profile_without_network_gets_a_task_without_egress() {
    let t = start().await;
    let cfg = t.stack.svc.cfg.sandbox.clone();
    assert_eq!(cfg.isolated_security_groups.len(), 1, "{cfg:?}");
    put_agent(&t, "offline", json!({"profile": "strict"})).await;
    let (_, run) = t.ask("offline", &sh("echo offline")).await;
    assert_eq!(
        tool_result(&run, "shell_exec")["stdout"],
        "offline\n",
        "{run:?}"
    );
    let (groups, network) = task_of(&t, "offline").await;
    assert_eq!(groups, cfg.isolated_security_groups);
    assert_eq!(network, "isolated");

    let (_, run) = t.ask("coder", &sh("echo online")).await;
    assert_eq!(
        tool_result(&run, "shell_exec")["stdout"],
        "online\n",
        "{run:?}"
    );
    let (groups, network) = task_of(&t, "coder").await;
    assert_eq!(groups, cfg.security_groups);
    assert_ne!(groups, cfg.isolated_security_groups);
    assert_eq!(network, "open");
    t.stack.stop().await;
}
