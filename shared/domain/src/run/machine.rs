//! The Run state machine: states, the events that move a Run, and the one
//! function that decides each move. [`Run::apply`] is the only way a Run's
//! state changes; it keeps the record's data (epoch, lease, step, output,
//! error) in step with the state, and returns the IO the caller must do.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{EventKind, Payload, Run, RunError};

/// Every state a Run can be in, by the names the API reports.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunState {
    Pending,
    Executing,
    AwaitingTool,
    AwaitingHitl,
    AwaitingChildren,
    Completed,
    Failed,
    Cancelled,
    TimedOut,
    ClosedCompleted,
    ClosedFailed,
    ClosedCancelled,
    ClosedTimedOut,
}

impl RunState {
    pub const ALL: [RunState; 13] = [
        RunState::Pending,
        RunState::Executing,
        RunState::AwaitingTool,
        RunState::AwaitingHitl,
        RunState::AwaitingChildren,
        RunState::Completed,
        RunState::Failed,
        RunState::Cancelled,
        RunState::TimedOut,
        RunState::ClosedCompleted,
        RunState::ClosedFailed,
        RunState::ClosedCancelled,
        RunState::ClosedTimedOut,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Pending => "PENDING",
            RunState::Executing => "EXECUTING",
            RunState::AwaitingTool => "AWAITING_TOOL",
            RunState::AwaitingHitl => "AWAITING_HITL",
            RunState::AwaitingChildren => "AWAITING_CHILDREN",
            RunState::Completed => "COMPLETED",
            RunState::Failed => "FAILED",
            RunState::Cancelled => "CANCELLED",
            RunState::TimedOut => "TIMED_OUT",
            RunState::ClosedCompleted => "CLOSED_COMPLETED",
            RunState::ClosedFailed => "CLOSED_FAILED",
            RunState::ClosedCancelled => "CLOSED_CANCELLED",
            RunState::ClosedTimedOut => "CLOSED_TIMED_OUT",
        }
    }

    pub fn parse(s: &str) -> Option<RunState> {
        RunState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Terminal: the Run's outcome is decided (closed or not).
    pub fn is_terminal(self) -> bool {
        !self.is_active()
    }

    /// Waiting: a step committed its wait (for a sandbox, a person or
    /// children); a result, a decision or a child's end moves it on, and
    /// its watchdog checks on it.
    pub fn is_waiting(self) -> bool {
        matches!(
            self,
            RunState::AwaitingTool | RunState::AwaitingHitl | RunState::AwaitingChildren
        )
    }

    /// Active: the Run can still make progress.
    pub fn is_active(self) -> bool {
        match self {
            RunState::Pending
            | RunState::Executing
            | RunState::AwaitingTool
            | RunState::AwaitingHitl
            | RunState::AwaitingChildren => true,
            RunState::Completed
            | RunState::Failed
            | RunState::Cancelled
            | RunState::TimedOut
            | RunState::ClosedCompleted
            | RunState::ClosedFailed
            | RunState::ClosedCancelled
            | RunState::ClosedTimedOut => false,
        }
    }

    /// Closed: post-terminal duties (session, parent, callback) are settled.
    pub fn is_closed(self) -> bool {
        matches!(
            self,
            RunState::ClosedCompleted
                | RunState::ClosedFailed
                | RunState::ClosedCancelled
                | RunState::ClosedTimedOut
        )
    }

    /// The closed state that follows a terminal one.
    fn closed(self) -> Option<RunState> {
        match self {
            RunState::Completed => Some(RunState::ClosedCompleted),
            RunState::Failed => Some(RunState::ClosedFailed),
            RunState::Cancelled => Some(RunState::ClosedCancelled),
            RunState::TimedOut => Some(RunState::ClosedTimedOut),
            RunState::Pending
            | RunState::Executing
            | RunState::AwaitingTool
            | RunState::AwaitingHitl
            | RunState::AwaitingChildren
            | RunState::ClosedCompleted
            | RunState::ClosedFailed
            | RunState::ClosedCancelled
            | RunState::ClosedTimedOut => None,
        }
    }

    /// The event recording that the Run reached this outcome (for a
    /// terminal or closed state); `None` while it is active.
    pub fn terminal_event(self) -> Option<EventKind> {
        use RunState::*;
        match self {
            Completed | ClosedCompleted => Some(EventKind::RunCompleted),
            Failed | ClosedFailed => Some(EventKind::RunFailed),
            TimedOut | ClosedTimedOut => Some(EventKind::RunTimedOut),
            Cancelled | ClosedCancelled => Some(EventKind::RunCancelled),
            Pending | Executing | AwaitingTool | AwaitingHitl | AwaitingChildren => None,
        }
    }

    /// The terminal outcome, with closed states mapped back to it.
    pub fn outcome(self) -> RunState {
        match self {
            RunState::ClosedCompleted => RunState::Completed,
            RunState::ClosedFailed => RunState::Failed,
            RunState::ClosedCancelled => RunState::Cancelled,
            RunState::ClosedTimedOut => RunState::TimedOut,
            other => other,
        }
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened to a Run, with the data it brings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEvent {
    /// A harness worker claimed the next step, with a lease until then.
    Claimed { lease_until_ms: i64 },
    /// The step's tools are settled; the next step is queued.
    StepContinues,
    /// The step dispatched sandbox calls (or queued for the sandbox) and
    /// waits for their answers.
    AwaitTool,
    /// The step needs a human's approval before it can go on.
    AwaitApproval,
    /// The step started child Runs and waits for all of them to end.
    AwaitChildren,
    /// A team's Run expanded into its members' Runs before any step
    /// (fan-out round 1, by the dispatcher).
    Expanded,
    /// The last child of the waiting point ended: the next step is queued
    /// (round 2, the lead's consolidation, the delegating parent going on).
    ChildrenSettled,
    /// The model gave its final answer.
    Answered { output: Payload },
    /// The Run failed for good (budget, model, dead letter, indeterminate tool).
    Failed { error: RunError },
    /// A caller cancelled the Run.
    CancelRequested,
    /// The wall-clock budget ran out.
    DeadlineExceeded { error: RunError },
    /// Post-terminal duties are settled.
    Closed,
}

impl fmt::Display for RunEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            RunEvent::Claimed { .. } => "claimed",
            RunEvent::StepContinues => "step_continues",
            RunEvent::AwaitTool => "await_tool",
            RunEvent::AwaitApproval => "await_approval",
            RunEvent::AwaitChildren => "await_children",
            RunEvent::Expanded => "expanded",
            RunEvent::ChildrenSettled => "children_settled",
            RunEvent::Answered { .. } => "answered",
            RunEvent::Failed { .. } => "failed",
            RunEvent::CancelRequested => "cancel_requested",
            RunEvent::DeadlineExceeded { .. } => "deadline_exceeded",
            RunEvent::Closed => "closed",
        };
        f.write_str(s)
    }
}

