//! The workload: a seeded list of jobs of every shape the scripted model
//! can drive, posted through the HTTP API as a user would. Every create
//! carries an `Idempotency-Key`, so a request retried across a restart of
//! the functions host starts nothing twice; a request that meets the host
//! down is retried until it is back. Effects (`http_request` POSTs) and
//! callbacks go to the counting receiver; approvals are decided by the
//! job that asked for them, as an approver would, with a key of the
//! tenant's `approver` role.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use reqwest::Method;
use serde::Serialize;
use serde_json::{json, Value};

use armada_api::runs::EventsPage;
use armada_domain::run::LogEvent;

use crate::rng::Rng;

/// The fan-out team the workload makes: five members, round 2 by the
/// assistant.
pub const FAN_OUT_TEAM: &str = "chaos-five";
/// The lead team: its lead plans two tasks, then consolidates.
pub const LEAD_TEAM: &str = "chaos-lead";
const LEAD: &str = "chaos-planner";
/// The agent whose `http_request` POSTs reach the receiver unasked.
pub const EFFECTS_AGENT: &str = "chaos-effects";
/// The agent whose sandbox runs the workload's commands (the stack's own).
pub const SANDBOX_AGENT: &str = "coder";
/// The agent whose `http_request` calls each wait for an approval.
pub const APPROVALS_AGENT: &str = "chaos-approvals";

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
    /// Two `http_request` POSTs in one turn, to the counting receiver.
    Effect,
    /// A POST that waits for an approver, who approves or rejects it.
    Approval,
    /// A lead team: two tasks planned, run in parallel, consolidated.
    Lead,
    /// A command in the coder's sandbox that appends a line to a file of
    /// its own and prints the file: one line, unless it ran twice.
    Sandbox,
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
            Shape::Effect => "effect",
            Shape::Approval => "approval",
            Shape::Lead => "lead",
            Shape::Sandbox => "sandbox",
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
    /// Whether an approval is approved (or rejected).
    pub approve: bool,
}

/// `runs` jobs, their shapes and details drawn from `rng`; without
/// `sandbox`, a sandbox job is a single answer instead.
pub fn plan(rng: &mut Rng, runs: usize, sandbox: bool) -> Vec<Job> {
    // Weights, out of 100.
    const SHAPES: [(Shape, u64); 10] = [
        (Shape::Single, 15),
        (Shape::Sandbox, 5),
        (Shape::Session, 12),
        (Shape::Delegation, 12),
        (Shape::FanOut, 8),
        (Shape::Chain, 12),
        (Shape::Cancel, 10),
        (Shape::Effect, 10),
        (Shape::Approval, 8),
        (Shape::Lead, 8),
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
                .filter(|s| sandbox || *s != Shape::Sandbox)
                .unwrap_or(Shape::Single);
            Job {
                index,
                shape,
                messages: rng.between(3, 5) as u32,
                cancel_after_ms: rng.between(0, 2_500),
                approve: rng.chance(50),
            }
        })
        .collect()
}

/// What a job started: its root Runs (each message of a session), its
/// session, and the approvals it decided.
#[derive(Debug, Clone)]
pub struct Started {
    pub shape: Shape,
    pub runs: Vec<String>,
    pub session: Option<String>,
    pub decided: Vec<Decided>,
}

/// An approval the workload decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub run_id: String,
    pub approval_id: String,
    /// The call it gates.
    pub call_id: String,
    pub approved: bool,
}

/// Whose key a request is sent with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    Tenant,
    Admin,
    Approver,
}

/// The API as the workload calls it: every call retried while the host
/// is down or busy, up to `patience`.
#[derive(Debug, Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
    pub key: String,
    pub admin_key: String,
    /// Made by [`prepare`].
    pub approver_key: String,
    pub patience: Duration,
    /// The counting receiver's effect and callback URLs.
    pub effect_url: String,
    pub callback_url: String,
}

