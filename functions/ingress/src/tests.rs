//! Ingress on in-memory ports: who may call, accepting a Run once per
//! `Idempotency-Key`, a tenant never seeing another's Run, cancelling
//! (fenced, announced once, refused when ended), bad input. No emulator.

use std::sync::Arc;

use lambda_http::Body;
use serde_json::{json, Value};

use armada_core::memory::fixtures::agent;
use armada_core::memory::{test_config, Memory};
use armada_core::ports::StoredKey;
use armada_core::Services;
use armada_domain::api::{ApiKey, KeyRole};
use armada_domain::messages::DispatchMessage;
use armada_domain::run::RunState;

use super::app;

/// One request through the API's router, its answer's body read whole.
pub(crate) async fn handle(svc: Arc<Services>, req: http::Request<Body>) -> http::Response<Body> {
    use http_body_util::BodyExt;
    use lambda_http::tower::ServiceExt;
    let resp = match app(svc).oneshot(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    };
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.expect("a body").to_bytes();
    let body = match String::from_utf8(bytes.to_vec()) {
        Ok(t) => Body::Text(t),
        Err(e) => Body::Binary(e.into_bytes()),
    };
    http::Response::from_parts(parts, body)
}

pub(crate) struct Api {
    pub(crate) svc: Arc<Services>,
    pub(crate) mem: Arc<Memory>,
}

/// The admin key of the test deployment.
const ADMIN: &str = "adm_unit_test_admin_key";

impl Api {
    pub(crate) async fn new() -> Api {
        Self::with(|_| {}).await
    }

    /// The test deployment, configured by `edit`.
    pub(crate) async fn with(edit: impl FnOnce(&mut armada_core::config::Config)) -> Api {
        let mut cfg = test_config();
        cfg.admin_key_sha256 = armada_domain::crypto::sha256_hex(ADMIN.as_bytes());
        edit(&mut cfg);
        let (svc, mem) = Services::in_memory(cfg);
        agent(&svc, "assistant", &["current_time"]).await;
        Api { svc, mem }
    }

    /// A tenant's bearer token, as `POST /v1/tenants/{t}/keys` would mint.
    pub(crate) async fn key(&self, tenant: &str) -> String {
        self.key_with_role(tenant, KeyRole::Member).await
    }

    pub(crate) async fn key_with_role(&self, tenant: &str, role: KeyRole) -> String {
        let key = ApiKey::mint();
        let stored = StoredKey {
            key_id: key.key_id.clone(),
            tenant: tenant.into(),
            secret_sha256: key.secret_hash(),
            revoked: false,
            role,
            owner: None,
        };
        self.svc
            .registry
            .put_key(&stored, 0)
            .await
            .expect("key stored");
        key.token()
    }

    pub(crate) async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (u16, Value) {
        let (status, json, _) = self.send(method, path, token, headers, body).await;
        (status, json)
    }

    /// As [`Self::call`], with the seconds of the answer's `Retry-After`.
    pub(crate) async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (u16, Value, Option<u32>) {
        let mut req = http::Request::builder().method(method).uri(path);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let body = body.map_or(Body::Empty, |b| Body::Text(b.to_string()));
        let req = req.body(body).expect("a well-formed request");
        let resp = handle(self.svc.clone(), req).await;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let json = match resp.body() {
            Body::Text(t) if !t.is_empty() => serde_json::from_str(t).unwrap_or(Value::Null),
            _ => Value::Null,
        };
        (status, json, retry_after)
    }
}

impl Api {
    /// `POST /v1/runs` of the assistant by `key`: the status and body.
    pub(crate) async fn start(&self, key: &str) -> (u16, Value) {
        let body = json!({"agent": "assistant", "input": "hi"});
        self.call("POST", "/v1/runs", Some(key), &[], Some(body))
            .await
    }
}

