//! What the local data plane gives each sandbox of the host: a uid of its
//! identity's own (taken from a counter in the sandboxes table, not derived
//! from the task ARN), a `/data` of its tenant's own, a view of the host
//! without the repository and its `.armada/` state, and pooled ports probed
//! on loopback only.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;

use armada_cli::local::dataplane::DataPlaneMode;
use armada_core::ports::FIRST_SANDBOX_UID;
use armada_tests::sandbox::*;
use armada_tests::{outcome, RunView};

fn uid_of(run: &RunView) -> u32 {
    assert_eq!(outcome(run), "COMPLETED", "{run:?}");
    stdout_of(run).trim().parse().unwrap()
}

/// An item of the stack's sandboxes table, by key.
async fn table_item(
    t: &armada_tests::TestStack,
    key: &str,
) -> Option<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    t.stack
        .aws
        .dynamo
        .get_item()
        .table_name(&t.stack.svc.cfg.sandboxes_table)
        .key(
            "sandbox_key",
            aws_sdk_dynamodb::types::AttributeValue::S(key.into()),
        )
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item()
        .cloned()
}

fn number(
    item: &std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>,
    k: &str,
) -> u64 {
    item[k].as_n().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_tenants_get_uids_of_their_own_from_the_table_and_keep_them() {
    let t = start().await;
    let mine = uid_of(&t.ask("coder", &sh("id -u")).await.1);
    let acme = tenant_client(&t, "acme").await;
    let theirs = uid_of(&ask_as(&acme, "coder", &sh("id -u")).await);
    assert_ne!(mine, theirs, "two tenants' sandboxes: two uids");
    // Handed out in turn from the table's counter, not hashed from the ARN.
    let mut both = [mine, theirs];
    both.sort_unstable();
    assert_eq!(both, [FIRST_SANDBOX_UID, FIRST_SANDBOX_UID + 1]);
    let counter = table_item(&t, "uid-counter").await.unwrap();
    assert_eq!(number(&counter, "taken"), 2);
    let kept = table_item(&t, "uid#local#coder").await.unwrap();
    assert_eq!(number(&kept, "uid"), u64::from(mine));
    // A new generation of the identity (its sandbox destroyed) keeps it.
    let gone = destroy_sandbox(&t, "local", "coder").await;
    assert_eq!(gone["state"], "DESTROYED", "{gone}");
    let again = uid_of(&t.ask("coder", &sh("id -u")).await.1);
    assert_eq!(sandbox_of(&t.client, "coder").await.generation, 2);
    assert_eq!(again, mine, "the identity keeps its uid");
    assert_eq!(
        number(&table_item(&t, "uid-counter").await.unwrap(), "taken"),
        2
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_never_sees_another_tenants_data() {
    // It reaches the data through a declared mount, which needs a mount
    // namespace per call: on Fargate such a sandbox fails closed
    // (tests/fargate_mode.rs), and a task holds no other tenant's data.
    if armada_tests::dataplane_mode() == DataPlaneMode::Fargate {
        return;
    }
    let t = start().await;
    // A user id of this test's own: every stack of the host shares `data`.
    let user = format!("iso{}", std::process::id());
    put_agent(
        &t,
        "datauser",
        serde_json::json!({
            "user": user,
            "mounts": [{"path": format!("/data/users/{user}/workspace"), "mode": "rw"}]
        }),
    )
    .await;
    // The host's operator made the user's workspace in each tenant's tree;
    // a call reaches its mount at the host path (`/data` is the tenant's).
    let tenants = data_dir().join("tenants");
    let ws = |tenant: &str| {
        tenants
            .join(tenant)
            .join("users")
            .join(&user)
            .join("workspace")
    };
    for tenant in ["local", "acme"] {
        std::fs::create_dir_all(ws(tenant)).unwrap();
        std::fs::set_permissions(ws(tenant), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let acme = tenant_client(&t, "acme").await;
    let secret = ws("acme").join("b-secret.txt");
    let theirs = ask_as(
        &acme,
        "datauser",
        &sh(&format!(
            "echo theirs > {} && ls {}",
            secret.display(),
            ws("acme").display()
        )),
    )
    .await;
    assert_eq!(outcome(&theirs), "COMPLETED", "{theirs:?}");
    assert_eq!(stdout_of(&theirs), "b-secret.txt\n", "{theirs:?}");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "theirs\n");
    // The same agent and user in another tenant: its /data is its own, and
    // the other tenant's file is out of reach by any path (its tree is not
    // even listed).
    let (_, mine) = t
        .ask(
            "datauser",
            &sh(&format!(
                "ls -A {} && echo listed; cat {} || echo unreachable; \
                 ls -A {} 2>/dev/null | grep -cx acme || true",
                ws("local").display(),
                secret.display(),
                tenants.display()
            )),
        )
        .await;
    assert_eq!(outcome(&mine), "COMPLETED", "{mine:?}");
    assert_eq!(stdout_of(&mine), "listed\nunreachable\n0\n", "{mine:?}");
    assert!(!ws("local").join("b-secret.txt").exists());
    for tenant in ["local", "acme"] {
        let _ = std::fs::remove_dir_all(tenants.join(tenant).join("users").join(&user));
    }
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_sandbox_reads_the_repository_or_its_armada_state() {
    let t = start().await;
    // World-readable, as the emulator's logs in `.armada/` are.
    let repo = armada_tests::root();
    let probe = repo
        .join(".armada")
        .join(format!("isolation-probe-{}", std::process::id()));
    std::fs::write(&probe, "not for sandboxes\n").unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o644)).unwrap();
    put_agent(&t, "devboxer", serde_json::json!({"profile": "devbox"})).await;
    let command = format!(
        "cat {} || echo denied; cat {}/Cargo.toml || echo denied; \
         ls -A {} | wc -l; echo still works > x && cat x",
        probe.display(),
        repo.display(),
        repo.display()
    );
    for agent in ["coder", "devboxer"] {
        let (_, run) = t.ask(agent, &sh(&command)).await;
        assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
        assert_eq!(
            stdout_of(&run),
            "denied\ndenied\n0\nstill works\n",
            "{agent:?}: {run:?}"
        );
        // Per call locally; on Fargate per task (the repository is not in
        // the task, and the call has no mount namespace of its own).
        let sb = sandbox_of(&t.client, agent).await;
        let want = match armada_tests::dataplane_mode() {
            DataPlaneMode::Local => "enforced",
            DataPlaneMode::Fargate => "partial",
        };
        assert_eq!(
            sb.controls.as_ref().expect("controls")["mounts"]["status"],
            want,
            "{sb:?}"
        );
    }
    let _ = std::fs::remove_file(&probe);
    t.stack.stop().await;
}
