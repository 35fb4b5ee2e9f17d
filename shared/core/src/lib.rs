//! What every function shares: the ports (what a handler needs from the
//! outside world), their AWS adapters, the application services built on
//! them, typed configuration and the runtime plumbing (SQS batches, the
//! HTTP router). Function crates build one [`Services`] at start-up and
//! hand it to their handlers; the local stack builds the very same.
//!
//! - [`ports`]: one module per port, each owning its vocabulary
//! - [`adapters`]: DynamoDB, SQS, S3, ECS, SES, models
//! - [`services`]: auth, sandboxes, callbacks, egress, tools, ending Runs
//! - `memory` (feature `test-support`): every port in memory

pub mod adapters;
pub mod batch;
pub mod cas;
pub mod clock;
pub mod config;
pub mod error;
pub mod faults;
pub mod http;
/// The in-memory doubles of every port, for unit tests (here, and in
/// the crates that enable `test-support`); not compiled into a deployment.
#[cfg(any(test, feature = "test-support"))]
pub mod memory;
pub mod ports;
pub mod services;
pub mod telemetry;

use std::sync::Arc;

use crate::adapters::aws::AwsClients;
use crate::adapters::dynamo::approvals::ApprovalStore;
use crate::adapters::dynamo::idempotency::IdempotencyStore;
use crate::adapters::dynamo::quotas::QuotasStore;
use crate::adapters::dynamo::registry::Registry as RegistryTable;
use crate::adapters::dynamo::runs::RunStore;
use crate::adapters::dynamo::sandboxes::SandboxStore;
use crate::adapters::dynamo::sessions::SessionStore;
use crate::adapters::dynamo::triggers::TriggerStore;
use crate::adapters::ecs::SandboxProvider;
use crate::adapters::models::Models;
use crate::adapters::s3::Payloads;
use crate::adapters::scheduler::EventBridgeTimers;
use crate::adapters::sns::AlarmTopics;
use crate::adapters::sqs::Queues as SqsQueues;
use crate::clock::Clock;
use crate::config::Config;
use crate::error::StoreError;
use crate::services::callbacks::Callbacks;
use crate::services::egress::Egress;
use crate::services::tools::InlineTools;

pub use crate::ports::{
    Also, Approvals, Blobs, Hooks, Idempotency, Mail, Mailboxes, Model, Provider, Queues, Quotas,
    Registry, RunEvents, Runs, SandboxReports, Sandboxes, SandboxesExt, Schedules, Secrets,
    Sessions, Timers, Topics, Vault,
};

/// Everything a handler needs, built once per process: the ports (AWS
/// adapters in a deployment and on the local stack, `memory` in unit
/// tests) and the pure services beside them.
#[derive(Debug, Clone)]
pub struct Services {
    /// What this process's handlers counted, per `Services`: each local
    /// stack (and so each test) reads its own.
    pub counters: Arc<Counters>,
    pub cfg: Config,
    pub runs: Arc<dyn Runs>,
    pub run_events: Arc<dyn RunEvents>,
    pub sessions: Arc<dyn Sessions>,
    pub approvals: Arc<dyn Approvals>,
    pub hooks: Arc<dyn Hooks>,
    /// Tenants' secrets, sealed.
    pub secrets: Arc<dyn Secrets>,
    /// Seals and opens secrets' values.
    pub vault: Arc<dyn Vault>,
    /// The alarm topics of cloudwatch hooks (SNS).
    pub topics: Arc<dyn Topics>,
    pub schedules: Arc<dyn Schedules>,
    pub mailboxes: Arc<dyn Mailboxes>,
    /// The timers that fire schedules (EventBridge Scheduler).
    pub timers: Arc<dyn Timers>,
    pub registry: Arc<dyn Registry>,
    pub sandboxes: Arc<dyn Sandboxes>,
    pub provider: Arc<dyn Provider>,
    pub idempotency: Arc<dyn Idempotency>,
    pub quotas: Arc<dyn Quotas>,
    pub queues: Arc<dyn Queues>,
    pub payloads: Arc<dyn Blobs>,
    pub models: Arc<dyn Model>,
    pub tools: InlineTools,
    pub callbacks: Callbacks,
    pub mail: Arc<dyn Mail>,
    pub clock: Clock,
    /// Where faults are injected ([`faults::NoFaults`] in a deployment).
    pub faults: Arc<dyn faults::FaultPoints>,
}

