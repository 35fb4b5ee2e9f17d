//! The counting receiver: where the workload's effects and callbacks
//! land, over real HTTP through the stack's egress guard. It counts each
//! effect by the `Idempotency-Key` its call sent, and each callback
//! attempt by the Run it names and the delivery id it carries; the checker
//! holds those counts against the ledgers and the Runs' callback records.
//! Like a receiver that has a bad moment now and then, it answers a
//! seeded share of callbacks `503`, so their retries are exercised too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use lambda_http::tower::ServiceExt;
use serde_json::Value;

use crate::rng::Rng;

/// What the receiver heard.
#[derive(Debug, Clone, Default)]
pub struct Heard {
    /// Effect key → how many requests carried it.
    pub effects: BTreeMap<String, u32>,
    /// Effect requests that carried no key.
    pub unkeyed_effects: u32,
    /// Run id → the delivery ids of the callback attempts that named it
    /// (answered `2xx` or not).
    pub callbacks: BTreeMap<String, Vec<String>>,
    /// Run id → attempts answered `2xx`.
    pub callbacks_taken: BTreeMap<String, u32>,
}

impl Heard {
    /// The distinct delivery ids a Run's callbacks came with.
    pub fn callback_ids(&self, run_id: &str) -> BTreeSet<&str> {
        self.callbacks
            .get(run_id)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect()
    }
}

struct Shared {
    heard: Mutex<Heard>,
    /// The share of callback attempts answered `503`, per hundred.
    refuse_percent: u64,
    rng: Mutex<Rng>,
}

/// A running receiver; it stops when dropped.
pub struct Receiver {
    /// `127.0.0.1:PORT`: what the egress guard and the agents allow.
    pub host: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn effect(State(s): State<Arc<Shared>>, headers: HeaderMap) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut heard = lock(&s.heard);
    match key {
        Some(k) => *heard.effects.entry(k).or_default() += 1,
        None => heard.unkeyed_effects += 1,
    }
    StatusCode::OK
}

async fn callback(State(s): State<Arc<Shared>>, headers: HeaderMap, body: String) -> StatusCode {
    let run_id = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["run_id"].as_str().map(str::to_string))
        .unwrap_or_default();
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let refuse = lock(&s.rng).between(0, 99) < s.refuse_percent;
    let mut heard = lock(&s.heard);
    heard.callbacks.entry(run_id.clone()).or_default().push(id);
    if refuse {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    *heard.callbacks_taken.entry(run_id).or_default() += 1;
    StatusCode::OK
}

impl Receiver {
    /// Listens on a loopback port of its own; `refuse_percent` of callback
    /// attempts (drawn from `rng`) are answered `503`.
    pub async fn start(rng: Rng, refuse_percent: u64) -> Result<Receiver> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("the counting receiver's port")?;
        let host = listener.local_addr()?.to_string();
        let shared = Arc::new(Shared {
            heard: Mutex::new(Heard::default()),
            refuse_percent,
            rng: Mutex::new(rng),
        });
        let app = Router::new()
            .route("/effect", post(effect))
            .route("/callback", post(callback))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let app = app.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                        app.clone().oneshot(req.map(axum::body::Body::new))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Receiver { host, shared, task })
    }

    pub fn effect_url(&self) -> String {
        format!("http://{}/effect", self.host)
    }

    pub fn callback_url(&self) -> String {
        format!("http://{}/callback", self.host)
    }

    /// What it heard so far.
    pub fn heard(&self) -> Heard {
        lock(&self.shared.heard).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn effects_are_counted_by_key_and_callbacks_by_run_and_id() {
        let r = Receiver::start(Rng::new(1), 0).await.expect("starts");
        let http = reqwest::Client::new();
        for key in ["run_a:c1", "run_a:c1", "run_b:c1"] {
            let resp = http
                .post(r.effect_url())
                .header("idempotency-key", key)
                .body("x")
                .send()
                .await
                .expect("answered");
            assert_eq!(resp.status(), 200);
        }
        http.post(r.effect_url()).send().await.expect("answered");
        for id in ["run_a", "other"] {
            http.post(r.callback_url())
                .header("webhook-id", id)
                .body(r#"{"run_id": "run_a"}"#)
                .send()
                .await
                .expect("answered");
        }
        let heard = r.heard();
        assert_eq!(heard.effects["run_a:c1"], 2);
        assert_eq!(heard.effects["run_b:c1"], 1);
        assert_eq!(heard.unkeyed_effects, 1);
        assert_eq!(
            heard.callback_ids("run_a"),
            BTreeSet::from(["run_a", "other"])
        );
        assert_eq!(heard.callbacks_taken["run_a"], 2);
    }

    #[tokio::test]
    async fn a_seeded_share_of_callbacks_is_refused() {
        let r = Receiver::start(Rng::new(7), 50).await.expect("starts");
        let http = reqwest::Client::new();
        let mut refused = 0;
        for _ in 0..40 {
            let resp = http
                .post(r.callback_url())
                .header("webhook-id", "run_a")
                .body(r#"{"run_id": "run_a"}"#)
                .send()
                .await
                .expect("answered");
            if resp.status() == 503 {
                refused += 1;
            }
        }
        assert!((5..=35).contains(&refused), "{refused} of 40 refused");
        assert_eq!(r.heard().callbacks["run_a"].len(), 40);
        assert_eq!(r.heard().callbacks_taken["run_a"], 40 - refused);
    }
}
