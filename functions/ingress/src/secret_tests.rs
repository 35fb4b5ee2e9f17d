//! `/v1/secrets` on in-memory ports: a value goes in and never comes out,
//! each tenant sees its own names, and bad input names its field.

use serde_json::json;

use armada_domain::api::KeyRole;

use crate::tests::{code, Api};

#[tokio::test]
async fn a_secret_is_written_listed_by_name_and_never_shown() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    // Put, then put again with a new value.
    for value in ["tok-8888-abcd", "tok-9999-abcd"] {
        let body = json!({ "value": value });
        let (s, v) = api
            .call("PUT", "/v1/secrets/crm-token", Some(&key), &[], Some(body))
            .await;
        assert_eq!(s, 204, "{v}");
    }
    let (s, page) = api.call("GET", "/v1/secrets", Some(&key), &[], None).await;
    assert_eq!(s, 200, "{page}");
    assert_eq!(page["secrets"].as_array().unwrap().len(), 1);
    assert_eq!(page["secrets"][0]["name"], "crm-token");
    assert!(!page.to_string().contains("tok-"), "{page}");
    // Stored sealed: not the value, not in the record.
    let stored = serde_json::to_string(&api.mem.state().secrets).unwrap();
    assert!(!stored.contains("tok-9999"), "{stored}");
    // Another tenant sees none of it.
    let other = api.key("other").await;
    let (_, theirs) = api
        .call("GET", "/v1/secrets", Some(&other), &[], None)
        .await;
    assert_eq!(theirs["secrets"], json!([]));
    let (s, v) = api
        .call("DELETE", "/v1/secrets/crm-token", Some(&other), &[], None)
        .await;
    assert_eq!((s, code(&v)), (404, "NOT_FOUND"), "{v}");
    let (s, _) = api
        .call("DELETE", "/v1/secrets/crm-token", Some(&key), &[], None)
        .await;
    assert_eq!(s, 204);
    let (_, page) = api.call("GET", "/v1/secrets", Some(&key), &[], None).await;
    assert_eq!(page["secrets"], json!([]));
}

#[tokio::test]
async fn bad_secrets_are_refused_naming_the_field_and_approvers_cannot_write() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    for (path, body, field) in [
        ("/v1/secrets/crm-token", json!({"value": "abc"}), "value"),
        ("/v1/secrets/crm-token", json!({"value": 12345}), "value"),
        (
            "/v1/secrets/crm-token",
            json!({"value": "abcd", "x": 1}),
            "x",
        ),
        ("/v1/secrets/CRM%20token", json!({"value": "abcd"}), "name"),
    ] {
        let (s, v) = api.call("PUT", path, Some(&key), &[], Some(body)).await;
        assert_eq!((s, code(&v)), (400, "INVALID_FIELD"), "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().starts_with(field),
            "{v}"
        );
    }
    let approver = api.key_with_role("acme", KeyRole::Approver).await;
    let (s, _) = api
        .call(
            "PUT",
            "/v1/secrets/crm-token",
            Some(&approver),
            &[],
            Some(json!({"value": "abcd"})),
        )
        .await;
    assert_eq!(s, 403);
    let (s, _) = api
        .call("GET", "/v1/secrets", Some(&approver), &[], None)
        .await;
    assert_eq!(s, 403);
}
