//! Destructive work judged by what it does, not by its words.
//!
//! No list of command words can tell whether a call deletes (`bash -c "rm
//! -rf build"`, `find -exec rm`, `shutil.rmtree`, `echo x > existing`). So
//! an unapproved call of an agent that gates destructive work runs against
//! a copy-on-write view of the workspace: an overlay whose lower layer is
//! the workspace and whose upper layer, in the sandbox's own directory
//! (root's, 0700: no call reaches it but through the overlay), takes every
//! change. After the call the agent reads the upper layer ([`judge`]):
//!
//! - a call that only creates files (or appends to one, or writes a file
//!   with what it held) has its changes applied to the workspace ([`apply`], done by a
//!   jail process as the sandbox's uid, confined like a call) and goes
//!   through;
//! - a call that deletes, truncates, renames over or rewrites an existing
//!   file has its changes held ([`Held`]) and the Run waits for an approval
//!   that lists them; approved, the held changes are applied and the call's
//!   answer is the one it gave; rejected, they are discarded (held changes
//!   older than the longest approval are removed by [`prune`]).
//!
//! Where the jail cannot mount (Fargate), unapproved calls run instead with
//! Landlock denying the removal and truncation of files in the workspace
//! (`FsRules::keep`), and a call that fails so asks for an approval.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The overlay's attribute on a directory that hides the lower one of its
/// name (it was deleted and made again).
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";
/// Entries a deleted directory is counted to, at most.
const COUNT_LIMIT: u64 = 100_000;
/// Effects named in an approval's reason, at most.
const LISTED: usize = 20;
/// Held changes older than this are discarded (the longest an approval
/// waits: `approvals.expires_s` is at most seven days).
pub const HOLD_FOR_S: u64 = 7 * 86_400;

/// A change to what the workspace held before the call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Effect {
    /// A file, link or directory deleted (a directory with what it held).
    Deleted {
        path: PathBuf,
        files: u64,
        bytes: u64,
    },
    /// A file rewritten, truncated, or replaced by something else.
    Changed {
        path: PathBuf,
        before: u64,
        after: u64,
    },
    /// A directory deleted and made again: what it held is gone.
    Replaced {
        path: PathBuf,
        files: u64,
        bytes: u64,
    },
}

/// What a call changed in the workspace: paths relative to it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeSet {
    /// Removed from the workspace first (deleted, or replaced as a whole).
    pub removed: Vec<PathBuf>,
    /// Then copied from the upper layer, each directory before what it holds.
    pub entries: Vec<PathBuf>,
    /// What of it changes what was there: empty for a call that only adds.
    pub effects: Vec<Effect>,
}

impl ChangeSet {
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.entries.is_empty()
    }

    pub fn destructive(&self) -> bool {
        !self.effects.is_empty()
    }

    /// What an approver reads: the effects, each path with its control
    /// characters escaped, the first [`LISTED`] of them.
    pub fn describe(&self) -> String {
        let shown: Vec<String> = self.effects.iter().take(LISTED).map(describe).collect();
        let more = self.effects.len().saturating_sub(LISTED);
        let mut text = shown.join("; ");
        if more > 0 {
            text.push_str(&format!("; and {more} more"));
        }
        text
    }
}

fn describe(e: &Effect) -> String {
    let p = |p: &Path| {
        let s: String = p
            .display()
            .to_string()
            .chars()
            .flat_map(|c| {
                if c.is_control() {
                    c.escape_default().collect::<Vec<_>>()
                } else {
                    vec![c]
                }
            })
            .collect();
        s
    };
    match e {
        Effect::Deleted { path, files, bytes } if *files > 1 => {
            format!("deletes {} ({files} files, {bytes} bytes)", p(path))
        }
        Effect::Deleted { path, bytes, .. } => format!("deletes {} ({bytes} bytes)", p(path)),
        Effect::Changed {
            path,
            before,
            after,
        } => format!("changes {} ({before} → {after} bytes)", p(path)),
        Effect::Replaced { path, files, bytes } => format!(
            "replaces directory {} (its {files} files, {bytes} bytes, are deleted)",
            p(path)
        ),
    }
}

/// Files and bytes beneath `path` (itself, when not a directory), not
/// following links, counted to [`COUNT_LIMIT`] entries.
fn measure(path: &Path) -> (u64, u64) {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return (0, 0);
    };
    if !m.is_dir() {
        return (1, m.len());
    }
    let (mut files, mut bytes, mut seen) = (0u64, 0u64, 0u64);
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > COUNT_LIMIT {
                return (files, bytes);
            }
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => {
                    files += 1;
                    bytes += m.len();
                }
                Err(_) => {}
            }
        }
    }
    (files, bytes)
}

