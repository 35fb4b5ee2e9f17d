//! The ECS Fargate sandbox provider and the hand queues.
//!
//! A sandbox generation is one ECS task (`RunTask`, keyed by the agent
//! identity in `startedBy` and tags) and one FIFO hand queue the harness
//! sends its calls to. The task learns what to enforce from its container
//! environment. In AWS the tasks run on Fargate; under the local stack the
//! emulator's ECS API records them and the local data plane runs each one as
//! a confined local process, so this code is the same in both.

use std::collections::HashMap;

use aws_sdk_ecs::types::{
    AssignPublicIp, AwsVpcConfiguration, ContainerOverride, EnvironmentFile, EnvironmentFileType,
    KeyValuePair, NetworkConfiguration, Tag, TaskOverride,
};
use aws_sdk_sqs::types::QueueAttributeName;
use sha2::{Digest, Sha256};

use armada_domain::agent::SandboxSpec;
use armada_domain::sandbox::access::{session_policy, PlatformArns};
use armada_domain::sandbox::credentials::{TaskCredentials, ROLE_CHAIN_MAX_SECONDS};
use armada_domain::sandbox::hand::HandMessage;
use armada_domain::sandbox::hand::HAND_VISIBILITY_SECONDS;
use armada_domain::sandbox::lifecycle::sandbox_key;
use armada_domain::sandbox::seal::answer_key;
use armada_domain::sandbox::CapabilitySet;

use crate::adapters::aws::AwsClients;
use crate::config::{Config, SandboxConfig};
use async_trait::async_trait;

use crate::error::{classify, StoreError};
use crate::ports::provider::{
    task_env, TaskInfo, TaskRequest, TAG_AGENT, TAG_GENERATION, TAG_TENANT,
};
use crate::ports::Provider;

/// Where a generation's bootstrap file lives in the payload bucket. The
/// task's credentials and answer key are secrets, and RunTask's container
/// overrides are not: `ecs:DescribeTasks` (any read-only principal) shows
/// them and CloudTrail records them. So they are written to this object
/// and named in the overrides as an environment file, which ECS fetches
/// with the task's execution role as it starts the task; the bucket
/// policy lets no one else read `bootstrap/`, and the object is deleted
/// with its generation (and expires after a day in any case). The nonce
/// makes each start's file its own (the start's token names it).
pub fn bootstrap_key(tenant: &str, agent: &str, generation: u64, nonce: &str) -> String {
    format!("{}{nonce}.env", bootstrap_prefix(tenant, agent, generation))
}

/// The prefix of a generation's bootstrap files.
pub fn bootstrap_prefix(tenant: &str, agent: &str, generation: u64) -> String {
    format!("bootstrap/{}/g{generation}-", started_by(tenant, agent))
}

