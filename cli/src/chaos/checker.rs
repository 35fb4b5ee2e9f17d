//! The checker: reads the history a workload left (the Run records, their
//! events and ledgers, the sessions, the queues, what the counting
//! receiver heard) and names every broken promise with its Run: a Run
//! never closed, ended twice or created twice, or ended more than two
//! minutes past its deadline; a team's round or a child
//! started twice; a lead's consolidation not exactly once; a chain step
//! started twice or after its chain broke; a session message left
//! unanswered or answered before the one before it ended; an effect
//! performed twice, performed without its ledger's record, or recorded
//! done but never performed; an approval applied twice or not at all, or
//! a rejected call performed; a callback never delivered, or delivered
//! under two ids; a message left visible in a queue.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::Result;
use serde::Serialize;

use armada_core::Services;
use armada_domain::collab::chain::step_run_id;
use armada_domain::run::family::SlotState;
use armada_domain::run::{EventKind, LogEvent, Run, RunEventRecord, RunState};

use armada_domain::ledger::{effect_key, ToolCallState};
use armada_domain::skills::{HTTP_REQUEST, SHELL_EXEC};
use armada_domain::team::Strategy;

use super::receiver::Heard;
use super::workload::{Decided, Started};

/// A broken promise, named by the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub run_id: String,
    pub rule: &'static str,
    pub detail: String,
}

/// How each shape's root Runs ended: shape → outcome → count.
pub type Outcomes = BTreeMap<String, BTreeMap<String, u64>>;

const TERMINAL: [EventKind; 4] = [
    EventKind::RunCompleted,
    EventKind::RunFailed,
    EventKind::RunCancelled,
    EventKind::RunTimedOut,
];

/// How far past its deadline a Run may end: whatever handles it next
/// sees the deadline (a watchdog's check, a step, a queued message
/// started again), and that may wait out a kill.
const LATE_END_BOUND_MS: i64 = 120_000;

fn count(events: &[RunEventRecord], kind: EventKind) -> usize {
    events.iter().filter(|e| e.event.kind() == kind).count()
}

fn first_at(events: &[RunEventRecord], kinds: &[EventKind]) -> Option<i64> {
    events
        .iter()
        .find(|e| kinds.contains(&e.event.kind()))
        .map(|e| e.at_ms)
}

