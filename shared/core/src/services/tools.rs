//! Inline skills: run inside the harness, no sandbox. `current_time` and
//! `http_request` to hosts on the agent's allow-list, through the egress
//! guard (so an allow-listed name that resolves to a private address, or
//! the platform's own endpoints, are still refused), with the headers the
//! agent fixes for its host: tenants' secrets opened here, as the request
//! goes, and scrubbed from what it answers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use armada_domain::agent::AgentDefinition;
use armada_domain::chat::ToolCall;
use armada_domain::skills::{SkillManifest, CURRENT_TIME, HTTP_REQUEST, MCP};
use armada_domain::step::ProgressNote;

use armada_domain::egress::HostPort;

use crate::clock::rfc3339;
use crate::ports::secrets::OpenSecret;
use crate::ports::Blobs;
use crate::services::egress::{url_target, Egress, EgressError};
use crate::services::mcp_sessions::McpSessions;
use crate::services::secrets::open_headers;
use armada_domain::ledger::effect_key;
use armada_domain::mcp::{artifact_key, Artifact};

/// A skill's failure, returned to the model as its result.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolFailure {
    pub code: &'static str,
    pub message: String,
}

impl ToolFailure {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        ToolFailure {
            code,
            message: message.into(),
        }
    }
    pub fn to_json(&self) -> Value {
        json!({"error": {"code": self.code, "message": self.message}})
    }
}

const MAX_BODY: usize = 16 * 1024;

#[derive(Debug, Clone)]
pub struct InlineTools {
    egress: Egress,
    /// MCP sessions kept between calls.
    mcp: Arc<McpSessions>,
    /// Where what a call answers that is not text is kept (the Run's
    /// artifacts).
    artifacts: Arc<dyn Blobs>,
}

impl InlineTools {
    /// Inline skills whose outbound requests go through `egress`.
    pub fn new(egress: Egress, artifacts: Arc<dyn Blobs>) -> Self {
        InlineTools {
            mcp: Arc::new(McpSessions::new(egress.clone())),
            egress,
            artifacts,
        }
    }

    /// The guard its requests go through (shared with callbacks).
    pub fn egress(&self) -> &Egress {
        &self.egress
    }

    /// Runs `call` of Run `run_id`. Its effect key names the call for
    /// good ([`effect_key`]): a request it makes carries it as
    /// `Idempotency-Key`, so a receiver that deduplicates sees one effect
    /// whatever happens to the step. `secrets` are the Run's tenant's;
    /// what the tool says of its progress goes to `progress`.
    pub async fn execute(
        &self,
        agent: &AgentDefinition,
        call: &ToolCall,
        run_id: &str,
        now_ms: i64,
        secrets: &dyn OpenSecret,
        progress: &mut Vec<ProgressNote>,
    ) -> Result<Value, ToolFailure> {
        let Some(manifest) = agent.manifest(&call.name) else {
            return Err(ToolFailure::new(
                "DENIED",
                format!("agent '{}' has no skill '{}'", agent.name, call.name),
            ));
        };
        match manifest.executor() {
            CURRENT_TIME => Ok(json!({"now": rfc3339(now_ms)})),
            HTTP_REQUEST => {
                let key = effect_key(run_id, &call.id);
                self.http_request(agent, &call.args, &key, secrets).await
            }
            MCP => {
                self.mcp_call(agent, &manifest, call, run_id, secrets, progress)
                    .await
            }
            other => Err(ToolFailure::new(
                "UNKNOWN_SKILL",
                format!("skill '{other}' is not an inline skill"),
            )),
        }
    }

    /// A tool of one of the agent's MCP servers, as frozen in `manifest`;
    /// what it answers that is not text is kept as the Run's artifacts.
    async fn mcp_call(
        &self,
        agent: &AgentDefinition,
        manifest: &SkillManifest,
        call: &ToolCall,
        run_id: &str,
        secrets: &dyn OpenSecret,
        progress: &mut Vec<ProgressNote>,
    ) -> Result<Value, ToolFailure> {
        let binding = manifest.mcp.as_ref();
        let server = binding.and_then(|b| agent.mcp_servers.iter().find(|s| s.name == b.server));
        let (Some(binding), Some(server)) = (binding, server) else {
            return Err(ToolFailure::new(
                "UNKNOWN_SKILL",
                format!("'{}' names no MCP server of the agent", manifest.name),
            ));
        };
        let wire = self
            .mcp
            .call_tool(server, &binding.tool, &call.args, secrets, progress)
            .await
            .map_err(|e| ToolFailure::new(e.code(), e.to_string()))?;
        let (mut result, artifacts) = armada_domain::mcp::tool_result(&wire, &call.id)
            .map_err(|text| ToolFailure::new("TOOL_ERROR", text))?;
        for a in artifacts {
            if let Err(why) = self.keep(run_id, &a).await {
                tracing::warn!(run_id, artifact = %a.id, %why, "an artifact was not kept");
                // The result says so, where it names the artifact.
                for entry in result["content"].as_array_mut().into_iter().flatten() {
                    if entry["artifact"] == a.id.as_str() {
                        entry["artifact"] = Value::Null;
                        entry["omitted"] = "not kept".into();
                    }
                }
            }
        }
        Ok(result)
    }

