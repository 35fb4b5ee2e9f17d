//! The disk limit is a real quota: the workspace gets a filesystem of
//! `disk_mb` of its own, so a call that writes more gets ENOSPC however it
//! splits its writes, and nothing it writes lands on the host's
//! filesystem. Each test mounts in a mount namespace of its own thread
//! (as the agent does in its own): nothing shows on the host, and nothing
//! outlives the test.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use armada_domain::sandbox::controls::Enforcement;
use armada_sandbox::agent::disk::{self, Backing, Disk, Prefer, IMAGE};

mod support;

use support::{fixture, sh, Fixture};

/// Runs `body` on a thread in a mount namespace of its own (the calls it
/// starts share it); `host` runs on the test's own thread (the host's
/// namespace) when the body sends it a path, and answers.
fn in_own_mounts<T: Send>(
    body: impl FnOnce(mpsc::Sender<PathBuf>, mpsc::Receiver<bool>) -> T + Send,
    host: impl Fn(&Path) -> bool,
) -> T {
    let (ask, asked) = mpsc::channel::<PathBuf>();
    let (answer, answered) = mpsc::channel::<bool>();
    std::thread::scope(|s| {
        let t = s.spawn(move || {
            disk::private_mounts().unwrap();
            body(ask, answered)
        });
        for p in asked {
            answer.send(host(&p)).unwrap();
        }
        t.join().unwrap()
    })
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn sandbox(disk_mb: u32) -> Fixture {
    let mut f = fixture("workspace");
    f.runner.env.limits.disk_mb = disk_mb;
    f
}

/// Bytes the file takes on its filesystem.
fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

#[test]
fn a_call_gets_enospc_past_the_disk_limit_and_the_host_is_untouched() {
    let f = sandbox(20);
    let ws = f.runner.env.workspace();
    let root = f.runner.env.root.clone();
    // Already there when the agent starts: kept.
    std::fs::write(ws.join("before.txt"), "kept").unwrap();
    std::os::unix::fs::chown(ws.join("before.txt"), Some(f.runner.env.uid), None).unwrap();
    let image = root.join(IMAGE);
    in_own_mounts(
        |ask, answer| {
            let d = disk::setup(&f.runner.env, Prefer::Image);
            let control = d.control();
            assert_eq!(control.status, Enforcement::Enforced, "{}", control.reason);
            assert!(control.reason.contains("ext4"), "{}", control.reason);
            let Disk::Quota(q) = &d else { unreachable!() };
            assert!(matches!(q.backing, Backing::Ext4 { .. }), "{q:?}");
            // The sandbox's, closed to others, with what was there.
            let meta = std::fs::metadata(&ws).unwrap();
            assert_eq!(meta.uid(), f.runner.env.uid);
            assert_eq!(meta.mode() & 0o777, 0o700);
            assert_ne!(meta.dev(), std::fs::metadata(&root).unwrap().dev());
            let r = block_on(sh(
                &f,
                "cat before.txt; echo; ls -A; dd if=/dev/zero of=big bs=1M count=50; echo rc=$?",
            ));
            let out = r["stdout"].as_str().unwrap();
            assert!(out.starts_with("kept\nbefore.txt\n"), "{r}");
            assert!(!out.contains("rc=0"), "dd failed: {r}");
            assert!(
                r["stderr"]
                    .as_str()
                    .unwrap()
                    .contains("No space left on device"),
                "{r}"
            );
            let big = ws.join("big");
            let size = std::fs::metadata(&big).unwrap().len();
            assert!(
                (12 << 20..=20 << 20).contains(&size),
                "stopped at about 20 MB: {size}"
            );
            // On the disk, not on the host's filesystem.
            assert_eq!(std::fs::metadata(&big).unwrap().dev(), meta.dev());
            assert!(answer_of(&ask, &answer, &big), "the host sees no such file");
            assert!(allocated(&image) <= 21 << 20, "{}", allocated(&image));
            // A quota, not a largest-file limit: many small files stop too,
            // and room comes back when they go.
            let r = block_on(sh(
                &f,
                "rm big; for i in 1 2 3 4; do dd if=/dev/zero of=part$i bs=1M count=6 2>&1 \
                 | grep -q 'No space left on device' && echo full-at-$i && break; done; \
                 rm part*; dd if=/dev/zero of=again bs=1M count=5 2>/dev/null && echo room",
            ));
            let out = r["stdout"].as_str().unwrap();
            assert!(
                out == "full-at-3\nroom\n" || out == "full-at-4\nroom\n",
                "6 MB files, each under the largest-file limit: {r}"
            );
            // Stopping unmounts it and removes the image.
            d.release().unwrap();
            assert_eq!(
                std::fs::metadata(&ws).unwrap().dev(),
                std::fs::metadata(&root).unwrap().dev()
            );
            assert!(!image.exists());
            assert!(!ws.join("again").exists());
        },
        |p| !p.exists(),
    );
}

fn answer_of(ask: &mpsc::Sender<PathBuf>, answer: &mpsc::Receiver<bool>, p: &Path) -> bool {
    ask.send(p.to_path_buf()).unwrap();
    answer.recv().unwrap()
}

#[test]
fn without_loop_devices_a_tmpfs_of_the_limit_holds() {
    let f = sandbox(20);
    let ws = f.runner.env.workspace();
    in_own_mounts(
        |_, _| {
            let d = disk::setup(&f.runner.env, Prefer::Tmpfs);
            let c = d.control();
            assert_eq!(c.status, Enforcement::Enforced, "{}", c.reason);
            assert!(c.reason.contains("tmpfs of 20 MB"), "{}", c.reason);
            let meta = std::fs::metadata(&ws).unwrap();
            assert_eq!(meta.uid(), f.runner.env.uid);
            assert_eq!(meta.permissions().mode() & 0o777, 0o700);
            // Two files under the largest-file limit, too much together.
            let r = block_on(sh(
                &f,
                "dd if=/dev/zero of=a bs=1M count=15 2>/dev/null && echo a; \
                 dd if=/dev/zero of=b bs=1M count=15 2>&1 | grep -o 'No space left on device'",
            ));
            assert_eq!(r["stdout"], "a\nNo space left on device\n", "{r}");
            d.release().unwrap();
            assert!(!ws.join("a").exists());
        },
        |_| true,
    );
}

#[test]
fn the_snapshot_tar_reads_and_restores_the_mounted_workspace() {
    let f = sandbox(64);
    let root = f.runner.env.root.clone();
    in_own_mounts(
        |_, _| {
            let d = disk::setup(&f.runner.env, Prefer::Image);
            assert!(d.is_quota(), "{}", d.control().reason);
            let r = block_on(sh(&f, "mkdir -p src && echo state > src/s.txt"));
            assert_eq!(r["exit_code"], 0, "{r}");
            // As the agent's snapshot makes it.
            let tar = |args: &[&str]| {
                let out = std::process::Command::new("tar")
                    .current_dir(&root)
                    .args(args)
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{out:?}");
                String::from_utf8(out.stdout).unwrap()
            };
            tar(&["-czf", "snap.tar.gz", "workspace", "home"]);
            let listing = tar(&["-tzf", "snap.tar.gz"]);
            assert!(listing.contains("workspace/src/s.txt"), "{listing}");
            assert!(!listing.contains("lost+found"), "{listing}");
            // Restored into the mounted workspace, it is on the disk.
            std::fs::remove_dir_all(f.runner.env.workspace().join("src")).unwrap();
            tar(&["-xzf", "snap.tar.gz", "--no-overwrite-dir"]);
            let r = block_on(sh(&f, "cat src/s.txt"));
            assert_eq!(r["stdout"], "state\n", "{r}");
            d.release().unwrap();
        },
        |_| true,
    );
}

#[test]
fn an_agent_restarted_after_a_crash_finds_the_workspace_on_its_disk() {
    let f = sandbox(32);
    let ws = f.runner.env.workspace();
    let image = f.runner.env.root.join(IMAGE);
    // The first agent writes, and dies without releasing its disk: its
    // namespace goes with its thread, the image stays.
    in_own_mounts(
        |_, _| {
            let d = disk::setup(&f.runner.env, Prefer::Image);
            assert!(d.is_quota(), "{}", d.control().reason);
            let r = block_on(sh(&f, "echo first > work.txt"));
            assert_eq!(r["exit_code"], 0, "{r}");
            std::mem::forget(d);
        },
        |_| true,
    );
    assert!(image.exists());
    assert!(!ws.join("work.txt").exists(), "not on the host");
    // The next one mounts the same image; while it runs, a third (a
    // crashed agent's server still up, say) gets the same device, so the
    // image is never mounted twice as two filesystems.
    let (held, hold) = mpsc::channel::<PathBuf>();
    let (done, wait) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let f = &f;
        s.spawn(move || {
            disk::private_mounts().unwrap();
            let d = disk::setup(&f.runner.env, Prefer::Image);
            let Disk::Quota(q) = &d else {
                panic!("{}", d.control().reason)
            };
            let Backing::Ext4 { device } = &q.backing else {
                panic!("{q:?}")
            };
            held.send(device.clone()).unwrap();
            wait.recv().unwrap();
        });
        let first = hold.recv().unwrap();
        in_own_mounts(
            |_, _| {
                let d = disk::setup(&f.runner.env, Prefer::Image);
                let Disk::Quota(q) = &d else {
                    panic!("{}", d.control().reason)
                };
                assert_eq!(q.backing, Backing::Ext4 { device: first });
                let r = block_on(sh(f, "cat work.txt; ls -A"));
                assert_eq!(r["stdout"], "first\nwork.txt\n", "{r}");
                d.release().unwrap();
            },
            |_| true,
        );
        done.send(()).unwrap();
    });
    assert!(!image.exists(), "released by the last one");
}

/// Set for the child this test starts, which moves itself.
const CHILD: &str = "ARMADA_TEST_OWN_MOUNTS_CHILD";

#[test]
fn the_agent_moves_itself_whole_into_a_mount_namespace_of_its_own() {
    let ns = || std::fs::read_link("/proc/self/ns/mnt").unwrap();
    if disk::in_own_mounts() {
        // The same process (pid), executed again: every thread of it is
        // in a namespace other than the one it started in.
        let started_in = std::env::var(CHILD).unwrap();
        assert_ne!(ns().display().to_string(), started_in);
        let other = std::thread::spawn(ns).join().unwrap();
        assert_eq!(other, ns(), "a new thread is there too");
        println!("own-mounts-ok pid={}", std::process::id());
        return;
    }
    if std::env::var_os(CHILD).is_some() {
        // A multi-threaded process, as the agent is.
        let _busy = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(5)));
        let Err(why) = disk::enter_own_mounts();
        panic!("did not move: {why}");
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "the_agent_moves_itself_whole_into_a_mount_namespace_of_its_own",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, ns().display().to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = out.id();
    let out = out.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains(&format!("own-mounts-ok pid={pid}\n")),
        "{stdout}"
    );
}
