//! The workload: a seeded list of jobs of every shape the scripted model
//! can drive, posted through the HTTP API as a user would. Every create
//! carries an `Idempotency-Key`, so a request retried across a restart of
//! the functions host starts nothing twice; a request that meets the host
//! down is retried until it is back.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use reqwest::Method;
use serde::Serialize;
use serde_json::{json, Value};

use crate::rng::Rng;

/// The fan-out team the workload makes: five members, round 2 by the
/// assistant.
pub const FAN_OUT_TEAM: &str = "chaos-five";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// One answer.
    Single,
    /// A session of 3-5 messages, posted back to back (each waits for the
    /// one before).
    Session,
    /// The orchestrator delegating two tasks in parallel.
    Delegation,
    /// A fan-out team of five, then round 2.
    FanOut,
    /// A relay chain of three.
    Chain,
    /// A slow answer, cancelled after a random moment.
    Cancel,
}

impl Shape {
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::Single => "single",
            Shape::Session => "session",
            Shape::Delegation => "delegation",
            Shape::FanOut => "fan_out",
            Shape::Chain => "chain",
            Shape::Cancel => "cancel",
        }
    }
}

/// One job of the workload.
#[derive(Debug, Clone)]
pub struct Job {
    pub index: usize,
    pub shape: Shape,
    /// A session's messages.
    pub messages: u32,
    /// When a cancel is sent, after the Run starts.
    pub cancel_after_ms: u64,
}

/// `runs` jobs, their shapes and details drawn from `rng`.
pub fn plan(rng: &mut Rng, runs: usize) -> Vec<Job> {
    // Weights, out of 100.
    const SHAPES: [(Shape, u64); 6] = [
        (Shape::Single, 30),
        (Shape::Session, 15),
        (Shape::Delegation, 15),
        (Shape::FanOut, 10),
        (Shape::Chain, 15),
        (Shape::Cancel, 15),
    ];
    (0..runs)
        .map(|index| {
            let mut pick = rng.between(0, 99);
            let shape = SHAPES
                .iter()
                .find(|(_, w)| {
                    let hit = pick < *w;
                    pick = pick.saturating_sub(*w);
                    hit
                })
                .map(|(s, _)| *s)
                .unwrap_or(Shape::Single);
            Job {
                index,
                shape,
                messages: rng.between(3, 5) as u32,
                cancel_after_ms: rng.between(0, 2_500),
            }
        })
        .collect()
}

/// What a job started: its root Runs (each message of a session), and
/// its session.
#[derive(Debug, Clone)]
pub struct Started {
    pub shape: Shape,
    pub runs: Vec<String>,
    pub session: Option<String>,
}

/// The API as the workload calls it: every call retried while the host
/// is down or busy, up to `patience`.
#[derive(Debug, Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
    pub key: String,
    pub admin_key: String,
    pub patience: Duration,
}

