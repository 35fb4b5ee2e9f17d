//! One sandbox's fixed surroundings: its directories, its unprivileged uid,
//! its resolved capability set and limits, and its cgroup. From these it
//! builds the [`JailSpec`] of each call: the symbolic roots of the
//! capability set (`$WORKSPACE`, `$HOME`, `$TMP`, `$SYSTEM`, `$DEVICES`)
//! become real paths here and nowhere else.

use std::path::{Path, PathBuf};

use armada_domain::sandbox::{
    CapabilitySet, Limits, MountMode, DEVICES, HOME, SYSTEM, TMP, WORKSPACE,
};
use armada_domain::skills::MountDecl;

use crate::call::Call;
use crate::cgroup::Cgroup;
use crate::jail::relay::EgressRelay;
use crate::jail::{Bind, FsRules, JailSpec, Step, TcpRules};

/// System directories a strict profile may read.
const SYSTEM_DIRS: [&str; 8] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];
/// Devices every shell needs (`> /dev/null`, random numbers).
const DEVICE_FILES: [&str; 6] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];
/// The user-data root as sandboxes name it (`/data/users/<id>/workspace`).
pub const DATA: &str = "/data";
/// Memory kept back from a call for the agent that runs it, so that a
/// call's OOM kill lands inside the call.
const AGENT_RESERVE_BYTES: u64 = 48 * 1024 * 1024;
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Host paths the host denies every sandbox it runs, whatever its profile
/// says (the local data plane: the repository, whose `.armada/` holds the
/// stack's keys, and every tenant's `/data`): a JSON array of absolute
/// paths in the agent's environment, covered in every confined call.
pub const HOST_DENY_ENV: &str = "ARMADA_SANDBOX_DENY";

/// The host's denials as [`HOST_DENY_ENV`] gives them (unset: none).
pub fn parse_host_denied(v: Option<&str>) -> Result<Vec<PathBuf>, String> {
    let Some(v) = v.filter(|v| !v.trim().is_empty()) else {
        return Ok(vec![]);
    };
    let paths: Vec<PathBuf> =
        serde_json::from_str(v).map_err(|e| format!("{HOST_DENY_ENV} is not a JSON list: {e}"))?;
    match paths.iter().find(|p| !p.is_absolute()) {
        Some(p) => Err(format!("{HOST_DENY_ENV}: {} is not absolute", p.display())),
        None => Ok(paths),
    }
}

/// This agent's host denials, read once.
fn host_denied() -> &'static Result<Vec<PathBuf>, String> {
    static DENIED: std::sync::OnceLock<Result<Vec<PathBuf>, String>> = std::sync::OnceLock::new();
    DENIED.get_or_init(|| parse_host_denied(std::env::var(HOST_DENY_ENV).ok().as_deref()))
}

#[derive(Debug, Clone)]
pub struct SandboxEnv {
    /// This sandbox's directory (workspace, home, scratch, call reports).
    pub root: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub caps: CapabilitySet,
    pub limits: Limits,
    /// TCP ports calls may connect to (the egress allow-list).
    pub egress_ports: Vec<u16>,
    /// Private targets the operator lets calls reach through the egress
    /// proxy (`host:port`, `host:*`).
    pub egress_allow: Vec<String>,
    /// Where `/data` is on this host.
    pub data_root: PathBuf,
    /// The sandbox's own cgroup (the task's), when there is one to use.
    pub cgroup: Option<Cgroup>,
    /// Declared mounts: sub-paths of the user's workspace under `/data`.
    pub mounts: Vec<MountDecl>,
}

impl SandboxEnv {
    pub fn workspace(&self) -> PathBuf {
        self.root.join("workspace")
    }

    pub fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    pub fn scratch(&self, run_id: &str) -> PathBuf {
        self.root
            .join("scratch")
            .join(crate::component::sanitize(run_id))
    }

    pub fn calls_dir(&self) -> PathBuf {
        self.root.join("calls")
    }

