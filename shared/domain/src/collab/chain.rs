//! Sequential relay chains (seed 000 §E): Runs A → B → C, peers with no
//! parent, linked by the link each carries (`chain_id`, its index, every
//! step's agent, so `chain_remaining` is what follows it). When a step
//! completes, the dispatcher starts the next with its output as the input
//! (and its artifacts listed); a step that ends any other way breaks the
//! chain: the steps after it are skipped, the completed ones keep their
//! outputs. A step's Run id is derived from the chain and its index, so
//! starting the next step twice starts one Run.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::children::prewarms;
use super::{child_run_id, Lineage, RunKind};
use crate::agent::AgentDefinition;
use crate::ledger::ToolCallState;
use crate::run::{NewRun, Payload, Run, RunState};
use crate::skills::FILE_WRITE;

pub use crate::run::family::{ChainLink, ChainState};

/// The Run id of step `index` of a chain.
pub fn step_run_id(chain_id: &str, index: usize) -> String {
    child_run_id(chain_id, "step", index)
}

/// The Run of the step after `previous` (which completed), run by
/// `agent` (`None`: deleted since; the step then fails at its start),
/// given `input`: a peer, no parent, the chain's metadata, and
/// `descendants` as its allowance ([`super::descendants::next_step`]).
pub fn next_step(
    previous: &Run,
    agent_name: &str,
    agent: Option<&AgentDefinition>,
    input: Payload,
    descendants: u32,
    now: i64,
) -> Option<Run> {
    let link = previous.chain.as_ref()?.next();
    let run_id = step_run_id(&link.chain_id, link.index as usize);
    let mut run = Run::new(
        NewRun {
            run_id,
            tenant: previous.tenant.clone(),
            agent: agent_name.to_string(),
            input,
            session: None,
            parent_run_id: None,
            callback_url: None,
            metadata: previous.metadata.clone(),
            limits: agent.map(|a| a.limits).unwrap_or_default(),
            prewarm_sandbox: prewarms(agent),
        },
        now,
    );
    run.lineage = Some(Lineage {
        kind: RunKind::ChainStep,
        descendants_left: Some(descendants),
        ..Lineage::root(&step_run_id(&link.chain_id, 0), agent_name)
    });
    run.chain = Some(link);
    run.started_by = previous.started_by.clone();
    run.started_by_address = previous.started_by_address.clone();
    Some(run)
}

/// What a step's end means for its chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterStep {
    /// Start the next step (`index`, `agent`), with `descendants` as its
    /// allowance.
    Next {
        index: u32,
        agent: String,
        descendants: u32,
    },
    /// The chain ended here, in this state; `skipped` are the agents of
    /// the steps that will never run; `cause` the code of why it broke
    /// when the step itself did not fail.
    Ended {
        state: ChainState,
        skipped: Vec<String>,
        cause: Option<&'static str>,
    },
}

/// Decides what follows a step that reached `outcome` (terminal).
/// `descendants`: the next step's allowance, `None` when the tree has no
/// room left for it ([`super::descendants::next_step`]): the chain then
/// breaks with `TOO_MANY_DESCENDANTS`.
pub fn after_step(link: &ChainLink, outcome: RunState, descendants: Option<u32>) -> AfterStep {
    match (outcome, descendants) {
        (RunState::Completed, Some(descendants)) if !link.is_last() => AfterStep::Next {
            index: link.index + 1,
            agent: link.steps[link.index as usize + 1].clone(),
            descendants,
        },
        (RunState::Completed, None) if !link.is_last() => AfterStep::Ended {
            state: ChainState::Failed,
            skipped: link.remaining().to_vec(),
            cause: Some(super::codes::TOO_MANY_DESCENDANTS),
        },
        (RunState::Completed, _) => AfterStep::Ended {
            state: ChainState::Completed,
            skipped: vec![],
            cause: None,
        },
        (other, _) => AfterStep::Ended {
            state: if other == RunState::Cancelled {
                ChainState::Cancelled
            } else {
                ChainState::Failed
            },
            skipped: link.remaining().to_vec(),
            cause: None,
        },
    }
}

/// What a completed step leaves for the next: its files (written through
/// `file_write`, in its own agent's workspace) and, when its output was
/// too large for the record, where it is stored.
pub fn artifacts(run: &Run) -> Vec<Value> {
    let mut out: Vec<Value> = run
        .ledger
        .values()
        .filter(|c| c.skill == FILE_WRITE && c.state() == ToolCallState::Done)
        .filter_map(|c| c.args.get("path").and_then(Value::as_str))
        .map(|p| json!({"kind": "file", "path": p, "agent": run.agent}))
        .collect();
    if let Some(Payload::Stored { key, bytes }) = &run.output {
        out.push(json!({"kind": "output", "key": key, "bytes": bytes}));
    }
    out
}

/// The next step's input: the previous step's output, and its artifacts
/// listed after it when there are any.
pub fn next_input(previous: &Run, output: &str, artifacts: &[Value]) -> String {
    if artifacts.is_empty() {
        return output.to_string();
    }
    let mut text = format!(
        "{output}\n\n---\nArtifacts of the previous step ({}, run {}):\n",
        previous.agent, previous.run_id
    );
    for a in artifacts {
        match a.get("kind").and_then(Value::as_str) {
            Some("file") => text.push_str(&format!(
                "- file {} (in {}'s workspace)\n",
                a["path"].as_str().unwrap_or_default(),
                a["agent"].as_str().unwrap_or_default()
            )),
            _ => text.push_str(&format!("- {a}\n")),
        }
    }
    text
}

