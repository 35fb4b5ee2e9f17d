//! What a sandbox actually enforces, control by control, as measured by the
//! sandbox itself when it applies its capability set. A report never claims
//! more than took effect; a capability set whose required controls are not
//! all in force fails the placement closed.

use serde::{Deserialize, Serialize};

use super::CapabilitySet;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    Enforced,
    Partial,
    NotEnforced,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Control {
    pub status: Enforcement,
    /// What took effect, or why not.
    pub reason: String,
}

impl Control {
    pub fn enforced(reason: impl Into<String>) -> Self {
        Control {
            status: Enforcement::Enforced,
            reason: reason.into(),
        }
    }
    pub fn partial(reason: impl Into<String>) -> Self {
        Control {
            status: Enforcement::Partial,
            reason: reason.into(),
        }
    }
    pub fn not_enforced(reason: impl Into<String>) -> Self {
        Control {
            status: Enforcement::NotEnforced,
            reason: reason.into(),
        }
    }
    /// A control a record made before it existed does not carry.
    fn unmeasured() -> Self {
        Control::not_enforced("not measured by this sandbox's agent")
    }
}

/// One report per control the issue names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Controls {
    pub filesystem: Control,
    pub network: Control,
    pub syscalls: Control,
    pub memory: Control,
    pub cpu: Control,
    pub pids: Control,
    pub mounts: Control,
    /// Whether a call sees only its own processes in /proc.
    #[serde(default = "Control::unmeasured")]
    pub processes: Control,
    /// What caps the workspace's size: a filesystem of the limit's size
    /// (enforced), or the largest file only (partial).
    #[serde(default = "Control::unmeasured")]
    pub disk: Control,
}

impl Controls {
    /// Every control with the same status (tests, and `off` reports).
    pub fn uniform(status: Enforcement, reason: &str) -> Self {
        let c = || Control {
            status,
            reason: reason.to_string(),
        };
        Controls {
            filesystem: c(),
            network: c(),
            syscalls: c(),
            memory: c(),
            cpu: c(),
            pids: c(),
            mounts: c(),
            processes: c(),
            disk: c(),
        }
    }
}

/// What a capability set needs in force before a sandbox may serve it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Required {
    pub filesystem: Enforcement,
    pub network: Enforcement,
    pub syscalls: Enforcement,
    pub memory: Enforcement,
    pub cpu: Enforcement,
    pub pids: Enforcement,
    pub mounts: Enforcement,
    pub processes: Enforcement,
    pub disk: Enforcement,
}

fn at_least(have: Enforcement, need: Enforcement) -> bool {
    let rank = |e| match e {
        Enforcement::NotEnforced => 0,
        Enforcement::Partial => 1,
        Enforcement::Enforced => 2,
    };
    rank(have) >= rank(need)
}

impl Required {
    /// The frozen requirement of a capability set. Resource limits hold for
    /// every profile (seed 000 §B); `off` skips the capability set itself
    /// (seed 001 §7.2) but not the limits. CPU is a throttle, not a kill,
    /// so a partial quota is accepted. Hiding other processes from /proc
    /// is reported, not required: a kernel older than 5.8 cannot do it
    /// without changing the host's /proc, and a Fargate task has its own
    /// pid namespace anyway. The disk limit holds for every profile, at
    /// least as the largest file: a filesystem of its own needs a sandbox
    /// that may mount, which a Fargate task may not (its ephemeral storage
    /// is the cap there). Memory, pids and mounts hold per call where the
    /// sandbox may make cgroups and namespaces, and per task (partial) where
    /// it may not, as on Fargate: the task's limits and per-process rlimits,
    /// $TMPDIR and Landlock in place of the call's mount namespace. Either
    /// serves; nothing of them serves not at all.
    pub fn of(caps: &CapabilitySet) -> Self {
        use Enforcement::*;
        let confine = if caps.enforce { Enforced } else { NotEnforced };
        Required {
            filesystem: confine,
            network: if caps.enforce && caps.restrict_network {
                Enforced
            } else {
                NotEnforced
            },
            syscalls: confine,
            memory: Partial,
            cpu: Partial,
            pids: Partial,
            mounts: if caps.enforce { Partial } else { NotEnforced },
            processes: NotEnforced,
            disk: Partial,
        }
    }

