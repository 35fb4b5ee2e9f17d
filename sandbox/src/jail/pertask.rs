//! A call in a task that cannot make namespaces (Fargate: no
//! CAP_SYS_ADMIN). What the call's mount namespace did is done otherwise:
//!
//! - its private /tmp becomes its Run's scratch directory (`$TMPDIR`), and
//!   Landlock grants that instead of /tmp;
//! - a denied path is left out of the Landlock rules: a rule over a
//!   directory that holds one becomes rules over the entries beside the way
//!   to it (so those directories are traversable, not listable), and a
//!   rule inside one is dropped. A denied path the call's uid cannot reach
//!   anyway (neither owner nor group, no access for others, here or on the
//!   way) needs nothing;
//! - declared mounts cannot be made: the call is refused.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::FsRules;

/// Whether `path` (or a directory on the way to it) keeps uid/gid out by
/// its permissions alone.
pub(super) fn closed_to(path: &Path, uid: u32, gid: u32) -> bool {
    let theirs = |m: &std::fs::Metadata| m.uid() != uid && m.gid() != gid;
    if let Ok(m) = std::fs::metadata(path) {
        let others = m.mode() & 0o007;
        let closed = if m.is_dir() {
            others & 0o005 == 0
        } else {
            others & 0o006 == 0
        };
        if theirs(&m) && closed {
            return true;
        }
    }
    path.ancestors().skip(1).any(|a| {
        std::fs::metadata(a).is_ok_and(|m| theirs(&m) && m.is_dir() && m.mode() & 0o001 == 0)
    })
}

/// The Landlock rules of `fs` without a mount namespace: `/tmp` is
/// `scratch`, and nothing of `hidden` is granted.
pub(super) fn rules(fs: &FsRules, hidden: &[PathBuf], scratch: Option<&Path>) -> FsRules {
    let hidden: Vec<PathBuf> = hidden
        .iter()
        .map(|h| std::fs::canonicalize(h).unwrap_or_else(|_| h.clone()))
        .collect();
    let tmp = |p: &PathBuf| match scratch {
        Some(s) if p == Path::new("/tmp") => s.to_path_buf(),
        _ => p.clone(),
    };
    let mut read: Vec<PathBuf> = Vec::new();
    let mut write: Vec<PathBuf> = Vec::new();
    let roots = fs
        .read_all
        .then(|| PathBuf::from("/"))
        .into_iter()
        .chain(fs.read.iter().map(tmp));
    for p in roots {
        around(&p, &hidden, &mut read);
    }
    for p in fs.write.iter().map(tmp) {
        around(&p, &hidden, &mut write);
    }
    FsRules {
        read_all: false,
        read,
        write,
        keep: fs.keep.iter().map(tmp).collect(),
    }
}

/// `p` itself, or, when a hidden path lies beneath it, what lies beside
/// the way to it; nothing when `p` is hidden or beneath a hidden path.
pub(super) fn around(p: &Path, hidden: &[PathBuf], out: &mut Vec<PathBuf>) {
    if hidden.iter().any(|h| p.starts_with(h)) {
        return;
    }
    if !hidden.iter().any(|h| h.starts_with(p)) {
        out.push(p.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(p) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if is_dir || !hidden.iter().any(|h| h.starts_with(&path)) {
            around(&path, hidden, out);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_hidden_path_is_left_out_of_the_rules_and_tmp_is_the_scratch() {
        let base = std::env::temp_dir().join(format!("armada-pertask-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        for d in ["a/secret/inner", "a/open", "b"] {
            std::fs::create_dir_all(base.join(d)).unwrap();
        }
        std::fs::write(base.join("a/file"), "x").unwrap();
        let fs = FsRules {
            read_all: false,
            read: vec![base.clone(), base.join("a/secret/inner")],
            write: vec![PathBuf::from("/tmp"), base.join("b")],
            keep: vec![],
        };
        let scratch = base.join("b/scratch");
        let r = rules(&fs, &[base.join("a/secret")], Some(&scratch));
        let mut read = r.read.clone();
        read.sort();
        assert_eq!(
            read,
            vec![base.join("a/file"), base.join("a/open"), base.join("b")]
        );
        assert_eq!(r.write, vec![scratch, base.join("b")]);
        assert!(!r.read_all);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn permissions_alone_can_close_a_path() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("armada-closed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("closed/inner")).unwrap();
        std::fs::create_dir_all(base.join("open")).unwrap();
        let mode = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
        mode(&base, 0o755).unwrap();
        mode(&base.join("closed"), 0o700).unwrap();
        mode(&base.join("open"), 0o755).unwrap();
        let me = std::fs::metadata(&base).unwrap();
        let (uid, gid) = (me.uid() + 12_345, me.gid() + 12_345);
        assert!(closed_to(&base.join("closed"), uid, gid));
        assert!(closed_to(&base.join("closed/inner"), uid, gid));
        assert!(!closed_to(&base.join("open"), uid, gid));
        // Its owner is not kept out.
        assert!(!closed_to(&base.join("closed"), me.uid(), me.gid()));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
