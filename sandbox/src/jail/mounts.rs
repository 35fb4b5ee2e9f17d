//! The call's mount namespace: a private /tmp, the denied paths covered,
//! the declared mounts bound into their covers, and a procfs of its own.
//!
//! A declared mount lies in the user's data, which calls write: its
//! source is opened beneath the data root and its mount point made beneath
//! the cover, neither following a symbolic link ([`super::beneath`]), and
//! both are handed to mount(2) as descriptors, never as names.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use super::beneath::{self, fd_path, open_beneath, OpenError, StepError};
use super::{Bind, JailSpec, OverlayLayers};

/// A declared mount's source, opened before anything is covered.
pub(super) struct Source<'a> {
    bind: &'a Bind,
    file: File,
    is_dir: bool,
}

/// Covers `path` with an empty filesystem in which only the declared
/// mounts appear, each bound from its descriptor; read-only ones are made
/// read-only, and so is the cover.
fn cover_keeping(path: &Path, inner: &[&Source<'_>]) -> Result<(), StepError> {
    use crate::sys::mount;
    let at = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mount(
        Some(Path::new("none")),
        path,
        Some("tmpfs"),
        flags,
        Some("size=64k,mode=755"),
    )
    .map_err(|e| at("tmpfs", e))?;
    // The cover just mounted: a host path, and nothing in it but what is
    // made here.
    let cover = File::from(crate::sys::open_path(path).map_err(|e| at("cover", e))?);
    for s in inner {
        let b = s.bind;
        let what = b.path.display().to_string();
        let rest = b
            .path
            .strip_prefix(path)
            .map_err(|e| format!("{what}: {e}"))?;
        // Beneath an earlier declared mount, the way runs through the
        // user's data again: held to the same rule as the sources.
        let mp =
            beneath::mount_point(&cover, rest, s.is_dir).map_err(|e| {
                match beneath::judge(&b.path, path, e) {
                    OpenError::Unsafe(why) => StepError::Unsafe(why),
                    OpenError::Io(e) => StepError::Failed(at(&what, e)),
                }
            })?;
        mount(
            Some(&fd_path(&s.file)),
            &fd_path(&mp.point),
            None,
            libc::MS_BIND,
            None,
        )
        .map_err(|e| at(&what, e))?;
        if !b.writable {
            // The point's descriptor is the directory beneath the new
            // mount: looked up again, the name is the mount's root.
            let top = open_beneath(mp.parent.as_fd(), &mp.name).map_err(|e| at(&what, e))?;
            mount(
                None,
                &fd_path(&top),
                None,
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | flags,
                None,
            )
            .map_err(|e| at(&what, e))?;
        }
    }
    mount(
        None,
        path,
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | flags,
        Some("size=64k,mode=755"),
    )
    .map_err(|e| at("read-only cover", e))?;
    Ok(())
}

/// What the call's mount namespace holds, and how its overlay went (when
/// it was to have one).
pub(super) struct Mounted {
    pub detail: String,
    pub overlay: Option<Result<String, String>>,
}

/// An overlay over `over` whose changes go to `layers`: made first, before
/// anything is covered, so its layers are reached as the agent made them.
fn overlay(layers: &OverlayLayers, over: &Path) -> Result<String, String> {
    let names = [over, &layers.upper, &layers.work];
    // overlayfs's options are a comma-separated list of colon-separated
    // paths: a path with either cannot be named in it.
    if let Some(bad) = names
        .iter()
        .find(|p| p.to_str().is_none_or(|s| s.contains([',', ':', '\\'])))
    {
        return Err(format!("{} cannot be named to overlayfs", bad.display()));
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={},redirect_dir=off,index=off,metacopy=off",
        over.display(),
        layers.upper.display(),
        layers.work.display()
    );
    crate::sys::mount(
        Some(Path::new("overlay")),
        over,
        Some("overlay"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&options),
    )
    .map_err(|e| format!("overlay over {}: {e}", over.display()))?;
    Ok("the workspace is an overlay: the call's changes are judged before they are kept".into())
}

pub(super) fn mount_namespace(spec: &JailSpec) -> Result<Mounted, StepError> {
    use crate::sys::mount;
    crate::sys::unshare(libc::CLONE_NEWNS).map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) => StepError::NoNamespaces(format!("mount namespace: {e}")),
        _ => StepError::Failed(format!("mount namespace: {e}")),
    })?;
    // Nothing done here may show outside the call.
    crate::sys::make_mounts_private().map_err(|e| format!("making / private: {e}"))?;
    let overlay = spec.effects.as_ref().map(|l| overlay(l, &spec.cwd));
    let mut done = Vec::new();
    if let Some(tmp) = &spec.private_tmp {
        mount(
            Some(tmp),
            Path::new("/tmp"),
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )
        .map_err(|e| format!("private /tmp: {e}"))?;
        done.push("private /tmp".to_string());
    }
    // Declared mounts are reached through descriptors opened before
    // anything is covered, then bound back at their own paths.
    let roots = beneath::roots(spec);
    let mut sources = Vec::new();
    for b in &spec.binds {
        let file = match beneath::open(&b.path, &roots) {
            Ok(f) => f,
            Err(OpenError::Unsafe(why)) => return Err(StepError::Unsafe(why)),
            Err(OpenError::Io(e)) => return Err(format!("mount {}: {e}", b.path.display()).into()),
        };
        let is_dir = file
            .metadata()
            .map_err(|e| format!("mount {}: {e}", b.path.display()))?
            .is_dir();
        sources.push(Source {
            bind: b,
            file,
            is_dir,
        });
    }
    for path in &spec.hide {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue;
        };
        let inner: Vec<&Source<'_>> = sources
            .iter()
            .filter(|s| s.bind.path.starts_with(path) && s.bind.path != *path)
            .collect();
        let covered = if !meta.is_dir() || inner.is_empty() {
            crate::sys::cover(path, meta.is_dir()).map_err(|e| StepError::Failed(e.to_string()))
        } else {
            cover_keeping(path, &inner)
        };
        covered.map_err(|e| match e {
            StepError::Failed(e) => StepError::Failed(format!("covering {}: {e}", path.display())),
            other => other,
        })?;
        done.push(format!("hid {}", path.display()));
        for s in inner {
            done.push(format!(
                "mounted {} {}",
                s.bind.path.display(),
                if s.bind.writable { "rw" } else { "ro" }
            ));
        }
    }
    Ok(Mounted {
        detail: done.join(", "),
        overlay,
    })
}

