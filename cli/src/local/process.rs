//! Process plumbing for the local stack: pid files, detaching, a file lock.

#![allow(unsafe_code)]

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

/// An exclusive `flock` held until dropped.
#[derive(Debug)]
pub struct FileLock(#[allow(dead_code)] File);

impl FileLock {
    pub fn acquire(path: &Path) -> Result<Self> {
        let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        // SAFETY: flock on a descriptor we own; blocks until granted.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            anyhow::bail!("flock {} failed", path.display());
        }
        Ok(FileLock(f))
    }
}

/// Puts the child in its own session so a terminal's Ctrl-C does not reach
/// it; with `die_with_parent` it is killed when the spawning thread's
/// process ends (used by tests, so no emulator outlives them).
pub fn detach(cmd: &mut Command, die_with_parent: bool) {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if die_with_parent {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            }
            Ok(())
        });
    }
}

pub fn alive(pid: u32) -> bool {
    // A child of ours that exited is a zombie until reaped, and a zombie
    // still "exists" for kill(0): reap it first.
    let mut status = 0;
    // SAFETY: non-blocking waitpid on a pid; fails harmlessly for non-children.
    if unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) } == pid as i32 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

pub fn terminate(pid: u32) -> bool {
    // SAFETY: sends SIGTERM to a pid we recorded.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) == 0 }
}

/// `kill -9`: the process ends at once, mid-whatever it was doing.
pub fn kill(pid: u32) -> bool {
    // SAFETY: sends SIGKILL to a pid we recorded.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) == 0 }
}

/// Stops a process and waits until it is gone: `SIGTERM`, then `SIGKILL`
/// once `grace` has passed. Whether it is gone.
pub fn stop(pid: u32, grace: std::time::Duration) -> bool {
    let gone_within = |limit: std::time::Duration| {
        let start = std::time::Instant::now();
        while start.elapsed() < limit {
            if !alive(pid) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        !alive(pid)
    };
    if !terminate(pid) {
        return !alive(pid);
    }
    if gone_within(grace) {
        return true;
    }
    // SAFETY: sends SIGKILL to a pid we recorded, which ignored SIGTERM.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    gone_within(std::time::Duration::from_secs(5))
}

pub fn write_pid(path: &Path, pid: u32) -> Result<()> {
    std::fs::write(path, pid.to_string()).with_context(|| format!("writing {}", path.display()))
}

pub fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Writes a file only its owner may read (`0600`), such as the stack's
/// keys in `.armada/local.env`: into a new file beside it, then renamed
/// over it, so neither an older world-readable file's mode nor a half
/// written file is ever what others see.
pub fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(contents.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write()
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
        .with_context(|| format!("writing {}", path.display()))
}

/// A loopback port free at this moment (the OS's pick), for a server
/// started next: an emulator, an API, a receiver.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_private_file_is_0600_even_over_a_world_readable_one() {
        let dir = std::env::temp_dir().join(format!("armada-private-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("local.env");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, "ARMADA_ADMIN_KEY=secret\n").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "ARMADA_ADMIN_KEY=secret\n"
        );
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary file left"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
