//! Serving the hand queue: one call at a time, each marked STARTED with a
//! conditional write, run in the jail, answered to the harness queue and
//! marked FINISHED; a call an earlier incarnation died in is answered `Lost`.

use crate::agent::faults;
use crate::agent::heartbeat;
use crate::agent::now_ms;
use crate::agent::Agent;
use crate::agent::Exit;
use crate::agent::Inflight;
use crate::agent::INLINE_OUTCOME_BYTES;
use crate::skills;
use crate::skills::Aftermath;
use anyhow::Context;
use anyhow::Result;
use armada_core::adapters::dynamo::sandboxes::CallRef;
use armada_core::Sandboxes;
use armada_domain::machine::Machine;
use armada_domain::messages::HarnessMessage;
use armada_domain::messages::ResultBody;
use armada_domain::program::{env_binding, open_env, EnvVar, ProgramCall, ProgramProtocol};
use armada_domain::sandbox::controls::Required;
use armada_domain::sandbox::hand::codes;
use armada_domain::sandbox::hand::error_json;
use armada_domain::sandbox::hand::CallMark;
use armada_domain::sandbox::hand::CallOutcome;
use armada_domain::sandbox::hand::HandMessage;
use armada_domain::sandbox::hand::Invocation;
use armada_domain::sandbox::hand::HAND_VISIBILITY_EXTEND_SECONDS;
use armada_domain::sandbox::hand::HAND_VISIBILITY_SECONDS;
use armada_domain::sandbox::lifecycle::PortLease;
use armada_domain::sandbox::lifecycle::SandboxAction;
use armada_domain::sandbox::lifecycle::SandboxEvent;
use armada_domain::sandbox::lifecycle::SandboxRecord;
use armada_domain::sandbox::lifecycle::SandboxState;
use armada_domain::sandbox::seal::Answer;
use armada_domain::skill_files::skill_dir;
use armada_domain::skills::SERVE;
use std::time::Duration;
use std::time::Instant;
use tracing::Instrument;

impl Agent {
    pub(super) async fn serve(
        &mut self,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Exit> {
        if faults::stall_at_start(&self.cfg.agent) {
            // A task that never comes up (a hung image pull, say).
            let _ = stop.changed().await;
            return Ok(Exit::Stopped);
        }
        if let Err(why) = self.check_mounts() {
            return self.fail_closed(&format!("refused at start: {why}")).await;
        }
        if let Some(key) = self.cfg.restore.clone() {
            if let Err(e) = self.restore(&key).await {
                return self
                    .fail_closed(&format!(
                        "could not restore the workspace from {key}: {e:#}"
                    ))
                    .await;
            }
        }
        let controls = match self.measure().await {
            Ok(c) => c,
            Err(e) => return self.fail_closed(&format!("could not confine: {e:#}")).await,
        };
        let unmet = Required::of(&self.cfg.caps).unmet(&controls);
        if !unmet.is_empty() {
            return self
                .fail_closed(&format!(
                    "profile '{}' cannot be enforced here: {}",
                    self.cfg.caps.profile,
                    unmet.join("; ")
                ))
                .await;
        }
        let now = now_ms();
        let ready = self
            .update(|r| {
                let ready = SandboxEvent::AgentReady {
                    generation: r.generation,
                    controls: Box::new(controls.clone()),
                };
                r.apply(ready, now).is_ok()
            })
            .await?;
        match ready {
            Some(r) if r.state() == SandboxState::Ready => {}
            other => {
                let why = format!(
                    "this task's generation {} is not the sandbox's ({:?})",
                    self.cfg.generation,
                    other.map(|r| (r.generation, r.state()))
                );
                tracing::warn!(sandbox = %self.cfg.key(), %why, "stale sandbox task exits");
                return Ok(Exit::Destroyed(why));
            }
        }
        tracing::info!(sandbox = %self.cfg.key(), generation = self.cfg.generation, "sandbox ready");
        self.recover_inflight().await?;
        // The heartbeat goes on during calls too: a long call is not a dead
        // sandbox. It also notices the sandbox being destroyed meanwhile.
        let (gone_tx, mut gone) = tokio::sync::watch::channel(None::<String>);
        let beat = tokio::spawn(heartbeat(
            self.store.clone(),
            self.cfg.tenant.clone(),
            self.cfg.agent.clone(),
            self.cfg.generation,
            Duration::from_secs(u64::from(self.cfg.heartbeat_seconds)),
            self.held.clone(),
            gone_tx,
        ));
        self.next_renewal_ms = self.first_renewal_ms();
        let exit = self.serve_queue(&mut stop, &mut gone).await;
        beat.abort();
        exit
    }

    pub(super) async fn serve_queue(
        &mut self,
        stop: &mut tokio::sync::watch::Receiver<bool>,
        gone: &mut tokio::sync::watch::Receiver<Option<String>>,
    ) -> Result<Exit> {
        let idle = Duration::from_secs(u64::from(self.cfg.idle_seconds));
        // Look for calls often enough to notice idleness in time.
        let wait = self.cfg.wait_seconds.min(
            i32::try_from(self.cfg.idle_seconds / 2)
                .unwrap_or(i32::MAX)
                .max(1),
        );
        let mut last_active = Instant::now();
        loop {
            if let Some(why) = gone.borrow().clone() {
                return Ok(Exit::Destroyed(why));
            }
            if self.may_hibernate() && last_active.elapsed() >= idle {
                if let Some(exit) = self.hibernate(idle).await? {
                    return Ok(exit);
                }
                last_active = Instant::now();
            }
            self.renew_credentials_if_due().await;
            let receive = self
                .aws
                .sqs
                .receive_message()
                .queue_url(&self.cfg.hand_queue_url)
                .max_number_of_messages(1)
                .visibility_timeout(HAND_VISIBILITY_SECONDS)
                .wait_time_seconds(wait)
                .send();
            let out = tokio::select! {
                r = receive => r,
                _ = stop.changed() => return Ok(Exit::Stopped),
            };
            let msgs = match out {
                Ok(o) => o.messages.unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "hand queue receive failed");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            for m in msgs {
                let receipt = m.receipt_handle().unwrap_or_default().to_string();
                let msg: HandMessage = match serde_json::from_str(m.body().unwrap_or_default()) {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::error!(error = %e, "malformed hand message dropped");
                        self.delete(&receipt).await;
                        continue;
                    }
                };
                match msg {
                    HandMessage::EndRun { run_id, .. } => {
                        let cleaned = self.runner.env.drop_scratch(&run_id);
                        self.delete(&receipt).await;
                        if let Err(e) = cleaned {
                            // A Run's files could not be removed: the next
                            // Run would see them. The sandbox goes instead.
                            let why =
                                format!("force-destroyed: cleanup after run {run_id} failed: {e}");
                            let now = now_ms();
                            self.update(|r| destroyed(r, &why, now)).await?;
                            self.shutdown_services();
                            return Ok(Exit::Destroyed(why));
                        }
                    }
                    HandMessage::Credentials {
                        generation,
                        credentials,
                    } => {
                        self.take_credentials(generation, credentials);
                        self.delete(&receipt).await;
                    }
                    HandMessage::Invoke(inv) => {
                        let hidden = self.keep_hidden(&receipt);
                        let done = self.invoke(inv, &receipt).await;
                        hidden.abort();
                        if let Some(exit) = done? {
                            self.shutdown_services();
                            return Ok(exit);
                        }
                        last_active = Instant::now();
                    }
                }
            }
        }
    }