/// Why the call keeps the host's /proc.
pub(super) enum ProcError {
    /// The kernel cannot give a procfs options of its own.
    Unsupported(String),
    Failed(String),
}

/// The first kernel whose procfs mounts each have options of their own
/// (and `hidepid=invisible`). Before it every procfs of a pid namespace
/// shares one superblock: `hidepid` given here would change the host's
/// /proc too, so it is not tried.
const PER_INSTANCE_PROC: (u32, u32) = (5, 8);

/// Mounts a procfs of the call's own over /proc, in the call's mount
/// namespace, with `hidepid=invisible`: a process the caller may not
/// ptrace is neither listed nor reachable, so once the jail has dropped
/// to the sandbox's uid the call sees its own processes only (not the
/// agent's, not root's, not another sandbox's). `/proc/self` and the
/// files that are not a process's (`/proc/meminfo`...) stay as they are.
pub(super) fn own_proc() -> Result<String, ProcError> {
    let (release, version) = crate::sys::kernel_release();
    match version {
        Some(v) if v >= PER_INSTANCE_PROC => {}
        _ => {
            return Err(ProcError::Unsupported(format!(
                "/proc is the host's: Linux {release} is older than {}.{}, whose procfs \
                 options are shared with the host's /proc (every process is listed)",
                PER_INSTANCE_PROC.0, PER_INSTANCE_PROC.1
            )))
        }
    }
    crate::sys::mount(
        Some(Path::new("proc")),
        Path::new("/proc"),
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some("hidepid=invisible"),
    )
    .map_err(|e| ProcError::Failed(format!("own /proc (hidepid=invisible): {e}")))?;
    Ok("own /proc (hidepid=invisible): the call lists and reaches its own processes only".into())
}
