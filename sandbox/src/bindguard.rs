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

use std::collections::HashMap;
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
fn exit() -> Insn {
    insn(0x95, 0, 0, 0, 0)
}

/// A program as it is written: instructions, and jumps to named labels
/// whose offsets are counted when it is finished.
#[derive(Debug, Default)]
struct Asm {
    insns: Vec<Insn>,
    labels: HashMap<&'static str, usize>,
    /// Jumps to patch: their index and their label.
    jumps: Vec<(usize, &'static str)>,
}

impl Asm {
    fn op(&mut self, i: Insn) -> &mut Self {
        self.insns.push(i);
        self
    }

    /// The next instruction is `name`.
    fn label(&mut self, name: &'static str) -> &mut Self {
        self.labels.insert(name, self.insns.len());
        self
    }

    // Jumps compare the low 32 bits (BPF_JMP32): a word's immediate such
    // as 0xffff0000 would be sign-extended in a 64-bit compare.
    fn jeq(&mut self, dst: u8, imm: i32, to: &'static str) -> &mut Self {
        self.jumps.push((self.insns.len(), to));
        self.op(insn(0x16, dst, 0, 0, imm))
    }

    fn jne(&mut self, dst: u8, imm: i32, to: &'static str) -> &mut Self {
        self.jumps.push((self.insns.len(), to));
        self.op(insn(0x56, dst, 0, 0, imm))
    }

    /// Returns `v` (1 takes the bind, 0 refuses it).
    fn verdict(&mut self, v: i32) -> &mut Self {
        self.op(mov(0, v)).op(exit())
    }

    /// The instructions, each jump's offset counted from the instruction
    /// after it to its label.
    fn finish(&mut self) -> Vec<Insn> {
        let mut insns = std::mem::take(&mut self.insns);
        for (at, label) in &self.jumps {
            let to = self.labels[label] as i64;
            insns[*at].off = i16::try_from(to - (*at as i64 + 1)).unwrap_or(i16::MAX);
        }
        insns
    }
}

fn program_v4() -> Vec<Insn> {
    Asm::default()
        .op(load(2, 1, USER_IP4))
        .jne(2, 0, "not_wildcard")
        .op(mov(3, LOOPBACK4))
        .op(store(1, USER_IP4, 3))
        .jeq(2, 0, "take") // always: r2 is the wildcard's 0
        .label("not_wildcard")
        .op(and(2, 0xff)) // the first octet
        .jne(2, 127, "refuse")
        .label("take")
        .verdict(1)
        .label("refuse")
        .verdict(0)
        .finish()
}

fn program_v6() -> Vec<Insn> {
    let w = |i: i16| USER_IP6 + 4 * i;
    Asm::default()
        .op(load(2, 1, w(0)))
        .op(load(3, 1, w(1)))
        .op(or(2, 3))
        .op(load(3, 1, w(2)))
        .op(load(4, 1, w(3)))
        .jne(2, 0, "refuse") // not in ::/64
        .jne(3, 0, "maybe_mapped") // word 2 set
        .jne(4, 0, "maybe_one") // not the wildcard
        // The wildcard becomes ::ffff:127.0.0.1.
        .op(mov(5, MAPPED))
        .op(store(1, w(2), 5))
        .op(mov(5, LOOPBACK4))
        .op(store(1, w(3), 5))
        .jeq(4, 0, "take") // always: r4 is the wildcard's 0
        .label("maybe_one")
        .jeq(4, ONE6, "take") // ::1 (else r3 = 0 fails the next test)
        .label("maybe_mapped")
        .jne(3, MAPPED, "refuse")
        .op(and(4, 0xff)) // the mapped address's first octet
        .jne(4, 127, "refuse")
        .label("take")
        .verdict(1)
        .label("refuse")
        .verdict(0)
        .finish()
}

/// `union bpf_attr` as `BPF_PROG_LOAD` reads it (linux/bpf.h), up to the
/// fields used, padded to the size passed.
#[derive(Debug, Default)]
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    rest: [u64; 7],
}

/// `union bpf_attr` as `BPF_PROG_ATTACH` reads it.
#[derive(Debug, Default)]
#[repr(C)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
    rest: [u32; 3],
}

// The kernel's layout (linux/bpf.h), checked where it is compiled.
const _: () = {
    assert!(std::mem::offset_of!(ProgLoadAttr, insns) == 8);
    assert!(std::mem::offset_of!(ProgLoadAttr, log_buf) == 32);
    assert!(std::mem::offset_of!(ProgLoadAttr, prog_name) == 48);
    assert!(std::mem::offset_of!(ProgLoadAttr, expected_attach_type) == 68);
    assert!(std::mem::size_of::<ProgLoadAttr>() == 128);
    assert!(std::mem::offset_of!(ProgAttachAttr, attach_type) == 8);
    assert!(std::mem::size_of::<ProgAttachAttr>() == 32);
    assert!(std::mem::size_of::<Insn>() == 8);
};

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<i64> {
    // SAFETY: `attr` is a `#[repr(C)]` view of `union bpf_attr` for `cmd`,
    // zeroed beyond the fields set, and its size is what is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut u8,
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn load_program(insns: &[Insn], attach_type: u32) -> io::Result<OwnedFd> {
    let license = b"GPL\0";
    let mut log = vec![0u8; 16 * 1024];
    let mut name = [0u8; 16];
    name[..11].copy_from_slice(b"armada_bind");
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name: name,
        expected_attach_type: attach_type,
        ..ProgLoadAttr::default()
    };
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
        let mut attr = ProgAttachAttr {
            target_fd: cgroup.as_raw_fd() as u32,
            attach_bpf_fd: prog.as_raw_fd() as u32,
            attach_type,
            ..ProgAttachAttr::default()
        };
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
