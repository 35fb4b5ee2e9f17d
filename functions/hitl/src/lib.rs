//! T1 hitl: the approval callback. Approvals arrive with the approvals issue;
//! until then every route answers 501 with a stable error code.

use lambda_http::{Body, Request, Response};

pub async fn handle(_req: Request) -> Response<Body> {
    let body = serde_json::json!({"error": {
        "code": "NOT_IMPLEMENTED",
        "message": "human approvals are not available in this version"
    }});
    Response::builder()
        .status(501)
        .header("content-type", "application/json")
        .body(Body::Text(body.to_string()))
        .unwrap_or_else(|_| Response::new(Body::Empty))
}
