//! Remote MCP servers, as their client: Streamable HTTP through the
//! official SDK (`rmcp`), every connection through the egress guard's
//! clients (so a server's name that resolves to a private address is
//! refused unless the operator listed it), with the headers the agent's
//! definition fixes (the tenant's secrets opened as the connection is
//! made, and scrubbed from what the server answers).
//!
//! A connection lasts one listing or one call. A harness is a Lambda
//! function and keeps no session between invocations; a session the
//! server ends mid-call is begun again by the SDK (a `404` on a known
//! session id), as the specification says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation,
    ProgressNotificationParam,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ClientHandler;
use rmcp::ServiceExt;
use serde_json::Value;

use armada_domain::mcp::{ListedTool, McpServer};
use armada_domain::secret::Scrubber;
use armada_domain::step::{ProgressNote, MAX_PROGRESS_NOTES};

use crate::ports::secrets::OpenSecret;
use crate::services::egress::{Egress, EgressError};
use crate::services::secrets::{open_headers, HeaderError};

/// How long a server has to answer `initialize`, and a listing.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a server gave no listing or no answer to a call. What a server
/// said is logged, not handed back: only a tool's own error result is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    #[error(transparent)]
    Headers(#[from] HeaderError),
    /// `EGRESS_REFUSED` / `INVALID_URL`.
    #[error("server '{0}' is not a target agents may reach")]
    Refused(String, EgressError),
    /// `MCP_UNREACHABLE`: no connection, or no MCP session.
    #[error("server '{0}' could not be reached")]
    Unreachable(String),
    /// `MCP_ERROR`: the server answered with a protocol error.
    #[error("server '{server}' refused the request: {message}")]
    Protocol { server: String, message: String },
    /// `TIMED_OUT`.
    #[error("server '{0}' did not answer in time")]
    TimedOut(String),
}

impl McpError {
    /// The stable code of a tool result or a registration's refusal.
    pub fn code(&self) -> &'static str {
        match self {
            McpError::Headers(h) => h.code(),
            McpError::Refused(_, e) => e.code(),
            McpError::Unreachable(_) => "MCP_UNREACHABLE",
            McpError::Protocol { .. } => "MCP_ERROR",
            McpError::TimedOut(_) => "TIMED_OUT",
        }
    }
}

/// A server's tools, every page of them.
pub async fn list_tools(
    egress: &Egress,
    server: &McpServer,
    secrets: &dyn OpenSecret,
) -> Result<Vec<ListedTool>, McpError> {
    let (session, _) = connect(egress, server, secrets, Listener::default()).await?;
    let listed = tokio::time::timeout(CONNECT_TIMEOUT, session.list_all_tools()).await;
    let _ = session.cancel().await;
    let tools = listed
        .map_err(|_| McpError::TimedOut(server.name.clone()))?
        .map_err(|e| failed(server, &e))?;
    Ok(tools
        .iter()
        .filter_map(|t| serde_json::to_value(t).ok())
        .filter_map(|v| ListedTool::from_wire(&v))
        .collect())
}

/// Calls `tool` with `args` (an object) and returns what it answered,
/// in the MCP wire form, its opened secrets scrubbed; the progress the
/// server reported meanwhile goes to `progress`.
pub async fn call_tool(
    egress: &Egress,
    server: &McpServer,
    tool: &str,
    args: &Value,
    secrets: &dyn OpenSecret,
    progress: &mut Vec<ProgressNote>,
) -> Result<Value, McpError> {
    let listener = Listener::default();
    let notes = listener.notes.clone();
    let (session, scrubber) = connect(egress, server, secrets, listener).await?;
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Some(a) = args.as_object() {
        params = params.with_arguments(a.clone());
    }
    let timeout = Duration::from_secs(u64::from(server.timeout_s));
    let answered = tokio::time::timeout(timeout, session.call_tool(params)).await;
    let _ = session.cancel().await;
    progress.extend(
        notes
            .lock()
            .map(|mut n| std::mem::take(&mut *n))
            .unwrap_or_default(),
    );
    for note in progress.iter_mut() {
        note.message = note
            .message
            .take()
            .map(|m| scrubber.scrub_str(&m).into_owned());
    }
    let result = answered
        .map_err(|_| McpError::TimedOut(server.name.clone()))?
        .map_err(|e| match failed(server, &e) {
            McpError::Protocol { server, message } => McpError::Protocol {
                server,
                message: scrubber.scrub_str(&message).into_owned(),
            },
            other => other,
        })?;
    let mut wire = serde_json::to_value(&result).unwrap_or_default();
    scrubber.scrub(&mut wire);
    Ok(wire)
}

/// The client's side of a session: who it is, and the progress the
/// server reports (one session is one call, so every note is that call's).
#[derive(Debug, Clone, Default)]
struct Listener {
    notes: Arc<Mutex<Vec<ProgressNote>>>,
}

impl ClientHandler for Listener {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Ok(mut notes) = self.notes.lock() {
            // The last are kept (they say the most).
            if notes.len() == MAX_PROGRESS_NOTES {
                notes.remove(0);
            }
            notes.push(ProgressNote {
                progress: params.progress,
                total: params.total,
                message: params.message,
            });
        }
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("armada", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// A session with `server`, initialized.
async fn connect(
    egress: &Egress,
    server: &McpServer,
    secrets: &dyn OpenSecret,
    listener: Listener,
) -> Result<(RunningService<RoleClient, Listener>, Scrubber), McpError> {
    let client = egress
        .client_for(&server.url)
        .map_err(|e| McpError::Refused(server.name.clone(), e))?;
    let (headers, scrubber) = open_headers(&server.headers, secrets).await?;
    let mut custom = HashMap::new();
    for (name, value) in headers {
        // Both were checked when the definition was written; a secret's
        // value may still be one no header can carry.
        let (Ok(name), Ok(mut value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) else {
            return Err(McpError::Protocol {
                server: server.name.clone(),
                message: format!("header {name} cannot carry its value"),
            });
        };
        value.set_sensitive(true);
        custom.insert(name, value);
    }
    let config =
        StreamableHttpClientTransportConfig::with_uri(server.url.as_str()).custom_headers(custom);
    let transport = StreamableHttpClientTransport::with_client(client, config);
    let session = tokio::time::timeout(CONNECT_TIMEOUT, listener.serve(transport))
        .await
        .map_err(|_| McpError::TimedOut(server.name.clone()))?
        .map_err(|e| {
            tracing::warn!(server = %server.name, error = %e, "MCP server: no session");
            McpError::Unreachable(server.name.clone())
        })?;
    Ok((session, scrubber))
}

/// A request's failure: a protocol error the server sent is named (its
/// code and message are the server's contract with its callers); a
/// transport failure only logged.
fn failed(server: &McpServer, e: &rmcp::ServiceError) -> McpError {
    match e {
        rmcp::ServiceError::McpError(data) => McpError::Protocol {
            server: server.name.clone(),
            message: data.message.to_string(),
        },
        rmcp::ServiceError::Timeout { .. } => McpError::TimedOut(server.name.clone()),
        other => {
            tracing::warn!(server = %server.name, error = %other, "MCP server: request failed");
            McpError::Unreachable(server.name.clone())
        }
    }
}
