//! The few raw system calls confinement needs, each wrapped once with its
//! safety argument. Everything else uses safe std or crate APIs.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// An `rc` of -1 as the error `errno` says.
pub(crate) fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A path as the C string a system call takes.
pub(crate) fn cpath(p: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Sends `sig` to `pid`; whether it was delivered.
pub fn kill(pid: i32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) takes plain integers and has no memory effects.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Sends `sig` to every process of group `pgid`.
pub fn killpg(pgid: i32, sig: libc::c_int) -> bool {
    // SAFETY: as kill.
    unsafe { libc::killpg(pgid, sig) == 0 }
}

pub fn setsid() -> io::Result<()> {
    // SAFETY: setsid(2) takes no arguments.
    let rc = unsafe { libc::setsid() };
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare(2) takes plain flags; called by a single-threaded process.
    check(unsafe { libc::unshare(flags) })
}

/// Covers `path` in this mount namespace: a directory by an empty,
/// read-only tmpfs nobody may enter, a file by `/dev/null`.
pub fn cover(path: &Path, is_dir: bool) -> io::Result<()> {
    if is_dir {
        mount(
            Some(Path::new("none")),
            path,
            Some("tmpfs"),
            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some("size=4k,mode=000"),
        )
    } else {
        mount(
            Some(Path::new("/dev/null")),
            path,
            None,
            libc::MS_BIND,
            None,
        )
    }
}

/// Makes every mount of this namespace private: nothing mounted from now
/// on shows outside it.
pub fn make_mounts_private() -> io::Result<()> {
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
}

/// mount(2). `source`/`fstype`/`data` may be absent.
pub fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = source.map(cpath).transpose()?;
    let tgt = cpath(target)?;
    let ty = fstype
        .map(CString::new)
        .transpose()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let dat = data
        .map(CString::new)
        .transpose()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives
    // the call, or null where mount(2) accepts null.
    check(unsafe {
        libc::mount(
            src.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            tgt.as_ptr(),
            ty.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            dat.as_ref()
                .map_or(std::ptr::null(), |s| s.as_ptr() as *const libc::c_void),
        )
    })
}

/// umount2(2); `detach` (MNT_DETACH) takes the mount out of the tree now
/// and lets it go once nothing uses it any more.
pub fn umount(target: &Path, detach: bool) -> io::Result<()> {
    let t = cpath(target)?;
    let flags = if detach { libc::MNT_DETACH } else { 0 };
    // SAFETY: `t` is a NUL-terminated string that outlives the call.
    check(unsafe { libc::umount2(t.as_ptr(), flags) })
}

/// setns(2): moves the calling thread into the namespace `fd` is open on.
pub fn setns(fd: BorrowedFd<'_>, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: `fd` is an open descriptor; setns takes plain integers.
    check(unsafe { libc::setns(fd.as_raw_fd(), nstype) })
}

// <linux/loop.h>, which `libc` does not carry.
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// struct loop_info64.
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// struct loop_config (LOOP_CONFIGURE, Linux 5.8).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

fn zeroed_info() -> LoopInfo64 {
    // SAFETY: loop_info64 is plain integers and byte arrays; zeroed is valid.
    unsafe { std::mem::zeroed() }
}

