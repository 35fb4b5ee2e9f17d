//! cgroups, v1 or v2, whichever this process's own cgroup offers: the local
//! data plane puts each sandbox task in a cgroup with the task's memory, CPU
//! and pid limits (what Fargate does for a task), and the sandbox agent puts
//! each call in a child of its own, so that a call's processes, even those
//! that escaped with `setsid`, can be frozen and killed together, and an OOM
//! kill can be attributed to the call.
//!
//! New groups are made beneath the caller's own group in every hierarchy
//! (delegation), never at a hierarchy's root.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no usable cgroup hierarchy: {0}")]
    Unavailable(String),
    #[error("cgroup {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cgroup {0} did not empty")]
    Busy(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    Memory,
    Cpu,
    Pids,
    Freezer,
}

impl Controller {
    const ALL: [Controller; 4] = [
        Controller::Memory,
        Controller::Cpu,
        Controller::Pids,
        Controller::Freezer,
    ];

    fn v1_name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
            Controller::Pids => "pids",
            Controller::Freezer => "freezer",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// One cgroup, as a directory per hierarchy (v1) or one directory (v2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    pub version: Version,
    dirs: Vec<(Controller, PathBuf)>,
}

/// A cgroup mount from /proc/self/mountinfo: (mount point, root within the
/// hierarchy, fstype, super options).
fn cgroup_mounts(mountinfo: &str) -> Vec<(PathBuf, String, String, Vec<String>)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            let fstype = *post.first()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            let opts = post.get(2).unwrap_or(&"").split(',').map(str::to_string);
            Some((
                PathBuf::from(pre.get(4)?),
                pre.get(3)?.to_string(),
                fstype.to_string(),
                opts.collect(),
            ))
        })
        .collect()
}

fn join_under(mount: &Path, mount_root: &str, path: &str) -> PathBuf {
    let rel = path.strip_prefix(mount_root).unwrap_or(path);
    mount.join(rel.trim_start_matches('/'))
}

