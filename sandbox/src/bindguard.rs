//! Listening sockets reachable from this host only: what a sandbox serves
//! is reached through its published port on loopback, never on the host's
//! other addresses. The local data plane shares one host (and one network)
//! among its sandboxes; on Fargate each task has an address of its own and
//! its security group is the boundary, so this is the local plane's.
//!
//! Two small eBPF programs attached to the task's cgroup (v2) judge every
//! `bind()` of every process in it, whatever the program asked for:
//!
//! - IPv4: the wildcard `0.0.0.0` becomes `127.0.0.1`; `127.0.0.0/8` is
//!   taken as is; any other address is refused (`EPERM`).
//! - IPv6: the wildcard `::` becomes `::ffff:127.0.0.1` (a dual-stack
//!   socket then takes IPv4 connections to 127.0.0.1, as the published URL
//!   names it); `::1` and `::ffff:127.0.0.1` are taken; anything else is
//!   refused.
//!
//! Written by hand (no BPF toolchain on the build machines), as the
//! instructions the kernel's verifier checks at load.

// The bpf(2) calls are raw system calls, wrapped here once, as in `sys`.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
const BPF_CGROUP_INET4_BIND: u32 = 8;
const BPF_CGROUP_INET6_BIND: u32 = 9;

// struct bpf_sock_addr, the programs' context.
const USER_IP4: i16 = 4;
const USER_IP6: i16 = 8;

/// 127.0.0.1 and ::ffff:0:0 as the u32 words a context load sees (network
/// byte order read on a little-endian machine).
const LOOPBACK4: i32 = i32::from_le_bytes([127, 0, 0, 1]);
const MAPPED: i32 = i32::from_le_bytes([0, 0, 0xff, 0xff]);
const ONE6: i32 = i32::from_le_bytes([0, 0, 0, 1]);

/// One eBPF instruction.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

/// dst = *(u32 *)(src + off)
fn load(dst: u8, src: u8, off: i16) -> Insn {
    insn(0x61, dst, src, off, 0)
}
/// *(u32 *)(dst + off) = src
fn store(dst: u8, off: i16, src: u8) -> Insn {
    insn(0x63, dst, src, off, 0)
}
fn mov(dst: u8, imm: i32) -> Insn {
    insn(0xb7, dst, 0, 0, imm)
}
fn or(dst: u8, src: u8) -> Insn {
    insn(0x4f, dst, src, 0, 0)
}
fn and(dst: u8, imm: i32) -> Insn {
    insn(0x57, dst, 0, 0, imm)
}
// Jumps compare the low 32 bits (BPF_JMP32): a word's immediate such as
// 0xffff0000 would be sign-extended in a 64-bit compare.
fn jeq(dst: u8, imm: i32, off: i16) -> Insn {
    insn(0x16, dst, 0, off, imm)
}
fn jne(dst: u8, imm: i32, off: i16) -> Insn {
    insn(0x56, dst, 0, off, imm)
}
fn exit() -> Insn {
    insn(0x95, 0, 0, 0, 0)
}

/// Returns `verdict` (1 takes the bind, 0 refuses it).
fn verdict(v: i32) -> [Insn; 2] {
    [mov(0, v), exit()]
}

fn program_v4() -> Vec<Insn> {
    let mut p = vec![
        /* 0 */ load(2, 1, USER_IP4),
        /* 1 */ jne(2, 0, 3), // not the wildcard: to 5
        /* 2 */ mov(3, LOOPBACK4),
        /* 3 */ store(1, USER_IP4, 3),
        /* 4 */ jeq(2, 0, 2), // (always) take it: to 7
        /* 5 */ and(2, 0xff), // the first octet
        /* 6 */ jne(2, 127, 2), // to 9
    ];
    p.extend(verdict(1)); // 7, 8
    p.extend(verdict(0)); // 9, 10
    p
}

