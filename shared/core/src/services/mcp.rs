//! Remote MCP servers, as their client: Streamable HTTP through the
//! official SDK (`rmcp`), every connection through the egress guard's
//! clients (so a server's name that resolves to a private address is
//! refused unless the operator listed it), with the headers the agent's
//! definition fixes (the tenant's secrets opened as the connection is
//! made, and scrubbed from what the server answers).
//!
//! A listing has a session of its own; calls share sessions a process
//! keeps ([`crate::services::mcp_sessions`]). A session the server ended
//! is begun again by the SDK (a `404` on a known session id), as the
//! specification says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientCapabilities, ClientConfig, ClientRequest,
    Implementation, ProgressNotificationParam, ProgressToken, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RoleClient, RunningService};
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

/// Why a server gave no listing or no answer to a call. A transport's
/// failure is logged, not handed back; a protocol error the server sent
/// is named (its message scrubbed of opened secrets), as is a tool's own
/// error result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    #[error(transparent)]
    Headers(#[from] HeaderError),
    /// `EGRESS_REFUSED` / `INVALID_URL`.
    #[error("server '{0}' is not a target agents may reach")]
    Refused(String, EgressError),
    /// `MCP_UNREACHABLE`: no connection, or no MCP session (an HTTP
    /// server that does not speak MCP).
    #[error("server '{0}' could not be reached as an MCP server")]
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
    let (headers, _) = open_headers(&server.headers, secrets).await?;
    let (session, _) = connect(egress, server, headers).await?;
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

/// Calls `tool` with `args` (an object) on `session` and returns what it
/// answered, in the MCP wire form, `scrubber`'s secrets scrubbed; the
/// progress the server reported for this request goes to `progress`.
pub(crate) async fn call_on(
    session: &Session,
    notes: &Notes,
    server: &McpServer,
    (tool, args): (&str, &Value),
    scrubber: &Scrubber,
    progress: &mut Vec<ProgressNote>,
) -> Result<Value, McpError> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Some(a) = args.as_object() {
        params = params.with_arguments(a.clone());
    }
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let handle = session
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .map_err(|e| failed(server, &e))?;
    let token = handle.progress_token.clone();
    let timeout = Duration::from_secs(u64::from(server.timeout_s));
    let answered = tokio::time::timeout(timeout, handle.await_response()).await;
    settle_notes(notes, &token).await;
    let noted = notes
        .lock()
        .ok()
        .and_then(|mut n| n.remove(&token))
        .unwrap_or_default();
    progress.extend(noted.into_iter().map(|mut note| {
        note.message = note.message.map(|m| scrubber.scrub_str(&m).into_owned());
        note
    }));
    let answer = answered
        .map_err(|_| McpError::TimedOut(server.name.clone()))?
        .map_err(|e| match failed(server, &e) {
            McpError::Protocol { server, message } => McpError::Protocol {
                server,
                message: scrubber.scrub_str(&message).into_owned(),
            },
            other => other,
        })?;
    let ServerResult::CallToolResult(result) = answer else {
        return Err(McpError::Protocol {
            server: server.name.clone(),
            message: "the answer to tools/call was not a tool's result".into(),
        });
    };
    let mut wire = serde_json::to_value(&result).unwrap_or_default();
    scrubber.scrub(&mut wire);
    Ok(wire)
}

/// Lets in the progress notes of `token` still on their way: the SDK
/// hands each notification to a task of its own, which may run after the
/// answer that followed it on the wire. Only for a request that reported
/// progress at all, until none came for two rounds (tens of ms at most).
async fn settle_notes(notes: &Notes, token: &ProgressToken) {
    let count = || {
        notes
            .lock()
            .ok()
            .and_then(|n| n.get(token).map(Vec::len))
            .unwrap_or(0)
    };
    let mut seen = count();
    if seen == 0 {
        return;
    }
    let mut still = 0;
    for _ in 0..10 {
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let now = count();
        still = if now == seen { still + 1 } else { 0 };
        if still == 2 {
            return;
        }
        seen = now;
    }
}

/// A session as the client holds it.
pub(crate) type Session = RunningService<RoleClient, Listener>;

/// The progress a session's server reported, by the request it was for.
pub(crate) type Notes = Arc<Mutex<HashMap<ProgressToken, Vec<ProgressNote>>>>;

/// How many requests' progress a session holds at once (a server that
/// reports for requests no call waits for costs a bounded map).
const MAX_NOTED_REQUESTS: usize = 64;

/// The client's side of a session: who it is, and the progress the
/// server reports, kept by request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Listener {
    notes: Notes,
}

impl ClientHandler for Listener {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let Ok(mut by_request) = self.notes.lock() else {
            return;
        };
        let known = by_request.contains_key(&params.progress_token);
        if !known && by_request.len() == MAX_NOTED_REQUESTS {
            return;
        }
        let notes = by_request.entry(params.progress_token).or_default();
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

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("armada", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// A session with `server`, initialized, sending `headers` (opened) with
/// every request; and where its progress notes go.
pub(crate) async fn connect(
    egress: &Egress,
    server: &McpServer,
    headers: Vec<(String, String)>,
) -> Result<(Session, Notes), McpError> {
    let client = egress
        .client_for(&server.url)
        .map_err(|e| McpError::Refused(server.name.clone(), e))?;
    let listener = Listener::default();
    let notes = listener.notes.clone();
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
    Ok((session, notes))
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