/// One step as the chain's view shows it.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepView {
    pub agent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The Run's state, or `PENDING` (not started yet) / `SKIPPED`.
    pub state: String,
}

/// The chain as its steps' Runs show it (`runs[i]`: step i's Run, if it
/// exists): its state and every step's.
pub fn view(steps: &[String], runs: &[Option<&Run>]) -> (ChainState, Vec<StepView>) {
    let mut state = ChainState::Running;
    let mut out = Vec::with_capacity(steps.len());
    for (i, agent) in steps.iter().enumerate() {
        let run = runs.get(i).copied().flatten();
        let shown = match (run, state) {
            (Some(r), _) => r.state().outcome().as_str().to_string(),
            (None, ChainState::Running) => "PENDING".to_string(),
            (None, _) => "SKIPPED".to_string(),
        };
        if let Some(r) = run {
            match r.state().outcome() {
                RunState::Completed if i + 1 == steps.len() => state = ChainState::Completed,
                RunState::Cancelled => state = ChainState::Cancelled,
                RunState::Failed | RunState::TimedOut => state = ChainState::Failed,
                _ => {}
            }
        }
        out.push(StepView {
            agent: agent.clone(),
            run_id: run.map(|r| r.run_id.clone()),
            state: shown,
        });
    }
    (state, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{ToolCallEvent, ToolCallRecord};
    use crate::machine::Machine;
    use crate::run::{test_run, RunEvent};

    fn link(index: u32) -> ChainLink {
        ChainLink {
            chain_id: "chain_1".into(),
            index,
            steps: vec!["r".into(), "w".into(), "p".into()],
            callback_url: None,
            team: None,
        }
    }

    #[test]
    fn a_completed_step_starts_the_next_and_anything_else_breaks_the_chain() {
        assert_eq!(link(0).remaining(), ["w", "p"]);
        assert_eq!(
            after_step(&link(0), RunState::Completed, Some(3)),
            AfterStep::Next {
                index: 1,
                agent: "w".into(),
                descendants: 3
            }
        );
        assert_eq!(
            after_step(&link(2), RunState::Completed, None),
            AfterStep::Ended {
                state: ChainState::Completed,
                skipped: vec![],
                cause: None
            }
        );
        assert_eq!(
            after_step(&link(1), RunState::TimedOut, Some(3)),
            AfterStep::Ended {
                state: ChainState::Failed,
                skipped: vec!["p".into()],
                cause: None
            }
        );
        assert!(matches!(
            after_step(&link(0), RunState::Cancelled, Some(3)),
            AfterStep::Ended {
                state: ChainState::Cancelled,
                ..
            }
        ));
        // No room left in the tree for the next step: the chain breaks.
        assert_eq!(
            after_step(&link(1), RunState::Completed, None),
            AfterStep::Ended {
                state: ChainState::Failed,
                skipped: vec!["p".into()],
                cause: Some("TOO_MANY_DESCENDANTS")
            }
        );
        assert_ne!(step_run_id("chain_1", 0), step_run_id("chain_1", 1));
        assert_eq!(link(0).next().index, 1);
    }

    fn ended(state: RunState) -> Run {
        let mut r = test_run();
        r.apply(RunEvent::Claimed { lease_until_ms: 1 }, 1).unwrap();
        let event = match state {
            RunState::Completed => RunEvent::Answered {
                output: Payload::Inline { text: "o".into() },
            },
            _ => RunEvent::DeadlineExceeded {
                error: crate::run::RunError::new("TIMED_OUT", "late"),
            },
        };
        r.apply(event, 2).unwrap();
        r
    }

    #[test]
    fn the_view_skips_what_follows_a_break_and_keeps_what_came_before() {
        let steps: Vec<String> = ["r", "w", "p"].iter().map(|s| s.to_string()).collect();
        let (a, b) = (ended(RunState::Completed), ended(RunState::TimedOut));
        let (state, v) = view(&steps, &[Some(&a), Some(&b), None]);
        assert_eq!(state, ChainState::Failed);
        let states: Vec<&str> = v.iter().map(|s| s.state.as_str()).collect();
        assert_eq!(states, ["COMPLETED", "TIMED_OUT", "SKIPPED"]);
        let (state, v) = view(&steps, &[Some(&a), None, None]);
        assert_eq!(state, ChainState::Running);
        assert_eq!(v[1].state, "PENDING");
        let (state, _) = view(&steps[..1], &[Some(&a)]);
        assert_eq!(state, ChainState::Completed);
    }

    #[test]
    fn the_next_input_is_the_output_with_the_artifacts_listed() {
        let mut r = ended(RunState::Completed);
        assert_eq!(next_input(&r, "draft", &artifacts(&r)), "draft");
        let mut rec = ToolCallRecord::planned(
            "c",
            FILE_WRITE,
            json!({"path": "notes.md", "content": "x"}),
            0,
            true,
            true,
        );
        let sent = ToolCallEvent::Dispatched {
            generation: Some(1),
        };
        rec.apply(sent, 0).unwrap();
        let answered = ToolCallEvent::Answered {
            ok: true,
            result: json!({}),
        };
        rec.apply(answered, 0).unwrap();
        r.ledger.insert("c".into(), rec);
        let text = next_input(&r, "draft", &artifacts(&r));
        assert!(text.starts_with("draft\n\n---\nArtifacts"), "{text}");
        assert!(
            text.contains("- file notes.md (in a's workspace)"),
            "{text}"
        );
    }
}
