//! A loopback HTTP server that does what API Gateway (HTTP API, payload
//! v2) does for the functions: it matches the template's routes, turns each
//! request into the v2 event JSON, and hands it, as `lambda_http` would, to
//! the function's handler.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full, Limited};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use lambda_http::aws_lambda_events::apigw::ApiGatewayV2httpRequest;
use lambda_http::request::LambdaRequest;
use lambda_http::Request;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::template::Route;

/// API Gateway's own payload limit.
const GATEWAY_MAX_BODY: usize = 10 * 1024 * 1024;

pub type HttpHandler =
    Arc<dyn Fn(Request) -> BoxFuture<'static, hyper::Response<Full<Bytes>>> + Send + Sync>;

/// A function's axum router as the handler its routes are given to, as
/// `lambda_http::run` serves it in AWS.
pub fn function(app: axum::Router) -> HttpHandler {
    Arc::new(move |req: Request| {
        let app = app.clone();
        Box::pin(async move {
            use lambda_http::tower::ServiceExt;
            let resp = match app.oneshot(req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
            let (parts, body) = resp.into_parts();
            match body.collect().await {
                Ok(b) => hyper::Response::from_parts(parts, Full::new(b.to_bytes())),
                Err(e) => {
                    tracing::error!(error = %e, "the function's answer could not be read");
                    plain(500, json!({"message": "Internal Server Error"}))
                }
            }
        })
    })
}

#[derive(Clone)]
struct Router {
    routes: Vec<(Route, Vec<String>)>,
    handlers: HashMap<String, HttpHandler>,
}

impl Router {
    fn new(mut routes: Vec<Route>, handlers: HashMap<String, HttpHandler>) -> Self {
        // As API Gateway chooses: a route without a greedy `{x+}` before
        // any with one, and of the greedy ones the longest prefix first;
        // an exact method before `ANY`.
        routes.sort_by_key(|r| {
            let greedy = r.path.contains("+}");
            let prefix = r.path.split("/{").next().map_or(0, str::len);
            (greedy, std::cmp::Reverse(prefix), r.method == "ANY")
        });
        let routes = routes
            .into_iter()
            .map(|r| {
                let segs = r
                    .path
                    .trim_matches('/')
                    .split('/')
                    .map(str::to_string)
                    .collect();
                (r, segs)
            })
            .collect();
        Router { routes, handlers }
    }

    /// The route, its path parameters, for a method and path.
    fn find(&self, method: &str, path: &str) -> Option<(&Route, HashMap<String, String>)> {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        'routes: for (route, pattern) in &self.routes {
            if route.method != method && route.method != "ANY" {
                continue;
            }
            let mut params = HashMap::new();
            for (i, p) in pattern.iter().enumerate() {
                if let Some(name) = p.strip_prefix('{').and_then(|p| p.strip_suffix("+}")) {
                    params.insert(name.to_string(), segs[i.min(segs.len())..].join("/"));
                    return Some((route, params));
                }
                let Some(seg) = segs.get(i) else {
                    continue 'routes;
                };
                if let Some(name) = p.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                    if seg.is_empty() {
                        continue 'routes;
                    }
                    params.insert(name.to_string(), seg.to_string());
                } else if p != seg {
                    continue 'routes;
                }
            }
            if segs.len() == pattern.len() {
                return Some((route, params));
            }
        }
        None
    }
}

/// A JSON response for the local servers.
pub fn plain(status: u16, body: serde_json::Value) -> hyper::Response<Full<Bytes>> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap_or_default()
}

async fn serve_one(
    router: Arc<Router>,
    peer: SocketAddr,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let raw_query = req.uri().query().unwrap_or_default().to_string();
    let Some((route, params)) = router.find(&method, &path) else {
        return plain(404, json!({"message": "Not Found"}));
    };
    let Some(handler) = router.handlers.get(&route.function).cloned() else {
        return plain(500, json!({"message": "Internal Server Error"}));
    };
    let mut headers = serde_json::Map::new();
    for (k, v) in req.headers() {
        let v = v.to_str().unwrap_or_default();
        let entry = headers.entry(k.as_str().to_string()).or_insert(json!(""));
        *entry = match entry.as_str() {
            Some("") | None => json!(v),
            Some(prev) => json!(format!("{prev},{v}")),
        };
    }
    let body = match Limited::new(req.into_body(), GATEWAY_MAX_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => return plain(413, json!({"message": "Request Entity Too Large"})),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let event = gateway_event(&Incoming {
        route,
        params: &params,
        method: &method,
        path: &path,
        raw_query: &raw_query,
        headers: &headers,
        body: &body,
        source_ip: &peer.ip().to_string(),
        now_ms: now,
    });
    let v2: ApiGatewayV2httpRequest = match serde_json::from_value(event) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(error = %e, "could not build the API Gateway event");
            return plain(500, json!({"message": "Internal Server Error"}));
        }
    };
    let request: Request = LambdaRequest::ApiGatewayV2(v2).into();
    handler(request).await
}

