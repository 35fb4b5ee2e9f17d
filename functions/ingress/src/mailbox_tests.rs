//! Mailboxes at the API on in-memory ports: an address is one mailbox's
//! across tenants and is freed with it, an approver key reads but does not
//! write, and another tenant's mailbox is not there.

use serde_json::json;

use armada_domain::api::KeyRole;

use crate::tests::{code, Api};

#[tokio::test]
async fn a_mailbox_owns_its_address_until_it_is_deleted() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    let body = json!({"name": "support", "agent": "assistant", "allow_senders": ["@example.com"]});
    let (s, v) = api
        .call("POST", "/v1/mailboxes", Some(&key), &[], Some(body.clone()))
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["address"], "support@armada.local");
    assert_eq!(v["mailbox"]["reply"], true);
    let id = v["mailbox_id"].as_str().unwrap_or_default().to_string();

    // Another tenant cannot take the address, nor see the mailbox.
    let other = api.key("globex").await;
    let (s, v) = api
        .call(
            "POST",
            "/v1/mailboxes",
            Some(&other),
            &[],
            Some(body.clone()),
        )
        .await;
    assert_eq!((s, code(&v)), (409, "ADDRESS_TAKEN"), "{v}");
    let path = format!("/v1/mailboxes/{id}");
    let (s, _) = api.call("GET", &path, Some(&other), &[], None).await;
    assert_eq!(s, 404);
    let (s, v) = api
        .call("GET", "/v1/mailboxes", Some(&other), &[], None)
        .await;
    assert_eq!((s, v["mailboxes"].as_array().map(Vec::len)), (200, Some(0)));

    // Changes: any field but the address; an approver only reads.
    let (s, v) = api
        .call(
            "PATCH",
            &path,
            Some(&key),
            &[],
            Some(json!({"reply": false, "allow_senders": ["bob@example.com"]})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["reply"].clone(), v["version"].clone()),
        (json!(false), json!(2))
    );
    let (s, v) = api
        .call(
            "PATCH",
            &path,
            Some(&key),
            &[],
            Some(json!({"name": "sales"})),
        )
        .await;
    assert_eq!((s, code(&v)), (400, "INVALID_FIELD"), "{v}");
    let (s, v) = api
        .call(
            "PATCH",
            &path,
            Some(&key),
            &[],
            Some(json!({"agent": "nobody"})),
        )
        .await;
    assert_eq!((s, code(&v)), (404, "NOT_FOUND"), "{v}");
    let approver = api.key_with_role("acme", KeyRole::Approver).await;
    let (s, v) = api
        .call(
            "GET",
            &format!("{path}/deliveries"),
            Some(&approver),
            &[],
            None,
        )
        .await;
    assert_eq!(
        (s, v["deliveries"].as_array().map(Vec::len)),
        (200, Some(0))
    );
    let (s, v) = api.call("DELETE", &path, Some(&approver), &[], None).await;
    assert_eq!((s, code(&v)), (403, "FORBIDDEN"));

    // Deleted: the address is free for anyone.
    let (s, _) = api.call("DELETE", &path, Some(&key), &[], None).await;
    assert_eq!(s, 204);
    let (s, _) = api.call("GET", &path, Some(&key), &[], None).await;
    assert_eq!(s, 404);
    let (s, v) = api
        .call("POST", "/v1/mailboxes", Some(&other), &[], Some(body))
        .await;
    assert_eq!(s, 201, "{v}");
}

#[tokio::test]
async fn a_create_request_is_checked_before_anything_is_written() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    for (body, status) in [
        (
            json!({"name": "s", "agent": "nobody", "allow_senders": ["a@b.c"]}),
            404,
        ),
        (
            json!({"name": "S p", "agent": "assistant", "allow_senders": ["a@b.c"]}),
            400,
        ),
        (
            json!({"name": "s", "chain": ["assistant"], "allow_senders": ["a@b.c"]}),
            400,
        ),
        (json!({"name": "s", "agent": "assistant"}), 400),
    ] {
        let (s, v) = api
            .call("POST", "/v1/mailboxes", Some(&key), &[], Some(body.clone()))
            .await;
        assert_eq!(s, status, "{body}: {v}");
    }
    assert!(api.mem.state().mailboxes.is_empty());
}
