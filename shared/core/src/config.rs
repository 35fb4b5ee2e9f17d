//! Typed configuration, read once at start-up from environment variables
//! (set by `infra/template.yaml` in AWS, by the local stack locally), failing
//! fast with the name of whatever is missing. No resource name, account or
//! region is hard-coded anywhere else.

use std::collections::HashMap;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration variable {0} is not set")]
    Missing(&'static str),
    #[error("configuration variable {name} is invalid: {reason}")]
    Invalid { name: &'static str, reason: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// DynamoDB table of Runs (`ARMADA_RUNS_TABLE`).
    pub runs_table: String,
    /// DynamoDB table of Run events (`ARMADA_RUN_EVENTS_TABLE`).
    pub run_events_table: String,
    /// DynamoDB table of AgentSessions (`ARMADA_SESSIONS_TABLE`).
    pub sessions_table: String,
    /// DynamoDB table of approvals (`ARMADA_APPROVALS_TABLE`).
    pub approvals_table: String,
    /// DynamoDB table of sandboxes (`ARMADA_SANDBOXES_TABLE`).
    pub sandboxes_table: String,
    /// DynamoDB registry: agents, API keys (`ARMADA_REGISTRY_TABLE`).
    pub registry_table: String,
    /// DynamoDB table of Idempotency-Key fingerprints (`ARMADA_IDEMPOTENCY_TABLE`).
    pub idempotency_table: String,
    /// DynamoDB table of what each tenant holds at once: its active Runs,
    /// its long-polls (`ARMADA_QUOTAS_TABLE`).
    pub quotas_table: String,
    /// DynamoDB table of what starts Runs without a key: hooks, their
    /// deliveries (`ARMADA_TRIGGERS_TABLE`).
    pub triggers_table: String,
    /// The KMS key of tenants' secrets. It
    /// (`ARMADA_SECRETS_KMS_KEY`, an ARN) wraps each value's data key;
    /// empty (the local stack), values are sealed under a key derived from
    /// the deployment secret.
    pub secrets_kms_key: Option<String>,
    /// Where schedules' timers live and what they send: EventBridge
    /// Scheduler's group, the role it assumes, the dispatch queue it sends
    /// to and the dead-letter queue of firings it could not send.
    pub timers: TimerConfig,
    /// Where cloudwatch hooks' alarms arrive.
    pub alarms: AlarmConfig,
    /// Where mailboxes' mail arrives.
    pub inbox: InboxConfig,
    /// Name of the dispatch queue (`ARMADA_DISPATCH_QUEUE`); URLs are resolved at start.
    pub dispatch_queue: String,
    /// Name of the dispatch dead-letter queue (`ARMADA_DISPATCH_DLQ`).
    pub dispatch_dlq: String,
    /// Name of the delivery queue (`ARMADA_DELIVERY_QUEUE`): callbacks and
    /// chat messages to tenants' endpoints.
    pub delivery_queue: String,
    /// Name of the harness FIFO queue (`ARMADA_HARNESS_QUEUE`).
    pub harness_queue: String,
    /// Name of the harness dead-letter FIFO queue (`ARMADA_HARNESS_DLQ`).
    pub harness_dlq: String,
    /// S3 bucket for large payloads (`ARMADA_PAYLOAD_BUCKET`).
    pub payload_bucket: String,
    /// SHA-256 hex of the admin API key (`ARMADA_ADMIN_KEY_SHA256`).
    pub admin_key_sha256: String,
    /// Base URL of the scripted model's OpenAI-compatible endpoint
    /// (`ARMADA_SCRIPTED_MODEL_URL`); empty when not deployed.
    pub scripted_model_url: Option<String>,
    /// How long a harness step's claim lasts before it is renewed
    /// (`ARMADA_STEP_LEASE_SECONDS`, at most `crash_return_s`); a live
    /// step renews it every third.
    pub step_lease_ms: i64,
    /// How soon the work of a function that died is taken up again
    /// (`ARMADA_CRASH_RETURN_SECONDS`, default 20): a step's messages are
    /// hidden for this long (not the queue's whole visibility timeout) as
    /// soon as the harness has them, the dispatcher's records once they
    /// took a second, again every third of it, and a step's lease lasts
    /// no longer. One SQS call per such record buys it: a queue's
    /// visibility timeout may not be shorter than its function's timeout,
    /// which a model call must fit in.
    pub crash_return_s: u32,
    /// The harness queue's visibility timeout
    /// (`ARMADA_HARNESS_QUEUE_VISIBILITY_SECONDS`): a live step keeps its
    /// messages hidden this long again every third of it.
    pub harness_visibility_s: u32,
    /// Visibility timeout of the queues the dispatcher consumes
    /// (`ARMADA_DISPATCH_QUEUE_VISIBILITY_SECONDS`): it keeps the records
    /// it works on hidden for this long again every third of it, so the
    /// record of an invocation that died comes back this soon.
    pub dispatch_visibility_s: u32,
    /// First backoff for a retryable message failure (`ARMADA_RETRY_BASE_SECONDS`).
    pub retry_base_seconds: u32,
    /// How callbacks are retried: the first delay, doubling
    /// (`ARMADA_CALLBACK_RETRY_BASE_SECONDS`, default 30), for how long
    /// after the first attempt (`ARMADA_CALLBACK_MAX_AGE_SECONDS`, default
    /// a day).
    pub callback_policy: armada_domain::run::callback::CallbackPolicy,
    /// Bodies above this many bytes go to S3 (`ARMADA_INLINE_LIMIT_BYTES`, default 32 KiB).
    pub inline_limit_bytes: usize,
    /// Attempts of a model call before the Run fails (`ARMADA_MODEL_ATTEMPTS`, default 3).
    pub model_attempts: u32,
    /// How deep delegation may go below a root Run
    /// (`ARMADA_MAX_DELEGATION_DEPTH`, default 4).
    pub max_delegation_depth: u32,
    /// How many child Runs one waiting point may have: one step's
    /// `delegate` and `plan` calls together (`ARMADA_MAX_CHILDREN_PER_WAIT`,
    /// default 64, one full `plan`); a call past it is answered
    /// `TOO_MANY_CHILDREN`.
    pub max_children_per_wait: u32,
    /// How many Runs one root Run's tree may have below the root: its
    /// children, theirs, team members and relay steps, every level and
    /// step together (`ARMADA_MAX_DESCENDANTS_PER_ROOT`, default 256); a
    /// call past it is answered `TOO_MANY_DESCENDANTS`.
    pub max_descendants_per_root: u32,
    /// How many Runs one tenant may start through the API in a minute
    /// (`ARMADA_TENANT_RUNS_PER_MINUTE`, default 600); past it a start is
    /// answered `429 RATE_LIMITED` with `Retry-After`.
    pub tenant_runs_per_minute: u32,
    /// How many Runs one tenant may have started through the API and not
    /// yet ended (`ARMADA_TENANT_ACTIVE_RUNS`, default 200; their children
    /// are bounded per root instead); past it a start is answered `429
    /// TOO_MANY_ACTIVE_RUNS` with `Retry-After`.
    pub tenant_active_runs: u32,
    /// How many long-polls (`GET /v1/runs/{id}/events?wait=N`, N > 0) one
    /// tenant may have waiting at once, across every instance
    /// (`ARMADA_TENANT_CONCURRENT_LONG_POLLS`, default 32); past it a poll
    /// is answered `429 TOO_MANY_LONG_POLLS` with `Retry-After`.
    pub tenant_concurrent_long_polls: u32,
    /// Signs result callbacks (`ARMADA_CALLBACK_SIGNING_SECRET`, at least 16 bytes).
    pub callback_signing_secret: String,
    /// The sender of approval emails (`ARMADA_APPROVAL_SENDER`), an SES
    /// identity of the account.
    pub approval_sender: String,
    /// Base URL of the HTTP API that approval links point at
    /// (`ARMADA_PUBLIC_URL`, e.g. `https://abc.execute-api.eu-west-1.amazonaws.com`).
    pub public_url: Option<String>,
    /// A directory where every approval email is also written as an `.eml`
    /// file (`ARMADA_MAIL_OUTBOX`; the local stack sets it).
    pub mail_outbox: Option<std::path::PathBuf>,
    /// Private targets the operator lets tenants' outbound requests reach
    /// (`ARMADA_EGRESS_ALLOW`, comma-separated `host:port` or `host:*`).
    pub egress_allow: Vec<String>,
    /// The platform's own endpoints, never a tenant's target: the AWS
    /// endpoint (`AWS_ENDPOINT_URL`), the scripted model, the public API
    /// and any in `ARMADA_PLATFORM_ENDPOINTS`.
    pub platform_urls: Vec<String>,
    /// Where sandbox tasks run.
    pub sandbox: SandboxConfig,
}

/// Where cloudwatch hooks' alarms arrive: each hook's SNS topic
/// (`ARMADA_ALARM_TOPIC_PREFIX` and the hook's id) delivers to the alarms
/// queue (`ARMADA_ALARMS_QUEUE`, `ARMADA_ALARMS_QUEUE_ARN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlarmConfig {
    pub queue: String,
    pub queue_arn: String,
    pub topic_prefix: String,
}

