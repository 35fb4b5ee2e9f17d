//! Calls answered by child Runs (`delegate`, `plan`): the agents they name
//! are looked up for [`decide`], and a step that plans children ends by
//! waiting for them. The step never waits inside its invocation: it
//! commits `AWAITING_CHILDREN` (holding nothing but its record: its
//! sandbox, if it held one, goes to the next Run waiting for it) and asks
//! the dispatcher to create and start the children; their ends are the
//! dispatcher's to record.

use std::collections::{BTreeMap, BTreeSet};

use crate::FaultPoint;
use crate::Harness;
use crate::StepError;
use armada_core::error::StoreError;
use armada_core::services::sandboxing;
use armada_domain::agent::AgentDefinition;
use armada_domain::chat::ChatMessage;
use armada_domain::collab::child_run_id;
use armada_domain::collab::delegate::{agents_named, parse_delegate};
use armada_domain::collab::resume::{self, ResumePlan};
use armada_domain::collab::CallError;
use armada_domain::context;
use armada_domain::ledger::ToolCallRecord;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::EventKind;
use armada_domain::run::Run;
use armada_domain::run::RunError;
use armada_domain::run::RunEvent;
use armada_domain::run::RunEventRecord;
use armada_domain::run::Stamp;
use armada_domain::skills;
use armada_domain::step::manifest_for;

impl Harness {
    /// The registered agents among those `calls` name.
    pub(crate) async fn known_agents(
        &self,
        run: &Run,
        agent: &AgentDefinition,
        calls: &[ToolCallRecord],
    ) -> Result<BTreeSet<String>, StepError> {
        let mut named = BTreeSet::new();
        for c in calls {
            let executor = manifest_for(run, agent, &c.skill)
                .map(|m| m.executor().to_string())
                .unwrap_or_default();
            named.extend(agents_named(&executor, &c.args));
        }
        let mut known = BTreeSet::new();
        for name in named {
            if self.svc.registry.agent(&name).await?.is_some() {
                known.insert(name);
            }
        }
        Ok(known)
    }

    /// The verdicts on the calls that resume a finished Run, by call id:
    /// the source read (its record, its transcript) and checked; a passing
    /// resume's transcript is copied for its child before the child exists.
    pub(crate) async fn resume_checks(
        &self,
        run: &Run,
        agent: &AgentDefinition,
        calls: &[ToolCallRecord],
    ) -> Result<BTreeMap<String, Result<ResumePlan, CallError>>, StepError> {
        let svc = &self.svc;
        let mut verdicts = BTreeMap::new();
        for c in calls {
            let executor = manifest_for(run, agent, &c.skill)
                .map(|m| m.executor().to_string())
                .unwrap_or_default();
            if executor != skills::DELEGATE {
                continue;
            }
            let Ok(args) = parse_delegate(&c.args) else {
                continue;
            };
            let (Some(source_id), Some(target)) = (
                args.resume_from.as_deref(),
                svc.registry.agent(&args.agent).await?,
            ) else {
                continue;
            };
            let source = svc.runs.get(source_id).await?;
            let transcript = match source.as_ref().filter(|s| s.tenant == run.tenant) {
                Some(s) => self.read_transcript(s).await?,
                None => Err("not found".to_string()),
            };
            let mut verdict = resume::check(
                &run.tenant,
                source_id,
                source.as_ref(),
                &target,
                transcript.as_deref().map_err(String::as_str),
                args.model.as_deref(),
            );
            if let (Ok(plan), Ok(messages)) = (verdict.as_mut(), transcript.as_ref()) {
                let child = child_run_id(&run.run_id, &c.call_id, 0);
                plan.transcript_key = resume::transcript_key(&run.tenant, &child);
                let copy = serde_json::to_string(messages).unwrap_or_default();
                svc.payloads.put_text(&plan.transcript_key, &copy).await?;
            }
            verdicts.insert(c.call_id.clone(), verdict);
        }
        Ok(verdicts)
    }

