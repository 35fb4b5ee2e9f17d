//! Sequential relay chains, the dispatcher's part: when a step's Run is
//! settled, the next step is created (once: its id is the chain's and its
//! index's) with the step's output as its input and started; or the chain
//! ends here, broken (the steps after it skipped) or done, and the chain's
//! callback hears it.

use crate::Dispatcher;
use crate::Handled;
use armada_core::batch::Outcome;
use armada_core::error::StoreError;
use armada_core::Also;
use armada_domain::collab::chain::{self, step_run_id, AfterStep, ChainLink};
use armada_domain::collab::descendants;
use armada_domain::messages::DispatchMessage;
use armada_domain::run::Run;
use armada_domain::run::RunEventRecord;
use armada_domain::run::Trigger;
use armada_domain::run::{Created, LogEvent};
use serde_json::json;

impl Dispatcher {
    /// Settling a chain step: `events` are the step's closing events (the
    /// chain's break, its callback's delivery are added to them).
    pub(crate) async fn advance_chain(
        &self,
        run: &mut Run,
        events: &mut Vec<RunEventRecord>,
    ) -> Handled {
        let Some(link) = run.chain.clone() else {
            return Ok(Outcome::Done);
        };
        let now = self.svc.clock.now_ms();
        let room = descendants::next_step(run, self.svc.cfg.max_descendants_per_root);
        match chain::after_step(&link, run.state().outcome(), room) {
            AfterStep::Next {
                index,
                agent,
                descendants,
            } => {
                let next_id = self.start_next_step(run, &agent, descendants, now).await?;
                tracing::info!(run_id = %run.run_id, next = %next_id, index, "chain step started");
                let started = LogEvent::ChainStepStarted {
                    chain_id: link.chain_id.clone(),
                    index,
                    agent: agent.clone(),
                    run_id: next_id,
                };
                events.push(run.push_event(started, now));
                Ok(Outcome::Done)
            }
            AfterStep::Ended {
                state,
                skipped,
                cause,
            } => {
                if !skipped.is_empty() {
                    tracing::warn!(run_id = %run.run_id, chain_id = %link.chain_id, ?skipped, cause, "chain broken");
                    let broken = LogEvent::ChainBroken {
                        chain_id: link.chain_id.clone(),
                        index: link.index,
                        state: run.state().outcome(),
                        skipped: skipped.clone(),
                        code: cause.map(str::to_string),
                    };
                    events.push(run.push_event(broken, now));
                }
                let secret = &self.svc.cfg.callback_signing_secret;
                if link.callback_url.is_some() {
                    // Delivered from the delivery queue once this step is
                    // closed, as a Run's own callback is.
                    let msg = DispatchMessage::deliver_chain_callback(
                        secret,
                        &run.run_id,
                        &run.tenant,
                        state,
                    );
                    self.svc.queues.send_routed(&msg).await?;
                }
                if self.mail_of(run).await?.is_some() {
                    // The chain's mail is answered with how it ended.
                    let msg = DispatchMessage::send_reply(secret, &run.run_id, &run.tenant);
                    self.svc.queues.send_routed(&msg).await?;
                }
                Ok(Outcome::Done)
            }
        }
    }

    /// Creates (once) and starts the step after `run`, with `descendants`
    /// as its allowance; its Run id.
    async fn start_next_step(
        &self,
        run: &Run,
        agent: &str,
        descendants: u32,
        now: i64,
    ) -> Result<String, StoreError> {
        let output = match &run.output {
            Some(p) => self.svc.payloads.read(p).await?,
            None => String::new(),
        };
        let text = chain::next_input(run, &output, &chain::artifacts(run));
        let def = self.svc.registry.agent(agent).await?;
        let link = run.chain.as_ref().map(ChainLink::next);
        let next_id = link
            .as_ref()
            .map(|l| step_run_id(&l.chain_id, l.index as usize))
            .unwrap_or_default();
        let key = format!("inputs/{}/{next_id}", run.tenant);
        let input = self
            .svc
            .payloads
            .spill(&key, &text, self.svc.cfg.inline_limit_bytes)
            .await?;
        let Some(mut next) = chain::next_step(run, agent, def.as_ref(), input, descendants, now)
        else {
            return Ok(next_id);
        };
        let created = LogEvent::RunCreated(Created {
            agent: agent.to_string(),
            trigger: Some(next.trigger()),
            chain_id: link.as_ref().map(|l| l.chain_id.clone()),
            index: link.as_ref().map(|l| l.index),
            previous_run_id: Some(run.run_id.clone()),
            ..Created::default()
        });
        let created = next.push_event(created, now);
        // The chain keeps its place among its tenant's active Runs: the
        // step before gives its marker back as it is settled.
        let marker = vec![Also::active_run(&next)];
        match self.svc.runs.create(&next, &[created], marker).await {
            Ok(()) | Err(StoreError::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
        self.svc
            .queues
            .send_dispatch(&DispatchMessage::StartRun {
                run_id: next_id.clone(),
                tenant: run.tenant.clone(),
            })
            .await?;
        Ok(next_id)
    }

    /// The mail that started `run`, or the relay chain it is a step of.
    pub(crate) async fn mail_of(&self, run: &Run) -> Result<Option<Trigger>, StoreError> {
        let first = match (&run.started_from, &run.chain) {
            (Some(t @ Trigger::Email { .. }), _) => return Ok(Some(t.clone())),
            (_, Some(link)) if link.index > 0 => {
                self.svc.runs.get(&step_run_id(&link.chain_id, 0)).await?
            }
            _ => None,
        };
        Ok(first
            .and_then(|r| r.started_from)
            .filter(|t| matches!(t, Trigger::Email { .. })))
    }

    /// What the chain's callback hears: the chain, every step, and the
    /// last step's output or the breaking step's error.
    pub(crate) async fn chain_result(
        &self,
        run: &Run,
        link: &ChainLink,
        state: chain::ChainState,
    ) -> Result<serde_json::Value, StoreError> {
        let mut runs = Vec::with_capacity(link.steps.len());
        for i in 0..link.steps.len() {
            runs.push(if i == link.index as usize {
                Some(run.clone())
            } else {
                self.svc.runs.get(&step_run_id(&link.chain_id, i)).await?
            });
        }
        let refs: Vec<Option<&Run>> = runs.iter().map(Option::as_ref).collect();
        let (_, steps) = chain::view(&link.steps, &refs);
        let output = match (&run.output, state) {
            (Some(p), chain::ChainState::Completed) => Some(self.svc.payloads.read(p).await?),
            _ => None,
        };
        Ok(json!({
            "chain_id": link.chain_id,
            "team": link.team,
            "state": state,
            "steps": steps,
            "output": output,
            "error": run.error,
            "metadata": run.metadata,
        }))
    }
}
