use serde_json::json;

use super::*;
use crate::skills::{builtin, FILE_WRITE, HTTP_REQUEST, SHELL_EXEC};

fn manifest(name: &str, risk: Risk) -> SkillManifest {
    let mut m = builtin(HTTP_REQUEST).unwrap();
    m.name = name.to_string();
    m.risk = risk;
    m
}

/// A rule's row: name, policy, skill, arguments, facts, the risk an
/// approval is asked at (`None`: it executes).
type Row<'a> = (
    &'a str,
    &'a ApprovalPolicy,
    SkillManifest,
    serde_json::Value,
    CallFacts,
    Option<Risk>,
);

fn approve(g: &Gate) -> Option<Risk> {
    match g {
        Gate::Execute => None,
        Gate::Approve { risk, .. } => Some(*risk),
    }
}

#[test]
fn the_rules_row_by_row() {
    let approve_medium = ApprovalPolicy {
        medium: MediumRisk::Approve,
        ..ApprovalPolicy::default()
    };
    let require_deploy = ApprovalPolicy {
        require: vec!["deploy".into()],
        ..ApprovalPolicy::default()
    };
    let none = CallFacts::default();
    let sandbox = CallFacts {
        in_sandbox: true,
        destructive_mount: false,
    };
    let rw_mount = CallFacts {
        in_sandbox: true,
        destructive_mount: true,
    };
    let default = ApprovalPolicy::default();
    let shell = |c: &str| json!({ "command": c });
    let rows: Vec<Row<'_>> = vec![
        (
            "low executes",
            &default,
            manifest("lookup", Risk::Low),
            json!({}),
            none,
            None,
        ),
        (
            "high needs approval",
            &default,
            manifest("wire_money", Risk::High),
            json!({}),
            none,
            Some(Risk::High),
        ),
        (
            "medium executes by default",
            &default,
            manifest("send", Risk::Medium),
            json!({}),
            none,
            None,
        ),
        (
            "medium: approve",
            &approve_medium,
            manifest("send", Risk::Medium),
            json!({}),
            none,
            Some(Risk::Medium),
        ),
        (
            "medium: approve leaves low alone",
            &approve_medium,
            manifest("lookup", Risk::Low),
            json!({}),
            none,
            None,
        ),
        (
            "require names it",
            &require_deploy,
            manifest("deploy", Risk::Low),
            json!({}),
            none,
            Some(Risk::Low),
        ),
        (
            "require names another",
            &require_deploy,
            manifest("lookup", Risk::Low),
            json!({}),
            none,
            None,
        ),
        (
            "rw mount: every sandbox call",
            &default,
            builtin(FILE_WRITE).unwrap(),
            json!({"path": "a", "content": "b"}),
            rw_mount,
            Some(Risk::High),
        ),
        (
            "rw mount: inline calls are not sandbox work",
            &default,
            builtin(HTTP_REQUEST).unwrap(),
            json!({"url": "https://x"}),
            CallFacts {
                in_sandbox: false,
                destructive_mount: true,
            },
            None,
        ),
        (
            "shell: ls",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("ls -la"),
            sandbox,
            None,
        ),
        (
            "shell: rm -rf",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("rm -rf build"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: rm -r",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("rm -r build"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: rm -fR",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("rm -fR build"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: rm --recursive",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("rm --recursive x"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: /bin/rm -r behind sudo",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("sudo /bin/rm -r x"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: rm of one file",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("rm -f notes.txt"),
            sandbox,
            None,
        ),
        (
            "shell: rm -r after &&",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("cd src && rm -r gen"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: rm -r through xargs",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("ls | xargs rm -r"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: find -delete",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("find . -name '*.o' -delete"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: find -name",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("find . -name '*.rs'"),
            sandbox,
            None,
        ),
        (
            "shell: git reset --hard",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("git reset --hard HEAD~1"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: git reset --soft",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("git reset --soft HEAD~1"),
            sandbox,
            None,
        ),
        (
            "shell: git clean -fd",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("git clean -fd"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: git -C repo clean -f",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("git -C repo clean -f"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: git clean -n",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("git clean -n"),
            sandbox,
            None,
        ),
        (
            "shell: git status",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("git status"),
            sandbox,
            None,
        ),
        (
            "shell: A=1 rm -r",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("A=1 rm -r x"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: in a subshell",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("(cd x; rm -rf y)"),
            sandbox,
            Some(Risk::High),
        ),
        (
            "shell: on a later line",
            &default,
            builtin(SHELL_EXEC).unwrap(),
            shell("echo hi\nrm -rf /work"),
            sandbox,
            Some(Risk::High),
        ),
    ];
    for (name, policy, m, args, facts, want) in rows {
        let got = gate(policy, &m, &args, facts);
        assert_eq!(approve(&got), want, "{name}: {got:?}");
        if let Gate::Approve { reasons, .. } = got {
            assert!(!reasons.is_empty(), "{name}: a gate says why");
        }
    }
}

#[test]
fn the_policy_parses_and_names_bad_fields() {
    let parse = |v: serde_json::Value| {
        let map = v.as_object().unwrap().clone();
        let f = Fields::nested(&map, "approvals").unwrap();
        ApprovalPolicy::from_fields(&f)
    };
    let p = parse(json!({
        "require": ["deploy"], "medium": "approve", "approvers": ["ops@example.com"],
        "chat_webhook_url": "https://chat.example.com/hook", "expires_s": 600,
        "on_reject": "fail", "allow_self_approval": true, "indeterminate": "ask",
        "destructive": "effect"
    }))
    .unwrap();
    assert_eq!(p.destructive, Destructive::Effect);
    assert_eq!(p.medium, MediumRisk::Approve);
    assert_eq!(p.on_reject, OnReject::Fail);
    assert_eq!(p.indeterminate, OnIndeterminate::Ask);
    assert_eq!(p.expires_s, 600);
    assert!(p.allow_self_approval);
    let d = parse(json!({})).unwrap();
    assert_eq!(d, ApprovalPolicy::default());
    for (body, field) in [
        (json!({"medium": "sometimes"}), "approvals.medium"),
        (
            json!({"approvers": ["not an address"]}),
            "approvals.approvers[0]",
        ),
        (
            json!({"approvers": "ops@example.com"}),
            "approvals.approvers",
        ),
        (json!({"expires_s": 1}), "approvals.expires_s"),
        (json!({"expires_s": 8 * 86400}), "approvals.expires_s"),
        (json!({"on_reject": "ignore"}), "approvals.on_reject"),
        (json!({"destructive": "never"}), "approvals.destructive"),
        (
            json!({"chat_webhook_url": "ftp://x"}),
            "approvals.chat_webhook_url",
        ),
        (json!({"approver": ["a@b.c"]}), "approvals.approver"),
        (json!({"indeterminate": "guess"}), "approvals.indeterminate"),
    ] {
        assert_eq!(parse(body.clone()).unwrap_err().field, field, "{body}");
    }
}

#[test]
fn emails() {
    for ok in ["a@b.co", "first.last+tag@mail.example.com"] {
        assert!(valid_email(ok), "{ok}");
    }
    for bad in [
        "",
        "a",
        "a@b",
        "@b.co",
        "a@.co",
        "a b@c.co",
        "a@b.co>",
        "a@b@c.co",
        "a@b.co\r\nBcc: x@y.z",
    ] {
        assert!(!valid_email(bad), "{bad:?}");
    }
}
