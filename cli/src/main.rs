//! `armada`: bring the local stack up and down, and talk to the HTTP API.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde_json::{json, Value};

use armada_api::runs::RunView;
use armada_cli::client::Client;
use armada_cli::local;
use armada_domain::run::{EventKind, RunState};

#[derive(Parser)]
#[command(
    name = "armada",
    version,
    about = "Armada: a multi-agent runtime on AWS Lambda, SQS and DynamoDB"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Bring the local stack up: emulator, resources from infra/template.yaml, handlers, scripted model.
    Up {
        /// Return once the stack is healthy, leaving it running in the background.
        #[arg(long)]
        detach: bool,
        /// Answer a first question and run a short session through the API.
        #[arg(long)]
        demo: bool,
        /// Port of the HTTP API.
        #[arg(long, default_value_t = 8787)]
        port: u16,
        /// A private target (HOST:PORT, or HOST:* for any port) that
        /// callbacks, http_request and chat webhooks may reach; loopback
        /// and private addresses are refused otherwise. Repeatable.
        #[arg(long = "allow-egress", value_name = "HOST:PORT")]
        allow_egress: Vec<String>,
        /// How the local data plane runs sandbox tasks: `local` (processes
        /// that may make namespaces and cgroups per call) or `fargate` (as
        /// Fargate would: no CAP_SYS_ADMIN/NET_ADMIN, read-only root and
        /// cgroupfs, a network namespace per isolated task).
        #[arg(long, default_value = "local", value_name = "local|fargate")]
        dataplane: armada_cli::local::dataplane::DataPlaneMode,
    },
    /// Stop everything `up` started. The emulator's state stays in
    /// `.armada/emulator` for the next `up`.
    Down {
        /// Also remove the emulator's state: the next `up` starts afresh.
        #[arg(long)]
        wipe: bool,
    },
    /// Ask an agent (or a team, or a relay chain) a one-off question and
    /// print the answer. A question that begins with @agent or @team:name
    /// goes there.
    Ask {
        text: String,
        /// The agent to ask (default: assistant, unless --team, --chain or
        /// a mention says otherwise).
        #[arg(long, conflicts_with_all = ["team", "chain"])]
        agent: Option<String>,
        /// A team from the registry (fan_out, relay or lead).
        #[arg(long, conflicts_with = "chain")]
        team: Option<String>,
        /// A relay chain of agents, comma-separated (researcher,assistant).
        #[arg(long, value_delimiter = ',')]
        chain: Option<Vec<String>>,
        /// Print the run id and return without waiting.
        #[arg(long)]
        no_wait: bool,
    },
    /// Chat with an agent: every line of stdin is a message of one session.
    Chat {
        #[arg(long, default_value = "assistant")]
        agent: String,
        /// Continue an existing session.
        #[arg(long)]
        session: Option<String>,
    },
    /// Inspect and cancel Runs.
    Runs {
        #[command(subcommand)]
        cmd: RunsCmd,
    },
    /// Register and read agent definitions.
    Agents {
        #[command(subcommand)]
        cmd: AgentsCmd,
    },
    /// Register and read teams (fan_out, relay, lead).
    Teams {
        #[command(subcommand)]
        cmd: TeamsCmd,
    },
    /// Follow and cancel relay chains.
    Chains {
        #[command(subcommand)]
        cmd: ChainsCmd,
    },
    /// Human approvals of risky tool calls: list, show, decide (decisions
    /// use ARMADA_APPROVER_KEY, a key with the approver role).
    Approvals {
        #[command(subcommand)]
        cmd: ApprovalsCmd,
    },
    /// Inspect and destroy agents' sandboxes.
    Sandboxes {
        #[command(subcommand)]
        cmd: SandboxesCmd,
    },
    /// Global sandbox profiles (they win over agents' project profiles).
    Profiles {
        #[command(subcommand)]
        cmd: ProfilesCmd,
    },
    /// Skills' programs: upload their files, list an MCP server's tools.
    Skills {
        #[command(subcommand)]
        cmd: armada_cli::skills::SkillsCmd,
    },
    /// Inbound webhooks of the tenant: GitHub, Standard Webhooks, Alertmanager.
    Hooks {
        #[command(subcommand)]
        cmd: armada_cli::hooks::HooksCmd,
    },
    /// Schedules of the tenant: Runs at the times a cron, rate or at expression names.
    Schedules {
        #[command(subcommand)]
        cmd: armada_cli::schedules::SchedulesCmd,
    },
    /// Mailboxes of the tenant: addresses whose mail starts Runs, answered in the thread.
    Mailboxes {
        #[command(subcommand)]
        cmd: armada_cli::mailboxes::MailboxesCmd,
    },
    /// Mint an admin key and print it with its SHA-256 (for `sam deploy`).
    Keygen,
    /// Print the API's OpenAPI 3.1 document (as in docs/openapi.json).
    Openapi,
    /// Run a seeded workload of every shape under injected faults on a
    /// local stack of its own, then check every promise; exits 1 on a
    /// violation.
    Chaos {
        #[arg(long, default_value_t = 100)]
        runs: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Comma-separated fault kinds: host-kill, point-kill,
        /// emulator-kill, sandbox-kill, redeliver, delay, slow-emulator
        /// (or all, none).
        #[arg(long, default_value = "all")]
        faults: String,
        /// Write the report as JSON here.
        #[arg(long)]
        report: Option<std::path::PathBuf>,
        /// Seconds the Runs have to end once the faults stop.
        #[arg(long, default_value_t = 240)]
        drain: u64,
        /// Seconds between host kills, at least and at most (`MIN-MAX`);
        /// with point-kill on, half of them are aimed at a fault point.
        #[arg(long, default_value = "45-90", value_parser = armada_cli::chaos::parse_span)]
        kill_every: (std::time::Duration, std::time::Duration),
        /// Seconds between emulator kills (`MIN-MAX`).
        #[arg(long, default_value = "90-180", value_parser = armada_cli::chaos::parse_span)]
        emulator_kill_every: (std::time::Duration, std::time::Duration),
        /// Seconds between kills of a sandbox agent (`MIN-MAX`).
        #[arg(long, default_value = "30-60", value_parser = armada_cli::chaos::parse_span)]
        sandbox_kill_every: (std::time::Duration, std::time::Duration),
        /// First run the same workload without faults, for its throughput.
        #[arg(long)]
        compare: bool,
    },
    /// Measure latency, throughput and AWS calls per Run against the floor.
    Bench {
        #[arg(long, default_value_t = 200)]
        runs: usize,
        #[arg(long, default_value_t = 100)]
        session_messages: usize,
        /// Runs in flight for the throughput phases, one phase each
        /// (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [8, 32])]
        concurrency: Vec<usize>,
        /// Skip the function binaries' size, init time and RSS.
        #[arg(long)]
        no_binaries: bool,
        /// Agents (samples) for the sandbox measurements; 0 skips them.
        #[arg(long, default_value_t = 5)]
        sandboxes: usize,
        /// Measure the one-at-a-time phase again after loading this many
        /// finished Runs into the stack.
        #[arg(long, default_value_t = 0)]
        fill: usize,
        /// Members of the fan-out team (each sleeping 1 s) measured against
        /// one member alone; 0 skips it.
        #[arg(long, default_value_t = 25)]
        fan_out: usize,
    },
}

