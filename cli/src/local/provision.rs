//! Creates, in the emulator, the tables, queues and buckets that the template
//! declares (idempotently), and loads the default agents from `config/agents`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;

use armada_core::adapters::aws::AwsClients;
use armada_core::ports::Registry as RegistryPort;
use armada_domain::agent::AgentDefinition;
use armada_domain::team::TeamDefinition;

use super::template::{TableSpec, TaskDefSpec, Template};

#[derive(Debug, Clone, Default)]
pub struct Provisioned {
    /// Queue logical id → URL.
    pub queue_urls: HashMap<String, String>,
    /// Queue logical id → ARN.
    pub queue_arns: HashMap<String, String>,
}

fn key_elements(key: &[(String, String)]) -> Result<Vec<KeySchemaElement>> {
    key.iter()
        .map(|(a, t)| {
            Ok(KeySchemaElement::builder()
                .attribute_name(a)
                .key_type(KeyType::from(t.as_str()))
                .build()?)
        })
        .collect()
}

async fn create_table(aws: &AwsClients, t: &TableSpec) -> Result<()> {
    let mut req = aws
        .dynamo
        .create_table()
        .table_name(&t.name)
        .billing_mode(BillingMode::PayPerRequest)
        .set_key_schema(Some(key_elements(&t.key)?));
    for (name, ty) in &t.attributes {
        req = req.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::from(ty.as_str()))
                .build()?,
        );
    }
    for ix in &t.indexes {
        req = req.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(&ix.name)
                .set_key_schema(Some(key_elements(&ix.key)?))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::from(ix.projection.as_str()))
                        .build(),
                )
                .build()?,
        );
    }
    match req.send().await {
        Ok(_) => {}
        Err(e)
            if e.as_service_error()
                .is_some_and(|se| se.is_resource_in_use_exception()) => {}
        Err(e) => {
            return Err(anyhow::Error::new(e)).with_context(|| format!("creating table {}", t.name))
        }
    }
    if let Some(attr) = &t.ttl_attribute {
        let _ = aws
            .dynamo
            .update_time_to_live()
            .table_name(&t.name)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name(attr)
                    .enabled(true)
                    .build()?,
            )
            .send()
            .await;
    }
    Ok(())
}

/// Makes `sender` a verified SES identity (approval emails come from it);
/// one that exists already is fine.
pub async fn verify_sender(aws: &AwsClients, sender: &str) -> Result<()> {
    match aws
        .ses
        .create_email_identity()
        .email_identity(sender)
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|se| se.is_already_exists_exception()) =>
        {
            Ok(())
        }
        Err(e) => {
            Err(anyhow::Error::new(e)).with_context(|| format!("verifying the sender {sender}"))
        }
    }
}