/// What one Run's own history must say.
fn check_run(run: &Run, events: &[RunEventRecord], out: &mut Vec<Violation>) {
    let mut broke = |rule: &'static str, detail: String| {
        out.push(Violation {
            run_id: run.run_id.clone(),
            rule,
            detail,
        })
    };
    if !run.state().is_closed() {
        // Where it stopped, for whoever reads the report.
        let last = events.last();
        broke(
            "not_closed",
            format!(
                "still {} after the drain (step {}, epoch {}, {} events, the last {:?}; \
                 its deadline {} s after that)",
                run.state(),
                run.step,
                run.epoch,
                events.len(),
                last.map(|e| e.event.kind()),
                last.map_or(0, |e| (run.budgets.deadline_ms - e.at_ms) / 1000),
            ),
        );
    }
    let ends: usize = TERMINAL.iter().map(|k| count(events, *k)).sum();
    if run.state().is_closed() && ends != 1 {
        broke("terminal_events", format!("{ends} terminal events"));
    }
    if let Some(end) = first_at(events, &TERMINAL) {
        // Waiting for a person stops the clock: an approval has its own
        // deadline, and a Run may end as soon as it is decided.
        let decided = events
            .iter()
            .filter(|e| {
                matches!(
                    e.event.kind(),
                    EventKind::ApprovalDecided | EventKind::ApprovalExpired
                )
            })
            .map(|e| e.at_ms)
            .max();
        let due = run.budgets.deadline_ms.max(decided.unwrap_or(0));
        if end > due + LATE_END_BOUND_MS {
            broke(
                "late_end",
                format!(
                    "ended {} s past its deadline",
                    (end - run.budgets.deadline_ms) / 1000
                ),
            );
        }
    }
    if count(events, EventKind::RunCreated) > 1 {
        broke("created_twice", "two run_created events".into());
    }
    if count(events, EventKind::RunClosed) > 1 {
        broke("closed_twice", "two run_closed events".into());
    }
    let mut rounds = HashSet::new();
    for e in events {
        if let LogEvent::RoundStarted { round, .. } = &e.event {
            if !rounds.insert(*round) {
                broke("round_twice", format!("round {round} started twice"));
            }
        }
    }
    let fan_out = run
        .team
        .as_ref()
        .is_some_and(|t| t.strategy == armada_domain::team::Strategy::FanOut);
    if fan_out && run.state().outcome() == RunState::Completed && !rounds.contains(&2) {
        broke("round_two_missing", "completed without round 2".into());
    }
    let mut steps = HashSet::new();
    let mut children = HashSet::new();
    let mut settled = HashSet::new();
    for e in events {
        match &e.event {
            LogEvent::ChainStepStarted { index, .. } if !steps.insert(*index) => {
                broke("chain_step_twice", format!("step {index} started twice"));
            }
            LogEvent::ChildStarted { run_id, .. } if !children.insert(run_id.clone()) => {
                broke("child_twice", format!("child {run_id} started twice"));
            }
            LogEvent::ApprovalDecided(a) | LogEvent::ApprovalExpired(a)
                if !settled.insert(a.approval_id.clone()) =>
            {
                broke(
                    "approval_twice",
                    format!("approval {} settled twice", a.approval_id),
                );
            }
            _ => {}
        }
    }
    let lead = run
        .team
        .as_ref()
        .is_some_and(|t| t.strategy == Strategy::Lead && t.lead.as_deref() == Some(&run.agent));
    let replies = count(events, EventKind::ModelReply);
    if lead && run.state().outcome() == RunState::Completed && replies != 2 {
        broke(
            "consolidation_not_once",
            format!("a lead completed after {replies} model replies, not plan then consolidate"),
        );
    }
}

/// A Run's `http_request` calls against what the receiver heard: each
/// performed at most once, never without its ledger's dispatch, and
/// performed when the ledger says it answered.
fn check_effects(run: &Run, heard: &Heard, out: &mut Vec<Violation>) {
    for (call_id, rec) in &run.ledger {
        if rec.skill != HTTP_REQUEST {
            continue;
        }
        let n = heard
            .effects
            .get(&effect_key(&run.run_id, call_id))
            .copied()
            .unwrap_or(0);
        let rule = match rec.state() {
            _ if n > 1 => Some("effect_twice"),
            ToolCallState::Done if n == 0 => Some("effect_lost"),
            ToolCallState::Planned | ToolCallState::Failed if n > 0 => Some("effect_unrecorded"),
            _ => None,
        };
        if let Some(rule) = rule {
            out.push(Violation {
                run_id: run.run_id.clone(),
                rule,
                detail: format!(
                    "call {call_id} is {:?} in the ledger; the receiver heard it {n} times",
                    rec.state()
                ),
            });
        }
    }
}