#[derive(Subcommand)]
enum RunsCmd {
    Show {
        run_id: String,
    },
    /// Print a Run's events; with --follow, until it ends.
    Events {
        run_id: String,
        #[arg(long)]
        follow: bool,
    },
    Cancel {
        run_id: String,
    },
    /// Draw the Run's tree (its root, children and theirs, or its chain's
    /// steps) with states and timings.
    Tree {
        run_id: String,
    },
}

#[derive(Subcommand)]
enum TeamsCmd {
    /// Create or update a team from a JSON file (admin key).
    Put {
        name: String,
        file: PathBuf,
    },
    Get {
        name: String,
    },
    List,
}

#[derive(Subcommand)]
enum ApprovalsCmd {
    /// The tenant's approvals, newest first.
    List {
        /// pending, approved, rejected, expired or cancelled.
        #[arg(long)]
        state: Option<String>,
    },
    Show {
        approval_id: String,
    },
    Approve {
        approval_id: String,
        #[arg(long)]
        comment: Option<String>,
    },
    Reject {
        approval_id: String,
        #[arg(long)]
        comment: Option<String>,
    },
}

#[derive(Subcommand)]
enum ChainsCmd {
    /// The chain's state and every step's.
    Show { chain_id: String },
    /// Cancel the running step; the rest are skipped.
    Cancel { chain_id: String },
}

