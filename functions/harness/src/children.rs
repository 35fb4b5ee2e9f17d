//! Calls answered by child Runs (`delegate`, `plan`): the agents they name
//! are looked up for [`decide`], and a step that plans children ends by
//! waiting for them. The step never waits inside its invocation: it
//! commits `AWAITING_CHILDREN` (holding nothing but its record: its
//! sandbox, if it held one, goes to the next Run waiting for it) and asks
//! the dispatcher to create and start the children; their ends are the
//! dispatcher's to record.

use std::collections::BTreeSet;

use armada_domain::collab::delegate::agents_named;
use armada_domain::step::manifest_for;

use super::*;

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
