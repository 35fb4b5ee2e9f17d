//! `armada chaos`: a seeded workload of every shape the scripted model
//! drives, run against a local stack while faults are injected on a
//! seeded schedule, then a checker that reads the history and names every
//! broken promise with its Run. The report is the goal made visible: no
//! violations.
//!
//! - [`workload`]: the jobs, posted through the HTTP API
//! - [`faults`]: the kills, and the stack they are injected into
//! - [`checker`]: the rules, over the Run records, events, sessions, queues
//!
//! Faults so far: `host-kill` (the functions host ended at once, mid-step,
//! as `kill -9` would end it, and started again over the same emulator,
//! tables and queues), `point-kill` (the same, exactly where the functions
//! meet one of their named fault points), `emulator-kill` (`kill -9` of
//! the emulator, which keeps its state in a directory of the run's own,
//! and its start again), `redeliver` (the pollers hand 5% of batches to
//! two invocations at once and, before 5% of batches, an old batch
//! again), `delay` (5% of batches handed late, by up to 20 s) and
//! `slow-emulator` (5% of the emulator's answers late, by up to 2 s).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;

use tokio::sync::{watch, Mutex};

use crate::local::{emulator, process, LocalOptions, LocalStack};

pub mod checker;
mod evidence;
mod faults;
pub mod receiver;
mod report;
pub mod workload;

use faults::{Emulator, Host, PointKills};
use report::percentiles;
pub use report::{HeardCounts, Percentiles, Report, SlowRecovery};

use crate::rng::Rng;
use workload::{Api, Started};

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// The functions host killed mid-work and started again.
    HostKill,
    /// Batches handed to two invocations at once, and old batches handed
    /// again (the pollers', as SQS's at-least-once allows).
    Redeliver,
    /// The emulator killed (`kill -9`) and started again over its state.
    EmulatorKill,
    /// The functions host killed where its work meets a named fault point
    /// ([`armada_core::faults::FaultPoint`]: in a step, in the children's
    /// start and their ends' noting, after an approval's decision).
    PointKill,
    /// Batches handed to their function late (up to 20 s, their messages
    /// in flight meanwhile).
    Delay,
    /// The emulator answers 5% of requests late, by up to 2 s.
    SlowEmulator,
    /// A sandbox agent killed (mid-call, if it had one), its host up.
    SandboxKill,
}

impl Fault {
    pub const ALL: [Fault; 7] = [
        Fault::HostKill,
        Fault::Redeliver,
        Fault::EmulatorKill,
        Fault::PointKill,
        Fault::Delay,
        Fault::SlowEmulator,
        Fault::SandboxKill,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Fault::HostKill => "host-kill",
            Fault::Redeliver => "redeliver",
            Fault::EmulatorKill => "emulator-kill",
            Fault::PointKill => "point-kill",
            Fault::Delay => "delay",
            Fault::SlowEmulator => "slow-emulator",
            Fault::SandboxKill => "sandbox-kill",
        }
    }

    /// A comma-separated list (`all` for every kind, `none` for none).
    pub fn parse_list(s: &str) -> Result<Vec<Fault>> {
        match s.trim() {
            "all" => return Ok(Fault::ALL.to_vec()),
            "none" | "" => return Ok(vec![]),
            _ => {}
        }
        s.split(',')
            .map(|f| {
                let f = f.trim();
                Fault::ALL
                    .into_iter()
                    .find(|k| k.as_str() == f)
                    .with_context(|| {
                        let known: Vec<&str> = Fault::ALL.iter().map(|k| k.as_str()).collect();
                        format!("unknown fault '{f}'; known: {}", known.join(", "))
                    })
            })
            .collect()
    }
}

/// `MIN-MAX` seconds (`3-12`), as the time between two faults.
pub fn parse_span(s: &str) -> Result<(Duration, Duration)> {
    let (lo, hi) = s
        .split_once('-')
        .with_context(|| format!("'{s}': expected MIN-MAX seconds"))?;
    let secs = |x: &str| -> Result<u64> {
        x.trim()
            .parse()
            .with_context(|| format!("'{s}': '{x}' is not a whole number of seconds"))
    };
    let (lo, hi) = (secs(lo)?, secs(hi)?);
    if lo == 0 || lo > hi {
        bail!("'{s}': expected 1 <= MIN <= MAX");
    }
    Ok((Duration::from_secs(lo), Duration::from_secs(hi)))
}

