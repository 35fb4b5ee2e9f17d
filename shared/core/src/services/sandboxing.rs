//! Sandbox control, shared by the harness (acquire, dispatch), the
//! dispatcher (release at a Run's end, the watchdog) and the API (list,
//! destroy): the lifecycle of the domain applied to the sandboxes table,
//! and the provider's tasks and hand queues started and stopped to match.

use armada_domain::agent::AgentDefinition;
use armada_domain::machine::Machine;
use armada_domain::messages::HarnessMessage;
use armada_domain::run::{Run, RunState};
use armada_domain::sandbox::hand::{CallMark, HandMessage, Invocation};
use armada_domain::sandbox::lifecycle::{
    Acquired, LifecycleError, SandboxAction, SandboxEvent, SandboxRecord, SandboxState,
};

use crate::error::StoreError;
use crate::faults::{Aborted, FaultPoint};
use crate::ports::provider::TaskRequest;
use crate::ports::{CallRef, Change, SandboxesExt, StoredMark};
use crate::Services;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The frozen requirement cannot be met: placement fails closed.
    #[error("the sandbox cannot be placed: {0}")]
    Placement(String),
    /// Killed at a fault point (tests): the start is left half done.
    #[error(transparent)]
    Aborted(#[from] Aborted),
}

/// What became of a Run's request for its agent's sandbox.
#[derive(Debug, Clone)]
pub struct Holding {
    pub record: SandboxRecord,
    pub acquired: Acquired,
}

/// What the watchdog learnt about a dispatched call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallWatch {
    /// Running, queued behind other calls, or answered already: wait.
    Wait,
    /// Never started and never will (sandbox gone): it fails plainly.
    NotRun(String),
    /// Started by a sandbox that is gone or silent: its effect is unknown.
    Lost(String),
    /// Finished by its sandbox long ago, and its answer never taken: the
    /// answer was lost on the way (the sandbox may be well).
    Unanswered(String),
}

/// How long after its sandbox marked a call finished the watchdog waits
/// for the answer before it speaks for it: longer than an answer takes
/// to come back from a worker that died holding it, or from waiting out
/// the lease of a step that is committing its dispatch.
pub fn answer_patience_ms(svc: &Services) -> i64 {
    let cfg = &svc.cfg;
    let lease_s = cfg.step_lease_ms / 1000;
    (lease_s + 2 * i64::from(cfg.crash_return_s) + i64::from(cfg.sandbox.stale_seconds)) * 1000
}

/// A new sandbox record's salt.
fn new_salt() -> String {
    hex::encode(rand::random::<[u8; 8]>())
}

pub fn now_ms(svc: &Services) -> i64 {
    svc.clock.now_ms()
}

/// Acquires the agent identity's sandbox for `run_id`, starting a task
/// when the generation has none. The caller dispatches only when held.
pub async fn acquire(
    svc: &Services,
    tenant: &str,
    run_id: &str,
    agent: &AgentDefinition,
) -> Result<Holding, SandboxError> {
    let now = now_ms(svc);
    let profile = agent.sandbox.profile.clone();
    let salt = new_salt();
    let (record, acquired) = svc
        .sandboxes
        .modify(tenant, &agent.name, |rec| {
            let mut r = rec.clone().unwrap_or_else(|| {
                SandboxRecord::new(tenant, &agent.name, &profile, now).salted(&salt)
            });
            let asked = SandboxEvent::Acquire {
                run_id: run_id.to_string(),
                profile: profile.clone(),
            };
            // Asking is never refused: a Run holds the sandbox or waits.
            let a = Acquired::of(&r.apply(asked, now).unwrap_or_default());
            match rec {
                // Held already and nothing changed: no write.
                Some(old)
                    if old.holder_run_id == r.holder_run_id
                        && old.waiters == r.waiters
                        && old.state() == r.state() =>
                {
                    Change::Keep((old, a))
                }
                _ => Change::Write(Box::new(r.clone()), (r, a)),
            }
        })
        .await?;
    let needs_task = matches!(acquired, Acquired::Held { .. }) && record.wants_task();
    if !needs_task {
        return Ok(Holding { record, acquired });
    }
    let record = start_task(svc, &record, agent).await?;
    Ok(Holding { record, acquired })
}

