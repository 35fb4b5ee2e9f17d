//! The workspace's disk: a filesystem of the limit's `disk_mb` of its own,
//! mounted at the workspace, so that no call writes past the limit however
//! many files it makes (RLIMIT_FSIZE, which the jail sets too, only holds
//! each file to it).
//!
//! Where the agent may mount (root with CAP_SYS_ADMIN: the local data
//! plane), the disk is a sparse ext4 image in the sandbox's directory on a
//! loop device, or a tmpfs of that size where loop devices are missing.
//! Where it may not (Fargate), the task's ephemeral storage is the cap and
//! the `disk` control says that only the largest file is held here.
//!
//! The agent mounts in a mount namespace of its own ([`enter_own_mounts`]),
//! which it and its calls share: nothing it mounts shows on the host, and
//! the mount goes with the agent's last process however the agent ends (a
//! SIGKILL included); the loop device then detaches itself. Stopping, the
//! agent unmounts the disk and removes the image ([`Disk::release`]); an
//! agent that crashed leaves the image for the one restarted after it.

use std::convert::Infallible;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use armada_domain::sandbox::controls::Control;

use crate::env::SandboxEnv;

/// The ext4 image, in the sandbox's directory (root's, 0600).
pub const IMAGE: &str = "workspace.img";
/// Where a new disk is mounted first, to take in the workspace's content.
const STAGING: &str = ".workspace-disk";
/// Set (to the agent's pid) once the agent runs in its own mount namespace.
pub const OWN_MOUNTS_ENV: &str = "ARMADA_SANDBOX_OWN_MOUNTS";
const MIB: u64 = 1024 * 1024;

/// What backs a workspace disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// An ext4 image on a loop device.
    Ext4 { device: PathBuf },
    /// A tmpfs (in memory).
    Tmpfs,
}

/// Which backing to try first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefer {
    /// An ext4 image, a tmpfs when loop devices are unavailable.
    Image,
    /// A tmpfs only.
    Tmpfs,
}

/// A filesystem of the limit's size mounted at the workspace.
#[derive(Debug)]
pub struct WorkspaceDisk {
    pub workspace: PathBuf,
    /// The ext4 image, when there is one.
    pub image: Option<PathBuf>,
    pub backing: Backing,
    pub size_mb: u32,
    /// Why the preferred backing was not used, if it was not.
    pub fallback: Option<String>,
}

/// What holds the workspace's size.
#[derive(Debug)]
pub enum Disk {
    /// A filesystem of its own, of the limit's size.
    Quota(WorkspaceDisk),
    /// Only RLIMIT_FSIZE (the largest file), and why no more.
    FileSizeOnly { disk_mb: u32, why: String },
}

impl Disk {
    pub fn file_size_only(disk_mb: u32, why: impl Into<String>) -> Self {
        Disk::FileSizeOnly {
            disk_mb,
            why: why.into(),
        }
    }

    /// The `disk` control: what holds, measured by this agent.
    pub fn control(&self) -> Control {
        match self {
            Disk::Quota(d) => {
                let what = match &d.backing {
                    Backing::Ext4 { device } => format!(
                        "an ext4 filesystem of {} MB of its own (an image in the sandbox's \
                         directory on {})",
                        d.size_mb,
                        device.display()
                    ),
                    Backing::Tmpfs => format!(
                        "a tmpfs of {} MB (in memory: it counts against the sandbox's memory, \
                         and is lost if the agent restarts)",
                        d.size_mb
                    ),
                };
                let fallback = d
                    .fallback
                    .as_ref()
                    .map(|f| format!("; {f}"))
                    .unwrap_or_default();
                Control::enforced(format!(
                    "the workspace is {what}: writing past it fails with ENOSPC; no file \
                     larger than {} MB (RLIMIT_FSIZE){fallback}",
                    d.size_mb
                ))
            }
            Disk::FileSizeOnly { disk_mb, why } => Control::partial(format!(
                "RLIMIT_FSIZE only: no file larger than {disk_mb} MB, but the workspace as a \
                 whole is not capped by this sandbox ({why}); where the task's storage is its \
                 own (Fargate), that storage is the cap"
            )),
        }
    }

    pub fn is_quota(&self) -> bool {
        matches!(self, Disk::Quota(_))
    }

    /// Unmounts the disk and removes its image (the agent stops).
    pub fn release(self) -> std::io::Result<()> {
        match self {
            Disk::Quota(d) => d.release(),
            Disk::FileSizeOnly { .. } => Ok(()),
        }
    }
}

impl WorkspaceDisk {
    pub fn release(self) -> std::io::Result<()> {
        if let Err(e) = crate::sys::umount(&self.workspace, false) {
            if e.raw_os_error() != Some(libc::EBUSY) {
                return Err(e);
            }
            // Something still has a file open there: out of the tree now,
            // gone with its last user.
            crate::sys::umount(&self.workspace, true)?;
        }
        if let Some(image) = &self.image {
            match std::fs::remove_file(image) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }
}

/// A mount namespace of the calling thread's own, into which the host's
/// later mounts still propagate and from which nothing propagates out.
/// Only the calling thread moves (and the processes it starts).
pub fn private_mounts() -> std::io::Result<()> {
    crate::sys::unshare(libc::CLONE_NEWNS)?;
    crate::sys::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_SLAVE,
        None,
    )
}

