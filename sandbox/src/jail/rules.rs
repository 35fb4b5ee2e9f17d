//! What the jail enforces in the kernel: the seccomp deny-list (with the
//! namespace-creating clone flags) and the Landlock ruleset over the
//! filesystem and TCP ports.

use std::collections::BTreeMap;
use std::path::PathBuf;

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};

use super::beneath::{self, OpenError, StepError};
use super::{FsRules, TcpRules};

/// System calls no skill needs and every escape wants.
pub(super) const DENIED_SYSCALLS: [i64; 42] = [
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_setns,
    libc::SYS_unshare,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_userfaultfd,
    libc::SYS_acct,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_syslog,
    // io_uring runs system calls on the call's behalf from kernel workers
    // that no seccomp filter sees.
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    // The mount API of file descriptors (mount(2) by other names).
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    SYS_OPEN_TREE_ATTR,
    libc::SYS_mount_setattr,
    libc::SYS_fspick,
    // Another process's descriptors and memory.
    libc::SYS_pidfd_getfd,
    libc::SYS_process_madvise,
];

/// open_tree_attr(2) (Linux 6.15), not yet in `libc`: one number on every
/// architecture since the tables were unified at 424.
const SYS_OPEN_TREE_ATTR: i64 = 467;

pub(super) const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

/// Socket families a call may open: local sockets, IPv4 and IPv6, and
/// netlink for the routing protocol alone (glibc lists interfaces through
/// it). Everything else (AF_ALG, AF_VSOCK, AF_PACKET, Bluetooth, the other
/// netlink protocols...) is kernel surface no skill needs.
pub(super) const SOCKET_FAMILIES: [i32; 4] = [
    libc::AF_UNIX,
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
];

/// MSG_FASTOPEN, not in `libc` for every target: a send with it connects
/// the socket first (TCP Fast Open) without calling connect(2), which is
/// where Landlock's TCP rule is checked.
const MSG_FASTOPEN: u64 = 0x2000_0000;

/// TCP_FASTOPEN_CONNECT (setsockopt at IPPROTO_TCP): connect(2) then only
/// records the address and the first write makes the connection.
const TCP_FASTOPEN_CONNECT: u64 = 30;

/// personality(2) arguments allowed: the query (0xffffffff) and plain
/// PER_LINUX, which only clears flags. Setting ADDR_NO_RANDOMIZE (ASLR off
/// for what the call executes next) or READ_IMPLIES_EXEC is denied.
const PERSONALITY_ALLOWED: [u64; 2] = [0xffff_ffff, 0];

pub(super) fn seccomp_filters() -> Result<Vec<seccompiler::BpfProgram>, String> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
        SeccompFilter, SeccompRule, TargetArch,
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let cond = |arg: u8, len: Len, op: Op, value: u64| {
        SeccompCondition::new(arg, len, op, value).map_err(|e| e.to_string())
    };
    let rule = |conds: Vec<SeccompCondition>| SeccompRule::new(conds).map_err(|e| e.to_string());
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED_SYSCALLS.iter().map(|s| (*s, vec![])).collect();
    // clone(2) may not make namespaces (a user namespace would hand the
    // call capabilities of its own).
    for bit in 0..64 {
        let flag = 1u64 << bit;
        if NAMESPACE_FLAGS & flag != 0 {
            let c = cond(0, Len::Qword, Op::MaskedEq(flag), flag)?;
            deny.entry(libc::SYS_clone)
                .or_default()
                .push(rule(vec![c])?);
        }
    }
    // The kernel reads these arguments as `int`: only their low 32 bits
    // count, so only those are compared (high bits change nothing).
    // socket(2): a family outside the list, or netlink other than route.
    let other_family = SOCKET_FAMILIES
        .iter()
        .map(|f| cond(0, Len::Dword, Op::Ne, *f as u64))
        .collect::<Result<Vec<_>, _>>()?;
    let other_netlink = vec![
        cond(0, Len::Dword, Op::Eq, libc::AF_NETLINK as u64)?,
        cond(2, Len::Dword, Op::Ne, libc::NETLINK_ROUTE as u64)?,
    ];
    deny.insert(
        libc::SYS_socket,
        vec![rule(other_family)?, rule(other_netlink)?],
    );
    // socketpair(2) works for local sockets only anyway.
    deny.insert(
        libc::SYS_socketpair,
        vec![rule(vec![cond(
            0,
            Len::Dword,
            Op::Ne,
            libc::AF_UNIX as u64,
        )?])?],
    );
    // TCP Fast Open connects outside connect(2): a send carrying
    // MSG_FASTOPEN, or any write after TCP_FASTOPEN_CONNECT. Landlock's
    // port rule hooks connect(2) alone, so both are refused and a call
    // connects the ordinary way. The flags are the `int` at argument 3 of
    // sendto and sendmmsg and at 2 of sendmsg.
    let fastopen = |arg| -> Result<Vec<SeccompRule>, String> {
        Ok(vec![rule(vec![cond(
            arg,
            Len::Dword,
            Op::MaskedEq(MSG_FASTOPEN),
            MSG_FASTOPEN,
        )?])?])
    };
    deny.insert(libc::SYS_sendto, fastopen(3)?);
    deny.insert(libc::SYS_sendmsg, fastopen(2)?);
    deny.insert(libc::SYS_sendmmsg, fastopen(3)?);
    deny.insert(
        libc::SYS_setsockopt,
        vec![rule(vec![
            cond(1, Len::Dword, Op::Eq, libc::IPPROTO_TCP as u64)?,
            cond(2, Len::Dword, Op::Eq, TCP_FASTOPEN_CONNECT)?,
        ])?],
    );
    // personality(2) takes an `unsigned int` as well.
    let other_persona = PERSONALITY_ALLOWED
        .iter()
        .map(|p| cond(0, Len::Dword, Op::Ne, *p))
        .collect::<Result<Vec<_>, _>>()?;
    deny.insert(libc::SYS_personality, vec![rule(other_persona)?]);
    let eperm = SeccompFilter::new(
        deny,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    // clone3 passes its flags in memory, out of a filter's sight: answer
    // ENOSYS so libc falls back to clone(2), which is filtered above.
    let enosys = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let compile = |f: SeccompFilter| {
        f.try_into()
            .map_err(|e: seccompiler::BackendError| e.to_string())
    };
    Ok(vec![native_abi_only(), compile(eperm)?, compile(enosys)?])
}