    /// The controls that fall short, with what was needed and what is there.
    pub fn unmet(&self, have: &Controls) -> Vec<String> {
        let pairs = [
            ("filesystem", self.filesystem, &have.filesystem),
            ("network", self.network, &have.network),
            ("syscalls", self.syscalls, &have.syscalls),
            ("memory", self.memory, &have.memory),
            ("cpu", self.cpu, &have.cpu),
            ("pids", self.pids, &have.pids),
            ("mounts", self.mounts, &have.mounts),
            ("processes", self.processes, &have.processes),
            ("disk", self.disk, &have.disk),
        ];
        pairs
            .into_iter()
            .filter(|(_, need, c)| !at_least(c.status, *need))
            .map(|(name, need, c)| {
                format!("{name}: needs {need:?}, have {:?} ({})", c.status, c.reason)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Profiles;

    fn all(status: Enforcement) -> Controls {
        Controls::uniform(status, "")
    }

    #[test]
    fn a_profile_is_served_only_when_its_controls_are_in_force() {
        let p = Profiles::default();
        let strict = Required::of(&p.resolve("strict").unwrap());
        assert!(strict.unmet(&all(Enforcement::Enforced)).is_empty());
        let mut weak = all(Enforcement::Enforced);
        weak.network = Control::partial("ports only");
        assert_eq!(strict.unmet(&weak).len(), 1, "strict restricts the network");
        let ws = Required::of(&p.resolve("workspace").unwrap());
        assert!(ws.unmet(&weak).is_empty(), "workspace does not");
        let off = Required::of(&p.resolve("off").unwrap());
        let mut none = all(Enforcement::NotEnforced);
        assert_eq!(off.unmet(&none).len(), 4, "limits hold even when off");
        none.memory = Control::enforced("");
        none.pids = Control::enforced("");
        none.cpu = Control::partial("");
        none.disk = Control::partial("RLIMIT_FSIZE only");
        assert!(off.unmet(&none).is_empty());
    }

    #[test]
    fn what_a_fargate_task_measures_serves_every_profile_and_nothing_less_does() {
        let p = Profiles::default();
        let mut fargate = all(Enforcement::Partial);
        fargate.filesystem = Control::enforced("landlock");
        fargate.syscalls = Control::enforced("seccomp");
        fargate.network = Control::enforced("per task");
        for profile in ["workspace", "devbox", "read-only", "strict", "off"] {
            let need = Required::of(&p.resolve(profile).unwrap());
            assert!(need.unmet(&fargate).is_empty(), "{profile}");
        }
        for hole in ["memory", "pids", "mounts"] {
            let mut weak = fargate.clone();
            let c = match hole {
                "memory" => &mut weak.memory,
                "pids" => &mut weak.pids,
                _ => &mut weak.mounts,
            };
            *c = Control::not_enforced("none");
            let ws = Required::of(&p.resolve("workspace").unwrap());
            assert_eq!(ws.unmet(&weak).len(), 1, "{hole}");
        }
    }

    #[test]
    fn a_record_from_before_the_processes_and_disk_controls_still_reads() {
        let mut v = serde_json::to_value(all(Enforcement::Enforced)).unwrap();
        v.as_object_mut().unwrap().remove("processes");
        v.as_object_mut().unwrap().remove("disk");
        let c: Controls = serde_json::from_value(v).unwrap();
        assert_eq!(c.processes.status, Enforcement::NotEnforced);
        assert_eq!(c.disk.status, Enforcement::NotEnforced);
        assert_eq!(c.mounts.status, Enforcement::Enforced);
    }
}
