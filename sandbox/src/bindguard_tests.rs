//! The programs load and judge real binds: a process in a guarded cgroup
//! that binds the wildcard listens on loopback only, and one that names
//! another address of the host is refused.

#![allow(clippy::unwrap_used)]

use super::*;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::process::Command;

fn jumps_land_on_instructions(p: &[Insn]) {
    for (i, ins) in p.iter().enumerate() {
        let class = ins.code & 0x07;
        if class == 0x05 || class == 0x06 {
            if ins.code == 0x95 {
                continue;
            }
            let to = i as i64 + 1 + i64::from(ins.off);
            assert!((0..p.len() as i64).contains(&to), "jump {i} lands at {to}");
        }
    }
    assert_eq!(p.last().unwrap().code, 0x95, "ends in exit");
}

#[test]
fn every_jump_lands_inside_its_program() {
    jumps_land_on_instructions(&program_v4());
    jumps_land_on_instructions(&program_v6());
    assert_eq!(LOOPBACK4.to_le_bytes(), [127, 0, 0, 1]);
    assert_eq!(MAPPED.to_le_bytes(), [0, 0, 0xff, 0xff]);
}

/// The jumps' offsets counted from labels are the ones counted by hand
/// when the programs were first written (and loaded, and tested).
#[test]
fn labels_give_the_offsets_once_counted_by_hand() {
    let offsets = |p: &[Insn]| -> Vec<i16> {
        p.iter()
            .filter(|i| i.code == 0x16 || i.code == 0x56)
            .map(|i| i.off)
            .collect()
    };
    assert_eq!(offsets(&program_v4()), [3, 2, 2]);
    assert_eq!(offsets(&program_v6()), [13, 7, 5, 4, 3, 4, 2]);
    assert_eq!((program_v4().len(), program_v6().len()), (11, 21));
}

/// Python in a fresh v2 cgroup under the guard binds `addr` (family
/// `fam`) and prints what it got, or the error.
fn bind_in_guarded_cgroup(fam: &str, addr: &str) -> Option<String> {
    let root = unified_root()?;
    let dir = root.join(format!(
        "armada-bindguard-test-{}-{fam}-{}",
        std::process::id(),
        addr.replace(':', "_")
    ));
    std::fs::create_dir_all(&dir).ok()?;
    if let Err(e) = loopback_binds(&dir) {
        let _ = std::fs::remove_dir(&dir);
        panic!("the programs did not load or attach: {e}");
    }
    let script = format!(
        r#"
import os, socket, sys
open("{procs}", "w").write(str(os.getpid()))
s = socket.socket(socket.{fam}, socket.SOCK_STREAM)
try:
    s.bind(("{addr}", 0))
    print(s.getsockname()[0])
except OSError as e:
    print("error", e.errno)
"#,
        procs = dir.join("cgroup.procs").display()
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&dir);
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn host_address() -> Option<String> {
    // Any non-loopback IPv4 address of this host.
    let out = Command::new("hostname").arg("-I").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|a| a.parse::<Ipv4Addr>().is_ok_and(|ip| !ip.is_loopback()))
        .map(str::to_string)
}

#[test]
fn wildcard_binds_become_loopback_and_other_addresses_are_refused() {
    if crate::sys::geteuid() != 0 || unified_root().is_none() {
        return; // attaching needs root and a cgroup v2 hierarchy
    }
    assert_eq!(
        bind_in_guarded_cgroup("AF_INET", "0.0.0.0").unwrap(),
        "127.0.0.1"
    );
    assert_eq!(
        bind_in_guarded_cgroup("AF_INET", "127.0.0.2").unwrap(),
        "127.0.0.2"
    );
    assert_eq!(
        bind_in_guarded_cgroup("AF_INET6", "::").unwrap(),
        "::ffff:127.0.0.1"
    );
    assert_eq!(bind_in_guarded_cgroup("AF_INET6", "::1").unwrap(), "::1");
    assert_eq!(
        bind_in_guarded_cgroup("AF_INET6", "fe80::1").unwrap(),
        "error 1"
    );
    if let Some(host) = host_address() {
        assert_eq!(
            bind_in_guarded_cgroup("AF_INET", &host).unwrap(),
            "error 1",
            "{host}"
        );
    }
    // Outside the cgroup nothing changed.
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))).unwrap();
    assert!(l.local_addr().unwrap().ip().is_unspecified());
    let _ = Ipv6Addr::LOCALHOST;
}