#[derive(Debug, Clone)]
pub struct ChaosOpts {
    pub runs: usize,
    pub seed: u64,
    /// Jobs in flight at once.
    pub concurrency: usize,
    pub faults: Vec<Fault>,
    pub report: Option<PathBuf>,
    /// How long Runs may take to end after the workload is posted and
    /// the faults stop (the recovery bound).
    pub drain: Duration,
    /// Between host kills (at a moment or at a fault point): at least,
    /// at most.
    pub kill_every: (Duration, Duration),
    /// Between emulator kills: at least, at most.
    pub emulator_kill_every: (Duration, Duration),
    /// Between kills of a sandbox agent: at least, at most.
    pub sandbox_kill_every: (Duration, Duration),
    /// The share of host kills aimed at a fault point (drawn among them
    /// all), with both `host-kill` and `point-kill` on; one of them alone
    /// makes every kill of its kind.
    pub aimed_percent: u64,
    /// Faults go on at least this long (and while the workload is
    /// posted, and until every kill asked for could come once).
    pub fault_window: Duration,
    /// Set apart this run's stack, state and keys from another's of the
    /// same process (`-free` for the fault-free run beside it).
    pub label: String,
    /// Whether the workload runs sandbox commands.
    pub sandbox_jobs: bool,
}

impl ChaosOpts {
    /// How long faults go on at least: the window, or the longest first
    /// pause of a kill asked for, so that each comes at least once.
    fn faults_for_at_least(&self) -> Duration {
        [
            (Fault::HostKill, self.kill_every.1),
            // An aimed kill waits up to the least pause for its point.
            (Fault::PointKill, self.kill_every.1 + self.kill_every.0),
            (Fault::EmulatorKill, self.emulator_kill_every.1),
            (Fault::SandboxKill, self.sandbox_kill_every.1),
        ]
        .iter()
        .filter(|(f, _)| self.faults.contains(f))
        .map(|(_, max)| *max)
        .fold(self.fault_window, Duration::max)
    }
}

impl Default for ChaosOpts {
    fn default() -> Self {
        ChaosOpts {
            runs: 100,
            seed: 1,
            concurrency: 8,
            faults: Fault::ALL.to_vec(),
            report: None,
            drain: Duration::from_secs(240),
            // A sane rate: each Run meets a kill or two, and a host comes
            // back (its messages after their visibility timeout, 60 s for
            // steps) before the next. `tests/chaos.rs` runs far denser.
            kill_every: (Duration::from_secs(45), Duration::from_secs(90)),
            emulator_kill_every: (Duration::from_secs(90), Duration::from_secs(180)),
            sandbox_kill_every: (Duration::from_secs(30), Duration::from_secs(60)),
            aimed_percent: 50,
            fault_window: Duration::from_secs(60),
            label: String::new(),
            sandbox_jobs: true,
        }
    }
}

