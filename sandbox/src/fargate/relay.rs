//! The task's way to the AWS endpoints when it has no egress (what a VPC
//! endpoint is on Fargate): inside the task's network namespace the
//! launcher listens on 127.0.0.1:<port>, and each connection the agent
//! makes is carried to the host's 127.0.0.1:<port> (the emulator) by a
//! thread that has joined the host's network namespace. A connection from
//! any uid but the agent's (root) is closed at once: a real endpoint wants
//! the task's credentials, which a call never holds, and the emulator
//! checks none.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsFd;

/// Accepts connections until the listener fails.
pub(super) fn serve(listener: TcpListener, mut table: File, host_net: File, port: u16) {
    let host_net = std::sync::Arc::new(host_net);
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let peer = conn.peer_addr().map(|a| a.port()).unwrap_or(0);
        if owner(&mut table, peer, port) != Some(0) {
            let _ = conn.shutdown(Shutdown::Both);
            continue;
        }
        let host_net = host_net.clone();
        std::thread::spawn(move || {
            if crate::sys::setns(host_net.as_fd(), libc::CLONE_NEWNET).is_err() {
                return;
            }
            if let Ok(up) = TcpStream::connect(("127.0.0.1", port)) {
                crate::pipe::pipe(conn, up);
            }
        });
    }
}

/// The uid owning the loopback socket of local port `peer` connected to
/// `port`, from the namespace's TCP table (`/proc/net/tcp`).
fn owner(table: &mut File, peer: u16, port: u16) -> Option<u32> {
    let mut text = String::new();
    table.seek(SeekFrom::Start(0)).ok()?;
    table.read_to_string(&mut text).ok()?;
    owner_in(&text, peer, port)
}

fn owner_in(text: &str, peer: u16, port: u16) -> Option<u32> {
    let local = format!("0100007F:{peer:04X}");
    let remote = format!("0100007F:{port:04X}");
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 7 && f[1] == local && f[2] == remote)
            .then(|| f[7].parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_read_from_the_socket_of_the_peers_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:11D6 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n\
   1: 0100007F:A1B2 0100007F:11D6 01 00000000:00000000 00:00000000 00000000 300001        0 2 1\n\
   2: 0100007F:C3D4 0100007F:11D6 01 00000000:00000000 00:00000000 00000000     0        0 3 1\n";
        assert_eq!(owner_in(table, 0xA1B2, 4566), Some(300_001));
        assert_eq!(owner_in(table, 0xC3D4, 4566), Some(0));
        assert_eq!(owner_in(table, 0xC3D4, 4567), None);
        assert_eq!(owner_in(table, 0x1111, 4566), None);
    }
}
