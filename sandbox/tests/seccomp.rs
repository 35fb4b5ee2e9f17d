//! The jail's seccomp filters, driven by real calls: Python's `ctypes`
//! makes raw system calls (`syscall(2)` with the native numbers, passed in
//! from `libc` so the script is the same on every architecture) and opens
//! sockets of every family, and the test reads back the errno of each.

#![allow(clippy::unwrap_used)]

use serde_json::{json, Value};

mod support;

use support::{call, fixture, py_json, sh};

const EPERM: i64 = libc::EPERM as i64;

/// Python that runs `syscall(nr, 0, 0, 0, 0, 0, 0)` for each `name: nr` of
/// `calls` and prints `{name: errno}` (0: it succeeded).
fn raw_syscalls(calls: &[(&str, i64)]) -> String {
    let table: serde_json::Map<String, Value> = calls
        .iter()
        .map(|(n, nr)| ((*n).into(), json!(nr)))
        .collect();
    format!(
        r#"
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {{}}
for name, nr in {table}.items():
    ctypes.set_errno(0)
    args = [ctypes.c_long(nr)] + [ctypes.c_long(0)] * 6
    out[name] = ctypes.get_errno() if libc.syscall(*args) == -1 else 0
print(json.dumps(out))
"#,
        table = Value::Object(table)
    )
}

#[tokio::test]
async fn the_deny_list_covers_io_uring_the_new_mount_api_and_process_reach() {
    let f = fixture("workspace");
    let mut calls = vec![
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
        ("fsopen", libc::SYS_fsopen),
        ("fsconfig", libc::SYS_fsconfig),
        ("fsmount", libc::SYS_fsmount),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("open_tree_attr", 467),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("fspick", libc::SYS_fspick),
        ("pidfd_getfd", libc::SYS_pidfd_getfd),
        ("process_madvise", libc::SYS_process_madvise),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("mount", libc::SYS_mount),
        ("unshare", libc::SYS_unshare),
    ];
    let out = py_json(&f, &raw_syscalls(&calls)).await;
    for (name, _) in calls.drain(..) {
        assert_eq!(out[name], EPERM, "{name}: {out}");
    }
    // Everyday calls are untouched.
    let ok = py_json(&f, &raw_syscalls(&[("getpid", libc::SYS_getpid)])).await;
    assert_eq!(ok["getpid"], 0, "{ok}");
}

#[tokio::test]
async fn personality_may_be_queried_but_not_changed() {
    let f = fixture("workspace");
    let code = r#"
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
def persona(p):
    ctypes.set_errno(0)
    return ctypes.get_errno() if libc.personality(ctypes.c_ulong(p)) == -1 else 0
# ADDR_NO_RANDOMIZE would turn ASLR off for whatever the call executes next;
# READ_IMPLIES_EXEC makes every readable mapping executable.
print(json.dumps({
    "query": persona(0xffffffff),
    "linux": persona(0),
    "no_randomize": persona(0x0040000),
    "read_implies_exec": persona(0x0400000),
    "high_bits_hide_nothing": persona(0x100040000),
}))
"#;
    let out = py_json(&f, code).await;
    assert_eq!(out["query"], 0, "{out}");
    assert_eq!(out["linux"], 0, "{out}");
    assert_eq!(out["no_randomize"], EPERM, "{out}");
    assert_eq!(out["read_implies_exec"], EPERM, "{out}");
    assert_eq!(out["high_bits_hide_nothing"], EPERM, "{out}");
}

#[cfg(target_arch = "x86_64")]
#[tokio::test]
async fn x32_system_calls_are_denied() {
    const X32: i64 = 0x4000_0000;
    let f = fixture("workspace");
    let out = py_json(
        &f,
        &raw_syscalls(&[
            ("x32_getpid", X32 | libc::SYS_getpid),
            ("x32_mount", X32 | libc::SYS_mount),
            ("x32_unshare", X32 | libc::SYS_unshare),
            ("x32_io_uring_setup", X32 | libc::SYS_io_uring_setup),
        ]),
    )
    .await;
    for name in [
        "x32_getpid",
        "x32_mount",
        "x32_unshare",
        "x32_io_uring_setup",
    ] {
        assert_eq!(out[name], EPERM, "{name}: {out}");
    }
}