/// Whether regular file `new` keeps all that `old` held: the same mode,
/// and `old`'s bytes at its start (unchanged, or appended to: nothing of
/// what was there is lost).
fn kept(new: &Path, nm: &std::fs::Metadata, old: &Path, om: &std::fs::Metadata) -> bool {
    if nm.len() < om.len() || nm.mode() != om.mode() {
        return false;
    }
    match (std::fs::read(new), std::fs::read(old)) {
        (Ok(n), Ok(o)) => n.starts_with(&o),
        _ => false,
    }
}

fn is_whiteout(m: &std::fs::Metadata) -> bool {
    m.file_type().is_char_device() && m.rdev() == 0
}

/// Reads the upper layer `upper` of a call's overlay over `lower` (the
/// workspace): what it changed, and what of that changes what was there.
/// Run by the agent as root (the overlay's own attributes are root's to
/// read); nothing is followed through a link, on either side.
pub fn judge(upper: &Path, lower: &Path) -> io::Result<ChangeSet> {
    let mut set = ChangeSet::default();
    walk(upper, lower, Path::new(""), true, &mut set)?;
    Ok(set)
}

fn walk(
    upper: &Path,
    lower: &Path,
    rel: &Path,
    lower_here: bool,
    set: &mut ChangeSet,
) -> io::Result<()> {
    let mut names: Vec<_> = std::fs::read_dir(upper.join(rel))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    for name in names {
        let r = rel.join(&name);
        let m = std::fs::symlink_metadata(upper.join(&r))?;
        let before = if lower_here {
            std::fs::symlink_metadata(lower.join(&r)).ok()
        } else {
            None
        };
        if is_whiteout(&m) {
            if before.is_some() {
                let (files, bytes) = measure(&lower.join(&r));
                set.effects.push(Effect::Deleted {
                    path: r.clone(),
                    files,
                    bytes,
                });
                set.removed.push(r);
            }
            continue;
        }
        if m.is_dir() {
            let opaque = crate::sys::lgetxattr(&upper.join(&r), OPAQUE_XATTR).as_deref()
                == Some(b"y".as_slice());
            let lower_dir = before.as_ref().is_some_and(|b| b.is_dir());
            match &before {
                Some(b) if b.is_dir() && opaque => {
                    let (files, bytes) = measure(&lower.join(&r));
                    if files > 0 || bytes > 0 {
                        set.effects.push(Effect::Replaced {
                            path: r.clone(),
                            files,
                            bytes,
                        });
                    }
                    set.removed.push(r.clone());
                }
                Some(b) if !b.is_dir() => {
                    set.effects.push(Effect::Changed {
                        path: r.clone(),
                        before: b.len(),
                        after: 0,
                    });
                    set.removed.push(r.clone());
                }
                _ => {}
            }
            set.entries.push(r.clone());
            walk(upper, lower, &r, lower_dir && !opaque, set)?;
            continue;
        }
        if let Some(b) = &before {
            let same = m.is_file() && b.is_file() && kept(&upper.join(&r), &m, &lower.join(&r), b);
            if !same {
                let (_, was) = measure(&lower.join(&r));
                set.effects.push(Effect::Changed {
                    path: r.clone(),
                    before: was,
                    after: m.len(),
                });
                if b.is_dir() {
                    set.removed.push(r.clone());
                }
            }
        }
        set.entries.push(r);
    }
    Ok(())
}

/// Removes `path` whatever it is (a directory with what it holds); one
/// that is not there is fine.
fn remove_any(path: &Path) -> io::Result<()> {
    let r = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Applies `changes` read from `source` (an upper layer, or held changes)
/// to `target` (the workspace). Run in a jail as the sandbox's uid: links
/// are recreated, never followed on the source side, and whatever a link
/// in the workspace leads to is what that uid may reach anyway.
pub fn apply(source: &Path, target: &Path, changes: &ChangeSet) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for r in &changes.removed {
        remove_any(&target.join(r))?;
    }
    let mut made: BTreeSet<PathBuf> = BTreeSet::new();
    for r in &changes.entries {
        let (src, dst) = (source.join(r), target.join(r));
        let m = std::fs::symlink_metadata(&src)?;
        let at = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", r.display()));
        if m.is_dir() {
            match std::fs::symlink_metadata(&dst) {
                Ok(d) if d.is_dir() => {}
                Ok(_) => {
                    std::fs::remove_file(&dst).map_err(at)?;
                    std::fs::create_dir(&dst).map_err(at)?;
                }
                Err(_) => std::fs::create_dir(&dst).map_err(at)?,
            }
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(m.mode() & 0o7777))
                .map_err(at)?;
            made.insert(r.clone());
            continue;
        }
        remove_any(&dst).map_err(at)?;
        if m.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).map_err(at)?, &dst).map_err(at)?;
        } else if m.is_file() {
            std::fs::copy(&src, &dst).map_err(at)?;
        }
        // Sockets, fifos and devices a call made are not kept.
    }
    Ok(())
}

