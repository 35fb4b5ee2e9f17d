//! The checker's rules on Runs made by hand in the in-memory ports.
use super::*;
use armada_core::memory::fixtures::accepted_run;
use armada_core::memory::test_config;
use armada_domain::run::{RunError, RunEvent};
use serde_json::json;

#[test]
fn a_span_is_active_between_its_creation_and_end_and_moves_at_its_events() {
    let span = Span {
        run_id: "run_1".into(),
        created: 10,
        ended: Some(50),
        events: vec![10, 20, 45, 50],
        kinds: vec!["run_created", "model_reply", "tool_call", "run_completed"],
    };
    assert!(!span.active_at(10) && span.active_at(11) && !span.active_at(50));
    assert_eq!(span.next_event(21), Some(45));
    assert_eq!(span.next_event(45), Some(45));
    assert_eq!(span.next_event(51), None);
    assert_eq!(span.around(21), (Some("model_reply"), Some("tool_call")));
    assert_eq!(span.around(5), (None, Some("run_created")));
    let open = Span {
        ended: None,
        ..span
    };
    assert!(open.active_at(1_000));
}

#[tokio::test]
async fn a_sandbox_command_that_found_its_line_twice_is_named() {
    use armada_domain::ledger::{ToolCallEvent, ToolCallRecord};
    use armada_domain::machine::Machine;
    let (svc, _mem) = Services::in_memory(test_config());
    let def = armada_core::memory::fixtures::agent(&svc, "coder", &[]).await;
    let mut run = accepted_run(&svc, "acme", &def, "hi").await;
    let mut rec = ToolCallRecord::planned("c1", SHELL_EXEC, json!({}), 1, false, true);
    rec.apply(
        ToolCallEvent::Dispatched {
            generation: Some(1),
        },
        1,
    )
    .expect("dispatched");
    rec.apply(
        ToolCallEvent::Answered {
            ok: true,
            result: json!({"exit_code": 0, "stdout": "effect\neffect\n"}),
        },
        2,
    )
    .expect("answered");
    run.ledger.insert("c1".into(), rec);
    run.apply(RunEvent::Claimed { lease_until_ms: 10 }, 1)
        .expect("claimed");
    run.apply(
        RunEvent::Answered {
            output: armada_domain::run::Payload::Inline {
                text: "done".into(),
            },
        },
        2,
    )
    .expect("completed");
    let mut out = Vec::new();
    check_sandbox_effect(&run, &mut out);
    assert_eq!(
        out.iter().map(|v| v.rule).collect::<Vec<_>>(),
        ["sandbox_effect_not_once"]
    );
}

/// Claimed, failed and closed, as a Run the faults ended.
fn fail_and_close(run: &mut Run) {
    run.apply(RunEvent::Claimed { lease_until_ms: 10 }, 1)
        .expect("claimed");
    run.apply(
        RunEvent::Failed {
            error: RunError::new("X", "x"),
        },
        2,
    )
    .expect("failed");
    run.apply(RunEvent::Closed, 3).expect("closed");
}

#[tokio::test]
async fn a_run_ended_twice_or_never_closed_is_named() {
    let (svc, _mem) = Services::in_memory(test_config());
    let def = armada_core::memory::fixtures::agent(&svc, "assistant", &[]).await;
    let mut run = accepted_run(&svc, "acme", &def, "hi").await;
    // Never ended: not closed.
    let mut out = Vec::new();
    check_run(&run, &[], &mut out);
    assert_eq!(
        out.iter().map(|v| v.rule).collect::<Vec<_>>(),
        ["not_closed"]
    );
    // Ended, and its end recorded twice.
    fail_and_close(&mut run);
    let end = LogEvent::RunFailed {
        error: Some(RunError::new("X", "x")),
        receives: None,
    };
    let twice = vec![
        RunEventRecord {
            seq: 1,
            at_ms: 2,
            event: end.clone(),
        },
        RunEventRecord {
            seq: 2,
            at_ms: 2,
            event: end,
        },
    ];
    let mut out = Vec::new();
    check_run(&run, &twice, &mut out);
    assert!(out.iter().any(|v| v.rule == "terminal_events"), "{out:?}");
}