/// IO that a transition asks its caller to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunAction {
    /// Send the harness the message for the next step.
    EnqueueNextStep,
    /// Tell the dispatcher the Run reached a terminal state.
    AnnounceTerminal,
}

/// An event the Run's state cannot take. Handlers log it with the Run,
/// count it and drop the message: retrying cannot make it legal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal run transition: {event} in state {from}")]
pub struct IllegalTransition {
    pub from: RunState,
    pub event: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub to: RunState,
    pub actions: Vec<RunAction>,
}

fn illegal(from: RunState, event: &RunEvent) -> IllegalTransition {
    IllegalTransition {
        from,
        event: event.to_string(),
    }
}

/// The Run state machine.
pub fn transition(from: RunState, event: &RunEvent) -> Result<Transition, IllegalTransition> {
    use RunAction::*;
    use RunState::*;
    let go = |to: RunState, actions: Vec<RunAction>| Ok(Transition { to, actions });
    let from_executing = |to: RunState, actions: Vec<RunAction>| match from {
        Executing => go(to, actions),
        Pending | AwaitingTool | AwaitingHitl | AwaitingChildren | Completed | Failed
        | Cancelled | TimedOut | ClosedCompleted | ClosedFailed | ClosedCancelled
        | ClosedTimedOut => Err(illegal(from, event)),
    };
    let from_active = |to: RunState, actions: Vec<RunAction>| match from {
        Pending | Executing | AwaitingTool | AwaitingHitl | AwaitingChildren => go(to, actions),
        Completed | Failed | Cancelled | TimedOut | ClosedCompleted | ClosedFailed
        | ClosedCancelled | ClosedTimedOut => Err(illegal(from, event)),
    };
    match event {
        RunEvent::Claimed { .. } => from_active(Executing, vec![]),
        RunEvent::StepContinues => from_executing(Executing, vec![EnqueueNextStep]),
        RunEvent::AwaitTool => from_executing(AwaitingTool, vec![]),
        RunEvent::AwaitApproval => from_executing(AwaitingHitl, vec![]),
        RunEvent::AwaitChildren => from_executing(AwaitingChildren, vec![]),
        RunEvent::Expanded => match from {
            Pending => go(AwaitingChildren, vec![]),
            _ => Err(illegal(from, event)),
        },
        RunEvent::ChildrenSettled => match from {
            AwaitingChildren => go(Executing, vec![EnqueueNextStep]),
            _ => Err(illegal(from, event)),
        },
        RunEvent::Answered { .. } => from_executing(Completed, vec![AnnounceTerminal]),
        RunEvent::Failed { .. } => from_active(Failed, vec![AnnounceTerminal]),
        RunEvent::CancelRequested => from_active(Cancelled, vec![AnnounceTerminal]),
        RunEvent::DeadlineExceeded { .. } => from_active(TimedOut, vec![AnnounceTerminal]),
        RunEvent::Closed => match from.closed() {
            Some(to) => go(to, vec![]),
            None => Err(illegal(from, event)),
        },
    }
}

