//! The faults `armada chaos` injects, and the stack it injects them into:
//! the functions host killed at seeded moments or at a step's named fault
//! points and started again, the emulator killed and started again over its
//! state.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::future::BoxFuture;
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

use armada_core::faults::{Aborted, FaultPoint, FaultPoints};
use aws_sdk_dynamodb::types::AttributeValue;

use crate::local::{emulator, process, LocalOptions, LocalStack};
use crate::rng::Rng;

/// What the stack is started with, each time.
#[derive(Clone)]
pub(super) struct Host {
    pub root: PathBuf,
    pub stack: String,
    pub api_port: u16,
    /// One deployment secret across restarts: what a killed host sealed
    /// (callbacks, replies, approval notices) the next one must accept.
    pub secret: String,
    /// The pollers' delivery faults, one schedule across restarts.
    pub deliveries: Option<Arc<crate::local::pollers::DeliveryFaults>>,
    /// Where the functions meet their named fault points, one across
    /// restarts.
    pub faults: Arc<dyn FaultPoints>,
    /// Which host is running: bumped at each kill.
    pub incarnation: Arc<std::sync::atomic::AtomicU64>,
    /// When the last kill came (ms; 0 before any).
    pub last_kill_ms: Arc<std::sync::atomic::AtomicI64>,
    /// The counting receiver (`host:port`): the one private target the
    /// egress guard lets the workload's calls and callbacks reach.
    pub receiver: String,
    /// Whether the stack runs the local sandbox data plane.
    pub data_plane: bool,
}

/// The local stack's options for this workload: its own stack name, a
/// fixed API port (the workload's clients keep their URL across a
/// restart), the emulator at `endpoint`.
pub(super) fn options(host: &Host, endpoint: &str) -> LocalOptions {
    let (root, stack, api_port) = (host.root.as_path(), host.stack.as_str(), host.api_port);
    let mut opts = LocalOptions::new(root);
    opts.parameters
        .insert("CallbackSigningSecret".into(), host.secret.clone());
    opts.parameters
        .insert("EgressAllow".into(), host.receiver.clone());
    // A refused callback is tried again within the drain.
    opts.parameters
        .insert("CallbackRetryBaseSeconds".into(), "2".into());
    opts.delivery_faults = host.deliveries.clone();
    opts.faults = host.faults.clone();
    opts.stack = stack.to_string();
    opts.api_port = api_port;
    opts.smtp_port = 0;
    opts.poll_wait_seconds = 1;
    // Sandbox tasks run as local processes, killed with the host (a
    // sandbox agent dies mid-call) and started again by the next one;
    // without sandbox jobs there is nothing for a data plane to run.
    opts.data_plane = host.data_plane;
    for (k, v) in [
        ("SandboxCheckSeconds", "1"),
        ("SandboxHeartbeatSeconds", "1"),
        ("SandboxStaleSeconds", "4"),
    ] {
        opts.parameters.insert(k.into(), v.into());
    }
    opts.emulator_dies_with_us = true;
    opts.mail_outbox = None;
    opts.endpoint = Some(endpoint.to_string());
    opts
}

/// The stack started again over the same emulator: the port the killed
/// one held is taken again as soon as it is let go.
async fn restart(host: &Host, endpoint: &str) -> Result<LocalStack> {
    let mut last = None;
    for _ in 0..40 {
        match LocalStack::start(options(host, endpoint)).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("the stack did not start again")))
}

/// A kill of the functions host: when, and the Runs whose steps it held.
pub(super) struct HostKill {
    pub at: i64,
    /// The steps the host held as it died, and when each was taken up
    /// again (see [`held_steps`] and [`taken_up`]).
    pub held: JoinHandle<Vec<HeldStep>>,
}

/// A step a killed host held: its Run, and how long after the kill a
/// worker claimed it again or the Run left `EXECUTING` (`None`: not
/// within [`TAKEN_UP_WITHIN`]).
#[derive(Debug, Clone)]
pub(super) struct HeldStep {
    pub run_id: String,
    pub taken_up_s: Option<f64>,
}

/// How long a held step is watched for.
const TAKEN_UP_WITHIN: Duration = Duration::from_secs(300);

