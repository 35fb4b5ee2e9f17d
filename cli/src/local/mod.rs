//! The local stack: the emulator, the template's resources in it, the four
//! handlers in-process behind an API-Gateway-like HTTP server and
//! Lambda-like SQS pollers, and the scripted model on loopback.

pub mod dataplane;
pub mod emulator;
pub mod http;
pub mod model_server;
pub mod pollers;
pub mod process;
pub mod provision;
pub mod smtp;
pub mod supervisor;
pub mod template;
pub mod timers;

#[cfg(test)]
mod fixtures;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use armada_core::adapters::aws::AwsClients;
use armada_core::adapters::dynamo::registry::StoredKey;
use armada_core::config::Config;
use armada_core::Services;
use armada_domain::api::{ApiKey, KeyRole};
use armada_domain::crypto::sha256_hex;
use armada_harness::{Harness, NoHooks, StepHooks};

use self::http::HttpHandler;
use self::model_server::ModelStats;
use self::pollers::{PollerSpec, SqsHandler};
use self::template::Template;

#[derive(Clone)]
pub struct LocalOptions {
    /// The repository root (template, config/, .armada/).
    pub root: PathBuf,
    /// The stack name: the prefix of every resource name.
    pub stack: String,
    pub region: String,
    /// An emulator to use as it is; `None` starts moto on `emulator_port`.
    pub endpoint: Option<String>,
    pub emulator_port: u16,
    /// Port of the HTTP API (0 picks one).
    pub api_port: u16,
    /// Port of the SMTP listener that takes mailboxes' mail (0 picks one).
    pub smtp_port: u16,
    /// Template parameter overrides (`sam deploy --parameter-overrides`).
    pub parameters: HashMap<String, String>,
    /// Batches in flight at once per queue for the harness and the
    /// dispatcher (Lambda's concurrency: it scales a FIFO queue's
    /// consumers with its message groups, a standard queue's with its
    /// depth, so a 25-member team's steps run side by side).
    pub harness_concurrency: usize,
    pub dispatcher_concurrency: usize,
    /// Long-poll wait of each receive.
    pub poll_wait_seconds: i32,
    /// Kill a moto we start when this process ends (tests).
    pub emulator_dies_with_us: bool,
    /// Where a moto we start keeps its state across restarts and crashes
    /// (`None`: in memory, lost when it stops).
    pub emulator_state: Option<PathBuf>,
    /// Test hooks inside the harness's steps (tests).
    pub hooks: Arc<dyn StepHooks>,
    /// What every function meets at its named fault points (chaos).
    pub faults: Arc<dyn armada_core::faults::FaultPoints>,
    /// Where to record the pid of an emulator this stack (re)starts.
    pub emulator_pid_file: Option<PathBuf>,
    /// Run the local sandbox data plane (sandbox tasks as local processes).
    pub data_plane: bool,
    /// Where sandbox directories go (default `/var/tmp/armada/<stack>`:
    /// every ancestor must be traversable by the sandboxes' uids).
    pub sandbox_root: Option<PathBuf>,
    /// Added to every sandbox agent's environment (tests).
    pub sandbox_env: Vec<(String, String)>,
    /// How the data plane runs sandbox tasks (`--dataplane`).
    pub dataplane: dataplane::DataPlaneMode,
    /// Where every approval email is also written as an `.eml` file.
    pub mail_outbox: Option<PathBuf>,
    /// Duplicated and replayed deliveries (`armada chaos`).
    pub delivery_faults: Option<Arc<pollers::DeliveryFaults>>,
}

impl std::fmt::Debug for LocalOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalOptions")
            .field("stack", &self.stack)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl LocalOptions {
    /// How a moto this stack starts is started.
    pub fn emulator(&self) -> emulator::Spawn {
        emulator::Spawn {
            port: self.emulator_port,
            die_with_parent: self.emulator_dies_with_us,
            state: self.emulator_state.clone(),
            slow: None,
        }
    }

    pub fn new(root: &Path) -> Self {
        LocalOptions {
            root: root.to_path_buf(),
            stack: "armada-local".into(),
            region: std::env::var("AWS_REGION")
                .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
                .unwrap_or_else(|_| "us-east-1".into()),
            endpoint: std::env::var("AWS_ENDPOINT_URL")
                .ok()
                .filter(|s| !s.is_empty()),
            emulator_port: 4566,
            api_port: 8787,
            smtp_port: 2525,
            parameters: HashMap::new(),
            harness_concurrency: 32,
            dispatcher_concurrency: 8,
            poll_wait_seconds: 5,
            emulator_dies_with_us: false,
            emulator_state: None,
            hooks: Arc::new(NoHooks),
            faults: Arc::new(armada_core::faults::NoFaults),
            emulator_pid_file: None,
            data_plane: true,
            sandbox_root: None,
            sandbox_env: Vec::new(),
            dataplane: dataplane::DataPlaneMode::Local,
            mail_outbox: Some(root.join(".armada/outbox")),
            delivery_faults: None,
        }
    }
}

