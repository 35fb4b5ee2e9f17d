//! Test support: one moto server per test process (started on a free port,
//! killed when the process ends), and a local stack per test with its own
//! stack name, so tests share the emulator but no resources.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use armada_api::error::ErrorBody;
pub use armada_api::runs::{EventView, RunView};
use armada_cli::client::Client;
use armada_cli::local::dataplane::DataPlaneMode;
use armada_cli::local::{emulator, LocalOptions, LocalStack};
use armada_domain::run::Run;
pub use armada_domain::run::{CallbackReport, EventKind, LogEvent, RunState};
use armada_harness::{Aborted, StepHooks};
use futures::future::BoxFuture;

pub mod approvals;
pub mod sandbox;
pub mod wait;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repository")
        .to_path_buf()
}

pub fn free_port() -> u16 {
    armada_cli::local::process::free_port().expect("a free port")
}

/// The pid of this process's own moto server, once started (`None` with
/// `ARMADA_TEST_ENDPOINT`).
pub fn emulator_pid() -> Option<u32> {
    EMULATOR_PID.get().copied()
}

static EMULATOR_PID: OnceLock<u32> = OnceLock::new();

/// The emulator endpoint: `ARMADA_TEST_ENDPOINT` if set, else a moto server
/// of this process's own.
pub fn emulator_endpoint() -> String {
    static EP: OnceLock<String> = OnceLock::new();
    EP.get_or_init(|| {
        if let Ok(ep) = std::env::var("ARMADA_TEST_ENDPOINT") {
            return ep;
        }
        let port = free_port();
        let (tx, rx) = std::sync::mpsc::channel();
        // The spawning thread never ends, so the child's parent-death signal
        // fires only when the whole test process exits.
        std::thread::spawn(move || {
            let how = emulator::Spawn {
                port,
                die_with_parent: true,
                state: None,
                slow: None,
            };
            let r = emulator::spawn(&root(), &how).map_err(|e| format!("{e:#}"));
            if let Ok(pid) = &r {
                let _ = EMULATOR_PID.set(*pid);
            }
            let _ = tx.send(r);
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("spawner thread").expect("moto starts");
        // Every caller gets an emulator that listens (tests that talk to it
        // directly do not wait for it themselves).
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "moto did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        format!("http://127.0.0.1:{port}")
    })
    .clone()
}

/// How this test process's stacks run sandbox tasks unless a test says:
/// `ARMADA_TEST_DATAPLANE` (`local`, the default, or `fargate`), so every
/// sandbox test file can be run as on Fargate.
pub fn dataplane_mode() -> DataPlaneMode {
    std::env::var("ARMADA_TEST_DATAPLANE")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or_default()
}

pub struct TestStack {
    pub stack: LocalStack,
    pub client: Client,
    pub admin: Client,
    /// Where this stack writes every approval email (`.eml`).
    pub outbox: PathBuf,
}

impl TestStack {
    pub fn stack_name() -> String {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = armada_core::clock::new_id("s");
        format!("t{}-{n}-{}", std::process::id(), &id[id.len() - 6..])
    }

    pub async fn start() -> Self {
        Self::start_with(HashMap::new(), None).await
    }

    pub async fn start_with(
        parameters: HashMap<String, String>,
        hooks: Option<Arc<dyn StepHooks>>,
    ) -> Self {
        Self::start_full(parameters, hooks, vec![]).await
    }

    /// As [`Self::start_with`], with variables added to every sandbox
    /// agent's environment (fault injection).
    pub async fn start_full(
        parameters: HashMap<String, String>,
        hooks: Option<Arc<dyn StepHooks>>,
        sandbox_env: Vec<(String, String)>,
    ) -> Self {
        Self::start_as(Self::stack_name(), parameters, hooks, sandbox_env).await
    }

    /// A stack whose harness runs up to `pollers` batches at once (the
    /// default is 2): for Runs that must be in their steps together.
    pub async fn start_concurrent(pollers: usize) -> Self {
        Self::start_opts(
            Self::stack_name(),
            HashMap::new(),
            None,
            vec![],
            pollers,
            dataplane_mode(),
        )
        .await
    }

    /// A stack whose data plane runs sandbox tasks in `mode` (whatever
    /// `ARMADA_TEST_DATAPLANE` says).
    pub async fn start_in(mode: DataPlaneMode, parameters: HashMap<String, String>) -> Self {
        Self::start_opts(Self::stack_name(), parameters, None, vec![], 2, mode).await
    }

    /// A stack of a given name: a second one of the same name takes over
    /// the first one's tables and queues (a functions host started again).
    pub async fn start_as(
        stack_name: String,
        parameters: HashMap<String, String>,
        hooks: Option<Arc<dyn StepHooks>>,
        sandbox_env: Vec<(String, String)>,
    ) -> Self {
        Self::start_opts(
            stack_name,
            parameters,
            hooks,
            sandbox_env,
            2,
            dataplane_mode(),
        )
        .await
    }

    async fn start_opts(
        stack_name: String,
        parameters: HashMap<String, String>,
        hooks: Option<Arc<dyn StepHooks>>,
        sandbox_env: Vec<(String, String)>,
        harness_pollers: usize,
        mode: DataPlaneMode,
    ) -> Self {
        armada_core::telemetry::init_with("warn");
        let ep = emulator_endpoint();
        emulator::wait_until_up(&ep, Duration::from_secs(60))
            .await
            .expect("emulator up");
        let mut opts = LocalOptions::new(&root());
        opts.endpoint = Some(ep);
        opts.stack = stack_name;
        opts.api_port = 0;
        opts.smtp_port = 0;
        opts.poll_wait_seconds = 1;
        opts.harness_concurrency = harness_pollers;
        opts.dispatcher_concurrency = 1;
        opts.parameters = parameters;
        // The tests' receivers listen on loopback ports of their own (the
        // platform's own ports stay refused); a test may list fewer.
        opts.parameters
            .entry("EgressAllow".into())
            .or_insert_with(|| "127.0.0.1:*".into());
        opts.sandbox_env = sandbox_env;
        opts.dataplane = mode;
        let outbox = std::env::temp_dir().join(format!("armada-outbox-{}", opts.stack));
        opts.mail_outbox = Some(outbox.clone());
        if let Some(h) = hooks {
            opts.hooks = h;
        }
        let stack = LocalStack::start(opts).await.expect("local stack starts");
        let client = Client::new(
            &stack.api_url,
            &stack.tenant_key,
            Some(stack.admin_key.clone()),
        );
        let admin = Client::new(
            &stack.api_url,
            &stack.admin_key,
            Some(stack.admin_key.clone()),
        );
        TestStack {
            stack,
            client,
            admin,
            outbox,
        }
    }

    /// Starts a Run and waits for it to end: its id and its final view.
    pub async fn ask(&self, agent: &str, input: &str) -> (String, RunView) {
        let run_id = self
            .client
            .create_run(agent, input)
            .await
            .expect("run created");
        let run = self
            .client
            .wait_run(&run_id, Duration::from_secs(60))
            .await
            .expect("run ends");
        (run_id, run)
    }

    /// A raw request: status and JSON body.
    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (u16, serde_json::Value) {
        let mut req =
            reqwest::Client::new().request(method, format!("{}{path}", self.stack.api_url));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        )
    }

    /// Puts the tenant's secret `name` (its member key): `204`.
    pub async fn put_secret(&self, name: &str, value: &str) {
        let body = serde_json::json!({ "value": value }).to_string();
        let key = self.stack.tenant_key.clone();
        let path = format!("/v1/secrets/{name}");
        let (status, v) = self
            .raw(reqwest::Method::PUT, &path, Some(&key), Some(&body), &[])
            .await;
        assert_eq!(status, 204, "{v}");
    }

    /// Deletes the tenant's secret `name`: `204`.
    pub async fn delete_secret(&self, name: &str) {
        let key = self.stack.tenant_key.clone();
        let path = format!("/v1/secrets/{name}");
        let (status, v) = self
            .raw(reqwest::Method::DELETE, &path, Some(&key), None, &[])
            .await;
        assert_eq!(status, 204, "{v}");
    }

    /// A Run's events, oldest first (its first page).
    pub async fn events(&self, run_id: &str) -> Vec<EventView> {
        let page = self.client.events(run_id, 0, 0).await.expect("events");
        page.events
    }

    /// The first event of a Run of type `kind`, if any.
    pub async fn event(&self, run_id: &str, kind: EventKind) -> Option<LogEvent> {
        self.events(run_id)
            .await
            .into_iter()
            .find(|e| e.kind() == kind)
            .map(|e| e.event)
    }

    /// The first event of `kind` on a Run, once there is one.
    pub async fn event_eventually(&self, run_id: &str, kind: EventKind) -> LogEvent {
        let what = format!("a {kind} event on {run_id}");
        wait::until(&what, wait::PATIENCE, || self.event(run_id, kind)).await
    }

    /// The events of a Run, by type.
    pub async fn event_types(&self, run_id: &str) -> Vec<String> {
        self.events(run_id)
            .await
            .iter()
            .map(|e| e.kind().to_string())
            .collect()
    }

    /// A hook's recorded deliveries, newest first: how each was answered
    /// and the Run it started or found.
    pub async fn hook_deliveries(
        &self,
        hook_id: &str,
    ) -> Vec<(armada_domain::hook::inbound::Outcome, Option<String>)> {
        let page: armada_api::hooks::DeliveriesPage = self
            .client
            .typed(
                reqwest::Method::GET,
                &format!("/v1/hooks/{hook_id}/deliveries?limit=200"),
                None,
            )
            .await
            .expect("the hook's deliveries");
        page.deliveries
            .into_iter()
            .map(|d| (d.outcome, d.run_id))
            .collect()
    }

    /// A mailbox's recorded mail, newest first.
    pub async fn mailbox_deliveries(
        &self,
        mailbox_id: &str,
    ) -> Vec<armada_api::mailboxes::MailView> {
        let page: armada_api::mailboxes::MailPage = self
            .client
            .typed(
                reqwest::Method::GET,
                &format!("/v1/mailboxes/{mailbox_id}/deliveries?limit=200"),
                None,
            )
            .await
            .expect("the mailbox's mail");
        page.deliveries
    }

    /// Waits until the Run is closed (post-terminal duties done).
    pub async fn wait_closed(&self, run_id: &str) -> RunView {
        let what = format!("run {run_id} to close");
        wait::until(&what, wait::PATIENCE, || async {
            let run = self.client.run(run_id).await.expect("run");
            run.state.is_closed().then_some(run)
        })
        .await
    }
}

pub fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Registers an agent whose only skill is `http_request`, allowed `hosts`.
pub async fn put_fetcher(t: &TestStack, name: &str, hosts: &[String]) {
    let def = serde_json::json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
        "system_prompt": "You fetch.",
        "skills": ["http_request"],
        "http_allow_hosts": hosts,
        "limits": {"timeout_s": 60}
    });
    t.admin
        .call(
            reqwest::Method::PUT,
            &format!("/v1/agents/{name}"),
            Some(&def),
            true,
        )
        .await
        .expect("the fetcher agent is registered");
}