impl HostKill {
    /// Ends `stack`'s host at once, as `kill -9` would.
    fn of(host: &Host, stack: LocalStack) -> HostKill {
        let dynamo = stack.aws.dynamo.clone();
        let table = stack.svc.cfg.runs_table.clone();
        let lease_ms = stack.svc.cfg.step_lease_ms;
        host.incarnation.fetch_add(1, Ordering::SeqCst);
        stack.kill();
        let at = armada_core::clock::Clock::default().now_ms();
        let since = host.last_kill_ms.swap(at, Ordering::SeqCst);
        HostKill {
            at,
            held: tokio::spawn(async move {
                let held = held_steps(&dynamo, &table, at, since, lease_ms).await;
                taken_up(&dynamo, &table, at, held).await
            }),
        }
    }
}

/// The Runs whose step a host killed at `at` held, with their epochs:
/// `EXECUTING` under a lease last renewed after the kill before it
/// (`since`; a lease lasts `lease_ms`): one from before was a dead
/// worker's. Read while the next host starts; nothing (and a warning) if
/// the emulator cannot be read within half a minute.
async fn held_steps(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    at: i64,
    since: i64,
    lease_ms: i64,
) -> Vec<(String, i64)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    'read: loop {
        let mut held = Vec::new();
        let mut start = None;
        loop {
            let page = dynamo
                .scan()
                .table_name(table)
                .projection_expression("run_id, #s, lease_until, epoch")
                .expression_attribute_names("#s", "state")
                .set_exclusive_start_key(start)
                .send()
                .await;
            let page = match page {
                Ok(p) => p,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "chaos: runs table unreadable; again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue 'read;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "chaos: the steps a killed host held are unknown");
                    return Vec::new();
                }
            };
            for item in page.items() {
                let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
                let lease = number(item, "lease_until");
                let renewed = lease - lease_ms;
                if text("state").as_deref() == Some("EXECUTING") && lease > at && renewed > since {
                    held.extend(text("run_id").map(|r| (r, number(item, "epoch"))));
                }
            }
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                return held;
            }
        }
    }
}