    /// Creates the sandbox's directories: owned by its uid and closed to
    /// every other uid (another sandbox's uid included). Host denials that
    /// cannot be applied (unreadable, or covering the sandbox's own
    /// directory) refuse the sandbox here, before any call.
    pub fn prepare(&self) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let denied = host_denied()
            .as_ref()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.clone()))?;
        self.check_host_denied(denied)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        std::fs::create_dir_all(&self.root)?;
        // Traversable, not listable: the uid reaches its own directories only.
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o711))?;
        for d in [self.workspace(), self.home(), self.root.join("scratch")] {
            std::fs::create_dir_all(&d)?;
            self.own(&d)?;
        }
        std::fs::create_dir_all(self.calls_dir())?;
        std::fs::set_permissions(self.calls_dir(), std::fs::Permissions::from_mode(0o700))?;
        Ok(())
    }

    fn own(&self, d: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if crate::sys::geteuid() == 0 {
            crate::sys::chown(d, self.uid, self.gid)?;
        }
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
    }

    /// The Run's private scratch directory (its /tmp), created on first use.
    pub fn prepare_scratch(&self, run_id: &str) -> std::io::Result<PathBuf> {
        let d = self.scratch(run_id);
        if !d.exists() {
            std::fs::create_dir_all(&d)?;
            self.own(&d)?;
        }
        Ok(d)
    }

    /// Destroys a Run's scratch directory (at the Run's end).
    pub fn drop_scratch(&self, run_id: &str) -> std::io::Result<()> {
        match std::fs::remove_dir_all(self.scratch(run_id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// A capability-set path on this host; `$TMP` is the call's /tmp.
    fn real(&self, sym: &str) -> Vec<PathBuf> {
        match sym {
            WORKSPACE => vec![self.workspace()],
            HOME => vec![self.home()],
            TMP => vec![PathBuf::from("/tmp")],
            SYSTEM => SYSTEM_DIRS.iter().map(PathBuf::from).collect(),
            DEVICES => DEVICE_FILES.iter().map(PathBuf::from).collect(),
            p if p == DATA => vec![self.data_root.clone()],
            p => match p.strip_prefix("/data/") {
                Some(rest) => vec![self.data_root.join(rest)],
                None => vec![PathBuf::from(p)],
            },
        }
    }

    fn fs_rules(&self) -> Option<FsRules> {
        if !self.caps.enforce {
            return None;
        }
        let expand = |v: &[String]| v.iter().flat_map(|s| self.real(s)).collect::<Vec<_>>();
        let mut write = expand(&self.caps.writable);
        // Every profile keeps the devices a shell cannot work without.
        write.extend(DEVICE_FILES.iter().map(PathBuf::from));
        let mut read = expand(&self.caps.readable);
        for b in self.binds() {
            if b.writable {
                write.push(b.path);
            } else {
                read.push(b.path);
            }
        }
        Some(FsRules {
            read_all: self.caps.read_all,
            read,
            write,
            keep: vec![],
        })
    }

    /// A host denial may not cover the sandbox's own directory (its calls
    /// work in it).
    fn check_host_denied(&self, denied: &[PathBuf]) -> Result<(), String> {
        match denied.iter().find(|d| self.root.starts_with(d)) {
            Some(d) => Err(format!(
                "{HOST_DENY_ENV}: {} would cover the sandbox's own {}",
                d.display(),
                self.root.display()
            )),
            None => Ok(()),
        }
    }

    /// Paths covered in the call's mount namespace: the profile's `deny`
    /// list, always the user-data root (zero mounts by default), and the
    /// host's denials ([`HOST_DENY_ENV`]).
    fn hidden(&self) -> Vec<PathBuf> {
        // An unreadable list never gets here: `prepare` refused the sandbox.
        let host: &[PathBuf] = host_denied().as_deref().unwrap_or(&[]);
        self.hidden_with(host)
    }

    fn hidden_with(&self, host: &[PathBuf]) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self.caps.deny.iter().flat_map(|s| self.real(s)).collect();
        for p in std::iter::once(&self.data_root).chain(host) {
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
        // What lies beneath a covered path is covered with it (declared
        // mounts beneath are bound back through the outer cover).
        let all = out.clone();
        out.retain(|p| !all.iter().any(|a| a != p && p.starts_with(a)));
        out
    }

    /// The declared mounts as host paths (their `/data` is `data_root`).
    fn binds(&self) -> Vec<Bind> {
        self.mounts
            .iter()
            .flat_map(|m| {
                self.real(&m.path).into_iter().map(move |path| Bind {
                    path,
                    writable: m.mode == MountMode::Rw,
                })
            })
            .collect()
    }

    /// Memory for one call: the sandbox's limit less what its agent needs.
    pub fn call_memory_bytes(&self) -> u64 {
        let limit = self
            .cgroup
            .as_ref()
            .and_then(Cgroup::memory_limit)
            .unwrap_or(u64::from(self.limits.memory_mb) * 1024 * 1024);
        limit
            .saturating_sub(AGENT_RESERVE_BYTES)
            .max(16 * 1024 * 1024)
    }

    /// The jail spec of one call.
    pub fn spec(
        &self,
        call: &Call,
        scratch: &Path,
        call_cgroup: Option<&Cgroup>,
        report: PathBuf,
    ) -> JailSpec {
        let (run_id, bind_ports) = (call.run_id.as_str(), call.bind_ports.as_slice());
        let enforce = self.caps.enforce;
        let mut env = vec![
            ("PATH".to_string(), PATH.to_string()),
            ("HOME".to_string(), self.home().display().to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
            ("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string()),
            ("ARMADA_RUN_ID".to_string(), run_id.to_string()),
            (
                "ARMADA_WORKSPACE".to_string(),
                self.workspace().display().to_string(),
            ),
        ];
        env.push((
            "TMPDIR".to_string(),
            if enforce {
                "/tmp".to_string()
            } else {
                scratch.display().to_string()
            },
        ));
        env.extend(call.env.iter().cloned());
        let mut require = vec![];
        if enforce {
            require.extend([Step::Filesystem, Step::Syscalls, Step::Mounts]);
            if crate::sys::geteuid() == 0 {
                require.push(Step::Uid);
            }
            // Restricted, or with a network of its own (per task where
            // the jail cannot make one): either way it must hold.
            require.push(Step::Network);
        }
        if call_cgroup.is_some() {
            require.push(Step::Cgroups);
        }
        // With its own network namespace a call reaches nothing anyway;
        // otherwise TCP is held to the egress ports and its own ports.
        let tcp = (enforce && !self.caps.restrict_network).then(|| TcpRules {
            bind: bind_ports.to_vec(),
            connect: self
                .egress_ports
                .iter()
                .chain(bind_ports)
                .copied()
                .collect(),
        });
        JailSpec {
            action: call.action.clone(),
            cwd: self.workspace(),
            env,
            uid: self.uid,
            gid: self.gid,
            cgroup_procs: call_cgroup.map(Cgroup::join_files).unwrap_or_default(),
            fs: self.fs_rules(),
            hide: if enforce { self.hidden() } else { vec![] },
            binds: if enforce { self.binds() } else { vec![] },
            private_tmp: enforce.then(|| scratch.to_path_buf()),
            isolate_network: enforce && self.caps.restrict_network,
            tcp,
            seccomp: enforce,
            max_file_bytes: Some(u64::from(self.limits.disk_mb) * 1024 * 1024),
            report,
            require,
            // What the task gives in place of namespaces and cgroups: the
            // runner knows it.
            task_network_isolated: false,
            call_limits: None,
            effects: None,
            // Where the call has a network at all, it gets one of its own
            // (the jail makes it where it can).
            egress_relay: (enforce && !self.caps.restrict_network).then(|| EgressRelay {
                egress_ports: self.egress_ports.clone(),
                allow: self.egress_allow.clone(),
                inbound: bind_ports.to_vec(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn env(profile: &str) -> SandboxEnv {
        SandboxEnv {
            root: PathBuf::from("/var/tmp/armada/stack/task/sandbox"),
            uid: 300_000,
            gid: 300_000,
            caps: armada_domain::sandbox::Profiles::default()
                .resolve(profile)
                .unwrap(),
            limits: Limits::default(),
            egress_ports: vec![],
            egress_allow: vec![],
            data_root: PathBuf::from("/var/tmp/armada/data/tenants/acme"),
            cgroup: None,
            mounts: vec![],
        }
    }

    #[test]
    fn the_hosts_denials_are_covered_in_every_confined_profile() {
        let repo = PathBuf::from("/work/repo");
        let host = vec![repo.clone(), PathBuf::from("/var/tmp/armada/data")];
        for profile in ["workspace", "devbox", "read-only", "strict"] {
            let e = env(profile);
            let hidden = e.hidden_with(&host);
            for p in &host {
                assert!(hidden.contains(p), "{profile}: {p:?} in {hidden:?}");
            }
            // The tenant's own data root is beneath the covered data trees.
            assert!(!hidden.contains(&e.data_root), "{profile}: {hidden:?}");
            assert!(e.hidden_with(&[]).contains(&e.data_root));
            assert_eq!(e.check_host_denied(&host), Ok(()));
        }
        // Never twice, whoever names it first.
        let e = env("devbox");
        let hidden = e.hidden_with(std::slice::from_ref(&e.data_root));
        assert_eq!(hidden.iter().filter(|p| **p == e.data_root).count(), 1);
        // A denial over the sandbox's own directory is refused.
        let e = env("workspace");
        assert!(e
            .check_host_denied(&[PathBuf::from("/var/tmp/armada")])
            .is_err());
        assert!(e.check_host_denied(std::slice::from_ref(&e.root)).is_err());
    }

    #[test]
    fn the_hosts_denials_are_a_json_list_of_absolute_paths() {
        assert_eq!(parse_host_denied(None), Ok(vec![]));
        assert_eq!(parse_host_denied(Some(" ")), Ok(vec![]));
        assert_eq!(
            parse_host_denied(Some(r#"["/work/repo", "/work/repo/.armada"]"#)),
            Ok(vec![
                PathBuf::from("/work/repo"),
                PathBuf::from("/work/repo/.armada")
            ])
        );
        for bad in ["/work/repo", r#"["relative"]"#, r#"{"a": 1}"#] {
            assert!(parse_host_denied(Some(bad)).is_err(), "{bad}");
        }
    }
}