    /// Stores an artifact's bytes under its Run.
    async fn keep(&self, run_id: &str, a: &Artifact) -> Result<(), String> {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(a.data.as_bytes())
            .map_err(|_| "its data is not base64".to_string())?;
        self.artifacts
            .put_bytes(&artifact_key(run_id, &a.id), &bytes, &a.mime_type)
            .await
            .map_err(|e| e.to_string())
    }

    async fn http_request(
        &self,
        agent: &AgentDefinition,
        args: &Value,
        effect_key: &str,
        secrets: &dyn OpenSecret,
    ) -> Result<Value, ToolFailure> {
        let url = args
            .get("url")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolFailure::new("INVALID_ARGS", "url is required"))?;
        let url = reqwest::Url::parse(url)
            .map_err(|e| ToolFailure::new("INVALID_ARGS", format!("url: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ToolFailure::new(
                "INVALID_ARGS",
                "url must be http or https",
            ));
        }
        let (host, port, default) =
            url_target(&url).ok_or_else(|| ToolFailure::new("INVALID_ARGS", "url has no host"))?;
        let target = format!("{host}:{port}");
        // Entries are `host[:port]`; a port left out is the scheme's.
        let allowed = agent
            .http_allow_hosts
            .iter()
            .filter_map(|e| HostPort::parse(e, false))
            .any(|e| e.allows(&host, port, default));
        if !allowed {
            return Err(ToolFailure::new(
                "EGRESS_DENIED",
                format!("{target} is not on the agent's allow-list"),
            ));
        }
        let method = args.get("method").and_then(Value::as_str).unwrap_or("GET");
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|_| ToolFailure::new("INVALID_ARGS", "method is not valid"))?;
        let refused = |e: EgressError| {
            let why = match e {
                EgressError::Refused => "is not reachable from skills",
                EgressError::InvalidUrl => "is not a valid target",
                EgressError::ConnectFailed => "did not answer",
            };
            ToolFailure::new(e.code(), format!("{target} {why}"))
        };
        let mut req = self
            .egress
            .request(method, url.as_str())
            .map_err(refused)?
            .timeout(Duration::from_secs(30))
            .header("idempotency-key", effect_key);
        if let Some(body) = args.get("body").and_then(Value::as_str) {
            req = req.body(body.to_string());
        }
        let rule = agent.http_headers.iter().find(|r| {
            HostPort::parse(&r.host, false).is_some_and(|e| e.allows(&host, port, default))
        });
        let none = BTreeMap::new();
        let (headers, scrubber) = open_headers(rule.map_or(&none, |r| &r.headers), secrets)
            .await
            .map_err(|e| ToolFailure::new(e.code(), e.to_string()))?;
        for (name, text) in headers {
            req = req.header(name, text);
        }
        let resp = Egress::send(req).await.map_err(refused)?;
        let status = resp.status().as_u16();
        let (bytes, truncated) = read_capped(resp, MAX_BODY)
            .await
            .map_err(|_| refused(EgressError::ConnectFailed))?;
        let text = String::from_utf8_lossy(&bytes);
        let mut cut = text.len().min(MAX_BODY);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut result = json!({"status": status, "body": &text[..cut], "truncated": truncated});
        // A remote that echoes a header back does not put it on record.
        scrubber.scrub(&mut result);
        Ok(result)
    }
}