/// Whether this agent already runs in a mount namespace of its own.
pub fn in_own_mounts() -> bool {
    std::env::var(OWN_MOUNTS_ENV).ok() == Some(std::process::id().to_string())
}

/// Moves the whole agent into a mount namespace of its own: the calling
/// thread makes one and executes the agent again from it, as it was
/// started (same pid, arguments and environment, plus
/// [`OWN_MOUNTS_ENV`]). A multi-threaded process cannot move its other
/// threads; the new image starts in the namespace with one thread. Returns
/// only when that could not be done, with the thread back where it was.
pub fn enter_own_mounts() -> Result<Infallible, String> {
    use std::os::unix::process::CommandExt;
    let before = std::fs::File::open("/proc/thread-self/ns/mnt")
        .map_err(|e| format!("/proc/thread-self/ns/mnt: {e}"))?;
    crate::sys::unshare(libc::CLONE_NEWNS)
        .map_err(|e| format!("a mount namespace of its own: {e}"))?;
    let go_back = |why: String| match crate::sys::setns(before.as_fd(), libc::CLONE_NEWNS) {
        Ok(()) => why,
        Err(e) => format!("{why} (and could not go back: {e})"),
    };
    if let Err(e) = crate::sys::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_SLAVE,
        None,
    ) {
        return Err(go_back(format!("making / a slave of the host's: {e}")));
    }
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let err = std::process::Command::new("/proc/self/exe")
        .arg0(argv0)
        .args(args)
        .env(OWN_MOUNTS_ENV, std::process::id().to_string())
        .exec();
    Err(go_back(format!(
        "executing the agent again in its own mount namespace: {err}"
    )))
}

/// Gives the workspace a disk of the limit's size (see the module), in the
/// calling thread's mount namespace; what is in the workspace already is
/// moved onto it. Where that cannot be done, says why.
pub fn setup(env: &SandboxEnv, prefer: Prefer) -> Disk {
    let disk_mb = env.limits.disk_mb;
    match try_setup(env, prefer) {
        Ok(d) => Disk::Quota(d),
        Err(why) => Disk::file_size_only(disk_mb, why),
    }
}

fn try_setup(env: &SandboxEnv, prefer: Prefer) -> Result<WorkspaceDisk, String> {
    let ws = env.workspace();
    env.prepare()
        .map_err(|e| format!("preparing the sandbox's directories: {e}"))?;
    if is_mount_point(&ws) {
        return Err(format!("{} is a mount point already", ws.display()));
    }
    let staging = env.root.join(STAGING);
    match std::fs::create_dir(&staging) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(format!("{}: {e}", staging.display()))
        }
        _ => {}
    }
    let mut fallback = None;
    // `fresh`: the image was made now (one a crashed agent left holds the
    // workspace, and is never removed here).
    let (backing, image, fresh) = match prefer {
        Prefer::Image => match mount_image(env, &staging) {
            Ok((device, image, fresh)) => (Backing::Ext4 { device }, Some(image), fresh),
            Err(e) => {
                fallback = Some(format!("no ext4 image ({e}), a tmpfs instead"));
                mount_tmpfs(env, &staging).map_err(|t| format!("{e}; tmpfs: {t}"))?;
                (Backing::Tmpfs, None, false)
            }
        },
        Prefer::Tmpfs => {
            mount_tmpfs(env, &staging).map_err(|e| format!("tmpfs: {e}"))?;
            (Backing::Tmpfs, None, false)
        }
    };
    let disk = WorkspaceDisk {
        workspace: ws.clone(),
        image,
        backing,
        size_mb: env.limits.disk_mb,
        fallback,
    };
    let undo = |disk: WorkspaceDisk, why: String| -> String {
        let _ = crate::sys::umount(&staging, true);
        let _ = std::fs::remove_dir(&staging);
        if let (Some(image), true) = (&disk.image, fresh) {
            let _ = std::fs::remove_file(image);
        }
        why
    };
    if let Err(e) = take_in(env, &staging) {
        return Err(undo(disk, e));
    }
    if let Err(e) = crate::sys::mount(Some(&staging), &ws, None, libc::MS_MOVE, None) {
        return Err(undo(disk, format!("moving the disk to the workspace: {e}")));
    }
    let _ = std::fs::remove_dir(&staging);
    Ok(disk)
}

