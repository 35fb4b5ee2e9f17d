//! Approvals of sandbox work on the real emulator (issue 9): destructive
//! work waits undispatched and runs in the same sandbox once approved (a
//! file written before the pause is still there); a file_write over an
//! existing file waits too; a call lost with its sandbox is settled by a
//! human when the agent asks (`approvals.indeterminate: ask`); a deletion
//! no list of words sees is held by its effect until a human decides.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use armada_domain::approval::ApprovalKind;
use armada_domain::skills::Risk;
use armada_tests::approvals::*;
use armada_tests::sandbox::{fast, sandbox_of, tool_result};
use armada_tests::{outcome, TestStack};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn destructive_sandbox_work_waits_and_runs_in_the_same_sandbox_once_approved() {
    let t = TestStack::start_with(fast(), None).await;
    put_agent(
        &t,
        "builder",
        &["shell_exec", "file_write"],
        json!({"approvers": ["ops@example.com"]}),
        json!({"profile": "workspace"}),
    )
    .await;
    let (approver, _) = key(&t, "local", "approver").await;
    let session = t.client.create_session("builder").await.unwrap();
    let write = format!(
        "/tool file_write {}",
        json!({"path": "build/keep.txt", "content": "kept"})
    );
    let first = t.client.send_message(&session, &write).await.unwrap();
    let run = t
        .client
        .wait_run(&first, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let arn = sandbox_of(&t.client, "builder").await.task_arn.clone();
    assert!(arn.is_some());

    // Replacing the file is destructive too: the sandbox refuses until a
    // human decides, and a rejection leaves the file as it was.
    let overwrite = format!(
        "/tool file_write {}",
        json!({"path": "build/keep.txt", "content": "changed"})
    );
    let over = t.client.send_message(&session, &overwrite).await.unwrap();
    let view = first_approval(&t.client, &over).await;
    let ids = [view.approval_id.clone()];
    assert_eq!(view.risk, Risk::High, "{view:?}");
    assert!(view.reasons.concat().contains("overwrite"), "{view:?}");
    decide(&approver, &ids[0], "reject", "keep it")
        .await
        .unwrap();
    let run = t
        .client
        .wait_run(&over, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        run.output
            .as_deref()
            .unwrap_or_default()
            .contains("APPROVAL_REJECTED"),
        "{run:?}"
    );

    let rm = format!(
        "/tool shell_exec {}",
        json!({"command": "cat build/keep.txt && rm -rf build && ls"})
    );
    let second = t.client.send_message(&session, &rm).await.unwrap();
    let view = first_approval(&t.client, &second).await;
    let ids = [view.approval_id.clone()];
    assert_eq!(view.risk, Risk::High, "{view:?}");
    assert!(view.reasons.concat().contains("rm -r"), "{view:?}");
    // The approval exists once the Run committed its wait with the call
    // still PLANNED: nothing was dispatched for it.
    assert!(
        !kinds(&t.events(&second).await).contains(&"tool_dispatched"),
        "not dispatched before approval"
    );
    decide(&approver, &ids[0], "approve", "clean it")
        .await
        .unwrap();
    let run = t
        .client
        .wait_run(&second, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let r = tool_result(&run, "shell_exec");
    assert_eq!(
        r["stdout"], "kept",
        "the file written before the pause: {r}"
    );
    assert_eq!(
        sandbox_of(&t.client, "builder").await.task_arn,
        arn,
        "the same sandbox task"
    );
    t.stack.stop().await;
}

/// `bash -c "rm -rf build"` passes the list of command words: the sandbox
/// runs it over an overlay, holds the deletion, and the Run waits for an
/// approval that lists it; rejected, the files stay; approved, the held
/// deletion is applied and the call answers as it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deletion_no_word_list_sees_waits_for_an_approval_that_lists_it() {
    let t = TestStack::start_with(fast(), None).await;
    put_agent(
        &t,
        "operator",
        &["shell_exec", "file_write"],
        json!({"approvers": ["ops@example.com"], "destructive": "effect"}),
        json!({"profile": "workspace"}),
    )
    .await;
    let (approver, _) = key(&t, "local", "approver").await;
    let session = t.client.create_session("operator").await.unwrap();
    let write = format!(
        "/tool file_write {}",
        json!({"path": "build/keep.txt", "content": "kept"})
    );
    let first = t.client.send_message(&session, &write).await.unwrap();
    let run = t
        .client
        .wait_run(&first, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let bypass = format!(
        "/tool shell_exec {}",
        json!({"command": "bash -c \"rm -rf build\" && echo gone"})
    );
    let held = |reasons: &[String]| {
        let text = reasons.concat();
        text.contains("deletes build") && text.contains("bytes")
    };

    let rejected = t.client.send_message(&session, &bypass).await.unwrap();
    let view = first_approval(&t.client, &rejected).await;
    assert_eq!(view.risk, Risk::High, "{view:?}");
    assert!(
        held(&view.reasons),
        "the approval lists the deletion: {view:?}"
    );
    let id = view.approval_id.clone();
    decide(&approver, &id, "reject", "keep the build")
        .await
        .unwrap();
    let run = t
        .client
        .wait_run(&rejected, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        run.output
            .as_deref()
            .unwrap_or_default()
            .contains("APPROVAL_REJECTED"),
        "{run:?}"
    );
    let cat = format!(
        "/tool shell_exec {}",
        json!({"command": "cat build/keep.txt"})
    );
    let read = t.client.send_message(&session, &cat).await.unwrap();
    let run = t
        .client
        .wait_run(&read, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        tool_result(&run, "shell_exec")["stdout"],
        "kept",
        "rejected, nothing was deleted: {run:?}"
    );

    let approved = t.client.send_message(&session, &bypass).await.unwrap();
    let view = first_approval(&t.client, &approved).await;
    assert!(held(&view.reasons), "{view:?}");
    let id = view.approval_id.clone();
    decide(&approver, &id, "approve", "clean it").await.unwrap();
    let run = t
        .client
        .wait_run(&approved, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert_eq!(
        tool_result(&run, "shell_exec")["stdout"],
        "gone\n",
        "the call answers as it did when it ran: {run:?}"
    );
    let read = t.client.send_message(&session, &cat).await.unwrap();
    let run = t
        .client
        .wait_run(&read, Duration::from_secs(60))
        .await
        .unwrap();
    assert_ne!(
        tool_result(&run, "shell_exec")["exit_code"],
        0,
        "approved, the build is gone: {run:?}"
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_lost_with_its_sandbox_is_settled_by_a_human_when_the_agent_asks() {
    let t = TestStack::start_with(fast(), None).await;
    put_agent(
        &t,
        "deployer",
        &["shell_exec"],
        json!({"indeterminate": "ask", "approvers": ["ops@example.com"]}),
        json!({}),
    )
    .await;
    let (approver, _) = key(&t, "local", "approver").await;
    let svc = &t.stack.svc;
    for (decision, result) in [
        ("happened", json!({"stdout": "deployed by hand"})),
        ("retry", Value::Null),
    ] {
        let cmd = json!({"command": "sleep 4 && echo deployed"});
        let id = t
            .client
            .create_run("deployer", &format!("/tool shell_exec {cmd}"))
            .await
            .unwrap();
        armada_tests::sandbox::eventually("the call has started", || async {
            let run = svc.runs.get(&id).await.unwrap().unwrap();
            let Some(call) = run.ledger.values().next() else {
                return false;
            };
            let call = armada_core::adapters::dynamo::sandboxes::CallRef {
                tenant: run.tenant.clone(),
                agent: run.agent.clone(),
                run_id: id.clone(),
                call_id: call.call_id.clone(),
                attempt: 1,
            };
            svc.sandboxes.mark(&call).await.unwrap().is_some()
        })
        .await;
        t.admin
            .call(
                Method::DELETE,
                "/v1/sandboxes/deployer?tenant=local",
                None,
                true,
            )
            .await
            .unwrap();
        wait_state(&t.client, &id, "AWAITING_HITL").await;
        let ids = approvals_of(&t.client, &id).await;
        let view = approval(&t.client, &ids[0]).await;
        assert_eq!(view.kind, ApprovalKind::Indeterminate, "{view:?}");
        let link = eml_link(&t.outbox, &ids[0]).await;
        let (_, html) = get_page(&link).await;
        assert!(
            html.contains("It happened") && html.contains("Run it again"),
            "{html}"
        );
        // An uncertain call is not approved or rejected: it is settled.
        assert_eq!(
            decide(&approver, &ids[0], "approve", "").await.unwrap_err(),
            400
        );
        approver
            .post(
                &format!("/v1/approvals/{}/decision", ids[0]),
                &json!({"decision": decision, "result": result}),
            )
            .await
            .unwrap();
        let run = t
            .client
            .wait_run(&id, Duration::from_secs(90))
            .await
            .unwrap();
        assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
        let r = tool_result(&run, "shell_exec");
        match decision {
            "happened" => assert_eq!(r["stdout"], "deployed by hand", "{r}"),
            _ => assert_eq!(r["stdout"], "deployed\n", "{r}"),
        }
    }
    t.stack.stop().await;
}