pub struct LocalStack {
    pub api_url: String,
    pub endpoint: String,
    pub admin_key: String,
    pub tenant_key: String,
    /// A key of the same tenant with the `approver` role.
    pub approver_key: String,
    /// Where approval emails and mail replies are also written (`.eml`).
    pub mail_outbox: Option<PathBuf>,
    /// Where mailboxes' mail is taken (`host:port`, SMTP).
    pub smtp_addr: String,
    pub tenant: String,
    pub model_url: String,
    pub model_stats: ModelStats,
    /// The services the handlers run on (one AWS client set, shared, so
    /// the call counter sees every call).
    pub svc: Arc<Services>,
    /// The dispatcher's services (its counters are its own).
    pub dispatcher_svc: Arc<Services>,
    pub aws: AwsClients,
    /// The clients of the SQS pollers, which stand for Lambda's event source
    /// mapping: in AWS those calls are the platform's, not the functions'.
    pub esm_aws: AwsClients,
    pub template: Template,
    pub provisioned: provision::Provisioned,
    /// The sandbox agents its data plane runs (none without one).
    pub sandbox_agents: dataplane::AgentPids,
    /// The emulator we started, if we started one (0 while it restarts).
    emulator_pid: Option<Arc<AtomicU32>>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for LocalStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalStack")
            .field("api_url", &self.api_url)
            .finish_non_exhaustive()
    }
}

/// What the stack needs of its emulator before it starts: its network, its
/// account, and the template's resources, made.
async fn prepare(
    opts: &LocalOptions,
    endpoint: &str,
    aws: &AwsClients,
    mut params: HashMap<String, String>,
) -> Result<(Template, provision::Provisioned)> {
    if !params.contains_key("SandboxSubnets") || !params.contains_key("SandboxSecurityGroups") {
        let (subnet, group) = provision::default_network(endpoint, &opts.region).await?;
        params.entry("SandboxSubnets".into()).or_insert(subnet);
        params
            .entry("SandboxSecurityGroups".into())
            .or_insert(group);
    }
    if !params.contains_key("SandboxIsolatedSecurityGroups") {
        let group = provision::isolated_security_group(endpoint, &opts.region).await?;
        params.insert("SandboxIsolatedSecurityGroups".into(), group);
    }
    if !params.contains_key(template::ACCOUNT_ID) {
        let who = aws
            .sts
            .get_caller_identity()
            .send()
            .await
            .context("asking the emulator which account this is")?;
        params.insert(
            template::ACCOUNT_ID.into(),
            who.account().unwrap_or("123456789012").to_string(),
        );
    }
    let text = std::fs::read_to_string(opts.root.join("infra/template.yaml"))?;
    let template = Template::parse(&text, &opts.stack, &opts.region, &params)?;
    let provisioned = provision::provision(aws, &template).await?;
    Ok((template, provisioned))
}

