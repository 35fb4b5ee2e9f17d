//! What the jail enforces in the kernel: the seccomp deny-list (with the
//! namespace-creating clone flags) and the Landlock ruleset over the
//! filesystem and TCP ports.

use std::collections::BTreeMap;
use std::path::PathBuf;

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};

use super::{FsRules, TcpRules};

/// System calls no skill needs and every escape wants.
pub(super) const DENIED_SYSCALLS: [i64; 29] = [
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
];

pub(super) const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

pub(super) fn seccomp_filters() -> Result<Vec<seccompiler::BpfProgram>, String> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED_SYSCALLS.iter().map(|s| (*s, vec![])).collect();
    // clone(2) may not make namespaces (a user namespace would hand the
    // call capabilities of its own).
    for bit in 0..64 {
        let flag = 1u64 << bit;
        if NAMESPACE_FLAGS & flag != 0 {
            let cond = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .map_err(|e| e.to_string())?;
            deny.entry(libc::SYS_clone)
                .or_default()
                .push(SeccompRule::new(vec![cond]).map_err(|e| e.to_string())?);
        }
    }
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
    Ok(vec![
        eperm
            .try_into()
            .map_err(|e: seccompiler::BackendError| e.to_string())?,
        enosys
            .try_into()
            .map_err(|e: seccompiler::BackendError| e.to_string())?,
    ])
}

pub(super) const ABI_USED: ABI = ABI::V6;

pub(super) fn landlock_ruleset(
    fs: &FsRules,
    tcp: Option<&TcpRules>,
) -> Result<RulesetCreated, String> {
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
    let mut rules: Vec<(PathBuf, bool)> = Vec::new();
    if fs.read_all {
        rules.push((PathBuf::from("/"), false));
    }
    rules.extend(fs.read.iter().map(|p| (p.clone(), false)));
    rules.extend(fs.write.iter().map(|p| (p.clone(), true)));
    for (path, write) in rules {
        // A path that does not exist grants nothing; skipping it is exact.
        let Ok(fd) = PathFd::new(&path) else { continue };
        let is_dir = path.is_dir();
        let mut access = if write { all } else { read };
        if !is_dir {
            access &= AccessFs::from_file(ABI_USED);
        }
        created = created
            .add_rule(PathBeneath::new(fd, access))
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
