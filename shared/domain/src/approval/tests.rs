use serde_json::json;

use super::*;

fn pending(risk: Risk, allow_self: bool) -> Approval {
    let policy = ApprovalPolicy {
        approvers: vec!["ops@example.com".into()],
        expires_s: 60,
        allow_self_approval: allow_self,
        ..ApprovalPolicy::default()
    };
    let req = ApprovalRequest {
        kind: Default::default(),
        call_id: "c1".into(),
        tool: "deploy".into(),
        args: json!({"env": "prod"}),
        risk,
        reasons: vec!["deploy is a high-risk skill".into()],
    };
    Approval::new(
        "t",
        "run_1",
        "ops",
        2,
        Some("key_starter".into()),
        &policy,
        req,
        1_000,
    )
}

/// An uncertain call of the same Run, asking whether it happened.
fn uncertain(allow_self: bool) -> Approval {
    let mut a = pending(Risk::Low, allow_self);
    a.kind = ApprovalKind::Indeterminate;
    a
}

fn key(id: &str) -> Decider {
    Decider::Key { key_id: id.into() }
}

#[test]
fn ids_are_derived_from_the_run_and_the_call() {
    assert_eq!(approval_id("run_1", "c1"), approval_id("run_1", "c1"));
    assert_ne!(approval_id("run_1", "c1"), approval_id("run_1", "c2"));
    assert_ne!(approval_id("run_1", "c1"), approval_id("run_2", "c1"));
    assert!(approval_id("r", "c").starts_with("apv_"));
}

#[test]
fn one_decision_and_only_one() {
    let mut a = pending(Risk::High, false);
    a.decide(
        Verdict::Approve,
        &key("key_boss"),
        Some("10.0.0.1".into()),
        Some("go".into()),
        2_000,
    )
    .unwrap();
    assert_eq!(a.state, ApprovalState::Approved);
    assert_eq!(a.version, 1);
    let d = a.decision.clone().unwrap();
    assert_eq!(
        (d.by.as_str(), d.how.as_str(), d.at_ms),
        ("key_boss", "key", 2_000)
    );
    assert_eq!(d.from.as_deref(), Some("10.0.0.1"));
    // The same again (a double click), or the opposite: refused, unchanged.
    for v in [Verdict::Approve, Verdict::Reject] {
        let e = a
            .decide(v, &key("key_boss"), None, None, 2_001)
            .unwrap_err();
        assert_eq!(e.code(), codes::APPROVAL_DECIDED);
    }
    assert_eq!((a.state, a.version), (ApprovalState::Approved, 1));
    assert!(a.refusal().is_none());
}

#[test]
fn the_starting_key_lets_nothing_of_its_own_run_go_on_unless_allowed() {
    // Every gate, whatever its risk (high, `medium: approve`, `require`d
    // low), and the go-ahead answers to an uncertain call.
    let own_go_aheads = [
        (Risk::High, Verdict::Approve),
        (Risk::Medium, Verdict::Approve),
        (Risk::Low, Verdict::Approve),
    ]
    .into_iter()
    .map(|(risk, v)| (pending(risk, false), v))
    .chain([
        (uncertain(false), Verdict::Retry),
        (
            uncertain(false),
            Verdict::Happened {
                result: json!("done"),
            },
        ),
    ]);
    for (a, v) in own_go_aheads {
        let mut mine = a.clone();
        let e = mine
            .decide(v.clone(), &key("key_starter"), None, None, 2_000)
            .unwrap_err();
        assert_eq!(e, ApprovalRefusal::SelfApproval(false), "{v:?}");
        assert_eq!((mine.state, mine.version), (ApprovalState::Pending, 0));
        // A second person may; and so may the starter when allowed.
        a.clone()
            .decide(v.clone(), &key("key_boss"), None, None, 2_000)
            .unwrap();
        let mut allowed = a;
        allowed.allow_self_approval = true;
        allowed
            .decide(v, &key("key_starter"), None, None, 2_000)
            .unwrap();
    }
    // Stopping one's own work is always allowed.
    let mut rejected = pending(Risk::High, false);
    rejected
        .decide(Verdict::Reject, &key("key_starter"), None, None, 2_000)
        .unwrap();
    assert_eq!(rejected.state, ApprovalState::Rejected);
    let mut failed = uncertain(false);
    failed
        .decide(Verdict::Fail, &key("key_starter"), None, None, 2_000)
        .unwrap();
    assert_eq!(failed.state, ApprovalState::Rejected);
    // The policy's word is what the approval was created with.
    let mut allowed = pending(Risk::Medium, true);
    allowed
        .decide(Verdict::Approve, &key("key_starter"), None, None, 2_000)
        .unwrap();
}