pub(crate) fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn a_caller_without_a_valid_key_is_refused() {
    let api = Api::new().await;
    let (status, body) = api.call("GET", "/v1/runs/run_x", None, &[], None).await;
    assert_eq!((status, code(&body)), (401, "UNAUTHORIZED"));
    let forged = ApiKey::mint().token();
    let (status, _) = api
        .call("GET", "/v1/runs/run_x", Some(&forged), &[], None)
        .await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn a_run_is_accepted_once_per_idempotency_key() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    let body = json!({"agent": "assistant", "input": "hi"});
    let idem = [("idempotency-key", "k-1")];
    let (status, first) = api
        .call("POST", "/v1/runs", Some(&key), &idem, Some(body.clone()))
        .await;
    assert_eq!((status, first["state"].as_str()), (202, Some("PENDING")));
    let run_id = first["run_id"].as_str().expect("a run id").to_string();
    assert_eq!(
        api.mem.take_dispatch(),
        [DispatchMessage::StartRun {
            run_id: run_id.clone(),
            tenant: "acme".into()
        }]
    );
    let (status, again) = api
        .call("POST", "/v1/runs", Some(&key), &idem, Some(body))
        .await;
    assert_eq!(
        (status, again["run_id"].as_str()),
        (202, Some(run_id.as_str()))
    );
    assert_eq!(again["replayed"], true);
    assert_eq!(api.mem.state().runs.len(), 1, "no second run");
    let other = json!({"agent": "assistant", "input": "something else"});
    let (status, refused) = api
        .call("POST", "/v1/runs", Some(&key), &idem, Some(other))
        .await;
    assert_eq!((status, code(&refused)), (409, "IDEMPOTENCY_KEY_REUSED"));
}

#[tokio::test]
async fn a_tenant_never_sees_another_tenants_run() {
    let api = Api::new().await;
    let (acme, globex) = (api.key("acme").await, api.key("globex").await);
    let body = json!({"agent": "assistant", "input": "secret plans"});
    let (_, created) = api
        .call("POST", "/v1/runs", Some(&acme), &[], Some(body))
        .await;
    let path = format!(
        "/v1/runs/{}",
        created["run_id"].as_str().unwrap_or_default()
    );
    let (status, _) = api.call("GET", &path, Some(&acme), &[], None).await;
    assert_eq!(status, 200);
    let (status, body) = api.call("GET", &path, Some(&globex), &[], None).await;
    assert_eq!((status, code(&body)), (404, "NOT_FOUND"));
    let cancel = format!("{path}/cancel");
    let (status, _) = api.call("POST", &cancel, Some(&globex), &[], None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_cancel_fences_the_run_is_announced_once_and_cannot_be_repeated() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    let body = json!({"agent": "assistant", "input": "hi"});
    let (_, created) = api
        .call("POST", "/v1/runs", Some(&key), &[], Some(body))
        .await;
    let run_id = created["run_id"].as_str().unwrap_or_default().to_string();
    api.mem.take_dispatch();
    let cancel = format!("/v1/runs/{run_id}/cancel");
    let (status, body) = api.call("POST", &cancel, Some(&key), &[], None).await;
    assert_eq!((status, body["state"].as_str()), (200, Some("CANCELLED")));
    let run = api.mem.state().runs[&run_id].clone();
    assert_eq!((run.state(), run.epoch), (RunState::Cancelled, 1));
    assert_eq!(
        api.mem.take_dispatch(),
        [DispatchMessage::RunTerminal {
            run_id: run_id.clone(),
            tenant: "acme".into()
        }]
    );
    let (status, body) = api.call("POST", &cancel, Some(&key), &[], None).await;
    assert_eq!((status, code(&body)), (409, "RUN_TERMINAL"));
    // Not settled yet: the end is announced again (settling twice closes
    // nothing twice), never ended again.
    let again = api.mem.take_dispatch();
    assert!(
        again
            .iter()
            .all(|m| matches!(m, DispatchMessage::RunTerminal { .. })),
        "{again:?}"
    );
    assert_eq!(api.mem.state().runs[&run_id].epoch, 1);
}

/// A cancel whose announcement is lost (the queue unreachable) is
/// recorded and answered 503; the caller's retry finds the Run ended and
/// announces it then, so the Run is settled (found by `armada chaos`: a
/// Run cancelled as the emulator died stayed CANCELLED, never closed).
#[tokio::test]
async fn a_cancel_not_announced_asks_for_a_retry_that_announces_it() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    let (_, created) = api.start(&key).await;
    let run_id = created["run_id"].as_str().unwrap_or_default().to_string();
    api.mem.take_dispatch();
    api.mem.state().dispatch_failures = 1;
    let cancel = format!("/v1/runs/{run_id}/cancel");
    let (status, body) = api.call("POST", &cancel, Some(&key), &[], None).await;
    assert_eq!((status, code(&body)), (503, "UNAVAILABLE"), "{body}");
    assert_eq!(api.mem.state().runs[&run_id].state(), RunState::Cancelled);
    assert!(api.mem.take_dispatch().is_empty());
    let (status, body) = api.call("POST", &cancel, Some(&key), &[], None).await;
    assert_eq!((status, code(&body)), (409, "RUN_TERMINAL"));
    assert_eq!(
        api.mem.take_dispatch(),
        [DispatchMessage::RunTerminal {
            run_id: run_id.clone(),
            tenant: "acme".into()
        }]
    );
}