impl Run {
    /// Applies an event of the step that holds the Run: the state moves,
    /// and the record follows it (a claim takes the next epoch and a lease;
    /// every other event ends the lease; a continuing step moves `step` on;
    /// an answer or a failure is recorded). Returns the IO to carry out
    /// after the commit.
    pub fn apply(
        &mut self,
        event: RunEvent,
        now_ms: i64,
    ) -> Result<Vec<RunAction>, IllegalTransition> {
        let t = transition(self.state, &event)?;
        if self.state.is_active() && t.to.is_terminal() {
            self.ended_at_ms = Some(now_ms);
        }
        // The time a human took is given back to the budget.
        if let Some(since) = self.awaiting_human_since_ms.take() {
            self.budgets.deadline_ms += (now_ms - since).max(0);
        }
        if matches!(event, RunEvent::AwaitApproval) {
            self.awaiting_human_since_ms = Some(now_ms);
        }
        self.state = t.to;
        self.updated_at_ms = now_ms;
        match event {
            RunEvent::Claimed { lease_until_ms } => {
                self.epoch += 1;
                self.lease_until_ms = lease_until_ms;
                return Ok(t.actions);
            }
            RunEvent::StepContinues | RunEvent::ChildrenSettled => self.step += 1,
            RunEvent::Answered { output } => self.output = Some(output),
            RunEvent::Failed { error } | RunEvent::DeadlineExceeded { error } => {
                self.error = Some(error)
            }
            RunEvent::AwaitTool
            | RunEvent::AwaitApproval
            | RunEvent::AwaitChildren
            | RunEvent::Expanded
            | RunEvent::CancelRequested
            | RunEvent::Closed => {}
        }
        self.lease_until_ms = 0;
        Ok(t.actions)
    }

