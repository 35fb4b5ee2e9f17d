//! The scripted model served over the OpenAI chat-completions protocol on
//! loopback, so the OpenAI-compatible adapter is the code path that runs.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

use armada_core::adapters::models::{openai_reply_body, parse_openai_request};
use armada_domain::scripted::{respond, Scripted};

/// Requests served, for tests that count model calls.
#[derive(Debug, Clone, Default)]
pub struct ModelStats {
    pub requests: Arc<AtomicU64>,
}

use super::http::plain as reply;

async fn answer(
    stats: ModelStats,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    if req.method() != hyper::Method::POST || !req.uri().path().ends_with("/chat/completions") {
        return reply(404, json!({"error": {"message": "not found"}}));
    }
    stats.requests.fetch_add(1, Ordering::Relaxed);
    let Ok(body) = req.into_body().collect().await else {
        return reply(400, json!({"error": {"message": "unreadable body"}}));
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body.to_bytes()) else {
        return reply(400, json!({"error": {"message": "body is not JSON"}}));
    };
    let model = v
        .get("model")
        .and_then(|m| m.as_str())
        .unwrap_or("scripted")
        .to_string();
    let messages = match parse_openai_request(&v) {
        Ok(m) => m,
        Err(e) => return reply(400, json!({"error": {"message": e}})),
    };
    let mut outcome = respond(&messages);
    loop {
        match outcome {
            Scripted::Sleep(ms, then) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                outcome = *then;
            }
            Scripted::Fail(text) => {
                return reply(
                    500,
                    json!({"error": {"message": text, "type": "scripted_failure"}}),
                )
            }
            Scripted::Reply(r) => return reply(200, openai_reply_body(&model, &r)),
        }
    }
}

pub async fn serve(listener: TcpListener, stats: ModelStats, mut shutdown: watch::Receiver<bool>) {
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
            _ = shutdown.changed() => return,
        };
        let stats = stats.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let stats = stats.clone();
                async move { Ok::<_, Infallible>(answer(stats, req).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