/// An approval the workload decided: applied once, and a rejected call
/// never performed.
fn check_decided(
    d: &Decided,
    runs: &HashMap<String, (Run, Vec<RunEventRecord>)>,
    heard: &Heard,
    out: &mut Vec<Violation>,
) {
    let mut broke = |rule: &'static str, detail: String| {
        out.push(Violation {
            run_id: d.run_id.clone(),
            rule,
            detail,
        })
    };
    let Some((run, events)) = runs.get(&d.run_id) else {
        return;
    };
    let settled: Vec<&armada_domain::run::ApprovalSettled> = events
        .iter()
        .filter_map(|e| match &e.event {
            LogEvent::ApprovalDecided(a) | LogEvent::ApprovalExpired(a)
                if a.approval_id == d.approval_id =>
            {
                Some(a)
            }
            _ => None,
        })
        .collect();
    // A Run cancelled or timed out while it waited settles nothing; nor
    // does one failed because the decision's message, or the message of
    // the step that took the decision up, ran out of deliveries (it says
    // so: a dead letter with its Run failed for it).
    let step = run.ledger.get(&d.call_id).map(|c| c.step);
    let decision_dead_lettered = run.error.as_ref().is_some_and(|e| {
        e.code == "DEAD_LETTERED"
            && (e
                .message
                .contains(&format!("decision of approval {}", d.approval_id))
                || step.is_some_and(|s| e.message.contains(&format!("step {s} message"))))
    });
    let waited_out = decision_dead_lettered
        || matches!(
            run.state().outcome(),
            RunState::Cancelled | RunState::TimedOut
        );
    if settled.is_empty() && !waited_out {
        broke(
            "approval_lost",
            format!("approval {} was decided but never applied", d.approval_id),
        );
    }
    let performed = heard
        .effects
        .get(&effect_key(&d.run_id, &d.call_id))
        .copied()
        .unwrap_or(0);
    if !d.approved && performed > 0 {
        broke(
            "rejected_effect",
            format!(
                "call {} was rejected and performed {performed} times",
                d.call_id
            ),
        );
    }
}

/// A Run's callback: once the Run closed, delivered (after what retries
/// it took), every attempt under the one delivery id.
fn check_callback(run: &Run, heard: &Heard, out: &mut Vec<Violation>) {
    if run.callback_url.is_none() || !run.state().is_closed() {
        return;
    }
    let ids = heard.callback_ids(&run.run_id);
    let taken = heard.callbacks_taken.get(&run.run_id).copied().unwrap_or(0);
    let rule = if ids.len() > 1 {
        Some((
            "callback_ids",
            format!("delivered under {} ids: {ids:?}", ids.len()),
        ))
    } else if taken == 0 {
        Some((
            "callback_missing",
            format!("{} attempts heard, none taken", ids.len()),
        ))
    } else {
        None
    };
    if let Some((rule, detail)) = rule {
        out.push(Violation {
            run_id: run.run_id.clone(),
            rule,
            detail,
        });
    }
}

/// A sandbox job's command appended one line to a file of its own and
/// printed the file: a Run that completed with any other number of lines
/// ran its command twice (or never).
fn check_sandbox_effect(run: &Run, out: &mut Vec<Violation>) {
    if run.state().outcome() != RunState::Completed {
        return;
    }
    for (call_id, rec) in &run.ledger {
        if rec.skill != SHELL_EXEC || rec.state() != ToolCallState::Done {
            continue;
        }
        let stdout = rec
            .result
            .as_ref()
            .and_then(|r| r["stdout"].as_str())
            .unwrap_or_default();
        let lines = stdout.lines().count();
        if lines != 1 {
            out.push(Violation {
                run_id: run.run_id.clone(),
                rule: "sandbox_effect_not_once",
                detail: format!("call {call_id} found its line {lines} times: {stdout:?}"),
            });
        }
    }
}

/// Effects the receiver heard that no Run of the workload has a ledger
/// record for (or that came with no key at all).
fn check_unowned_effects(heard: &Heard, recorded: &HashSet<String>, out: &mut Vec<Violation>) {
    for key in heard.effects.keys().filter(|k| !recorded.contains(*k)) {
        out.push(Violation {
            run_id: key.rsplit_once(':').map(|(r, _)| r).unwrap_or("").into(),
            rule: "effect_unrecorded",
            detail: format!("{key} reached the receiver; no ledger records it"),
        });
    }
    if heard.unkeyed_effects > 0 {
        out.push(Violation {
            run_id: String::new(),
            rule: "effect_unkeyed",
            detail: format!(
                "{} effects came without an Idempotency-Key",
                heard.unkeyed_effects
            ),
        });
    }
}

