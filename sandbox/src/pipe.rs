//! Two TCP connections joined: what either sends the other receives,
//! until one side closes (the relays' way of carrying a connection).

use std::net::{Shutdown, TcpStream};

/// Copies both ways until either side closes; returns when both are done.
pub fn pipe(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let one = std::thread::spawn(move || copy(a, b));
    copy(b2, a2);
    let _ = one.join();
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}