fn program_v6() -> Vec<Insn> {
    let w = |i: i16| USER_IP6 + 4 * i;
    let mut p = vec![
        /* 0 */ load(2, 1, w(0)),
        /* 1 */ load(3, 1, w(1)),
        /* 2 */ or(2, 3),
        /* 3 */ load(3, 1, w(2)),
        /* 4 */ load(4, 1, w(3)),
        /* 5 */ jne(2, 0, 13), // not in ::/64: refuse (19)
        /* 6 */ jne(3, 0, 7), // word 2 set: maybe mapped (14)
        /* 7 */ jne(4, 0, 5), // not the wildcard: maybe ::1 (13)
        // The wildcard becomes ::ffff:127.0.0.1.
        /* 8 */ mov(5, MAPPED),
        /* 9 */ store(1, w(2), 5),
        /* 10 */ mov(5, LOOPBACK4),
        /* 11 */ store(1, w(3), 5),
        /* 12 */ jeq(4, 0, 4), // (always) take it (17)
        /* 13 */ jeq(4, ONE6, 3), // ::1: take it (17); else r3 = 0 fails 14
        /* 14 */ jne(3, MAPPED, 4), // refuse (19)
        /* 15 */ and(4, 0xff), // the mapped address's first octet
        /* 16 */ jne(4, 127, 2), // refuse (19)
    ];
    p.extend(verdict(1)); // 17, 18
    p.extend(verdict(0)); // 19, 20
    p
}

fn bpf(cmd: libc::c_long, attr: &mut [u8]) -> io::Result<i64> {
    // SAFETY: `attr` is a zeroed, correctly sized `union bpf_attr` for `cmd`.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn put(attr: &mut [u8], at: usize, bytes: &[u8]) {
    attr[at..at + bytes.len()].copy_from_slice(bytes);
}

fn load_program(insns: &[Insn], attach_type: u32) -> io::Result<OwnedFd> {
    let license = b"GPL\0";
    let mut log = vec![0u8; 16 * 1024];
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &BPF_PROG_TYPE_CGROUP_SOCK_ADDR.to_ne_bytes());
    put(&mut attr, 4, &(insns.len() as u32).to_ne_bytes());
    put(&mut attr, 8, &(insns.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 16, &(license.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 24, &1u32.to_ne_bytes()); // log_level
    put(&mut attr, 28, &(log.len() as u32).to_ne_bytes());
    put(&mut attr, 32, &(log.as_mut_ptr() as u64).to_ne_bytes());
    put(&mut attr, 48, b"armada_bind\0");
    put(&mut attr, 68, &attach_type.to_ne_bytes()); // expected_attach_type
    match bpf(BPF_PROG_LOAD, &mut attr) {
        // SAFETY: the kernel returned a new file descriptor we now own.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        Err(e) => {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let why = String::from_utf8_lossy(&log[..end]);
            Err(io::Error::new(e.kind(), format!("{e}: {why}")))
        }
    }
}

/// Attaches the two programs to the cgroup (v2) at `dir`: every bind of
/// every process in it or below is judged from then on.
pub fn loopback_binds(dir: &Path) -> io::Result<()> {
    let cgroup = std::fs::File::open(dir)?;
    for (insns, attach_type) in [
        (program_v4(), BPF_CGROUP_INET4_BIND),
        (program_v6(), BPF_CGROUP_INET6_BIND),
    ] {
        let prog = load_program(&insns, attach_type)?;
        let mut attr = [0u8; 32];
        put(&mut attr, 0, &(cgroup.as_raw_fd() as u32).to_ne_bytes());
        put(&mut attr, 4, &(prog.as_raw_fd() as u32).to_ne_bytes());
        put(&mut attr, 8, &attach_type.to_ne_bytes());
        bpf(BPF_PROG_ATTACH, &mut attr)?;
        // The attachment keeps the program; our descriptor goes.
    }
    Ok(())
}

/// Where this host's cgroup v2 hierarchy is mounted (beside v1 on hybrid
/// hosts), if it is.
pub fn unified_root() -> Option<std::path::PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, at, fs) = (f.next()?, f.next()?, f.next()?);
            (fs == "cgroup2").then(|| std::path::PathBuf::from(at))
        })
        .next()
}

#[cfg(test)]
#[path = "bindguard_tests.rs"]
mod tests;