/// A resident agent's sandbox is made (or woken) ahead of its first call,
/// without being held: the Run that starts it finds it warm.
pub async fn prewarm(
    svc: &Services,
    tenant: &str,
    agent: &AgentDefinition,
) -> Result<SandboxRecord, SandboxError> {
    let now = now_ms(svc);
    let profile = agent.sandbox.profile.clone();
    let salt = new_salt();
    let record = svc
        .sandboxes
        .modify(tenant, &agent.name, |rec| {
            let mut r = rec.clone().unwrap_or_else(|| {
                SandboxRecord::new(tenant, &agent.name, &profile, now).salted(&salt)
            });
            let prewarm = SandboxEvent::Prewarm {
                profile: profile.clone(),
            };
            match r.apply(prewarm, now) {
                Ok(started) if !started.is_empty() => Change::Write(Box::new(r.clone()), r),
                _ => Change::Keep(r),
            }
        })
        .await?;
    if record.wants_task() {
        return start_task(svc, &record, agent).await;
    }
    Ok(record)
}

/// Starts the task of `rec`'s generation: resolves the profile (global
/// profiles first), creates the hand queue, runs the task and records it.
pub async fn start_task(
    svc: &Services,
    rec: &SandboxRecord,
    agent: &AgentDefinition,
) -> Result<SandboxRecord, SandboxError> {
    let global = svc.registry.profiles().await?;
    let (caps, shadowed) = match agent.sandbox.resolve(global) {
        Ok(c) => c,
        Err(e) => {
            let why = format!("profile '{}': {e}", agent.sandbox.profile);
            fail(svc, rec, &why).await?;
            return Err(SandboxError::Placement(why));
        }
    };
    if !shadowed.is_empty() {
        tracing::warn!(agent = %agent.name, ?shadowed, "project profiles shadowed by global ones of the same name were ignored");
    }
    let queue = svc
        .provider
        .hand_queue(&rec.tenant, &rec.agent, rec.generation, &rec.salt)
        .await?;
    // The sandbox mounts what the definition and its skills' manifests declare.
    let mut spec = agent.sandbox.clone();
    spec.mounts = agent.sandbox_mounts();
    let arn = svc
        .provider
        .start(&TaskRequest {
            tenant: &rec.tenant,
            agent: &rec.agent,
            generation: rec.generation,
            hand_queue_url: &queue,
            salt: &rec.salt,
            caps: &caps,
            spec: &spec,
            // Waking from a snapshot: the new task restores the workspace.
            restore: (rec.state() == SandboxState::Waking)
                .then_some(rec.snapshot_key.as_deref())
                .flatten(),
            start_token: &rec.start_token(),
        })
        .await?;
    tracing::info!(sandbox = %rec.key(), generation = rec.generation, task = %arn, "sandbox task started");
    let holder = rec.holder_run_id.as_deref().unwrap_or_default();
    svc.faults.at(FaultPoint::AfterTaskStart, holder).await?;
    let generation = rec.generation;
    let updated = svc
        .sandboxes
        .modify(&rec.tenant, &rec.agent, |cur| match cur {
            Some(mut r) if r.generation == generation => {
                let started = SandboxEvent::TaskStarted {
                    generation,
                    task_arn: arn.clone(),
                    hand_queue_url: queue.clone(),
                };
                match r.apply(started, now_ms(svc)) {
                    Ok(_) => Change::Write(Box::new(r.clone()), Some(r)),
                    // Left as it was: the task is stopped below as unwanted.
                    Err(e) => {
                        refused(svc, &r, "task_started", &e);
                        Change::Keep(Some(r))
                    }
                }
            }
            other => Change::Keep(other),
        })
        .await?;
    match updated {
        Some(r) if r.task_arn.as_deref() == Some(arn.as_str()) => Ok(r),
        // Superseded meanwhile (destroyed): the task is not wanted.
        other => {
            if let Err(e) = svc
                .provider
                .stop(&arn, "superseded before it started")
                .await
            {
                tracing::warn!(task = %arn, error = %e, "an unwanted sandbox task could not be stopped; it stops at its idle timeout");
            }
            Err(SandboxError::Placement(format!(
                "the sandbox changed while starting ({:?})",
                other.map(|r| (r.generation, r.state()))
            )))
        }
    }
}