/// A request as the gateway received it, matched to its route.
pub struct Incoming<'a> {
    pub route: &'a Route,
    pub params: &'a HashMap<String, String>,
    pub method: &'a str,
    /// As sent: still percent-encoded.
    pub path: &'a str,
    pub raw_query: &'a str,
    pub headers: &'a serde_json::Map<String, serde_json::Value>,
    pub body: &'a [u8],
    pub source_ip: &'a str,
    pub now_ms: i64,
}

/// The HTTP API payload 2.0 event API Gateway hands the function for a
/// request (its shape checked against AWS's documented example, see
/// `tests/fixtures/aws`): a body that is not UTF-8 goes base64-encoded;
/// query parameters are decoded, repeated names joined by commas.
pub fn gateway_event(r: &Incoming<'_>) -> serde_json::Value {
    let (body_text, b64) = match std::str::from_utf8(r.body) {
        Ok(s) => (s.to_string(), false),
        Err(_) => {
            use base64::Engine;
            (
                base64::engine::general_purpose::STANDARD.encode(r.body),
                true,
            )
        }
    };
    let mut qs = serde_json::Map::new();
    for (k, v) in form_urlencoded::parse(r.raw_query.as_bytes()) {
        let entry = qs.entry(k.into_owned()).or_insert(json!(null));
        *entry = match entry.as_str() {
            Some(prev) => json!(format!("{prev},{v}")),
            None => json!(v),
        };
    }
    let route_key = format!("{} {}", r.route.method, r.route.path);
    let time = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(r.now_ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(GATEWAY_TIME).ok())
        .unwrap_or_default();
    json!({
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": r.path,
        "rawQueryString": r.raw_query,
        "headers": r.headers,
        "queryStringParameters": if qs.is_empty() { serde_json::Value::Null } else { serde_json::Value::Object(qs) },
        "pathParameters": if r.params.is_empty() { serde_json::Value::Null } else { json!(r.params) },
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "domainName": "127.0.0.1",
            "domainPrefix": "local",
            "http": {"method": r.method, "path": r.path, "protocol": "HTTP/1.1",
                     "sourceIp": r.source_ip,
                     "userAgent": r.headers.get("user-agent").cloned().unwrap_or(json!(""))},
            "requestId": uuid::Uuid::new_v4().to_string(),
            "routeKey": route_key,
            "stage": "$default",
            "time": time,
            "timeEpoch": r.now_ms
        },
        "body": if r.body.is_empty() { serde_json::Value::Null } else { json!(body_text) },
        "isBase64Encoded": b64
    })
}

/// `requestContext.time` as API Gateway writes it: `12/Mar/2020:19:03:58 +0000`.
const GATEWAY_TIME: &[time::format_description::FormatItem<'static>] = time::macros::format_description!(
    "[day]/[month repr:short]/[year]:[hour]:[minute]:[second] +0000"
);

/// Serves until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    routes: Vec<Route>,
    handlers: HashMap<String, HttpHandler>,
    mut shutdown: watch::Receiver<bool>,
) {
    let router = Arc::new(Router::new(routes, handlers));
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => { tracing::warn!(error = %e, "accept failed"); continue; }
            },
            _ = shutdown.changed() => return,
        };
        let router = router.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let router = router.clone();
                async move { Ok::<_, Infallible>(serve_one(router, peer, req).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_with_parameters() {
        let r = |m: &str, p: &str| Route {
            method: m.into(),
            path: p.into(),
            function: "f".into(),
        };
        let router = Router::new(
            vec![
                r("GET", "/v1/runs/{run_id}"),
                r("GET", "/v1/runs/{run_id}/events"),
                r("POST", "/v1/runs"),
            ],
            HashMap::new(),
        );
        let (route, params) = router.find("GET", "/v1/runs/abc/events").unwrap();
        assert_eq!(route.path, "/v1/runs/{run_id}/events");
        assert_eq!(params["run_id"], "abc");
        assert!(router.find("GET", "/v1/runs").is_none());
        assert!(router.find("DELETE", "/v1/runs/abc").is_none());
        assert!(router.find("POST", "/v1/runs").is_some());
    }
}