/// A 32-bit system call from a 64-bit process (`int $0x80`) is a call of
/// another architecture: the process is killed (SIGSYS) before it runs.
#[cfg(target_arch = "x86_64")]
#[tokio::test]
async fn a_system_call_of_another_architecture_kills_the_process() {
    let f = fixture("workspace");
    let code = r#"
import ctypes, mmap
# mov eax, 20 (getpid in the i386 table); int 0x80; ret
code = bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3])
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(code)
f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
print("survived", f(), flush=True)
"#;
    let r = call(&f, "python_exec", json!({ "code": code }), 30).await;
    assert_eq!(r["exit_code"], 128 + libc::SIGSYS, "{r}");
    assert!(!r["stdout"].as_str().unwrap().contains("survived"), "{r}");
}

#[tokio::test]
async fn sockets_are_held_to_unix_inet_and_route_netlink() {
    let f = fixture("workspace");
    let code = r#"
import json, socket
def sock(family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close()
        return 0
    except OSError as e:
        return e.errno
def pair(family):
    try:
        for s in socket.socketpair(family, socket.SOCK_STREAM):
            s.close()
        return 0
    except OSError as e:
        return e.errno
print(json.dumps({
    "alg": sock(38, socket.SOCK_SEQPACKET),
    "vsock": sock(40, socket.SOCK_STREAM),
    "packet": sock(17, socket.SOCK_DGRAM),
    "netlink_uevent": sock(16, socket.SOCK_DGRAM, 15),
    "netlink_audit": sock(16, socket.SOCK_RAW, 9),
    "netlink_sock_diag": sock(16, socket.SOCK_RAW, 4),
    "bluetooth": sock(31, socket.SOCK_STREAM),
    "pair_inet": pair(socket.AF_INET),
    "inet": sock(socket.AF_INET, socket.SOCK_STREAM),
    "inet_udp": sock(socket.AF_INET, socket.SOCK_DGRAM),
    "inet6": sock(socket.AF_INET6, socket.SOCK_STREAM),
    "unix": sock(socket.AF_UNIX, socket.SOCK_STREAM),
    "netlink_route": sock(16, socket.SOCK_RAW, 0),
    "pair_unix": pair(socket.AF_UNIX),
}))
"#;
    let out = py_json(&f, code).await;
    for denied in [
        "alg",
        "vsock",
        "packet",
        "netlink_uevent",
        "netlink_audit",
        "netlink_sock_diag",
        "bluetooth",
        "pair_inet",
    ] {
        assert_eq!(out[denied], EPERM, "{denied}: {out}");
    }
    for allowed in ["inet", "inet_udp", "unix", "netlink_route", "pair_unix"] {
        assert_eq!(out[allowed], 0, "{allowed}: {out}");
    }
    assert_ne!(out["inet6"], EPERM, "{out}");
    // Name resolution (glibc asks route netlink for the interfaces).
    let r = sh(
        &f,
        "python3 -c 'import socket; print(socket.getaddrinfo(\"localhost\", 80, flags=socket.AI_ADDRCONFIG)[0][0] > 0)'",
    )
    .await;
    assert_eq!(r["stdout"], "True\n", "{r}");
}

/// TCP Fast Open connects without connect(2), where Landlock's port rule
/// sits: a send with MSG_FASTOPEN and the TCP_FASTOPEN_CONNECT option are
/// refused, even towards a port the call may reach; the ordinary ways of
/// connecting and sending are not.
#[tokio::test]
async fn tcp_fast_open_is_refused_and_ordinary_sends_are_not() {
    // The call's egress proxy (its own loopback's 3128) is a port the
    // call may reach: without the filter's rule each Fast Open send would
    // connect (and answer 0), so only seccomp can make it EPERM.
    let port = armada_sandbox::jail::relay::PROXY_PORT;
    let f = fixture("workspace");
    let code = format!(
        r#"
import ctypes, json, socket
MSG_FASTOPEN, TCP_FASTOPEN_CONNECT = 0x20000000, 30
ADDR = ("127.0.0.1", {port})
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def attempt(f):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        f(s)
        return 0
    except OSError as e:
        return e.errno
    finally:
        s.close()
def sendmmsg(s):
    ctypes.set_errno(0)
    args = [{sendmmsg}, s.fileno(), 0, 0, MSG_FASTOPEN]
    if libc.syscall(*[ctypes.c_long(a) for a in args]) == -1:
        raise OSError(ctypes.get_errno(), "sendmmsg")
def udp_sendto():
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.bind(("127.0.0.1", 0))
    r.settimeout(10)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.sendto(b"plain", r.getsockname())
        # Sent is not yet received: the datagram must arrive as well.
        return 0 if r.recv(16) == b"plain" else -1
    except OSError as e:
        return e.errno
    finally:
        u.close()
        r.close()
print(json.dumps({{
    "sendto_fastopen": attempt(lambda s: s.sendto(b"x", MSG_FASTOPEN, ADDR)),
    "sendto_fastopen_nosignal": attempt(
        lambda s: s.sendto(b"x", MSG_FASTOPEN | socket.MSG_NOSIGNAL, ADDR)),
    "sendmsg_fastopen": attempt(lambda s: s.sendmsg([b"x"], [], MSG_FASTOPEN, ADDR)),
    "sendmmsg_fastopen": attempt(sendmmsg),
    "fastopen_connect": attempt(
        lambda s: s.setsockopt(socket.IPPROTO_TCP, TCP_FASTOPEN_CONNECT, 1)),
    "nodelay": attempt(lambda s: s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)),
    "connect_send": attempt(lambda s: (s.connect(ADDR), s.send(b"plain"))),
    "connect_sendto": attempt(lambda s: (s.connect(ADDR), s.sendto(b"plain", 0, ADDR))),
    "udp_sendto": udp_sendto(),
}}))
"#,
        sendmmsg = libc::SYS_sendmmsg,
    );
    let out = py_json(&f, &code).await;
    for denied in [
        "sendto_fastopen",
        "sendto_fastopen_nosignal",
        "sendmsg_fastopen",
        "sendmmsg_fastopen",
        "fastopen_connect",
    ] {
        assert_eq!(out[denied], EPERM, "{denied}: {out}");
    }
    for allowed in ["nodelay", "connect_send", "connect_sendto", "udp_sendto"] {
        assert_eq!(out[allowed], 0, "{allowed}: {out}");
    }
}

#[tokio::test]
async fn ordinary_workloads_still_run_under_the_filters() {
    let f = fixture("workspace");
    let r = sh(
        &f,
        "set -e; git init -q repo; cd repo; echo hi > a; git add a; \
         git -c user.email=a@b -c user.name=a commit -q -m one; git log --oneline | wc -l; \
         (sleep 0.1 & wait); tar -czf ../a.tgz . && echo tarred",
    )
    .await;
    assert_eq!(r["stdout"], "1\ntarred\n", "{r}");
    let code = "import subprocess, threading, asyncio, multiprocessing\n\
                t = threading.Thread(target=lambda: None); t.start(); t.join()\n\
                print(subprocess.run(['sh', '-c', 'echo sub'], capture_output=True, text=True).stdout, end='')\n\
                print(asyncio.run(asyncio.sleep(0, result='async')))\n";
    let r = call(&f, "python_exec", json!({ "code": code }), 30).await;
    assert_eq!(r["stdout"], "sub\nasync\n", "{r}");
}