impl Cgroup {
    /// The cgroup this process is in, preferring v1 when its memory
    /// controller is mounted (hybrid hosts keep controllers there).
    pub fn current() -> Result<Cgroup, CgroupError> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(io(Path::new("/proc/self/mountinfo")))?;
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(io(Path::new("/proc/self/cgroup")))?;
        Self::from_tables(&mountinfo, &own)
    }

    fn from_tables(mountinfo: &str, own: &str) -> Result<Cgroup, CgroupError> {
        let mounts = cgroup_mounts(mountinfo);
        // (controllers, path) from "id:controllers:path".
        let membership: Vec<(Vec<&str>, &str)> = own
            .lines()
            .filter_map(|l| {
                let mut it = l.splitn(3, ':');
                let _id = it.next()?;
                let ctrls = it.next()?;
                let path = it.next()?;
                Some((ctrls.split(',').collect(), path))
            })
            .collect();
        let mut dirs = Vec::new();
        for c in Controller::ALL {
            let name = c.v1_name();
            let Some((mnt, root, _, _)) = mounts
                .iter()
                .find(|(_, _, ty, opts)| ty == "cgroup" && opts.iter().any(|o| o == name))
            else {
                continue;
            };
            let Some((_, path)) = membership.iter().find(|(cs, _)| cs.contains(&name)) else {
                continue;
            };
            dirs.push((c, join_under(mnt, root, path)));
        }
        if dirs.iter().any(|(c, _)| *c == Controller::Memory) {
            return Ok(Cgroup {
                version: Version::V1,
                dirs,
            });
        }
        let v2 = mounts.iter().find(|(_, _, ty, _)| ty == "cgroup2");
        let path = membership.iter().find(|(cs, _)| cs == &vec![""]);
        match (v2, path) {
            (Some((mnt, root, _, _)), Some((_, path))) => {
                let dir = join_under(mnt, root, path);
                Ok(Cgroup {
                    version: Version::V2,
                    dirs: Controller::ALL.iter().map(|c| (*c, dir.clone())).collect(),
                })
            }
            _ => Err(CgroupError::Unavailable(
                "neither a v1 memory hierarchy nor cgroup2 is mounted".into(),
            )),
        }
    }

    /// A cgroup made of the given directories (e.g. read back from a record).
    pub fn from_dirs(version: Version, dirs: Vec<(Controller, PathBuf)>) -> Cgroup {
        Cgroup { version, dirs }
    }

    pub fn dirs(&self) -> &[(Controller, PathBuf)] {
        &self.dirs
    }

    fn dir(&self, c: Controller) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(cc, _)| *cc == c)
            .map(|(_, p)| p.as_path())
    }

    pub fn has(&self, c: Controller) -> bool {
        self.dir(c).is_some()
    }

    /// Distinct directories (v2 has one for every controller).
    fn unique_dirs(&self) -> Vec<&Path> {
        let mut out: Vec<&Path> = Vec::new();
        for (_, d) in &self.dirs {
            if !out.contains(&d.as_path()) {
                out.push(d);
            }
        }
        out
    }

    /// Creates (or reuses) the child `name` in every hierarchy. On v2 the
    /// controllers are enabled for children first.
    pub fn child(&self, name: &str) -> Result<Cgroup, CgroupError> {
        if self.version == Version::V2 {
            if let Some(d) = self.unique_dirs().first() {
                let ctl = d.join("cgroup.subtree_control");
                // Enabling is best effort: a controller we may not delegate
                // shows up as a missing file, and is reported as such.
                for c in ["+memory", "+cpu", "+pids"] {
                    let _ = std::fs::write(&ctl, c);
                }
            }
        }
        let mut dirs = Vec::new();
        for (c, d) in &self.dirs {
            let child = d.join(name);
            if !child.exists() {
                std::fs::create_dir(&child).map_err(io(&child))?;
            }
            dirs.push((*c, child));
        }
        Ok(Cgroup {
            version: self.version,
            dirs,
        })
    }

    fn write(&self, c: Controller, file: &str, value: &str) -> Result<(), CgroupError> {
        let dir = self
            .dir(c)
            .ok_or_else(|| CgroupError::Unavailable(format!("no {} controller", c.v1_name())))?;
        let path = dir.join(file);
        std::fs::write(&path, value).map_err(io(&path))
    }

    fn read(&self, c: Controller, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir(c)?.join(file)).ok()
    }

    pub fn set_memory_limit(&self, bytes: u64) -> Result<(), CgroupError> {
        match self.version {
            Version::V1 => {
                self.write(
                    Controller::Memory,
                    "memory.limit_in_bytes",
                    &bytes.to_string(),
                )?;
                // Without swap accounting this file is absent; with it, the
                // limit must cover swap too or the kernel swaps instead of OOM.
                let _ = self.write(
                    Controller::Memory,
                    "memory.memsw.limit_in_bytes",
                    &bytes.to_string(),
                );
                Ok(())
            }
            Version::V2 => {
                self.write(Controller::Memory, "memory.max", &bytes.to_string())?;
                let _ = self.write(Controller::Memory, "memory.swap.max", "0");
                Ok(())
            }
        }
    }

    /// The memory limit in force on this group, if any.
    pub fn memory_limit(&self) -> Option<u64> {
        let raw = match self.version {
            Version::V1 => self.read(Controller::Memory, "memory.limit_in_bytes")?,
            Version::V2 => self.read(Controller::Memory, "memory.max")?,
        };
        let v: u64 = raw.trim().parse().ok()?;
        // v1 reports "no limit" as a huge page-aligned number.
        (v < (1u64 << 62)).then_some(v)
    }

    /// `millis` of CPU per second (1000 = one core).
    pub fn set_cpu_millis(&self, millis: u32) -> Result<(), CgroupError> {
        let period = 100_000u64;
        let quota = u64::from(millis) * period / 1000;
        match self.version {
            Version::V1 => {
                self.write(Controller::Cpu, "cpu.cfs_period_us", &period.to_string())?;
                self.write(Controller::Cpu, "cpu.cfs_quota_us", &quota.to_string())
            }
            Version::V2 => self.write(Controller::Cpu, "cpu.max", &format!("{quota} {period}")),
        }
    }

    pub fn cpu_millis(&self) -> Option<u32> {
        let (quota, period) = match self.version {
            Version::V1 => (
                self.read(Controller::Cpu, "cpu.cfs_quota_us")?
                    .trim()
                    .parse::<i64>()
                    .ok()?,
                self.read(Controller::Cpu, "cpu.cfs_period_us")?
                    .trim()
                    .parse::<i64>()
                    .ok()?,
            ),
            Version::V2 => {
                let raw = self.read(Controller::Cpu, "cpu.max")?;
                let mut it = raw.split_whitespace();
                let q = it.next()?;
                let p: i64 = it.next()?.parse().ok()?;
                (if q == "max" { -1 } else { q.parse().ok()? }, p)
            }
        };
        (quota > 0 && period > 0).then(|| (quota * 1000 / period) as u32)
    }

    pub fn set_pids_max(&self, n: u32) -> Result<(), CgroupError> {
        self.write(Controller::Pids, "pids.max", &n.to_string())
    }

    pub fn pids_max(&self) -> Option<u32> {
        self.read(Controller::Pids, "pids.max")?.trim().parse().ok()
    }

    /// OOM kills inside this group so far.
    pub fn oom_kills(&self) -> u64 {
        let file = match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        self.read(Controller::Memory, file)
            .and_then(|text| {
                text.lines().find_map(|l| {
                    l.strip_prefix("oom_kill ")
                        .and_then(|v| v.trim().parse().ok())
                })
            })
            .unwrap_or(0)
    }

    /// Pids directly in this group (not in its children).
    pub fn procs(&self) -> Vec<i32> {
        let c = if self.has(Controller::Freezer) {
            Controller::Freezer
        } else {
            Controller::Memory
        };
        self.read(c, "cgroup.procs")
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Pids in this group and all its descendants.
    pub fn all_procs(&self) -> Vec<i32> {
        let mut out = self.procs();
        for child in self.children() {
            out.extend(child.all_procs());
        }
        out
    }

    fn children(&self) -> Vec<Cgroup> {
        let Some((_, first)) = self.dirs.first() else {
            return vec![];
        };
        let Ok(rd) = std::fs::read_dir(first) else {
            return vec![];
        };
        rd.filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .map(|name| Cgroup {
                version: self.version,
                dirs: self
                    .dirs
                    .iter()
                    .map(|(c, d)| (*c, d.join(&name)))
                    .filter(|(_, d)| d.exists())
                    .collect(),
            })
            .collect()
    }

    /// Freezes every process of the group (and its descendants).
    pub fn freeze(&self) -> Result<(), CgroupError> {
        match self.version {
            Version::V1 => self.write(Controller::Freezer, "freezer.state", "FROZEN")?,
            Version::V2 => self.write(Controller::Freezer, "cgroup.freeze", "1")?,
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.frozen() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Err(CgroupError::Busy(self.dirs[0].1.clone()))
    }

    pub fn frozen(&self) -> bool {
        match self.version {
            Version::V1 => self
                .read(Controller::Freezer, "freezer.state")
                .is_some_and(|s| s.trim() == "FROZEN"),
            Version::V2 => self
                .read(Controller::Freezer, "cgroup.events")
                .is_some_and(|s| s.lines().any(|l| l.trim() == "frozen 1")),
        }
    }

    pub fn thaw(&self) -> Result<(), CgroupError> {
        match self.version {
            Version::V1 => self.write(Controller::Freezer, "freezer.state", "THAWED"),
            Version::V2 => self.write(Controller::Freezer, "cgroup.freeze", "0"),
        }
    }

    /// Kills every process of the group and its descendants and waits until
    /// they are gone. Frozen first, so nothing can fork its way out between
    /// reading the list and the kill. Returns how many were killed.
    pub fn kill_all(&self) -> Result<usize, CgroupError> {
        let frozen = self.has(Controller::Freezer) && self.freeze().is_ok();
        let mut killed = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.all_procs();
            if pids.is_empty() {
                break;
            }
            for pid in &pids {
                if crate::sys::kill(*pid, libc::SIGKILL) {
                    killed += 1;
                }
            }
            if frozen {
                // Killed tasks in a frozen group die once thawed.
                let _ = self.thaw();
            }
            if Instant::now() > deadline {
                return Err(CgroupError::Busy(self.dirs[0].1.clone()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if frozen {
            let _ = self.thaw();
        }
        Ok(killed)
    }

    /// Kills what is left and removes the group (children first).
    pub fn destroy(&self) -> Result<(), CgroupError> {
        self.kill_all()?;
        self.remove()
    }

    fn remove(&self) -> Result<(), CgroupError> {
        for child in self.children() {
            child.remove()?;
        }
        for d in self.unique_dirs() {
            if d.exists() {
                // An exiting task may linger an instant after it left the list.
                let mut tries = 0;
                loop {
                    match std::fs::remove_dir(d) {
                        Ok(()) => break,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                        Err(e) if tries < 200 => {
                            tries += 1;
                            let _ = e;
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => return Err(io(d)(e)),
                    }
                }
            }
        }
        Ok(())
    }

    /// The `cgroup.procs` files a process writes its pid to, to join.
    pub fn join_files(&self) -> Vec<PathBuf> {
        self.unique_dirs()
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    /// Moves a process into this group.
    pub fn add(&self, pid: u32) -> Result<(), CgroupError> {
        for f in self.join_files() {
            std::fs::write(&f, pid.to_string()).map_err(io(&f))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 30 0:22 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
27 25 0:24 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
28 25 0:25 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
29 25 0:26 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
30 25 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn finds_the_own_group_in_each_v1_hierarchy() {
        let own = "8:pids:/\n6:freezer:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n";
        let cg = Cgroup::from_tables(HYBRID, own).unwrap();
        assert_eq!(cg.version, Version::V1);
        assert_eq!(
            cg.dir(Controller::Memory).unwrap(),
            Path::new("/sys/fs/cgroup/memory/process_api/abc")
        );
        assert_eq!(
            cg.dir(Controller::Pids).unwrap(),
            Path::new("/sys/fs/cgroup/pids")
        );
    }

    #[test]
    fn falls_back_to_the_unified_hierarchy() {
        let info = "30 25 0:27 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n";
        let cg = Cgroup::from_tables(info, "0::/system.slice/x.service\n").unwrap();
        assert_eq!(cg.version, Version::V2);
        assert_eq!(
            cg.dir(Controller::Memory).unwrap(),
            Path::new("/sys/fs/cgroup/system.slice/x.service")
        );
        assert_eq!(cg.unique_dirs().len(), 1);
    }
}