fn open_dev(path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let p = cpath(path)?;
    // SAFETY: `p` is a NUL-terminated string that outlives the call.
    let fd = unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Attaches a free loop device to `file` (read-write) with
/// LO_FLAGS_AUTOCLEAR: the kernel detaches it once its last user (the
/// returned descriptor, a mount of it) is gone, however its owner ended.
/// Returns the device's descriptor and path.
pub fn loop_attach(file: BorrowedFd<'_>) -> io::Result<(OwnedFd, std::path::PathBuf)> {
    let ctl = open_dev(Path::new("/dev/loop-control"), libc::O_RDWR)?;
    let mut tries = 0;
    loop {
        tries += 1;
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = std::path::PathBuf::from(format!("/dev/loop{n}"));
        let dev = open_dev(&path, libc::O_RDWR)?;
        let mut info = zeroed_info();
        info.flags = LO_FLAGS_AUTOCLEAR;
        let config = LoopConfig {
            fd: file.as_raw_fd() as u32,
            block_size: 0,
            info,
            reserved: [0; 8],
        };
        // SAFETY: `config` is a valid loop_config for the duration of the call.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &config) };
        if rc == 0 {
            return Ok((dev, path));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // Taken by someone else between the two calls: another one.
            Some(libc::EBUSY) if tries < 16 => continue,
            // Before Linux 5.8: attach, then set the flag.
            Some(libc::EINVAL | libc::ENOTTY) => {}
            _ => return Err(e),
        }
        // SAFETY: LOOP_SET_FD takes the backing file's descriptor.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_FD as _, file.as_raw_fd()) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EBUSY) && tries < 16 {
                continue;
            }
            return Err(e);
        }
        // SAFETY: `info` is a valid loop_info64 for the duration of the call.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_STATUS64 as _, &info) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: LOOP_CLR_FD takes no argument.
            unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CLR_FD as _, 0) };
            return Err(e);
        }
        return Ok((dev, path));
    }
}

/// The loop device already backed by the file of device `dev` and inode
/// `ino`, if one is.
pub fn loop_backing(dev: u64, ino: u64) -> Option<std::path::PathBuf> {
    let entries = std::fs::read_dir("/sys/block").ok()?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") || !e.path().join("loop/backing_file").exists() {
            continue;
        }
        let path = std::path::PathBuf::from(format!("/dev/{name}"));
        let Ok(fd) = open_dev(&path, libc::O_RDONLY) else {
            continue;
        };
        let mut info = zeroed_info();
        // SAFETY: `info` is a valid loop_info64 the kernel fills.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), LOOP_GET_STATUS64 as _, &mut info) };
        if rc == 0 && info.device == dev && info.inode == ino {
            return Some(path);
        }
    }
    None
}

/// openat2(2): opens `path` relative to `dir` with `flags` (and `mode`
/// when creating), resolved under `resolve` (`RESOLVE_*`). Retried on
/// EAGAIN, which RESOLVE_BENEATH answers when a rename raced the lookup.
pub fn openat2(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: libc::c_int,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let p = cpath(path)?;
    // struct open_how of <linux/openat2.h> (libc's cannot be built).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: u64::from(mode),
        resolve,
    };
    let mut tries = 0;
    loop {
        // SAFETY: `dir` is an open descriptor, `p` a NUL-terminated string
        // and `how` an open_how whose size is passed with it; all outlive
        // the call.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                p.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel just returned this descriptor, owned by no one else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        let e = io::Error::last_os_error();
        tries += 1;
        if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) || tries > 16 {
            return Err(e);
        }
    }
}

/// openat(2) of `path` relative to `dir` (`mode` when creating).
pub fn openat(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    let p = cpath(path)?;
    // SAFETY: `dir` is an open descriptor and `p` a NUL-terminated string
    // that outlives the call; the mode is passed as the unsigned int the
    // variadic argument is read as.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            p.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An O_PATH descriptor of `path`, followed as named (links included).
pub fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let p = cpath(path)?;
    // SAFETY: `p` is a NUL-terminated string that outlives the call.
    let fd = unsafe { libc::open(p.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// mkdirat(2): directory `name` in `dir`.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &Path, mode: libc::mode_t) -> io::Result<()> {
    let p = cpath(name)?;
    // SAFETY: `dir` is an open descriptor and `p` a NUL-terminated string
    // that outlives the call.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), p.as_ptr(), mode) })
}

/// Drops to `uid`/`gid` with exactly `groups` as supplementary groups.
pub fn drop_privileges(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    // SAFETY: the slice pointer and length describe valid memory.
    check(unsafe { libc::setgroups(groups.len(), groups.as_ptr()) })?;
    // SAFETY: plain integer arguments. setresgid/uid leave no saved id behind.
    check(unsafe { libc::setresgid(gid, gid, gid) })?;
    // SAFETY: as above.
    check(unsafe { libc::setresuid(uid, uid, uid) })
}

pub fn set_rlimit(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: `lim` is a valid rlimit for the duration of the call.
    check(unsafe { libc::setrlimit(resource, &lim) })
}

/// Brings the loopback interface of the current network namespace up, so a
/// sandbox without a network still has its own 127.0.0.1.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo\0".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: fd is an open socket and req a valid ifreq naming "lo".
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) };
    let result = if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: the union member ifru_flags is the one SIOCGIFFLAGS filled.
        unsafe {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        }
        // SAFETY: as above, setting the flags just read.
        check(unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) })
    };
    // SAFETY: closing the socket opened above.
    unsafe { libc::close(fd) };
    result
}

