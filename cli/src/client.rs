//! A thin client of the HTTP API, used by the CLI commands, the demo and the
//! benchmark. It reads `ARMADA_API_URL` / `ARMADA_API_KEY` /
//! `ARMADA_ADMIN_KEY` from the environment or from `.armada/local.env`.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use armada_api::error::ErrorBody;
use armada_api::runs::{EventsPage, RunAccepted, RunView};
use armada_api::sessions::SessionCreated;

#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    pub base: String,
    pub key: String,
    pub admin_key: Option<String>,
}

/// An error answer of the API.
#[derive(Debug, Clone, thiserror::Error)]
#[error("HTTP {status}: {code}: {message}")]
pub struct ApiFailure {
    pub status: u16,
    pub code: String,
    pub message: String,
}

pub fn read_env_file(path: &Path) -> HashMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

impl Client {
    pub fn new(base: &str, key: &str, admin_key: Option<String>) -> Self {
        Client {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap_or_default(),
            base: base.trim_end_matches('/').to_string(),
            key: key.to_string(),
            admin_key,
        }
    }

    /// From the environment, else from `<root>/.armada/local.env`.
    pub fn from_env(root: Option<&Path>) -> Result<Self> {
        let file = root
            .map(|r| read_env_file(&r.join(".armada/local.env")))
            .unwrap_or_default();
        let get = |k: &str| std::env::var(k).ok().or_else(|| file.get(k).cloned());
        let base = get("ARMADA_API_URL").ok_or_else(|| {
            anyhow!(
                "ARMADA_API_URL is not set and .armada/local.env is missing: run `armada up` first"
            )
        })?;
        let key = get("ARMADA_API_KEY").unwrap_or_default();
        Ok(Client::new(&base, &key, get("ARMADA_ADMIN_KEY")))
    }

    /// As [`Self::from_env`], acting with `ARMADA_APPROVER_KEY` (a key
    /// with the approver role) when there is one.
    pub fn approver_from_env(root: Option<&Path>) -> Result<Self> {
        let mut c = Self::from_env(root)?;
        let file = root
            .map(|r| read_env_file(&r.join(".armada/local.env")))
            .unwrap_or_default();
        if let Some(k) = std::env::var("ARMADA_APPROVER_KEY")
            .ok()
            .or_else(|| file.get("ARMADA_APPROVER_KEY").cloned())
            .filter(|k| !k.is_empty())
        {
            c.key = k;
        }
        Ok(c)
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        admin: bool,
    ) -> Result<Value> {
        let key = if admin {
            self.admin_key
                .clone()
                .ok_or_else(|| anyhow!("this command needs ARMADA_ADMIN_KEY"))?
        } else {
            self.key.clone()
        };
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(b) = body {
            req = req.json(b);
        }
        self.answer(req, path).await
    }

    /// Sends raw bytes (an upload) with the admin key.
    pub async fn put_bytes(&self, path: &str, body: Vec<u8>, content_type: &str) -> Result<Value> {
        let key = self
            .admin_key
            .clone()
            .ok_or_else(|| anyhow!("this command needs ARMADA_ADMIN_KEY"))?;
        let req = self
            .http
            .put(format!("{}{path}", self.base))
            .bearer_auth(key)
            .header("content-type", content_type)
            .body(body);
        self.answer(req, path).await
    }

    /// The answer to `req`: its JSON, or its `ErrorBody` as an error.
    async fn answer(&self, req: reqwest::RequestBuilder, path: &str) -> Result<Value> {
        let resp = req
            .send()
            .await
            .with_context(|| format!("calling {}{path}", self.base))?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        let v: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(json!({"raw": text}))
        };
        if status >= 400 {
            // Every error the API answers is an `ErrorBody`; anything else
            // (a proxy's page) is shown as it came.
            let (code, message) = match serde_json::from_value::<ErrorBody>(v.clone()) {
                Ok(b) => (b.error.code, b.error.message),
                Err(_) => ("HTTP_ERROR".to_string(), text),
            };
            return Err(ApiFailure {
                status,
                code,
                message,
            }
            .into());
        }
        Ok(v)
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        self.call(reqwest::Method::GET, path, None, false).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.call(reqwest::Method::POST, path, Some(body), false)
            .await
    }

    /// A call whose answer is read as `T`, the API's view of it.
    pub async fn typed<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T> {
        let v = self.call(method, path, body, false).await?;
        serde_json::from_value(v.clone())
            .with_context(|| format!("{path} answered what the API does not describe: {v}"))
    }

    /// Starts a Run of `agent`; its id.
    pub async fn create_run(&self, agent: &str, input: &str) -> Result<String> {
        let body = json!({"agent": agent, "input": input});
        let accepted: RunAccepted = self
            .typed(reqwest::Method::POST, "/v1/runs", Some(&body))
            .await?;
        Ok(accepted.run_id)
    }

    /// Opens a session with `agent`; its id.
    pub async fn create_session(&self, agent: &str) -> Result<String> {
        let body = json!({"agent": agent});
        let created: SessionCreated = self
            .typed(reqwest::Method::POST, "/v1/sessions", Some(&body))
            .await?;
        Ok(created.session_id)
    }

    /// Posts a session's next message; the id of the Run answering it.
    pub async fn send_message(&self, session_id: &str, input: &str) -> Result<String> {
        let path = format!("/v1/sessions/{session_id}/messages");
        let accepted: RunAccepted = self
            .typed(reqwest::Method::POST, &path, Some(&json!({"input": input})))
            .await?;
        Ok(accepted.run_id)
    }

    /// A Run, as the API shows it.
    pub async fn run(&self, run_id: &str) -> Result<RunView> {
        self.typed(reqwest::Method::GET, &format!("/v1/runs/{run_id}"), None)
            .await
    }

    /// A page of a Run's events after `after`, waiting up to `wait_s` for
    /// one. When the tenant's long-polls are all waiting (`429
    /// TOO_MANY_LONG_POLLS`), a look without waiting, which needs no
    /// slot, a second later instead.
    pub async fn events(&self, run_id: &str, after: u64, wait_s: u64) -> Result<EventsPage> {
        let path = format!("/v1/runs/{run_id}/events?after={after}");
        let get = reqwest::Method::GET;
        match self
            .typed(get.clone(), &format!("{path}&wait={wait_s}"), None)
            .await
        {
            Err(e)
                if e.downcast_ref::<ApiFailure>()
                    .is_some_and(|f| f.code == "TOO_MANY_LONG_POLLS") =>
            {
                tokio::time::sleep(Duration::from_secs(1)).await;
                self.typed(get, &path, None).await
            }
            other => other,
        }
    }

    /// Follows a Run's events until it reaches a terminal state; returns the Run.
    pub async fn wait_run(&self, run_id: &str, timeout: Duration) -> Result<RunView> {
        let start = Instant::now();
        let mut after = 0u64;
        loop {
            let left = timeout.saturating_sub(start.elapsed()).as_secs().min(10);
            let page = self.events(run_id, after, left).await?;
            after = page.next;
            if page.events.iter().any(|e| e.kind().is_terminal()) {
                return self.run(run_id).await;
            }
            if start.elapsed() >= timeout {
                bail!("run {run_id} did not finish within {timeout:?}");
            }
        }
    }
}

pub fn run_id(v: &Value) -> Result<String> {
    v.get("run_id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| anyhow!("no run_id in {v}"))
}
