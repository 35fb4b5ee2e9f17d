//! Declared mounts live in the user's data, which the sandbox's calls may
//! write: a call can turn a declared path into a symbolic link before the
//! next call declares it. The jail opens such paths beneath the data root
//! without following any link, and refuses the call instead of widening
//! its mounts or its Landlock rules.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use armada_domain::sandbox::{MountMode, ProfileDef, Profiles};
use armada_domain::skills::MountDecl;

mod support;

use support::{fixture, fixture_with, sh, Fixture};

/// `{data}/users/u1/workspace`, owned by the sandbox's uid (its calls
/// write it through a rw mount), with the directories above traversable.
fn user_workspace(f: &Fixture) -> PathBuf {
    let data = f.runner.env.data_root.clone();
    let ws = data.join("users/u1/workspace");
    std::fs::create_dir_all(ws.join("repo")).unwrap();
    for d in [&data, &data.join("users"), &data.join("users/u1")] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for d in [&ws, &ws.join("repo")] {
        std::os::unix::fs::chown(d, Some(f.runner.env.uid), Some(f.runner.env.gid)).unwrap();
    }
    ws
}

fn mount(path: &str, mode: MountMode) -> MountDecl {
    MountDecl {
        path: path.into(),
        mode,
    }
}

/// A directory outside every sandbox, readable by every uid.
fn secret_dir(tag: &str) -> PathBuf {
    let d = PathBuf::from(format!("/var/tmp/armada-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(d.join("inner")).unwrap();
    std::fs::write(d.join("inner/f"), "secret").unwrap();
    std::fs::write(d.join("f"), "secret").unwrap();
    for p in [&d, &d.join("inner")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    d
}

fn refused(r: &Value) -> bool {
    r["error"]["code"] == "DENIED"
        && r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("symbolic link")
}

/// A call with the user's workspace mounted rw makes `link` a symlink.
async fn plant_symlink(f: &mut Fixture, ws: &Path, link: &str, target: &Path) {
    f.runner.env.mounts = vec![mount("/data/users/u1/workspace", MountMode::Rw)];
    let cmd = format!(
        "cd {} && rm -rf {link} && ln -s {} {link}",
        ws.display(),
        target.display()
    );
    let r = sh(f, &cmd).await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(std::fs::read_link(ws.join(link)).unwrap(), target);
}

#[tokio::test]
async fn a_declared_mount_replaced_by_a_symlink_to_root_is_refused() {
    let mut f = fixture("workspace");
    let ws = user_workspace(&f);
    plant_symlink(&mut f, &ws, "repo", Path::new("/")).await;
    // Followed, the next call would have `/` bound rw at repo and a
    // Landlock rule granting everything beneath `/`.
    let escape = PathBuf::from(format!("/var/tmp/armada-escape-{}", std::process::id()));
    let _ = std::fs::remove_file(&escape);
    f.runner.env.mounts = vec![mount("/data/users/u1/workspace/repo", MountMode::Rw)];
    let r = sh(&f, &format!("echo pwned > {}", escape.display())).await;
    let escaped = escape.exists();
    let _ = std::fs::remove_file(&escape);
    assert!(!escaped, "the call wrote outside its sandbox: {r}");
    assert!(refused(&r), "{r}");
    // The workspace itself, no link in it, still mounts.
    f.runner.env.mounts = vec![mount("/data/users/u1/workspace", MountMode::Ro)];
    let r = sh(&f, &format!("ls {}", ws.display())).await;
    assert_eq!(r["stdout"], "repo\n", "{r}");
}

#[tokio::test]
async fn a_symlink_anywhere_along_a_declared_mount_is_refused() {
    let secret = secret_dir("along");
    let mut f = fixture("strict");
    let ws = user_workspace(&f);
    plant_symlink(&mut f, &ws, "sub", &secret).await;
    // `sub/inner` is a real directory; `sub` on the way to it is a link.
    f.runner.env.mounts = vec![mount("/data/users/u1/workspace/sub/inner", MountMode::Ro)];
    let r = sh(&f, &format!("cat {}/sub/inner/f", ws.display())).await;
    std::fs::remove_dir_all(&secret).unwrap();
    assert_ne!(r["stdout"], "secret", "read through the link: {r}");
    assert!(refused(&r), "{r}");
}

#[tokio::test]
async fn a_profile_path_beneath_the_data_root_is_not_followed_through_a_symlink() {
    let secret = secret_dir("profile");
    let profiles = Profiles::load(
        BTreeMap::from([(
            "strict-link".to_string(),
            ProfileDef {
                extends: Some("strict".into()),
                read_only: vec!["/data/users/u1/workspace/link".into()],
                ..ProfileDef::default()
            },
        )]),
        Default::default(),
    )
    .unwrap();
    let mut f = fixture_with("strict-link", &profiles, 256);
    let ws = user_workspace(&f);
    plant_symlink(&mut f, &ws, "link", &secret).await;
    // The workspace is mounted and the profile's Landlock rule names the
    // link: followed, the rule would grant reading the secret directory.
    f.runner.env.mounts = vec![mount("/data/users/u1/workspace", MountMode::Ro)];
    let r = sh(&f, &format!("cat {}/f", secret.display())).await;
    std::fs::remove_dir_all(&secret).unwrap();
    assert_ne!(r["stdout"], "secret", "read through the link: {r}");
    assert!(refused(&r), "{r}");
}

#[tokio::test]
async fn declared_mounts_still_nest_and_may_name_a_file() {
    let mut f = fixture("workspace");
    let ws = user_workspace(&f);
    std::fs::write(ws.join("notes.txt"), "notes").unwrap();
    f.runner.env.mounts = vec![
        mount("/data/users/u1/workspace", MountMode::Rw),
        mount("/data/users/u1/workspace/repo", MountMode::Ro),
        mount("/data/users/u1/workspace/notes.txt", MountMode::Ro),
    ];
    let ws = ws.display();
    let r = sh(
        &f,
        &format!(
            "cd {ws}; echo a > new && echo wrote; echo b > repo/x || echo ro; \
             cat notes.txt; echo; echo c >> notes.txt || echo ro"
        ),
    )
    .await;
    assert_eq!(r["stdout"], "wrote\nro\nnotes\nro\n", "{r}");
}
