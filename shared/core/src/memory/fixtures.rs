//! What the handlers' unit tests build over and over: an agent in the
//! registry, an accepted Run, an SQS event carrying messages as Lambda
//! would deliver them.

use std::collections::HashMap;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use serde_json::json;

use armada_domain::agent::AgentDefinition;
use armada_domain::run::{Created, LogEvent, NewRun, Payload, Run};
use armada_domain::session::{OnBusy, SessionHeader};

use crate::ports::Also;

use crate::Services;

/// Puts an agent on the scripted model with `skills` into the registry.
pub async fn agent(svc: &Services, name: &str, skills: &[&str]) -> AgentDefinition {
    let body = json!({
        "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 8192},
        "system_prompt": "You help.",
        "skills": skills,
    });
    let def = AgentDefinition::from_json(name, &body)
        .unwrap_or_else(|e| panic!("test agent {name}: {e}"));
    svc.registry
        .put_agent(&def)
        .await
        .unwrap_or_else(|e| panic!("storing test agent {name}: {e}"));
    def
}

/// Accepts a Run of `agent` for `tenant` (PENDING, with its `run_created`
/// event and its tenant's marker of an active Run), as ingress would.
pub async fn accepted_run(
    svc: &Services,
    tenant: &str,
    agent: &AgentDefinition,
    input: &str,
) -> Run {
    accept(svc, tenant, agent, input, None).await
}

/// Opens a session of `agent` for `tenant` (messages queue while busy).
pub async fn session(svc: &Services, tenant: &str, agent: &AgentDefinition) -> SessionHeader {
    let h = SessionHeader {
        session_id: crate::clock::new_id("ses"),
        tenant: tenant.to_string(),
        agent: agent.name.clone(),
        on_busy: OnBusy::Queue,
        next_seq: 0,
        done_seq: 0,
        created_at_ms: svc.clock.now_ms(),
    };
    svc.sessions
        .create(&h)
        .await
        .unwrap_or_else(|e| panic!("creating a test session: {e}"));
    h
}

/// Accepts the next message of a session as its Run, as ingress would.
pub async fn session_message(
    svc: &Services,
    session_id: &str,
    agent: &AgentDefinition,
    input: &str,
) -> Run {
    let h = svc
        .sessions
        .header(session_id)
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no test session {session_id}"));
    let tenant = h.tenant.clone();
    accept(svc, &tenant, agent, input, Some(h)).await
}

async fn accept(
    svc: &Services,
    tenant: &str,
    agent: &AgentDefinition,
    input: &str,
    session: Option<SessionHeader>,
) -> Run {
    let now = svc.clock.now_ms();
    let mut run = Run::new(
        NewRun {
            run_id: crate::clock::new_id("run"),
            tenant: tenant.to_string(),
            agent: agent.name.clone(),
            input: Payload::Inline {
                text: input.to_string(),
            },
            session: session
                .as_ref()
                .map(|h| (h.session_id.clone(), h.next_seq + 1)),
            parent_run_id: None,
            callback_url: None,
            metadata: json!({}),
            limits: agent.limits,
            prewarm_sandbox: false,
        },
        now,
    );
    let created = LogEvent::RunCreated(Created {
        agent: agent.name.clone(),
        ..Created::default()
    });
    let created = run.push_event(created, now);
    let also = session
        .map(|header| Also::SessionMessage {
            header,
            run_id: run.run_id.clone(),
        })
        .into_iter()
        .chain([Also::active_run(&run)])
        .collect();
    svc.runs
        .create(&run, &[created], also)
        .await
        .unwrap_or_else(|e| panic!("creating a test run: {e}"));
    run
}

/// An SQS event with one record per body, from the queue named `queue`,
/// each on its first delivery.
pub fn sqs_event(queue: &str, bodies: &[String]) -> SqsEvent {
    let records = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            let mut m = SqsMessage::default();
            m.message_id = Some(format!("m{i}"));
            m.receipt_handle = Some(format!("r{i}"));
            m.body = Some(body.clone());
            m.attributes =
                HashMap::from([("ApproximateReceiveCount".to_string(), "1".to_string())]);
            m.event_source_arn = Some(format!("arn:aws:sqs:us-east-1:000000000000:{queue}"));
            m
        })
        .collect();
    let mut event = SqsEvent::default();
    event.records = records;
    event
}