/// Where mailboxes' mail arrives: addresses of the deployment's inbound
/// domain (`ARMADA_INBOUND_DOMAIN`, default `armada.local`), whose mail
/// SES stores in the payload bucket and announces on the mail topic
/// (`ARMADA_MAIL_TOPIC_ARN`), which delivers to the mail queue
/// (`ARMADA_MAIL_QUEUE`) the dispatcher consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxConfig {
    pub domain: String,
    pub queue: String,
    pub topic_arn: String,
}

/// EventBridge Scheduler, as schedules' timers use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerConfig {
    /// The stack's schedule group (`ARMADA_SCHEDULE_GROUP`).
    pub group: String,
    /// The role the scheduler assumes to send (`ARMADA_SCHEDULER_ROLE_ARN`).
    pub role_arn: String,
    /// Where firings go (`ARMADA_DISPATCH_QUEUE_ARN`).
    pub dispatch_queue_arn: String,
    /// Firings the scheduler could not send (`ARMADA_SCHEDULES_DLQ_ARN`).
    pub dead_letter_arn: String,
    /// How late a firing may still start a Run
    /// (`ARMADA_SCHEDULE_MAX_EVENT_AGE_SECONDS`, default an hour, as
    /// EventBridge retries): an older one is recorded missed.
    pub max_event_age_s: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SandboxConfig {
    /// ECS cluster of the sandbox tasks (`ARMADA_SANDBOX_CLUSTER`).
    pub cluster: String,
    /// Task definition of the standard tier, 1 vCPU / 2 GB (`ARMADA_SANDBOX_TASK_STANDARD`).
    pub task_standard: String,
    /// Task definition of the large tier, up to the caps (`ARMADA_SANDBOX_TASK_LARGE`).
    pub task_large: String,
    /// The sandbox container's name in both task definitions (`ARMADA_SANDBOX_CONTAINER`, default `hand`).
    pub container: String,
    /// Subnets of the tasks' awsvpc network (`ARMADA_SANDBOX_SUBNETS`, comma-separated).
    pub subnets: Vec<String>,
    /// Security groups of the tasks (`ARMADA_SANDBOX_SECURITY_GROUPS`, comma-separated).
    pub security_groups: Vec<String>,
    /// Security groups of the tasks whose profile restricts the network
    /// (`ARMADA_SANDBOX_ISOLATED_SECURITY_GROUPS`): no egress but the VPC
    /// endpoints the agent itself needs, so the rule holds per task where
    /// per-call network namespaces are not available (Fargate).
    pub isolated_security_groups: Vec<String>,
    /// Name prefix of the per-sandbox hand queues (`ARMADA_HAND_QUEUE_PREFIX`).
    pub hand_queue_prefix: String,
    /// The role each sandbox task's own credentials are assumed from,
    /// narrowed to its identity by a session policy
    /// (`ARMADA_SANDBOX_IDENTITY_ROLE_ARN`). Unset, tasks get no
    /// credentials of their own (and hold only what their task role
    /// grants, which in the template is nothing).
    pub identity_role_arn: Option<String>,
    /// How often a Run waiting on a sandbox is checked on (`ARMADA_SANDBOX_CHECK_SECONDS`, default 30).
    pub check_seconds: u32,
    /// A sandbox agent not heard of for this long is taken for dead
    /// (`ARMADA_SANDBOX_STALE_SECONDS`, default 60).
    pub stale_seconds: u32,
    /// How often a sandbox agent reports it is alive (`ARMADA_SANDBOX_HEARTBEAT_SECONDS`, default 10).
    pub heartbeat_seconds: u32,
    /// A sandbox not ready after this long is started again, once
    /// (`ARMADA_SANDBOX_START_TIMEOUT_SECONDS`, default 30 as seed 000 says).
    pub start_timeout_seconds: u32,
}