/// The deployment's callback signing secret. Tenants' callback secrets are
/// derived from it, so a stack whose emulator keeps its state keeps this
/// too (beside that state, its owner's alone); otherwise each start mints
/// one.
fn callback_signing_secret(state: Option<&Path>) -> Result<String> {
    let Some(dir) = state else {
        return Ok(ApiKey::mint().secret);
    };
    let path = dir.join("callback-signing-secret");
    if let Ok(kept) = std::fs::read_to_string(&path) {
        if !kept.trim().is_empty() {
            return Ok(kept.trim().to_string());
        }
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let secret = ApiKey::mint().secret;
    process::write_private(&path, &secret)?;
    Ok(secret)
}

/// Finds the repository root from the current directory upwards.
pub fn find_root() -> Result<PathBuf> {
    let mut dir = std::env::current_dir()?;
    loop {
        if dir.join("infra/template.yaml").exists() {
            return Ok(dir);
        }
        if !dir.pop() {
            return Err(anyhow!(
                "infra/template.yaml not found here or above: run armada from the repository"
            ));
        }
    }
}

impl LocalStack {
    pub async fn start(opts: LocalOptions) -> Result<Self> {
        let (endpoint, emulator_pid) = match &opts.endpoint {
            Some(ep) => (ep.trim_end_matches('/').to_string(), None),
            None => {
                let ep = format!("http://127.0.0.1:{}", opts.emulator_port);
                if emulator::answers(&ep).await {
                    (ep, None)
                } else {
                    let pid = emulator::spawn(&opts.root, &opts.emulator())?;
                    // Recovering a large state takes a while.
                    emulator::wait_until_up(&ep, Duration::from_secs(300)).await?;
                    (ep, Some(pid))
                }
            }
        };
        let mut emulator_pid = emulator_pid;
        let aws = AwsClients::load_local(&endpoint, &opts.region).await;
        emulator::keep_tasks_running(&endpoint).await;

        // The scripted model and the API listener come first: their URLs
        // are template parameters.
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let model_listener = TcpListener::bind("127.0.0.1:0").await?;
        let model_url = format!("http://{}/v1", model_listener.local_addr()?);
        let model_stats = ModelStats::default();
        tasks.push(tokio::spawn(model_server::serve(
            model_listener,
            model_stats.clone(),
            shutdown_rx.clone(),
        )));
        let api_listener = TcpListener::bind(("127.0.0.1", opts.api_port))
            .await
            .with_context(|| format!("binding the API port {}", opts.api_port))?;
        let api_url = format!("http://{}", api_listener.local_addr()?);
        let smtp_listener = TcpListener::bind(("127.0.0.1", opts.smtp_port))
            .await
            .with_context(|| format!("binding the SMTP port {}", opts.smtp_port))?;
        let smtp_addr = smtp_listener.local_addr()?.to_string();

        let admin_key = format!("adm_{}", ApiKey::mint().secret);
        let mut params = opts.parameters.clone();
        params.insert("AdminKeySha256".into(), sha256_hex(admin_key.as_bytes()));
        params
            .entry("ScriptedModelUrl".into())
            .or_insert(model_url.clone());
        // Approval links point at this stack's API.
        params.entry("PublicUrl".into()).or_insert(api_url.clone());
        if !params.contains_key("CallbackSigningSecret") {
            let secret = callback_signing_secret(opts.emulator_state.as_deref())?;
            params.insert("CallbackSigningSecret".into(), secret);
        }
        // The emulator's side is prepared again, within a minute, when the
        // emulator stops answering meanwhile: one that answered as this
        // stack started may be one `armada down` was still stopping.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let (template, provisioned) = loop {
            match prepare(&opts, &endpoint, &aws, params.clone()).await {
                Ok(done) => break done,
                Err(e)
                    if std::time::Instant::now() < deadline
                        && !emulator::answers(&endpoint).await =>
                {
                    tracing::warn!(error = %format!("{e:#}"), "the emulator went away as the stack started; trying again");
                    if opts.endpoint.is_none() {
                        emulator_pid = Some(emulator::spawn(&opts.root, &opts.emulator())?);
                    }
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    emulator::wait_until_up(&endpoint, left).await?;
                    emulator::keep_tasks_running(&endpoint).await;
                }
                Err(e) => return Err(e),
            }
        };
        if let (Some(pid), Some(f)) = (emulator_pid, &opts.emulator_pid_file) {
            process::write_pid(f, pid)?;
        }
        // The port is this stack's to serve (no endpoint was given): an
        // emulator found there is adopted, and started again if it goes.
        let emulator_pid = match emulator_pid {
            Some(p) => Some(Arc::new(AtomicU32::new(p))),
            None if opts.endpoint.is_none() => Some(Arc::new(AtomicU32::new(0))),
            None => None,
        };

        // Each function gets the environment the template gives it.
        let outbox = opts.mail_outbox.clone();
        let services = |binary: &'static str| {
            let aws = aws.clone();
            let template = template.clone();
            let outbox = outbox.clone();
            let endpoint = endpoint.clone();
            let faults = opts.faults.clone();
            async move {
                let mut env = template.environment(binary)?;
                // The emulator is the platform's: never a tenant's target.
                env.insert("AWS_ENDPOINT_URL".into(), endpoint);
                if let Some(dir) = outbox {
                    env.insert("ARMADA_MAIL_OUTBOX".into(), dir.display().to_string());
                }
                let cfg = Config::from_map(&env)?;
                let mut svc = Services::init(cfg, aws).await?;
                if let Some(s) = Arc::get_mut(&mut svc) {
                    s.faults = faults;
                }
                Ok::<_, anyhow::Error>(svc)
            }
        };
        let ingress_svc = services("ingress").await?;
        let dispatcher_svc = services("dispatcher").await?;
        let harness_svc = services("harness").await?;
        let hitl_svc = services("hitl").await?;
        provision::verify_sender(&aws, &dispatcher_svc.cfg.approval_sender).await?;
        // Mailboxes reply from their own addresses.
        provision::verify_sender(&aws, &dispatcher_svc.cfg.inbox.domain).await?;

        provision::load_agents(ingress_svc.registry.as_ref(), &opts.root).await?;
        provision::load_teams(ingress_svc.registry.as_ref(), &opts.root).await?;
        let tenant = "local".to_string();
        let key = ApiKey::mint();
        let stored_key = StoredKey {
            key_id: key.key_id.clone(),
            tenant: tenant.clone(),
            secret_sha256: key.secret_hash(),
            revoked: false,
            role: KeyRole::Member,
            owner: None,
        };
        ingress_svc
            .registry
            .put_key(&stored_key, ingress_svc.clock.now_ms())
            .await?;
        // A second key of the tenant that decides its approvals.
        let approver = ApiKey::mint();
        let approver_stored = StoredKey {
            key_id: approver.key_id.clone(),
            tenant: tenant.clone(),
            secret_sha256: approver.secret_hash(),
            revoked: false,
            role: KeyRole::Approver,
            owner: None,
        };
        ingress_svc
            .registry
            .put_key(&approver_stored, ingress_svc.clock.now_ms())
            .await?;
        let supervisor = supervisor::Supervisor {
            aws: AwsClients::load_local(&endpoint, &opts.region).await,
            endpoint: endpoint.clone(),
            template: template.clone(),
            root: opts.root.clone(),
            registry_table: ingress_svc.cfg.registry_table.clone(),
            runs_table: ingress_svc.cfg.runs_table.clone(),
            tenant_key: stored_key,
            owned: emulator_pid.clone().map(|pid| (opts.emulator(), pid)),
            pid_file: opts.emulator_pid_file.clone(),
        };
        tasks.push(tokio::spawn(supervisor.run(shutdown_rx.clone())));

        let mut http_handlers: HashMap<String, HttpHandler> = HashMap::new();
        http_handlers.insert(
            "ingress".into(),
            http::function(armada_ingress::app(ingress_svc.clone())),
        );
        http_handlers.insert("hitl".into(), http::function(armada_hitl::app(hitl_svc)));
        tasks.push(tokio::spawn(http::serve(
            api_listener,
            template.routes(),
            http_handlers,
            shutdown_rx.clone(),
        )));

        let dispatcher = armada_dispatcher::Dispatcher::new(dispatcher_svc.clone());
        let harness = Arc::new(Harness::with_hooks(harness_svc.clone(), opts.hooks.clone()));
        let mut sqs_handlers: HashMap<&str, (SqsHandler, usize)> = HashMap::new();
        sqs_handlers.insert(
            "dispatcher",
            (
                Arc::new(move |ev| {
                    let d = dispatcher.clone();
                    Box::pin(async move { Ok(d.handle_event(ev).await) })
                }),
                opts.dispatcher_concurrency,
            ),
        );
        sqs_handlers.insert(
            "harness",
            (
                Arc::new(move |ev| {
                    let h = harness.clone();
                    Box::pin(async move { h.handle_event(ev).await.map_err(|e| e.to_string()) })
                }),
                opts.harness_concurrency,
            ),
        );
        let esm_aws = AwsClients::load_local(&endpoint, &opts.region).await;
        let mut sandbox_agents = dataplane::AgentPids::default();
        if opts.data_plane {
            // Its calls are the platform's (Fargate's), not the functions'.
            let dp_aws = AwsClients::load_local(&endpoint, &opts.region).await;
            let cfg = &harness_svc.cfg;
            let provider = armada_core::adapters::ecs::SandboxProvider::new(
                &dp_aws,
                cfg,
                &harness_svc.queues.harness_url(),
                &harness_svc.queues.dispatch_url(),
            );
            let store = armada_core::adapters::dynamo::sandboxes::SandboxStore::new(
                dp_aws.dynamo.clone(),
                &cfg.sandboxes_table,
            );
            let dp_opts = dataplane::DataPlaneOptions {
                root: opts
                    .sandbox_root
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("/var/tmp/armada").join(&opts.stack)),
                agent: dataplane::sandbox_program()?,
                endpoint: endpoint.clone(),
                region: opts.region.clone(),
                extra_env: opts.sandbox_env.clone(),
                poll: Duration::from_millis(200),
                mode: opts.dataplane,
            };
            let plane = dataplane::DataPlane::new(provider, store, dp_opts, &opts.stack);
            sandbox_agents = plane.agents();
            tasks.push(tokio::spawn(plane.run(shutdown_rx.clone())));
        }
        for esm in template.event_source_mappings() {
            let (handler, concurrency) = sqs_handlers
                .get(esm.function.as_str())
                .cloned()
                .ok_or_else(|| anyhow!("no local handler for function {}", esm.function))?;
            let spec = PollerSpec {
                queue_url: provisioned.queue_urls[&esm.queue_logical_id].clone(),
                queue_arn: provisioned.queue_arns[&esm.queue_logical_id].clone(),
                batch_size: esm.batch_size as i32,
                wait_seconds: opts.poll_wait_seconds,
                region: opts.region.clone(),
                hold_s: harness_svc.cfg.crash_return_s as i32,
            };
            // Dead-letter queues are drained one batch at a time; work
            // queues with up to the function's concurrency in flight.
            let n = if esm.queue_logical_id.contains("DeadLetter") {
                1
            } else {
                concurrency.max(1)
            };
            tasks.push(tokio::spawn(pollers::run(
                esm_aws.sqs.clone(),
                spec,
                handler.clone(),
                n,
                opts.delivery_faults.clone(),
                shutdown_rx.clone(),
            )));
        }

        // Schedules fire here as EventBridge Scheduler would fire them.
        let queues: HashMap<String, String> = provisioned
            .queue_arns
            .iter()
            .filter_map(|(id, arn)| Some((arn.clone(), provisioned.queue_urls.get(id)?.clone())))
            .collect();
        let timers = timers::LocalTimers {
            aws: aws.clone(),
            group: template.physical_name("ScheduleGroup")?,
            queues,
            poll: Duration::from_millis(500),
        };
        tasks.push(tokio::spawn(timers.run(shutdown_rx.clone())));
        tasks.push(tokio::spawn(smtp::serve(
            smtp_listener,
            smtp::Listener {
                svc: ingress_svc.clone(),
                aws: aws.clone(),
            },
            shutdown_rx.clone(),
        )));

        Ok(LocalStack {
            api_url,
            endpoint,
            admin_key,
            tenant_key: key.token(),
            approver_key: approver.token(),
            mail_outbox: opts.mail_outbox.clone(),
            smtp_addr,
            tenant,
            model_url,
            model_stats,
            svc: harness_svc,
            dispatcher_svc,
            aws,
            esm_aws,
            template,
            provisioned,
            sandbox_agents,
            emulator_pid,
            shutdown,
            tasks,
        })
    }

    /// The pid of the emulator this stack started, if it started one.
    pub fn emulator_pid(&self) -> Option<u32> {
        self.emulator_pid
            .as_ref()
            .map(|p| p.load(Ordering::Relaxed))
            .filter(|p| *p != 0)
    }

    /// Stops every task this stack started (not the emulator: see [`Self::emulator_pid`]).
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
    }

    /// Ends every task of this stack at once, mid-step, as `kill -9` of the
    /// functions host would: nothing more is released, deleted, re-hidden or
    /// committed (sandbox agents, processes of their own, are not touched).
    pub fn kill(self) {
        for t in self.tasks {
            t.abort();
        }
    }

    /// The contents of `.armada/local.env`.
    pub fn env_file(&self) -> String {
        format!(
            "ARMADA_API_URL={}\nARMADA_API_KEY={}\nARMADA_APPROVER_KEY={}\nARMADA_ADMIN_KEY={}\nAWS_ENDPOINT_URL={}\nARMADA_TENANT={}\nARMADA_SMTP={}\n",
            self.api_url, self.tenant_key, self.approver_key, self.admin_key, self.endpoint, self.tenant, self.smtp_addr
        )
    }
}
