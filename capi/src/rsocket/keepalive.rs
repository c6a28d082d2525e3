//! Keepalive probes (`SO_KEEPALIVE`; rsocket.c's `tcp_svc`): every `TCP_KEEPIDLE`
//! seconds a connected rsocket with the option on sends a KEEPALIVE control message.
//! The peer only takes a receive for it; the point is the sender's: a probe to a peer
//! that is gone completes in error, and the rsocket turns to error (EIO in SO_ERROR,
//! POLLERR from rpoll) instead of waiting for data forever.
//!
//! One thread serves the process, started by the first rsocket that turns the
//! option on; it looks once a second.

use std::sync::Once;
use std::time::{Duration, Instant};

use super::data::{msg, st, CTRL_KEEPALIVE, OP_CTRL};
use super::{Sock, SOCKETS};

/// The seconds librdmacm takes when no TCP_KEEPIDLE was set: the kernel's TCP
/// keepalive time.
pub(crate) fn default_time() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_keepalive_time")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(7200)
}

/// Starts the keepalive thread (once per process).
pub(crate) fn start() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("rsocket-keepalive".into())
            .spawn(|| loop {
                std::thread::sleep(Duration::from_secs(1));
                tick(Instant::now());
            });
        if spawned.is_err() {
            eprintln!("rdma-emu librdmacm: cannot start the rsocket keepalive thread");
        }
    });
}

/// One look at every rsocket: the probes due now go.
fn tick(now: Instant) {
    let socks: Vec<_> = SOCKETS.lock().values().cloned().collect();
    for rs in socks {
        let mut s = rs.s.lock();
        probe(&mut s, now);
    }
}

/// Sends `s`'s probe if it is due (and a control slot is free, as rsocket.c
/// `tcp_svc_send_keepalive`), and sets the next time.
fn probe(s: &mut Sock, now: Instant) {
    if s.so_opts & (1 << libc::SO_KEEPALIVE) == 0 || s.state & st::CONNECTED == 0 {
        return;
    }
    let period = Duration::from_secs(u64::from(s.keepalive_time.max(1)));
    let due = *s.keepalive_next.get_or_insert(now + period);
    if now < due {
        return;
    }
    s.keepalive_next = Some(now + period);
    let Some(c) = s.conn.as_mut() else {
        return;
    };
    if c.ctrl_avail() {
        c.ctrl_seqno = c.ctrl_seqno.wrapping_add(1);
        if let Err(e) = c.post_msg(msg(OP_CTRL, CTRL_KEEPALIVE)) {
            s.state = st::ERROR;
            s.err = e;
        }
    }
}
