//! A workspace saved by tar running as the sandbox's uid (it reads only
//! what the sandbox's calls could), and restored: the snapshot's members
//! listed by tar, judged (nothing outside `workspace/` and `home/`, no
//! special file, nothing written through a link), then extracted as the
//! sandbox's uid.

use std::path::Path;

use anyhow::{anyhow, Context, Result};

/// The trees a snapshot holds, each a directory of the sandbox root.
const SNAPSHOT_TREES: [&str; 2] = ["workspace", "home"];

/// One member of a snapshot, as `tar --list --verbose` shows it: its type
/// (the first letter of the mode: `-`, `d`, `l`, `h`, `c`, ...), its name,
/// and what a symbolic or hard link points to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub kind: char,
    pub name: Vec<u8>,
    pub link: Option<Vec<u8>>,
}

/// Saves the sandbox `root`'s trees into `archive` (a file the agent owns,
/// handed to tar as its output). tar runs as the sandbox's uid: a hard link
/// to a file only root may read, or anything else the calls could not
/// read, is skipped with a warning rather than copied into a snapshot the
/// calls would then own; links are stored as links, never followed.
pub(crate) async fn archive_workspace(
    root: &Path,
    archive: &Path,
    uid: u32,
    gid: u32,
) -> Result<()> {
    let out = std::fs::File::create(archive).context("creating the snapshot file")?;
    // The root itself is not readable by the uid (0711), so no `-C`: the
    // process starts there (chdir comes after the uid change).
    let status = tokio::process::Command::new("tar")
        .current_dir(root)
        .args(["--ignore-failed-read", "-czf", "-"])
        .args(SNAPSHOT_TREES)
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .uid(uid)
        .gid(gid)
        .status()
        .await
        .context("running tar")?;
    // 1: a file changed while it was read (a call still writing); the
    // archive is still whole.
    match status.code() {
        Some(0 | 1) => Ok(()),
        _ => Err(anyhow!("tar could not save the workspace: {status}")),
    }
}

/// Restores the snapshot `archive` into the sandbox `root`. The archive
/// was written by the sandbox's own calls' files, so it is judged first
/// ([`judge_snapshot`], over GNU tar's own listing of it: the parser that
/// lists is the one that extracts) and then extracted by tar running as
/// the sandbox's uid, which can create nothing its calls could not:
/// no device, no file of another owner, nothing outside its trees.
pub(crate) async fn extract_snapshot(
    archive: &Path,
    root: &Path,
    uid: u32,
    gid: u32,
) -> Result<()> {
    let tar = |args: &[&str]| -> Result<tokio::process::Command> {
        let mut cmd = tokio::process::Command::new("tar");
        cmd.args(args)
            .env("LC_ALL", "C")
            .stdin(std::fs::File::open(archive).context("opening the snapshot")?)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if crate::sys::geteuid() == 0 {
            // std drops the supplementary groups along with the uid.
            cmd.uid(uid).gid(gid);
        }
        Ok(cmd)
    };
    let failed = |what: &str, out: &std::process::Output| {
        anyhow!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    };
    // The names as stored (--absolute-names: nothing stripped), quoted so
    // that every name is one line.
    let listing = tar(&[
        "--list",
        "--verbose",
        "--numeric-owner",
        "--quoting-style=c",
        "--absolute-names",
        "--gzip",
        "--file=-",
    ])?
    .output()
    .await
    .context("running tar")?;
    if !listing.status.success() {
        return Err(failed("listing the snapshot", &listing));
    }
    let members = parse_listing(&String::from_utf8_lossy(&listing.stdout))
        .map_err(|e| anyhow!("the snapshot's listing: {e}"))?;
    judge_snapshot(&members).map_err(|e| anyhow!("the snapshot is refused: {e}"))?;
    // Run in the root rather than told `--directory`, which tar opens for
    // reading: the root is 0711, traversable by the uid, not readable.
    let extracted = tar(&[
        "--extract",
        "--gzip",
        "--file=-",
        "--no-same-owner",
        "--no-same-permissions",
        "--no-overwrite-dir",
        "--no-xattrs",
        "--no-acls",
        "--no-selinux",
    ])?
    .current_dir(root)
    .output()
    .await
    .context("running tar")?;
    if !extracted.status.success() {
        return Err(failed("extracting the snapshot", &extracted));
    }
    Ok(())
}