pub async fn provision(aws: &AwsClients, t: &Template) -> Result<Provisioned> {
    for table in t.tables()? {
        create_table(aws, &table).await?;
    }
    for group in t.schedule_groups()? {
        // moto replaces a group made again (and drops its schedules) where
        // AWS would refuse: one that exists is left as it is.
        let exists = aws
            .scheduler
            .get_schedule_group()
            .name(&group)
            .send()
            .await
            .is_ok();
        if exists {
            continue;
        }
        match aws
            .scheduler
            .create_schedule_group()
            .name(&group)
            .send()
            .await
        {
            Ok(_) => {}
            Err(e)
                if e.as_service_error()
                    .is_some_and(|se| se.is_conflict_exception()) => {}
            Err(e) => {
                return Err(anyhow::Error::new(e))
                    .with_context(|| format!("creating schedule group {group}"))
            }
        }
    }
    let mut out = Provisioned::default();
    let queues = t.queues()?;
    for q in &queues {
        let mut req = aws.sqs.create_queue().queue_name(&q.name);
        if q.fifo {
            req = req.attributes(QueueAttributeName::FifoQueue, "true");
            if q.content_dedup {
                req = req.attributes(QueueAttributeName::ContentBasedDeduplication, "true");
            }
        }
        if let Some(v) = q.visibility_timeout {
            req = req.attributes(QueueAttributeName::VisibilityTimeout, v.to_string());
        }
        if let Some(r) = q.retention {
            req = req.attributes(QueueAttributeName::MessageRetentionPeriod, r.to_string());
        }
        let url = req
            .send()
            .await
            .with_context(|| format!("creating queue {}", q.name))?
            .queue_url()
            .unwrap_or_default()
            .to_string();
        let arn = aws
            .sqs
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await?
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
            .unwrap_or_default();
        out.queue_urls.insert(q.logical_id.clone(), url);
        out.queue_arns.insert(q.logical_id.clone(), arn);
    }
    // Redrive policies name their DLQ by ARN, known only now.
    for q in &queues {
        if let Some((dlq, max)) = &q.redrive {
            let policy = serde_json::json!({
                "deadLetterTargetArn": out.queue_arns.get(dlq).cloned().unwrap_or_default(),
                "maxReceiveCount": max,
            });
            aws.sqs
                .set_queue_attributes()
                .queue_url(&out.queue_urls[&q.logical_id])
                .attributes(QueueAttributeName::RedrivePolicy, policy.to_string())
                .send()
                .await
                .with_context(|| format!("setting the redrive policy of {}", q.name))?;
        }
    }
    // Topics, and the queues subscribed to them (SNS delivers to a queue
    // by its ARN, known only now).
    for topic in t.topics()? {
        aws.sns
            .create_topic()
            .name(&topic)
            .send()
            .await
            .with_context(|| format!("creating topic {topic}"))?;
    }
    for (topic_arn, queue_arn, raw) in t.queue_subscriptions()? {
        let mut req = aws
            .sns
            .subscribe()
            .topic_arn(&topic_arn)
            .protocol("sqs")
            .endpoint(&queue_arn);
        if raw {
            req = req.attributes("RawMessageDelivery", "true");
        }
        req.send()
            .await
            .with_context(|| format!("subscribing {queue_arn} to {topic_arn}"))?;
    }
    for cluster in t.clusters()? {
        aws.ecs
            .create_cluster()
            .cluster_name(&cluster)
            .send()
            .await
            .with_context(|| format!("creating cluster {cluster}"))?;
    }
    for td in t.task_definitions()? {
        register_task_definition(aws, &td).await?;
    }
    for bucket in t.buckets()? {
        let mut req = aws.s3.create_bucket().bucket(&bucket);
        let region = aws
            .sdk_config
            .region()
            .map(|r| r.to_string())
            .unwrap_or_default();
        if !region.is_empty() && region != "us-east-1" {
            req = req.create_bucket_configuration(
                aws_sdk_s3::types::CreateBucketConfiguration::builder()
                    .location_constraint(aws_sdk_s3::types::BucketLocationConstraint::from(
                        region.as_str(),
                    ))
                    .build(),
            );
        }
        match req.send().await {
            Ok(_) => {}
            Err(e)
                if e.as_service_error().is_some_and(|se| {
                    se.is_bucket_already_owned_by_you() || se.is_bucket_already_exists()
                }) => {}
            Err(e) => {
                return Err(anyhow::Error::new(e))
                    .with_context(|| format!("creating bucket {bucket}"))
            }
        }
    }
    Ok(out)
}

async fn register_task_definition(aws: &AwsClients, td: &TaskDefSpec) -> Result<()> {
    use aws_sdk_ecs::types::{Compatibility, ContainerDefinition, KeyValuePair, NetworkMode};
    let mut req = aws
        .ecs
        .register_task_definition()
        .family(&td.family)
        .cpu(&td.cpu)
        .memory(&td.memory)
        .network_mode(NetworkMode::Awsvpc)
        .requires_compatibilities(Compatibility::Fargate);
    for c in &td.containers {
        req = req.container_definitions(
            ContainerDefinition::builder()
                .name(&c.name)
                .image(&c.image)
                .memory(c.memory_mb)
                .essential(true)
                .set_command(Some(c.command.clone()))
                .set_environment(Some(
                    c.environment
                        .iter()
                        .map(|(k, v)| KeyValuePair::builder().name(k).value(v).build())
                        .collect(),
                ))
                .build(),
        );
    }
    req.send()
        .await
        .with_context(|| format!("registering task definition {}", td.family))?;
    Ok(())
}

/// One call of the emulator's EC2 query API (unsigned: the emulator does
/// not check signatures), answering its XML.
pub async fn ec2_query(endpoint: &str, region: &str, params: &str) -> Result<String> {
    Ok(reqwest::Client::new()
        .post(format!("{}/", endpoint.trim_end_matches('/')))
        .header(
            "authorization",
            format!("AWS4-HMAC-SHA256 Credential=test/20260101/{region}/ec2/aws4_request, SignedHeaders=host, Signature=0"),
        )
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("{params}&Version=2016-11-15"))
        .send()
        .await?
        .text()
        .await?)
}

