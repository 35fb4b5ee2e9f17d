//! `armada chaos` as a gate: a seeded workload of every shape (answers
//! with callbacks, sessions, delegations, a fan-out team of five, relay
//! chains, cancels, effects at a counting receiver, approvals approved
//! and rejected, lead plans)
//! while the functions host is killed at seeded moments and at steps'
//! named fault points, the emulator is killed, each started again, and the
//! pollers hand batches twice, old batches again and batches late; the
//! checker reads every Run's history and finds no broken promise.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use armada_cli::chaos::{self, ChaosOpts, Fault};
use armada_tests::root;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seeded_workload_under_kills_and_redeliveries_breaks_no_promise() {
    armada_core::telemetry::init_with("warn");
    let opts = ChaosOpts {
        runs: 100,
        seed: 7,
        concurrency: 6,
        faults: Fault::ALL.to_vec(),
        report: Some(
            std::env::temp_dir().join(format!("armada-chaos-{}.json", std::process::id())),
        ),
        drain: Duration::from_secs(300),
        // Dense, but with the stack up most of the time: at a host kill
        // every 8-15 s a hundred jobs' sessions and teams spent their
        // wall clock on recoveries (a third of them timed out) and little
        // was left to check. Half the host kills are aimed at a point.
        kill_every: (Duration::from_secs(8), Duration::from_secs(20)),
        emulator_kill_every: (Duration::from_secs(40), Duration::from_secs(80)),
        sandbox_kill_every: (Duration::from_secs(10), Duration::from_secs(20)),
        aimed_percent: 50,
        fault_window: Duration::from_secs(20),
        label: String::new(),
        // Sandbox calls too: every host kill kills their agents mid-call.
        sandbox_jobs: true,
    };
    let report = chaos::run(&root(), &opts).await.unwrap();
    let summary = report.summary();
    assert!(report.errors.is_empty(), "{summary}");
    assert!(report.violations.is_empty(), "{summary}");
    for fault in ["host-kill", "emulator-kill", "delayed-batch"] {
        assert!(
            report.faults.get(fault).copied().unwrap_or(0) >= 1,
            "{summary}"
        );
    }
    let at_points: u64 = report
        .faults
        .iter()
        .filter(|(k, _)| k.starts_with("point-kill:"))
        .map(|(_, n)| n)
        .sum();
    assert!(at_points >= 1, "{summary}");
    // Every shape ran, and every root Run is counted once.
    assert_eq!(report.runs.len(), 10, "{summary}");
    // The receiver's rules had something to check.
    let h = report.heard;
    assert!(h.effects >= 1 && h.callbacks_taken >= 1, "{summary}");
    assert!(h.approved >= 1 && h.rejected >= 1, "{summary}");
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(opts.report.unwrap()).unwrap()).unwrap();
    assert_eq!(written["seed"], 7);
    assert_eq!(written["violations"], serde_json::json!([]));
}
