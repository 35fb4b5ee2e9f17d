//! Paths inside trees the sandbox's own calls write (the workspace, the
//! user data under the data root), opened without trusting what is there.
//!
//! A call may turn any directory of such a tree into a symbolic link (to
//! `/`, say) before the next call is confined. Followed, that link would
//! bind `/` where a declared mount belongs and hang a Landlock rule on `/`.
//! So each path the jail confines with (a declared mount's source and
//! mount point, a Landlock rule's path) that lies beneath one of those
//! roots is opened from the root, without following any link: `openat2`
//! with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or one O_NOFOLLOW component
//! at a time where openat2 is missing. A link on the way refuses the call.
//! The roots themselves, and every path outside them, are host paths the
//! operator chose, opened as named.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Component, Path, PathBuf};

use super::JailSpec;

/// A confinement step that could not be done.
#[derive(Debug)]
pub(super) enum StepError {
    /// It failed: the call is refused if the spec requires the step.
    Failed(String),
    /// The spec's paths were tampered with (a link where a directory was
    /// declared): the call is refused whatever the spec requires.
    Unsafe(String),
    /// The task may not make namespaces (no CAP_SYS_ADMIN, as on Fargate):
    /// the call is confined per task instead ([`super::pertask`]).
    NoNamespaces(String),
}

impl From<String> for StepError {
    fn from(s: String) -> Self {
        StepError::Failed(s)
    }
}

/// Why a path was not opened.
#[derive(Debug)]
pub(super) enum OpenError {
    /// It does not exist, or could not be reached.
    Io(io::Error),
    /// A component is a symbolic link, or the path would leave its root.
    Unsafe(String),
}

/// The trees a call may shape: the workspace, and the covered paths (the
/// data root, beneath which every declared mount lies, among them).
pub(super) fn roots(spec: &JailSpec) -> Vec<PathBuf> {
    std::iter::once(spec.cwd.clone())
        .chain(spec.hide.iter().cloned())
        .collect()
}

/// The outermost of `roots` strictly above `path`, and `path` below it.
fn root_of<'a>(path: &'a Path, roots: &'a [PathBuf]) -> Option<(&'a Path, &'a Path)> {
    roots
        .iter()
        .filter_map(|r| {
            let rest = path.strip_prefix(r).ok()?;
            (!rest.as_os_str().is_empty()).then_some((r.as_path(), rest))
        })
        .min_by_key(|(r, _)| r.components().count())
}

/// An O_PATH descriptor of `path`: resolved from its root without
/// following a link when it lies beneath one of `roots`, as named
/// otherwise.
pub(super) fn open(path: &Path, roots: &[PathBuf]) -> Result<File, OpenError> {
    let Some((root, rest)) = root_of(path, roots) else {
        return crate::sys::open_path(path)
            .map(File::from)
            .map_err(OpenError::Io);
    };
    let dir = crate::sys::open_path(root).map_err(OpenError::Io)?;
    open_beneath(dir.as_fd(), rest).map_err(|e| judge(path, root, e))
}

/// Refusals are told apart from paths that are simply not there.
pub(super) fn judge(path: &Path, root: &Path, e: io::Error) -> OpenError {
    match e.raw_os_error() {
        Some(libc::ELOOP) => OpenError::Unsafe(format!(
            "{} is, or passes through, a symbolic link beneath {}: refused, not followed",
            path.display(),
            root.display()
        )),
        Some(libc::EXDEV) => OpenError::Unsafe(format!(
            "{} is not a plain path beneath {}: refused",
            path.display(),
            root.display()
        )),
        _ => OpenError::Io(e),
    }
}

/// The components of `rest`, all plain names (no `..`, no root): EXDEV
/// otherwise, as openat2 answers a path leaving its root.
fn names(rest: &Path) -> io::Result<Vec<&OsStr>> {
    rest.components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(io::Error::from_raw_os_error(libc::EXDEV)),
        })
        .collect()
}

/// Opens `rest` (O_PATH) beneath `dir`, following no symbolic link:
/// ELOOP if a component is one.
pub(super) fn open_beneath(dir: BorrowedFd<'_>, rest: &Path) -> io::Result<File> {
    names(rest)?;
    const RESOLVE: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
    match crate::sys::openat2(dir, rest, libc::O_PATH, 0, RESOLVE) {
        Ok(fd) => Ok(File::from(fd)),
        // Kernels before 5.6, or a container runtime's filter that does
        // not know openat2.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
            walk_beneath(dir, rest)
        }
        Err(e) => Err(e),
    }
}