/// An environment file as ECS reads one: `NAME=value` lines; blank lines
/// and `#` comments are skipped.
pub fn parse_env_file(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[derive(Debug, Clone)]
pub struct SandboxProvider {
    ecs: aws_sdk_ecs::Client,
    sqs: aws_sdk_sqs::Client,
    sts: aws_sdk_sts::Client,
    s3: aws_sdk_s3::Client,
    cfg: SandboxConfig,
    harness_queue_url: String,
    dispatch_queue_url: String,
    sandboxes_table: String,
    payload_bucket: String,
    /// What the session policies name (with an identity role).
    arns: Option<PlatformArns>,
    /// The deployment's secret, from which each generation's answer key
    /// is derived.
    answer_secret: String,
}

/// A generation's hand queue: the identity's digest, the generation, and
/// the record's salt (so a deleted identity's next generation 1 gets a
/// queue of its own).
pub fn hand_queue_name(
    prefix: &str,
    tenant: &str,
    agent: &str,
    generation: u64,
    salt: &str,
) -> String {
    let d = Sha256::digest(sandbox_key(tenant, agent).as_bytes());
    let salted = if salt.is_empty() {
        String::new()
    } else {
        format!("-{salt}")
    };
    format!(
        "{prefix}-{}-g{generation}{salted}.fifo",
        &hex::encode(d)[..16]
    )
}

/// `startedBy` holds at most 36 characters: the identity's digest.
pub fn started_by(tenant: &str, agent: &str) -> String {
    let d = Sha256::digest(sandbox_key(tenant, agent).as_bytes());
    format!("sb-{}", &hex::encode(d)[..32])
}

impl SandboxProvider {
    /// The provider of a deployment: its clients, its configuration and
    /// its queues' URLs.
    pub fn new(
        aws: &AwsClients,
        cfg: &Config,
        harness_queue_url: &str,
        dispatch_queue_url: &str,
    ) -> Self {
        let region = aws
            .sdk_config
            .region()
            .map(|r| r.to_string())
            .unwrap_or_default();
        let arns = cfg.sandbox.identity_role_arn.as_deref().and_then(|role| {
            PlatformArns::derive(
                role,
                &region,
                harness_queue_url,
                dispatch_queue_url,
                &cfg.sandboxes_table,
                &cfg.payload_bucket,
            )
        });
        if cfg.sandbox.identity_role_arn.is_some() && arns.is_none() {
            tracing::error!("ARMADA_SANDBOX_IDENTITY_ROLE_ARN is not an IAM role ARN (or no region is set): sandbox tasks get no credentials of their own");
        }
        SandboxProvider {
            ecs: aws.ecs.clone(),
            sqs: aws.sqs.clone(),
            sts: aws.sts.clone(),
            s3: aws.s3.clone(),
            cfg: cfg.sandbox.clone(),
            harness_queue_url: harness_queue_url.to_string(),
            dispatch_queue_url: dispatch_queue_url.to_string(),
            sandboxes_table: cfg.sandboxes_table.clone(),
            payload_bucket: cfg.payload_bucket.clone(),
            arns,
            answer_secret: cfg.callback_signing_secret.clone(),
        }
    }

    /// The task's security groups: a profile that restricts the network
    /// gets the isolated groups (no egress), when the deployment has them.
    fn security_groups(&self, caps: &CapabilitySet) -> &[String] {
        if caps.restrict_network && !self.cfg.isolated_security_groups.is_empty() {
            &self.cfg.isolated_security_groups
        } else {
            &self.cfg.security_groups
        }
    }

    /// Whether the task's network is isolated as a whole (its agent reports
    /// the network control from this where it cannot make namespaces).
    fn task_network(&self, caps: &CapabilitySet) -> &'static str {
        if caps.restrict_network && !self.cfg.isolated_security_groups.is_empty() {
            "isolated"
        } else {
            "open"
        }
    }

    fn hand_queue_name(&self, tenant: &str, agent: &str, generation: u64, salt: &str) -> String {
        hand_queue_name(&self.cfg.hand_queue_prefix, tenant, agent, generation, salt)
    }

    /// Creates the generation's hand queue (FIFO, grouped by Run) or finds it.
    fn task_definition(&self, spec: &SandboxSpec) -> &str {
        if spec.limits.cpu_millis <= 1000 && spec.limits.memory_mb <= 2048 {
            &self.cfg.task_standard
        } else {
            &self.cfg.task_large
        }
    }

    /// Writes a generation's bootstrap file; returns its ARN.
    async fn write_bootstrap(
        &self,
        tenant: &str,
        agent: &str,
        generation: u64,
        nonce: &str,
        vars: &[(&str, String)],
    ) -> Result<String, StoreError> {
        let key = bootstrap_key(tenant, agent, generation, nonce);
        let text: String = vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        self.s3
            .put_object()
            .bucket(&self.payload_bucket)
            .key(&key)
            .body(text.into_bytes().into())
            .send()
            .await
            .map_err(classify)?;
        Ok(format!("arn:aws:s3:::{}/{key}", self.payload_bucket))
    }

    /// The environment a task's container gets, as ECS gives it: its
    /// environment files (fetched from the payload bucket), then its
    /// overrides, which win. The local data plane starts agents with it.
    pub async fn task_environment(
        &self,
        info: &TaskInfo,
    ) -> Result<HashMap<String, String>, StoreError> {
        let mut env = HashMap::new();
        for arn in &info.env_files {
            let Some((bucket, key)) = arn
                .splitn(6, ':')
                .nth(5)
                .and_then(|path| path.split_once('/'))
            else {
                return Err(StoreError::Terminal(format!("not an S3 object ARN: {arn}")));
            };
            let bytes = crate::adapters::s3::object_bytes(&self.s3, bucket, key).await?;
            env.extend(parse_env_file(&String::from_utf8_lossy(&bytes)));
        }
        env.extend(info.env.clone());
        Ok(env)
    }
}

