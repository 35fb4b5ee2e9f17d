//! The session policy judged by a small evaluator of the IAM rules it
//! uses (Allow statements, `*`/`?` globs on actions and resources,
//! `ForAllValues:StringLike` on `dynamodb:LeadingKeys`): identity A's task
//! may do its own work and nothing of identity B's.

use super::*;

fn glob(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], t) || (!t.is_empty() && go(p, &t[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &t[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &t[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => vec![],
    }
}

/// Whether `policy` allows `action` on `resource` with these leading keys
/// and, for a write, the attributes it names (a full record write names
/// the control half; [`REPORT_ATTRIBUTES`] is the report's).
fn allows(policy: &Value, action: &str, resource: &str, leading_keys: &[&str]) -> bool {
    let attrs: &[&str] = if action == "dynamodb:GetItem" {
        &[]
    } else {
        &[
            "sandbox_key",
            "doc",
            "tenant",
            "agent",
            "state",
            "generation",
            "version",
        ]
    };
    allows_naming(policy, action, resource, leading_keys, attrs)
}

fn allows_naming(
    policy: &Value,
    action: &str,
    resource: &str,
    leading_keys: &[&str],
    attributes: &[&str],
) -> bool {
    policy["Statement"].as_array().unwrap().iter().any(|st| {
        st["Effect"] == "Allow"
            && strings(&st["Action"]).iter().any(|a| glob(a, action))
            && strings(&st["Resource"]).iter().any(|r| glob(r, resource))
            && conditions_hold(&st["Condition"], leading_keys, attributes)
    })
}

/// `ForAllValues:` operators: every value the request has for the key
/// matches one of the statement's.
fn conditions_hold(condition: &Value, leading_keys: &[&str], attributes: &[&str]) -> bool {
    let Some(ops) = condition.as_object() else {
        return condition.is_null();
    };
    ops.iter().all(|(op, keys)| {
        let matches: fn(&str, &str) -> bool = match op.as_str() {
            "ForAllValues:StringLike" => glob,
            "ForAllValues:StringEquals" => |p, t| p == t,
            other => panic!("the evaluator does not know {other}"),
        };
        keys.as_object().unwrap().iter().all(|(key, allowed)| {
            let given = match key.as_str() {
                "dynamodb:LeadingKeys" => leading_keys,
                "dynamodb:Attributes" => attributes,
                other => panic!("the evaluator does not know {other}"),
            };
            let allowed = strings(allowed);
            given.iter().all(|g| allowed.iter().any(|p| matches(p, g)))
        })
    })
}

fn arns() -> PlatformArns {
    PlatformArns {
        sqs_prefix: "arn:aws:sqs:eu-west-1:123456789012:".into(),
        harness_queue: "arn:aws:sqs:eu-west-1:123456789012:armada-harness.fifo".into(),
        dispatch_queue: "arn:aws:sqs:eu-west-1:123456789012:armada-dispatch".into(),
        sandboxes_table: "arn:aws:dynamodb:eu-west-1:123456789012:table/armada-sandboxes".into(),
        payload_bucket: "arn:aws:s3:::armada-payloads".into(),
    }
}

const TABLE: &str = "arn:aws:dynamodb:eu-west-1:123456789012:table/armada-sandboxes";
const Q: &str = "arn:aws:sqs:eu-west-1:123456789012:";

#[test]
fn a_task_does_its_own_work() {
    let p = session_policy("acme", "coder", "armada-hand-aaaa-g3.fifo", &arns());
    let own_queue = format!("{Q}armada-hand-aaaa-g3.fifo");
    for action in [
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
    ] {
        assert!(allows(&p, action, &own_queue, &[]), "{action}");
    }
    assert!(allows(
        &p,
        "sqs:SendMessage",
        &format!("{Q}armada-harness.fifo"),
        &[]
    ));
    assert!(allows(
        &p,
        "sqs:SendMessage",
        &format!("{Q}armada-dispatch"),
        &[]
    ));
    for action in [
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
    ] {
        assert!(
            allows(&p, action, TABLE, &["call#acme#coder#run_1#c1#1"]),
            "{action}"
        );
    }
    // Its record: read it, and write its report.
    assert!(allows(&p, "dynamodb:GetItem", TABLE, &["acme#coder"]));
    assert!(allows_naming(
        &p,
        "dynamodb:UpdateItem",
        TABLE,
        &["acme#coder"],
        &REPORT_ATTRIBUTES
    ));
    for key in ["g3/workspace.tar.gz", "outcomes/run_1/c1-1.json"] {
        let object = format!("arn:aws:s3:::armada-payloads/sandboxes/acme/coder/{key}");
        assert!(allows(&p, "s3:GetObject", &object, &[]));
        assert!(allows(&p, "s3:PutObject", &object, &[]));
    }
}

#[test]
fn a_task_can_touch_nothing_of_another_identity() {
    let p = session_policy("acme", "coder", "armada-hand-aaaa-g3.fifo", &arns());
    // B's calls: another identity's hand queue, or another generation's.
    for queue in ["armada-hand-bbbb-g1.fifo", "armada-hand-aaaa-g2.fifo"] {
        let arn = format!("{Q}{queue}");
        for action in ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:SendMessage"] {
            assert!(!allows(&p, action, &arn, &[]), "{action} {queue}");
        }
    }
    // B's record and marks, and names that only begin like A's.
    for key in [
        "beta#coder",
        "acme#coder2",
        "call#beta#coder#run_9#c1#1",
        "call#acme#coder2#run_9#c1#1",
        "port#10.0.0.1#8081",
    ] {
        for action in [
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
        ] {
            assert!(!allows(&p, action, TABLE, &[key]), "{action} {key}");
        }
        assert!(!allows(&p, "dynamodb:GetItem", TABLE, &["acme#coder", key]));
    }
    // Reads that take no key, deletes, other tables.
    for action in [
        "dynamodb:Scan",
        "dynamodb:Query",
        "dynamodb:DeleteItem",
        "dynamodb:BatchGetItem",
    ] {
        assert!(!allows(&p, action, TABLE, &["acme#coder"]), "{action}");
    }
    assert!(!allows(
        &p,
        "dynamodb:GetItem",
        "arn:aws:dynamodb:eu-west-1:123456789012:table/armada-runs",
        &["acme#coder"]
    ));
    // B's snapshot and outcomes, and a prefix that only begins like A's.
    for object in [
        "sandboxes/beta/coder/g1/workspace.tar.gz",
        "sandboxes/acme/coder2/g1/workspace.tar.gz",
        "payloads/run_1/input.json",
    ] {
        let arn = format!("arn:aws:s3:::armada-payloads/{object}");
        assert!(!allows(&p, "s3:GetObject", &arn, &[]), "{object}");
        assert!(!allows(&p, "s3:PutObject", &arn, &[]), "{object}");
    }
    assert!(!allows(
        &p,
        "s3:DeleteObject",
        "arn:aws:s3:::armada-payloads/sandboxes/acme/coder/g3/workspace.tar.gz",
        &[]
    ));
}

#[test]
fn a_task_cannot_write_the_control_half_of_its_record() {
    let p = session_policy("acme", "coder", "armada-hand-aaaa-g3.fifo", &arns());
    // A put replaces the whole item; an update may name the report only.
    assert!(!allows(&p, "dynamodb:PutItem", TABLE, &["acme#coder"]));
    assert!(!allows(&p, "dynamodb:UpdateItem", TABLE, &["acme#coder"]));
    for control in [
        "doc",
        "tenant",
        "agent",
        "state",
        "generation",
        "expires_at",
    ] {
        assert!(
            !allows_naming(
                &p,
                "dynamodb:UpdateItem",
                TABLE,
                &["acme#coder"],
                &["sandbox_key", "report", control]
            ),
            "{control}"
        );
    }
    // Nor another identity's report, nor a mark through the report's right.
    for key in ["beta#coder", "acme#coder2", "uid#acme#coder", "uid-counter"] {
        assert!(
            !allows_naming(&p, "dynamodb:UpdateItem", TABLE, &[key], &REPORT_ATTRIBUTES),
            "{key}"
        );
        assert!(!allows(&p, "dynamodb:GetItem", TABLE, &[key]), "{key}");
    }
}

#[test]
fn the_evaluator_itself_matches_globs() {
    assert!(glob("call#a#b#*", "call#a#b#x"));
    assert!(!glob("call#a#b#*", "call#a#bb#x"));
    assert!(glob("s3:*", "s3:GetObject"));
    assert!(!glob("a?c", "ac"));
}

#[test]
fn the_keys_an_agent_writes_are_the_ones_its_policy_allows() {
    let p = session_policy("acme", "coder", "armada-hand-aaaa-g3.fifo", &arns());
    let mark = mark_key("acme", "coder", "run_1", "c1", 2);
    assert_eq!(mark, "call#acme#coder#run_1#c1#2");
    assert!(allows(&p, "dynamodb:PutItem", TABLE, &[&mark]));
    assert!(!allows(
        &p,
        "dynamodb:PutItem",
        TABLE,
        &[&mark_key("beta", "coder", "run_1", "c1", 2)]
    ));
    for key in [
        outcome_key("acme", "coder", "run_1", "c1", 2),
        snapshot_key("acme", "coder", 3),
    ] {
        let arn = format!("arn:aws:s3:::armada-payloads/{key}");
        assert!(allows(&p, "s3:PutObject", &arn, &[]), "{key}");
    }
    for key in [
        outcome_key("beta", "coder", "run_1", "c1", 2),
        snapshot_key("acme", "coder2", 3),
    ] {
        let arn = format!("arn:aws:s3:::armada-payloads/{key}");
        assert!(!allows(&p, "s3:GetObject", &arn, &[]), "{key}");
    }
}

#[test]
fn arns_are_derived_from_the_role_and_the_names() {
    let got = PlatformArns::derive(
        "arn:aws:iam::123456789012:role/armada-sandbox-identity",
        "eu-west-1",
        "https://sqs.eu-west-1.amazonaws.com/123456789012/armada-harness.fifo",
        "https://sqs.eu-west-1.amazonaws.com/123456789012/armada-dispatch",
        "armada-sandboxes",
        "armada-payloads",
    );
    assert_eq!(got, Some(arns()));
    let china = PlatformArns::derive(
        "arn:aws-cn:iam::1:role/r",
        "cn-north-1",
        "q/h",
        "q/d",
        "t",
        "b",
    )
    .unwrap();
    assert_eq!(china.sqs_prefix, "arn:aws-cn:sqs:cn-north-1:1:");
    assert_eq!(china.payload_bucket, "arn:aws-cn:s3:::b");
    for bad in ["role/x", "arn:aws:s3:::bucket", "arn:aws:iam:::role/x"] {
        assert_eq!(
            PlatformArns::derive(bad, "eu-west-1", "q/h", "q/d", "t", "b"),
            None,
            "{bad}"
        );
    }
}

#[test]
fn the_policy_fits_the_session_policy_limit() {
    // AWS takes at most 2,048 characters of plaintext session policy.
    let long = "a".repeat(63);
    let p = session_policy(
        &long,
        &long,
        &format!("armada-hand-{}-g99999.fifo", "f".repeat(16)),
        &arns(),
    );
    let text = p.to_string();
    assert!(text.len() < 2048, "{} characters", text.len());
}
