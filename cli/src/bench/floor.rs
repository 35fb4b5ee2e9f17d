//! The floor, Run by Run: the time the emulator itself spent on the very
//! calls of that Run's path, as the SDK interceptor measured them while the
//! Run went through (same operations, tables, conditions and item sizes,
//! under the same concurrency), so nothing is replayed or stood in for.
//!
//! For a Run posted at `t0`, whose terminal commit ended at `t1`:
//! - latency = `t1 - t0`;
//! - floor = the time within `[t0, t1]` during which at least one of the
//!   Run's own calls or hops was in the emulator (their union: the
//!   dispatcher settling a session's previous message may overlap the next
//!   one's calls), plus its share of the calls that name no Run;
//! - its calls: the functions' calls whose request names the Run, started
//!   at or after `t0` and ended by `t1` (later ones, settling and closing,
//!   are off the path);
//! - its queue hops: for each message sent for it, the receive that
//!   returned it, counted from when both the message and the receive were
//!   there (`max(send end, receive start)`) to the receive's end;
//! - a call that names no Run but a session (its header, its history) is
//!   that session's Run in flight when the call started;
//! - calls that name neither (the registry's key and agent reads) are shared
//!   equally by the Runs of the phase.
//!
//! What is left, latency minus floor, is ours: the functions' own work,
//! the pollers, the scripted model's HTTP round trip, and waiting.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{anyhow, Result};

use armada_core::adapters::aws::CallRecord;

/// A Run as a client posted it.
#[derive(Debug, Clone)]
pub(super) struct Posted {
    pub run_id: String,
    pub session: Option<String>,
    pub at: Instant,
}

/// One Run's latency and floor, and the emulator's work on it by
/// operation (a sum: parts may overlap in time, the floor does not).
#[derive(Debug, Clone, Default)]
pub(super) struct RunTiming {
    pub latency_ms: f64,
    pub floor_ms: f64,
    pub by_op: BTreeMap<String, f64>,
}

/// The length of the union of intervals, in milliseconds.
fn covered(mut spans: Vec<(Instant, Instant)>) -> f64 {
    spans.sort();
    let mut total = 0.0;
    let mut cur: Option<(Instant, Instant)> = None;
    for (a, b) in spans {
        cur = match cur {
            Some((ca, cb)) if a <= cb => Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                total += ms(ca, cb);
                Some((a, b))
            }
            None => Some((a, b)),
        };
    }
    total + cur.map_or(0.0, |(a, b)| ms(a, b))
}

const HOP: &str = "queue hop (send → receive)";
const SHARED: &str = "calls naming no run (shared)";

fn ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

/// The end of a Run's terminal commit.
fn commit_end(run_id: &str, calls: &[CallRecord]) -> Result<Instant> {
    calls
        .iter()
        .find(|c| c.terminal && c.runs.iter().any(|r| r == run_id))
        .ok_or_else(|| anyhow!("run {run_id}: no terminal commit in the call log"))?
        .end
        .ok_or_else(|| anyhow!("run {run_id}: its terminal commit did not return"))
}

