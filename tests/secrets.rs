//! Tenants' secrets end to end on the emulator: a secret put through the
//! API reaches the host an agent's `http_request` header rule names, and
//! its value appears nowhere the stack records (the Run, its events, the
//! agent, the secrets list), even when the remote echoes it back; a
//! deleted secret fails the call naming only the name. And the vault a
//! deployment uses, on the emulator's KMS: a data key per value, opened
//! only under its tenant and name.

#![allow(clippy::unwrap_used)]

use reqwest::Method;
use serde_json::{json, Value};

use armada_api::secrets::SecretsPage;
use armada_core::adapters::aws::AwsClients;
use armada_core::adapters::kms::KmsVault;
use armada_core::adapters::vault::DerivedVault;
use armada_core::error::StoreError;
use armada_core::ports::Vault;
use armada_domain::secret::{SecretValue, DERIVED_KEY};
use armada_tests::{emulator_endpoint, outcome, TestStack};

const TOKEN: &str = "Bearer crm-7f3a9c21e4";

/// A server that answers every request with the request's head, as an
/// endpoint that echoes what it was sent would; the heads, as heard.
async fn echoing() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = l.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tx.send(String::from_utf8_lossy(&head).to_string());
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    head.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.write_all(&head).await;
            });
        }
    });
    (host, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_secret_reaches_its_host_and_nothing_recorded_holds_it() {
    let t = TestStack::start().await;
    let key = t.stack.tenant_key.clone();
    let (host, mut heard) = echoing().await;
    t.put_secret("crm-token", TOKEN).await;
    let def = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
        "system_prompt": "You file tickets.",
        "skills": ["http_request"],
        "http_allow_hosts": [host],
        "http_headers": [{"host": host, "headers": {
            "Authorization": {"secret": "crm-token"},
            "X-Team": "blue",
        }}],
        "limits": {"timeout_s": 60}
    });
    t.admin
        .call(Method::PUT, "/v1/agents/crm", Some(&def), true)
        .await
        .unwrap();

    let ask = format!(
        "/tool http_request {}",
        json!({"url": format!("http://{host}/tickets"), "method": "POST", "body": "new ticket"})
    );
    let (run_id, run) = t.ask("crm", &ask).await;
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    let head = heard.recv().await.unwrap().to_ascii_lowercase();
    assert!(
        head.contains(&format!("authorization: {}", TOKEN.to_ascii_lowercase())),
        "{head}"
    );
    assert!(head.contains("x-team: blue"), "{head}");
    // The echo came back scrubbed, and nothing recorded holds the value.
    let output = run.output.clone().unwrap_or_default();
    assert!(output.contains("[secret:crm-token]"), "{output}");
    let events = serde_json::to_string(&t.events(&run_id).await).unwrap();
    let (_, view) = t
        .raw(
            Method::GET,
            &format!("/v1/runs/{run_id}"),
            Some(&key),
            None,
            &[],
        )
        .await;
    let (_, agent) = t
        .raw(Method::GET, "/v1/agents/crm", Some(&key), None, &[])
        .await;
    let (_, listed) = t
        .raw(Method::GET, "/v1/secrets", Some(&key), None, &[])
        .await;
    for (what, text) in [
        ("events", events),
        ("run", view.to_string()),
        ("agent", agent.to_string()),
        ("secrets", listed.to_string()),
    ] {
        assert!(!text.contains("crm-7f3a9c21e4"), "{what}: {text}");
    }
    let page: SecretsPage = serde_json::from_value(listed).unwrap();
    assert_eq!(page.secrets.len(), 1);
    assert_eq!(page.secrets[0].name, "crm-token");

    // Deleted: the next call fails naming the secret, and sends nothing.
    t.delete_secret("crm-token").await;
    let (_, run) = t.ask("crm", &ask).await;
    let output = run.output.clone().unwrap_or_default();
    let result: Value = output
        .split_once("returned: ")
        .and_then(|(_, j)| serde_json::from_str(j).ok())
        .unwrap_or(Value::Null);
    assert_eq!(result["error"]["code"], "SECRET_NOT_FOUND", "{output}");
    assert!(heard.try_recv().is_err(), "nothing was sent without it");
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kms_vault_wraps_a_data_key_per_value_bound_to_its_secret() {
    let aws = AwsClients::load_local(&emulator_endpoint(), "us-east-1").await;
    let made = aws
        .kms
        .create_key()
        .description("armada secrets test")
        .send()
        .await
        .unwrap();
    let arn = made.key_metadata().unwrap().arn().unwrap().to_string();
    let deployment = "a deployment secret of the test";
    let vault = KmsVault::new(aws.kms.clone(), &arn, DerivedVault::new(deployment));
    let value = SecretValue::new(TOKEN.into());

    let sealed = vault.seal("acme", "crm-token", &value).await.unwrap();
    assert_eq!(sealed.key, arn);
    let wrapped = sealed.wrapped_key.clone().unwrap();
    assert!(!sealed.value.contains("crm-7f3a"), "{sealed:?}");
    assert_eq!(
        vault.open("acme", "crm-token", &sealed).await.unwrap(),
        value
    );
    // A data key of its own each time.
    let again = vault.seal("acme", "crm-token", &value).await.unwrap();
    assert_ne!(again.wrapped_key.unwrap(), wrapped);
    // Moved to another tenant or name, or given another's data key: it
    // does not open.
    for (tenant, name) in [("other", "crm-token"), ("acme", "other-token")] {
        let moved = vault.open(tenant, name, &sealed).await;
        assert!(matches!(moved, Err(StoreError::Corrupt(_))), "{moved:?}");
    }
    let mut swapped = sealed.clone();
    swapped.wrapped_key = Some(
        vault
            .seal("acme", "crm-token", &value)
            .await
            .unwrap()
            .wrapped_key
            .unwrap(),
    );
    assert!(matches!(
        vault.open("acme", "crm-token", &swapped).await,
        Err(StoreError::Corrupt(_))
    ));
    // What was sealed before the deployment named its key still opens.
    let before = DerivedVault::new(deployment)
        .seal("acme", "crm-token", &value)
        .await
        .unwrap();
    assert_eq!(before.key, DERIVED_KEY);
    assert_eq!(
        vault.open("acme", "crm-token", &before).await.unwrap(),
        value
    );
}
