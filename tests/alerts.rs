//! An Alertmanager hook against a real Alertmanager (Debian's
//! `prometheus-alertmanager`, which scripts/test installs): its webhook
//! receiver points at the hook with the hook's bearer token, alerts are
//! posted to its API, and what it sends is what starts Runs. One Run per
//! firing group; its repeat notifications and its `resolved` start none;
//! the same alert firing again after resolving starts a new one.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use armada_api::hooks::HookCreated;
use armada_domain::hook::inbound::Outcome;
use armada_domain::run::Trigger;
use armada_tests::{free_port, wait, RunState, TestStack};

/// A running Alertmanager, stopped when dropped.
struct Alertmanager {
    process: Child,
    api: String,
    _dir: PathBuf,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Alertmanager {
    /// Starts one whose only receiver posts to `url` with `token`, sending
    /// resolved notifications, grouping by alert name and repeating a
    /// group's notification every two seconds.
    async fn start(url: &str, token: &str) -> Alertmanager {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("armada-alertmanager-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = format!(
            r#"route:
  receiver: armada
  group_by: [alertname]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 2s
receivers:
  - name: armada
    webhook_configs:
      - url: "{url}"
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials: "{token}"
"#
        );
        std::fs::write(dir.join("alertmanager.yml"), config).unwrap();
        let process = Command::new("prometheus-alertmanager")
            .arg(format!(
                "--config.file={}",
                dir.join("alertmanager.yml").display()
            ))
            .arg(format!("--storage.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            // One instance: no gossip with peers.
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus-alertmanager starts (scripts/test installs Debian's package)");
        let api = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        wait::eventually("alertmanager to be ready", || async {
            http.get(format!("{api}/-/ready"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        Alertmanager {
            process,
            api,
            _dir: dir,
        }
    }

    /// Posts alerts to its API, as Prometheus would.
    async fn post(&self, alerts: Value) {
        let resp = reqwest::Client::new()
            .post(format!("{}/api/v2/alerts", self.api))
            .json(&alerts)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{:?}", resp.text().await);
    }
}

fn rfc3339(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
    armada_core::clock::rfc3339(d.as_millis() as i64)
}

/// One alert named `name` on `instance`, from `starts` until `ends`.
fn alert(name: &str, starts: &str, ends: Option<&str>) -> Value {
    let mut a = json!({
        "labels": {"alertname": name, "instance": "db-1", "severity": "page"},
        "annotations": {"summary": format!("{name} on db-1")},
        "startsAt": starts,
    });
    if let Some(e) = ends {
        a["endsAt"] = json!(e);
    }
    a
}

fn count(seen: &[(Outcome, Option<String>)], outcome: Outcome) -> usize {
    seen.iter().filter(|(o, _)| *o == outcome).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_real_alertmanager_starts_one_run_per_firing_and_none_for_repeats_or_resolved() {
    let t = TestStack::start().await;
    let (s, v) = t
        .raw(
            Method::POST,
            "/v1/hooks",
            Some(&t.stack.tenant_key),
            Some(&json!({"kind": "alertmanager", "agent": "assistant"}).to_string()),
            &[],
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let hook: HookCreated = serde_json::from_value(v).unwrap();
    let id = hook.hook_id.clone();
    let am = Alertmanager::start(&hook.url, hook.secret.as_deref().unwrap()).await;

    // It fires: one notification, one Run, with the alert in its input.
    let started = std::time::SystemTime::now();
    let first_start = rfc3339(started);
    am.post(json!([alert("DiskFull", &first_start, None)]))
        .await;
    let seen = wait::until("the firing to start a Run", wait::PATIENCE, || async {
        let seen = t.hook_deliveries(&id).await;
        (count(&seen, Outcome::Started) >= 1).then_some(seen)
    })
    .await;
    let run_id = seen
        .iter()
        .find(|(o, _)| *o == Outcome::Started)
        .and_then(|(_, r)| r.clone())
        .unwrap();
    let run = t.wait_closed(&run_id).await;
    assert_eq!(run.state.outcome(), RunState::Completed, "{run:?}");
    let input = run.input.clone().unwrap();
    assert!(
        input.starts_with("Alertmanager reports firing for DiskFull (1 alerts)."),
        "{input}"
    );
    assert!(matches!(run.trigger, Some(Trigger::Hook { ref event, .. }) if event == "firing"));

    // It repeats the notification every two seconds: each is a duplicate.
    let seen = wait::until(
        "two repeats of the notification",
        wait::PATIENCE,
        || async {
            let seen = t.hook_deliveries(&id).await;
            (count(&seen, Outcome::Duplicate) >= 2).then_some(seen)
        },
    )
    .await;
    assert_eq!(count(&seen, Outcome::Started), 1, "{seen:?}");
    assert!(seen
        .iter()
        .filter(|(o, _)| *o == Outcome::Duplicate)
        .all(|(_, r)| r.as_deref() == Some(run_id.as_str())));

    // It resolves: the resolved notification starts nothing.
    let now = rfc3339(std::time::SystemTime::now());
    am.post(json!([alert("DiskFull", &first_start, Some(&now))]))
        .await;
    let seen = wait::until("the resolved notification", wait::PATIENCE, || async {
        let seen = t.hook_deliveries(&id).await;
        (count(&seen, Outcome::Filtered) >= 1).then_some(seen)
    })
    .await;
    assert_eq!(count(&seen, Outcome::Started), 1, "{seen:?}");

    // It fires again, a new episode: a new Run.
    let again = rfc3339(std::time::SystemTime::now() + Duration::from_secs(1));
    am.post(json!([alert("DiskFull", &again, None)])).await;
    let seen = wait::until(
        "the second firing to start a Run",
        wait::PATIENCE,
        || async {
            let seen = t.hook_deliveries(&id).await;
            (count(&seen, Outcome::Started) >= 2).then_some(seen)
        },
    )
    .await;
    let runs: Vec<&str> = seen
        .iter()
        .filter(|(o, _)| *o == Outcome::Started)
        .filter_map(|(_, r)| r.as_deref())
        .collect();
    assert_eq!(runs.len(), 2, "{seen:?}");
    assert_ne!(runs[0], runs[1]);
    drop(am);
    t.stack.stop().await;
}
