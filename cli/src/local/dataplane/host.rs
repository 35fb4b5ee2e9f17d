//! What the host gives a sandbox besides its own directory: the `/data` of
//! its tenant (never another tenant's).

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
    if !armada_domain::api::valid_tenant(tenant) {
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
}