fn number(item: &HashMap<String, AttributeValue>, key: &str) -> i64 {
    item.get(key)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Watches each held step (a Run and its epoch at the kill) until a
/// worker claims it again (a new epoch) or its Run leaves `EXECUTING`.
async fn taken_up(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    at: i64,
    held: Vec<(String, i64)>,
) -> Vec<HeldStep> {
    let mut watched: Vec<(HeldStep, i64)> = held
        .into_iter()
        .map(|(run_id, epoch)| {
            let step = HeldStep {
                run_id,
                taken_up_s: None,
            };
            (step, epoch)
        })
        .collect();
    let until = Instant::now() + TAKEN_UP_WITHIN;
    while Instant::now() < until && watched.iter().any(|(h, _)| h.taken_up_s.is_none()) {
        for (step, epoch) in watched.iter_mut().filter(|(h, _)| h.taken_up_s.is_none()) {
            let read = dynamo
                .get_item()
                .table_name(table)
                .key("run_id", AttributeValue::S(step.run_id.clone()))
                .projection_expression("#s, epoch")
                .expression_attribute_names("#s", "state")
                .send()
                .await;
            // Unreadable (the emulator restarting): looked at again.
            let Some(item) = read.ok().and_then(|r| r.item) else {
                continue;
            };
            let executing = item.get("state").and_then(|v| v.as_s().ok());
            if number(&item, "epoch") != *epoch || executing.is_none_or(|s| s != "EXECUTING") {
                let now = armada_core::clock::Clock::default().now_ms();
                step.taken_up_s = Some((now - at) as f64 / 1000.0);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    watched.into_iter().map(|(h, _)| h).collect()
}

/// How the host is killed: at seeded moments, every `every` (at least,
/// at most), `aimed_percent` of the kills (evenly spread) aimed at a
/// fault point.
#[derive(Debug, Clone, Copy)]
pub(super) struct KillSchedule {
    pub every: (Duration, Duration),
    pub aimed_percent: u64,
}

/// Kills the host on its schedule until told to stop; the kills, each with
/// the fault point it landed on (`None`: a moment's). A kill aimed at a
/// point waits for a step to meet it, at most the schedule's least pause
/// (then it comes at that moment), so aimed or not the kills keep one
/// rate: `--kill-every` is the time between any two.
pub(super) async fn host_kills(
    host: Host,
    endpoint: String,
    stack: Arc<Mutex<Option<LocalStack>>>,
    points: Option<Arc<PointKills>>,
    mut rng: Rng,
    schedule: KillSchedule,
    mut stop: watch::Receiver<bool>,
) -> Result<Vec<(HostKill, Option<FaultPoint>)>> {
    let mut kills = Vec::new();
    // The share aimed, spread evenly (at half, every other kill, the
    // first aimed): a seed cannot draw a run with none.
    let mut share = 100 - schedule.aimed_percent.min(100);
    while seeded_pause(&mut rng, schedule.every, &mut stop).await {
        share += schedule.aimed_percent.min(100);
        let aimed = share >= 100;
        if aimed {
            share -= 100;
        }
        let aim = match &points {
            Some(points) if aimed => {
                let point =
                    FaultPoint::ALL[rng.between(0, FaultPoint::ALL.len() as u64 - 1) as usize];
                Some((points, point))
            }
            _ => None,
        };
        let mut point = None;
        if let Some((points, drawn)) = aim {
            // The drawn point first; met by no step within half the least
            // pause, the first point any step meets (so rare points are
            // aimed at, and an aimed kill lands at a point unless the
            // stack idles).
            let mut stopped = false;
            for target in [Some(drawn), None] {
                points.arm(target);
                stopped = struck_within(points, schedule.every.0 / 2, &mut stop).await;
                if stopped || points.has_struck() {
                    break;
                }
            }
            // Nothing is aimed any more; a step held at a point meanwhile
            // dies with this kill.
            point = points.disarm();
            if stopped && point.is_none() {
                break;
            }
        }
        let mut held = stack.lock().await;
        if let Some(s) = held.take() {
            kills.push((HostKill::of(&host, s), point));
            match point {
                Some(p) => tracing::warn!(
                    point = p.as_str(),
                    "chaos: the functions host was killed at a fault point"
                ),
                None => tracing::warn!(kills = kills.len(), "chaos: the functions host was killed"),
            }
        }
        *held = Some(restart(&host, &endpoint).await?);
    }
    Ok(kills)
}

/// Waits until a step is held at the armed point, `within` at most;
/// `true` when told to stop first.
async fn struck_within(
    points: &PointKills,
    within: Duration,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let waited = tokio::time::sleep(within);
    tokio::pin!(waited);
    loop {
        tokio::select! {
            _ = points.struck.notified() => if points.has_struck() { return false },
            _ = &mut waited => return false,
            _ = stop.changed() => return true,
        }
    }
}

/// Kills one of the running host's sandbox agents (seeded: which, and
/// when) until told to stop, as a container that crashed mid-call ends
/// its Fargate task; the data plane stops the task, and the watchdog
/// answers for the call it held. The kill times (none while no agent
/// runs).
pub(super) async fn sandbox_kills(
    stack: Arc<Mutex<Option<LocalStack>>>,
    mut rng: Rng,
    every: (Duration, Duration),
    mut stop: watch::Receiver<bool>,
) -> Result<Vec<i64>> {
    let mut kills = Vec::new();
    while seeded_pause(&mut rng, every, &mut stop).await {
        let agents = match stack.lock().await.as_ref() {
            Some(s) => s.sandbox_agents.list(),
            None => continue,
        };
        if agents.is_empty() {
            continue;
        }
        let (task, pid) = &agents[rng.between(0, agents.len() as u64 - 1) as usize];
        if process::kill(*pid) {
            kills.push(armada_core::clock::Clock::default().now_ms());
            tracing::warn!(task, "chaos: a sandbox agent was killed");
        }
    }
    Ok(kills)
}

/// Waits a seeded while, between `every.0` and `every.1`; `false` when
/// told to stop first.
async fn seeded_pause(
    rng: &mut Rng,
    every: (Duration, Duration),
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let wait =
        Duration::from_millis(rng.between(every.0.as_millis() as u64, every.1.as_millis() as u64));
    tokio::select! {
        _ = tokio::time::sleep(wait) => true,
        _ = stop.changed() => false,
    }
}

/// The emulator the workload runs on, started here with a state directory
/// of this run's own, so that a kill loses nothing it acknowledged.
pub(super) struct Emulator {
    root: PathBuf,
    how: emulator::Spawn,
    pub endpoint: String,
    pid: std::sync::atomic::AtomicU32,
}

impl Emulator {
    /// `slow`: the share of requests answered late, and by up to how
    /// many ms (`slow-emulator`).
    pub async fn start(root: &Path, state: PathBuf, slow: Option<(u32, u32)>) -> Result<Self> {
        let port = process::free_port()?;
        let how = emulator::Spawn {
            port,
            die_with_parent: true,
            state: Some(state),
            slow,
        };
        let pid = emulator::spawn(root, &how)?;
        let endpoint = format!("http://127.0.0.1:{port}");
        emulator::wait_until_up(&endpoint, Duration::from_secs(300)).await?;
        Ok(Emulator {
            root: root.to_path_buf(),
            how,
            endpoint,
            pid: pid.into(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `kill -9`, then started again over the same state, on the same port.
    async fn kill_and_restart(&self) -> Result<()> {
        let pid = self.pid();
        process::kill(pid);
        let gone = Instant::now() + Duration::from_secs(30);
        while process::alive(pid) && Instant::now() < gone {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pid = emulator::spawn(&self.root, &self.how)?;
        self.pid.store(pid, std::sync::atomic::Ordering::Relaxed);
        emulator::wait_until_up(&self.endpoint, Duration::from_secs(300)).await
    }
}

/// Kills the emulator at seeded moments until told to stop; the kill times.
pub(super) async fn emulator_kills(
    emulator: Arc<Emulator>,
    mut rng: Rng,
    every: (Duration, Duration),
    mut stop: watch::Receiver<bool>,
) -> Result<Vec<i64>> {
    let mut kills = Vec::new();
    while seeded_pause(&mut rng, every, &mut stop).await {
        kills.push(armada_core::clock::Clock::default().now_ms());
        tracing::warn!(kills = kills.len(), "chaos: the emulator was killed");
        emulator.kill_and_restart().await?;
    }
    Ok(kills)
}

/// A kill aimed at a named fault point: while armed, the first step of the
/// running host to meet the point is held there, and the kill lands on it.
#[derive(Debug)]
pub(super) struct PointKills {
    aim: std::sync::Mutex<Aim>,
    /// Which host a kill is aimed at ([`Host::incarnation`]), so a step of
    /// a host killed since is not held for the next one's kill.
    host: Arc<std::sync::atomic::AtomicU64>,
    /// Told when a step is held at the armed point.
    struck: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Aim {
    /// The point aimed at (`None`: any), and for which host.
    armed: Option<(Option<FaultPoint>, u64)>,
    /// Where a step was held.
    struck: Option<FaultPoint>,
}

impl PointKills {
    pub fn new(incarnation: Arc<std::sync::atomic::AtomicU64>) -> Arc<Self> {
        Arc::new(PointKills {
            aim: Default::default(),
            host: incarnation,
            struck: tokio::sync::Notify::new(),
        })
    }

    /// Aims at `point` (`None`: any), unless a step is held already.
    fn arm(&self, point: Option<FaultPoint>) {
        if let Ok(mut aim) = self.aim.lock() {
            if aim.struck.is_none() {
                aim.armed = Some((point, self.host.load(Ordering::SeqCst)));
            }
        }
    }

    fn has_struck(&self) -> bool {
        self.aim.lock().is_ok_and(|a| a.struck.is_some())
    }

    /// Nothing aimed from here on; the point a step was held at, if one
    /// was (then the host must be killed under it).
    fn disarm(&self) -> Option<FaultPoint> {
        self.aim
            .lock()
            .ok()
            .and_then(|mut a| std::mem::take(&mut *a).struck)
    }

    /// Whether this meeting of `point` is the aimed kill.
    fn strikes(&self, point: FaultPoint) -> bool {
        let Ok(mut aim) = self.aim.lock() else {
            return false;
        };
        let host = self.host.load(Ordering::SeqCst);
        let aimed = match aim.armed {
            Some((target, of)) => of == host && target.is_none_or(|t| t == point),
            None => false,
        };
        if !aimed {
            return false;
        }
        *aim = Aim {
            armed: None,
            struck: Some(point),
        };
        self.struck.notify_one();
        true
    }
}

impl FaultPoints for PointKills {
    fn at<'a>(&'a self, point: FaultPoint, _run_id: &'a str) -> BoxFuture<'a, Result<(), Aborted>> {
        if self.strikes(point) {
            // Held here until the host is killed under it.
            return Box::pin(std::future::pending());
        }
        Box::pin(async { Ok(()) })
    }
}