#[tokio::test]
async fn a_chain_step_after_a_break_and_a_round_started_twice_are_named() {
    use armada_domain::collab::chain::ChainLink;
    let (svc, _mem) = Services::in_memory(test_config());
    let def = armada_core::memory::fixtures::agent(&svc, "assistant", &[]).await;
    let link = |index: u32| ChainLink {
        chain_id: "chain_1".into(),
        index,
        steps: vec!["assistant".into(); 3],
        callback_url: None,
        team: None,
    };
    let mut first = accepted_run(&svc, "acme", &def, "draft").await;
    first.run_id = step_run_id("chain_1", 0);
    first.chain = Some(link(0));
    first
        .apply(RunEvent::Claimed { lease_until_ms: 10 }, 1)
        .expect("claimed");
    first
        .apply(
            RunEvent::Failed {
                error: RunError::new("X", "x"),
            },
            2,
        )
        .expect("failed");
    let mut second = accepted_run(&svc, "acme", &def, "draft").await;
    second.run_id = step_run_id("chain_1", 1);
    second.chain = Some(link(1));
    let runs = HashMap::from([
        (first.run_id.clone(), (first, vec![])),
        (second.run_id.clone(), (second.clone(), vec![])),
    ]);
    let mut out = Vec::new();
    check_chain(&runs, &mut out);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].rule, out[0].run_id.as_str()),
        ("chain_step_after_break", second.run_id.as_str())
    );

    let round = |n: u32| RunEventRecord {
        seq: u64::from(n),
        at_ms: 1,
        event: LogEvent::RoundStarted {
            round: 1,
            after_round: None,
            team: None,
            members: vec![],
        },
    };
    let mut out = Vec::new();
    check_run(&second, &[round(1), round(2)], &mut out);
    assert!(out.iter().any(|v| v.rule == "round_twice"), "{out:?}");
}

