//! At start: the mounts checked again, and the capability set applied to a
//! probe call, measuring per control what actually took effect.

use crate::agent::usable_cgroup;
use crate::agent::Agent;
use crate::call::Call;
use crate::cgroup::Cgroup;
use crate::jail::Step;
use anyhow::Context;
use anyhow::Result;
use armada_domain::sandbox::check_mount;
use armada_domain::sandbox::controls::Control;
use armada_domain::sandbox::controls::Controls;
use armada_domain::sandbox::controls::Enforcement;

impl Agent {
    /// Mounts are checked again here: registry data may have been edited
    /// past the API's validation.
    pub(super) fn check_mounts(&self) -> Result<(), String> {
        let user = self.cfg.user.as_deref().unwrap_or_default();
        for m in &self.cfg.mounts {
            check_mount(&m.path, m.mode, user).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Applies the capability set to a probe call and reports per control
    /// what actually took effect.
    pub async fn measure(&self) -> Result<Controls> {
        self.runner
            .env
            .prepare()
            .context("preparing the sandbox directories")?;
        let run = self.runner.run(Call::probe()).await?;
        let _ = self.runner.env.drop_scratch("probe");
        let rep = &run.report;
        let caps = &self.cfg.caps;
        let step = |s: Step, what: &str| -> Control {
            Control {
                status: rep.status(s),
                reason: if rep.detail(s).is_empty() {
                    format!("{what}: not applied")
                } else {
                    rep.detail(s).to_string()
                },
            }
        };
        let off = || Control::not_enforced("profile off: the capability set is not applied");
        let filesystem = if !caps.enforce {
            off()
        } else {
            let mut c = step(Step::Filesystem, "landlock");
            if rep.status(Step::Uid) != Enforcement::Enforced && c.status == Enforcement::Enforced {
                c.status = Enforcement::Partial;
            }
            c.reason = format!("{}; {}", c.reason, rep.detail(Step::Uid));
            c
        };
        let network = if !caps.enforce {
            off()
        } else if caps.restrict_network {
            step(Step::Network, "network namespace")
        } else if rep.status(Step::Tcp) == Enforcement::Enforced {
            Control::partial(format!(
                "not restricted by the profile; {} (landlock); UDP and destinations are not filtered",
                rep.detail(Step::Tcp)
            ))
        } else {
            Control::not_enforced(
                "not restricted by the profile, and TCP ports could not be limited",
            )
        };
        let syscalls = if caps.enforce {
            step(Step::Syscalls, "seccomp")
        } else {
            off()
        };
        let mounts = if caps.enforce {
            step(Step::Mounts, "mount namespace")
        } else {
            off()
        };
        let processes = if !caps.enforce {
            off()
        } else if rep.status(Step::Processes) == Enforcement::NotEnforced
            && task_pid_namespace()
            && rep.status(Step::Uid) == Enforcement::Enforced
        {
            // Fargate: no /proc per call, but one per task.
            Control::partial(
                "per task, not per call: the task's own pid namespace and /proc (its pid 1 \
                 is this agent's program), so a call lists the task's processes only, never another \
                 identity's; the agent's /proc files (its environment) are closed to the \
                 call's uid",
            )
        } else {
            step(Step::Processes, "own /proc")
        };
        let (usable, own) = usable_cgroup();
        // Calls get no cgroup of their own (cgroupfs is not the agent's,
        // as on Fargate): the task's limits hold the whole task, and each
        // call has per-process limits (see the jail's report).
        let per_call = (usable.is_none() && rep.status(Step::Cgroups) == Enforcement::Partial)
            .then(|| rep.detail(Step::Cgroups).to_string());
        let limit_control = |v: Option<String>, what: &str| match (v, &per_call) {
            (Some(d), None) => Control::enforced(d),
            (Some(d), Some(calls)) => Control::partial(format!("per task: {d}; {calls}")),
            (None, Some(calls)) => {
                Control::partial(format!("no {what} limit on the task is visible; {calls}"))
            }
            (None, None) => {
                Control::not_enforced(format!("no {what} limit is in force on the sandbox"))
            }
        };
        let memory = limit_control(
            own.as_ref().and_then(Cgroup::memory_limit).map(|b| {
                format!(
                    "{} MB on the sandbox's cgroup; each call gets {} MB",
                    b / (1024 * 1024),
                    self.runner.env.call_memory_bytes() / (1024 * 1024)
                )
            }),
            "memory",
        );
        let cpu = limit_control(
            own.as_ref()
                .and_then(Cgroup::cpu_millis)
                .map(|m| format!("{m} millicores (CFS quota; throttled, not killed)")),
            "CPU",
        );
        let pids = limit_control(
            own.as_ref()
                .and_then(Cgroup::pids_max)
                .map(|n| format!("at most {n} processes")),
            "pid",
        );
        Ok(Controls {
            filesystem,
            network,
            syscalls,
            memory,
            cpu,
            pids,
            mounts,
            processes,
            disk: self.disk_control(),
        })
    }
}

/// Whether this agent runs in a pid namespace of its task's own: its pid 1
/// is this program (the agent, or the supervisor that started it), or the
/// container's init running it (`/dev/init -- <this program>`, ECS's
/// `initProcessEnabled`), not a host's init.
fn task_pid_namespace() -> bool {
    let cmdline = |p: &str| std::fs::read(format!("/proc/{p}/cmdline")).ok();
    if std::process::id() == 1 {
        return true;
    }
    match (cmdline("1"), cmdline("self")) {
        (Some(init), Some(me)) => runs_us(&init, &me),
        _ => false,
    }
}

/// `init` (a NUL-separated command line) is ours, or an init whose
/// command after `--` is ours.
fn runs_us(init: &[u8], me: &[u8]) -> bool {
    if init == me {
        return true;
    }
    let mut wrapped = b"--\0".to_vec();
    wrapped.extend_from_slice(me);
    init.ends_with(&wrapped)
}

#[cfg(test)]
mod tests {
    use super::runs_us;

    #[test]
    fn the_task_init_is_recognised_running_the_agent() {
        let me = b"/usr/local/bin/armada-sandbox\0agent\0";
        assert!(runs_us(me, me));
        assert!(runs_us(
            b"/dev/init\0--\0/usr/local/bin/armada-sandbox\0agent\0",
            me
        ));
        assert!(!runs_us(b"/sbin/init\0", me));
        assert!(!runs_us(b"/dev/init\0--\0/bin/sh\0", me));
        assert!(!runs_us(b"x/usr/local/bin/armada-sandbox\0agent\0", me));
    }
}