/// A Run whose document cannot be read answers GET with its state and
/// CORRUPT_RECORD (not a 500), and a cancel ends it, announced once.
#[tokio::test]
async fn a_run_whose_record_cannot_be_read_is_read_and_cancelled() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    let (status, created) = api.start(&key).await;
    assert_eq!(status, 202, "{created}");
    let run_id = created["run_id"].as_str().unwrap().to_string();
    api.mem.take_dispatch();
    api.mem.state().corrupt_runs.insert(run_id.clone());
    let path = format!("/v1/runs/{run_id}");
    let (status, view) = api.call("GET", &path, Some(&key), &[], None).await;
    assert_eq!((status, code(&view)), (200, "CORRUPT_RECORD"), "{view}");
    assert_eq!(view["state"], "PENDING");
    let other = api.key("other").await;
    let (status, _) = api.call("GET", &path, Some(&other), &[], None).await;
    assert_eq!(
        status, 404,
        "another tenant's unreadable Run does not exist"
    );
    let (status, _) = api
        .call("GET", &format!("{path}/events"), Some(&key), &[], None)
        .await;
    assert_eq!(status, 200);
    let (status, cancelled) = api
        .call("POST", &format!("{path}/cancel"), Some(&key), &[], None)
        .await;
    assert_eq!(
        (status, &cancelled["state"]),
        (200, &json!("CANCELLED")),
        "{cancelled}"
    );
    assert_eq!(api.mem.take_dispatch().len(), 1, "its end is announced");
    let (status, view) = api.call("GET", &path, Some(&key), &[], None).await;
    assert_eq!(
        (status, &view["state"]),
        (200, &json!("CANCELLED")),
        "{view}"
    );
    assert_eq!(code(&view), "CORRUPT_RECORD");
}

#[tokio::test]
async fn bad_input_gets_a_named_error_and_writes_nothing() {
    let api = Api::new().await;
    let key = api.key("acme").await;
    for body in [
        json!({"agent": "assistant"}),
        json!({"agent": "assistant", "input": "hi", "surprise": 1}),
        json!({"agent": "nobody", "input": "hi"}),
    ] {
        let (status, resp) = api
            .call("POST", "/v1/runs", Some(&key), &[], Some(body))
            .await;
        assert!(matches!(status, 400 | 404), "{status} {resp}");
        assert!(!code(&resp).is_empty(), "{resp}");
    }
    // A body nested deeper than a record may hold is refused as a whole.
    let deep = (0..40).fold(json!("x"), |v, _| json!({ "k": v }));
    let (status, resp) = api
        .call(
            "POST",
            "/v1/runs",
            Some(&key),
            &[],
            Some(json!({"agent": "assistant", "input": "hi", "metadata": deep})),
        )
        .await;
    assert_eq!((status, code(&resp)), (400, "INVALID_JSON"), "{resp}");
    assert!(
        resp["error"]["message"]
            .as_str()
            .unwrap()
            .contains("over the limit of 32"),
        "{resp}"
    );
    assert!(api.mem.state().runs.is_empty());
    assert!(api.mem.take_dispatch().is_empty());
}