async fn fail(svc: &Services, rec: &SandboxRecord, why: &str) -> Result<(), StoreError> {
    let now = now_ms(svc);
    let generation = rec.generation;
    svc.sandboxes
        .modify(&rec.tenant, &rec.agent, |cur| match cur {
            Some(mut r) if r.generation == generation => match r.apply(
                SandboxEvent::Fail {
                    generation,
                    why: why.to_string(),
                },
                now,
            ) {
                Ok(_) => Change::Write(Box::new(r), ()),
                Err(e) => {
                    refused(svc, &r, "fail", &e);
                    Change::Keep(())
                }
            },
            _ => Change::Keep(()),
        })
        .await
}

/// Sends a call to the sandbox's hand queue.
pub async fn dispatch(
    svc: &Services,
    rec: &SandboxRecord,
    inv: &Invocation,
) -> Result<(), SandboxError> {
    let queue = rec
        .hand_queue_url
        .as_deref()
        .ok_or_else(|| SandboxError::Placement("the sandbox has no hand queue".into()))?;
    svc.provider
        .send(queue, &HandMessage::Invoke(inv.clone()))
        .await?;
    Ok(())
}

/// A Run ended: it lets go of its sandbox (or leaves the queue for it).
/// Returns the Run the sandbox was handed to, and when.
pub async fn release(
    svc: &Services,
    tenant: &str,
    agent: &str,
    run_id: &str,
) -> Result<Option<(String, i64)>, StoreError> {
    let now = now_ms(svc);
    let (next, queue) = svc
        .sandboxes
        .modify(tenant, agent, |rec| match rec {
            Some(mut r) => {
                let holder = r.holder_run_id.as_deref() == Some(run_id);
                let waiting = r.waiters.iter().any(|w| w == run_id);
                if !holder && !waiting {
                    return Change::Keep((None, None));
                }
                let released = SandboxEvent::Release {
                    run_id: run_id.to_string(),
                };
                // Letting go is never refused.
                let next = r
                    .apply(released, now)
                    .unwrap_or_default()
                    .into_iter()
                    .find_map(|a| match a {
                        SandboxAction::HandTo(next) => Some(next),
                        _ => None,
                    });
                let queue = (holder && !r.state().is_gone())
                    .then(|| r.hand_queue_url.clone())
                    .flatten();
                Change::Write(Box::new(r), (next, queue))
            }
            None => Change::Keep((None, None)),
        })
        .await?;
    let next = next.map(|n| (n, now));
    if let Some(q) = queue {
        // The Run's scratch directory goes with it.
        let end = HandMessage::EndRun {
            run_id: run_id.to_string(),
            tenant: tenant.to_string(),
        };
        if let Err(e) = svc.provider.send(&q, &end).await {
            tracing::warn!(run_id, error = %e, "could not tell the sandbox the run ended");
        }
    }
    Ok(next)
}

/// A Run lets go of its agent's sandbox (it ended, or it waits for its
/// children holding nothing but its record) and the next Run waiting for
/// it, if it still waits, is sent its step.
pub async fn release_and_wake(svc: &Services, run: &Run) -> Result<(), StoreError> {
    let Some((next_id, handed_at_ms)) = release(svc, &run.tenant, &run.agent, &run.run_id).await?
    else {
        return Ok(());
    };
    tracing::info!(run_id = %run.run_id, next = %next_id, "sandbox handed to the next run");
    let Some(waiting) = svc.runs.get(&next_id).await? else {
        return Ok(());
    };
    if waiting.state() != RunState::AwaitingTool {
        return Ok(());
    }
    svc.queues
        .send_harness(&handed(&waiting, handed_at_ms))
        .await
}