/// [`open_beneath`] one component at a time, each opened O_NOFOLLOW from
/// the one before and refused when it is a link.
pub(super) fn walk_beneath(dir: BorrowedFd<'_>, rest: &Path) -> io::Result<File> {
    let mut cur: Option<File> = None;
    for name in names(rest)? {
        let at = cur.as_ref().map_or(dir, |f| f.as_fd());
        let next = File::from(crate::sys::openat(
            at,
            Path::new(name),
            libc::O_PATH | libc::O_NOFOLLOW,
            0,
        )?);
        if next.metadata()?.file_type().is_symlink() {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        cur = Some(next);
    }
    cur.ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A mount point made beneath a cover: the parent directory, the last
/// name, and the point itself.
pub(super) struct MountPoint {
    pub parent: File,
    pub name: PathBuf,
    pub point: File,
}

/// Opens `rest` beneath `dir`, creating what is missing (directories, and
/// an empty file last when the mount is of a file), following no link.
pub(super) fn mount_point(dir: &File, rest: &Path, is_dir: bool) -> io::Result<MountPoint> {
    let names = names(rest)?;
    let mut parent = dir.try_clone()?;
    for (i, name) in names.iter().enumerate() {
        let last = i + 1 == names.len();
        let name = Path::new(name);
        let next = match open_beneath(parent.as_fd(), name) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let made = if last && !is_dir {
                    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW;
                    crate::sys::openat(parent.as_fd(), name, flags, 0o644).map(drop)
                } else {
                    crate::sys::mkdirat(parent.as_fd(), name, 0o755)
                };
                match made {
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                    _ => open_beneath(parent.as_fd(), name)?,
                }
            }
            other => other?,
        };
        if last {
            return Ok(MountPoint {
                parent,
                name: name.to_path_buf(),
                point: next,
            });
        }
        parent = next;
    }
    Err(io::Error::from_raw_os_error(libc::EINVAL))
}

/// The path through which mount(2) reaches what `fd` is open on.
pub(super) fn fd_path(fd: &impl std::os::fd::AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::OwnedFd;

    fn cwd_fd(dir: &Path) -> OwnedFd {
        crate::sys::open_path(dir).unwrap_or_else(|e| panic!("{e}"))
    }

    fn tree() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "armada-beneath-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("root/a/b")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(d.join("root/a/b/f"), "x").unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(d.join("outside")).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink("/", d.join("root/a/to_root")).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink("b", d.join("root/a/to_b")).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(d.join("outside"), d.join("root/out"))
            .unwrap_or_else(|e| panic!("{e}"));
        d
    }

    fn errno(r: io::Result<File>) -> Option<i32> {
        r.err().and_then(|e| e.raw_os_error())
    }

    #[test]
    fn links_are_refused_on_the_way_and_at_the_end_by_both_ways_of_opening() {
        let d = tree();
        let root = cwd_fd(&d.join("root"));
        for open in [open_beneath, walk_beneath] {
            assert!(open(root.as_fd(), Path::new("a/b/f")).is_ok());
            assert!(open(root.as_fd(), Path::new("a/b")).is_ok());
            for linked in ["a/to_root", "a/to_root/etc", "a/to_b/f", "out", "out/x"] {
                assert_eq!(
                    errno(open(root.as_fd(), Path::new(linked))),
                    Some(libc::ELOOP),
                    "{linked}"
                );
            }
            assert_eq!(
                errno(open(root.as_fd(), Path::new("a/../../outside"))),
                Some(libc::EXDEV)
            );
            assert_eq!(
                errno(open(root.as_fd(), Path::new("a/missing"))),
                Some(libc::ENOENT)
            );
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_paths_strictly_beneath_a_root_are_held_to_it() {
        let d = tree();
        let roots = vec![d.join("root"), d.join("root/a")];
        // Beneath the outermost root: the link is refused.
        let refused = open(&d.join("root/a/to_b/f"), &roots);
        assert!(matches!(refused, Err(OpenError::Unsafe(ref m)) if m.contains("symbolic link")));
        assert!(open(&d.join("root/a/b/f"), &roots).is_ok());
        // A root itself, and a path outside every root, are host paths.
        let outside = vec![d.join("root/a/to_b")];
        assert!(open(&d.join("root/a/to_b"), &outside).is_ok());
        assert!(open(&d.join("root/a/to_b/f"), &[]).is_ok());
        assert!(matches!(
            open(&d.join("root/nope"), &roots),
            Err(OpenError::Io(_))
        ));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn mount_points_are_made_without_following_links() {
        let d = tree();
        let root = File::from(cwd_fd(&d.join("root")));
        let mp = mount_point(&root, Path::new("a/new/dir"), true).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(mp.name, Path::new("dir"));
        assert!(d.join("root/a/new/dir").is_dir());
        mount_point(&root, Path::new("a/new/file"), false).unwrap_or_else(|e| panic!("{e}"));
        assert!(d.join("root/a/new/file").is_file());
        let through = mount_point(&root, Path::new("out/made"), true);
        assert_eq!(
            through.err().and_then(|e| e.raw_os_error()),
            Some(libc::ELOOP)
        );
        assert!(!d.join("outside/made").exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