/// A Run's outcome, whether or not it is closed yet.
pub fn outcome(run: &impl StateOf) -> String {
    let s = run.state_name();
    s.strip_prefix("CLOSED_").unwrap_or(&s).to_string()
}

/// A Run's state, from its typed view or (for raw answers) its JSON.
pub trait StateOf {
    fn state_name(&self) -> String;
}

impl StateOf for RunView {
    fn state_name(&self) -> String {
        self.state.as_str().to_string()
    }
}

impl StateOf for serde_json::Value {
    fn state_name(&self) -> String {
        self["state"].as_str().unwrap_or_default().to_string()
    }
}

/// A request a [`callback_receiver`] heard: its headers and its body.
#[derive(Debug, Clone)]
pub struct Heard {
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Heard {
    /// A header's value (`""` when absent).
    pub fn header(&self, name: &str) -> String {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    /// Whether the tenant's `secret` (`whsec_…`) verifies this request as
    /// the Standard Webhooks reference library (PyPI `standardwebhooks`)
    /// does: its own verifier, run on the headers and body as received.
    pub fn verifies_with(&self, secret: &str) -> bool {
        let python = armada_cli::local::emulator::install_isolated_tool(
            &root(),
            "standardwebhooks",
            "1.3.0",
            include_str!("../fixtures/hooks/standardwebhooks-requirements.txt"),
            "python",
        )
        .expect("the Standard Webhooks library installs");
        let headers = serde_json::json!({
            "webhook-id": self.header("webhook-id"),
            "webhook-timestamp": self.header("webhook-timestamp"),
            "webhook-signature": self.header("webhook-signature"),
        });
        let mut child = std::process::Command::new(python)
            .arg(root().join("tests/fixtures/hooks/standard-sign.py"))
            .args([secret, "verify", &headers.to_string()])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("python runs");
        use std::io::Write;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(self.body.as_bytes()).expect("body written");
        }
        child.wait().expect("the verifier ends").success()
    }
}

/// A loopback receiver that records each request (headers and body) and
/// answers with the given statuses in turn (the last one repeats).
pub async fn callback_receiver(
    statuses: Vec<u16>,
) -> (String, tokio::sync::mpsc::UnboundedReceiver<Heard>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let url = format!("http://{}/hook", listener.local_addr().expect("bound"));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut n = 0;
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // Read headers, then the body by Content-Length.
            let (head, body) = loop {
                let k = s.read(&mut chunk).await.unwrap_or(0);
                if k == 0 {
                    break (String::new(), String::new());
                }
                buf.extend_from_slice(&chunk[..k]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some((head, rest)) = text.split_once("\r\n\r\n") {
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if rest.len() >= len {
                        break (head.to_string(), rest[..len].to_string());
                    }
                }
            };
            let headers = head
                .lines()
                .skip(1)
                .filter_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    Some((k.trim().to_ascii_lowercase(), v.trim().to_string()))
                })
                .collect();
            let _ = tx.send(Heard { headers, body });
            let status = statuses[n.min(statuses.len() - 1)];
            n += 1;
            let _ = s
                .write_all(
                    format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    )
                    .as_bytes(),
                )
                .await;
        }
    });
    (url, rx)
}