/// The filters above compare system call numbers, and a number means
/// something only in its own ABI. This one, written by hand, holds the
/// call to the native ABI before any number is looked at:
///
/// - another architecture (`seccomp_data.arch`: i386 through `int $0x80`
///   on x86_64, arm32 on aarch64) kills the process. seccompiler's filters
///   already answer KILL_PROCESS there, and the kernel takes the most
///   restrictive answer of all filters, so ERRNO here would never be the
///   answer seen; KILL keeps this filter complete on its own;
/// - on x86_64, the x32 ABI shares the native `arch` value and marks its
///   numbers with bit 30 (`__X32_SYSCALL_BIT`), so `0x40000000 | 165` is
///   x32 `mount` and matched no rule: every such number answers EPERM,
///   like the deny-list (not ENOSYS: a kernel built without x32 already
///   answers ENOSYS, and the filter's answer should be told apart).
pub(super) fn native_abi_only() -> seccompiler::BpfProgram {
    use seccompiler::sock_filter;
    const LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS
    const JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
                             // offsetof(struct seccomp_data, nr / arch)
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    let stmt = |code, k| sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code, k, jt, jf| sock_filter { code, jt, jf, k };
    let mut prog = vec![
        stmt(LD_W_ABS, ARCH),
        jump(JEQ_K, NATIVE_AUDIT_ARCH, 1, 0),
        stmt(RET_K, libc::SECCOMP_RET_KILL_PROCESS),
    ];
    if cfg!(target_arch = "x86_64") {
        const JSET_K: u16 = 0x05 | 0x40; // BPF_JMP | BPF_JSET | BPF_K
        const X32_SYSCALL_BIT: u32 = 0x4000_0000;
        prog.extend([
            stmt(LD_W_ABS, NR),
            jump(JSET_K, X32_SYSCALL_BIT, 0, 1),
            stmt(RET_K, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        ]);
    }
    prog.push(stmt(RET_K, libc::SECCOMP_RET_ALLOW));
    prog
}

/// AUDIT_ARCH_* of the architecture this jail was built for.
#[cfg(target_arch = "x86_64")]
const NATIVE_AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const NATIVE_AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64
#[cfg(target_arch = "riscv64")]
const NATIVE_AUDIT_ARCH: u32 = 0xC000_00F3; // AUDIT_ARCH_RISCV64

pub(super) const ABI_USED: ABI = ABI::V6;

/// The ruleset over `fs` (and `tcp`). A rule's path beneath one of
/// `roots` is opened without following links ([`super::beneath`]): a link
/// there refuses the call rather than hang the rule on its target.
pub(super) fn landlock_ruleset(
    fs: &FsRules,
    tcp: Option<&TcpRules>,
    roots: &[PathBuf],
) -> Result<RulesetCreated, StepError> {
    let err = |e: landlock::RulesetError| e.to_string();
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(ABI_USED))
        .map_err(err)?;
    if tcp.is_some() {
        rs = rs
            .handle_access(AccessNet::from_all(ABI_USED))
            .map_err(err)?;
    }
    rs = rs.scope(Scope::from_all(ABI_USED)).map_err(err)?;
    let mut created = rs.create().map_err(err)?;
    let read = AccessFs::from_read(ABI_USED);
    let all = AccessFs::from_all(ABI_USED);
    // Beneath a kept tree, files may be made and written, never removed,
    // renamed away or truncated.
    let keeping: BitFlags<AccessFs> =
        all & !(AccessFs::RemoveFile | AccessFs::RemoveDir | AccessFs::Truncate);
    let mut rules: Vec<(PathBuf, BitFlags<AccessFs>)> = Vec::new();
    if fs.read_all {
        rules.push((PathBuf::from("/"), read));
    }
    rules.extend(fs.read.iter().map(|p| (p.clone(), read)));
    for p in &fs.write {
        let kept = |k: &PathBuf| p.starts_with(k);
        let holds_kept: Vec<PathBuf> = fs
            .keep
            .iter()
            .filter(|k| k.starts_with(p) && *k != p)
            .cloned()
            .collect();
        if fs.keep.iter().any(kept) {
            rules.push((p.clone(), keeping));
        } else if !holds_kept.is_empty() {
            // A tree that holds a kept one is granted around it: a rule
            // over the whole would grant removal inside it too.
            let mut beside = Vec::new();
            super::pertask::around(p, &holds_kept, &mut beside);
            rules.extend(beside.into_iter().map(|b| (b, all)));
            rules.extend(holds_kept.into_iter().map(|k| (k, keeping)));
        } else {
            rules.push((p.clone(), all));
        }
    }
    for (path, granted) in rules {
        let file = match beneath::open(&path, roots) {
            Ok(f) => f,
            Err(OpenError::Unsafe(why)) => return Err(StepError::Unsafe(why)),
            // A path that does not exist grants nothing; skipping it is exact.
            Err(OpenError::Io(_)) => continue,
        };
        let is_dir = file.metadata().is_ok_and(|m| m.is_dir());
        let mut access = granted;
        if !is_dir {
            access &= AccessFs::from_file(ABI_USED);
        }
        created = created
            .add_rule(PathBeneath::new(file, access))
            .map_err(err)?;
    }
    if let Some(t) = tcp {
        for p in &t.bind {
            created = created
                .add_rule(NetPort::new(*p, AccessNet::BindTcp))
                .map_err(err)?;
        }
        for p in &t.connect {
            created = created
                .add_rule(NetPort::new(*p, AccessNet::ConnectTcp))
                .map_err(err)?;
        }
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a classic-BPF program (the few instructions `native_abi_only`
    /// uses) over a `seccomp_data` of `nr` and `arch`.
    fn run(prog: &[seccompiler::sock_filter], nr: u32, arch: u32) -> u32 {
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = &prog[pc];
            pc += 1;
            match i.code {
                0x20 => acc = if i.k == 0 { nr } else { arch },
                0x15 => pc += usize::from(if acc == i.k { i.jt } else { i.jf }),
                0x45 => pc += usize::from(if acc & i.k != 0 { i.jt } else { i.jf }),
                0x06 => return i.k,
                c => panic!("unexpected instruction {c:#x}"),
            }
        }
    }

    #[test]
    fn only_the_native_abi_passes_the_hand_written_filter() {
        let prog = native_abi_only();
        let errno = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let getpid = libc::SYS_getpid as u32;
        assert_eq!(
            run(&prog, getpid, NATIVE_AUDIT_ARCH),
            libc::SECCOMP_RET_ALLOW
        );
        // i386 (int $0x80), arm32, and the other 64-bit one: killed
        // before any number is read.
        let foreign = [0x4000_0003, 0x4000_0028, 0xC000_003E, 0xC000_00B7];
        for arch in foreign.into_iter().filter(|a| *a != NATIVE_AUDIT_ARCH) {
            assert_eq!(
                run(&prog, getpid, arch),
                libc::SECCOMP_RET_KILL_PROCESS,
                "{arch:#x}"
            );
        }
        let x32 = 0x4000_0000 | libc::SYS_mount as u32;
        let expected = if cfg!(target_arch = "x86_64") {
            errno
        } else {
            libc::SECCOMP_RET_ALLOW
        };
        assert_eq!(run(&prog, x32, NATIVE_AUDIT_ARCH), expected);
    }

    #[test]
    fn the_filters_compile_and_deny_what_they_list() {
        let progs = seccomp_filters().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(progs.len(), 3);
        let unique: std::collections::BTreeSet<_> = DENIED_SYSCALLS.iter().collect();
        assert_eq!(unique.len(), DENIED_SYSCALLS.len(), "no duplicates");
    }
}
