//! The call's way out when it has a network namespace of its own: its
//! loopback is its own (not the host's, where the emulator — the whole
//! control plane — and every other local service listen), and the only
//! ways out are two relays a process of the jail runs beside the call:
//!
//! - an egress proxy on the call's 127.0.0.1:[`PROXY_PORT`]
//!   (`HTTPS_PROXY`): `CONNECT host:port` to a port the profile allows,
//!   resolved in the host's namespace and refused when any address the name
//!   has is not public ([`forbidden_ip`], the egress guard's rule) unless
//!   the operator listed the target;
//! - for a server the call starts (`serve`), its granted port on the host's
//!   loopback, bound only once the server listens in the call's namespace
//!   (so whoever waits for the port waits for the server), each connection
//!   carried into the call's namespace.
//!
//! The relay process is forked by the jail while it is root, before the
//! call is confined: it moves one thread to the host's network namespace
//! (threads that thread starts are there too), then drops to `nobody` for
//! good, and dies with the call (parent-death signal). It parses what the
//! call sends it, so it holds nothing and can do nothing but relay.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use armada_domain::egress::{forbidden_ip, HostPort};

/// Where the call reaches the egress proxy, on its own loopback.
pub const PROXY_PORT: u16 = 3128;
/// The uid and gid the relay runs as once set up.
const NOBODY: u32 = 65_534;
/// Longest request head the proxy reads.
const MAX_HEAD: usize = 8 * 1024;

/// What the relay carries for one call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRelay {
    /// Ports a `CONNECT` may name (the profile's egress ports).
    pub egress_ports: Vec<u16>,
    /// Targets the operator lists (`host:port`, `host:*`): reached even
    /// when private.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Host-loopback ports carried into the call's namespace (a server's).
    #[serde(default)]
    pub inbound: Vec<u16>,
}

impl EgressRelay {
    /// The environment that points a call's clients at the proxy.
    pub fn proxy_env() -> Vec<(String, String)> {
        let url = format!("http://127.0.0.1:{PROXY_PORT}");
        let mut env: Vec<(String, String)> =
            ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"]
                .iter()
                .map(|k| (k.to_string(), url.clone()))
                .collect();
        for k in ["NO_PROXY", "no_proxy"] {
            env.push((k.to_string(), "localhost,127.0.0.1,::1".to_string()));
        }
        env
    }
}

/// In the jail, as root and single-threaded, after its mount namespace:
/// gives the call a network namespace of its own and starts the relay
/// process beside it.
pub(super) fn start(spec: &EgressRelay) -> Result<(), String> {
    let host_net = File::open("/proc/self/ns/net").map_err(|e| format!("host netns: {e}"))?;
    crate::sys::unshare(libc::CLONE_NEWNET).map_err(|e| format!("network namespace: {e}"))?;
    crate::sys::loopback_up().map_err(|e| format!("loopback: {e}"))?;
    let proxy = TcpListener::bind(("127.0.0.1", PROXY_PORT))
        .map_err(|e| format!("the egress proxy's port: {e}"))?;
    match crate::fargate::sys::fork_single_threaded().map_err(|e| format!("fork: {e}"))? {
        0 => {
            let code = match crate::fargate::sys::die_with_parent_now() {
                Ok(()) => serve(proxy, host_net, spec),
                Err(_) => 1,
            };
            crate::fargate::sys::exit_now(code)
        }
        _ => Ok(()),
    }
}

/// The relay process: returns only if it could not be set up.
fn serve(proxy: TcpListener, host_net: File, spec: &EgressRelay) -> i32 {
    // The thread in the host's namespace: it makes each outgoing
    // connection and binds each inbound port, in threads of its own.
    let (to_host, jobs) = mpsc::channel::<HostJob>();
    let (ready_tx, ready) = mpsc::channel::<bool>();
    std::thread::spawn(move || {
        let moved = crate::sys::setns(host_net.as_fd(), libc::CLONE_NEWNET).is_ok();
        let _ = ready_tx.send(moved);
        if !moved {
            return;
        }
        for job in jobs {
            std::thread::spawn(move || job.run());
        }
    });
    if ready.recv() != Ok(true) {
        return 1;
    }
    // For good, for every thread: nothing it does needs a privilege now.
    if crate::sys::drop_privileges(NOBODY, NOBODY, &[NOBODY]).is_err() {
        return 1;
    }
    for port in spec.inbound.clone() {
        let to_host = to_host.clone();
        std::thread::spawn(move || inbound(port, to_host));
    }
    let allow: Vec<HostPort> = spec
        .allow
        .iter()
        .filter_map(|a| HostPort::parse(a, true))
        .collect();
    for conn in proxy.incoming() {
        let Ok(conn) = conn else { continue };
        let (to_host, ports, allow) = (to_host.clone(), spec.egress_ports.clone(), allow.clone());
        std::thread::spawn(move || {
            if let Some(job) = connect_request(conn, &ports, &allow) {
                let _ = to_host.send(job);
            }
        });
    }
    0
}