/// A system program by its full path: the agent's environment may have
/// no PATH (the local data plane clears it), and mkfs lives in sbin.
fn tool(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

fn is_mount_point(path: &Path) -> bool {
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    match (dev(path), path.parent().and_then(dev)) {
        (Some(a), Some(b)) => a != b,
        _ => false,
    }
}

/// The sandbox's ext4 image (made now, or the one a crashed agent left)
/// mounted at `at`; the loop device, the image, and whether it is new.
fn mount_image(env: &SandboxEnv, at: &Path) -> Result<(PathBuf, PathBuf, bool), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let image = env.root.join(IMAGE);
    let fresh = !image.exists();
    if fresh {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&image)
            .map_err(|e| format!("{}: {e}", image.display()))?;
        // Sparse: the host's disk is used as the workspace fills.
        f.set_len(u64::from(env.limits.disk_mb) * MIB)
            .map_err(|e| format!("{}: {e}", image.display()))?;
        drop(f);
        let out = std::process::Command::new(tool("mkfs.ext4"))
            .args(["-q", "-F", "-m", "0", "-L", "armada-ws", "-E"])
            .arg(format!(
                "root_owner={}:{},lazy_itable_init=1,lazy_journal_init=1",
                env.uid, env.gid
            ))
            .arg(&image)
            .output();
        let made = match out {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(format!(
                "mkfs.ext4: {} {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => Err(format!("mkfs.ext4: {e}")),
        };
        if let Err(e) = made {
            let _ = std::fs::remove_file(&image);
            return Err(e);
        }
    }
    let mounted = attach_and_mount(&image, at);
    if mounted.is_err() && fresh {
        let _ = std::fs::remove_file(&image);
    }
    mounted.map(|device| (device, image, fresh))
}

fn attach_and_mount(image: &Path, at: &Path) -> Result<PathBuf, String> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|e| format!("{}: {e}", image.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", image.display()))?;
    // A crashed agent's calls may still hold the image on its device:
    // mounted again from that device, it is the same filesystem.
    if let Some(device) = crate::sys::loop_backing(meta.dev(), meta.ino()) {
        if crate::sys::mount(Some(&device), at, Some("ext4"), flags, None).is_ok() {
            return Ok(device);
        }
    }
    let (dev, device) =
        crate::sys::loop_attach(file.as_fd()).map_err(|e| format!("a loop device: {e}"))?;
    crate::sys::mount(Some(&device), at, Some("ext4"), flags, None)
        .map_err(|e| format!("mounting {}: {e}", device.display()))?;
    // The mount holds the device now; it detaches itself once unmounted.
    drop(dev);
    Ok(device)
}

fn mount_tmpfs(env: &SandboxEnv, at: &Path) -> std::io::Result<()> {
    crate::sys::mount(
        Some(Path::new("none")),
        at,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&format!(
            "size={}m,mode=700,uid={},gid={}",
            env.limits.disk_mb, env.uid, env.gid
        )),
    )
}

/// Makes the new disk (at `staging`) the workspace's: the sandbox's uid's,
/// 0700, with what the workspace held moved onto it (a copy that does not
/// fit fails the disk, and the workspace is left as it was).
fn take_in(env: &SandboxEnv, staging: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let at = |e: std::io::Error| format!("{}: {e}", staging.display());
    // mkfs's own directory; fsck makes one again if it ever needs it.
    let lost = staging.join("lost+found");
    if lost.is_dir() {
        let _ = std::fs::remove_dir(&lost);
    }
    crate::sys::chown(staging, env.uid, env.gid).map_err(at)?;
    std::fs::set_permissions(staging, std::fs::Permissions::from_mode(0o700)).map_err(at)?;
    let ws = env.workspace();
    let entries: Vec<PathBuf> = std::fs::read_dir(&ws)
        .map_err(|e| format!("{}: {e}", ws.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    if entries.is_empty() {
        return Ok(());
    }
    // cp -a: links stay links, owners and modes stay.
    let out = std::process::Command::new(tool("cp"))
        .arg("-a")
        .arg("--")
        .arg(ws.join("."))
        .arg(staging)
        .output()
        .map_err(|e| format!("cp: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the workspace's content does not fit on a disk of {} MB: {}",
            env.limits.disk_mb,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    for p in entries {
        let gone = match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p),
            Ok(_) => std::fs::remove_file(&p),
            Err(e) => Err(e),
        };
        gone.map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use armada_domain::sandbox::controls::Enforcement;

    #[test]
    fn the_control_says_what_holds() {
        let none = Disk::file_size_only(20, "unshare: Operation not permitted");
        let c = none.control();
        assert_eq!(c.status, Enforcement::Partial);
        assert!(c.reason.contains("RLIMIT_FSIZE only"), "{}", c.reason);
        assert!(c.reason.contains("20 MB"), "{}", c.reason);
        assert!(c.reason.contains("Operation not permitted"), "{}", c.reason);
        let quota = Disk::Quota(WorkspaceDisk {
            workspace: "/sandbox/workspace".into(),
            image: None,
            backing: Backing::Tmpfs,
            size_mb: 20,
            fallback: Some("no ext4 image (no loop device), a tmpfs instead".into()),
        });
        let c = quota.control();
        assert_eq!(c.status, Enforcement::Enforced);
        assert!(c.reason.contains("tmpfs of 20 MB"), "{}", c.reason);
        assert!(c.reason.contains("no loop device"), "{}", c.reason);
    }
}