#[tokio::test]
async fn teams_are_admin_data_naming_registered_agents() {
    let api = Api::new().await;
    agent(&api.svc, "intel", &["current_time"]).await;
    let key = api.key("acme").await;
    let team = json!({"members": ["assistant", "intel"], "strategy": "fan_out",
                      "failure_policy": {"quorum": 1}});
    let (status, _) = api
        .call("PUT", "/v1/teams/soc", Some(&key), &[], Some(team.clone()))
        .await;
    assert_eq!(status, 403, "a tenant key cannot define teams");
    let (status, body) = api
        .call("PUT", "/v1/teams/soc", Some(ADMIN), &[], Some(team))
        .await;
    assert_eq!((status, body["strategy"].as_str()), (200, Some("fan_out")));
    assert_eq!(body["failure_policy"], json!({"quorum": 1}));
    let (status, got) = api
        .call("GET", "/v1/teams/soc", Some(&key), &[], None)
        .await;
    assert_eq!(
        (status, got["members"].clone()),
        (200, json!(["assistant", "intel"]))
    );
    let (_, list) = api.call("GET", "/v1/teams", Some(&key), &[], None).await;
    assert_eq!(list["teams"].as_array().map(Vec::len), Some(1));

    let unknown = json!({"members": ["assistant", "ghost"], "strategy": "relay"});
    let (status, body) = api
        .call("PUT", "/v1/teams/bad", Some(ADMIN), &[], Some(unknown))
        .await;
    assert_eq!((status, code(&body)), (404, "NOT_FOUND"), "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("ghost"));
    let lead = json!({"members": ["assistant"], "strategy": "lead"});
    let (status, body) = api
        .call("PUT", "/v1/teams/bad", Some(ADMIN), &[], Some(lead))
        .await;
    assert_eq!((status, code(&body)), (400, "INVALID_FIELD"), "{body}");
    assert!(!api.mem.state().teams.contains_key("bad"));

    let (status, _) = api
        .call("DELETE", "/v1/teams/soc", Some(ADMIN), &[], None)
        .await;
    assert_eq!(status, 200);
    let (status, _) = api
        .call("GET", "/v1/teams/soc", Some(&key), &[], None)
        .await;
    assert_eq!(status, 404);
    let (status, _) = api
        .call("DELETE", "/v1/teams/soc", Some(ADMIN), &[], None)
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_tenant_key_reads_an_agent_without_the_operators_secrets() {
    let api = Api::new().await;
    let def = json!({
        "model": {"provider": "openai", "model_id": "gpt-x", "context_window": 8192,
                  "base_url": "https://models.internal.example/v1",
                  "api_key_env": "OPS_MODEL_KEY"},
        "system_prompt": "Be careful.",
        "skills": ["current_time"],
        "approvals": {"require": ["current_time"],
                      "approvers": ["ops-lead@example.com"],
                      "chat_webhook_url": "https://chat.example.com/hook/SECRET-TOKEN"}
    });
    let (status, body) = api
        .call("PUT", "/v1/agents/careful", Some(ADMIN), &[], Some(def))
        .await;
    assert_eq!(status, 200, "{body}");
    let secrets = [
        "models.internal.example",
        "OPS_MODEL_KEY",
        "ops-lead@example.com",
        "SECRET-TOKEN",
    ];
    let member = api.key("acme").await;
    let approver = api.key_with_role("acme", KeyRole::Approver).await;
    for key in [member.as_str(), approver.as_str()] {
        let (status, one) = api
            .call("GET", "/v1/agents/careful", Some(key), &[], None)
            .await;
        assert_eq!(status, 200, "{one}");
        let (status, all) = api.call("GET", "/v1/agents", Some(key), &[], None).await;
        assert_eq!(status, 200, "{all}");
        for body in [one.to_string(), all.to_string()] {
            for secret in secrets {
                assert!(!body.contains(secret), "{secret} shown to a tenant: {body}");
            }
        }
        // What a tenant needs to call the agent is still there.
        assert_eq!(one["model"]["model_id"], "gpt-x");
        assert_eq!(one["approvals"]["require"], json!(["current_time"]));
        assert_eq!(one["version"], 1);
    }
    // The admin key reads the whole definition.
    let (status, one) = api
        .call("GET", "/v1/agents/careful", Some(ADMIN), &[], None)
        .await;
    assert_eq!(status, 200, "{one}");
    let (_, all) = api.call("GET", "/v1/agents", Some(ADMIN), &[], None).await;
    for body in [one.to_string(), all.to_string()] {
        for secret in secrets {
            assert!(
                body.contains(secret),
                "{secret} hidden from the admin: {body}"
            );
        }
    }
}

/// A team and a skill read with `GET` can be written back as they are
/// too (their `name` is the path's: accepted and ignored).
#[tokio::test]
async fn a_team_and_a_skill_read_can_be_written_back() {
    let api = Api::new().await;
    let team =
        json!({"members": ["assistant"], "strategy": "fan_out", "failure_policy": {"quorum": 1}});
    let (status, _) = api
        .call("PUT", "/v1/teams/crew", Some(ADMIN), &[], Some(team))
        .await;
    assert_eq!(status, 200);
    let skill = json!({"kind": "external_api", "executor": "http_request", "risk": "low"});
    let (status, _) = api
        .call("PUT", "/v1/skills/lookup", Some(ADMIN), &[], Some(skill))
        .await;
    assert_eq!(status, 200);
    for (read_at, write_at) in [
        ("/v1/teams/crew", "/v1/teams/crew2"),
        ("/v1/skills/lookup", "/v1/skills/lookup2"),
    ] {
        let (status, read) = api.call("GET", read_at, Some(ADMIN), &[], None).await;
        assert_eq!(status, 200, "{read}");
        assert!(read.get("name").is_some(), "{read}");
        let (status, written) = api
            .call("PUT", write_at, Some(ADMIN), &[], Some(read.clone()))
            .await;
        assert_eq!(status, 200, "{read_at} written back: {written}");
        let (_, copy) = api.call("GET", write_at, Some(ADMIN), &[], None).await;
        let mut expected = read;
        expected["name"] = copy["name"].clone();
        assert_eq!(copy, expected, "{write_at}");
    }
}

/// What `GET` returns can be `PUT` back as it is (under the same name or
/// another): its version, frozen manifests and report are read-only fields,
/// accepted and ignored. `If-Match` makes the write conditional: `412` once
/// someone else changed the definition since it was read.
#[tokio::test]
async fn a_definition_read_can_be_written_back_and_if_match_guards_it() {
    let api = Api::new().await;
    let (status, read) = api
        .call("GET", "/v1/agents/assistant", Some(ADMIN), &[], None)
        .await;
    assert_eq!(status, 200, "{read}");
    assert!(read.get("manifests").is_some(), "{read}");
    let version = read["version"].as_u64().unwrap();
    let (status, copy) = api
        .call(
            "PUT",
            "/v1/agents/helper",
            Some(ADMIN),
            &[],
            Some(read.clone()),
        )
        .await;
    assert_eq!((status, &copy["name"]), (200, &json!("helper")), "{copy}");
    let at = |v: u64| v.to_string();
    let (status, again) = api
        .call(
            "PUT",
            "/v1/agents/assistant",
            Some(ADMIN),
            &[("if-match", &format!("\"{version}\""))],
            Some(read.clone()),
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["version"], json!(version + 1));
    // Written from the same (now stale) read: refused, nothing changed.
    let (status, stale) = api
        .call(
            "PUT",
            "/v1/agents/assistant",
            Some(ADMIN),
            &[("if-match", &at(version))],
            Some(read.clone()),
        )
        .await;
    assert_eq!(
        (status, stale["error"]["code"].as_str()),
        (412, Some("PRECONDITION_FAILED")),
        "{stale}"
    );
    let (_, now) = api
        .call("GET", "/v1/agents/assistant", Some(ADMIN), &[], None)
        .await;
    assert_eq!(now["version"], json!(version + 1));
    let (status, bad) = api
        .call(
            "PUT",
            "/v1/agents/assistant",
            Some(ADMIN),
            &[("if-match", "yesterday")],
            Some(read.clone()),
        )
        .await;
    assert_eq!(
        (status, bad["error"]["code"].as_str()),
        (400, Some("INVALID_HEADER"))
    );
    // Unknown fields are still refused.
    let mut typo = read;
    typo["sandboxx"] = json!({});
    let (status, _) = api
        .call("PUT", "/v1/agents/assistant", Some(ADMIN), &[], Some(typo))
        .await;
    assert_eq!(status, 400);
}

/// A key minted for a person (`owner`) marks the Runs it starts with that
/// address, which their approval links are then held to.
#[tokio::test]
async fn a_key_minted_for_a_person_marks_the_runs_it_starts() {
    let api = Api::new().await;
    let (status, minted) = api
        .call(
            "POST",
            "/v1/tenants/acme/keys",
            Some(ADMIN),
            &[],
            Some(json!({"owner": "Alice@Example.com"})),
        )
        .await;
    assert_eq!(status, 201, "{minted}");
    assert_eq!(minted["owner"], "alice@example.com");
    let key = minted["key"].as_str().unwrap().to_string();
    let body = json!({"agent": "assistant", "input": "hi"});
    let (status, run) = api
        .call("POST", "/v1/runs", Some(&key), &[], Some(body))
        .await;
    assert_eq!(status, 202, "{run}");
    let stored = api
        .svc
        .runs
        .get(run["run_id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.started_by_address.as_deref(),
        Some("alice@example.com")
    );
    let (status, bad) = api
        .call(
            "POST",
            "/v1/tenants/acme/keys",
            Some(ADMIN),
            &[],
            Some(json!({"owner": "not an address"})),
        )
        .await;
    assert_eq!((status, code(&bad)), (400, "INVALID_FIELD"));
}
