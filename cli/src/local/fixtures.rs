//! The local stack against events as AWS sends them (`tests/fixtures/aws`,
//! AWS's documented examples): the local HTTP server's and SQS pollers'
//! events have every field AWS's have, of the same type, and the
//! functions answer AWS's events as they answer the local ones.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_http::aws_lambda_events::apigw::ApiGatewayV2httpRequest;
use lambda_http::request::LambdaRequest;
use serde_json::{json, Value};

use super::http::{gateway_event, Incoming};
use super::pollers::{sqs_record, Received};
use super::template::Route;

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/aws")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Every field of `v` (by its JSON pointer) with its JSON type.
fn fields(v: &Value, at: &str, out: &mut BTreeMap<String, &'static str>) {
    let kind = match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(m) => {
            for (k, child) in m {
                fields(child, &format!("{at}/{k}"), out);
            }
            "object"
        }
    };
    out.insert(at.to_string(), kind);
}

/// The fields AWS sends only with some requests or configurations:
/// cookies, stage variables, an authorizer's context; and the entries of
/// the request's own maps, which depend on the request.
fn optional(pointer: &str) -> bool {
    [
        "/cookies",
        "/stageVariables",
        "/requestContext/authentication",
        "/requestContext/authorizer",
    ]
    .iter()
    .any(|p| pointer.starts_with(p))
        || ["/headers/", "/queryStringParameters/", "/pathParameters/"]
            .iter()
            .any(|p| pointer.starts_with(p))
}

/// The local server's event for the request AWS's example describes.
fn local_event_for(aws: &Value) -> Value {
    let (method, route_path) = aws["routeKey"].as_str().unwrap().split_once(' ').unwrap();
    let route = Route {
        method: method.to_string(),
        path: route_path.to_string(),
        function: "ingress".into(),
    };
    let params: HashMap<String, String> = aws["pathParameters"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect()
        })
        .unwrap_or_default();
    let headers = aws["headers"].as_object().unwrap().clone();
    gateway_event(&Incoming {
        route: &route,
        params: &params,
        method,
        path: aws["rawPath"].as_str().unwrap(),
        raw_query: aws["rawQueryString"].as_str().unwrap(),
        headers: &headers,
        body: aws["body"].as_str().unwrap_or_default().as_bytes(),
        source_ip: aws["requestContext"]["http"]["sourceIp"].as_str().unwrap(),
        now_ms: aws["requestContext"]["timeEpoch"].as_i64().unwrap(),
    })
}

#[test]
fn the_local_gateway_event_has_every_field_aws_sends_of_its_type() {
    for name in [
        "apigw-v2-http-request.json",
        "apigw-v2-http-request-path-parameters.json",
    ] {
        let aws = fixture(name);
        let local = local_event_for(&aws);
        let (mut want, mut have) = (BTreeMap::new(), BTreeMap::new());
        fields(&aws, "", &mut want);
        fields(&local, "", &mut have);
        for (pointer, kind) in want.iter().filter(|(p, _)| !optional(p)) {
            assert_eq!(have.get(pointer), Some(kind), "{name}: {pointer}");
        }
        // What the function reads, as AWS writes it.
        for pointer in [
            "/rawPath",
            "/rawQueryString",
            "/queryStringParameters",
            "/pathParameters",
            "/routeKey",
            "/requestContext/time",
            "/requestContext/timeEpoch",
            "/requestContext/http/method",
            "/requestContext/http/sourceIp",
            "/body",
            "/isBase64Encoded",
        ] {
            let absent = Value::Null;
            assert_eq!(
                local.pointer(pointer).unwrap_or(&absent),
                aws.pointer(pointer).unwrap_or(&absent),
                "{name}: {pointer}"
            );
        }
        serde_json::from_value::<ApiGatewayV2httpRequest>(local).unwrap();
    }
}

/// AWS's own events, through the API's router as `lambda_http` hands
/// them over in AWS: paths and queries are decoded, keys read, bodies
/// parsed.
#[tokio::test]
async fn the_api_answers_the_events_aws_sends() {
    use armada_core::memory::fixtures::agent;
    use armada_core::memory::test_config;
    use armada_core::ports::StoredKey;
    use armada_domain::api::{ApiKey, KeyRole};
    use http_body_util::BodyExt;
    use lambda_http::tower::ServiceExt;

    let (svc, mem) = armada_core::Services::in_memory(test_config());
    agent(&svc, "assistant", &["current_time"]).await;
    let key = ApiKey::mint();
    let stored = StoredKey {
        key_id: key.key_id.clone(),
        tenant: "acme".into(),
        secret_sha256: key.secret_hash(),
        revoked: false,
        role: KeyRole::Member,
        owner: None,
    };
    svc.registry.put_key(&stored, 0).await.unwrap();
    let app = armada_ingress::app(svc.clone());
    let send = |mut event: Value| {
        let app = app.clone();
        event["headers"]["authorization"] = json!(format!("Bearer {}", key.token()));
        async move {
            let v2: ApiGatewayV2httpRequest = serde_json::from_value(event).unwrap();
            let req: lambda_http::Request = LambdaRequest::ApiGatewayV2(v2).into();
            let resp = app.oneshot(req).await.unwrap();
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (
                status,
                serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null),
            )
        }
    };
    let (status, body) = send(fixture("apigw-v2-http-request.json")).await;
    assert_eq!(status, 202, "{body}");
    let run_id = body["run_id"].as_str().unwrap();
    let run = mem.state().runs.get(run_id).cloned().unwrap();
    assert_eq!(run.tenant, "acme");
    let (status, body) = send(fixture("apigw-v2-http-request-path-parameters.json")).await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'run one'"),
        "the path is decoded: {body}"
    );
}

#[test]
fn the_local_sqs_records_are_the_records_aws_sends() {
    for (name, queue) in [
        ("sqs-standard-event.json", "my-queue"),
        ("sqs-fifo-event.json", "fifo.fifo"),
    ] {
        let aws = fixture(name);
        let record = &aws["Records"][0];
        let local = sqs_record(&Received {
            message_id: record["messageId"].as_str().unwrap(),
            receipt_handle: record["receiptHandle"].as_str().unwrap(),
            body: record["body"].as_str().unwrap(),
            md5_of_body: record["md5OfBody"].as_str().unwrap(),
            attributes: record["attributes"].as_object().unwrap().clone(),
            queue_arn: record["eventSourceARN"].as_str().unwrap(),
            region: record["awsRegion"].as_str().unwrap(),
        });
        assert_eq!(&local, record, "{name}");
        let event: SqsEvent = serde_json::from_value(aws.clone()).unwrap();
        let msg = &event.records[0];
        assert_eq!(armada_core::batch::receive_count(msg), 1, "{name}");
        assert_eq!(armada_core::batch::source_queue(msg), queue, "{name}");
    }
}