/// Events worth counting that are not errors.
#[derive(Debug, Default)]
pub struct Counters {
    /// Messages dropped as duplicates or overtaken.
    pub stale_drops: std::sync::atomic::AtomicU64,
    /// Sandbox answers refused because their seal did not hold (one
    /// sandbox answering for another's call, or a changed stored answer).
    pub forged_drops: std::sync::atomic::AtomicU64,
    /// Commits refused because a newer epoch had claimed the Run.
    pub fenced_commits: std::sync::atomic::AtomicU64,
    /// Moves the domain refused (a Run or tool-call transition that is not
    /// legal from where the record is); each is logged with its Run.
    pub illegal_transitions: std::sync::atomic::AtomicU64,
    /// Hook deliveries refused because their signature, token or
    /// timestamp did not verify (their bodies are not kept).
    pub unverified_deliveries: std::sync::atomic::AtomicU64,
}

impl Services {
    pub async fn init(cfg: Config, aws: AwsClients) -> Result<Arc<Self>, StoreError> {
        let queues = SqsQueues::resolve(aws.sqs.clone(), &cfg).await?;
        let payloads = Payloads::new(aws.s3.clone(), &cfg.payload_bucket);
        let runs = Arc::new(RunStore::new(
            aws.dynamo.clone(),
            &cfg.runs_table,
            &cfg.run_events_table,
            &cfg.sessions_table,
            &cfg.idempotency_table,
            &cfg.approvals_table,
            &cfg.quotas_table,
        ));
        let egress = Egress::of(&cfg);
        let triggers = Arc::new(TriggerStore::new(aws.dynamo.clone(), &cfg.triggers_table));
        Ok(Arc::new(Services {
            counters: Arc::default(),
            runs: runs.clone(),
            run_events: runs,
            sessions: Arc::new(SessionStore::new(
                aws.dynamo.clone(),
                &cfg.sessions_table,
                payloads.clone(),
            )),
            approvals: Arc::new(ApprovalStore::new(aws.dynamo.clone(), &cfg.approvals_table)),
            hooks: triggers.clone(),
            secrets: triggers.clone(),
            vault: match &cfg.secrets_kms_key {
                Some(key) => Arc::new(crate::adapters::kms::KmsVault::new(
                    aws.kms.clone(),
                    key,
                    crate::adapters::vault::DerivedVault::of(&cfg),
                )),
                None => Arc::new(crate::adapters::vault::DerivedVault::of(&cfg)),
            },
            topics: Arc::new(AlarmTopics::new(aws.sns.clone(), &cfg)),
            schedules: triggers.clone(),
            mailboxes: triggers,
            timers: Arc::new(EventBridgeTimers::new(aws.scheduler.clone(), &cfg)),
            registry: Arc::new(RegistryTable::new(aws.dynamo.clone(), &cfg.registry_table)),
            sandboxes: Arc::new(SandboxStore::new(aws.dynamo.clone(), &cfg.sandboxes_table)),
            provider: Arc::new(SandboxProvider::new(
                &aws,
                &cfg,
                &queues.harness_url,
                &queues.dispatch_url,
            )),
            idempotency: Arc::new(IdempotencyStore::new(
                aws.dynamo.clone(),
                &cfg.idempotency_table,
            )),
            quotas: Arc::new(QuotasStore::new(aws.dynamo.clone(), &cfg.quotas_table)),
            payloads: Arc::new(payloads.clone()),
            models: Arc::new(Models::new(&aws.sdk_config, cfg.scripted_model_url.clone())),
            tools: InlineTools::new(egress.clone(), Arc::new(payloads.clone())),
            callbacks: Callbacks::new(&cfg.callback_signing_secret, 3, egress),
            mail: Arc::new(crate::adapters::ses::SesMail::new(
                aws.ses.clone(),
                &cfg.approval_sender,
                cfg.mail_outbox.clone(),
            )),
            clock: Clock::default(),
            faults: Arc::new(faults::NoFaults),
            queues: Arc::new(queues),
            cfg,
        }))
    }

    /// From the environment, as a Lambda function starts.
    pub async fn from_env() -> Result<Arc<Self>, anyhow::Error> {
        let cfg = Config::from_env()?;
        let aws = AwsClients::load(None).await;
        Ok(Self::init(cfg, aws).await?)
    }
}
