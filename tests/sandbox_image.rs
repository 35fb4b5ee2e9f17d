//! `scripts/build-sandbox-image` builds the sandbox task image with no
//! container engine and no registry (debootstrap + umoci): the image is a
//! valid OCI layout whose root holds what the agent and the built-in skills
//! need, whose entrypoint is the agent, and in whose root a non-root uid
//! runs the agent binary and python3.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The workspace's sandbox binary, stripped (the image only needs the code).
fn agent_binary(dir: &Path) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let built = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("armada-sandbox");
    assert!(built.is_file(), "{} is not built", built.display());
    let stripped = dir.join("armada-sandbox");
    run(Command::new("strip").arg("-o").arg(&stripped).arg(&built));
    stripped
}

#[test]
fn the_image_is_an_oci_layout_with_the_agent_and_what_skills_need() {
    let root = armada_tests::root();
    let work = root.join("target/test-artifacts/sandbox-image");
    std::fs::create_dir_all(&work).unwrap();
    let binary = agent_binary(&work);
    // The Debian root in `work/base` is kept between runs of this test.
    run(Command::new(root.join("scripts/build-sandbox-image"))
        .arg("--binary")
        .arg(&binary)
        .arg("--out")
        .arg(&work));
    let layout = work.join("oci");
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(layout.join("index.json")).unwrap()).unwrap();
    let tagged = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["annotations"]["org.opencontainers.image.ref.name"] == "sandbox");
    assert!(tagged, "{index}");

    // Unpacked as a runtime would: the config says how the task starts.
    let bundle = work.join("unpacked");
    let _ = std::fs::remove_dir_all(&bundle);
    run(Command::new("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:sandbox", layout.display()))
        .arg(&bundle));
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(bundle.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(
        config["process"]["args"],
        serde_json::json!(["/usr/local/bin/armada-sandbox", "agent"]),
        "{config}"
    );
    let rootfs = bundle.join("rootfs");
    for needed in [
        "usr/local/bin/armada-sandbox",
        "usr/bin/python3",
        "bin/sh",
        "bin/tar",
        "usr/bin/ps",
        "etc/ssl/certs/ca-certificates.crt",
        "data",
    ] {
        assert!(rootfs.join(needed).exists(), "the image lacks /{needed}");
    }
    assert!(
        !rootfs.join("usr/share/doc/python3").exists(),
        "docs are trimmed"
    );

    // In the image's root, with its own libc, as an unprivileged uid: the
    // agent binary starts (and answers its usage), python3 runs.
    // A task has its own /proc: so does this one (a pid namespace of its
    // own, proc mounted in the image's root).
    let uid = "300123:300123";
    let out = Command::new("unshare")
        .args(["--fork", "--pid"])
        .arg(format!("--mount-proc={}", rootfs.join("proc").display()))
        .arg("chroot")
        .arg(format!("--userspec={uid}"))
        .arg(&rootfs)
        .args(["/usr/local/bin/armada-sandbox", "no-such-mode"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("usage: armada-sandbox"),
        "{out:?}"
    );
    let who = run(Command::new("chroot")
        .arg(format!("--userspec={uid}"))
        .arg(&rootfs)
        .args([
            "/usr/bin/python3",
            "-c",
            "import os, ssl, json; print(os.getuid(), os.getgid())",
        ]));
    assert_eq!(who.trim(), "300123 300123");
    std::fs::remove_dir_all(&bundle).unwrap();
}