/// The message that tells a Run waiting for its sandbox that it holds it
/// now (handed over at `handed_at_ms`, when the last holder let go).
pub fn handed(waiting: &Run, handed_at_ms: i64) -> HarnessMessage {
    HarnessMessage::SandboxHanded {
        run_id: waiting.run_id.clone(),
        tenant: waiting.tenant.clone(),
        step: waiting.step,
        handed_at_ms,
    }
}

/// Destroys a sandbox now (administrator, deleted agent, security): the
/// task is stopped, its hand queue removed, its record marked DESTROYED.
pub async fn destroy(
    svc: &Services,
    tenant: &str,
    agent: &str,
    why: &str,
) -> Result<Option<SandboxRecord>, StoreError> {
    let now = now_ms(svc);
    let before = svc
        .sandboxes
        .modify(tenant, agent, |rec| match rec {
            Some(mut r) => {
                let old = r.clone();
                // Never refused (a sandbox already going stays as it is);
                // its task is stopped below whatever state it was in.
                let _ = r.apply(
                    SandboxEvent::Destroy {
                        why: why.to_string(),
                    },
                    now,
                );
                Change::Write(Box::new(r), Some(old))
            }
            None => Change::Keep(None),
        })
        .await?;
    let Some(old) = before else { return Ok(None) };
    if let Some(arn) = &old.task_arn {
        svc.provider.stop(arn, why).await?;
    }
    if let Some(q) = &old.hand_queue_url {
        svc.provider.delete_hand_queue(q).await?;
    }
    // Its secrets go with it (they also expire on their own).
    if let Err(e) = svc
        .provider
        .delete_bootstrap(tenant, agent, old.generation)
        .await
    {
        tracing::warn!(sandbox = %old.key(), error = %e, "a destroyed sandbox's bootstrap file was not deleted; it expires in a day");
    }
    let generation = old.generation;
    let after = svc
        .sandboxes
        .modify(tenant, agent, |rec| match rec {
            Some(mut r) if r.generation == generation => {
                match r.apply(SandboxEvent::Stopped { generation }, now) {
                    Ok(_) => Change::Write(Box::new(r.clone()), Some(r)),
                    Err(e) => {
                        refused(svc, &r, "stopped", &e);
                        Change::Keep(Some(r))
                    }
                }
            }
            other => Change::Keep(other),
        })
        .await?;
    tracing::warn!(sandbox = %old.key(), generation, why, "sandbox destroyed");
    Ok(after)
}

/// Whether a sandbox has been silent for too long to be alive.
fn silent(svc: &Services, rec: &SandboxRecord, now: i64) -> bool {
    let stale = i64::from(svc.cfg.sandbox.stale_seconds) * 1000;
    rec.state() == SandboxState::Ready && now - rec.heartbeat_at_ms > stale
}