#[derive(Subcommand)]
enum AgentsCmd {
    /// Create or update an agent from a JSON file (admin key); its MCP
    /// servers' tools are listed and frozen into it.
    Put {
        name: String,
        file: PathBuf,
        /// Whose secrets open the MCP servers' headers for the listing.
        #[arg(long)]
        tenant: Option<String>,
    },
    Get {
        name: String,
    },
    List,
    /// List the agent's MCP servers' tools again into its next version.
    RefreshTools {
        name: String,
        /// Whose secrets open the servers' headers for the listing.
        #[arg(long)]
        tenant: Option<String>,
    },
}

#[derive(Subcommand)]
enum SandboxesCmd {
    /// The tenant's sandboxes: state, task, ports, holder, controls.
    List,
    /// One agent's sandbox, with what each control enforces.
    Show { agent: String },
    /// Destroy an agent's sandbox (admin key; the tenant is ARMADA_TENANT or --tenant).
    Destroy {
        agent: String,
        #[arg(long, env = "ARMADA_TENANT", default_value = "local")]
        tenant: String,
    },
}

#[derive(Subcommand)]
enum ProfilesCmd {
    List,
    /// Define a global custom profile from a JSON file (admin key).
    Put {
        name: String,
        file: PathBuf,
    },
}

/// PUTs a JSON file's contents with the admin key.
async fn put_json_file(c: &Client, path: &str, file: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let body: Value = serde_json::from_str(&text).context("the file is not JSON")?;
    c.call(reqwest::Method::PUT, path, Some(&body), true).await
}

/// The query naming whose secrets open MCP servers' headers, if any.
fn as_tenant(tenant: Option<&str>) -> String {
    tenant.map_or_else(String::new, |t| {
        let t: String = t
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        format!("?tenant={t}")
    })
}

