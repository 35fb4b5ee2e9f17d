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

pub fn write_pid(path: &Path, pid: u32) -> Result<()> {
    std::fs::write(path, pid.to_string()).with_context(|| format!("writing {}", path.display()))
}

pub fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}
