//! The call's mount namespace: a private /tmp, the denied paths covered,
//! and the declared mounts bound into their covers.

use std::path::{Path, PathBuf};

use super::{Bind, JailSpec};

/// Covers `path` with an empty filesystem in which only the declared
/// mounts appear, each bound from its descriptor; read-only ones are made
/// read-only, and so is the cover.
pub(super) fn cover_keeping(path: &Path, inner: &[&(&Bind, std::fs::File)]) -> std::io::Result<()> {
    use crate::sys::mount;
    use std::os::unix::io::AsRawFd;
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mount(
        Some(Path::new("none")),
        path,
        Some("tmpfs"),
        flags,
        Some("size=64k,mode=755"),
    )?;
    for (b, f) in inner {
        std::fs::create_dir_all(&b.path)?;
        let src = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
        mount(Some(&src), &b.path, None, libc::MS_BIND, None)?;
        if !b.writable {
            mount(
                None,
                &b.path,
                None,
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | flags,
                None,
            )?;
        }
    }
    mount(
        None,
        path,
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | flags,
        Some("size=64k,mode=755"),
    )
}

pub(super) fn mount_namespace(spec: &JailSpec) -> Result<String, String> {
    use crate::sys::mount;
    crate::sys::unshare(libc::CLONE_NEWNS).map_err(|e| format!("mount namespace: {e}"))?;
    // Nothing done here may show outside the call.
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
    .map_err(|e| format!("making / private: {e}"))?;
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
    let mut sources = Vec::new();
    for b in &spec.binds {
        let f =
            std::fs::File::open(&b.path).map_err(|e| format!("mount {}: {e}", b.path.display()))?;
        sources.push((b, f));
    }
    for path in &spec.hide {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue;
        };
        let inner: Vec<&(&Bind, std::fs::File)> = sources
            .iter()
            .filter(|(b, _)| b.path.starts_with(path) && b.path != *path)
            .collect();
        let covered = if !meta.is_dir() {
            mount(
                Some(Path::new("/dev/null")),
                path,
                None,
                libc::MS_BIND,
                None,
            )
        } else if inner.is_empty() {
            mount(
                Some(Path::new("none")),
                path,
                Some("tmpfs"),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                Some("size=4k,mode=000"),
            )
        } else {
            cover_keeping(path, &inner)
        };
        covered.map_err(|e| format!("covering {}: {e}", path.display()))?;
        done.push(format!("hid {}", path.display()));
        for (b, _) in inner {
            done.push(format!(
                "mounted {} {}",
                b.path.display(),
                if b.writable { "rw" } else { "ro" }
            ));
        }
    }
    Ok(done.join(", "))
}