fn print(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn root() -> Option<PathBuf> {
    local::find_root().ok()
}

fn main() {
    // `armada sandbox agent|exec` is the sandbox program, as the local data
    // plane starts it (one build serves the whole stack). The jail must stay
    // single-threaded, so this comes before any runtime exists.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(local::dataplane::SANDBOX_SUBCOMMAND) {
        let mode = args.get(2).cloned().unwrap_or_default();
        let code = match local::dataplane::sandbox_program() {
            Ok(program) => armada_sandbox::entry::main(program, &mode),
            Err(e) => {
                eprintln!("armada sandbox: {e:#}");
                1
            }
        };
        std::process::exit(code);
    }
    let cli = Cli::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: no async runtime: {e}");
            std::process::exit(1);
        }
    };
    armada_core::telemetry::init_with("warn");
    if let Err(e) = rt.block_on(run(cli)) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Up {
            detach,
            demo,
            port,
            allow_egress,
            dataplane,
        } => {
            let root = local::find_root()?;
            let args = armada_cli::up::UpArgs {
                demo,
                port,
                allow_egress,
                dataplane,
            };
            if detach {
                armada_cli::up::detached(&root, &args).await
            } else {
                armada_cli::up::foreground(&root, &args).await
            }
        }
        Cmd::Down { wipe } => armada_cli::up::down(&local::find_root()?, wipe),
        Cmd::Ask {
            text,
            agent,
            team,
            chain,
            no_wait,
        } => {
            let c = Client::from_env(root().as_deref())?;
            let mut body = json!({"input": text});
            match (agent, team, chain) {
                (Some(a), _, _) => body["agent"] = json!(a),
                (_, Some(t), _) => body["team"] = json!(t),
                (_, _, Some(steps)) => body["chain"] = json!(steps),
                // A mention at the start addresses its agent or team.
                _ if text.trim_start().starts_with('@') => {}
                _ => body["agent"] = json!("assistant"),
            }
            let v = c.post("/v1/runs", &body).await?;
            let run_id = armada_cli::client::run_id(&v)?;
            if no_wait {
                println!("{run_id}");
                if let Some(chain_id) = v["chain_id"].as_str() {
                    println!("{chain_id}");
                }
                return Ok(());
            }
            let run = c.wait_run(&run_id, Duration::from_secs(600)).await?;
            match v["chain_id"].as_str() {
                Some(chain_id) => follow_chain(&c, chain_id).await,
                None => print_answer(&run),
            }
        }
        Cmd::Chat { agent, session } => chat(&agent, session).await,
        Cmd::Runs { cmd } => {
            let c = Client::from_env(root().as_deref())?;
            match cmd {
                RunsCmd::Show { run_id } => print(&c.get(&format!("/v1/runs/{run_id}")).await?),
                RunsCmd::Tree { run_id } => {
                    let trace = c.get(&format!("/v1/runs/{run_id}/trace")).await?;
                    print!("{}", armada_cli::tree::draw(&trace));
                }
                RunsCmd::Cancel { run_id } => print(
                    &c.post(&format!("/v1/runs/{run_id}/cancel"), &json!({}))
                        .await?,
                ),
                RunsCmd::Events { run_id, follow } => {
                    let mut after = 0;
                    loop {
                        let wait = if follow { 10 } else { 0 };
                        let page = c.events(&run_id, after, wait).await?;
                        for e in &page.events {
                            println!("{}", serde_json::to_string(e)?);
                        }
                        after = page.next;
                        let ended = page.events.iter().any(|e| e.kind() == EventKind::RunClosed);
                        if !follow || ended {
                            return Ok(());
                        }
                    }
                }
            }
            Ok(())
        }
        Cmd::Agents { cmd } => {
            let c = Client::from_env(root().as_deref())?;
            match cmd {
                AgentsCmd::Put { name, file, tenant } => {
                    let path = format!("/v1/agents/{name}{}", as_tenant(tenant.as_deref()));
                    print(&put_json_file(&c, &path, &file).await?)
                }
                AgentsCmd::Get { name } => print(&c.get(&format!("/v1/agents/{name}")).await?),
                AgentsCmd::List => print(&c.get("/v1/agents").await?),
                AgentsCmd::RefreshTools { name, tenant } => {
                    let path = format!(
                        "/v1/agents/{name}/refresh-tools{}",
                        as_tenant(tenant.as_deref())
                    );
                    print(&c.call(reqwest::Method::POST, &path, None, true).await?)
                }
            }
            Ok(())
        }
        Cmd::Teams { cmd } => {
            let c = Client::from_env(root().as_deref())?;
            match cmd {
                TeamsCmd::Put { name, file } => {
                    print(&put_json_file(&c, &format!("/v1/teams/{name}"), &file).await?)
                }
                TeamsCmd::Get { name } => print(&c.get(&format!("/v1/teams/{name}")).await?),
                TeamsCmd::List => print(&c.get("/v1/teams").await?),
            }
            Ok(())
        }
        Cmd::Chains { cmd } => {
            let c = Client::from_env(root().as_deref())?;
            match cmd {
                ChainsCmd::Show { chain_id } => {
                    print(&c.get(&format!("/v1/chains/{chain_id}")).await?)
                }
                ChainsCmd::Cancel { chain_id } => print(
                    &c.post(&format!("/v1/chains/{chain_id}/cancel"), &json!({}))
                        .await?,
                ),
            }
            Ok(())
        }
        Cmd::Approvals { cmd } => {
            let c = Client::from_env(root().as_deref())?;
            let decide = |id: String, decision: &str, comment: Option<String>| {
                let approver = Client::approver_from_env(root().as_deref());
                let decision = decision.to_string();
                async move {
                    let body = json!({"decision": decision, "comment": comment});
                    approver?
                        .post(&format!("/v1/approvals/{id}/decision"), &body)
                        .await
                }
            };
            match cmd {
                ApprovalsCmd::List { state } => {
                    let q = state.map(|s| format!("?state={s}")).unwrap_or_default();
                    print(&c.get(&format!("/v1/approvals{q}")).await?)
                }
                ApprovalsCmd::Show { approval_id } => {
                    print(&c.get(&format!("/v1/approvals/{approval_id}")).await?)
                }
                ApprovalsCmd::Approve {
                    approval_id,
                    comment,
                } => print(&decide(approval_id, "approve", comment).await?),
                ApprovalsCmd::Reject {
                    approval_id,
                    comment,
                } => print(&decide(approval_id, "reject", comment).await?),
            }
            Ok(())
        }
        Cmd::Sandboxes { cmd } => {
            let c = Client::from_env(root().as_deref())?;
            match cmd {
                SandboxesCmd::List => print(&c.get("/v1/sandboxes").await?),
                SandboxesCmd::Show { agent } => {
                    print(&c.get(&format!("/v1/sandboxes/{agent}")).await?)
                }
                SandboxesCmd::Destroy { agent, tenant } => print(
                    &c.call(
                        reqwest::Method::DELETE,
                        &format!("/v1/sandboxes/{agent}?tenant={tenant}"),
                        None,
                        true,
                    )
                    .await?,
                ),
            }
            Ok(())
        }
        Cmd::Skills { cmd } => {
            let api = || Client::from_env(root().as_deref());
            print(&armada_cli::skills::run(cmd, api).await?);
            Ok(())
        }
        Cmd::Hooks { cmd } => {
            let c = Client::from_env(root().as_deref())?;
            print(&armada_cli::hooks::run(&c, cmd).await?);
            Ok(())
        }
        Cmd::Schedules { cmd } => {
            let c = Client::from_env(root().as_deref())?;
            print(&armada_cli::schedules::run(&c, cmd).await?);
            Ok(())
        }
        Cmd::Mailboxes { cmd } => {
            let c = Client::from_env(root().as_deref())?;
            print(&armada_cli::mailboxes::run(&c, cmd).await?);
            Ok(())
        }
        Cmd::Profiles { cmd } => {
            let c = Client::from_env(root().as_deref())?;
            match cmd {
                ProfilesCmd::List => print(&c.get("/v1/profiles").await?),
                ProfilesCmd::Put { name, file } => {
                    print(&put_json_file(&c, &format!("/v1/profiles/{name}"), &file).await?)
                }
            }
            Ok(())
        }
        Cmd::Openapi => {
            let text = armada_cli::openapi::document_json();
            std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes())?;
            Ok(())
        }
        Cmd::Chaos {
            runs,
            seed,
            concurrency,
            faults,
            report,
            drain,
            kill_every,
            emulator_kill_every,
            sandbox_kill_every,
            compare,
        } => {
            let opts = armada_cli::chaos::ChaosOpts {
                runs,
                seed,
                concurrency,
                faults: armada_cli::chaos::Fault::parse_list(&faults)?,
                report,
                drain: std::time::Duration::from_secs(drain),
                kill_every,
                emulator_kill_every,
                sandbox_kill_every,
                ..Default::default()
            };
            let report =
                armada_cli::chaos::run_compared(&local::find_root()?, &opts, compare).await?;
            print!("{}", report.summary());
            if !report.violations.is_empty() || !report.errors.is_empty() {
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Bench {
            runs,
            session_messages,
            concurrency,
            no_binaries,
            sandboxes,
            fill,
            fan_out,
        } => {
            armada_cli::bench::run(
                &local::find_root()?,
                armada_cli::bench::BenchOptions {
                    runs,
                    session_messages,
                    concurrency,
                    binaries: !no_binaries,
                    sandbox_samples: sandboxes,
                    fill,
                    fan_out,
                },
            )
            .await
        }
        Cmd::Keygen => {
            let key = format!("adm_{}", armada_domain::api::ApiKey::mint().secret);
            println!("ARMADA_ADMIN_KEY={key}");
            println!(
                "AdminKeySha256={}",
                armada_domain::crypto::sha256_hex(key.as_bytes())
            );
            Ok(())
        }
    }
}

