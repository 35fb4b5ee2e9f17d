//! What a team makes of its members' ends: the failure policy (`all`,
//! `best_effort`, `quorum`) and the one message its Run answers over in
//! round 2 (every member's name, state and output, in the team's order).

use super::{codes, RunKind};
use crate::run::family::ChildEnd;
use crate::run::{LogEvent, RunError, RunEventRecord};
use crate::team::FailurePolicy;

/// A team's failure policy over its members' ends: `all` needs every one
/// to complete, `best_effort` takes whatever there is, `quorum` needs n.
pub fn judge(policy: FailurePolicy, ends: &[ChildEnd]) -> Result<(), RunError> {
    let failed: Vec<String> = ends
        .iter()
        .filter(|e| !e.completed())
        .map(|e| format!("{} {}", e.agent, e.failure_text()))
        .collect();
    let completed = ends.len() - failed.len();
    match policy {
        FailurePolicy::All if !failed.is_empty() => Err(RunError::new(
            codes::MEMBERS_FAILED,
            format!(
                "the team's failure policy is all, and {} did not complete: {}",
                failed.len(),
                failed.join("; ")
            ),
        )),
        FailurePolicy::Quorum(n) if (completed as u32) < n => Err(RunError::new(
            codes::QUORUM_NOT_MET,
            format!(
                "the team needs {n} completed members and {completed} completed; failed: {}",
                failed.join("; ")
            ),
        )),
        FailurePolicy::All | FailurePolicy::BestEffort | FailurePolicy::Quorum(_) => Ok(()),
    }
}

/// The one message a fan-out team's Run answers over in round 2: every
/// member's name, state and output (or error), in the team's order.
pub fn round_message(ends: &[ChildEnd]) -> String {
    let mut text = String::from(
        "Your team's members have each answered the request above. Answer it over their answers.\n",
    );
    for e in ends {
        text.push_str(&format!("\n### {} — {}\n", e.agent, e.state));
        match (&e.output, e.completed()) {
            (Some(out), true) => text.push_str(out),
            _ => text.push_str(&format!("(no answer: {})", e.failure_text())),
        }
        text.push('\n');
    }
    text
}

/// The round-2 message a `round_started` event stands for in a Run's log:
/// built from the `child_finished` events of the round before it.
pub fn round_message_at(log: &[RunEventRecord], event: &RunEventRecord) -> Option<String> {
    let LogEvent::RoundStarted {
        after_round: Some(after),
        members: order,
        ..
    } = &event.event
    else {
        return None;
    };
    let mut ends: Vec<ChildEnd> = log
        .iter()
        .filter_map(|e| match &e.event {
            LogEvent::ChildFinished(f) if f.round == *after && f.kind == RunKind::Member => {
                Some(ChildEnd::of(f))
            }
            _ => None,
        })
        .collect();
    // In the team's order (the event lists the members' Runs), not in the
    // order they happened to end.
    let at = |id: &str| order.iter().position(|o| o == id);
    ends.sort_by_key(|e| at(&e.run_id));
    Some(round_message(&ends))
}