impl Api {
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        idempotency_key: Option<&str>,
        admin: bool,
    ) -> Result<(u16, Value)> {
        let start = Instant::now();
        let key = if admin { &self.admin_key } else { &self.key };
        loop {
            let mut req = self
                .http
                .request(method.clone(), format!("{}{path}", self.base))
                .bearer_auth(key)
                .timeout(Duration::from_secs(30));
            if let Some(b) = body {
                req = req.json(b);
            }
            if let Some(k) = idempotency_key {
                req = req.header("Idempotency-Key", k);
            }
            let answer = match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let v: Value = resp.json().await.unwrap_or(Value::Null);
                    // Down, restarting, or shedding load: again, later.
                    (!(status >= 500 || status == 429)).then_some((status, v))
                }
                Err(_) => None,
            };
            if let Some(a) = answer {
                return Ok(a);
            }
            if start.elapsed() > self.patience {
                bail!("{method} {path}: no answer within {:?}", self.patience);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn start(&self, path: &str, body: Value, idem: &str) -> Result<String> {
        let (status, v) = self
            .send(Method::POST, path, Some(&body), Some(idem), false)
            .await?;
        if status != 202 && status != 200 {
            bail!("POST {path}: {status} {v}");
        }
        v["run_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("POST {path}: no run_id in {v}"))
    }
}

/// Makes what the workload needs beyond the stack's own definitions.
pub async fn prepare(api: &Api) -> Result<()> {
    let team = json!({"members": ["assistant", "researcher", "coder", "operator", "orchestrator"],
        "strategy": "fan_out", "aggregator": "assistant", "failure_policy": "best_effort"});
    let (status, v) = api
        .send(
            Method::PUT,
            &format!("/v1/teams/{FAN_OUT_TEAM}"),
            Some(&team),
            None,
            true,
        )
        .await?;
    if status >= 300 {
        bail!("making the fan-out team: {status} {v}");
    }
    Ok(())
}

/// Posts one job; what it started. `tag` keeps this workload's keys apart
/// from another's.
pub async fn execute(api: &Api, job: &Job, tag: &str) -> Result<Started> {
    let i = job.index;
    let idem = |part: &str| format!("chaos-{tag}-{i}-{part}");
    let one = |runs: Vec<String>| Started {
        shape: job.shape,
        runs,
        session: None,
    };
    Ok(match job.shape {
        Shape::Single => {
            let body = json!({"agent": "assistant", "input": format!("question {i}")});
            one(vec![api.start("/v1/runs", body, &idem("run")).await?])
        }
        Shape::Delegation => {
            let calls = json!([
                {"name": "delegate", "args": {"agent": "researcher", "task": format!("find sources {i}")}},
                {"name": "delegate", "args": {"agent": "assistant", "task": format!("outline {i}")}},
            ]);
            let body = json!({"agent": "orchestrator", "input": format!("/tools {calls}")});
            one(vec![api.start("/v1/runs", body, &idem("run")).await?])
        }
        Shape::FanOut => {
            let body = json!({"team": FAN_OUT_TEAM, "input": format!("review {i}")});
            one(vec![api.start("/v1/runs", body, &idem("run")).await?])
        }
        Shape::Chain => {
            let body = json!({"chain": ["assistant", "researcher", "assistant"],
                "input": format!("draft {i}")});
            one(vec![api.start("/v1/runs", body, &idem("run")).await?])
        }
        Shape::Cancel => {
            let body = json!({"agent": "assistant", "input": format!("/sleep 4000 slow {i}")});
            let run_id = api.start("/v1/runs", body, &idem("run")).await?;
            tokio::time::sleep(Duration::from_millis(job.cancel_after_ms)).await;
            let (status, v) = api
                .send(
                    Method::POST,
                    &format!("/v1/runs/{run_id}/cancel"),
                    None,
                    None,
                    false,
                )
                .await?;
            // Ended before the cancel came: nothing to cancel, also right.
            if status >= 300 && status != 409 {
                bail!("cancel {run_id}: {status} {v}");
            }
            one(vec![run_id])
        }
        Shape::Session => {
            let (status, v) = api
                .send(
                    Method::POST,
                    "/v1/sessions",
                    Some(&json!({"agent": "assistant"})),
                    None,
                    false,
                )
                .await?;
            let session = v["session_id"]
                .as_str()
                .filter(|_| status == 201)
                .ok_or_else(|| anyhow!("POST /v1/sessions: {status} {v}"))?
                .to_string();
            let mut runs = Vec::new();
            for m in 1..=job.messages {
                let body = json!({"input": format!("message {m} of {i}")});
                let path = format!("/v1/sessions/{session}/messages");
                runs.push(api.start(&path, body, &idem(&format!("m{m}"))).await?);
            }
            Started {
                shape: job.shape,
                runs,
                session: Some(session),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_is_one_workload_of_every_shape() {
        let a = plan(&mut Rng::new(42), 200);
        let b = plan(&mut Rng::new(42), 200);
        let shapes = |p: &[Job]| p.iter().map(|j| j.shape).collect::<Vec<_>>();
        assert_eq!(shapes(&a), shapes(&b));
        for s in [
            Shape::Single,
            Shape::Session,
            Shape::Delegation,
            Shape::FanOut,
            Shape::Chain,
            Shape::Cancel,
        ] {
            assert!(a.iter().any(|j| j.shape == s), "{s:?}");
        }
        assert!(a.iter().all(|j| (3..=5).contains(&j.messages)));
        assert_ne!(shapes(&a), shapes(&plan(&mut Rng::new(43), 200)));
    }
}
