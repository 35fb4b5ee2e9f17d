//! Skills whose program is an MCP server (`protocol: mcp`): the server is
//! started by the jail as any call is (the profile, the sandbox's uid,
//! its limits), speaks MCP over its stdin and stdout with the agent as
//! its client (the official SDK), and is kept across calls: one server
//! per skill, started again when it has died or when what it was started
//! with (command, environment) changed. Each call is one `tools/call`.

use std::collections::BTreeMap;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{RoleClient, RunningService};
use rmcp::ServiceExt;
use serde_json::{json, Value};

use armada_domain::crypto::sha256_hex;
use armada_domain::mcp::tool_result;
use armada_domain::program::ProgramCall;
use armada_domain::sandbox::hand::{codes, error_json};
use armada_domain::secret::{Scrubber, SecretValue};
use armada_domain::skill_files::stage_mark;

use crate::agent::Agent;
use crate::call::Call;
use crate::jail::Action;
use crate::runner::Detached;
use crate::skills::{Opened, SkillAnswer};

/// How long a server has to answer `initialize`.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The error of a server that could not be started or that ended.
const MCP_SERVER_FAILED: &str = "MCP_SERVER_FAILED";

/// The client's side of a server's session: who it is.
#[derive(Debug, Clone, Default)]
struct Client;

impl rmcp::ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("armada-sandbox", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// A skill's server as the agent keeps it.
pub(super) struct McpChild {
    session: RunningService<RoleClient, Client>,
    process: Detached,
    /// What it was started with: another command or environment starts
    /// another server.
    started_with: String,
}

impl std::fmt::Debug for McpChild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpChild")
            .field("pid", &self.process.pid)
            .finish_non_exhaustive()
    }
}

impl McpChild {
    /// Its session open and its process there. (Its pipe is no sign: a
    /// helper the jail started before it exec'd the server may hold it.)
    fn alive(&self) -> bool {
        !self.session.is_transport_closed() && process_alive(self.process.pid)
    }

    /// Ends the server and everything it started.
    fn stop(self) {
        let McpChild {
            session, process, ..
        } = self;
        drop(session);
        kill(process);
    }
}

fn process_alive(pid: u32) -> bool {
    pid != 0 && crate::sys::kill(pid as i32, 0)
}

