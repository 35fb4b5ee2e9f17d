//! A sandbox task as Fargate runs one, made on this host (`armada-sandbox
//! task`, the local data plane's `fargate` mode), so what the agent can do
//! there is measured here rather than assumed:
//!
//! - the container's capabilities only ([`sys::FARGATE_CAPS`], Docker's
//!   default set): no CAP_SYS_ADMIN (no mount, no namespaces), no
//!   CAP_NET_ADMIN, taken out of the bounding set so nothing gets them back;
//! - its own pid namespace with its own /proc (the agent is pid 1);
//! - a mount namespace in which the root filesystem, /sys and cgroupfs are
//!   read-only (`readonlyRootFilesystem`) but for the task's own directory
//!   (its one writable volume) and a fresh /dev/shm, and where what is not
//!   the task's (the repository, other tasks, other tenants' data) is
//!   covered, as it is simply absent from a task's image;
//! - when its tier has no egress (`ARMADA_SANDBOX_TASK_NETWORK=isolated`,
//!   a security group with no egress rule), a network namespace of its own
//!   with loopback only, in which the AWS endpoint the agent uses is relayed
//!   to the emulator ([`relay`]) as a VPC endpoint would be, for the agent
//!   alone: connections from any other uid are dropped (a real endpoint
//!   wants the task's credentials, which no call holds).
//!
//! The data plane places the launcher in the task's cgroup (memory, CPU,
//! pids) before it starts; inside, that cgroupfs is read-only, so the agent
//! gets no cgroup per call.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::program::Program;

mod relay;
pub mod sys;

/// The environment variable that carries the [`TaskSpec`] to the launcher
/// (as JSON), or says it comes on standard input ([`TASK_SPEC_ON_STDIN`]).
pub const TASK_SPEC_ENV: &str = "ARMADA_TASK_SPEC";
/// [`TASK_SPEC_ENV`]'s value when the spec is the launcher's standard
/// input, read to its end (a spec may outgrow an environment variable).
pub const TASK_SPEC_ON_STDIN: &str = "stdin";

/// What the launcher makes of the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The task's one writable directory (its volume).
    pub writable: PathBuf,
    /// Host paths that are not in the task: covered by empty filesystems.
    pub hide: Vec<PathBuf>,
    /// `Some(port)`: the task gets a network namespace of its own, with
    /// 127.0.0.1:`port` relayed to the host's (the emulator) for the agent.
    pub endpoint_port: Option<u16>,
}

/// `armada-sandbox task`: builds the task and runs the agent in it; the
/// agent's exit code. Must run single-threaded (it forks).
pub fn launch(program: &Program) -> i32 {
    let text = std::env::var(TASK_SPEC_ENV)
        .map_err(|e| e.to_string())
        .and_then(|s| {
            if s != TASK_SPEC_ON_STDIN {
                return Ok(s);
            }
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map(|_| text)
                .map_err(|e| format!("standard input: {e}"))
        });
    let spec: TaskSpec =
        match text.and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string())) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("armada-sandbox task: bad {TASK_SPEC_ENV}: {e}");
                return 1;
            }
        };
    std::env::remove_var(TASK_SPEC_ENV);
    match build(program, &spec) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("armada-sandbox task: {e}");
            1
        }
    }
}

fn build(program: &Program, spec: &TaskSpec) -> Result<i32, String> {
    // The host's network, kept for the relay's outgoing side.
    let host_net =
        std::fs::File::open("/proc/self/ns/net").map_err(|e| format!("host netns: {e}"))?;
    // The pid namespace comes later, in a child: a process that has
    // unshared one may not start threads (the relay's).
    let mut flags = libc::CLONE_NEWNS;
    if spec.endpoint_port.is_some() {
        flags |= libc::CLONE_NEWNET;
    }
    crate::sys::unshare(flags).map_err(|e| format!("namespaces: {e}"))?;
    // The program, reached by its descriptor once its path is covered (it
    // may live in the repository, which is not in the task); opened in the
    // task's mount namespace, where it is bound from.
    let exe = crate::sys::open_path(&program.exe)
        .map_err(|e| format!("{}: {e}", program.exe.display()))?;
    let endpoint = match spec.endpoint_port {
        Some(port) => {
            crate::sys::loopback_up().map_err(|e| format!("loopback: {e}"))?;
            let listener = std::net::TcpListener::bind(("127.0.0.1", port))
                .map_err(|e| format!("the endpoint's relay on port {port}: {e}"))?;
            // Opened now: once the agent's /proc is over /proc, this
            // process (outside its pid namespace) has no /proc/self.
            let table = std::fs::File::open("/proc/self/net/tcp")
                .map_err(|e| format!("/proc/self/net/tcp: {e}"))?;
            Some((listener, table, port))
        }
        None => None,
    };
    read_only_root(spec)?;
    let image = image_program(program, &exe, &spec.writable)?;
    let child = sys::fork_single_threaded().map_err(|e| format!("fork: {e}"))?;
    if child == 0 {
        sys::exit_now(pid_namespace(&image));
    }
    if let Some((listener, table, port)) = endpoint {
        std::thread::spawn(move || relay::serve(listener, table, host_net, port));
    }
    Ok(sys::wait_exit(child))
}