/// A call's overlay layers, made in the sandbox's `effects` directory.
#[derive(Debug)]
pub struct Layers {
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
}

/// The sandbox's directory of layers and held changes: root's, 0700.
pub fn effects_dir(root: &Path) -> PathBuf {
    root.join("effects")
}

fn private_dir(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::create_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
}

impl Layers {
    /// Fresh layers for call `name`; the upper layer's root looks like
    /// the workspace's (its owner and mode), which the overlay shows.
    pub fn make(root: &Path, workspace: &Path, name: &str) -> io::Result<Layers> {
        use std::os::unix::fs::PermissionsExt;
        let base = effects_dir(root);
        private_dir(&base)?;
        let dir = base.join(name);
        let _ = remove_any(&dir);
        private_dir(&dir)?;
        let (upper, work) = (dir.join("upper"), dir.join("work"));
        std::fs::create_dir(&upper)?;
        std::fs::create_dir(&work)?;
        let ws = std::fs::metadata(workspace)?;
        std::os::unix::fs::chown(&upper, Some(ws.uid()), Some(ws.gid()))?;
        std::fs::set_permissions(&upper, std::fs::Permissions::from_mode(ws.mode() & 0o7777))?;
        Ok(Layers { dir, upper, work })
    }

    pub fn discard(self) {
        let _ = remove_any(&self.dir);
    }

    /// Keeps the changes for an approval of call `key`: the upper layer
    /// moves to `held/<key>`, with what the call answered.
    pub fn hold(self, key: &str, changes: &ChangeSet, answer: &Value) -> io::Result<Held> {
        let held = Held::dir(self.dir.parent().unwrap_or(&self.dir), key);
        private_dir(held.parent().unwrap_or(&held))?;
        let _ = remove_any(&held);
        private_dir(&held)?;
        std::fs::rename(&self.upper, held.join("upper"))?;
        let record = HeldRecord {
            changes: changes.clone(),
            answer: answer.clone(),
            held_at_s: now_s(),
        };
        std::fs::write(held.join("held.json"), serde_json::to_vec(&record)?)?;
        self.discard();
        Ok(Held { dir: held, record })
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeldRecord {
    pub changes: ChangeSet,
    /// What the call answered when it ran.
    pub answer: Value,
    pub held_at_s: u64,
}

/// The held changes of one call, waiting for its approval.
#[derive(Debug)]
pub struct Held {
    pub dir: PathBuf,
    pub record: HeldRecord,
}

impl Held {
    fn dir(effects: &Path, key: &str) -> PathBuf {
        effects.join("held").join(key)
    }

    /// The changes held for call `key`, if any (a sandbox restarted from
    /// a snapshot has none: the approved call then runs again).
    pub fn find(root: &Path, key: &str) -> Option<Held> {
        let dir = Self::dir(&effects_dir(root), key);
        let text = std::fs::read(dir.join("held.json")).ok()?;
        let record = serde_json::from_slice(&text).ok()?;
        Some(Held { dir, record })
    }

    pub fn upper(&self) -> PathBuf {
        self.dir.join("upper")
    }

    pub fn discard(self) {
        let _ = remove_any(&self.dir);
    }
}

/// The key of a call's held changes: one path component.
pub fn held_key(run_id: &str, call_id: &str) -> String {
    use std::hash::{Hash, Hasher};
    // The ids made safe as a name may collide (a model names its calls):
    // a hash of the raw ids tells them apart.
    let mut h = std::hash::DefaultHasher::new();
    (run_id, call_id).hash(&mut h);
    let short = |s: &str| {
        crate::component::sanitize(s)
            .chars()
            .take(64)
            .collect::<String>()
    };
    format!("{}--{}--{:016x}", short(run_id), short(call_id), h.finish())
}

/// Discards held changes older than [`HOLD_FOR_S`] (their approval was
/// rejected, or expired) and the layers of calls that ended without their
/// agent (a crash): called before a call's layers are made, and an agent
/// runs one call at a time.
pub fn prune(root: &Path) {
    let base = effects_dir(root);
    if let Ok(entries) = std::fs::read_dir(base.join("held")) {
        for e in entries.flatten() {
            let old = std::fs::read(e.path().join("held.json"))
                .ok()
                .and_then(|t| serde_json::from_slice::<HeldRecord>(&t).ok())
                .is_none_or(|r| now_s().saturating_sub(r.held_at_s) > HOLD_FOR_S);
            if old {
                let _ = remove_any(&e.path());
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(&base) {
        for e in entries.flatten() {
            let p = e.path();
            if e.file_name() != "held" {
                let _ = remove_any(&p);
            }
        }
    }
}

#[cfg(test)]
#[path = "effects_tests.rs"]
mod tests;