/// Every Run below `root`: its children (of every round) and, for a
/// relay chain's first step, the steps after it.
async fn tree(svc: &Services, root: &str, out: &mut Vec<Violation>) -> Result<Vec<Run>> {
    let mut runs = Vec::new();
    // (a Run, whether it must exist): a child whose slot is still queued
    // may never have been written (its parent ended first).
    let mut todo = vec![(root.to_string(), true)];
    let mut seen = HashSet::new();
    while let Some((id, must_exist)) = todo.pop() {
        if !seen.insert(id.clone()) {
            continue;
        }
        let Some(run) = svc.runs.get(&id).await? else {
            if must_exist {
                out.push(Violation {
                    run_id: id,
                    rule: "missing",
                    detail: "started but not stored".into(),
                });
            }
            continue;
        };
        if let Some(children) = &run.children {
            todo.extend(
                children
                    .slots
                    .iter()
                    .map(|s| (s.run_id.clone(), s.state() != SlotState::Queued)),
            );
        }
        if let Some(link) = run.chain.as_ref().filter(|l| l.index == 0) {
            for i in 1..link.steps.len() {
                let step = step_run_id(&link.chain_id, i);
                if svc.runs.head(&step).await?.is_some() {
                    todo.push((step, true));
                }
            }
        }
        runs.push(run);
    }
    Ok(runs)
}

/// A relay chain's steps: each after the one before completed, never
/// after a break.
fn check_chain(runs: &HashMap<String, (Run, Vec<RunEventRecord>)>, out: &mut Vec<Violation>) {
    for (run, _) in runs.values() {
        let Some(link) = run.chain.as_ref().filter(|l| l.index > 0) else {
            continue;
        };
        let before = step_run_id(&link.chain_id, link.index as usize - 1);
        match runs.get(&before) {
            Some((prev, _)) if prev.state().outcome() == RunState::Completed => {}
            Some((prev, _)) => out.push(Violation {
                run_id: run.run_id.clone(),
                rule: "chain_step_after_break",
                detail: format!(
                    "step {} ran after step {} ended {}",
                    link.index,
                    link.index - 1,
                    prev.state()
                ),
            }),
            None => out.push(Violation {
                run_id: run.run_id.clone(),
                rule: "chain_step_orphan",
                detail: format!("step {} has no step before it", link.index),
            }),
        }
    }
}

/// A session's messages: every one answered, each after the one before
/// ended (they were posted back to back, and queue).
async fn check_session(
    svc: &Services,
    session_id: &str,
    posted: &[String],
    runs: &HashMap<String, (Run, Vec<RunEventRecord>)>,
    out: &mut Vec<Violation>,
) -> Result<()> {
    let Some(header) = svc.sessions.header(session_id).await? else {
        out.push(Violation {
            run_id: posted.first().cloned().unwrap_or_default(),
            rule: "session_missing",
            detail: format!("session {session_id} is not stored"),
        });
        return Ok(());
    };
    if header.next_seq != posted.len() as u64 || header.done_seq != header.next_seq {
        out.push(Violation {
            run_id: posted.last().cloned().unwrap_or_default(),
            rule: "session_unanswered",
            detail: format!(
                "session {session_id}: {} posted, next_seq {}, done_seq {}",
                posted.len(),
                header.next_seq,
                header.done_seq
            ),
        });
    }
    for pair in posted.windows(2) {
        let (Some((_, before)), Some((_, after))) = (runs.get(&pair[0]), runs.get(&pair[1])) else {
            continue;
        };
        let ended = first_at(before, &TERMINAL);
        let began = first_at(after, &[EventKind::ModelReply]);
        if let (Some(ended), Some(began)) = (ended, began) {
            if began < ended {
                out.push(Violation {
                    run_id: pair[1].clone(),
                    rule: "session_order",
                    detail: format!("answered before {} ended", pair[0]),
                });
            }
        }
    }
    Ok(())
}

