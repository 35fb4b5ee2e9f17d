//! What the host gives a sandbox besides its own directory: the `/data` of
//! its tenant (never another tenant's), and what it hides from every
//! sandbox whatever its profile: the repository the stack runs from (its
//! `.armada/` holds the admin and tenant keys and the emulator's state) and
//! every tenant's `/data` by its host path.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Where the tenants' `/data` trees live: `data` beside the sandbox root.
pub(super) fn data_base(sandbox_root: &Path) -> PathBuf {
    sandbox_root.parent().unwrap_or(sandbox_root).join("data")
}

/// A tenant's `/data` on this host, `<data>/tenants/<tenant>`, created if
/// need be. `<data>` and `<data>/tenants` are traversable, not listable;
/// a tenant's tree is root's alone (0700): its sandboxes reach their
/// user workspaces through the mounts of their calls, never by host path.
pub(super) fn tenant_data(base: &Path, tenant: &str) -> Result<PathBuf> {
    if !armada_domain::names::valid_tenant(tenant) {
        bail!("{tenant:?} is not a tenant id");
    }
    let tenants = base.join("tenants");
    let dir = tenants.join(tenant);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (d, mode) in [
        (base, 0o711),
        (tenants.as_path(), 0o711),
        (dir.as_path(), 0o700),
    ] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("closing {}", d.display()))?;
    }
    Ok(dir)
}

/// The repositories this stack runs from: the one found from the working
/// directory (as `armada up` finds it) and the one whose build is running.
pub(super) fn repositories() -> Vec<PathBuf> {
    let from_exe = std::env::current_exe().ok().and_then(|exe| {
        exe.ancestors()
            .skip(1)
            .find(|d| d.join("infra/template.yaml").is_file())
            .map(Path::to_path_buf)
    });
    let mut out: Vec<PathBuf> = crate::local::find_root()
        .ok()
        .into_iter()
        .chain(from_exe)
        .collect();
    out.dedup();
    out
}

/// The host paths hidden from every sandbox: each repository and its
/// `.armada` state, and the tenants' `/data` trees. Never a path holding
/// `keep` (the sandboxes' own directories): around one, what lies beside
/// the way to it is hidden instead, entry by entry (entries made later are
/// not). Canonical paths, none beneath another.
pub(super) fn denied_paths(repos: &[PathBuf], data_base: &Path, keep: &[PathBuf]) -> Vec<PathBuf> {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let keep: Vec<PathBuf> = keep.iter().map(|k| canon(k)).collect();
    let wanted = repos
        .iter()
        .flat_map(|r| [r.clone(), crate::local::emulator::state_dir(r)])
        .chain([data_base.to_path_buf()])
        .map(|p| canon(&p));
    let mut out = Vec::new();
    for p in wanted {
        deny_around(&p, &keep, &mut out);
    }
    out.sort();
    out.dedup();
    let all = out.clone();
    out.retain(|p| !all.iter().any(|a| a != p && p.starts_with(a)));
    out
}

fn deny_around(p: &Path, keep: &[PathBuf], out: &mut Vec<PathBuf>) {
    if keep.iter().any(|k| k == p) {
        return;
    }
    if !keep.iter().any(|k| k.starts_with(p)) {
        out.push(p.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(p) else {
        return;
    };
    for e in entries.flatten() {
        deny_around(&e.path(), keep, out);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("armada-host-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn each_tenant_gets_a_data_tree_of_its_own_and_ids_stay_ids() {
        let root = scratch("data");
        let base = data_base(&root.join("stack"));
        assert_eq!(base, root.join("data"));
        let a = tenant_data(&base, "acme").unwrap();
        let b = tenant_data(&base, "globex").unwrap();
        assert_eq!(a, base.join("tenants/acme"));
        assert_ne!(a, b);
        assert!(!a.starts_with(&b) && !b.starts_with(&a));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&a), 0o700);
        assert_eq!(mode(&base.join("tenants")), 0o711);
        // Again: the same tree.
        assert_eq!(tenant_data(&base, "acme").unwrap(), a);
        for bad in ["", "..", "a/b", "Acme", "a.b", "a b"] {
            assert!(tenant_data(&base, bad).is_err(), "{bad:?}");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_repository_its_state_and_the_data_trees_are_denied_never_a_sandbox() {
        let root = scratch("deny");
        let repo = root.join("repo");
        for d in ["repo/.armada", "repo/src", "repo/sandboxes/stack", "data"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(repo.join("Cargo.toml"), "").unwrap();
        // Sandboxes elsewhere: the repository and the data trees, whole.
        let elsewhere = root.join("var/stack");
        let denied = denied_paths(
            std::slice::from_ref(&repo),
            &root.join("data"),
            &[elsewhere],
        );
        assert_eq!(denied, vec![root.join("data"), repo.clone()]);
        // Sandboxes inside the repository: everything beside the way to them.
        let inside = repo.join("sandboxes/stack");
        let mut denied = denied_paths(std::slice::from_ref(&repo), &root.join("data"), &[inside]);
        denied.sort();
        let mut want = vec![
            root.join("data"),
            repo.join(".armada"),
            repo.join("Cargo.toml"),
            repo.join("src"),
        ];
        want.sort();
        assert_eq!(denied, want);
        // The repository found from here: this crate's own.
        assert!(repositories()
            .iter()
            .any(|r| Path::new(env!("CARGO_MANIFEST_DIR")).starts_with(r)));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
