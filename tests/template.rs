//! `infra/template.yaml` is the one list of resources: the local stack
//! creates exactly what it declares, it passes cfn-lint, and its queues give
//! each consumer at least six function timeouts of visibility.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_sqs::types::QueueAttributeName;
use serde_norway::Value;

use armada_cli::local::emulator;
use armada_cli::local::template::Template;
use armada_tests::{root, TestStack};

/// What a deployment must give (and the account CloudFormation knows).
fn deploy_parameters() -> HashMap<String, String> {
    armada_tests::params(&[
        ("AdminKeySha256", &"0".repeat(64)),
        ("CallbackSigningSecret", "0123456789abcdef"),
        ("SandboxSubnets", "subnet-1"),
        ("SandboxSecurityGroups", "sg-1"),
        ("AWS::AccountId", "123456789012"),
    ])
}

fn raw_template() -> Value {
    serde_norway::from_str(&std::fs::read_to_string(root().join("infra/template.yaml")).unwrap())
        .unwrap()
}

/// Resources of a type, read straight from the YAML (not through the local
/// stack's own parser), with `${AWS::StackName}` substituted.
fn declared(doc: &Value, ty: &str, name_prop: &str, stack: &str) -> BTreeMap<String, Value> {
    doc["Resources"]
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"].as_str() == Some(ty))
        .map(|(id, r)| {
            let name = r["Properties"][name_prop]["Fn::Sub"]
                .as_str()
                .map(|s| s.replace("${AWS::StackName}", stack))
                .unwrap_or_else(|| {
                    format!("{stack}-{}", id.as_str().unwrap().to_ascii_lowercase())
                });
            (name, r["Properties"].clone())
        })
        .collect()
}