/// Makes this process the reaper of its orphaned descendants.
pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) })
}

/// Reaps any exited child without blocking; its pid, if one was reaped.
pub fn reap_any() -> Option<i32> {
    let mut status = 0;
    // SAFETY: waitpid with a valid status pointer.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    (pid > 0).then_some(pid)
}

/// The running kernel's release (`uname -r`), and its major and minor
/// numbers when they parse.
pub fn kernel_release() -> (String, Option<(u32, u32)>) {
    // SAFETY: utsname is plain data; zeroed is a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid utsname for the duration of the call.
    if unsafe { libc::uname(&mut u) } != 0 {
        return (String::new(), None);
    }
    let bytes: Vec<u8> = u
        .release
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    let release = String::from_utf8_lossy(&bytes).into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let version = match (parts.next(), parts.next()) {
        (Some(a), Some(b)) => a.parse().ok().zip(b.parse().ok()),
        _ => None,
    };
    (release, version)
}

pub fn geteuid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() }
}

pub fn chown(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
}

/// Makes a command's child join cgroups before it executes: each file is a
/// `cgroup.procs`, to which the child writes "0" (meaning itself), so not
/// one instruction of the program runs outside its group.
pub fn join_cgroups_before_exec(
    cmd: &mut tokio::process::Command,
    procs_files: &[std::path::PathBuf],
) -> io::Result<()> {
    let paths: Vec<CString> = procs_files
        .iter()
        .map(|p| cpath(p))
        .collect::<io::Result<_>>()?;
    // SAFETY: the closure runs between fork and exec and only calls
    // open/write/close on strings prepared before the fork: no allocation,
    // no locks.
    unsafe {
        cmd.pre_exec(move || {
            for p in &paths {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let rc = libc::write(fd, b"0".as_ptr() as *const libc::c_void, 1);
                libc::close(fd);
                if rc != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(())
}

/// The child is killed (SIGKILL) when the thread that spawned it exits, so
/// no sandbox process outlives the host process that runs it.
pub fn die_with_parent(cmd: &mut tokio::process::Command) {
    // SAFETY: prctl with integer arguments between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The real uid and session of process `pid`, from its /proc files;
/// `None` for a zombie.
pub fn process_uid_and_session(pid: i32) -> Option<(u32, i32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's name (in parentheses, which may hold anything):
    // state, ppid, pgrp, session.
    let rest: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    // A zombie is gone already (its parent has yet to reap it).
    if matches!(rest.first(), Some(&"Z" | &"X")) {
        return None;
    }
    let session = rest.get(3)?.parse().ok()?;
    Some((uid, session))
}

/// The value of extended attribute `name` of `path` itself (not of what a
/// link points to); `None` when it has none or cannot be read.
pub fn lgetxattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = cpath(path).ok()?;
    let n = CString::new(name).ok()?;
    let mut buf = vec![0u8; 256];
    // SAFETY: both names are NUL-terminated C strings that outlive the
    // call, and the buffer's length is passed with its pointer.
    let rc = unsafe {
        libc::lgetxattr(
            p.as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr().cast::<libc::c_void>(),
            buf.len(),
        )
    };
    let len = usize::try_from(rc).ok()?;
    buf.truncate(len);
    Some(buf)
}