/// Work done in the host's network namespace.
enum HostJob {
    /// Reach `host:port` for the call and carry `client` there.
    Connect {
        client: TcpStream,
        host: String,
        port: u16,
        listed: bool,
    },
    /// Bind the host's loopback `port` and hand the listener back.
    Bind {
        port: u16,
        reply: mpsc::Sender<TcpListener>,
    },
}

impl HostJob {
    fn run(self) {
        match self {
            HostJob::Connect {
                mut client,
                host,
                port,
                listed,
            } => match reach(&host, port, listed) {
                Ok(up) => {
                    if client
                        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                        .is_ok()
                    {
                        crate::pipe::pipe(client, up);
                    }
                }
                Err(status) => refuse(&mut client, status),
            },
            HostJob::Bind { port, reply } => {
                // Until it binds (another process may hold the port a moment).
                loop {
                    if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
                        let _ = reply.send(l);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

/// The addresses of `host:port` the call may reach: every one public, or
/// the target listed by the operator. A status line otherwise.
fn reach(host: &str, port: u16, listed: bool) -> Result<TcpStream, &'static str> {
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => (host, port)
            .to_socket_addrs()
            .map_err(|_| "502 Bad Gateway")?
            .collect(),
    };
    if addrs.is_empty() {
        return Err("502 Bad Gateway");
    }
    if !listed && addrs.iter().any(|a| forbidden_ip(a.ip()).is_some()) {
        return Err("403 Forbidden");
    }
    addrs
        .iter()
        .find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(10)).ok())
        .ok_or("502 Bad Gateway")
}

fn refuse(client: &mut TcpStream, status: &str) {
    let _ = client.write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes());
    let _ = client.shutdown(Shutdown::Both);
}

/// Reads a `CONNECT host:port` request; the job that carries it, or the
/// refusal already answered.
fn connect_request(mut conn: TcpStream, ports: &[u16], allow: &[HostPort]) -> Option<HostJob> {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > MAX_HEAD {
            refuse(&mut conn, "431 Request Header Fields Too Large");
            return None;
        }
    }
    let _ = conn.set_read_timeout(None);
    let line = String::from_utf8_lossy(&head);
    let target = match line.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["CONNECT", target, ..] => target.to_string(),
        _ => {
            refuse(&mut conn, "405 Method Not Allowed");
            return None;
        }
    };
    let Some(hp) = HostPort::parse(&target, false) else {
        refuse(&mut conn, "400 Bad Request");
        return None;
    };
    let Some(port) = hp.port else {
        refuse(&mut conn, "400 Bad Request");
        return None;
    };
    let listed = allow.iter().any(|a| a.allows(&hp.host, port, port));
    if !listed && !ports.contains(&port) {
        refuse(&mut conn, "403 Forbidden");
        return None;
    }
    Some(HostJob::Connect {
        client: conn,
        host: hp.host,
        port,
        listed,
    })
}

/// Waits until the call's server listens on `port` in its namespace, then
/// has the host's loopback `port` bound and carries its connections in.
fn inbound(port: u16, to_host: mpsc::Sender<HostJob>) {
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (reply, listener) = mpsc::channel();
    if to_host.send(HostJob::Bind { port, reply }).is_err() {
        return;
    }
    let Ok(listener) = listener.recv() else {
        return;
    };
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        std::thread::spawn(move || {
            if let Ok(server) = TcpStream::connect(("127.0.0.1", port)) {
                crate::pipe::pipe(conn, server);
            }
        });
    }
}