/// The mounts of a task: private, read-only but for its directory and
/// /dev/shm, what is not the task's covered.
fn read_only_root(spec: &TaskSpec) -> Result<(), String> {
    use crate::sys::mount;
    crate::sys::make_mounts_private().map_err(|e| format!("making / private: {e}"))?;
    for path in &spec.hide {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue;
        };
        crate::sys::cover(path, meta.is_dir())
            .map_err(|e| format!("covering {}: {e}", path.display()))?;
    }
    let w = &spec.writable;
    mount(Some(w), w, None, libc::MS_BIND | libc::MS_REC, None)
        .map_err(|e| format!("the task's volume {}: {e}", w.display()))?;
    let shm = Path::new("/dev/shm");
    let shm_ok = shm.is_dir()
        && mount(
            Some(Path::new("shm")),
            shm,
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some("size=64m,mode=1777"),
        )
        .is_ok();
    sys::mount_setattr_recursive(Path::new("/"), sys::MOUNT_ATTR_RDONLY, 0)
        .map_err(|e| format!("a read-only root: {e}"))?;
    sys::mount_setattr_recursive(w, 0, sys::MOUNT_ATTR_RDONLY)
        .map_err(|e| format!("the task's volume writable: {e}"))?;
    if shm_ok {
        sys::mount_setattr_recursive(shm, 0, sys::MOUNT_ATTR_RDONLY)
            .map_err(|e| format!("/dev/shm writable: {e}"))?;
    }
    Ok(())
}

/// The program as the task's image holds it: bound read-only at
/// `<writable>/.image/<name>`, so the agent (and the jails it starts from
/// its own executable) runs it from a path inside the task.
fn image_program(program: &Program, exe: &OwnedFd, writable: &Path) -> Result<Program, String> {
    use crate::sys::mount;
    let name = program.exe.file_name().unwrap_or("armada-sandbox".as_ref());
    let dir = writable.join(".image");
    let target = dir.join(name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::write(&target, b"").map_err(|e| format!("{}: {e}", target.display()))?;
    let source = PathBuf::from(format!("/proc/self/fd/{}", exe.as_raw_fd()));
    mount(Some(&source), &target, None, libc::MS_BIND, None)
        .map_err(|e| format!("the program in the task: {e}"))?;
    mount(
        None,
        &target,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
        None,
    )
    .map_err(|e| format!("the program read-only: {e}"))?;
    Ok(Program {
        exe: target,
        prefix: program.prefix.clone(),
    })
}

/// In the launcher's child: a pid namespace of the task's own, whose pid 1
/// becomes the agent; its exit code.
fn pid_namespace(image: &Program) -> i32 {
    let r = sys::die_with_parent_now()
        .and_then(|()| crate::sys::unshare(libc::CLONE_NEWPID))
        .and_then(|()| sys::fork_single_threaded());
    match r {
        Ok(0) => {
            let e = become_agent(image);
            eprintln!("armada-sandbox task: {e}");
            1
        }
        Ok(pid) => sys::wait_exit(pid),
        Err(e) => {
            eprintln!("armada-sandbox task: the task's pid namespace: {e}");
            1
        }
    }
}

/// In the forked child, pid 1 of the task's pid namespace: its own /proc,
/// the container's capabilities, then the agent. Returns only on failure.
fn become_agent(program: &Program) -> String {
    if let Err(e) = sys::die_with_parent_now() {
        return format!("parent-death signal: {e}");
    }
    if let Err(e) = crate::sys::mount(
        Some(Path::new("proc")),
        Path::new("/proc"),
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    ) {
        return format!("the task's /proc: {e}");
    }
    if let Err(e) = sys::keep_fargate_capabilities() {
        return format!("the container's capabilities: {e}");
    }
    let e = std::process::Command::new(&program.exe)
        .args(&program.prefix)
        .arg("agent")
        .exec();
    format!("executing the agent: {e}")
}
