//! The in-memory stack the dispatcher's end-to-end unit tests drive: the
//! harness and the dispatcher handing each other's messages.

use std::sync::Arc;

use armada_core::memory::fixtures::{accepted_run, sqs_event};
use armada_core::memory::{test_config, Memory};
use armada_domain::run::Payload;
use armada_domain::team::TeamDefinition;
use armada_harness::Harness;

use super::*;
use armada_domain::messages::HarnessMessage;

pub(crate) const TENANT: &str = "acme";

pub(crate) struct Stack {
    pub(crate) svc: Arc<Services>,
    pub(crate) mem: Arc<Memory>,
    pub(crate) harness: Harness,
    pub(crate) dispatcher: Dispatcher,
}

impl Stack {
    pub(crate) fn new() -> Stack {
        Self::with(|_| {})
    }

    /// The stack of a deployment configured by `edit`.
    pub(crate) fn with(edit: impl FnOnce(&mut armada_core::config::Config)) -> Stack {
        let mut cfg = test_config();
        edit(&mut cfg);
        let (svc, mem) = Services::in_memory(cfg);
        Stack {
            harness: Harness::new(svc.clone()),
            dispatcher: Dispatcher::new(svc.clone()),
            svc,
            mem,
        }
    }

    /// The stack of a deployment whose functions die once at `point`.
    pub(crate) fn dying_at(point: armada_core::faults::FaultPoint) -> Stack {
        let (svc, mem) = Services::in_memory(test_config());
        let mut dying = (*svc).clone();
        dying.faults = Arc::new(armada_core::faults::DiesOnceAt::new(point));
        let svc = Arc::new(dying);
        Stack {
            harness: Harness::new(svc.clone()),
            dispatcher: Dispatcher::new(svc.clone()),
            svc,
            mem,
        }
    }

    /// What is queued for the harness and the dispatcher (taken), the
    /// watchdog's checks set aside.
    fn queued(&self) -> (Vec<HarnessMessage>, Vec<DispatchMessage>) {
        let dispatch = self
            .mem
            .take_dispatch()
            .into_iter()
            .filter(|m| !matches!(m, DispatchMessage::CheckRun { .. }))
            .collect();
        (self.mem.take_harness(), dispatch)
    }

    /// As [`Stack::pump`], with a message whose handler died handed again,
    /// as SQS would once its visibility timeout passed; how many died.
    pub(crate) async fn pump_redelivering(&self) -> usize {
        let mut died = 0;
        for _ in 0..500 {
            let (harness, dispatch) = self.queued();
            if harness.is_empty() && dispatch.is_empty() {
                return died;
            }
            for m in harness {
                let body = serde_json::to_string(&m).unwrap_or_default();
                let event = || sqs_event(&self.svc.cfg.harness_queue, std::slice::from_ref(&body));
                if self.harness.handle_event(event()).await.is_err() {
                    died += 1;
                    self.harness.handle_event(event()).await.expect("handled");
                }
            }
            for m in dispatch {
                if self.to_dispatcher(&m).await > 0 {
                    died += 1;
                    assert_eq!(self.to_dispatcher(&m).await, 0, "handled again: {m:?}");
                }
            }
        }
        panic!("the messages never settled");
    }

    /// Hands every queued message to its consumer, one at a time, until
    /// none is left; the watchdog's checks are set aside.
    pub(crate) async fn pump(&self) {
        for _ in 0..500 {
            let (harness, dispatch) = self.queued();
            if harness.is_empty() && dispatch.is_empty() {
                return;
            }
            for m in harness {
                self.to_harness(&m).await;
            }
            for m in dispatch {
                self.to_dispatcher(&m).await;
            }
        }
        panic!("the messages never settled");
    }

    /// Hands the harness what is queued for it, once.
    pub(crate) async fn harness_pass(&self) {
        for m in self.mem.take_harness() {
            self.to_harness(&m).await;
        }
    }

    pub(crate) async fn to_harness(&self, m: &HarnessMessage) {
        let body = serde_json::to_string(m).unwrap_or_default();
        let event = sqs_event(&self.svc.cfg.harness_queue, &[body]);
        self.harness.handle_event(event).await.expect("handled");
    }

    pub(crate) async fn to_dispatcher(&self, m: &DispatchMessage) -> usize {
        let body = serde_json::to_string(m).unwrap_or_default();
        let event = sqs_event(&self.svc.cfg.dispatch_queue, &[body]);
        self.dispatcher
            .handle_event(event)
            .await
            .batch_item_failures
            .len()
    }

    /// A Run of `agent_name` (as a team's, with `team`), accepted as
    /// ingress accepts it.
    async fn accepted(&self, agent_name: &str, input: &str, team: Option<TeamDefinition>) -> Run {
        let def = self.svc.registry.agent(agent_name).await.ok().flatten();
        let mut run = accepted_run(&self.svc, TENANT, &def.expect("agent"), input).await;
        if team.is_some() {
            let prev = run.stamp();
            run.team = team;
            self.svc
                .runs
                .save(prev, &run, &[], vec![])
                .await
                .expect("saved");
        }
        run
    }

    fn start_message(run: &Run) -> DispatchMessage {
        DispatchMessage::StartRun {
            run_id: run.run_id.clone(),
            tenant: TENANT.into(),
        }
    }

    /// Accepts a Run and hands its start to the dispatcher.
    pub(crate) async fn start(
        &self,
        agent_name: &str,
        input: &str,
        team: Option<TeamDefinition>,
    ) -> Run {
        let run = self.accepted(agent_name, input, team).await;
        self.to_dispatcher(&Self::start_message(&run)).await;
        run
    }

    /// Accepts a Run and queues its start, for the next pump.
    pub(crate) async fn queue_start(
        &self,
        agent_name: &str,
        input: &str,
        team: Option<TeamDefinition>,
    ) -> Run {
        let run = self.accepted(agent_name, input, team).await;
        self.svc
            .queues
            .send_dispatch(&Self::start_message(&run))
            .await
            .expect("queued");
        run
    }

    pub(crate) fn run(&self, id: &str) -> Run {
        self.mem.state().runs[id].clone()
    }

    pub(crate) fn output(&self, id: &str) -> String {
        match self.run(id).output {
            Some(Payload::Inline { text }) => text,
            other => panic!("no inline output: {other:?}"),
        }
    }

    pub(crate) fn children(&self, id: &str) -> Vec<Run> {
        let ids: Vec<String> = self
            .run(id)
            .children
            .map(|c| c.slots.into_iter().map(|s| s.run_id).collect())
            .unwrap_or_default();
        ids.iter().map(|i| self.run(i)).collect()
    }

    pub(crate) fn kinds(&self, id: &str) -> Vec<String> {
        self.mem.state().events[id]
            .values()
            .map(|e| e.kind().as_str().to_string())
            .collect()
    }
}