impl Config {
    /// How long the harness hides a record it works on, at a time.
    pub fn harness_hide_s(&self) -> u32 {
        self.harness_visibility_s.min(self.crash_return_s)
    }

    /// How long the dispatcher hides a record it works on, at a time.
    pub fn dispatch_hide_s(&self) -> u32 {
        self.dispatch_visibility_s.min(self.crash_return_s)
    }

    pub fn from_env() -> Result<Self, ConfigError> {
        let vars: HashMap<String, String> = std::env::vars().collect();
        Self::from_map(&vars)
    }

    pub fn from_map(vars: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let req = |name: &'static str| -> Result<String, ConfigError> {
            match vars.get(name) {
                Some(v) if !v.is_empty() => Ok(v.clone()),
                _ => Err(ConfigError::Missing(name)),
            }
        };
        let num = |name: &'static str, default: u64| -> Result<u64, ConfigError> {
            match vars.get(name) {
                None => Ok(default),
                Some(v) if v.is_empty() => Ok(default),
                Some(v) => v
                    .parse()
                    .map_err(|e: std::num::ParseIntError| ConfigError::Invalid {
                        name,
                        reason: e.to_string(),
                    }),
            }
        };
        let list = |name: &str| -> Vec<String> {
            vars.get(name)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        let admin = req("ARMADA_ADMIN_KEY_SHA256")?;
        if admin.len() != 64 || !admin.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(ConfigError::Invalid {
                name: "ARMADA_ADMIN_KEY_SHA256",
                reason: "must be 64 hex characters".into(),
            });
        }
        let egress_allow = list("ARMADA_EGRESS_ALLOW");
        if let Some(bad) = egress_allow
            .iter()
            .find(|e| armada_domain::egress::HostPort::parse(e, true).is_none())
        {
            return Err(ConfigError::Invalid {
                name: "ARMADA_EGRESS_ALLOW",
                reason: format!("'{bad}' is not host:port or host:*"),
            });
        }
        let mut platform_urls = list("ARMADA_PLATFORM_ENDPOINTS");
        for name in [
            "AWS_ENDPOINT_URL",
            "ARMADA_SCRIPTED_MODEL_URL",
            "ARMADA_PUBLIC_URL",
        ] {
            platform_urls.extend(vars.get(name).filter(|v| !v.is_empty()).cloned());
        }
        Ok(Config {
            egress_allow,
            platform_urls,
            runs_table: req("ARMADA_RUNS_TABLE")?,
            run_events_table: req("ARMADA_RUN_EVENTS_TABLE")?,
            sessions_table: req("ARMADA_SESSIONS_TABLE")?,
            approvals_table: req("ARMADA_APPROVALS_TABLE")?,
            sandboxes_table: req("ARMADA_SANDBOXES_TABLE")?,
            registry_table: req("ARMADA_REGISTRY_TABLE")?,
            idempotency_table: req("ARMADA_IDEMPOTENCY_TABLE")?,
            quotas_table: req("ARMADA_QUOTAS_TABLE")?,
            triggers_table: req("ARMADA_TRIGGERS_TABLE")?,
            secrets_kms_key: vars
                .get("ARMADA_SECRETS_KMS_KEY")
                .filter(|v| !v.is_empty())
                .cloned(),
            alarms: AlarmConfig {
                queue: vars.get("ARMADA_ALARMS_QUEUE").cloned().unwrap_or_default(),
                queue_arn: vars
                    .get("ARMADA_ALARMS_QUEUE_ARN")
                    .cloned()
                    .unwrap_or_default(),
                topic_prefix: vars
                    .get("ARMADA_ALARM_TOPIC_PREFIX")
                    .filter(|v| !v.is_empty())
                    .cloned()
                    .unwrap_or_else(|| "armada-alarms-".into()),
            },
            inbox: InboxConfig {
                domain: vars
                    .get("ARMADA_INBOUND_DOMAIN")
                    .map(|d| d.trim().trim_end_matches('.').to_ascii_lowercase())
                    .filter(|d| !d.is_empty())
                    .unwrap_or_else(|| "armada.local".into()),
                queue: vars.get("ARMADA_MAIL_QUEUE").cloned().unwrap_or_default(),
                topic_arn: vars
                    .get("ARMADA_MAIL_TOPIC_ARN")
                    .cloned()
                    .unwrap_or_default(),
            },
            timers: TimerConfig {
                group: vars
                    .get("ARMADA_SCHEDULE_GROUP")
                    .filter(|v| !v.is_empty())
                    .cloned()
                    .unwrap_or_else(|| "default".into()),
                role_arn: vars
                    .get("ARMADA_SCHEDULER_ROLE_ARN")
                    .cloned()
                    .unwrap_or_default(),
                dispatch_queue_arn: vars
                    .get("ARMADA_DISPATCH_QUEUE_ARN")
                    .cloned()
                    .unwrap_or_default(),
                dead_letter_arn: vars
                    .get("ARMADA_SCHEDULES_DLQ_ARN")
                    .cloned()
                    .unwrap_or_default(),
                max_event_age_s: num("ARMADA_SCHEDULE_MAX_EVENT_AGE_SECONDS", 3600)?
                    .clamp(60, 86_400) as u32,
            },
            dispatch_queue: req("ARMADA_DISPATCH_QUEUE")?,
            dispatch_dlq: req("ARMADA_DISPATCH_DLQ")?,
            delivery_queue: req("ARMADA_DELIVERY_QUEUE")?,
            harness_queue: req("ARMADA_HARNESS_QUEUE")?,
            harness_dlq: req("ARMADA_HARNESS_DLQ")?,
            payload_bucket: req("ARMADA_PAYLOAD_BUCKET")?,
            admin_key_sha256: admin.to_ascii_lowercase(),
            scripted_model_url: vars
                .get("ARMADA_SCRIPTED_MODEL_URL")
                .filter(|v| !v.is_empty())
                .cloned(),
            crash_return_s: num("ARMADA_CRASH_RETURN_SECONDS", 20)?.max(3) as u32,
            step_lease_ms: num("ARMADA_STEP_LEASE_SECONDS", 60)?
                .min(num("ARMADA_CRASH_RETURN_SECONDS", 20)?.max(3))
                as i64
                * 1000,
            harness_visibility_s: num("ARMADA_HARNESS_QUEUE_VISIBILITY_SECONDS", 60)?.max(1) as u32,
            dispatch_visibility_s: num("ARMADA_DISPATCH_QUEUE_VISIBILITY_SECONDS", 45)?.max(1)
                as u32,
            retry_base_seconds: num("ARMADA_RETRY_BASE_SECONDS", 2)? as u32,
            callback_policy: armada_domain::run::callback::CallbackPolicy {
                base_s: num("ARMADA_CALLBACK_RETRY_BASE_SECONDS", 30)?.clamp(1, 3600) as u32,
                max_age_s: num("ARMADA_CALLBACK_MAX_AGE_SECONDS", 86_400)?.clamp(1, 7 * 86_400)
                    as u32,
            },
            inline_limit_bytes: num("ARMADA_INLINE_LIMIT_BYTES", 32 * 1024)? as usize,
            model_attempts: num("ARMADA_MODEL_ATTEMPTS", 3)?.max(1) as u32,
            max_delegation_depth: num(
                "ARMADA_MAX_DELEGATION_DEPTH",
                u64::from(armada_domain::collab::DEFAULT_MAX_DEPTH),
            )?
            .min(64) as u32,
            max_children_per_wait: num(
                "ARMADA_MAX_CHILDREN_PER_WAIT",
                u64::from(armada_domain::collab::DEFAULT_MAX_CHILDREN_PER_WAIT),
            )?
            .clamp(1, 1024) as u32,
            max_descendants_per_root: num(
                "ARMADA_MAX_DESCENDANTS_PER_ROOT",
                u64::from(armada_domain::collab::DEFAULT_MAX_DESCENDANTS),
            )?
            .clamp(1, 100_000) as u32,
            tenant_runs_per_minute: num("ARMADA_TENANT_RUNS_PER_MINUTE", 600)?.clamp(1, 1_000_000)
                as u32,
            tenant_active_runs: num("ARMADA_TENANT_ACTIVE_RUNS", 200)?.clamp(1, 100_000) as u32,
            tenant_concurrent_long_polls: num("ARMADA_TENANT_CONCURRENT_LONG_POLLS", 32)?
                .clamp(1, 1000) as u32,
            callback_signing_secret: {
                let s = req("ARMADA_CALLBACK_SIGNING_SECRET")?;
                if s.len() < 16 {
                    return Err(ConfigError::Invalid {
                        name: "ARMADA_CALLBACK_SIGNING_SECRET",
                        reason: "must be at least 16 bytes".into(),
                    });
                }
                s
            },
            approval_sender: vars
                .get("ARMADA_APPROVAL_SENDER")
                .filter(|v| !v.is_empty())
                .cloned()
                .unwrap_or_else(|| "approvals@example.com".into()),
            public_url: vars
                .get("ARMADA_PUBLIC_URL")
                .map(|v| v.trim_end_matches('/').to_string())
                .filter(|v| !v.is_empty()),
            mail_outbox: vars
                .get("ARMADA_MAIL_OUTBOX")
                .filter(|v| !v.is_empty())
                .map(std::path::PathBuf::from),
            sandbox: SandboxConfig {
                cluster: req("ARMADA_SANDBOX_CLUSTER")?,
                task_standard: req("ARMADA_SANDBOX_TASK_STANDARD")?,
                task_large: req("ARMADA_SANDBOX_TASK_LARGE")?,
                container: vars
                    .get("ARMADA_SANDBOX_CONTAINER")
                    .filter(|v| !v.is_empty())
                    .cloned()
                    .unwrap_or_else(|| "hand".into()),
                subnets: list("ARMADA_SANDBOX_SUBNETS"),
                security_groups: list("ARMADA_SANDBOX_SECURITY_GROUPS"),
                isolated_security_groups: list("ARMADA_SANDBOX_ISOLATED_SECURITY_GROUPS"),
                hand_queue_prefix: req("ARMADA_HAND_QUEUE_PREFIX")?,
                identity_role_arn: vars
                    .get("ARMADA_SANDBOX_IDENTITY_ROLE_ARN")
                    .filter(|v| !v.is_empty())
                    .cloned(),
                check_seconds: num("ARMADA_SANDBOX_CHECK_SECONDS", 30)?.max(1) as u32,
                stale_seconds: num("ARMADA_SANDBOX_STALE_SECONDS", 60)?.max(1) as u32,
                heartbeat_seconds: num("ARMADA_SANDBOX_HEARTBEAT_SECONDS", 10)?.max(1) as u32,
                start_timeout_seconds: num(
                    "ARMADA_SANDBOX_START_TIMEOUT_SECONDS",
                    u64::from(armada_domain::sandbox::START_TIMEOUT_S),
                )?
                .max(1) as u32,
            },
        })
    }
}