fn print_answer(run: &RunView) -> Result<()> {
    if run.state.outcome() == RunState::Completed {
        println!("{}", run.output.as_deref().unwrap_or_default());
        return Ok(());
    }
    let why = run
        .error
        .as_ref()
        .map(|e| format!("{}: {}", e.code, e.message))
        .unwrap_or_default();
    bail!("run {} ended {}: {why}", run.run_id, run.state)
}

/// Waits for a relay chain to end and prints its last answer (or why it
/// broke, step by step).
async fn follow_chain(c: &Client, chain_id: &str) -> Result<()> {
    loop {
        let chain = c.get(&format!("/v1/chains/{chain_id}")).await?;
        if chain["state"] == "RUNNING" {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let steps = chain["steps"].as_array().cloned().unwrap_or_default();
        if chain["state"] == "COMPLETED" {
            let last = steps
                .last()
                .and_then(|s| s["run_id"].as_str())
                .unwrap_or_default();
            return print_answer(&c.run(last).await?);
        }
        for s in &steps {
            eprintln!(
                "  {} {}",
                s["agent"].as_str().unwrap_or("?"),
                s["state"].as_str().unwrap_or("?")
            );
        }
        bail!("chain {chain_id} ended {}", chain["state"]);
    }
}

async fn chat(agent: &str, session: Option<String>) -> Result<()> {
    let c = Client::from_env(root().as_deref())?;
    let sid = match session {
        Some(s) => s,
        None => c.create_session(agent).await?,
    };
    eprintln!("session {sid} with {agent}; one message per line, Ctrl-D to end");
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let run_id = c.send_message(&sid, &line).await?;
        let run = c.wait_run(&run_id, Duration::from_secs(600)).await?;
        print_answer(&run)?;
    }
    Ok(())
}