/// Accounts each posted Run of a phase against the phase's calls: the
/// functions' (`calls`) and the pollers' (`receives`).
pub(super) fn account(
    runs: &[Posted],
    calls: &[CallRecord],
    receives: &[CallRecord],
) -> Result<Vec<RunTiming>> {
    let (first, last) = match (
        runs.iter().map(|r| r.at).min(),
        calls.iter().filter_map(|c| c.end).max(),
    ) {
        (Some(a), Some(b)) => (a, b),
        _ => return Ok(vec![]),
    };
    let windows: Vec<(Instant, Instant)> = runs
        .iter()
        .map(|r| Ok((r.at, commit_end(&r.run_id, calls)?)))
        .collect::<Result<_>>()?;
    // The Run a call belongs to: the one it names, else its session's Run
    // in flight then; `None`: it names neither.
    let owner = |c: &CallRecord| -> Option<usize> {
        if let Some(i) = runs.iter().position(|r| c.runs.contains(&r.run_id)) {
            return Some(i);
        }
        runs.iter().zip(&windows).position(|(r, (from, to))| {
            r.session.as_ref().is_some_and(|s| c.sessions.contains(s))
                && c.start >= *from
                && c.start <= *to
        })
    };
    let owners: Vec<Option<usize>> = calls.iter().map(owner).collect();
    let shared: f64 = calls
        .iter()
        .zip(&owners)
        .filter(|(c, o)| {
            o.is_none()
                && c.runs.is_empty()
                && c.sessions.is_empty()
                && c.start >= first
                && c.end.is_some_and(|e| e <= last)
        })
        .map(|(c, _)| c.millis())
        .sum::<f64>()
        / runs.len().max(1) as f64;
    runs.iter()
        .zip(&windows)
        .enumerate()
        .map(|(i, (run, &(posted, end)))| {
            let id = &run.run_id;
            let named = |c: &&CallRecord| c.runs.iter().any(|r| r == id);
            let mut t = RunTiming {
                latency_ms: ms(posted, end),
                ..RunTiming::default()
            };
            let on_path: Vec<&CallRecord> = calls
                .iter()
                .zip(&owners)
                .filter(|(_, o)| **o == Some(i))
                .map(|(c, _)| c)
                .filter(|c| c.start >= posted && c.end.is_some_and(|e| e <= end))
                .collect();
            let mut spans = Vec::new();
            for c in &on_path {
                *t.by_op.entry(c.op.clone()).or_default() += c.millis();
                if let Some(e) = c.end {
                    spans.push((c.start, e));
                }
            }
            for send in on_path.iter().filter(|c| c.op == "SQS.SendMessage") {
                let Some(sent) = send.end else { continue };
                let got = receives
                    .iter()
                    .filter(named)
                    .filter(|r| r.end.is_some_and(|e| e >= sent && e <= end))
                    .min_by_key(|r| r.end);
                if let Some((r, r_end)) = got.and_then(|r| r.end.map(|e| (r, e))) {
                    let from = sent.max(r.start);
                    *t.by_op.entry(HOP.into()).or_default() += ms(from, r_end);
                    spans.push((from, r_end));
                }
            }
            if shared > 0.0 {
                t.by_op.insert(SHARED.into(), shared);
            }
            t.floor_ms = covered(spans) + shared;
            Ok(t)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn call(op: &str, at: Instant, from_ms: u64, to_ms: u64, runs: &[&str]) -> CallRecord {
        CallRecord::new(
            op,
            at + Duration::from_millis(from_ms),
            Some(at + Duration::from_millis(to_ms)),
            runs.iter().map(|r| r.to_string()).collect(),
        )
    }

    fn posted(id: &str, at: Instant) -> Posted {
        Posted {
            run_id: id.into(),
            session: None,
            at,
        }
    }

    #[test]
    fn a_run_is_charged_its_own_path_and_nothing_after_its_commit() {
        let t0 = Instant::now();
        let mut commit = call("DynamoDB.TransactWriteItems", t0, 40, 50, &["a"]);
        commit.terminal = true;
        let calls = vec![
            call("DynamoDB.TransactWriteItems", t0, 0, 5, &["a"]),
            call("SQS.SendMessage", t0, 5, 7, &["a"]),
            call("DynamoDB.GetItem", t0, 20, 22, &[]),
            call("DynamoDB.GetItem", t0, 21, 24, &["b"]),
            commit,
            call("DynamoDB.TransactWriteItems", t0, 60, 70, &["a"]),
        ];
        // The receive was waiting before the send: counted from the send.
        let receives = vec![call("SQS.ReceiveMessage", t0, 1, 9, &["a"])];
        let t = account(&[posted("a", t0)], &calls, &receives).unwrap();
        assert_eq!(t[0].latency_ms.round(), 50.0);
        let floor = 5.0 + 2.0 + 2.0 + 2.0 + 10.0; // commit, send, hop, shared, terminal
        assert_eq!(t[0].floor_ms.round(), floor);
        assert_eq!(t[0].by_op[HOP].round(), 2.0);
    }

    #[test]
    fn overlapping_calls_count_once_in_the_floor() {
        let t0 = Instant::now();
        let at = |m: u64| t0 + Duration::from_millis(m);
        assert_eq!(
            covered(vec![(at(0), at(10)), (at(5), at(12)), (at(20), at(21))]).round(),
            13.0
        );
        assert_eq!(covered(vec![]), 0.0);
    }

    #[test]
    fn a_run_without_a_terminal_commit_is_an_error_not_a_number() {
        let t0 = Instant::now();
        let calls = vec![call("DynamoDB.GetItem", t0, 0, 1, &["a"])];
        assert!(account(&[posted("a", t0)], &calls, &[]).is_err());
    }
}