    /// A finished Run's conversation (its input, tool rounds and answer);
    /// `Err`: it cannot be read (what is missing), which fails a resume
    /// closed. A store that is only briefly unavailable retries the step.
    async fn read_transcript(
        &self,
        source: &Run,
    ) -> Result<Result<Vec<ChatMessage>, String>, StepError> {
        let svc = &self.svc;
        let unreadable = |what: &str, e: StoreError| -> Result<String, StepError> {
            if e.is_retryable() {
                return Err(StepError::Retry(e.to_string()));
            }
            Ok(format!("{what}: {e}"))
        };
        let input = match svc.payloads.read(&source.input).await {
            Ok(t) => t,
            Err(e) => return Ok(Err(unreadable("its input", e)?)),
        };
        let output = match &source.output {
            Some(p) => match svc.payloads.read(p).await {
                Ok(t) => t,
                Err(e) => return Ok(Err(unreadable("its answer", e)?)),
            },
            None => return Ok(Err("it has no answer".into())),
        };
        let log = match svc.run_events.all_events(&source.run_id).await {
            Ok(log) => log,
            Err(e) => return Ok(Err(unreadable("its events", e)?)),
        };
        if !log.iter().any(|e| e.kind() == EventKind::RunCreated) {
            return Ok(Err("its events have expired".into()));
        }
        let transcript = context::transcript(&input, &log);
        Ok(Ok(resume::source_transcript(transcript, &output)))
    }

    /// The copied transcript a resumed Run starts from; `Err` fails it
    /// closed (`RESUME_UNREADABLE`).
    pub(crate) async fn resumed_transcript(
        &self,
        run: &Run,
    ) -> Result<Result<Vec<ChatMessage>, RunError>, StepError> {
        let Some(from) = &run.resumed else {
            return Ok(Ok(vec![]));
        };
        let fail = |why: String| {
            Ok(Err(RunError::new(
                resume::RESUME_UNREADABLE,
                format!(
                    "the transcript copied from run '{}' could not be read: {why}",
                    from.source_run_id
                ),
            )))
        };
        match self.svc.payloads.get_text(&from.transcript_key).await {
            Ok(text) => match serde_json::from_str(&text) {
                Ok(messages) => Ok(Ok(messages)),
                Err(e) => fail(e.to_string()),
            },
            Err(e) if e.is_retryable() => Err(StepError::Retry(e.to_string())),
            Err(e) => fail(e.to_string()),
        }
    }

    /// The step's children are planned (or, on a redelivery, still out):
    /// let go of the sandbox, commit the wait, have them started.
    pub(crate) async fn await_children(
        &self,
        mut run: Run,
        prev: Stamp,
        events: Vec<RunEventRecord>,
    ) -> Result<(), StepError> {
        let svc = &self.svc;
        if run.sandbox_key.is_some() {
            // A child of the same agent would otherwise wait for the very
            // sandbox its parent holds while waiting for it.
            sandboxing::release_and_wake(svc, &run).await?;
        }
        let now = svc.clock.now_ms();
        run.apply(RunEvent::AwaitChildren, now)?;
        svc.runs.save(prev, &run, &events, vec![]).await?;
        self.svc
            .faults
            .at(FaultPoint::AfterCommit, &run.run_id)
            .await
            .map_err(StepError::Aborted)?;
        let round = run.children.as_ref().map_or(0, |c| c.round);
        tracing::info!(run_id = %run.run_id, round, outstanding = run.outstanding_children(), "waiting for children");
        svc.queues
            .send_dispatch(&DispatchMessage::SpawnChildren {
                run_id: run.run_id.clone(),
                tenant: run.tenant.clone(),
                round,
            })
            .await
            .map_err(|e| StepError::Retry(format!("children not started: {e}")))?;
        self.check_later(&run).await
    }
}