/// Returns once the server's process has ended.
async fn ended(pid: u32) {
    while process_alive(pid) {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Kills a server's processes: its cgroup, or its session.
fn kill(process: Detached) {
    match process.cgroup {
        Some(cg) => {
            let _ = cg.destroy();
        }
        None => {
            crate::sys::killpg(process.pid as i32, libc::SIGKILL);
        }
    }
}

/// The servers of an agent, by skill.
pub(super) type McpChildren = BTreeMap<String, McpChild>;

/// What a server was started with, as a digest (its environment holds
/// secrets: never kept in the clear): its command, its environment, and
/// the version of its files and installs (staged anew, the running server
/// would go on with what was deleted beneath it).
fn fingerprint(p: &ProgramCall, opened: &Opened) -> String {
    let env: Vec<_> = opened.env.iter().map(|v| (&v.name, &v.value)).collect();
    let staged = stage_mark(p.files.as_ref().map(|f| f.sha256.as_str()), &p.install);
    let text = serde_json::to_string(&(&opened.command, env, staged)).unwrap_or_default();
    sha256_hex(text.as_bytes())
}

impl Agent {
    /// Calls the tool `p` names on its skill's server (started first if
    /// it is not running), within `timeout`.
    pub(super) async fn mcp_call(
        &mut self,
        p: &ProgramCall,
        opened: &Opened,
        args: &Value,
        call_id: &str,
        timeout: Duration,
    ) -> SkillAnswer {
        let Some(tool) = p.tool.clone() else {
            return SkillAnswer::refused(error_json(
                codes::INVALID_ARGS,
                format!(
                    "skill '{}' is an MCP server: call one of its tools",
                    p.skill
                ),
            ));
        };
        let (session, pid) = match self.mcp_server(p, opened).await {
            Ok(s) => s,
            Err(why) => return SkillAnswer::refused(error_json(MCP_SERVER_FAILED, why)),
        };
        let mut params = CallToolRequestParams::new(tool);
        if let Some(a) = args.as_object() {
            params = params.with_arguments(a.clone());
        }
        let answered = tokio::select! {
            answered = tokio::time::timeout(timeout, session.call_tool(params)) => answered,
            () = ended(pid) => Ok(Err(rmcp::ServiceError::TransportClosed)),
        };
        let scrubber = Scrubber::new(
            opened
                .env
                .iter()
                .filter_map(|v| Some((v.secret.clone()?, SecretValue::new(v.value.clone())))),
        );
        let mut result = match answered {
            Err(_) => {
                // Whatever it was doing goes with it.
                self.stop_mcp(&p.skill);
                error_json(
                    codes::TIMEOUT,
                    format!("the server did not answer within {} s", timeout.as_secs()),
                )
            }
            Ok(Err(rmcp::ServiceError::McpError(e))) => error_json(
                "MCP_ERROR",
                format!("the server refused the call: {}", e.message),
            ),
            Ok(Err(e)) => {
                tracing::warn!(skill = %p.skill, error = %e, "an MCP server failed during a call");
                self.stop_mcp(&p.skill);
                error_json(MCP_SERVER_FAILED, "the server ended during the call")
            }
            Ok(Ok(r)) => {
                let wire = serde_json::to_value(&r).unwrap_or_default();
                match tool_result(&wire, call_id) {
                    Ok((v, artifacts)) => without_artifacts(v, artifacts.len()),
                    // The tool's own error result.
                    Err(text) => error_json("TOOL_ERROR", text),
                }
            }
        };
        scrubber.scrub(&mut result);
        SkillAnswer::refused(result)
    }

    /// The running server of `p`'s skill (started if it is not), and the
    /// pid of its process.
    async fn mcp_server(
        &mut self,
        p: &ProgramCall,
        opened: &Opened,
    ) -> Result<(&RunningService<RoleClient, Client>, u32), String> {
        let wanted = fingerprint(p, opened);
        let keep = self
            .mcp
            .get(&p.skill)
            .is_some_and(|c| c.alive() && c.started_with == wanted);
        if !keep {
            if self.mcp.contains_key(&p.skill) {
                tracing::info!(skill = %p.skill, "an MCP server ended or changed; starting it again");
            }
            self.stop_mcp(&p.skill);
            let child = self.start_mcp(p, opened, wanted).await?;
            self.mcp.insert(p.skill.clone(), child);
        }
        self.mcp
            .get(&p.skill)
            .map(|c| (&c.session, c.process.pid))
            .ok_or_else(|| "the server is gone".to_string())
    }

    async fn start_mcp(
        &self,
        p: &ProgramCall,
        opened: &Opened,
        started_with: String,
    ) -> Result<McpChild, String> {
        let name = format!("mcp-{}", p.skill);
        let call = Call {
            action: Action::Exec {
                argv: opened.command.clone(),
            },
            run_id: name.clone(),
            stdin: None,
            timeout: Duration::from_secs(u64::from(u32::MAX)),
            bind_ports: vec![],
            env: opened
                .env
                .iter()
                .map(|v| (v.name.clone(), v.value.clone()))
                .collect(),
            effects: None,
        };
        // A report of an earlier start is not this one's.
        let _ = std::fs::remove_file(self.runner.env.calls_dir().join(format!("{name}.json")));
        let (process, stdin, stdout) = self
            .runner
            .spawn_piped(call, &name)
            .await
            .map_err(|e| format!("the server could not be started: {e}"))?;
        if let Some(why) = self.runner.detached_report(&name).refused {
            return Err(format!(
                "the sandbox refused to start the server without its controls: {why}"
            ));
        }
        let started = tokio::time::timeout(START_TIMEOUT, Client.serve((stdout, stdin))).await;
        let session = match started {
            Ok(Ok(s)) => s,
            failed => {
                let log = std::fs::read_to_string(&process.log).unwrap_or_default();
                let start = log.char_indices().rev().nth(999).map_or(0, |(i, _)| i);
                let why = match failed {
                    Err(_) => format!(
                        "it did not answer initialize within {} s",
                        START_TIMEOUT.as_secs()
                    ),
                    _ => "it ended before its session began".to_string(),
                };
                kill(process);
                return Err(format!(
                    "the server could not be started: {why}: {}",
                    log[start..].trim()
                ));
            }
        };
        tracing::info!(skill = %p.skill, pid = process.pid, "MCP server started");
        Ok(McpChild {
            session,
            process,
            started_with,
        })
    }

    /// Stops the server of `skill`, if one runs.
    pub(super) fn stop_mcp(&mut self, skill: &str) {
        if let Some(child) = self.mcp.remove(skill) {
            child.stop();
        }
    }

    /// Stops every server (the agent is ending).
    pub(super) fn stop_all_mcp(&mut self) {
        for (_, child) in std::mem::take(&mut self.mcp) {
            child.stop();
        }
    }
}

/// A result without the binary content a sandbox's server returned: the
/// Run's artifacts are the control plane's to store, not a sandbox's.
fn without_artifacts(mut v: Value, dropped: usize) -> Value {
    if dropped == 0 {
        return v;
    }
    if let Some(items) = v.get_mut("content").and_then(Value::as_array_mut) {
        for item in items.iter_mut() {
            if let Some(o) = item.as_object_mut() {
                if o.remove("artifact").is_some() {
                    o.insert(
                        "omitted".into(),
                        json!("binary content from a sandbox's server is not kept"),
                    );
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use armada_domain::program::{EnvVar, ProgramProtocol, StagedFiles};

    fn call(sha: &str) -> ProgramCall {
        ProgramCall {
            command: vec!["node".into(), "server.js".into()],
            protocol: ProgramProtocol::Mcp,
            env: None,
            refused: None,
            skill: "fs".into(),
            files: Some(StagedFiles {
                key: format!("k/{sha}.tar"),
                sha256: sha.into(),
            }),
            install: vec!["npm ci".into()],
            tool: Some("read".into()),
        }
    }

    #[test]
    fn a_server_is_started_again_for_new_files_or_a_new_environment() {
        let opened = |token: &str| Opened {
            command: vec!["node".into(), "server.js".into()],
            env: vec![EnvVar {
                name: "TOKEN".into(),
                value: token.into(),
                secret: Some("t".into()),
            }],
        };
        let base = fingerprint(&call("aaa"), &opened("one"));
        assert_eq!(base, fingerprint(&call("aaa"), &opened("one")));
        assert_ne!(base, fingerprint(&call("bbb"), &opened("one")));
        assert_ne!(base, fingerprint(&call("aaa"), &opened("two")));
        // The digest keeps no secret in the clear.
        assert!(!base.contains("one"));
        // Another tool of the same server is the same server.
        let mut other = call("aaa");
        other.tool = Some("write".into());
        assert_eq!(base, fingerprint(&other, &opened("one")));
    }
}