#[async_trait]
impl Provider for SandboxProvider {
    fn config(&self) -> &SandboxConfig {
        &self.cfg
    }

    async fn hand_queue(
        &self,
        tenant: &str,
        agent: &str,
        generation: u64,
        salt: &str,
    ) -> Result<String, StoreError> {
        let out = self
            .sqs
            .create_queue()
            .queue_name(self.hand_queue_name(tenant, agent, generation, salt))
            .attributes(QueueAttributeName::FifoQueue, "true")
            // The agent keeps a call's message hidden while the call runs.
            .attributes(
                QueueAttributeName::VisibilityTimeout,
                HAND_VISIBILITY_SECONDS.to_string(),
            )
            .attributes(QueueAttributeName::MessageRetentionPeriod, "86400")
            .send()
            .await
            .map_err(classify)?;
        out.queue_url()
            .map(str::to_string)
            .ok_or_else(|| StoreError::Terminal("CreateQueue returned no URL".into()))
    }

    async fn delete_hand_queue(&self, url: &str) -> Result<(), StoreError> {
        match self.sqs.delete_queue().queue_url(url).send().await {
            Ok(_) => Ok(()),
            Err(e) => match classify(e) {
                StoreError::Terminal(m) if m.contains("NonExistentQueue") => Ok(()),
                other => Err(other),
            },
        }
    }