/// The code of an error answer, read as the API's `ErrorBody`: `None`
/// when the body is not one (so a success, or a malformed error, never
/// passes for a refusal).
pub fn error_code(body: &serde_json::Value) -> Option<String> {
    serde_json::from_value::<ErrorBody>(body.clone())
        .ok()
        .map(|b| b.error.code)
}

/// The message of an error answer, read as the API's `ErrorBody`; the
/// test fails when the body is not one.
pub fn error_message(body: &serde_json::Value) -> String {
    match serde_json::from_value::<ErrorBody>(body.clone()) {
        Ok(b) => b.error.message,
        Err(e) => panic!("not an error body ({e}): {body}"),
    }
}

/// Short leases and visibility timeouts so redelivery happens in seconds.
pub fn fast_redelivery(max_receives: &str) -> HashMap<String, String> {
    params(&[
        ("HarnessTimeoutSeconds", "1"),
        ("HarnessQueueVisibilitySeconds", "3"),
        ("MaxReceiveCount", max_receives),
        ("RetryBaseSeconds", "0"),
    ])
}

/// Dies after the step's tools ran (their effects happened) and before the
/// results were committed, on the first attempt.
pub struct CrashAfterTools;

impl StepHooks for CrashAfterTools {
    fn after_tools_ran<'a>(&'a self, run: &'a Run) -> BoxFuture<'a, Result<(), Aborted>> {
        Box::pin(async move {
            if run.epoch == 1 {
                return Err(Aborted("injected crash after the tools ran".into()));
            }
            Ok(())
        })
    }
}
