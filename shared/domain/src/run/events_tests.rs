use super::*;
use serde_json::json;

/// One event of every kind, each with every field it can carry.
fn one_of_each() -> Vec<LogEvent> {
    let error = Some(RunError::new("E", "why"));
    let settled = ApprovalSettled {
        approval_id: "ap".into(),
        call_id: "c".into(),
        name: "deploy".into(),
        state: crate::approval::ApprovalState::Approved,
        by: Some("key_boss".into()),
        how: Some("key".into()),
        from: Some("10.0.0.1".into()),
        at_ms: Some(7),
        comment: Some("ok".into()),
    };
    let report = CallbackReport {
        delivery: "d".into(),
        attempts: 3,
        status: Some(500),
        error: Some("refused".into()),
    };
    let (call_id, name) = (String::from("c"), String::from("t"));
    vec![
        LogEvent::RunCreated(Created {
            agent: "a".into(),
            trigger: Some(Trigger::Hook {
                hook_id: "h".into(),
                event: "push".into(),
                delivery_id: "d".into(),
            }),
            team: Some("t".into()),
            session_id: Some("s".into()),
            session_seq: Some(2),
            parent_run_id: Some("p".into()),
            kind: Some(RunKind::Member),
            depth: Some(1),
            chain_id: Some("ch".into()),
            index: Some(1),
            previous_run_id: Some("r0".into()),
        }),
        LogEvent::ModelReply {
            content: "hi".into(),
            truncated: false,
            tool_calls: vec![ToolCall {
                id: "c".into(),
                name: "t".into(),
                args: json!({"x": 1}),
            }],
        },
        LogEvent::ModelRetried { attempts: 2 },
        LogEvent::ToolCall {
            call_id: call_id.clone(),
            name: name.clone(),
            args: json!({"x": [1, 2]}),
        },
        LogEvent::ToolDispatched {
            call_id: call_id.clone(),
            name: name.clone(),
            attempt: 1,
            sandbox: "sb".into(),
            generation: 4,
        },
        LogEvent::ToolResult {
            call_id: call_id.clone(),
            name: name.clone(),
            state: ToolCallState::Done,
            result: json!("text"),
        },
        LogEvent::ToolIndeterminate {
            call_id: call_id.clone(),
            name: name.clone(),
            reason: Some("lost".into()),
            asking: true,
        },
        LogEvent::ToolProgress {
            call_id: call_id.clone(),
            progress: 2.0,
            total: Some(5.0),
            message: Some("step 2".into()),
        },
        LogEvent::ToolRetried {
            call_id: call_id.clone(),
            name: name.clone(),
            reason: "lost".into(),
            attempt: 2,
        },
        LogEvent::SandboxWait {
            position: 1,
            holder_run_id: Some("r9".into()),
        },
        LogEvent::SecurityViolation {
            call_id: call_id.clone(),
            message: "no".into(),
        },
        LogEvent::HistoryCompacted {
            dropped_turns: 4,
            kept_turns: 6,
        },
        LogEvent::ApprovalRequested {
            approval_id: "ap".into(),
            kind: ApprovalKind::Gate,
            call_id: call_id.clone(),
            name: name.clone(),
            args: json!({}),
            risk: Risk::High,
            reasons: vec!["risky".into()],
        },
        LogEvent::ApprovalDecided(settled.clone()),
        LogEvent::ApprovalExpired(settled),
        LogEvent::ChildStarted {
            run_id: "r1".into(),
            agent: "a".into(),
            kind: RunKind::Delegation,
        },
        LogEvent::ChildFinished(ChildFinished {
            run_id: "r1".into(),
            agent: "a".into(),
            kind: RunKind::Delegation,
            round: 1,
            call_id: Some(call_id.clone()),
            state: RunState::Failed,
            output: Some("o".into()),
            error: error.clone(),
        }),
        LogEvent::RoundStarted {
            round: 2,
            after_round: Some(1),
            team: Some("t".into()),
            members: vec!["r1".into()],
        },
        LogEvent::ResumedFrom {
            source_run_id: "r0".into(),
            messages: 3,
            tokens: 100,
            model: "m".into(),
            model_ignored: Some("other".into()),
        },
        LogEvent::ChainStepStarted {
            chain_id: "ch".into(),
            index: 1,
            agent: "b".into(),
            run_id: "r2".into(),
        },
        LogEvent::ChainBroken {
            chain_id: "ch".into(),
            index: 0,
            state: RunState::Failed,
            skipped: vec!["b".into()],
            code: Some("CHAIN_BROKEN".into()),
        },
        LogEvent::RunCompleted {
            output: "done".into(),
            truncated: true,
        },
        LogEvent::RunFailed {
            error: error.clone(),
            receives: Some(5),
        },
        LogEvent::RunCancelled {
            error: error.clone(),
            by: Some("parent".into()),
            parent_run_id: Some("p".into()),
            code: Some("PARENT_ENDED".into()),
        },
        LogEvent::RunTimedOut { error },
        LogEvent::CallbackDelivered(report.clone()),
        LogEvent::CallbackFailed(report),
        LogEvent::RunClosed {
            outcome: RunState::Completed,
        },
    ]
}

#[test]
fn every_kind_has_its_fields_and_reads_back_as_written() {
    let events = one_of_each();
    let kinds: Vec<EventKind> = events.iter().map(LogEvent::kind).collect();
    assert_eq!(
        kinds, ALL_EVENTS,
        "one variant per kind, in ALL_EVENTS' order"
    );
    for event in events {
        let kind = event.kind();
        let written = serde_json::to_value(&event).unwrap();
        assert_eq!(written["type"], kind.as_str());
        let fields = event.fields();
        // The API shows them beside the event's own number and time.
        for own in ["type", "seq", "at"] {
            assert!(fields.get(own).is_none(), "{own} in {fields}");
        }
        assert_eq!(LogEvent::from_parts(kind.as_str(), fields), Ok(event));
    }
}

#[test]
fn fields_that_say_nothing_are_left_out_and_missing_ones_are_refused() {
    let quiet = LogEvent::RunCancelled {
        error: None,
        by: None,
        parent_run_id: None,
        code: None,
    };
    assert_eq!(quiet.fields(), json!({}));
    let read = LogEvent::from_parts("tool_call", json!({"call_id": "c"}));
    assert!(read.unwrap_err().contains("tool_call"));
    assert!(LogEvent::from_parts("no_such_kind", json!({})).is_err());
    assert!(LogEvent::from_parts("run_closed", json!([1])).is_err());
    // A chain_broken event stored before the log was typed.
    let stored = json!({"chain_id": "c", "at": 2, "state": "FAILED", "skipped": []});
    let read = LogEvent::from_parts("chain_broken", stored).unwrap();
    assert!(
        matches!(read, LogEvent::ChainBroken { index: 2, .. }),
        "{read:?}"
    );
}

#[test]
fn a_kind_is_named_as_it_is_written() {
    for kind in ALL_EVENTS {
        let written = serde_json::to_value(kind).unwrap();
        assert_eq!(written, kind.as_str());
        assert_eq!(kind.as_str().parse::<EventKind>(), Ok(kind));
    }
    assert_eq!(EventKind::ChainStepStarted.as_str(), "chain_step_started");
    assert_eq!(
        serde_json::to_value(EventKind::ChainStepStarted).unwrap(),
        "chain_step_started"
    );
    assert!("nothing".parse::<EventKind>().is_err());
}
