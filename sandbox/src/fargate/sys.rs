//! The raw system calls of a Fargate-like task: its capabilities, its
//! read-only mounts, and the launcher's fork. Wrapped once each, with their
//! safety argument, as in [`crate::sys`].

#![allow(unsafe_code)]

use std::io;
use std::path::Path;

use crate::sys::{check, cpath};

/// The capabilities a Fargate container keeps (Docker's default set; a
/// task definition may add SYS_PTRACE and nothing else): no SYS_ADMIN (no
/// mount, no namespaces), no NET_ADMIN, no SYS_RESOURCE, no SYS_PTRACE.
pub const FARGATE_CAPS: [u32; 14] = [
    0,  // CHOWN
    1,  // DAC_OVERRIDE
    3,  // FOWNER
    4,  // FSETID
    5,  // KILL
    6,  // SETGID
    7,  // SETUID
    8,  // SETPCAP
    10, // NET_BIND_SERVICE
    13, // NET_RAW
    18, // SYS_CHROOT
    27, // MKNOD
    29, // AUDIT_WRITE
    31, // SETFCAP
];

/// The highest capability number this kernel knows.
fn cap_last() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Leaves the calling thread (and what it executes) only the capabilities
/// of a Fargate container ([`FARGATE_CAPS`]): every other one leaves the
/// bounding set (so no later exec, as root or through a file capability,
/// gets it back) and the effective, permitted, inheritable and ambient
/// sets. Capabilities are per thread: a test drops them on its own thread
/// and spawns from it.
pub fn keep_fargate_capabilities() -> io::Result<()> {
    let keep: u64 = FARGATE_CAPS.iter().fold(0, |m, c| m | 1 << c);
    for cap in 0..=cap_last() {
        if keep & (1 << cap) == 0 {
            // SAFETY: prctl with integer arguments.
            let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
            // EINVAL: a capability this kernel does not have.
            if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                return Err(io::Error::last_os_error());
            }
        }
    }
    // SAFETY: prctl with integer arguments.
    check(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    })?;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: a v3 header and the two data words it describes.
    check(unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut Header,
            data.as_mut_ptr(),
        ) as libc::c_int
    })?;
    for (i, d) in data.iter_mut().enumerate() {
        let k = (keep >> (32 * i)) as u32;
        d.effective &= k;
        d.permitted &= k;
        d.inheritable = 0;
    }
    // SAFETY: as above; capset reads the data.
    check(unsafe {
        libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) as libc::c_int
    })
}

/// Whether the calling thread holds `cap` in its effective set.
pub fn has_capability(cap: u32) -> bool {
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|eff| eff & (1 << cap) != 0)
}

/// CAP_SYS_ADMIN: mounts and namespaces.
pub const CAP_SYS_ADMIN: u32 = 21;

/// mount_setattr(2) over `path` and every mount beneath it: sets `set`
/// and clears `clear` (`MOUNT_ATTR_*`).
pub fn mount_setattr_recursive(path: &Path, set: u64, clear: u64) -> io::Result<()> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    let p = cpath(path)?;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `p` is a NUL-terminated string and `attr` a mount_attr whose
    // size is passed with it; both outlive the call.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            p.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        ) as libc::c_int
    })
}

/// MOUNT_ATTR_RDONLY.
pub const MOUNT_ATTR_RDONLY: u64 = 1;

/// fork(2), for a single-threaded process only (the task launcher).
/// `Ok(0)` in the child, the child's pid in the parent.
pub fn fork_single_threaded() -> io::Result<i32> {
    // SAFETY: the caller is single-threaded, so the child is a complete
    // copy (no lock held by a thread that does not exist there).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pid)
    }
}

/// Waits for `pid`; its exit code (128 + the signal that killed it).
pub fn wait_exit(pid: i32) -> i32 {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid status pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc == pid {
            if libc::WIFEXITED(status) {
                return libc::WEXITSTATUS(status);
            }
            if libc::WIFSIGNALED(status) {
                return 128 + libc::WTERMSIG(status);
            }
        } else if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 1;
        }
    }
}

/// This process gets SIGKILL when its parent dies.
pub fn die_with_parent_now() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) })
}

/// Ends a forked child now, without the parent's destructors or atexit
/// handlers.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit(2) ends the process; nothing is left to run.
    unsafe { libc::_exit(code) }
}