fn pairs(v: &Value, a: &str, b: &str) -> BTreeSet<(String, String)> {
    v.as_sequence()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e[a].as_str().unwrap().to_string(),
                e[b].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_resources_are_exactly_the_templates() {
    let t = TestStack::start().await;
    let stack = t.stack.template.stack().to_string();
    let doc = raw_template();
    let aws = &t.stack.aws;

    let tables = declared(&doc, "AWS::DynamoDB::Table", "TableName", &stack);
    assert_eq!(tables.len(), 9, "nine tables are declared");
    // A page holds 100 names, and the emulator holds every stack of this
    // test process: every page is read.
    let mut listed: BTreeSet<String> = BTreeSet::new();
    let mut after: Option<String> = None;
    loop {
        let page = aws
            .dynamo
            .list_tables()
            .set_exclusive_start_table_name(after.clone())
            .send()
            .await
            .unwrap();
        listed.extend(
            page.table_names()
                .iter()
                .filter(|n| n.starts_with(&format!("{stack}-")))
                .cloned(),
        );
        after = page.last_evaluated_table_name().map(str::to_string);
        if after.is_none() {
            break;
        }
    }
    assert_eq!(listed, tables.keys().cloned().collect::<BTreeSet<_>>());
    for (name, props) in &tables {
        let d = aws
            .dynamo
            .describe_table()
            .table_name(name)
            .send()
            .await
            .unwrap();
        let d = d.table().unwrap();
        let key: BTreeSet<(String, String)> = d
            .key_schema()
            .iter()
            .map(|k| {
                (
                    k.attribute_name().to_string(),
                    k.key_type().as_str().to_string(),
                )
            })
            .collect();
        assert_eq!(
            key,
            pairs(&props["KeySchema"], "AttributeName", "KeyType"),
            "{name}"
        );
        let attrs: BTreeSet<(String, String)> = d
            .attribute_definitions()
            .iter()
            .map(|a| {
                (
                    a.attribute_name().to_string(),
                    a.attribute_type().as_str().to_string(),
                )
            })
            .collect();
        assert_eq!(
            attrs,
            pairs(
                &props["AttributeDefinitions"],
                "AttributeName",
                "AttributeType"
            ),
            "{name}"
        );
        let gsis: BTreeMap<String, BTreeSet<(String, String)>> = d
            .global_secondary_indexes()
            .iter()
            .map(|g| {
                (
                    g.index_name().unwrap().to_string(),
                    g.key_schema()
                        .iter()
                        .map(|k| {
                            (
                                k.attribute_name().to_string(),
                                k.key_type().as_str().to_string(),
                            )
                        })
                        .collect(),
                )
            })
            .collect();
        let want: BTreeMap<String, BTreeSet<(String, String)>> = props["GlobalSecondaryIndexes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|g| {
                (
                    g["IndexName"].as_str().unwrap().to_string(),
                    pairs(&g["KeySchema"], "AttributeName", "KeyType"),
                )
            })
            .collect();
        assert_eq!(gsis, want, "{name}");
    }

    let queues = declared(&doc, "AWS::SQS::Queue", "QueueName", &stack);
    let listed: BTreeSet<String> = aws
        .sqs
        .list_queues()
        .queue_name_prefix(format!("{stack}-"))
        .send()
        .await
        .unwrap()
        .queue_urls()
        .iter()
        .map(|u| u.rsplit('/').next().unwrap().to_string())
        .collect();
    assert_eq!(listed, queues.keys().cloned().collect::<BTreeSet<_>>());
    let template = &t.stack.template;
    for (name, props) in &queues {
        let url = aws
            .sqs
            .get_queue_url()
            .queue_name(name)
            .send()
            .await
            .unwrap()
            .queue_url()
            .unwrap()
            .to_string();
        let attrs: HashMap<QueueAttributeName, String> = aws
            .sqs
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .unwrap()
            .attributes()
            .cloned()
            .unwrap_or_default();
        let fifo = props["FifoQueue"].as_bool().unwrap_or(false);
        assert_eq!(
            attrs
                .get(&QueueAttributeName::FifoQueue)
                .map(String::as_str)
                == Some("true"),
            fifo,
            "{name}"
        );
        if let Some(v) = props.get("VisibilityTimeout") {
            let want = template.resolve_str(v).unwrap();
            assert_eq!(
                attrs[&QueueAttributeName::VisibilityTimeout],
                want,
                "{name}"
            );
        }
        match props.get("RedrivePolicy") {
            Some(rp) => {
                let policy: serde_json::Value =
                    serde_json::from_str(&attrs[&QueueAttributeName::RedrivePolicy]).unwrap();
                let dlq_id = rp["deadLetterTargetArn"]["Fn::GetAtt"][0].as_str().unwrap();
                let dlq_name = template.physical_name(dlq_id).unwrap();
                assert!(
                    policy["deadLetterTargetArn"]
                        .as_str()
                        .unwrap()
                        .ends_with(&format!(":{dlq_name}")),
                    "{policy}"
                );
                let want: u64 = template
                    .resolve_str(&rp["maxReceiveCount"])
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(
                    policy["maxReceiveCount"].to_string().trim_matches('"'),
                    want.to_string()
                );
            }
            None => assert!(
                !attrs.contains_key(&QueueAttributeName::RedrivePolicy),
                "{name}"
            ),
        }
    }
    let buckets = declared(&doc, "AWS::S3::Bucket", "BucketName", &stack);
    for b in buckets.keys() {
        aws.s3.head_bucket().bucket(b).send().await.unwrap();
    }
    // Each topic, and each queue subscribed to it as declared (the mail
    // topic hands SES's notices to the mail queue as they are: raw).
    let topics = declared(&doc, "AWS::SNS::Topic", "TopicName", &stack);
    assert_eq!(topics.len(), 1, "the mail topic");
    {
        let arn = template
            .resolve_str(&serde_norway::from_str("Ref: MailTopic").unwrap())
            .unwrap();
        let name = arn.rsplit(':').next().unwrap().to_string();
        assert!(topics.contains_key(&name), "{arn}");
        let subs = aws
            .sns
            .list_subscriptions_by_topic()
            .topic_arn(&arn)
            .send()
            .await
            .unwrap();
        let queue = template.physical_name("MailQueue").unwrap();
        let sub = subs
            .subscriptions()
            .iter()
            .find(|s| {
                s.endpoint()
                    .is_some_and(|e| e.ends_with(&format!(":{queue}")))
            })
            .unwrap_or_else(|| panic!("{queue} is subscribed to {name}"));
        let attrs = aws
            .sns
            .get_subscription_attributes()
            .subscription_arn(sub.subscription_arn().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(
            attrs
                .attributes()
                .and_then(|a| a.get("RawMessageDelivery"))
                .map(String::as_str),
            Some("true")
        );
    }
    // The sandbox cluster and one task definition per tier, as declared.
    let clusters = declared(&doc, "AWS::ECS::Cluster", "ClusterName", &stack);
    assert_eq!(clusters.len(), 1);
    for name in clusters.keys() {
        let d = aws
            .ecs
            .describe_clusters()
            .clusters(name)
            .send()
            .await
            .unwrap();
        assert_eq!(d.clusters().len(), 1, "{name}");
    }
    let tasks = declared(&doc, "AWS::ECS::TaskDefinition", "Family", &stack);
    assert_eq!(tasks.len(), 2, "standard and large tiers");
    for (family, props) in &tasks {
        let d = aws
            .ecs
            .describe_task_definition()
            .task_definition(family)
            .send()
            .await
            .unwrap();
        let td = d.task_definition().unwrap();
        assert_eq!(td.cpu(), props["Cpu"].as_str(), "{family}");
        assert_eq!(td.memory(), props["Memory"].as_str(), "{family}");
        let c = &td.container_definitions()[0];
        assert_eq!(c.name(), props["ContainerDefinitions"][0]["Name"].as_str());
        assert_eq!(c.command(), ["agent"], "{family}");
    }
    t.stack.stop().await;
}

#[test]
fn template_passes_cfn_lint() {
    let bin = emulator::install_tool(&root(), "cfn-lint", emulator::CFN_LINT_VERSION, "cfn-lint")
        .unwrap();
    let out = std::process::Command::new(bin)
        .arg(root().join("infra/template.yaml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cfn-lint:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The harness and the dispatcher keep their records hidden while they
/// work (a heartbeat every third of the visibility), so their queues need
/// only what Lambda demands (visibility >= the function's timeout) and
/// each must be told its queues' visibility.
#[test]
fn queues_outlast_their_consumers_and_report_batch_failures() {
    let text = std::fs::read_to_string(root().join("infra/template.yaml")).unwrap();
    let t = Template::parse(&text, "s", "us-east-1", &HashMap::new()).unwrap();
    let queues: HashMap<String, _> = t
        .queues()
        .unwrap()
        .into_iter()
        .map(|q| (q.logical_id.clone(), q))
        .collect();
    let mappings = t.event_source_mappings();
    assert_eq!(
        mappings.len(),
        7,
        "dispatch, delivery, alarms, mail, both dead-letter queues, harness"
    );
    for m in mappings {
        let q = &queues[&m.queue_logical_id];
        let timeout = t.function_timeout(&m.function).unwrap();
        let vis = q
            .visibility_timeout
            .expect("every consumed queue sets its visibility");
        assert!(
            vis >= timeout,
            "{}: visibility {vis} < the timeout {timeout}",
            q.name
        );
        let told = match m.function.as_str() {
            "harness" => "ARMADA_HARNESS_QUEUE_VISIBILITY_SECONDS",
            "dispatcher" => "ARMADA_DISPATCH_QUEUE_VISIBILITY_SECONDS",
            other => panic!("{other} consumes {} with no heartbeat", q.name),
        };
        let required = deploy_parameters();
        let deployed = Template::parse(&text, "s", "us-east-1", &required).unwrap();
        let env = deployed.environment(&m.function).unwrap();
        assert_eq!(
            env[told],
            vis.to_string(),
            "{} must know {}'s visibility",
            m.function,
            q.name
        );
        assert!(
            m.report_batch_item_failures,
            "{} must report batch item failures",
            m.function
        );
        assert!(m.batch_size >= 1 && m.batch_size <= 10);
    }
    assert!(queues["HarnessQueue"].fifo && queues["HarnessDeadLetterQueue"].fifo);
}

/// A sandbox task holds no role of its own: its only credentials are the
/// identity role's, assumed per generation by the functions that start and
/// renew them, and narrowed by the session policy to that identity; the
/// role grants at most what the session policies of every identity
/// together need.
#[test]
fn sandbox_tasks_act_only_through_their_identitys_credentials() {
    let doc = raw_template();
    let res = &doc["Resources"];
    for tier in ["SandboxTaskStandard", "SandboxTaskLarge"] {
        assert!(
            res[tier]["Properties"]["TaskRoleArn"].is_null(),
            "{tier} must not carry a task role"
        );
    }
    let role = &res["SandboxIdentityRole"]["Properties"];
    assert_eq!(role["MaxSessionDuration"].as_u64(), Some(3600));
    // Only the dispatcher's and the harness's roles, each by its own ARN:
    // a name pattern (`${AWS::StackName}-*`) would trust another stack
    // whose name starts with this one's.
    let trust = role["AssumeRolePolicyDocument"]["Statement"]
        .as_sequence()
        .unwrap();
    let get_att = |id: &str| -> Value {
        serde_norway::from_str(&format!("{{Fn::GetAtt: [{id}, Arn]}}")).unwrap()
    };
    let (assumers, may_assume) = (
        ["DispatcherFunctionRole", "HarnessFunctionRole"],
        vec![
            get_att("DispatcherFunctionRole"),
            get_att("HarnessFunctionRole"),
        ],
    );
    assert_eq!(trust.len(), 1, "{trust:?}");
    assert_eq!(
        trust[0]["Principal"]["AWS"].as_sequence(),
        Some(&may_assume),
        "the trust names the two roles: {trust:?}"
    );
    assert!(
        trust[0]["Condition"].is_null(),
        "no condition widens or narrows it"
    );
    let granted: BTreeSet<String> = role["Policies"][0]["PolicyDocument"]["Statement"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|st| st["Action"].as_sequence().unwrap().clone())
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let arns = armada_domain::sandbox::access::PlatformArns {
        sqs_prefix: "arn:aws:sqs:r:1:".into(),
        harness_queue: "h".into(),
        dispatch_queue: "d".into(),
        sandboxes_table: "t".into(),
        payload_bucket: "b".into(),
    };
    let session = armada_domain::sandbox::access::session_policy("t", "a", "q", &arns);
    for st in session["Statement"].as_array().unwrap() {
        for a in st["Action"].as_array().unwrap() {
            assert!(
                granted.contains(a.as_str().unwrap()),
                "the role lacks {a}, which the session policy grants"
            );
        }
    }
    // Their permission is a policy of its own on exactly those roles (inline
    // in the functions' Policies it would close a dependency cycle, which
    // cfn-lint refuses: E3004), and no function grants it inline.
    let assume = &res["SandboxIdentityAssumePolicy"]["Properties"];
    let on_roles: Vec<&str> = assume["Roles"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r["Ref"].as_str().unwrap())
        .collect();
    assert_eq!(on_roles, assumers);
    let st = &assume["PolicyDocument"]["Statement"][0];
    assert_eq!(st["Action"].as_str(), Some("sts:AssumeRole"));
    assert_eq!(st["Resource"], get_att("SandboxIdentityRole"));
    for function in [
        "IngressFunction",
        "HitlFunction",
        "DispatcherFunction",
        "HarnessFunction",
    ] {
        let inline = serde_norway::to_string(&res[function]["Properties"]["Policies"]).unwrap();
        assert!(!inline.contains("sts:AssumeRole"), "{function}");
    }
    let required = deploy_parameters();
    let text = std::fs::read_to_string(root().join("infra/template.yaml")).unwrap();
    let deployed = Template::parse(&text, "s", "us-east-1", &required).unwrap();
    assert_eq!(
        deployed.environment("dispatcher").unwrap()["ARMADA_SANDBOX_IDENTITY_ROLE_ARN"],
        "arn:aws:iam::123456789012:role/s-sandboxidentityrole"
    );
}

/// A generation's secrets reach its task in a bootstrap file, not in the
/// task's overrides: only the sandbox execution role (ECS starting the
/// task) may read `bootstrap/`, which it may; the files expire in a day.
#[test]
fn bootstrap_files_are_read_by_the_execution_role_alone() {
    let doc = raw_template();
    let res = &doc["Resources"];
    let policy = &res["PayloadBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"][0];
    assert_eq!(policy["Effect"].as_str(), Some("Deny"));
    assert_eq!(policy["Principal"].as_str(), Some("*"));
    assert_eq!(policy["Action"].as_str(), Some("s3:GetObject"));
    assert!(policy["Resource"]["Fn::Sub"]
        .as_str()
        .unwrap()
        .ends_with("/bootstrap/*"));
    assert_eq!(
        policy["Condition"]["ArnNotEquals"]["aws:PrincipalArn"]["Fn::GetAtt"][0].as_str(),
        Some("SandboxExecutionRole")
    );
    let reads =
        serde_norway::to_string(&res["SandboxExecutionRole"]["Properties"]["Policies"]).unwrap();
    assert!(
        reads.contains("s3:GetObject") && reads.contains("/bootstrap/*"),
        "{reads}"
    );
    let rules = &res["PayloadBucket"]["Properties"]["LifecycleConfiguration"]["Rules"][0];
    assert_eq!(rules["Prefix"].as_str(), Some("bootstrap/"));
    assert_eq!(rules["ExpirationInDays"].as_u64(), Some(1));
}
