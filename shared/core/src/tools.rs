//! Inline skills: run inside the harness, no sandbox. `current_time` and
//! `http_request` to hosts on the agent's allow-list, through the egress
//! guard (so an allow-listed name that resolves to a private address, or
//! the platform's own endpoints, are still refused).

use std::time::Duration;

use serde_json::{json, Value};

use armada_domain::agent::AgentDefinition;
use armada_domain::chat::ToolCall;
use armada_domain::skills::{CURRENT_TIME, HTTP_REQUEST};

use armada_domain::egress::HostPort;

use crate::clock::rfc3339;
use crate::egress::{url_target, Egress, EgressError};

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
}

impl InlineTools {
    /// Inline skills whose outbound requests go through `egress`.
    pub fn new(egress: Egress) -> Self {
        InlineTools { egress }
    }

    /// The guard its requests go through (shared with callbacks).
    pub fn egress(&self) -> &Egress {
        &self.egress
    }

    pub async fn execute(
        &self,
        agent: &AgentDefinition,
        call: &ToolCall,
        now_ms: i64,
    ) -> Result<Value, ToolFailure> {
        let Some(manifest) = agent.manifest(&call.name) else {
            return Err(ToolFailure::new(
                "DENIED",
                format!("agent '{}' has no skill '{}'", agent.name, call.name),
            ));
        };
        match manifest.executor() {
            CURRENT_TIME => Ok(json!({"now": rfc3339(now_ms)})),
            HTTP_REQUEST => self.http_request(agent, &call.args).await,
            other => Err(ToolFailure::new(
                "UNKNOWN_SKILL",
                format!("skill '{other}' is not an inline skill"),
            )),
        }
    }

    async fn http_request(
        &self,
        agent: &AgentDefinition,
        args: &Value,
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
            .timeout(Duration::from_secs(30));
        if let Some(body) = args.get("body").and_then(Value::as_str) {
            req = req.body(body.to_string());
        }
        let resp = Egress::send(req).await.map_err(refused)?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|_| refused(EgressError::ConnectFailed))?;
        let truncated = text.len() > MAX_BODY;
        let mut cut = text.len().min(MAX_BODY);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        Ok(json!({"status": status, "body": &text[..cut], "truncated": truncated}))
    }
}