#[tokio::test]
async fn effects_approvals_and_callbacks_are_held_against_the_receiver() {
    use armada_domain::ledger::{ToolCallEvent, ToolCallRecord};
    use armada_domain::machine::Machine;
    let (svc, _mem) = Services::in_memory(test_config());
    let def = armada_core::memory::fixtures::agent(&svc, "assistant", &[]).await;
    let mut run = accepted_run(&svc, "acme", &def, "hi").await;
    let call = |id: &str, events: Vec<ToolCallEvent>| {
        let mut rec = ToolCallRecord::planned(id, HTTP_REQUEST, json!({}), 1, false, false);
        for e in events {
            rec.apply(e, 1).expect("legal");
        }
        (id.to_string(), rec)
    };
    let done = || {
        vec![
            ToolCallEvent::Dispatched { generation: None },
            ToolCallEvent::Answered {
                ok: true,
                result: json!({"status": 200}),
            },
        ]
    };
    run.ledger = [
        call("twice", done()),
        call("lost", done()),
        call("fine", done()),
        call("never_sent", vec![]),
    ]
    .into_iter()
    .collect();
    let key = |c: &str| effect_key(&run.run_id, c);
    let mut heard = Heard::default();
    heard.effects.insert(key("twice"), 2);
    heard.effects.insert(key("fine"), 1);
    heard.effects.insert(key("never_sent"), 1);
    heard.effects.insert("run_x:c9".into(), 1);
    let mut out = Vec::new();
    check_effects(&run, &heard, &mut out);
    let recorded = run.ledger.keys().map(|c| key(c)).collect();
    check_unowned_effects(&heard, &recorded, &mut out);
    let mut rules: Vec<(&str, &str)> = out
        .iter()
        .map(|v| (v.rule, v.detail.split(' ').nth(1).unwrap_or("")))
        .collect();
    rules.sort();
    assert_eq!(
        rules,
        [
            ("effect_lost", "lost"),
            ("effect_twice", "twice"),
            ("effect_unrecorded", "never_sent"),
            ("effect_unrecorded", "reached"),
        ],
        "{out:?}"
    );

    // A rejected call performed, and its decision never applied.
    let runs = HashMap::from([(run.run_id.clone(), (run.clone(), vec![]))]);
    let rejected = Decided {
        run_id: run.run_id.clone(),
        approval_id: "ap_1".into(),
        call_id: "fine".into(),
        approved: false,
    };
    let mut out = Vec::new();
    check_decided(&rejected, &runs, &heard, &mut out);
    let rules: Vec<&str> = out.iter().map(|v| v.rule).collect();
    assert_eq!(rules, ["approval_lost", "rejected_effect"], "{out:?}");
    // Not lost: a Run failed because the decision's own message ran out of
    // deliveries, and saying so. (Another message's dead letter is no
    // excuse.)
    let failed_for = |what: &str| {
        let mut r = run.clone();
        r.error = Some(RunError::new(
            "DEAD_LETTERED",
            format!("the run's {what} message failed on every delivery"),
        ));
        let runs = HashMap::from([(r.run_id.clone(), (r, vec![]))]);
        let mut out = Vec::new();
        check_decided(&rejected, &runs, &Heard::default(), &mut out);
        out.iter().map(|v| v.rule).collect::<Vec<_>>()
    };
    assert!(failed_for("decision of approval ap_1").is_empty());
    assert_eq!(failed_for("start"), ["approval_lost"]);
    // Nor one whose step that took the decision up ran out of them (a
    // worker killed at every delivery); another step's is no excuse.
    let step = run.ledger["fine"].step;
    assert!(failed_for(&format!("step {step}")).is_empty());
    assert_eq!(failed_for(&format!("step {}", step + 1)), ["approval_lost"]);

    // A closed Run's callback: under two ids, then never taken.
    run.callback_url = Some("http://127.0.0.1:9/callback".into());
    fail_and_close(&mut run);
    heard
        .callbacks
        .insert(run.run_id.clone(), vec!["a".into(), "b".into()]);
    heard.callbacks_taken.insert(run.run_id.clone(), 1);
    let mut out = Vec::new();
    check_callback(&run, &heard, &mut out);
    assert_eq!(
        out.iter().map(|v| v.rule).collect::<Vec<_>>(),
        ["callback_ids"]
    );
    heard
        .callbacks
        .insert(run.run_id.clone(), vec![run.run_id.clone()]);
    heard.callbacks_taken.clear();
    let mut out = Vec::new();
    check_callback(&run, &heard, &mut out);
    assert_eq!(
        out.iter().map(|v| v.rule).collect::<Vec<_>>(),
        ["callback_missing"]
    );
}

/// A sandbox still held by a Run that ended, and a task no sandbox
/// names, are each named; a sandbox held by a live Run is not.
#[tokio::test]
async fn a_sandbox_left_held_or_a_task_left_running_is_named() {
    let (svc, mem) = Services::in_memory(test_config());
    let def = armada_core::memory::fixtures::agent(&svc, "coder", &[SHELL_EXEC]).await;
    let run = accepted_run(&svc, "acme", &def, "hi").await;
    armada_core::services::sandboxing::acquire(&svc, "acme", &run.run_id, &def)
        .await
        .expect("held");
    let quiet = std::time::Duration::ZERO;
    let found = leaked_sandboxes(&svc, "acme", quiet).await.expect("read");
    assert!(found.is_empty(), "{found:?}");
    // The holder ends without letting go, and a task is left behind.
    {
        let mut st = mem.state();
        let held = st.runs.get_mut(&run.run_id).expect("run");
        held.apply(RunEvent::CancelRequested, 5).expect("cancelled");
        let (arn, task) = st.tasks.iter().next().expect("a task");
        let mut stray = task.clone();
        stray.arn = format!("{arn}-stray");
        stray.last_status = "RUNNING".into();
        st.tasks.insert(stray.arn.clone(), stray);
    }
    let found = leaked_sandboxes(&svc, "acme", quiet).await.expect("read");
    let rules: Vec<(&str, &str)> = found.iter().map(|v| (v.rule, v.run_id.as_str())).collect();
    assert_eq!(
        rules,
        [
            ("sandbox_held_by_ended_run", run.run_id.as_str()),
            ("sandbox_task_unowned", "")
        ],
        "{found:?}"
    );
    assert!(found[1].detail.contains("-stray"), "{found:?}");
}