    /// Keeps the message of the call being run hidden until told to stop
    /// (aborted), so that no one takes it meanwhile; an agent that dies
    /// stops keeping it.
    fn keep_hidden(&self, receipt: &str) -> tokio::task::JoinHandle<()> {
        let sqs = self.aws.sqs.clone();
        let queue = self.cfg.hand_queue_url.clone();
        let receipt = receipt.to_string();
        tokio::spawn(async move {
            let every = Duration::from_secs(HAND_VISIBILITY_EXTEND_SECONDS);
            loop {
                tokio::time::sleep(every).await;
                let kept = sqs
                    .change_message_visibility()
                    .queue_url(&queue)
                    .receipt_handle(&receipt)
                    .visibility_timeout(HAND_VISIBILITY_SECONDS)
                    .send()
                    .await;
                if let Err(e) = kept {
                    tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "could not keep a call's message hidden");
                }
            }
        })
    }

    pub(super) async fn delete(&self, receipt: &str) {
        if let Err(e) = self
            .aws
            .sqs
            .delete_message()
            .queue_url(&self.cfg.hand_queue_url)
            .receipt_handle(receipt)
            .send()
            .await
        {
            tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "could not delete a hand message; it will come back");
        }
    }

    /// A restarted agent answers for the call its predecessor died in.
    pub(super) async fn recover_inflight(&self) -> Result<()> {
        let Ok(text) = std::fs::read_to_string(self.inflight_path()) else {
            return Ok(());
        };
        let Ok(inflight) = serde_json::from_str::<Inflight>(&text) else {
            let _ = std::fs::remove_file(self.inflight_path());
            return Ok(());
        };
        let inv = inflight.invocation;
        tracing::warn!(run_id = %inv.run_id, call_id = %inv.call_id, "answering for a call the previous agent died in");
        self.answer(
            &inv,
            CallOutcome::Lost {
                reason: "the sandbox agent crashed during the call".into(),
            },
        )
        .await?;
        self.delete(&inflight.receipt_handle).await;
        let _ = std::fs::remove_file(self.inflight_path());
        Ok(())
    }

    /// Sends an outcome to the harness queue.
    pub(super) async fn answer(&self, inv: &Invocation, outcome: CallOutcome) -> Result<()> {
        let inline = serde_json::to_string(&outcome)?;
        let body = if inline.len() > INLINE_OUTCOME_BYTES {
            let sha256 = armada_domain::crypto::sha256_hex(inline.as_bytes());
            let key = armada_domain::sandbox::access::outcome_key(
                &self.cfg.tenant,
                &self.cfg.agent,
                &inv.run_id,
                &inv.call_id,
                inv.attempt,
            );
            self.aws
                .s3
                .put_object()
                .bucket(&self.cfg.payload_bucket)
                .key(&key)
                .content_type("application/json")
                .body(inline.into_bytes().into())
                .send()
                .await
                .context("storing a large outcome")?;
            ResultBody::Stored { key, sha256 }
        } else {
            ResultBody::Inline { outcome }
        };
        let seal = Answer {
            run_id: &inv.run_id,
            tenant: &inv.tenant,
            step: inv.step,
            call_id: &inv.call_id,
            attempt: inv.attempt,
            body: &body,
        }
        .seal(&self.cfg.answer_key, self.cfg.generation);
        let msg = HarnessMessage::ToolResult {
            run_id: inv.run_id.clone(),
            tenant: inv.tenant.clone(),
            step: inv.step,
            call_id: inv.call_id.clone(),
            attempt: inv.attempt,
            body,
            seal: Some(seal),
        };
        self.aws
            .sqs
            .send_message()
            .queue_url(&self.cfg.harness_queue_url)
            .message_body(serde_json::to_string(&msg)?)
            .message_group_id(&inv.run_id)
            .message_deduplication_id(msg.dedup_id())
            .send()
            .await
            .context("sending an outcome to the harness queue")?;
        Ok(())
    }

    /// Handles one call; `Some(exit)` when the sandbox must stop after it.
    pub(super) async fn invoke(&mut self, inv: Invocation, receipt: &str) -> Result<Option<Exit>> {
        let span = tracing::info_span!("call", run_id = %inv.run_id, call_id = %inv.call_id, skill = %inv.skill);
        self.invoke_in_span(inv, receipt).instrument(span).await
    }

    async fn invoke_in_span(&mut self, inv: Invocation, receipt: &str) -> Result<Option<Exit>> {
        if inv.tenant != self.cfg.tenant || inv.agent != self.cfg.agent {
            // Seed 000 §E: a sandbox serving another identity is destroyed
            // at once, and the event is recorded.
            let why = format!(
                "security: sandbox of {}#{} was sent a call of {}#{}",
                self.cfg.tenant, self.cfg.agent, inv.tenant, inv.agent
            );
            tracing::error!(security = true, %why, "cross-identity call refused; destroying the sandbox");
            self.answer(
                &inv,
                CallOutcome::NotRun {
                    code: armada_domain::sandbox::hand::SECURITY_VIOLATION.into(),
                    message: why.clone(),
                },
            )
            .await?;
            self.delete(receipt).await;
            let now = now_ms();
            self.update(|r| destroyed(r, &why, now)).await?;
            return Ok(Some(Exit::Destroyed(why)));
        }
        let call = CallRef {
            tenant: self.cfg.tenant.clone(),
            agent: self.cfg.agent.clone(),
            run_id: inv.run_id.clone(),
            call_id: inv.call_id.clone(),
            attempt: inv.attempt,
        };
        let prior = self
            .store
            .mark_first(&call, CallMark::Started, self.cfg.generation, now_ms())
            .await?;
        match prior.map(|m| m.mark) {
            None => {}
            Some(CallMark::Started) => {
                // Started by an agent that died before answering.
                self.answer(
                    &inv,
                    CallOutcome::Lost {
                        reason: "the call was started by a sandbox that died before answering"
                            .into(),
                    },
                )
                .await?;
                self.delete(receipt).await;
                return Ok(None);
            }
            Some(CallMark::Finished) | Some(CallMark::Abandoned) => {
                // Answered already, or given up on by the control plane.
                self.delete(receipt).await;
                return Ok(None);
            }
        }
        let inflight = Inflight {
            invocation: inv.clone(),
            receipt_handle: receipt.to_string(),
        };
        std::fs::write(self.inflight_path(), serde_json::to_vec(&inflight)?)?;
        faults::panic_on(&inv);
        let answer = if inv.skill == SERVE {
            self.serve_call(&inv).await
        } else {
            let key = crate::effects::held_key(&inv.run_id, &inv.call_id);
            // An approved call may have changes held from when it ran.
            let judged = skills::Judged {
                key: (inv.judge_effects || inv.approved).then_some(key.as_str()),
                approved: inv.approved,
            };
            match self.program_of(&inv) {
                // Refused by the control plane (a secret it does not
                // have), or an environment that does not open: not run.
                Err(refused) => skills::SkillAnswer::refused(refused),
                Ok(program) => match self.staged(&inv).await {
                    Err(failed) => skills::SkillAnswer::refused(failed),
                    Ok(()) => match (served_by(&inv), program.as_ref()) {
                        (Some(p), Some(opened)) => {
                            let timeout = std::time::Duration::from_secs(u64::from(inv.timeout_s));
                            self.mcp_call(p, opened, &inv.args, &inv.call_id, timeout)
                                .await
                        }
                        _ => {
                            skills::invoke_judged(
                                &self.runner,
                                &inv.skill,
                                &inv.args,
                                &inv.run_id,
                                inv.timeout_s,
                                judged,
                                program.as_ref(),
                            )
                            .await
                        }
                    },
                },
            }
        };
        let needs_approval = answer
            .result
            .pointer("/error/code")
            .and_then(|c| c.as_str())
            == Some(codes::APPROVAL_REQUIRED);
        let outcome = if needs_approval {
            // The workspace was not changed (the call did not run, or its
            // changes are held): it waits for a human.
            CallOutcome::NotRun {
                code: codes::APPROVAL_REQUIRED.into(),
                message: answer
                    .result
                    .pointer("/error/message")
                    .and_then(|m| m.as_str())
                    .unwrap_or_default()
                    .to_string(),
            }
        } else {
            CallOutcome::Finished {
                result: answer.result.clone(),
            }
        };
        self.answer(&inv, outcome).await?;
        if let Err(e) = self.store.mark_finished(&call, now_ms()).await {
            tracing::warn!(error = %e, "could not mark the call finished");
        }
        self.delete(receipt).await;
        let _ = std::fs::remove_file(self.inflight_path());
        let now = now_ms();
        let g = self.cfg.generation;
        let ports: Vec<PortLease> = self
            .ports
            .values()
            .map(|p| PortLease {
                container: p.container,
                host: p.bind,
            })
            .collect();
        self.update(|r| {
            r.ports = ports.clone();
            r.apply(SandboxEvent::Touch { generation: g }, now).is_ok()
        })
        .await?;
        if answer.aftermath == Aftermath::Destroy {
            let code = answer.result["error"]["code"].as_str().unwrap_or("error");
            let why = format!("force-destroyed after {code} in call {}", inv.call_id);
            self.update(|r| destroyed(r, &why, now)).await?;
            return Ok(Some(Exit::Destroyed(why)));
        }
        Ok(None)
    }
}

