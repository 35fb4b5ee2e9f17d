//! Each release function binary under a loopback Lambda Runtime API: its
//! size, init time and peak RSS.

use crate::bench::fill;
use crate::local::LocalStack;
use anyhow::Context;
use anyhow::Result;
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use serde_json::Value;
use std::convert::Infallible;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;
use tokio::net::TcpListener;

/// Serves the Lambda Runtime API to one function process: `events`
/// invocations, then holds the next poll open.
async fn runtime_api(
    events: Vec<Value>,
) -> Result<(
    String,
    Arc<AtomicU64>,
    tokio::sync::oneshot::Receiver<Instant>,
)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let served = Arc::new(AtomicU64::new(0));
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let first_tx = Arc::new(std::sync::Mutex::new(Some(first_tx)));
    let events = Arc::new(events);
    let counter = served.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let events = events.clone();
            let counter = counter.clone();
            let first_tx = first_tx.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let events = events.clone();
                    let counter = counter.clone();
                    let first_tx = first_tx.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        if path.ends_with("/invocation/next") {
                            if let Some(tx) = first_tx.lock().ok().and_then(|mut t| t.take()) {
                                let _ = tx.send(Instant::now());
                            }
                            let n = counter.load(Ordering::Relaxed) as usize;
                            let Some(ev) = events.get(n).cloned() else {
                                tokio::time::sleep(Duration::from_secs(3600)).await;
                                return Ok::<_, Infallible>(hyper::Response::new(Full::new(
                                    Bytes::new(),
                                )));
                            };
                            let deadline = std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .map(|d| d.as_millis() + 30_000)
                                .unwrap_or(0);
                            let resp = hyper::Response::builder()
                                .header("Lambda-Runtime-Aws-Request-Id", format!("req-{n}"))
                                .header("Lambda-Runtime-Deadline-Ms", deadline.to_string())
                                .header(
                                    "Lambda-Runtime-Invoked-Function-Arn",
                                    "arn:aws:lambda:us-east-1:000000000000:function:bench",
                                )
                                .header("Lambda-Runtime-Trace-Id", "Root=1-0-0")
                                .body(Full::new(Bytes::from(ev.to_string())))
                                .unwrap_or_default();
                            return Ok(resp);
                        }
                        if path.contains("/response") || path.contains("/error") {
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(hyper::Response::builder()
                            .status(202)
                            .body(Full::new(Bytes::new()))
                            .unwrap_or_default())
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok((addr, served, first_rx))
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    fill::status_field(pid, "VmHWM:")
}

pub(super) async fn binaries(
    root: &Path,
    stack: &LocalStack,
    env: &std::collections::HashMap<String, String>,
) -> Result<()> {
    let dir: PathBuf = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| root.join("target/release"));
    println!(
        "\nFunction binaries ({}), each under the Lambda Runtime API with 200 invocations:",
        dir.display()
    );
    let health = json!({
        "version": "2.0", "routeKey": "GET /v1/health", "rawPath": "/v1/health", "rawQueryString": "",
        "headers": {}, "requestContext": {"http": {"method": "GET", "path": "/v1/health", "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1", "userAgent": "bench"},
        "accountId": "local", "apiId": "local", "domainName": "local", "domainPrefix": "local", "requestId": "r", "routeKey": "GET /v1/health", "stage": "$default", "time": "", "timeEpoch": 0},
        "isBase64Encoded": false
    });
    let sqs = |queue: &str, body: Value| {
        json!({"Records": [{"messageId": "m1", "receiptHandle": "r1", "body": body.to_string(), "attributes": {"ApproximateReceiveCount": "1", "MessageGroupId": "g"},
                "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs", "eventSourceARN": format!("arn:aws:sqs:us-east-1:000000000000:{queue}"), "awsRegion": "us-east-1"}]})
    };
    let step = json!({"type": "step", "run_id": "run_bench_absent", "tenant": "local", "step": 0});
    let start = json!({"type": "start_run", "run_id": "run_bench_absent", "tenant": "local"});
    let cases = [
        ("ingress", health.clone()),
        ("hitl", health),
        ("dispatcher", sqs(&stack.svc.cfg.dispatch_queue, start)),
        ("harness", sqs(&stack.svc.cfg.harness_queue, step)),
    ];
    println!(
        "  {:<11} {:>10} {:>10} {:>12}",
        "function", "size", "init", "peak RSS"
    );
    for (name, event) in cases {
        let bin = dir.join(name);
        let Ok(meta) = std::fs::metadata(&bin) else {
            println!("  {name:<11} not built (cargo build --release --bins)");
            continue;
        };
        let (addr, served, first) = runtime_api(vec![event; 200]).await?;
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.envs(env)
            .env("AWS_LAMBDA_RUNTIME_API", &addr)
            .env("AWS_LAMBDA_FUNCTION_NAME", name)
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "bench")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", "bench")
            .env("AWS_ENDPOINT_URL", &stack.endpoint)
            .env("AWS_REGION", "us-east-1")
            .env(
                "AWS_ACCESS_KEY_ID",
                std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_else(|_| "test".into()),
            )
            .env(
                "AWS_SECRET_ACCESS_KEY",
                std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "test".into()),
            )
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let t0 = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let init = match tokio::time::timeout(Duration::from_secs(20), first).await {
            Ok(Ok(t)) => t - t0,
            _ => {
                println!("  {name:<11} did not reach the Runtime API");
                let _ = child.kill().await;
                continue;
            }
        };
        let until = Instant::now() + Duration::from_secs(60);
        while served.load(Ordering::Relaxed) < 200 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let rss = child.id().and_then(peak_rss_kib).unwrap_or(0);
        let _ = child.kill().await;
        println!(
            "  {name:<11} {:>8.1} MB {:>7.1} ms {:>9.1} MB",
            meta.len() as f64 / 1e6,
            init.as_secs_f64() * 1000.0,
            rss as f64 / 1024.0
        );
    }
    Ok(())
}