/// The members of a `tar --list --verbose --quoting-style=c` listing.
pub(crate) fn parse_listing(out: &str) -> Result<Vec<Member>, String> {
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| parse_member(l).ok_or_else(|| format!("cannot read the line {l:?}")))
        .collect()
}

/// `drwxr-xr-x 0/0 0 2024-01-01 00:00 "name"`, then ` -> "target"` for a
/// symbolic link or ` link to "target"` for a hard one. Owners are numeric
/// and dates unquoted: the first `"` opens the name.
fn parse_member(line: &str) -> Option<Member> {
    let kind = line.chars().next()?;
    let (name, rest) = unquote(&line[line.find('"')?..])?;
    let link = match (kind, rest) {
        ('l', r) => Some(unquote(r.strip_prefix(" -> ")?)?),
        ('h', r) => Some(unquote(r.strip_prefix(" link to ")?)?),
        (_, "") => None,
        _ => return None,
    };
    match link {
        Some((target, "")) => Some(Member {
            kind,
            name,
            link: Some(target),
        }),
        Some(_) => None,
        None => Some(Member {
            kind,
            name,
            link: None,
        }),
    }
}

/// A C-quoted string at the start of `s` (`"a\"b\303\251"`): its bytes,
/// and what follows it.
fn unquote(s: &str) -> Option<(Vec<u8>, &str)> {
    let b = s.as_bytes();
    if b.first() != Some(&b'"') {
        return None;
    }
    let mut out = Vec::new();
    let mut i = 1;
    while i < b.len() {
        match b[i] {
            b'"' => return Some((out, &s[i + 1..])),
            b'\\' => {
                let c = *b.get(i + 1)?;
                i += 2;
                out.push(match c {
                    b'0'..=b'7' => {
                        let digits = b[i - 1..]
                            .iter()
                            .take(3)
                            .take_while(|d| (b'0'..=b'7').contains(*d));
                        let n = digits.clone().count();
                        let v = digits.fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
                        i += n - 1;
                        u8::try_from(v).ok()?
                    }
                    b'n' => b'\n',
                    b't' => b'\t',
                    b'r' => b'\r',
                    b'a' => 7,
                    b'b' => 8,
                    b'f' => 12,
                    b'v' => 11,
                    b'?' => b'?',
                    b'\\' | b'"' | b'\'' => c,
                    _ => return None,
                });
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    None
}

/// The components of a member's name inside one of [`SNAPSHOT_TREES`],
/// or why it lies elsewhere.
fn plain(name: &[u8]) -> Result<Vec<&[u8]>, &'static str> {
    if name.starts_with(b"/") {
        return Err("an absolute name");
    }
    let parts: Vec<&[u8]> = name
        .split(|b| *b == b'/')
        .filter(|p| !p.is_empty() && *p != b".")
        .collect();
    if parts.iter().any(|p| *p == b"..") {
        return Err("a '..' in the name");
    }
    match parts.first() {
        Some(top) if SNAPSHOT_TREES.iter().any(|t| t.as_bytes() == *top) => Ok(parts),
        _ => Err("outside workspace/ and home/"),
    }
}

/// Whether a snapshot may be restored: every member (and every hard
/// link's target) is a plain name inside `workspace/` or `home/`, the two
/// trees themselves are directories, there is no device, fifo or other
/// special file, and nothing is written through a symbolic link of the
/// archive. A symbolic link may point anywhere (a Python venv points at
/// /usr/bin/python3): made by tar as the sandbox's uid and never written
/// through, it is what the sandbox's calls can make themselves.
pub(crate) fn judge_snapshot(members: &[Member]) -> Result<(), String> {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let symlinks: std::collections::HashSet<Vec<&[u8]>> = members
        .iter()
        .filter(|m| m.kind == 'l')
        .filter_map(|m| plain(&m.name).ok())
        .collect();
    let through_link = |parts: &[&[u8]]| {
        (1..parts.len())
            .map(|i| &parts[..i])
            .find(|above| symlinks.contains(*above))
            .map(|above| lossy(&above.join(&b'/')))
    };
    for m in members {
        let name = lossy(&m.name);
        let parts = plain(&m.name).map_err(|why| format!("{name}: {why}"))?;
        match m.kind {
            'd' => {}
            '-' | 'l' | 'h' if parts.len() > 1 => {}
            '-' | 'l' | 'h' => {
                return Err(format!(
                    "{name}: a tree of the snapshot that is not a directory"
                ))
            }
            'c' | 'b' => return Err(format!("{name}: a device")),
            'p' => return Err(format!("{name}: a fifo")),
            k => return Err(format!("{name}: a member of type '{k}'")),
        }
        if let Some(link) = through_link(&parts) {
            return Err(format!("{name}: written through the symbolic link {link}"));
        }
        if m.kind == 'h' {
            let target = m
                .link
                .as_deref()
                .ok_or_else(|| format!("{name}: a hard link to nothing"))?;
            let t = plain(target)
                .map_err(|why| format!("{name}: a hard link to {}: {why}", lossy(target)))?;
            if let Some(link) = through_link(&t) {
                return Err(format!(
                    "{name}: a hard link through the symbolic link {link}"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    static N: AtomicU32 = AtomicU32::new(0);

    /// A sandbox root as `SandboxEnv::prepare` leaves it: root's, 0711,
    /// with `workspace` and `home` the uid's, 0700.
    fn sandbox_root() -> (PathBuf, u32) {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let root = PathBuf::from(format!(
            "/var/tmp/armada-restore-{}-{n}",
            std::process::id()
        ));
        let uid = 230_000 + std::process::id() % 1000 * 10 + n;
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711)).unwrap();
        for d in ["workspace", "home"] {
            std::fs::create_dir(root.join(d)).unwrap();
            std::os::unix::fs::chown(root.join(d), Some(uid), Some(uid)).unwrap();
            std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        (root, uid)
    }

    /// A gzipped tar made by Python's `tarfile` from `members`, lines of
    /// `add(name, kind, data=, link=, mode=)` calls.
    fn archive(root: &Path, members: &str) -> PathBuf {
        let file = root.with_extension("tar.gz");
        let script = format!(
            r#"
import io, sys, tarfile
t = tarfile.open(sys.argv[1], "w:gz")
def add(name, kind="-", data=b"", link="", mode=0o644, dev=(0, 0)):
    kinds = {{"-": tarfile.REGTYPE, "d": tarfile.DIRTYPE, "l": tarfile.SYMTYPE,
             "h": tarfile.LNKTYPE, "c": tarfile.CHRTYPE, "b": tarfile.BLKTYPE,
             "p": tarfile.FIFOTYPE}}
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.linkname, ti.uid, ti.gid = kinds[kind], mode, link, 0, 0
    ti.devmajor, ti.devminor = dev
    ti.size = len(data) if kind == "-" else 0
    t.addfile(ti, io.BytesIO(data) if kind == "-" else None)
{members}
t.close()
"#
        );
        let ok = std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(&file)
            .status()
            .unwrap()
            .success();
        assert!(ok, "python3 could not write the archive");
        file
    }

    #[test]
    fn a_snapshot_listing_is_read_and_judged_member_by_member() {
        let listing = r#"drwxr-xr-x 0/0               0 2024-05-01 12:00 "workspace/"
-rw-r--r-- 0/0               1 2024-05-01 12:00 "workspace/we \"ird\" -> x\nname"
-rw-r--r-- 1000/1000         1 2024-05-01 12:00 "workspace/caf\303\251"
lrwxrwxrwx 0/0               0 2024-05-01 12:00 "workspace/.venv/bin/python" -> "/usr/bin/python3"
hrw-r--r-- 0/0               0 2024-05-01 12:00 "home/h" link to "workspace/caf\303\251"
drwx------ 0/0               0 2024-05-01 12:00 "home/"
"#;
        let members = parse_listing(listing).unwrap();
        assert_eq!(members.len(), 6);
        assert_eq!(members[1].name, b"workspace/we \"ird\" -> x\nname");
        assert_eq!(members[1].link, None);
        assert_eq!(members[2].name, "workspace/café".as_bytes());
        assert_eq!(members[3].link.as_deref(), Some(&b"/usr/bin/python3"[..]));
        assert_eq!(
            (members[4].kind, members[4].link.as_deref()),
            ('h', Some("workspace/café".as_bytes()))
        );
        assert_eq!(judge_snapshot(&members), Ok(()));
        assert!(parse_listing("-rw-r--r-- 0/0 1 2024-05-01 12:00 \"unterminated").is_err());
        assert!(parse_listing("lrwxrwxrwx 0/0 0 2024-05-01 12:00 \"a\" => \"b\"").is_err());

        // (type, name, link) members, and the reason each list is refused for.
        type List<'a> = &'a [(char, &'a str, &'a str)];
        let refused: [(List<'_>, &str); 16] = [
            (&[('-', "/etc/x", "")], "absolute"),
            (&[('-', "workspace/../calls/x", "")], "'..'"),
            (&[('-', "calls/x", "")], "outside"),
            (&[('-', "./x", "")], "outside"),
            (&[('c', "workspace/mem", "")], "device"),
            (&[('b', "workspace/sda", "")], "device"),
            (&[('p', "workspace/fifo", "")], "fifo"),
            (&[('V', "workspace/label", "")], "type 'V'"),
            (&[('l', "workspace", "/etc")], "not a directory"),
            (&[('-', "home", "")], "not a directory"),
            (
                &[('l', "workspace/l", "/"), ('-', "workspace/l/etc/x", "")],
                "through the symbolic link workspace/l",
            ),
            // The order does not matter: a later link is written through too.
            (
                &[('d', "workspace/l/x/", ""), ('l', "workspace/l", "/")],
                "through",
            ),
            (
                &[('h', "workspace/pw", "/etc/passwd")],
                "hard link to /etc/passwd: an absolute",
            ),
            (
                &[('h', "workspace/pw", "workspace/../../etc/passwd")],
                "'..'",
            ),
            (
                &[
                    ('l', "workspace/l", "/"),
                    ('h', "workspace/pw", "workspace/l/etc/passwd"),
                ],
                "hard link through",
            ),
            (&[('h', "workspace/pw", "")], "to nothing"),
        ];
        for (list, why) in refused {
            let members: Vec<Member> = list
                .iter()
                .map(|(kind, name, link)| Member {
                    kind: *kind,
                    name: name.as_bytes().to_vec(),
                    link: (!link.is_empty()).then(|| link.as_bytes().to_vec()),
                })
                .collect();
            let r = judge_snapshot(&members);
            assert!(
                r.as_ref().is_err_and(|e| e.contains(why)),
                "{members:?}: {r:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_good_snapshot_restores_owned_by_the_sandbox_uid() {
        if crate::sys::geteuid() != 0 {
            return; // tar cannot change uid
        }
        let (root, uid) = sandbox_root();
        let file = archive(
            &root,
            r##"
add("workspace/", "d", mode=0o755)
add("workspace/run.sh", data=b"#!/bin/sh\n", mode=0o4755)
add("workspace/src/", "d", mode=0o777)
add("workspace/src/a.py", data=b"print(1)\n")
add("workspace/same.py", "h", link="workspace/src/a.py")
add("workspace/.venv/bin/python", "l", link="/usr/bin/python3")
add("workspace/lib64", "l", link="src")
add("home/", "d", mode=0o755)
add("home/.bashrc", data=b"export A=1\n")
"##,
        );
        extract_snapshot(&file, &root, uid, uid).await.unwrap();
        let ws = root.join("workspace");
        assert_eq!(std::fs::read(ws.join("same.py")).unwrap(), b"print(1)\n");
        assert_eq!(
            std::fs::read(root.join("home/.bashrc")).unwrap(),
            b"export A=1\n"
        );
        let link = std::fs::read_link(ws.join(".venv/bin/python")).unwrap();
        assert_eq!(link, Path::new("/usr/bin/python3"));
        for p in ["run.sh", "src", "src/a.py", ".venv/bin/python", "."] {
            let m = std::fs::symlink_metadata(ws.join(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (uid, uid), "{p}");
        }
        let run = std::fs::metadata(ws.join("run.sh")).unwrap().mode();
        assert_eq!(run & 0o7000, 0, "no set-id bit survives: {run:o}");
        let top = std::fs::metadata(&ws).unwrap().mode();
        assert_eq!(top & 0o777, 0o700, "the workspace keeps its mode: {top:o}");
        // What `snapshot` makes of it (the same tar command) restores again.
        let (again, uid2) = sandbox_root();
        let file2 = again.with_extension("tar.gz");
        let mut tar = std::process::Command::new("tar");
        tar.arg("-C").arg(&root).arg("-czf").arg(&file2);
        assert!(tar.args(["workspace", "home"]).status().unwrap().success());
        extract_snapshot(&file2, &again, uid2, uid2).await.unwrap();
        let same = std::fs::read(again.join("workspace/same.py")).unwrap();
        assert_eq!(same, b"print(1)\n");
        for p in [root, again, file, file2] {
            let _ = std::fs::remove_dir_all(&p);
            let _ = std::fs::remove_file(&p);
        }
    }

    #[tokio::test]
    async fn a_snapshot_holds_only_what_the_sandbox_could_read() {
        if crate::sys::geteuid() != 0 {
            return; // tar cannot change uid
        }
        let (root, uid) = sandbox_root();
        // A root-only file, hard-linked into the workspace (root can; a
        // call could try where protected_hardlinks is off).
        let secret = root.join("secret");
        std::fs::write(&secret, "root only\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::hard_link(&secret, root.join("workspace/secret")).unwrap();
        std::fs::write(root.join("workspace/mine.txt"), "mine\n").unwrap();
        std::os::unix::fs::chown(root.join("workspace/mine.txt"), Some(uid), Some(uid)).unwrap();
        let file = root.with_extension("tar.gz");
        archive_workspace(&root, &file, uid, uid).await.unwrap();
        let listed = std::process::Command::new("tar")
            .args(["-tzf"])
            .arg(&file)
            .output()
            .unwrap();
        let names = String::from_utf8_lossy(&listed.stdout).to_string();
        assert!(names.contains("workspace/mine.txt"), "{names}");
        let contents = std::process::Command::new("tar")
            .args(["-xzOf"])
            .arg(&file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&contents.stdout);
        assert!(text.contains("mine"), "{text}");
        assert!(
            !text.contains("root only"),
            "the root-only file was saved: {text}"
        );
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_file(&file);
    }

    #[tokio::test]
    async fn hostile_snapshots_are_refused_and_write_nothing_outside() {
        if crate::sys::geteuid() != 0 {
            return; // tar cannot change uid
        }
        let escape = format!("/var/tmp/armada-restore-escape-{}", std::process::id());
        // Python lines; ESCAPE is a path outside every sandbox.
        let cases = [
            ("dot-dot", r#"add("workspace/../calls/x", data=b"x")"#),
            ("absolute", r#"add("/etc/x", data=b"x")"#),
            ("outside the trees", r#"add("calls/x", data=b"x")"#),
            ("char device", r#"add("workspace/disk", "c", dev=(1, 3))"#),
            ("block device", r#"add("workspace/disk", "b", dev=(7, 0))"#),
            ("fifo", r#"add("workspace/disk", "p")"#),
            (
                "via a symlink",
                "add('workspace/l', 'l', link='/')\nadd('workspace/lESCAPE')",
            ),
            (
                "via ..",
                "add('workspace/up', 'l', link='..')\nadd('workspace/up/calls/x')",
            ),
            (
                "hard link out",
                r#"add("workspace/pw", "h", link="/etc/passwd")"#,
            ),
            (
                "hard link up",
                r#"add("workspace/pw", "h", link="workspace/../../etc/passwd")"#,
            ),
            (
                "workspace a symlink",
                r#"add("workspace", "l", link="/etc")"#,
            ),
        ];
        let mut wrong = Vec::new();
        for (what, members) in cases {
            let (root, uid) = sandbox_root();
            std::fs::create_dir(root.join("calls")).unwrap();
            let file = archive(&root, &members.replace("ESCAPE", &escape));
            let r = extract_snapshot(&file, &root, uid, uid).await;
            let ws = root.join("workspace");
            let outside = [
                root.join("calls/x"),
                root.join("etc"),
                PathBuf::from(&escape),
            ];
            let leaked: Vec<_> = outside.iter().filter(|p| p.exists()).collect();
            let special = std::fs::symlink_metadata(ws.join("disk")).is_ok();
            let pw = std::fs::symlink_metadata(ws.join("pw")).is_ok();
            let ws_dir = std::fs::symlink_metadata(&ws).is_ok_and(|m| m.is_dir());
            // Refused by the judge, not merely failed in tar.
            let refused = r.as_ref().is_err_and(|e| e.to_string().contains("refused"));
            if !refused || !leaked.is_empty() || special || pw || !ws_dir {
                wrong.push(format!(
                    "{what}: {r:?}, leaked {leaked:?}, special {special}, link {pw}, workspace a directory {ws_dir}"
                ));
            }
            let _ = std::fs::remove_file(&escape);
            let _ = std::fs::remove_dir_all(&root);
            let _ = std::fs::remove_file(&file);
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}