impl Agent {
    /// The program a call runs, its environment opened with this
    /// generation's key (sealed for it, and for this call, by the
    /// harness); `Err`: the call's error, answered without running it.
    fn program_of(&self, inv: &Invocation) -> Result<Option<skills::Opened>, serde_json::Value> {
        let Some(p) = &inv.program else {
            return Ok(None);
        };
        if let Some(r) = &p.refused {
            return Err(error_json(&r.code, r.message.clone()));
        }
        let env = match &p.env {
            None => vec![],
            Some(sealed) => {
                let binding = env_binding(&inv.run_id, &inv.call_id, inv.attempt);
                open_env(&self.cfg.answer_key, &binding, sealed).ok_or_else(|| {
                    error_json(
                        codes::SANDBOX_UNAVAILABLE,
                        "the program's environment does not open in this sandbox",
                    )
                })?
            }
        };
        let mut env = env;
        if !p.skill.is_empty() {
            env.push(EnvVar {
                name: "ARMADA_SKILL_DIR".into(),
                value: skill_dir(&p.skill),
                secret: None,
            });
        }
        Ok(Some(skills::Opened {
            command: p.command.clone(),
            env,
        }))
    }

    /// The call's program staged (files and installs), if it has one.
    async fn staged(&self, inv: &Invocation) -> Result<(), serde_json::Value> {
        match &inv.program {
            Some(p) => {
                let timeout = std::time::Duration::from_secs(u64::from(inv.timeout_s));
                self.stage(p, timeout).await
            }
            None => Ok(()),
        }
    }
}

/// The program of a call whose skill's program is an MCP server.
fn served_by(inv: &Invocation) -> Option<&ProgramCall> {
    inv.program
        .as_deref()
        .filter(|p| p.protocol == ProgramProtocol::Mcp)
}

/// Asks `r` to be destroyed for `why`: whether it changed (a sandbox
/// already going stays as it is).
fn destroyed(r: &mut SandboxRecord, why: &str, now: i64) -> bool {
    let destroy = SandboxEvent::Destroy {
        why: why.to_string(),
    };
    r.apply(destroy, now)
        .is_ok_and(|actions| actions.contains(&SandboxAction::StopTask))
}
