//! The confinement steps of one call, in order (see the [module
//! documentation](super)). Where the task cannot make namespaces (Fargate:
//! no CAP_SYS_ADMIN), the steps that needed them are done per task or by
//! other means ([`super::pertask`]) and reported `partial`; what cannot be
//! done at all without them refuses the call.

use std::path::PathBuf;

use landlock::RulesetStatus;

use armada_domain::sandbox::controls::Enforcement;

use super::beneath::{self, StepError};
use super::mounts::{mount_namespace, own_proc, ProcError};
use super::pertask;
use super::rules::{landlock_ruleset, seccomp_filters, DENIED_SYSCALLS};
use super::{JailReport, JailSpec, Step};

pub(super) fn confine(spec: &mut JailSpec, report: &mut JailReport) -> Result<(), String> {
    let require = spec.require.clone();
    let required = |s: Step| require.contains(&s);
    let fail = |report: &mut JailReport, step: Step, detail: String| -> Result<(), String> {
        report.note(step, Enforcement::NotEnforced, detail.clone());
        if required(step) {
            Err(format!("{step:?}: {detail}"))
        } else {
            Ok(())
        }
    };
    // A path of the spec tampered with (a link in a declared mount) is
    // refused whatever the spec requires.
    let refuse = |report: &mut JailReport, step: Step, why: String| -> Result<(), String> {
        report.note(step, Enforcement::NotEnforced, why.clone());
        Err(format!("{step:?}: {why}"))
    };
    let root = crate::sys::geteuid() == 0;

    // 1. cgroups
    let pid = std::process::id().to_string();
    let joined: Result<(), String> = spec
        .cgroup_procs
        .iter()
        .try_for_each(|f| std::fs::write(f, &pid).map_err(|e| format!("{}: {e}", f.display())));
    match joined {
        Ok(()) if !spec.cgroup_procs.is_empty() => report.note(
            Step::Cgroups,
            Enforcement::Enforced,
            "joined the call's cgroups",
        ),
        Ok(()) => fail(report, Step::Cgroups, "no cgroup to join".into())?,
        Err(e) => fail(report, Step::Cgroups, e)?,
    }

    // 2. one process group for the call
    crate::sys::setsid().map_err(|e| format!("setsid: {e}"))?;

    // 3. namespaces
    let want_mounts = spec.private_tmp.is_some() || !spec.hide.is_empty() || !spec.binds.is_empty();
    let mut own_ns = false;
    // Why the call gets no namespaces of its own, when it gets none.
    let mut per_task: Option<String> = None;
    // How the call's changes to the workspace are held for judging.
    let mut overlay: Option<Result<String, String>> = None;
    if want_mounts {
        match mount_namespace(spec) {
            Ok(m) => {
                own_ns = true;
                overlay = m.overlay;
                report.note(Step::Mounts, Enforcement::Enforced, m.detail);
            }
            Err(StepError::NoNamespaces(why)) => per_task = Some(why),
            Err(StepError::Failed(e)) => fail(report, Step::Mounts, e)?,
            Err(StepError::Unsafe(why)) => refuse(report, Step::Mounts, why)?,
        }
    } else {
        report.note(
            Step::Mounts,
            Enforcement::Enforced,
            "no mount changes needed",
        );
    }
    if let Some(why) = &per_task {
        if !spec.binds.is_empty() {
            return refuse(
                report,
                Step::Mounts,
                format!(
                    "declared mounts need a mount namespace of the call's own, which this \
                     task cannot make ({why})"
                ),
            );
        }
    }
    // The call's own /proc, in its own mount namespace. A kernel that
    // cannot have one is reported; one that can but fails refuses the
    // call wherever the mounts are required.
    if own_ns {
        match own_proc() {
            Ok(detail) => report.note(Step::Processes, Enforcement::Enforced, detail),
            Err(ProcError::Unsupported(why)) => {
                report.note(Step::Processes, Enforcement::NotEnforced, why);
            }
            Err(ProcError::Failed(e)) => {
                report.note(Step::Processes, Enforcement::NotEnforced, e.clone());
                if required(Step::Mounts) || required(Step::Processes) {
                    return Err(format!("{:?}: {e}", Step::Processes));
                }
            }
        }
    } else {
        report.note(
            Step::Processes,
            Enforcement::NotEnforced,
            "no mount namespace of the call's own: /proc is the task's",
        );
    }
    if let Some(relay) = spec.egress_relay.clone().filter(|_| !spec.isolate_network) {
        if let Some(why) = &per_task {
            report.note(
                Step::Network,
                Enforcement::Partial,
                format!(
                    "per task, not per call ({why}): the task's own network and its security \
                     group hold the call"
                ),
            );
        } else {
            match super::relay::start(&relay) {
                Ok(()) => {
                    spec.env.extend(super::relay::EgressRelay::proxy_env());
                    if let Some(t) = spec.tcp.as_mut() {
                        t.connect = std::iter::once(super::relay::PROXY_PORT)
                            .chain(t.bind.iter().copied())
                            .collect();
                    }
                    report.note(
                        Step::Network,
                        Enforcement::Enforced,
                        format!(
                            "own network namespace: its loopback is its own; out only through \
                             the egress proxy (127.0.0.1:{}, CONNECT to ports {:?}, public \
                             addresses only) and its server's port {:?}",
                            super::relay::PROXY_PORT,
                            relay.egress_ports,
                            relay.inbound
                        ),
                    );
                }
                Err(e) => fail(report, Step::Network, e)?,
            }
        }
    }
    if spec.isolate_network {
        let r = crate::sys::unshare(libc::CLONE_NEWNET)
            .map_err(|e| (e.raw_os_error(), format!("network namespace: {e}")))
            .and_then(|()| crate::sys::loopback_up().map_err(|e| (None, format!("loopback: {e}"))));
        match r {
            Ok(()) => report.note(
                Step::Network,
                Enforcement::Enforced,
                "own network namespace with loopback only",
            ),
            Err((Some(libc::EPERM), e)) if spec.task_network_isolated => report.note(
                Step::Network,
                Enforcement::Enforced,
                format!(
                    "per task, not per call ({e}): the task's network has no egress \
                     (ARMADA_SANDBOX_TASK_NETWORK=isolated) but the endpoints its agent \
                     uses, which answer the agent alone"
                ),
            ),
            Err((_, e)) => fail(report, Step::Network, e)?,
        }
    }

    // 4. rlimits
    let _ = crate::sys::set_rlimit(libc::RLIMIT_CORE, 0);
    if let Some(max) = spec.max_file_bytes {
        crate::sys::set_rlimit(libc::RLIMIT_FSIZE, max)
            .map_err(|e| format!("RLIMIT_FSIZE: {e}"))?;
    }
    if spec.cgroup_procs.is_empty() {
        if let Some(l) = spec.call_limits {
            let set = |r, v: u64, what: &str| {
                crate::sys::set_rlimit(r, v).map_err(|e| format!("{what}: {e}"))
            };
            set(libc::RLIMIT_AS, l.address_space_bytes, "RLIMIT_AS")?;
            set(libc::RLIMIT_CPU, l.cpu_seconds, "RLIMIT_CPU")?;
            set(libc::RLIMIT_NPROC, l.processes, "RLIMIT_NPROC")?;
            // The task's OOM killer takes the call before its agent.
            let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
            report.note(
                Step::Cgroups,
                Enforcement::Partial,
                format!(
                    "no cgroup of the call's own: per process RLIMIT_AS {} MB, RLIMIT_CPU \
                     {} s, RLIMIT_NPROC {} for the sandbox's uid; the task's cgroup holds \
                     the whole task",
                    l.address_space_bytes / (1024 * 1024),
                    l.cpu_seconds,
                    l.processes
                ),
            );
        }
    }

    // A call to be judged whose workspace is no overlay (no mount
    // namespace, or the overlay failed): Landlock keeps the workspace's
    // files instead, and says so if it holds.
    if spec.effects.is_some() {
        match overlay {
            Some(Ok(detail)) => report.note(Step::Effects, Enforcement::Enforced, detail),
            other => {
                let why = match other {
                    Some(Err(e)) => e,
                    _ => per_task
                        .clone()
                        .unwrap_or_else(|| "no mount namespace".into()),
                };
                let cwd = spec.cwd.clone();
                if let Some(fs) = spec.fs.as_mut() {
                    fs.keep.push(cwd);
                }
                report.note(
                    Step::Effects,
                    Enforcement::NotEnforced,
                    format!("no overlay over the workspace ({why})"),
                );
            }
        }
    }

    // Without a mount namespace: /tmp is the Run's scratch, and denied
    // paths the uid could reach are kept out of the Landlock rules.
    let mut landlocked: Vec<PathBuf> = Vec::new();
    let mut closed = 0;
    let reads_all = spec.fs.as_ref().is_some_and(|f| f.read_all);
    if per_task.is_some() {
        if let Some(scratch) = &spec.private_tmp {
            for (k, v) in spec.env.iter_mut() {
                if k == "TMPDIR" {
                    *v = scratch.display().to_string();
                }
            }
        }
        for h in &spec.hide {
            if pertask::closed_to(h, spec.uid, spec.gid) {
                closed += 1;
            } else if h.exists() {
                landlocked.push(h.clone());
            }
        }
        if let Some(fs) = &spec.fs {
            spec.fs = Some(pertask::rules(fs, &landlocked, spec.private_tmp.as_deref()));
        }
    }

    // 5. the Landlock ruleset, built while every path is still reachable
    let ruleset = match &spec.fs {
        Some(fs) => match landlock_ruleset(fs, spec.tcp.as_ref(), &beneath::roots(spec)) {
            Ok(r) => Some(r),
            Err(StepError::Failed(e) | StepError::NoNamespaces(e)) => {
                fail(report, Step::Filesystem, format!("landlock: {e}"))?;
                None
            }
            Err(StepError::Unsafe(why)) => {
                refuse(report, Step::Filesystem, why)?;
                None
            }
        },
        None => {
            report.note(
                Step::Filesystem,
                Enforcement::NotEnforced,
                "sandbox disabled by profile off",
            );
            None
        }
    };

    // privileges
    if root {
        match crate::sys::drop_privileges(spec.uid, spec.gid, &[spec.gid]) {
            Ok(()) => report.note(
                Step::Uid,
                Enforcement::Enforced,
                format!("runs as uid {} gid {}", spec.uid, spec.gid),
            ),
            Err(e) => fail(report, Step::Uid, format!("setuid: {e}"))?,
        }
    } else {
        report.note(
            Step::Uid,
            Enforcement::Partial,
            format!("already unprivileged (uid {})", crate::sys::geteuid()),
        );
    }

    // 6. apply Landlock, then seccomp
    let mut landlock_holds = false;
    if let Some(rs) = ruleset {
        match rs.restrict_self() {
            Ok(status) => {
                let st = match status.ruleset {
                    RulesetStatus::FullyEnforced => Enforcement::Enforced,
                    RulesetStatus::PartiallyEnforced => Enforcement::Partial,
                    RulesetStatus::NotEnforced => Enforcement::NotEnforced,
                };
                let detail = format!("landlock {:?} ({:?})", status.ruleset, status.landlock);
                if st == Enforcement::Enforced {
                    landlock_holds = true;
                    report.note(Step::Filesystem, st, detail.clone());
                    if report.status(Step::Effects) == Enforcement::NotEnforced
                        && spec.effects.is_some()
                    {
                        let why = report.detail(Step::Effects).to_string();
                        report.note(
                            Step::Effects,
                            Enforcement::Partial,
                            format!(
                                "{why}: Landlock keeps the workspace's files from removal, \
                                 renaming and truncation"
                            ),
                        );
                    }
                    if let Some(t) = &spec.tcp {
                        report.note(
                            Step::Tcp,
                            Enforcement::Enforced,
                            format!("TCP bind {:?}, connect {:?} only", t.bind, t.connect),
                        );
                    }
                } else {
                    without_landlock(
                        spec,
                        report,
                        per_task.is_some() && reads_all,
                        detail.clone(),
                        &fail,
                    )?;
                    if spec.tcp.is_some() {
                        fail(report, Step::Tcp, detail)?;
                    }
                }
            }
            Err(e) => without_landlock(
                spec,
                report,
                per_task.is_some() && reads_all,
                format!("landlock: {e}"),
                &fail,
            )?,
        }
    }
    if let Some(why) = &per_task {
        let what = format!(
            "no mount namespace of the call's own ({why}): the Run's /tmp is its scratch \
             ($TMPDIR; /tmp is not the call's), {} denied path(s) closed to the call's uid \
             by their permissions",
            closed
        );
        if landlocked.is_empty() || landlock_holds {
            report.note(
                Step::Mounts,
                Enforcement::Partial,
                format!(
                    "{what}, {} left out of its Landlock rules",
                    landlocked.len()
                ),
            );
        } else {
            fail(
                report,
                Step::Mounts,
                format!("{what}; without Landlock nothing holds the call out of {landlocked:?}"),
            )?;
        }
    }
    if spec.seccomp {
        let r = seccomp_filters().and_then(|progs| {
            progs
                .iter()
                .try_for_each(|p| seccompiler::apply_filter(p).map_err(|e| e.to_string()))
        });
        match r {
            Ok(()) => report.note(
                Step::Syscalls,
                Enforcement::Enforced,
                format!(
                    "seccomp holds the call to the native ABI (no x32, no other \
                     architecture) and denies {} system calls, namespace creation, \
                     sockets other than unix, inet, inet6 and route netlink, and \
                     personality changes",
                    DENIED_SYSCALLS.len()
                ),
            ),
            Err(e) => fail(report, Step::Syscalls, format!("seccomp: {e}"))?,
        }
    }
    Ok(())
}

/// Landlock did not take (the kernel lacks it, or part of it). In a task
/// without namespaces, a profile that reads everything (`reads_all_per_task`)
/// keeps what its uid gives it (it owns the workspace, home and scratch
/// only): `partial`. One that narrows what may be read (strict) has nothing
/// else to narrow it with: the step fails, and with it the call where it is
/// required.
fn without_landlock(
    spec: &JailSpec,
    report: &mut JailReport,
    reads_all_per_task: bool,
    detail: String,
    fail: &impl Fn(&mut JailReport, Step, String) -> Result<(), String>,
) -> Result<(), String> {
    if reads_all_per_task && report.status(Step::Uid) == Enforcement::Enforced {
        report.note(
            Step::Filesystem,
            Enforcement::Partial,
            format!(
                "{detail}: only the call's uid {} holds it (it owns the workspace, home and \
                 scratch alone)",
                spec.uid
            ),
        );
        Ok(())
    } else {
        fail(report, Step::Filesystem, detail)
    }
}