/// The first `cap` bytes of a response's body, and whether there was
/// more: the rest is never read (a remote answering gigabytes, or never
/// ending, costs a harness no more than `cap`).
async fn read_capped(
    mut resp: reqwest::Response,
    cap: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        body.extend_from_slice(&chunk);
        if body.len() > cap {
            body.truncate(cap);
            return Ok((body, true));
        }
    }
    Ok((body, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::memory::{test_config, Memory};
    use crate::services::egress::EgressPolicy;
    use armada_domain::secret::SecretValue;

    /// A tenant's secrets, by name.
    #[derive(Debug, Default)]
    struct Secrets(std::collections::HashMap<String, String>);

    #[async_trait::async_trait]
    impl OpenSecret for Secrets {
        fn tenant(&self) -> &str {
            "acme"
        }

        async fn open(&self, name: &str) -> Result<Option<SecretValue>, crate::error::StoreError> {
            Ok(self.0.get(name).cloned().map(SecretValue::new))
        }
    }

    /// A server that answers each request with the request's head, as
    /// an endpoint that echoes what it was sent would.
    async fn echoing() -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        head.len()
                    );
                    let _ = s.write_all(answer.as_bytes()).await;
                    let _ = s.write_all(&head).await;
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn a_hosts_headers_carry_the_tenants_secret_which_its_answer_does_not() {
        let port = echoing().await;
        let host = format!("127.0.0.1:{port}");
        let tools = InlineTools::new(
            Egress::new(EgressPolicy::new(std::slice::from_ref(&host), &[]).unwrap()),
            Memory::new(test_config()),
        );
        let agent = AgentDefinition::from_json(
            "crm",
            &json!({
                "model": {"provider": "scripted", "model_id": "m", "context_window": 4096},
                "system_prompt": "You file tickets.",
                "skills": ["http_request"],
                "http_allow_hosts": [host],
                "http_headers": [{"host": host, "headers": {
                    "Authorization": {"secret": "crm-token"},
                    "X-Team": "blue",
                }}],
            }),
        )
        .unwrap();
        let call = ToolCall {
            id: "c1".into(),
            name: "http_request".into(),
            args: json!({"url": format!("http://{host}/tickets"), "method": "POST", "body": "x"}),
        };
        let secrets =
            Secrets([("crm-token".to_string(), "Bearer tok-4242-xyz".to_string())].into());
        let got = tools
            .execute(&agent, &call, "run_1", 0, &secrets, &mut vec![])
            .await
            .unwrap();
        let body = got["body"].as_str().unwrap().to_ascii_lowercase();
        // The request carried both headers; the answer names the secret.
        assert!(body.contains("authorization: [secret:crm-token]"), "{body}");
        assert!(body.contains("x-team: blue"), "{body}");
        assert!(!got.to_string().contains("tok-4242"), "{got}");
        // A tenant without the secret: the call fails naming only it.
        let failed = tools
            .execute(
                &agent,
                &call,
                "run_1:c1",
                0,
                &Secrets::default(),
                &mut vec![],
            )
            .await
            .unwrap_err();
        assert_eq!(failed.code, "SECRET_NOT_FOUND");
        assert!(failed.message.contains("'crm-token'"));
    }

    /// A server whose body never ends.
    async fn endless() -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 2048];
                    let _ = s.read(&mut buf).await;
                    let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n";
                    if s.write_all(head).await.is_err() {
                        return;
                    }
                    let block = vec![b'a'; 64 * 1024];
                    while s.write_all(&block).await.is_ok() {}
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn a_body_is_read_only_as_far_as_the_cap() {
        let port = endless().await;
        let allow = vec![format!("127.0.0.1:{port}")];
        let tools = InlineTools::new(
            Egress::new(EgressPolicy::new(&allow, &[]).unwrap()),
            Memory::new(test_config()),
        );
        let agent = AgentDefinition::from_json(
            "fetcher",
            &json!({
                "model": {"provider": "scripted", "model_id": "m", "context_window": 4096},
                "system_prompt": "You fetch.",
                "skills": ["http_request"],
                "http_allow_hosts": [format!("127.0.0.1:{port}")],
            }),
        )
        .unwrap();
        let call = ToolCall {
            id: "c1".into(),
            name: "http_request".into(),
            args: json!({"url": format!("http://127.0.0.1:{port}/")}),
        };
        // Read whole, a body that never ends would never be answered.
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            tools.execute(
                &agent,
                &call,
                "run_1:c1",
                0,
                &Secrets::default(),
                &mut vec![],
            ),
        )
        .await
        .expect("answered without reading the whole body")
        .unwrap();
        assert_eq!(got["status"], 200);
        assert_eq!(got["truncated"], true);
        assert_eq!(got["body"].as_str().unwrap().len(), MAX_BODY);
    }
}