#[test]
fn tokens_are_single_use_and_only_their_approvals() {
    let mut a = pending(Risk::High, false);
    a.mint_token("ops@example.com", "secret-token-1", 1_500)
        .unwrap();
    assert!(
        a.tokens.iter().all(|t| t.sha256 != "secret-token-1"),
        "only hashes are kept"
    );
    assert_eq!(a.token_recipient("secret-token-1"), Some("ops@example.com"));
    let forged = Decider::Token {
        token: "guess".into(),
    };
    let e = a
        .decide(Verdict::Approve, &forged, None, None, 2_000)
        .unwrap_err();
    assert_eq!(e.code(), codes::TOKEN_INVALID);
    let mut other = pending(Risk::High, false);
    other.approval_id = "apv_other".into();
    let real = Decider::Token {
        token: "secret-token-1".into(),
    };
    assert_eq!(
        other
            .decide(Verdict::Approve, &real, None, None, 2_000)
            .unwrap_err()
            .code(),
        codes::TOKEN_INVALID
    );
    a.decide(Verdict::Reject, &real, None, Some("not now".into()), 2_000)
        .unwrap();
    assert_eq!(a.decision.as_ref().unwrap().by, "ops@example.com");
    assert_eq!(a.decision.as_ref().unwrap().how, "token");
    let (code, msg) = a.refusal().unwrap();
    assert_eq!(code, codes::APPROVAL_REJECTED);
    assert!(msg.contains("not now"), "{msg}");
    // Used: it decides nothing more.
    let e = a
        .decide(Verdict::Approve, &real, None, None, 2_001)
        .unwrap_err();
    assert_eq!(e.code(), codes::APPROVAL_DECIDED);
    // Reminting a link for a decided approval is refused.
    assert!(a.mint_token("ops@example.com", "again", 2_002).is_err());
}

#[test]
fn a_new_link_voids_the_old_one_for_that_recipient() {
    let mut a = pending(Risk::High, false);
    a.mint_token("ops@example.com", "first", 1_100).unwrap();
    a.mint_token(CHAT_RECIPIENT, "chat-token", 1_100).unwrap();
    a.mint_token("ops@example.com", "second", 1_200).unwrap();
    assert_eq!(a.token_recipient("first"), None);
    assert_eq!(a.token_recipient("second"), Some("ops@example.com"));
    assert_eq!(a.token_recipient("chat-token"), Some(CHAT_RECIPIENT));
}

#[test]
fn expiry_counts_as_a_rejection_and_ends_every_way_of_deciding() {
    let mut a = pending(Risk::High, false);
    a.mint_token("ops@example.com", "tok", 1_000).unwrap();
    assert!(a.expire(60_999).is_err(), "not yet due");
    let e = a
        .decide(
            Verdict::Approve,
            &Decider::Token {
                token: "tok".into(),
            },
            None,
            None,
            61_000,
        )
        .unwrap_err();
    assert_eq!(e.code(), codes::APPROVAL_EXPIRED);
    a.expire(61_000).unwrap();
    assert_eq!(a.state, ApprovalState::Expired);
    assert_eq!(a.refusal().unwrap().0, codes::APPROVAL_EXPIRED);
    assert!(a.expire(62_000).is_err(), "once");
    assert!(a.cancel(62_000).is_err());
}

