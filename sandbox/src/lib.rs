//! The sandbox agent (the "Hand") and its confinement. One agent runs in
//! each sandbox task (a Fargate task in AWS, a local process under the
//! local data plane) and runs the agent identity's skill calls one at a
//! time, each in a jail built from the sandbox's resolved capability set.
//!
//! - [`agent`]: the agent's main loop: start, probe, report, serve the hand queue
//! - [`jail`]: the confinement steps, run by `armada-sandbox exec` before it
//!   executes a call's command (cgroups, namespaces, Landlock, uid, seccomp)
//! - [`entry`]: the program's modes (`agent`, `exec`), for `armada-sandbox`
//!   and `armada sandbox` alike
//! - [`effects`]: destructive work judged by what it changes in the workspace
//! - [`bindguard`]: listening sockets on loopback only (cgroup eBPF)
//! - [`cgroup`]: v1/v2 cgroups: limits, freezing, killing, OOM counts
//! - [`env`]: one sandbox's directories, uid, capability set → jail specs
//! - [`fargate`]: a sandbox task as Fargate runs one, made locally (`task`)
//! - [`pipe`]: two TCP connections joined (the relays')
//! - [`runner`]: one call through the jail: timeout, output, reaping, OOM
//! - [`skills`]: `shell_exec`, `python_exec`, `file_read`, `file_write`, `serve`
//! - [`sys`]: the raw system calls, wrapped once

pub mod agent;
pub mod bindguard;
pub mod call;
pub mod cgroup;
pub mod component;
pub mod effects;
pub mod entry;
pub mod env;
pub mod fargate;
pub mod jail;
pub mod pipe;
pub mod program;
pub mod runner;
pub mod skills;
pub mod sys;
