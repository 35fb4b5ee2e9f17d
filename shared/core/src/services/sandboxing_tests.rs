//! Sandbox control on the in-memory ports: a start cut short between the
//! provider's answer and the record, and the hand-over to a waiting Run.

use std::sync::Arc;

use armada_domain::machine::Machine;
use armada_domain::messages::HarnessMessage;
use armada_domain::run::RunEvent;
use armada_domain::sandbox::controls::{Controls, Enforcement};
use armada_domain::sandbox::lifecycle::{Acquired, SandboxEvent, SandboxState};

use super::*;
use crate::faults::DiesOnceAt;
use crate::memory::fixtures::{accepted_run, agent};
use crate::memory::{test_config, Memory};

const TENANT: &str = "t1";

fn dying_at(point: FaultPoint) -> (Arc<Services>, Arc<Memory>) {
    let (svc, mem) = Services::in_memory(test_config());
    let mut dying = (*svc).clone();
    dying.faults = Arc::new(DiesOnceAt::new(point));
    (Arc::new(dying), mem)
}

#[tokio::test]
async fn a_start_cut_short_after_the_provider_answered_is_finished_with_the_same_task() {
    let (svc, mem) = dying_at(FaultPoint::AfterTaskStart);
    let coder = agent(&svc, "coder", &["shell"]).await;
    let died = acquire(&svc, TENANT, "run_a", &coder).await;
    assert!(matches!(died, Err(SandboxError::Aborted(_))), "{died:?}");
    assert_eq!(mem.state().tasks.len(), 1, "the task was started");
    // Its agent reports in before anyone writes the task down.
    svc.sandboxes
        .modify(TENANT, "coder", |rec| {
            let mut r = rec.expect("the record");
            let ready = SandboxEvent::AgentReady {
                generation: r.generation,
                controls: Box::new(Controls::uniform(Enforcement::Enforced, "test")),
            };
            r.apply(ready, 1).expect("ready");
            Change::Write(Box::new(r), ())
        })
        .await
        .expect("written");
    let rec = svc.sandboxes.get(TENANT, "coder").await.unwrap().unwrap();
    assert_eq!(
        (rec.state(), rec.task_arn.as_ref()),
        (SandboxState::Ready, None)
    );

    // The step's redelivery asks again: it holds the sandbox, and the
    // start is finished with the task already running, not a second one.
    let held = acquire(&svc, TENANT, "run_a", &coder).await.expect("held");
    assert!(matches!(held.acquired, Acquired::Held { .. }));
    let tasks: Vec<String> = mem.state().tasks.keys().cloned().collect();
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!(held.record.task_arn.as_ref(), Some(&tasks[0]));
    assert!(held.record.hand_queue_url.is_some());
    // So a call can be sent to it.
    assert!(!held.record.wants_task());
}

#[tokio::test]
async fn a_waiting_run_is_told_it_holds_the_sandbox_apart_from_its_step() {
    let (svc, mem) = Services::in_memory(test_config());
    let coder = agent(&svc, "coder", &["shell"]).await;
    let first = accepted_run(&svc, TENANT, &coder, "one").await;
    let second = accepted_run(&svc, TENANT, &coder, "two").await;
    acquire(&svc, TENANT, &first.run_id, &coder)
        .await
        .expect("held");
    let waits = acquire(&svc, TENANT, &second.run_id, &coder)
        .await
        .expect("queued");
    assert_eq!(waits.acquired, Acquired::Waiting { position: 1 });
    {
        let mut st = mem.state();
        let r = st.runs.get_mut(&second.run_id).expect("the run");
        r.apply(RunEvent::Claimed { lease_until_ms: 0 }, 1)
            .expect("claimed");
        r.apply(RunEvent::AwaitTool, 1).expect("waiting");
    }

    release_and_wake(&svc, &first).await.expect("released");
    let told = mem.take_harness();
    let [HarnessMessage::SandboxHanded { run_id, step, .. }] = &told[..] else {
        panic!("{told:?}");
    };
    assert_eq!((run_id, *step), (&second.run_id, 0));
    // Not the message that began its step: SQS would drop that as a
    // repeat within its five minutes.
    let began = HarnessMessage::Step {
        run_id: second.run_id.clone(),
        tenant: TENANT.into(),
        step: 0,
        epoch: 0,
    };
    assert_ne!(told[0].dedup_id(), began.dedup_id());
}
