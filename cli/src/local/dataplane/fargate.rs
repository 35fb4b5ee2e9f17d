//! The data plane's `fargate` mode: each task's agent is started the way
//! Fargate starts a sandbox task's container (`armada sandbox task`, see
//! [`armada_sandbox::fargate`]), so what a profile gets there is measured
//! on this machine: no CAP_SYS_ADMIN/NET_ADMIN, a read-only root and
//! cgroupfs but for the task's own directory, nothing of the host's that a
//! task's image would not hold, its own pid namespace, and, for a tier
//! without egress, its own network namespace whose only way out is the
//! AWS endpoint, for the agent.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{bail, Result};

use armada_core::ports::provider::{task_env, TaskInfo};
use armada_sandbox::fargate::TaskSpec;

use super::host;

/// How the data plane runs a sandbox task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DataPlaneMode {
    /// As a local process with every capability: calls get namespaces and
    /// cgroups of their own.
    #[default]
    Local,
    /// As Fargate would (`armada up --dataplane fargate`).
    Fargate,
}

impl DataPlaneMode {
    /// The sandbox program's mode that starts a task.
    pub(super) fn entry(self) -> &'static str {
        match self {
            DataPlaneMode::Local => "agent",
            DataPlaneMode::Fargate => "task",
        }
    }
}

impl FromStr for DataPlaneMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "local" => Ok(DataPlaneMode::Local),
            "fargate" => Ok(DataPlaneMode::Fargate),
            other => Err(format!("{other:?}: expected local or fargate")),
        }
    }
}

/// The task a Fargate-like launcher makes for `info`: `dir` its one
/// writable volume, `data_root` its tenant's data; hidden, what a task
/// would not hold: the repositories, every other task and stack under
/// `root`'s parent, and every other tenant's data.
pub(super) fn task_spec(
    info: &TaskInfo,
    root: &Path,
    dir: &Path,
    data_root: &Path,
    endpoint: &str,
) -> Result<TaskSpec> {
    let everything_local = root.parent().unwrap_or(root).to_path_buf();
    let repos: Vec<PathBuf> = host::repositories()
        .into_iter()
        .chain([root.to_path_buf(), everything_local])
        .collect();
    let hide = host::denied_paths(
        &repos,
        &host::data_base(root),
        &[dir.to_path_buf(), data_root.to_path_buf()],
    );
    let isolated = info.env.get(task_env::TASK_NETWORK).map(String::as_str) == Some("isolated");
    let endpoint_port = if isolated {
        Some(loopback_port(endpoint)?)
    } else {
        None
    };
    Ok(TaskSpec {
        writable: dir.to_path_buf(),
        hide,
        endpoint_port,
    })
}

/// The port of an endpoint on this machine's loopback, which the task's
/// relay can carry.
fn loopback_port(endpoint: &str) -> Result<u16> {
    let rest = endpoint
        .strip_prefix("http://")
        .unwrap_or(endpoint)
        .trim_end_matches('/');
    match rest.split_once(':') {
        Some(("127.0.0.1" | "localhost", port)) => Ok(port.parse()?),
        _ => bail!(
            "an isolated task reaches the emulator through a relay to 127.0.0.1:<port>; \
             {endpoint} is not on loopback"
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn modes_parse_and_only_a_loopback_endpoint_is_relayed() {
        assert_eq!("local".parse(), Ok(DataPlaneMode::Local));
        assert_eq!("fargate".parse(), Ok(DataPlaneMode::Fargate));
        assert!("docker".parse::<DataPlaneMode>().is_err());
        assert_eq!(DataPlaneMode::default(), DataPlaneMode::Local);
        assert_eq!(loopback_port("http://127.0.0.1:4566").unwrap(), 4566);
        assert_eq!(loopback_port("http://localhost:5000/").unwrap(), 5000);
        assert!(loopback_port("http://10.0.0.5:4566").is_err());
    }
}