    /// Sends a message to a hand queue. Calls are deduplicated per call.
    async fn send(&self, queue_url: &str, msg: &HandMessage) -> Result<(), StoreError> {
        let body = serde_json::to_string(msg).map_err(|e| StoreError::Terminal(e.to_string()))?;
        let (group, dedup) = match msg {
            HandMessage::Invoke(inv) => (inv.run_id.clone(), inv.dedup_id()),
            HandMessage::EndRun { run_id, .. } => (run_id.clone(), format!("{run_id}-end")),
            // A group of their own, so no Run's calls hold them back; one
            // message per set of credentials.
            HandMessage::Credentials { credentials, .. } => (
                "credentials".to_string(),
                format!("credentials-{}", credentials.access_key_id),
            ),
        };
        self.sqs
            .send_message()
            .queue_url(queue_url)
            .message_body(body)
            .message_group_id(group)
            .message_deduplication_id(dedup)
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// Assumes the identity role for one generation, narrowed by the
    /// session policy to that identity's queue, record, marks and objects.
    async fn credentials(
        &self,
        tenant: &str,
        agent: &str,
        generation: u64,
        hand_queue_url: &str,
    ) -> Result<Option<TaskCredentials>, StoreError> {
        let (Some(role), Some(arns)) = (&self.cfg.identity_role_arn, &self.arns) else {
            return Ok(None);
        };
        let queue = hand_queue_url.rsplit('/').next().unwrap_or_default();
        let policy = session_policy(tenant, agent, queue, arns).to_string();
        let out = self
            .sts
            .assume_role()
            .role_arn(role)
            .role_session_name(format!("{}-g{generation}", started_by(tenant, agent)))
            .policy(policy)
            .duration_seconds(ROLE_CHAIN_MAX_SECONDS as i32)
            .send()
            .await
            .map_err(classify)?;
        let c = out
            .credentials()
            .ok_or_else(|| StoreError::Retryable("AssumeRole returned no credentials".into()))?;
        Ok(Some(TaskCredentials {
            access_key_id: c.access_key_id().to_string(),
            secret_access_key: c.secret_access_key().to_string(),
            session_token: c.session_token().to_string(),
            expires_at_ms: c.expiration().to_millis().unwrap_or(0),
        }))
    }

    /// Deletes a generation's bootstrap files (its task has started, or
    /// its sandbox is gone).
    async fn delete_bootstrap(
        &self,
        tenant: &str,
        agent: &str,
        generation: u64,
    ) -> Result<(), StoreError> {
        let listed = self
            .s3
            .list_objects_v2()
            .bucket(&self.payload_bucket)
            .prefix(bootstrap_prefix(tenant, agent, generation))
            .send()
            .await
            .map_err(classify)?;
        for o in listed.contents() {
            if let Some(key) = o.key() {
                self.s3
                    .delete_object()
                    .bucket(&self.payload_bucket)
                    .key(key)
                    .send()
                    .await
                    .map_err(classify)?;
            }
        }
        Ok(())
    }

    /// Starts a generation's task; returns its ARN.
    async fn start(&self, req: &TaskRequest<'_>) -> Result<String, StoreError> {
        use task_env::*;
        let credentials = self
            .credentials(req.tenant, req.agent, req.generation, req.hand_queue_url)
            .await?;
        let mut env: Vec<(&str, String)> = vec![
            (TENANT, req.tenant.to_string()),
            (AGENT, req.agent.to_string()),
            (GENERATION, req.generation.to_string()),
            (HAND_QUEUE_URL, req.hand_queue_url.to_string()),
            (HARNESS_QUEUE_URL, self.harness_queue_url.clone()),
            (SANDBOXES_TABLE, self.sandboxes_table.clone()),
            (PAYLOAD_BUCKET, self.payload_bucket.clone()),
            (CAPS, to_json(req.caps)),
            (LIMITS, to_json(&req.spec.limits)),
            (
                EGRESS_PORTS,
                req.spec
                    .egress_ports
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            (MOUNTS, to_json(&req.spec.mounts)),
            (USER, req.spec.user.clone().unwrap_or_default()),
            (IDLE_SECONDS, req.spec.idle_hibernate_s.to_string()),
            (RESIDENT, req.spec.resident.to_string()),
            (HEARTBEAT_SECONDS, self.cfg.heartbeat_seconds.to_string()),
            (RESTORE, req.restore.unwrap_or_default().to_string()),
            (TASK_NETWORK, self.task_network(req.caps).to_string()),
            (
                ANSWER_KEY,
                answer_key(
                    &self.answer_secret,
                    req.tenant,
                    req.agent,
                    req.generation,
                    req.salt,
                ),
            ),
            (DISPATCH_QUEUE_URL, self.dispatch_queue_url.clone()),
        ];
        if let Some(c) = credentials {
            env.extend([
                (ACCESS_KEY_ID, c.access_key_id),
                (SECRET_ACCESS_KEY, c.secret_access_key),
                (SESSION_TOKEN, c.session_token),
                (CREDENTIALS_EXPIRE_MS, c.expires_at_ms.to_string()),
            ]);
        }
        let (secret, public): (Vec<_>, Vec<_>) =
            env.into_iter().partition(|(k, _)| BOOTSTRAP.contains(k));
        // Named by the start, so a retried start names the same file and
        // asks ECS for the same task (the same client token with other
        // parameters is a ConflictException).
        let nonce = &req.start_token[..req.start_token.len().min(16)];
        let file = self
            .write_bootstrap(req.tenant, req.agent, req.generation, nonce, &secret)
            .await?;
        let overrides = TaskOverride::builder()
            .container_overrides(
                ContainerOverride::builder()
                    .name(&self.cfg.container)
                    .set_environment(Some(
                        public
                            .into_iter()
                            .map(|(k, v)| KeyValuePair::builder().name(k).value(v).build())
                            .collect(),
                    ))
                    .environment_files(
                        EnvironmentFile::builder()
                            .r#type(EnvironmentFileType::S3)
                            .value(file)
                            .build()
                            .map_err(|e| StoreError::Terminal(e.to_string()))?,
                    )
                    .build(),
            )
            .build();
        let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
        let network = NetworkConfiguration::builder()
            .awsvpc_configuration(
                AwsVpcConfiguration::builder()
                    .set_subnets(Some(self.cfg.subnets.clone()))
                    .set_security_groups(Some(self.security_groups(req.caps).to_vec()))
                    .assign_public_ip(AssignPublicIp::Disabled)
                    .build()
                    .map_err(|e| StoreError::Terminal(e.to_string()))?,
            )
            .build();
        let out = self
            .ecs
            .run_task()
            .cluster(&self.cfg.cluster)
            .task_definition(self.task_definition(req.spec))
            .launch_type(aws_sdk_ecs::types::LaunchType::Fargate)
            .count(1)
            // ECS answers a repeat of the token with the task it started.
            .client_token(req.start_token)
            .started_by(started_by(req.tenant, req.agent))
            .tags(tag(TAG_TENANT, req.tenant))
            .tags(tag(TAG_AGENT, req.agent))
            .tags(tag(TAG_GENERATION, &req.generation.to_string()))
            .overrides(overrides)
            .network_configuration(network)
            .send()
            .await
            .map_err(classify)?;
        if let Some(f) = out.failures().first() {
            return Err(StoreError::Retryable(format!(
                "RunTask failed: {} {}",
                f.reason().unwrap_or_default(),
                f.detail().unwrap_or_default()
            )));
        }
        out.tasks()
            .first()
            .and_then(|t| t.task_arn())
            .map(str::to_string)
            .ok_or_else(|| StoreError::Retryable("RunTask returned no task".into()))
    }

    async fn stop(&self, task_arn: &str, reason: &str) -> Result<(), StoreError> {
        let mut reason = reason.to_string();
        reason.truncate(255);
        match self
            .ecs
            .stop_task()
            .cluster(&self.cfg.cluster)
            .task(task_arn)
            .reason(reason)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match classify(e) {
                // Already gone is what we wanted.
                StoreError::Terminal(m)
                    if m.contains("not found") || m.contains("InvalidParameter") =>
                {
                    Ok(())
                }
                other => Err(other),
            },
        }
    }

    /// The task ARNs started for an identity (any state ECS still lists).
    async fn list(&self, started: Option<&str>) -> Result<Vec<String>, StoreError> {
        let mut arns = Vec::new();
        let mut token = None;
        loop {
            let out = self
                .ecs
                .list_tasks()
                .cluster(&self.cfg.cluster)
                .set_started_by(started.map(str::to_string))
                .set_next_token(token)
                .send()
                .await
                .map_err(classify)?;
            arns.extend(out.task_arns().iter().cloned());
            match out.next_token() {
                Some(t) => token = Some(t.to_string()),
                None => return Ok(arns),
            }
        }
    }

    async fn describe(&self, arns: &[String]) -> Result<Vec<TaskInfo>, StoreError> {
        let mut out = Vec::new();
        // DescribeTasks takes at most 100 tasks.
        for chunk in arns.chunks(100) {
            let resp = self
                .ecs
                .describe_tasks()
                .cluster(&self.cfg.cluster)
                .set_tasks(Some(chunk.to_vec()))
                .include(aws_sdk_ecs::types::TaskField::Tags)
                .send()
                .await
                .map_err(classify)?;
            for t in resp.tasks() {
                let container: Vec<&ContainerOverride> = t
                    .overrides()
                    .map(|o| o.container_overrides())
                    .unwrap_or_default()
                    .iter()
                    .filter(|c| c.name() == Some(self.cfg.container.as_str()))
                    .collect();
                let env = container
                    .iter()
                    .flat_map(|c| c.environment())
                    .filter_map(|kv| Some((kv.name()?.to_string(), kv.value()?.to_string())))
                    .collect();
                let env_files = container
                    .iter()
                    .flat_map(|c| c.environment_files())
                    .map(|f| f.value().to_string())
                    .collect();
                out.push(TaskInfo {
                    arn: t.task_arn().unwrap_or_default().to_string(),
                    last_status: t.last_status().unwrap_or_default().to_string(),
                    desired_status: t.desired_status().unwrap_or_default().to_string(),
                    started_by: t.started_by().map(str::to_string),
                    tags: t
                        .tags()
                        .iter()
                        .filter_map(|tag| Some((tag.key()?.to_string(), tag.value()?.to_string())))
                        .collect(),
                    env,
                    env_files,
                    task_definition: t.task_definition_arn().unwrap_or_default().to_string(),
                });
            }
        }
        Ok(out)
    }
}

/// Serialising our own types to JSON cannot fail.
fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_salt_names_a_hand_queue_of_its_own_within_sqs_limits() {
        let old = hand_queue_name("armada-hand", "acme", "coder", 1, "");
        let first = hand_queue_name("armada-hand", "acme", "coder", 1, "0a1b2c3d4e5f6a7b");
        let again = hand_queue_name("armada-hand", "acme", "coder", 1, "99aa88bb77cc66dd");
        assert_ne!(first, again);
        assert!(old.ends_with("-g1.fifo") && first.ends_with("-g1-0a1b2c3d4e5f6a7b.fifo"));
        // SQS queue names: at most 80 characters, including `.fifo`; with
        // a 25-character stack name and a millionth generation.
        let long = hand_queue_name(
            &format!("{}-hand", "s".repeat(25)),
            "t",
            "a",
            1_000_000,
            "0a1b2c3d4e5f6a7b",
        );
        assert!(long.len() <= 80, "{} characters: {long}", long.len());
    }
}