#[test]
fn a_cancelled_runs_approval_says_so() {
    let mut a = pending(Risk::High, false);
    a.cancel(2_000).unwrap();
    let e = a
        .decide(Verdict::Approve, &key("key_boss"), None, None, 2_001)
        .unwrap_err();
    assert_eq!(e.code(), codes::APPROVAL_CANCELLED);
}

/// Four eyes through links too: the starter's own address, among the
/// approvers, gets a link that may stop its Run but not let it go on
/// (unless the agent allows self-approval); another approver's link may.
#[test]
fn the_starters_own_link_stops_its_run_but_never_lets_it_go_on() {
    let starter = |allow_self: bool| {
        let mut a = pending(Risk::High, allow_self);
        a.approvers.push("Alice@Example.com".into());
        a.requested_by_address = Some("alice@example.com".into());
        a.mint_token("Alice@Example.com", "alice-token", 1_500)
            .unwrap();
        a.mint_token("ops@example.com", "ops-token", 1_500).unwrap();
        a
    };
    let link = |t: &str| Decider::Token { token: t.into() };
    let mut a = starter(false);
    let e = a
        .decide(Verdict::Approve, &link("alice-token"), None, None, 2_000)
        .unwrap_err();
    assert_eq!(e, ApprovalRefusal::SelfApproval(true));
    assert_eq!(a.state, ApprovalState::Pending, "nothing was decided");
    a.decide(Verdict::Approve, &link("ops-token"), None, None, 2_000)
        .unwrap();
    assert_eq!(a.state, ApprovalState::Approved);
    let mut a = starter(false);
    a.decide(Verdict::Reject, &link("alice-token"), None, None, 2_000)
        .unwrap();
    assert_eq!(a.state, ApprovalState::Rejected, "stopping one's own work");
    let mut a = starter(true);
    a.decide(Verdict::Approve, &link("alice-token"), None, None, 2_000)
        .unwrap();
    assert_eq!(a.state, ApprovalState::Approved, "the agent allows it");
}

/// The approval's machine in the common shape: each event returns what the
/// handler does next, and a refusal changes nothing.
#[test]
fn the_machine_says_what_follows_each_event() {
    use crate::machine::Machine;
    let mut a = pending(Risk::High, false);
    let mint = ApprovalEvent::MintToken {
        recipient: "ops@example.com".into(),
        token: "t1".into(),
    };
    assert_eq!(
        a.apply(mint, 1_500).unwrap(),
        vec![ApprovalAction::SendLink {
            recipient: "ops@example.com".into(),
            token: "t1".into()
        }]
    );
    let before = a.clone();
    let own = ApprovalEvent::Decide {
        verdict: Verdict::Approve,
        by: key("key_starter"),
        from: None,
        comment: None,
    };
    assert_eq!(
        a.apply(own, 2_000).unwrap_err(),
        ApprovalRefusal::SelfApproval(false)
    );
    assert_eq!(a, before, "a refusal changes nothing");
    let boss = ApprovalEvent::Decide {
        verdict: Verdict::Approve,
        by: key("key_boss"),
        from: None,
        comment: None,
    };
    assert_eq!(
        a.apply(boss, 2_000).unwrap(),
        vec![ApprovalAction::ResumeRun]
    );
    assert_eq!(
        a.apply(ApprovalEvent::Cancel, 2_001).unwrap_err(),
        ApprovalRefusal::AlreadyDecided("approved")
    );
    let mut late = pending(Risk::High, false);
    assert_eq!(
        late.apply(ApprovalEvent::Expire, 2_000).unwrap_err(),
        ApprovalRefusal::NotOverdue
    );
    assert_eq!(
        late.apply(ApprovalEvent::Expire, 61_000).unwrap(),
        vec![ApprovalAction::ResumeRun]
    );
    let mut gone = pending(Risk::High, false);
    assert!(gone.apply(ApprovalEvent::Cancel, 2_000).unwrap().is_empty());
    assert_eq!(gone.version(), 1, "each change is a new version");
}
