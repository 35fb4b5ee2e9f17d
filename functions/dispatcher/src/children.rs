//! Collaboration, the dispatcher's part (T2: expansion and waiting). A
//! parent waits in `AWAITING_CHILDREN` with its children listed on its
//! record; this file creates and starts them (within the waiting point's
//! `max_parallel`), expands a fan-out team's Run into its members, sends
//! each child's end to its parent's FIFO group (where the harness notes it:
//! the counter, round 2), and cancels the children of a parent that ended.
//!
//! A start is sent before the parent's record says so: a start is
//! harmless to repeat (the dispatcher drops a second one), a record saying
//! "started" about a child that never was would not be.

use std::collections::HashMap;

use crate::DispatchError;
use crate::Dispatcher;
use crate::Handled;
use armada_core::batch::Outcome;
use armada_core::cas::until_written;
use armada_core::cas::Try;
use armada_core::error::StoreError;
use armada_core::faults::FaultPoint;
use armada_core::services::ending::{self, EndOutcome};
use armada_core::services::unreadable::Ending;
use armada_domain::agent::AgentDefinition;
use armada_domain::collab::children;
use armada_domain::collab::{codes as collab_codes, SlotState};
use armada_domain::messages::DispatchMessage;
use armada_domain::messages::HarnessMessage;
use armada_domain::run::Run;
use armada_domain::run::RunError;
use armada_domain::run::RunEvent;
use armada_domain::run::RunState;
use armada_domain::run::{Created, EndNote, LogEvent};
use armada_domain::team::Strategy;

impl Dispatcher {
    /// `SpawnChildren`: the children of waiting point `round` that do not
    /// exist yet are created, and as many as `max_parallel` allows started.
    pub(crate) async fn spawn_children(&self, run_id: &str, tenant: &str, round: u32) -> Handled {
        let tried = until_written::<_, DispatchError, _>(|| async {
            let Some(parent) = self.load(run_id, tenant).await? else {
                return Ok(Try::Done(Outcome::Done));
            };
            let current = parent.children.as_ref().map_or(0, |c| c.round);
            if parent.state() != RunState::AwaitingChildren || current != round {
                tracing::info!(run_id, state = %parent.state(), round, current, "children's start for a parent that moved on dropped");
                return Ok(Try::Done(Outcome::Done));
            }
            let created = self.create_children(&parent).await?;
            if created != Outcome::Done {
                return Ok(Try::Done(created));
            }
            let now = self.svc.clock.now_ms();
            let mut next = parent.clone();
            let (start, events) = children::start_queued(&mut next, now);
            if start.is_empty() {
                return Ok(Try::Done(Outcome::Done));
            }
            self.send_starts(&start, tenant).await?;
            if self
                .svc
                .faults
                .at(FaultPoint::AfterChildSpawn, run_id)
                .await
                .is_err()
            {
                // Died here: the parent is left as it was, for the
                // redelivery (the children exist; their starts are sent).
                return Ok(Try::Done(Outcome::Abandoned));
            }
            match self
                .svc
                .runs
                .save(parent.stamp(), &next, &events, vec![])
                .await
            {
                Ok(()) => {
                    tracing::info!(run_id, round, started = start.len(), "children started");
                    Ok(Try::Done(Outcome::Done))
                }
                Err(StoreError::Conflict { .. }) => Ok(Try::Again),
                Err(e) => Err(e.into()),
            }
        })
        .await?;
        match tried {
            Some(done) => Ok(done),
            None => Ok(Outcome::retry("the parent kept changing")),
        }
    }