/// Runs the workload under its faults and checks what it left.
pub async fn run(root: &Path, opts: &ChaosOpts) -> Result<Report> {
    if opts.runs == 0 || opts.concurrency == 0 {
        bail!("--runs and --concurrency must be at least 1");
    }
    let seed = Rng::new(opts.seed);
    let incarnation = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let points = opts
        .faults
        .contains(&Fault::PointKill)
        .then(|| PointKills::new(incarnation.clone()));
    // A tenth of callback attempts refused: their retries are checked too.
    let receiver = receiver::Receiver::start(seed.fork("receiver"), 10).await?;
    let host = Host {
        receiver: receiver.host.clone(),
        data_plane: opts.sandbox_jobs,
        root: root.to_path_buf(),
        stack: format!("chaos-{}-{}{}", opts.seed, std::process::id(), opts.label),
        api_port: process::free_port()?,
        faults: match &points {
            Some(p) => p.clone(),
            None => Arc::new(armada_core::faults::NoFaults),
        },
        incarnation,
        last_kill_ms: Default::default(),
        secret: armada_domain::api::ApiKey::mint().secret,
        deliveries: (opts.faults.contains(&Fault::Redeliver)
            || opts.faults.contains(&Fault::Delay))
        .then(|| {
            let again = if opts.faults.contains(&Fault::Redeliver) {
                5
            } else {
                0
            };
            let late = if opts.faults.contains(&Fault::Delay) {
                5
            } else {
                0
            };
            Arc::new(
                crate::local::pollers::DeliveryFaults::new(
                    seed.fork("deliveries").next_u64(),
                    again,
                    again,
                )
                .with_delays(late, Duration::from_secs(20)),
            )
        }),
    };
    // The emulator is this run's own, with its own state (unless
    // AWS_ENDPOINT_URL names one to use as it is).
    let given = LocalOptions::new(root).endpoint;
    for fault in [Fault::EmulatorKill, Fault::SlowEmulator] {
        if given.is_some() && opts.faults.contains(&fault) {
            bail!(
                "{} needs the emulator armada starts: unset AWS_ENDPOINT_URL",
                fault.as_str()
            );
        }
    }
    let slow = opts
        .faults
        .contains(&Fault::SlowEmulator)
        .then_some((5, 2000));
    let state = emulator::ensure_state_dir(root)?.join(&host.stack);
    let owned = match &given {
        Some(_) => None,
        None => Some(Arc::new(Emulator::start(root, state.clone(), slow).await?)),
    };
    let endpoint = match (&given, &owned) {
        (Some(ep), _) => ep.clone(),
        (None, Some(e)) => e.endpoint.clone(),
        (None, None) => unreachable!("one or the other"),
    };
    let first = LocalStack::start(faults::options(&host, &endpoint)).await?;
    let mut api = Api {
        http: reqwest::Client::new(),
        base: first.api_url.clone(),
        key: first.tenant_key.clone(),
        admin_key: first.admin_key.clone(),
        approver_key: String::new(),
        patience: Duration::from_secs(180),
        effect_url: receiver.effect_url(),
        callback_url: receiver.callback_url(),
    };
    let tenant = first.tenant.clone();
    let stack = Arc::new(Mutex::new(Some(first)));
    api.approver_key = workload::prepare(&api, &tenant, &receiver.host).await?;
    let jobs = workload::plan(&mut seed.fork("workload"), opts.runs, opts.sandbox_jobs);

    let (stop_tx, stop_rx) = watch::channel(false);
    let at_moments = opts.faults.contains(&Fault::HostKill);
    let killer = (at_moments || points.is_some()).then(|| {
        let schedule = faults::KillSchedule {
            every: opts.kill_every,
            aimed_percent: match (at_moments, points.is_some()) {
                (true, true) => opts.aimed_percent.min(100),
                (false, _) => 100,
                (true, false) => 0,
            },
        };
        tokio::spawn(faults::host_kills(
            host.clone(),
            endpoint.clone(),
            stack.clone(),
            points.clone(),
            seed.fork("faults"),
            schedule,
            stop_rx,
        ))
    });
    let emulator_killer = match &owned {
        Some(e) if opts.faults.contains(&Fault::EmulatorKill) => {
            Some(tokio::spawn(faults::emulator_kills(
                e.clone(),
                seed.fork("emulator faults"),
                opts.emulator_kill_every,
                stop_tx.subscribe(),
            )))
        }
        _ => None,
    };
    let sandbox_killer =
        (opts.faults.contains(&Fault::SandboxKill) && opts.sandbox_jobs).then(|| {
            tokio::spawn(faults::sandbox_kills(
                stack.clone(),
                seed.fork("sandbox faults"),
                opts.sandbox_kill_every,
                stop_tx.subscribe(),
            ))
        });
    let began = Instant::now();
    let tag = format!("{}-{}{}", opts.seed, std::process::id(), opts.label);
    let results: Vec<Result<Started>> = futures::stream::iter(jobs.iter())
        .map(|job| workload::execute(&api, job, &tag))
        .buffer_unordered(opts.concurrency)
        .collect()
        .await;
    let mut started = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(s) => started.push(s),
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    // Faults go on while the workload is posted (and for the fault window
    // at least); then every root must end within the drain (a killed
    // host's messages come back after their queue's visibility timeout:
    // 60 s for steps, 180 s for the dispatcher).
    tokio::time::sleep(opts.faults_for_at_least().saturating_sub(began.elapsed())).await;
    let _ = stop_tx.send(true);
    let kills = match killer {
        Some(k) => k.await.context("the host killer")??,
        None => Vec::new(),
    };
    let emulator_kills = match emulator_killer {
        Some(k) => k.await.context("the emulator killer")??,
        None => Vec::new(),
    };
    let sandbox_kills = match sandbox_killer {
        Some(k) => k.await.context("the sandbox killer")??,
        None => Vec::new(),
    };
    let points_killed: Vec<armada_core::faults::FaultPoint> =
        kills.iter().filter_map(|(_, p)| *p).collect();
    // A kill at a point is a host kill like the others.
    let held_at: Vec<_> = kills.into_iter().map(|(k, _)| (k.at, k.held)).collect();
    let kills: Vec<i64> = held_at.iter().map(|(at, _)| *at).collect();
    let roots: Vec<String> = started.iter().flat_map(|s| s.runs.clone()).collect();
    let deadline = Instant::now() + opts.drain;
    while Instant::now() < deadline {
        let Some(svc) = stack.lock().await.as_ref().map(|s| s.svc.clone()) else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let mut open = 0;
        for id in &roots {
            let closed = svc
                .runs
                .head(id)
                .await
                .ok()
                .flatten()
                .is_some_and(|h| h.state.is_closed());
            if !closed {
                open += 1;
            }
        }
        // Every root closed: then every Run of their trees.
        if open == 0
            && checker::unclosed(&svc, &started)
                .await
                .is_ok_and(|n| n == 0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let elapsed = began.elapsed();
    let held = stack.lock().await.take();
    let Some(last) = held else {
        bail!("no stack is running at the end");
    };
    let settled =
        checker::callbacks_settled(&last.svc, &started, &receiver, Duration::from_secs(90)).await;
    let checked = match settled {
        Ok(()) => checker::check(&last.svc, &started, &receiver.heard()).await,
        Err(e) => Err(e),
    };
    let stuck = checker::stuck_messages(&last).await;
    let leaked = checker::leaked_sandboxes(&last.svc, &tenant, Duration::from_secs(30)).await;
    let mut checked = checked;
    if let Ok(c) = &mut checked {
        evidence::explain(&last.svc, &mut c.violations).await;
    }
    last.stop().await;
    let checked = checked?;
    let mut violations = checked.violations;
    violations.extend(stuck?);
    violations.extend(leaked?);
    if let Some(e) = &owned {
        process::stop(e.pid(), Duration::from_secs(60));
        if violations.is_empty() {
            let _ = std::fs::remove_dir_all(&state);
        } else {
            // What the checker read, for a look: `moto_server`-compatible
            // state to start an emulator over (`armada_moto.py --state-dir`).
            eprintln!(
                "armada chaos: the emulator's state is kept in {}",
                state.display()
            );
        }
    }
    // Per step a killed host held: until a worker claimed it again (or,
    // not seen within the watch, its Run's next event or end).
    let mut steps_held = Vec::new();
    for (at, held) in held_at {
        steps_held.push((at, held.await.unwrap_or_default()));
    }
    let all_kills: Vec<i64> = kills.iter().chain(&emulator_kills).copied().collect();
    let mut taken_up: Vec<SlowRecovery> = {
        let by_run: HashMap<&str, &checker::Span> = checked
            .spans
            .iter()
            .map(|s| (s.run_id.as_str(), s))
            .collect();
        steps_held
            .iter()
            .flat_map(|(at, steps)| steps.iter().map(move |h| (*at, h)))
            .filter_map(|(at, h)| {
                let span = by_run.get(h.run_id.as_str())?;
                let next = span.next_event(at).or(span.ended)?;
                let (before, after) = span.around(at);
                let seconds = h.taken_up_s.unwrap_or((next - at) as f64 / 1000.0);
                let until = at + (seconds * 1000.0) as i64;
                Some(SlowRecovery {
                    run_id: h.run_id.clone(),
                    killed_at_ms: at,
                    seconds,
                    before,
                    after,
                    kills_meanwhile: all_kills.iter().filter(|k| **k > at && **k < until).count(),
                })
            })
            .collect()
    };
    let recovery_s = percentiles(taken_up.iter().map(|r| r.seconds).collect());
    taken_up.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    taken_up.truncate(5);
    let drained = |kills: &[i64]| {
        percentiles(
            kills
                .iter()
                .filter_map(|&at| {
                    // The Runs active at the kill: until the last of them ended.
                    let ends: Vec<i64> = checked
                        .spans
                        .iter()
                        .filter(|s| s.active_at(at))
                        .map(|s| s.ended.unwrap_or(i64::MAX))
                        .collect();
                    let last = ends.into_iter().max()?;
                    (last != i64::MAX).then(|| (last - at) as f64 / 1000.0)
                })
                .collect(),
        )
    };
    // Per Run active at a kill: how long until it moved again (its next
    // event), whatever else it waited for meanwhile.
    let resumed = |kills: &[i64]| {
        percentiles(
            kills
                .iter()
                .flat_map(|&at| {
                    checked
                        .spans
                        .iter()
                        .filter(move |s| s.active_at(at))
                        .filter_map(move |s| s.next_event(at))
                        .map(move |next| (next - at) as f64 / 1000.0)
                })
                .collect(),
        )
    };
    let total: u64 = checked.outcomes.values().flat_map(|o| o.values()).sum();
    let heard = {
        let h = receiver.heard();
        let decided: Vec<bool> = started
            .iter()
            .flat_map(|s| s.decided.iter().map(|d| d.approved))
            .collect();
        HeardCounts {
            effects: h.effects.values().map(|n| u64::from(*n)).sum(),
            callback_attempts: h.callbacks.values().map(|v| v.len() as u64).sum(),
            callbacks_taken: h.callbacks_taken.values().map(|n| u64::from(*n)).sum(),
            approved: decided.iter().filter(|a| **a).count() as u64,
            rejected: decided.iter().filter(|a| !**a).count() as u64,
        }
    };
    let report = Report {
        seed: opts.seed,
        runs: checked.outcomes,
        faults: {
            use std::sync::atomic::Ordering::Relaxed;
            let (twice, again, late) = host.deliveries.as_ref().map_or((0, 0, 0), |d| {
                (
                    d.duplicated.load(Relaxed),
                    d.replayed.load(Relaxed),
                    d.delayed.load(Relaxed),
                )
            });
            let mut at_points: BTreeMap<String, u64> = BTreeMap::new();
            for point in &points_killed {
                *at_points
                    .entry(format!("point-kill:{}", point.as_str()))
                    .or_default() += 1;
            }
            [
                ("host-kill", (kills.len() - points_killed.len()) as u64),
                ("emulator-kill", emulator_kills.len() as u64),
                ("sandbox-kill", sandbox_kills.len() as u64),
                ("duplicated-batch", twice),
                ("replayed-batch", again),
                ("delayed-batch", late),
                // Counted by the emulator, not here: its share is reported.
                (
                    "slow-emulator-percent",
                    slow.map_or(0, |(p, _)| u64::from(p)),
                ),
            ]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| (k.to_string(), n))
            .chain(at_points)
            .collect()
        },
        violations,
        heard,
        recovery_s,
        slowest_recoveries: taken_up,
        resumed_s: resumed(&kills),
        drained_s: drained(&kills),
        emulator_recovery_s: drained(&emulator_kills),
        runs_per_s: total as f64 / elapsed.as_secs_f64().max(0.001),
        fault_free_runs_per_s: None,
        elapsed_s: elapsed.as_secs_f64(),
        errors,
    };
    if let Some(path) = &opts.report {
        report.write(path)?;
    }
    Ok(report)
}

/// The workload under its faults, and (`compare`) first the same workload
/// without any, on a stack of its own, for the throughput beside it.
pub async fn run_compared(root: &Path, opts: &ChaosOpts, compare: bool) -> Result<Report> {
    let free = if compare {
        let quiet = ChaosOpts {
            faults: vec![],
            report: None,
            label: format!("{}-free", opts.label),
            ..opts.clone()
        };
        Some(run(root, &quiet).await?.runs_per_s)
    } else {
        None
    };
    let mut report = run(root, opts).await?;
    report.fault_free_runs_per_s = free;
    if let (Some(path), Some(_)) = (&opts.report, free) {
        report.write(path)?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_min_then_max_whole_seconds() {
        let s = |x| parse_span(x).map(|(a, b)| (a.as_secs(), b.as_secs()));
        assert_eq!(s("3-12").ok(), Some((3, 12)));
        assert_eq!(s(" 30 - 30 ").ok(), Some((30, 30)));
        for bad in ["12-3", "0-5", "5", "a-b", "-3"] {
            assert!(s(bad).is_err(), "{bad}");
        }
    }
}