/// The watchdog's look at one dispatched call of a waiting Run.
pub async fn watch_call(
    svc: &Services,
    rec: Option<&SandboxRecord>,
    call: &CallRef,
    dispatched_generation: u64,
) -> Result<CallWatch, StoreError> {
    let now = now_ms(svc);
    let mark = svc.sandboxes.mark(call).await?;
    let gone = match rec {
        None => true,
        Some(r) => r.generation != dispatched_generation || r.state().is_gone(),
    };
    let dead = gone || rec.is_some_and(|r| silent(svc, r, now));
    match mark {
        Some(StoredMark {
            mark: CallMark::Finished,
            at_ms,
            ..
        }) if now - at_ms > answer_patience_ms(svc) => Ok(CallWatch::Unanswered(format!(
            "the sandbox finished the call {} s ago and its answer never came",
            (now - at_ms) / 1000
        ))),
        Some(StoredMark {
            mark: CallMark::Finished,
            ..
        }) => Ok(CallWatch::Wait),
        Some(StoredMark {
            mark: CallMark::Abandoned,
            ..
        }) => Ok(CallWatch::NotRun(
            "the sandbox was gone before the call started".into(),
        )),
        Some(StoredMark {
            mark: CallMark::Started,
            ..
        }) if dead => Ok(CallWatch::Lost(if gone {
            "the sandbox was destroyed during the call".into()
        } else {
            "the sandbox stopped answering during the call".into()
        })),
        Some(_) => Ok(CallWatch::Wait),
        None if dead => {
            // Never started: make sure it never will, then say so.
            match svc
                .sandboxes
                .mark_first(call, CallMark::Abandoned, dispatched_generation, now)
                .await?
            {
                None
                | Some(StoredMark {
                    mark: CallMark::Abandoned,
                    ..
                }) => Ok(CallWatch::NotRun(
                    match rec.and_then(|r| r.failure.clone()) {
                        Some(f) => format!("the sandbox is unavailable: {f}"),
                        None => "the sandbox is unavailable".into(),
                    },
                )),
                // It started in between: look again next time.
                Some(_) => Ok(CallWatch::Wait),
            }
        }
        None => Ok(CallWatch::Wait),
    }
}

/// A start that took longer than the start timeout (seed 000: 30 s) is retried once; the
/// second time the sandbox fails. Returns the record as it now is.
pub async fn check_start(
    svc: &Services,
    rec: &SandboxRecord,
    agent: Option<&AgentDefinition>,
) -> Result<SandboxRecord, SandboxError> {
    let now = now_ms(svc);
    let starting = matches!(
        rec.state(),
        SandboxState::Provisioning | SandboxState::Waking
    );
    let timeout_s = svc.cfg.sandbox.start_timeout_seconds;
    if !starting || now - rec.state_changed_at_ms < i64::from(timeout_s) * 1000 {
        return Ok(rec.clone());
    }
    let (generation, attempt) = (rec.generation, rec.start_attempts);
    let old_task = rec.task_arn.clone();
    let (retry, updated) = svc
        .sandboxes
        .modify(&rec.tenant, &rec.agent, |cur| match cur {
            Some(mut r) => {
                let late = SandboxEvent::StartTimedOut {
                    generation,
                    attempt,
                    timeout_s,
                };
                match r.apply(late, now) {
                    Ok(actions) => {
                        let retry = actions.contains(&SandboxAction::RestartTask);
                        Change::Write(Box::new(r.clone()), (Some(retry), r))
                    }
                    Err(_) => Change::Keep((None, r)),
                }
            }
            None => Change::Keep((None, rec.clone())),
        })
        .await?;
    if let Some(arn) = &old_task {
        if let Err(e) = svc
            .provider
            .stop(
                arn,
                &format!("the sandbox did not start within {timeout_s} s"),
            )
            .await
        {
            tracing::warn!(task = %arn, error = %e, "a sandbox task that did not start could not be stopped");
        }
    }
    match (retry, agent) {
        (Some(true), Some(agent)) => {
            tracing::warn!(sandbox = %rec.key(), "sandbox start timed out; retrying once");
            start_task(svc, &updated, agent).await
        }
        (Some(false), _) => {
            tracing::error!(sandbox = %rec.key(), "sandbox start timed out twice; it failed");
            Ok(updated)
        }
        _ => Ok(updated),
    }
}

/// The view of a sandbox the API and CLI show.
pub fn view(rec: &SandboxRecord) -> armada_api::sandboxes::SandboxView {
    armada_api::sandboxes::SandboxView::of(rec, crate::clock::rfc3339)
}

/// A lifecycle move the sandbox's record refused: logged with the sandbox
/// and counted; the record is kept as it was.
fn refused(svc: &Services, rec: &SandboxRecord, what: &str, e: &LifecycleError) {
    svc.counters
        .illegal_transitions
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::error!(sandbox = %rec.key(), generation = rec.generation, what, error = %e, "illegal sandbox transition refused");
}

#[cfg(test)]
#[path = "sandboxing_tests.rs"]
mod tests;