/// The emulator's default subnets and security groups, to stand for the
/// VPC a deployment passes as `SandboxSubnets` and `SandboxSecurityGroups`.
pub async fn default_network(endpoint: &str, region: &str) -> Result<(String, String)> {
    let query = |action: &'static str| ec2_query(endpoint, region, action);
    let ids = |xml: &str, tag: &str| -> Vec<String> {
        let open = format!("<{tag}>");
        let close = format!("</{tag}>");
        xml.split(&open)
            .skip(1)
            .filter_map(|rest| rest.split(&close).next())
            .map(str::to_string)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let subnets = ids(&query("Action=DescribeSubnets").await?, "subnetId");
    // The default VPC's own group, by name: the emulator also holds the
    // isolated group (made by the first stack that needed it), which must
    // never stand for the open one.
    let groups = ids(
        &query("Action=DescribeSecurityGroups&Filter.1.Name=group-name&Filter.1.Value.1=default")
            .await?,
        "groupId",
    );
    anyhow::ensure!(
        !subnets.is_empty() && !groups.is_empty(),
        "the emulator reports no default subnet or security group"
    );
    Ok((subnets[0].clone(), groups[0].clone()))
}

/// The security group of sandboxes whose profile restricts the network
/// (`SandboxIsolatedSecurityGroups`): made once in the emulator's default
/// VPC, found again by name after.
pub async fn isolated_security_group(endpoint: &str, region: &str) -> Result<String> {
    const NAME: &str = "armada-sandbox-isolated";
    let call = |params: String| async move { ec2_query(endpoint, region, &params).await };
    let group_id = |xml: &str| {
        xml.split("<groupId>")
            .nth(1)
            .and_then(|rest| rest.split("</groupId>").next())
            .map(str::to_string)
    };
    let found = call(format!(
        "Action=DescribeSecurityGroups&Filter.1.Name=group-name&Filter.1.Value.1={NAME}"
    ))
    .await?;
    if let Some(id) = group_id(&found) {
        return Ok(id);
    }
    let made = call(format!(
        "Action=CreateSecurityGroup&GroupName={NAME}&GroupDescription=armada+sandboxes+without+egress"
    ))
    .await?;
    if let Some(id) = group_id(&made) {
        return Ok(id);
    }
    // Another stack made it at the same moment: take that one.
    let again = call(format!(
        "Action=DescribeSecurityGroups&Filter.1.Name=group-name&Filter.1.Value.1={NAME}"
    ))
    .await?;
    group_id(&again).ok_or_else(|| anyhow::anyhow!("the emulator made no security group: {made}"))
}

/// The `*.json` files of a `config/` folder, by name, each parsed.
fn config_files(root: &Path, folder: &str) -> Result<Vec<(String, PathBuf, serde_json::Value)>> {
    let dir = root.join("config").join(folder);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    entries.sort();
    let mut out = Vec::new();
    for path in entries {
        let text = std::fs::read_to_string(&path)?;
        let body: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        out.push((name, path, body));
    }
    Ok(out)
}

/// Loads every `config/teams/*.json` into the registry (after the agents:
/// every agent a team names must be registered).
pub async fn load_teams(registry: &dyn RegistryPort, root: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for (name, path, body) in config_files(root, "teams")? {
        let def = TeamDefinition::from_json(&name, &body)
            .with_context(|| format!("validating {}", path.display()))?;
        for agent in def.agents() {
            if registry.agent(agent).await?.is_none() {
                bail!("{}: agent '{agent}' is not registered", path.display());
            }
        }
        registry.put_team(&def).await?;
        names.push(name);
    }
    Ok(names)
}

/// Loads every `config/agents/*.json` into the registry. The scripted
/// provider needs no URL in the file: the deployment supplies it.
pub async fn load_agents(registry: &dyn RegistryPort, root: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for (name, path, body) in config_files(root, "agents")? {
        let mut def = AgentDefinition::from_json(&name, &body)
            .with_context(|| format!("validating {}", path.display()))?;
        registry
            .resolve_manifests(&mut def)
            .await?
            .with_context(|| format!("validating {}", path.display()))?;
        registry.put_agent(&def).await?;
        names.push(name);
    }
    Ok(names)
}
