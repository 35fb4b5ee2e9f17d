//! `armada skills …`: what an operator does with skills beyond their
//! manifests: uploads a program's files, and lists the tools of an MCP
//! server over stdio (run here, on the operator's machine) in the form a
//! manifest's `program.tools` takes them.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
use rmcp::ServiceExt;
use serde_json::Value;

use crate::client::Client;

#[derive(Subcommand)]
pub enum SkillsCmd {
    /// Run an MCP server over stdio and print its tools as a manifest's
    /// `program.tools` takes them: `armada skills list-tools -- node server.js .`
    ListTools {
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
    /// Upload the files of a skill's program: a tar, or a gzip of one.
    PutFiles { name: String, archive: String },
}

/// How long the server has to start and list its tools.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// Carries out `cmd`; what to print.
pub async fn run(cmd: SkillsCmd, api: impl FnOnce() -> Result<Client>) -> Result<Value> {
    match cmd {
        SkillsCmd::ListTools { command } => list_stdio_tools(&command).await,
        SkillsCmd::PutFiles { name, archive } => {
            let bytes = std::fs::read(&archive).with_context(|| format!("reading {archive}"))?;
            api()?
                .put_bytes(
                    &format!("/v1/skills/{name}/files"),
                    bytes,
                    "application/octet-stream",
                )
                .await
        }
    }
}

/// Starts `command` with its stdin and stdout as an MCP session, lists
/// every tool (all pages), and ends it: the tools as the wire has them.
pub async fn list_stdio_tools(command: &[String]) -> Result<Value> {
    let Some((program, args)) = command.split_first() else {
        bail!("name the server's command");
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        bail!("the server's pipes were not made");
    };
    let client = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("armada", env!("CARGO_PKG_VERSION")),
    );
    let listed = tokio::time::timeout(LIST_TIMEOUT, async {
        let session = client.serve((stdout, stdin)).await?;
        let tools = session.list_all_tools().await?;
        let _ = session.cancel().await;
        anyhow::Ok(tools)
    })
    .await
    .context("the server did not list its tools in time")??;
    let _ = child.kill().await;
    Ok(serde_json::to_value(listed)?)
}