    /// Creates the Runs of the current waiting point's children that are
    /// not created yet (each is created once: its id is fixed by its slot).
    async fn create_children(&self, parent: &Run) -> Handled {
        let Some(c) = parent.children.as_ref() else {
            return Ok(Outcome::Done);
        };
        let now = self.svc.clock.now_ms();
        let mut agents: HashMap<String, Option<AgentDefinition>> = HashMap::new();
        let mut runs = Vec::new();
        for slot in c.slots.iter().filter(|s| s.round == c.round) {
            if slot.state() != SlotState::Queued {
                continue;
            }
            if !agents.contains_key(&slot.agent) {
                let def = self.svc.registry.agent(&slot.agent).await?;
                agents.insert(slot.agent.clone(), def);
            }
            // An agent deleted since its child was planned: the child is
            // created all the same and fails at its first step, naming it.
            let def = agents.get(&slot.agent).cloned().flatten();
            let mut child = children::new_child(parent, slot, def.as_ref(), now);
            let lineage = child.lineage();
            let created = LogEvent::RunCreated(Created {
                agent: child.agent.clone(),
                trigger: Some(child.trigger()),
                parent_run_id: Some(parent.run_id.clone()),
                kind: Some(lineage.kind),
                depth: Some(lineage.depth),
                ..Created::default()
            });
            let created = child.push_event(created, now);
            let mut events = vec![created];
            if let Some(plan) = &slot.resume {
                // What it took over, and the model it keeps (the source's,
                // whatever was asked for instead).
                let resumed = LogEvent::ResumedFrom {
                    source_run_id: plan.source_run_id.clone(),
                    messages: plan.messages as u64,
                    tokens: plan.tokens,
                    model: plan.identity.model.model_id.clone(),
                    model_ignored: plan.model_ignored.clone(),
                };
                events.push(child.push_event(resumed, now));
            }
            runs.push((child, events));
        }
        // Created side by side: a 25-member team is not 25 round trips
        // one after another.
        let creates = runs
            .iter()
            .map(|(child, events)| self.svc.runs.create(child, events, vec![]));
        for created in futures::future::join_all(creates).await {
            match created {
                Ok(()) | Err(StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Outcome::Done)
    }

    /// Sends the children's starts, side by side.
    async fn send_starts(&self, ids: &[String], tenant: &str) -> Result<(), StoreError> {
        let msgs: Vec<DispatchMessage> = ids
            .iter()
            .map(|id| DispatchMessage::StartRun {
                run_id: id.clone(),
                tenant: tenant.to_string(),
            })
            .collect();
        let sends = msgs.iter().map(|m| self.svc.queues.send_dispatch(m));
        futures::future::join_all(sends).await.into_iter().collect()
    }

    /// Round 1 of a fan-out team's Run, instead of its first step.
    pub(crate) async fn expand(&self, run: Run) -> Handled {
        let now = self.svc.clock.now_ms();
        let mut next = run.clone();
        let max = self.svc.cfg.max_descendants_per_root;
        let events = match children::expand_team(&mut next, max, now) {
            Ok(events) => events,
            // More members than the tree may have: the team's Run fails,
            // saying so, and is settled like any other.
            Err(e @ children::ExpandRefused::TooManyDescendants { .. }) => {
                tracing::warn!(run_id = %run.run_id, error = %e, "team run refused");
                let code = e.code().unwrap_or(collab_codes::TOO_MANY_DESCENDANTS);
                let event = RunEvent::Failed {
                    error: RunError::new(code, e.to_string()),
                };
                return match self.end_from_outside(run, event, EndNote::default()).await {
                    // Announcing its end is settling it, here and now.
                    Ok(Ok(_)) => self.settle(&next.run_id, &next.tenant).await,
                    Ok(Err(e)) => Ok(self.illegal(&next.run_id, &e)),
                    Err(e) => Err(e.into()),
                };
            }
            Err(e) => {
                tracing::error!(run_id = %run.run_id, error = %e, "team run not expanded; dropped");
                return Ok(Outcome::Done);
            }
        };
        match self
            .svc
            .runs
            .save(run.stamp(), &next, &events, vec![])
            .await
        {
            Ok(()) => {
                // The team's Run waits: the watchdog keeps its deadline.
                let check = DispatchMessage::CheckRun {
                    run_id: next.run_id.clone(),
                    tenant: next.tenant.clone(),
                    step: next.step,
                    epoch: next.epoch,
                    n: 0,
                };
                let delay = self.svc.cfg.sandbox.check_seconds;
                self.svc.queues.send_dispatch_delayed(&check, delay).await?;
            }
            // Someone else expanded it: the spawn below is idempotent.
            Err(StoreError::Conflict { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(run_id = %run.run_id, members = next.outstanding_children(), "team expanded");
        self.spawn_children(&run.run_id, &run.tenant, 1).await
    }

    /// A child's start: only while its parent still waits for it; the child
    /// of a parent that ended is cancelled instead.
    pub(crate) async fn parent_still_waits(&self, child: &Run) -> Result<bool, StoreError> {
        let Some(pid) = &child.parent_run_id else {
            return Ok(true);
        };
        let parent = self.svc.runs.get(pid).await?;
        Ok(parent.is_some_and(|p| p.state().is_active() && p.tenant == child.tenant))
    }

    /// A child ended: its end goes to its parent's FIFO group of the
    /// harness queue, where the parent's notes are taken in order, in
    /// batches, never racing the parent's own steps (see the harness's
    /// `child_end`).
    pub(crate) async fn announce_to_parent(&self, child: &Run) -> Handled {
        let Some(parent) = child.parent_run_id.clone() else {
            return Ok(Outcome::Done);
        };
        let msg = HarnessMessage::ChildEnded {
            run_id: parent,
            tenant: child.tenant.clone(),
            child_run_id: child.run_id.clone(),
        };
        self.svc.queues.send_harness(&msg).await?;
        Ok(Outcome::Done)
    }

    /// A parent ended: every child still active is cancelled (fenced, as
    /// any cancel), and each one's own settling does the same below it.
    pub(crate) async fn cancel_children(&self, parent: &Run) -> Handled {
        let Some(c) = parent.children.as_ref() else {
            return Ok(Outcome::Done);
        };
        let open: Vec<String> = c
            .slots
            .iter()
            .filter(|s| s.state() != SlotState::Ended)
            .map(|s| s.run_id.clone())
            .collect();
        for child_id in open {
            let outcome = self
                .cancel_child(&child_id, &parent.tenant, &parent.run_id)
                .await?;
            if outcome != Outcome::Done {
                return Ok(outcome);
            }
        }
        Ok(Outcome::Done)
    }

    async fn cancel_child(&self, child_id: &str, tenant: &str, parent_id: &str) -> Handled {
        let by = EndNote {
            by: Some("parent".into()),
            parent_run_id: Some(parent_id.to_string()),
            code: Some(collab_codes::PARENT_ENDED.into()),
            ..EndNote::default()
        };
        let ending = Ending::Cancel { by: "parent" };
        let event = RunEvent::CancelRequested;
        match ending::end(&self.svc, child_id, tenant, event, by, ending).await? {
            Some(EndOutcome::Ended(ended)) => {
                tracing::info!(run_id = %child_id, parent = %parent_id, "child cancelled with its parent");
                ending::carry_out(&self.svc, &ended.run, &ended.actions).await?;
                Ok(Outcome::Done)
            }
            // Never created (the parent ended first), or ended already.
            Some(EndOutcome::Missing | EndOutcome::AlreadyEnded(_)) => Ok(Outcome::Done),
            Some(EndOutcome::Refused(e)) => Ok(self.illegal(child_id, &e)),
            None => Ok(Outcome::retry("the child kept changing")),
        }
    }

    /// A child whose parent ended before it started: cancelled, then settled.
    pub(crate) async fn cancel_orphan(&self, run: Run) -> Handled {
        let (run_id, tenant) = (run.run_id.clone(), run.tenant.clone());
        let by = EndNote {
            by: Some("parent".into()),
            code: Some(armada_domain::collab::codes::PARENT_ENDED.into()),
            ..EndNote::default()
        };
        match self
            .end_from_outside(run, RunEvent::CancelRequested, by)
            .await
        {
            Ok(Ok(_)) => self.settle(&run_id, &tenant).await,
            Ok(Err(e)) => Ok(self.illegal(&run_id, &e)),
            Err(StoreError::Conflict { .. }) => Ok(Outcome::retry("the run changed")),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether a Run starts by expanding into its team's members.
    pub(crate) fn fans_out(run: &Run) -> bool {
        run.team
            .as_ref()
            .is_some_and(|t| t.strategy == Strategy::FanOut)
    }
}
