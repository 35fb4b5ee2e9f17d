//! What `armada chaos` found, as `--report` writes it and the CLI prints it.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};

use serde::Serialize;

use super::checker::{Outcomes, Violation};

/// How much the receiver-backed rules had to check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HeardCounts {
    /// Effect requests (each `http_request` POST that arrived).
    pub effects: u64,
    pub callback_attempts: u64,
    /// Callback attempts answered `2xx` (the rest were refused `503`).
    pub callbacks_taken: u64,
    pub approved: u64,
    pub rejected: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    /// How many were measured.
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
}

/// A step a killed host held, and how long until a worker took it up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlowRecovery {
    pub run_id: String,
    pub killed_at_ms: i64,
    pub seconds: f64,
    /// Its last event before the kill and the one that ended the wait.
    pub before: Option<&'static str>,
    pub after: Option<&'static str>,
    /// Kills (of the host or the emulator) that came before it was taken
    /// up: a slow recovery is often a chain of them.
    pub kills_meanwhile: usize,
}

/// What `--report` writes.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub seed: u64,
    /// Shape → how its root Runs ended → how many.
    pub runs: Outcomes,
    /// Fault kind → how many were injected.
    pub faults: BTreeMap<String, u64>,
    pub violations: Vec<Violation>,
    /// Per step a killed host held (its Run `EXECUTING` under the host's
    /// lease): from the kill until the Run's next event, the step taken
    /// up again by the next host.
    pub recovery_s: Option<Percentiles>,
    /// The held steps slowest to be taken up (at most five), for a look.
    pub slowest_recoveries: Vec<SlowRecovery>,
    /// Per Run active at a host kill, waiting or not: from the kill until
    /// its next event.
    pub resumed_s: Option<Percentiles>,
    /// Per host kill: from the kill until every Run active at it had ended.
    pub drained_s: Option<Percentiles>,
    /// The same, per emulator kill.
    pub emulator_recovery_s: Option<Percentiles>,
    /// What reached the counting receiver, and the approvals decided.
    pub heard: HeardCounts,
    pub runs_per_s: f64,
    /// The same workload's throughput without faults, when it was run
    /// beside (`--compare`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault_free_runs_per_s: Option<f64>,
    pub elapsed_s: f64,
    /// Jobs the workload could not post (the API never answered).
    pub errors: Vec<String>,
}

impl Report {
    /// `--report`'s JSON.
    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// The readable summary the command prints.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "armada chaos: seed {}, {:.1} s, {:.2} runs/s",
            self.seed, self.elapsed_s, self.runs_per_s
        );
        if let Some(free) = self.fault_free_runs_per_s {
            s.push_str(&format!(" ({free:.2} runs/s without faults)"));
        }
        s.push('\n');
        for (shape, outcomes) in &self.runs {
            let parts: Vec<String> = outcomes.iter().map(|(o, n)| format!("{o} {n}")).collect();
            s.push_str(&format!("  {shape:<11} {}\n", parts.join(", ")));
        }
        for (fault, n) in &self.faults {
            s.push_str(&format!("  fault {fault}: {n}\n"));
        }
        for (what, r) in [
            ("a held step taken up after a host kill", &self.recovery_s),
            ("a Run's next event after a host kill", &self.resumed_s),
            ("every Run active at a host kill ended", &self.drained_s),
            (
                "every Run active at an emulator kill ended",
                &self.emulator_recovery_s,
            ),
        ] {
            if let Some(r) = r {
                s.push_str(&format!(
                    "  {what}: p50 {:.1} s, p99 {:.1} s (of {})\n",
                    r.p50, r.p99, r.n
                ));
            }
        }
        let h = &self.heard;
        s.push_str(&format!(
            "  heard: {} effects, {} callback attempts ({} taken); approvals: {} approved, {} rejected\n",
            h.effects, h.callback_attempts, h.callbacks_taken, h.approved, h.rejected
        ));
        for e in &self.errors {
            s.push_str(&format!("  error: {e}\n"));
        }
        if self.violations.is_empty() {
            s.push_str("  no violations\n");
        } else {
            s.push_str(&format!("  {} violations:\n", self.violations.len()));
            for v in &self.violations {
                s.push_str(&format!("    {} {}: {}\n", v.rule, v.run_id, v.detail));
            }
        }
        s
    }
}

pub(super) fn percentiles(mut xs: Vec<f64>) -> Option<Percentiles> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    Some(Percentiles {
        n: xs.len(),
        p50: at(0.5),
        p99: at(0.99),
    })
}