    /// Applies an event that comes from outside the step (a cancel, the
    /// watchdog's deadline, a dead letter): it also takes the next epoch,
    /// as a claim would, so a worker still inside a step cannot commit.
    pub fn apply_from_outside(
        &mut self,
        event: RunEvent,
        now_ms: i64,
    ) -> Result<Vec<RunAction>, IllegalTransition> {
        let actions = self.apply(event, now_ms)?;
        self.epoch += 1;
        Ok(actions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::{test_run, TERMINAL_EVENTS};

    fn err() -> RunError {
        RunError::new("X", "x")
    }

    fn every_event() -> Vec<RunEvent> {
        let out = Payload::Inline { text: "a".into() };
        vec![
            RunEvent::Claimed { lease_until_ms: 1 },
            RunEvent::StepContinues,
            RunEvent::AwaitTool,
            RunEvent::AwaitApproval,
            RunEvent::AwaitChildren,
            RunEvent::Expanded,
            RunEvent::ChildrenSettled,
            RunEvent::Answered { output: out },
            RunEvent::Failed { error: err() },
            RunEvent::CancelRequested,
            RunEvent::DeadlineExceeded { error: err() },
        ]
    }

    #[test]
    fn terminal_states_refuse_every_progress_event() {
        for st in [
            RunState::Completed,
            RunState::Failed,
            RunState::Cancelled,
            RunState::TimedOut,
        ] {
            for ev in every_event() {
                assert!(transition(st, &ev).is_err(), "{st} {ev}");
            }
            let closed = transition(st, &RunEvent::Closed).unwrap().to;
            assert!(closed.is_closed());
            assert_eq!(closed.outcome(), st);
            assert!(transition(closed, &RunEvent::Closed).is_err());
        }
    }

    #[test]
    fn only_the_step_that_holds_the_run_moves_it_on() {
        for st in [
            RunState::Pending,
            RunState::AwaitingTool,
            RunState::AwaitingHitl,
            RunState::AwaitingChildren,
        ] {
            for ev in [
                RunEvent::StepContinues,
                RunEvent::AwaitTool,
                RunEvent::AwaitChildren,
                RunEvent::Answered {
                    output: Payload::Inline { text: "a".into() },
                },
            ] {
                assert!(transition(st, &ev).is_err(), "{st} {ev}");
            }
            let claimed = transition(st, &RunEvent::Claimed { lease_until_ms: 1 });
            assert_eq!(claimed.unwrap().to, RunState::Executing);
        }
    }

    #[test]
    fn the_record_follows_the_state() {
        let mut run = test_run();
        assert!(run
            .apply(
                RunEvent::Claimed {
                    lease_until_ms: 500
                },
                10
            )
            .unwrap()
            .is_empty());
        assert_eq!(
            (run.state, run.epoch, run.lease_until_ms),
            (RunState::Executing, 1, 500)
        );
        let actions = run.apply(RunEvent::StepContinues, 20).unwrap();
        assert_eq!(actions, vec![RunAction::EnqueueNextStep]);
        assert_eq!(
            (run.step, run.lease_until_ms, run.updated_at_ms),
            (1, 0, 20)
        );
        run.apply(
            RunEvent::Claimed {
                lease_until_ms: 900,
            },
            30,
        )
        .unwrap();
        run.apply(RunEvent::AwaitChildren, 31).unwrap();
        assert_eq!(
            (run.state, run.lease_until_ms),
            (RunState::AwaitingChildren, 0)
        );
        run.apply(
            RunEvent::Claimed {
                lease_until_ms: 950,
            },
            40,
        )
        .unwrap();
        let out = Payload::Inline {
            text: "done".into(),
        };
        let actions = run
            .apply(
                RunEvent::Answered {
                    output: out.clone(),
                },
                41,
            )
            .unwrap();
        assert_eq!(actions, vec![RunAction::AnnounceTerminal]);
        assert_eq!(
            (run.state, run.output.clone(), run.epoch),
            (RunState::Completed, Some(out), 3)
        );
        let illegal = run
            .apply(RunEvent::Failed { error: err() }, 42)
            .unwrap_err();
        assert_eq!(
            (illegal.from, illegal.event.as_str()),
            (RunState::Completed, "failed")
        );
        assert_eq!(run.error, None, "a refused event changes nothing");
    }

    #[test]
    fn children_are_waited_for_and_their_end_moves_the_run_to_its_next_step() {
        assert_eq!(
            transition(RunState::Pending, &RunEvent::Expanded)
                .unwrap()
                .to,
            RunState::AwaitingChildren
        );
        for st in [RunState::Executing, RunState::AwaitingChildren] {
            assert!(transition(st, &RunEvent::Expanded).is_err(), "{st}");
        }
        for st in [
            RunState::Pending,
            RunState::Executing,
            RunState::AwaitingTool,
        ] {
            assert!(transition(st, &RunEvent::ChildrenSettled).is_err(), "{st}");
        }
        let mut run = test_run();
        run.apply(RunEvent::Claimed { lease_until_ms: 5 }, 1)
            .unwrap();
        run.apply(RunEvent::AwaitChildren, 2).unwrap();
        let actions = run
            .apply_from_outside(RunEvent::ChildrenSettled, 3)
            .unwrap();
        assert_eq!(actions, vec![RunAction::EnqueueNextStep]);
        assert_eq!(
            (run.state, run.step, run.epoch, run.lease_until_ms),
            (RunState::Executing, 1, 2, 0)
        );
    }

    #[test]
    fn an_event_from_outside_fences_the_worker_out() {
        let mut run = test_run();
        run.apply(
            RunEvent::Claimed {
                lease_until_ms: 500,
            },
            10,
        )
        .unwrap();
        run.apply_from_outside(RunEvent::DeadlineExceeded { error: err() }, 11)
            .unwrap();
        assert_eq!(
            (run.state, run.epoch, run.lease_until_ms),
            (RunState::TimedOut, 2, 0)
        );
        assert_eq!(run.error, Some(err()));
        assert!(run
            .apply_from_outside(RunEvent::CancelRequested, 12)
            .is_err());
        assert_eq!(run.epoch, 2);
    }

    #[test]
    fn every_outcome_has_its_own_terminal_event() {
        let mut seen = Vec::new();
        for st in RunState::ALL {
            match st.terminal_event() {
                Some(kind) => {
                    assert!(TERMINAL_EVENTS.contains(&kind), "{st}");
                    assert_eq!(st.terminal_event(), st.outcome().terminal_event());
                    if !seen.contains(&kind) {
                        seen.push(kind);
                    }
                }
                None => assert!(st.is_active(), "{st}"),
            }
        }
        assert_eq!(seen.len(), TERMINAL_EVENTS.len());
    }

    #[test]
    fn names_round_trip() {
        for st in RunState::ALL {
            assert_eq!(RunState::parse(st.as_str()), Some(st));
            let json = serde_json::to_string(&st).unwrap();
            assert_eq!(json, format!("\"{}\"", st.as_str()));
        }
    }
}
