//! The local plane's stand-in for a task's own address: sandboxes share
//! this host's network, so what a sandbox serves must be reachable through
//! its published port on loopback only, never on the host's other
//! addresses ([`armada_sandbox::bindguard`]). Each task's processes are in
//! a cgroup v2 whose binds are judged: the task's own cgroup where the
//! host runs v2, else a group made for it in the v2 hierarchy a hybrid
//! host mounts beside v1 (a process is in one group of each hierarchy).

use std::path::{Path, PathBuf};

use armada_sandbox::bindguard;
use armada_sandbox::cgroup::{Cgroup, Version};

/// Where this stack's v2 groups go on a hybrid host.
fn stack_groups(stack: &str) -> Option<PathBuf> {
    Some(bindguard::unified_root()?.join(format!("armada-{stack}")))
}

/// Guards the binds of task `id`: `Ok(Some(dir))` is a v2 group made for
/// it, which its processes must join (and which goes with the task).
pub(super) fn guard(
    stack: &str,
    id: &str,
    cgroup: Option<&Cgroup>,
) -> Result<Option<PathBuf>, String> {
    if let Some(cg) = cgroup.filter(|c| c.version == Version::V2) {
        let dir = cg
            .dirs()
            .first()
            .map(|(_, d)| d.clone())
            .ok_or("a v2 cgroup without a directory")?;
        bindguard::loopback_binds(&dir).map_err(|e| e.to_string())?;
        return Ok(None);
    }
    let dir = stack_groups(stack)
        .ok_or("this host mounts no cgroup v2 hierarchy")?
        .join(id);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    bindguard::loopback_binds(&dir).map_err(|e| e.to_string())?;
    Ok(Some(dir))
}

/// Removes a task's group once its processes are gone.
pub(super) fn release(dir: &Path) {
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::warn!(group = %dir.display(), error = %e, "could not remove a task's bind group");
    }
}

/// Groups an earlier run of this stack left (their processes were killed
/// with its cgroups).
pub(super) fn clear_leftovers(stack: &str) {
    let Some(groups) = stack_groups(stack) else {
        return;
    };
    for e in std::fs::read_dir(&groups).into_iter().flatten().flatten() {
        let _ = std::fs::remove_dir(e.path());
    }
}