impl Api {
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        idempotency_key: Option<&str>,
        who: Who,
    ) -> Result<(u16, Value)> {
        let start = Instant::now();
        let key = match who {
            Who::Tenant => &self.key,
            Who::Admin => &self.admin_key,
            Who::Approver => &self.approver_key,
        };
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
            .send(Method::POST, path, Some(&body), Some(idem), Who::Tenant)
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

/// Makes what the workload needs beyond the stack's own definitions: its
/// teams, the agents whose calls reach `receiver` (`host:port`), and an
/// approver's key of `tenant`, which it returns.
pub async fn prepare(api: &Api, tenant: &str, receiver: &str) -> Result<String> {
    let scripted =
        json!({"provider": "scripted", "model_id": "scripted-1", "context_window": 8192});
    let agent = |name: &str, extra: Value| {
        let mut def = json!({
            "model": scripted,
            "system_prompt": format!("You are {name}."),
            "limits": {"timeout_s": 600},
        });
        if let (Some(d), Value::Object(e)) = (def.as_object_mut(), extra) {
            d.extend(e);
        }
        (format!("/v1/agents/{name}"), def)
    };
    let puts = [
        agent(
            EFFECTS_AGENT,
            json!({"skills": ["http_request"], "http_allow_hosts": [receiver]}),
        ),
        agent(
            APPROVALS_AGENT,
            json!({"skills": ["http_request"], "http_allow_hosts": [receiver],
                "approvals": {"require": ["http_request"]}}),
        ),
        agent(LEAD, json!({"skills": ["current_time"]})),
        (
            format!("/v1/teams/{FAN_OUT_TEAM}"),
            json!({"members": ["assistant", "researcher", "coder", "operator", "orchestrator"],
                "strategy": "fan_out", "aggregator": "assistant", "failure_policy": "best_effort"}),
        ),
        (
            format!("/v1/teams/{LEAD_TEAM}"),
            json!({"members": ["assistant", "researcher"], "strategy": "lead", "lead": LEAD}),
        ),
    ];
    for (path, body) in &puts {
        let (status, v) = api
            .send(Method::PUT, path, Some(body), None, Who::Admin)
            .await?;
        if status >= 300 {
            bail!("PUT {path}: {status} {v}");
        }
    }
    let path = format!("/v1/tenants/{tenant}/keys");
    let (status, v) = api
        .send(
            Method::POST,
            &path,
            Some(&json!({"role": "approver"})),
            None,
            Who::Admin,
        )
        .await?;
    v["key"]
        .as_str()
        .filter(|_| status < 300)
        .map(str::to_string)
        .ok_or_else(|| anyhow!("POST {path}: {status} {v}"))
}

/// A POST to the receiver, as a tool call's arguments.
fn effect_call(api: &Api, what: String) -> Value {
    json!({"name": "http_request",
        "args": {"url": api.effect_url, "method": "POST", "body": what}})
}

/// How long a job waits for its Run to ask for an approval: the
/// approvals agent's timeout.
const ASKING_PATIENCE: Duration = Duration::from_secs(600);

/// Waits for the Run's approval request and decides it; `None` when the
/// Run ended without asking.
async fn decide(api: &Api, run_id: &str, approve: bool) -> Result<Option<Decided>> {
    let start = Instant::now();
    let asked = loop {
        let path = format!("/v1/runs/{run_id}/events?after=0");
        let (status, v) = api
            .send(Method::GET, &path, None, None, Who::Tenant)
            .await?;
        if status != 200 {
            bail!("GET {path}: {status} {v}");
        }
        let page: EventsPage = serde_json::from_value(v)?;
        let request = page.events.iter().find_map(|e| match &e.event {
            LogEvent::ApprovalRequested {
                approval_id,
                call_id,
                ..
            } => Some((approval_id.clone(), call_id.clone())),
            _ => None,
        });
        if request.is_some() {
            break request;
        }
        if page.events.iter().any(|e| e.kind().is_terminal()) {
            break None;
        }
        // As long as a Run may take to get there (its agent's timeout):
        // under faults its first step can wait on a kill or two.
        if start.elapsed() > ASKING_PATIENCE {
            bail!("{run_id} asked for no approval within {ASKING_PATIENCE:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let Some((approval_id, call_id)) = asked else {
        return Ok(None);
    };
    let decision = if approve { "approve" } else { "reject" };
    let path = format!("/v1/approvals/{approval_id}/decision");
    let body = json!({"decision": decision, "comment": "chaos"});
    let (status, v) = api
        .send(Method::POST, &path, Some(&body), None, Who::Approver)
        .await?;
    // 409: decided already (an earlier try of this one whose answer was
    // lost with the host); the checker finds out whether it was applied
    // once.
    if status >= 300 && status != 409 {
        bail!("POST {path}: {status} {v}");
    }
    Ok(Some(Decided {
        run_id: run_id.to_string(),
        approval_id,
        call_id,
        approved: approve,
    }))
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
        decided: vec![],
    };
    Ok(match job.shape {
        Shape::Single => {
            let body = json!({"agent": "assistant", "input": format!("question {i}"),
                "callback_url": api.callback_url});
            one(vec![api.start("/v1/runs", body, &idem("run")).await?])
        }
        Shape::Effect => {
            let calls = json!([
                effect_call(api, format!("charge {i}")),
                effect_call(api, format!("notify {i}")),
            ]);
            let body = json!({"agent": EFFECTS_AGENT, "input": format!("/tools {calls}"),
                "callback_url": api.callback_url});
            one(vec![api.start("/v1/runs", body, &idem("run")).await?])
        }
        Shape::Approval => {
            let calls = json!([effect_call(api, format!("launch {i}"))]);
            let body = json!({"agent": APPROVALS_AGENT, "input": format!("/tools {calls}")});
            let run_id = api.start("/v1/runs", body, &idem("run")).await?;
            let decided = decide(api, &run_id, job.approve).await?;
            Started {
                decided: decided.into_iter().collect(),
                ..one(vec![run_id])
            }
        }
        Shape::Sandbox => {
            let file = format!("effects-{tag}-{i}.txt");
            let command = format!("echo effect >> {file}; cat {file}");
            let calls = json!([{"name": "shell_exec", "args": {"command": command}}]);
            let body = json!({"agent": SANDBOX_AGENT, "input": format!("/tools {calls}")});
            one(vec![api.start("/v1/runs", body, &idem("run")).await?])
        }
        Shape::Lead => {
            let plan = json!({"tasks": [
                {"agent": "assistant", "task": format!("write part a of {i}")},
                {"agent": "researcher", "task": format!("find sources for {i}")},
            ]});
            let body = json!({"team": LEAD_TEAM, "input": format!("/tool plan {plan}")});
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
                    Who::Tenant,
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
                    Who::Tenant,
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
                session: Some(session),
                ..one(runs)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_is_one_workload_of_every_shape() {
        let a = plan(&mut Rng::new(42), 200, true);
        let b = plan(&mut Rng::new(42), 200, true);
        let shapes = |p: &[Job]| p.iter().map(|j| j.shape).collect::<Vec<_>>();
        assert_eq!(shapes(&a), shapes(&b));
        for s in [
            Shape::Single,
            Shape::Session,
            Shape::Delegation,
            Shape::FanOut,
            Shape::Chain,
            Shape::Cancel,
            Shape::Effect,
            Shape::Approval,
            Shape::Lead,
            Shape::Sandbox,
        ] {
            assert!(a.iter().any(|j| j.shape == s), "{s:?}");
        }
        assert!(a.iter().all(|j| (3..=5).contains(&j.messages)));
        let approvals = a.iter().filter(|j| j.shape == Shape::Approval);
        assert!(approvals.clone().any(|j| j.approve) && approvals.clone().any(|j| !j.approve));
        assert_ne!(shapes(&a), shapes(&plan(&mut Rng::new(43), 200, true)));
        let without = plan(&mut Rng::new(42), 200, false);
        assert!(without.iter().all(|j| j.shape != Shape::Sandbox));
        assert_eq!(without.len(), 200);
    }
}
