//! MCP sessions a process keeps between calls (a warm harness): a Run's
//! second call to a server, and the next Run's, skip the `initialize`
//! round trips. A session is one tenant's, for one server, with the
//! headers' values as they open for the call (a secret changed or
//! deleted opens differently, and gets a session of its own); an idle or
//! closed one is let go, and one the server ended is begun again by the
//! SDK (`404` on its id), as the specification says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use armada_domain::mcp::McpServer;
use armada_domain::step::ProgressNote;

use crate::ports::secrets::OpenSecret;
use crate::services::egress::Egress;
use crate::services::mcp::{self, McpError, Notes, Session};
use crate::services::secrets::open_headers;

/// How long an unused session is kept, and how many are.
const KEEP_IDLE: Duration = Duration::from_secs(120);
const MAX_KEPT: usize = 32;

struct Kept {
    session: Arc<Session>,
    notes: Notes,
    used_at: Instant,
}

/// The sessions, by tenant, server and headers.
pub struct McpSessions {
    egress: Egress,
    kept: Mutex<HashMap<String, Kept>>,
}

impl std::fmt::Debug for McpSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.kept.lock().map_or(0, |k| k.len());
        f.debug_struct("McpSessions").field("kept", &kept).finish()
    }
}

impl McpSessions {
    /// Sessions whose connections go through `egress`.
    pub fn new(egress: Egress) -> Self {
        McpSessions {
            egress,
            kept: Mutex::default(),
        }
    }

    /// Calls `tool` of `server` with `args` for the tenant of `secrets`
    /// (see [`mcp::call_on`]), in a kept session or a new one.
    pub async fn call_tool(
        &self,
        server: &McpServer,
        tool: &str,
        args: &Value,
        secrets: &dyn OpenSecret,
        progress: &mut Vec<ProgressNote>,
    ) -> Result<Value, McpError> {
        let (headers, scrubber) = open_headers(&server.headers, secrets).await?;
        let key = session_key(secrets.tenant(), server, &headers);
        let (session, notes) = match self.kept(&key) {
            Some(kept) => kept,
            None => {
                let (session, notes) = mcp::connect(&self.egress, server, headers).await?;
                (Arc::new(session), notes)
            }
        };
        let answered =
            mcp::call_on(&session, &notes, server, (tool, args), &scrubber, progress).await;
        self.keep(key, session, notes);
        answered
    }

    /// A kept session of `key` still open and recently used.
    fn kept(&self, key: &str) -> Option<(Arc<Session>, Notes)> {
        let mut kept = self.kept.lock().ok()?;
        let now = Instant::now();
        kept.retain(|_, k| {
            now.duration_since(k.used_at) < KEEP_IDLE && !k.session.is_transport_closed()
        });
        kept.get(key).map(|k| (k.session.clone(), k.notes.clone()))
    }

    /// Keeps a session for the next call (the least recently used goes
    /// when there are too many); one whose transport closed is let go.
    fn keep(&self, key: String, session: Arc<Session>, notes: Notes) {
        if session.is_transport_closed() {
            return;
        }
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        if !kept.contains_key(&key) && kept.len() >= MAX_KEPT {
            let oldest = kept
                .iter()
                .min_by_key(|(_, k)| k.used_at)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                kept.remove(&oldest);
            }
        }
        let used_at = Instant::now();
        kept.insert(
            key,
            Kept {
                session,
                notes,
                used_at,
            },
        );
    }
}

/// The key of a session: its tenant, the server's name and URL, and the
/// headers' values, hashed (a value is held by the session, not by a key).
fn session_key(tenant: &str, server: &McpServer, headers: &[(String, String)]) -> String {
    let mut h = Sha256::new();
    for part in [tenant, &server.name, &server.url] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    for (name, value) in headers {
        for part in [name, value] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str, url: &str) -> McpServer {
        armada_domain::mcp::McpServer::parse_list(&serde_json::json!([{"name": name, "url": url}]))
            .unwrap()
            .remove(0)
    }

    #[test]
    fn a_session_is_one_tenants_for_one_server_and_its_headers_values() {
        let crm = server("crm", "https://crm.example.com/mcp");
        let token = |v: &str| vec![("Authorization".to_string(), v.to_string())];
        let k = session_key("acme", &crm, &token("Bearer a"));
        assert_eq!(k, session_key("acme", &crm, &token("Bearer a")));
        assert!(!k.contains("Bearer"));
        for other in [
            session_key("globex", &crm, &token("Bearer a")),
            session_key("acme", &crm, &token("Bearer b")),
            session_key(
                "acme",
                &server("crm", "https://crm2.example.com/mcp"),
                &token("Bearer a"),
            ),
            session_key(
                "acme",
                &server("crm2", "https://crm.example.com/mcp"),
                &token("Bearer a"),
            ),
            session_key("acme", &crm, &[]),
        ] {
            assert_ne!(k, other);
        }
    }
}