/// How a Run ended, with its error's code when it failed
/// (`FAILED:DEAD_LETTERED`): a failure the faults caused is told apart
/// from one the workload asked for.
fn outcome_of(run: &Run) -> String {
    let outcome = run.state().outcome();
    match (&run.error, outcome) {
        (Some(e), RunState::Failed) => format!("{outcome}:{}", e.code),
        _ => outcome.to_string(),
    }
}

/// How many Runs of the workload's trees are not closed yet (a chain's
/// later steps and children outlive their root's close).
pub async fn unclosed(svc: &Services, started: &[Started]) -> Result<usize> {
    let mut ignored = Vec::new();
    let mut open = 0;
    for root in started.iter().flat_map(|s| &s.runs) {
        open += tree(svc, root, &mut ignored)
            .await?
            .iter()
            .filter(|r| !r.state().is_closed())
            .count();
    }
    Ok(open)
}

/// Waits, up to `within`, until every closed root Run with a callback has
/// had one taken by the receiver (a closed Run's callback is queued as it
/// closes, and a refused one is tried again after its backoff).
pub async fn callbacks_settled(
    svc: &Services,
    started: &[Started],
    receiver: &super::receiver::Receiver,
    within: std::time::Duration,
) -> Result<()> {
    let mut waiting = Vec::new();
    for id in started.iter().flat_map(|s| &s.runs) {
        if let Some(run) = svc.runs.get(id).await? {
            if run.callback_url.is_some() && run.state().is_closed() {
                waiting.push(run.run_id);
            }
        }
    }
    let deadline = std::time::Instant::now() + within;
    loop {
        let heard = receiver.heard();
        waiting.retain(|id| !heard.callbacks_taken.contains_key(id));
        if waiting.is_empty() || std::time::Instant::now() > deadline {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// What the checker found.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    pub violations: Vec<Violation>,
    pub outcomes: Outcomes,
    /// Every Run's life, for the recovery times.
    pub spans: Vec<Span>,
}

/// A Run's creation, end and every event between (ms).
#[derive(Debug, Clone, Default)]
pub struct Span {
    pub run_id: String,
    pub created: i64,
    pub ended: Option<i64>,
    /// Its events' times, oldest first.
    pub events: Vec<i64>,
    /// Their kinds, in the same order.
    pub kinds: Vec<&'static str>,
}

impl Span {
    /// Whether it had begun and not ended at `at`.
    pub fn active_at(&self, at: i64) -> bool {
        self.created < at && self.ended.is_none_or(|e| e > at)
    }

    /// Its first event at or after `at`.
    pub fn next_event(&self, at: i64) -> Option<i64> {
        self.events.iter().copied().find(|&t| t >= at)
    }

    /// The kinds of its last event before `at` and its first after.
    pub fn around(&self, at: i64) -> (Option<&'static str>, Option<&'static str>) {
        let i = self.events.partition_point(|&t| t < at);
        let kind = |i: usize| self.kinds.get(i).copied();
        (i.checked_sub(1).and_then(kind), kind(i))
    }
}

/// Reads every Run the workload started and what came of it, with what
/// the receiver heard.
pub async fn check(svc: &Services, started: &[Started], heard: &Heard) -> Result<Checked> {
    let mut checked = Checked::default();
    let out = &mut checked.violations;
    let mut recorded = HashSet::new();
    for job in started {
        let mut runs: HashMap<String, (Run, Vec<RunEventRecord>)> = HashMap::new();
        for root in &job.runs {
            for run in tree(svc, root, out).await? {
                let events = svc.run_events.all_events(&run.run_id).await?;
                check_run(&run, &events, out);
                check_effects(&run, heard, out);
                check_callback(&run, heard, out);
                recorded.extend(run.ledger.keys().map(|c| effect_key(&run.run_id, c)));
                checked.spans.push(Span {
                    run_id: run.run_id.clone(),
                    created: first_at(&events, &[EventKind::RunCreated])
                        .unwrap_or(run.created_at_ms),
                    ended: first_at(&events, &TERMINAL),
                    events: events.iter().map(|e| e.at_ms).collect(),
                    kinds: events.iter().map(|e| e.kind().as_str()).collect(),
                });
                runs.insert(run.run_id.clone(), (run, events));
            }
            let outcome = runs
                .get(root)
                .map(|(r, _)| outcome_of(r))
                .unwrap_or_else(|| "MISSING".into());
            *checked
                .outcomes
                .entry(job.shape.as_str().to_string())
                .or_default()
                .entry(outcome)
                .or_default() += 1;
        }
        check_chain(&runs, out);
        if job.shape == super::workload::Shape::Sandbox {
            for root in &job.runs {
                if let Some((run, _)) = runs.get(root) {
                    check_sandbox_effect(run, out);
                }
            }
        }
        for d in &job.decided {
            check_decided(d, &runs, heard, out);
        }
        if let Some(session) = &job.session {
            check_session(svc, session, &job.runs, &runs, out).await?;
        }
    }
    check_unowned_effects(heard, &recorded, out);
    Ok(checked)
}

/// Messages still visible in the stack's queues once every Run has ended
/// (given half a minute: a settled Run's last notices drain): each is a
/// message nobody will ever handle.
pub async fn stuck_messages(stack: &crate::local::LocalStack) -> Result<Vec<Violation>> {
    use aws_sdk_sqs::types::QueueAttributeName;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut stuck = Vec::new();
        for (logical_id, url) in &stack.provisioned.queue_urls {
            let attrs = stack
                .aws
                .sqs
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .send()
                .await?;
            let visible: u64 = attrs
                .attributes()
                .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if visible > 0 {
                stuck.push(Violation {
                    run_id: String::new(),
                    rule: "stuck_message",
                    detail: format!("{visible} messages left in {logical_id}"),
                });
            }
        }
        if stuck.is_empty() || std::time::Instant::now() > deadline {
            return Ok(stuck);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// Sandboxes left behind once every Run has ended (given half a minute:
/// the last holder lets go as its Run settles): a sandbox still held by
/// a Run that ended (`sandbox_held_by_ended_run`: every later Run of its
/// agent would queue behind it), or a task running that no sandbox names
/// (`sandbox_task_unowned`: it runs, and is paid for, with nobody to stop
/// it).
/// A leak is named only once it has lasted `settle` (the last settling
/// may still be letting go).
pub async fn leaked_sandboxes(
    svc: &Services,
    tenant: &str,
    settle: std::time::Duration,
) -> Result<Vec<Violation>> {
    let deadline = std::time::Instant::now() + settle;
    loop {
        let mut leaked = Vec::new();
        let records = svc.sandboxes.list(tenant).await?;
        for rec in &records {
            let Some(holder) = &rec.holder_run_id else {
                continue;
            };
            let ended = svc
                .runs
                .head(holder)
                .await?
                .is_none_or(|h| h.state.is_terminal());
            if ended && !rec.state().is_gone() {
                leaked.push(Violation {
                    run_id: holder.clone(),
                    rule: "sandbox_held_by_ended_run",
                    detail: format!("the sandbox of {} ({})", rec.agent, rec.state()),
                });
            }
        }
        let named: HashSet<&str> = records
            .iter()
            .filter(|r| !r.state().is_gone())
            .filter_map(|r| r.task_arn.as_deref())
            .collect();
        let tasks = svc.provider.list(None).await?;
        for task in svc.provider.describe(&tasks).await? {
            if task.is_running() && !named.contains(task.arn.as_str()) {
                leaked.push(Violation {
                    run_id: String::new(),
                    rule: "sandbox_task_unowned",
                    detail: format!(
                        "task {} ({}) runs with no sandbox naming it",
                        task.arn,
                        task.started_by.unwrap_or_default()
                    ),
                });
            }
        }
        if leaked.is_empty() || std::time::Instant::now() > deadline {
            return Ok(leaked);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
#[path = "checker_tests.rs"]
mod tests;
