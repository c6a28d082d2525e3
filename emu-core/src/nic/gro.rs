//! When the device's receive socket has `UDP_GRO` on.
//!
//! GRO lets a peer's GSO run (up to 64 KiB of same-size packets) arrive as one
//! datagram, which one receive takes with the segment size in a control message: bulk
//! traffic needs it, since without it the kernel splits every run as it delivers it,
//! in the sender's time. But a control message needs `recvmsg`, and for one datagram
//! at a time `recvfrom` costs less than `recvmsg` with room for the control message,
//! which a ping-pong pays on every half round trip (`rdma-emu bench send_lat
//! --busy-poll`; docs/performance.md).
//!
//! So the link turns GRO off after [`QUIET`] receives without a sign of bulk traffic,
//! and on again at the first backlog: a receive that took [`BULK`] datagrams or more
//! at once. A GRO run received, or such a backlog, counts as bulk while GRO is on.
//!
//! The kernel reports a run's segment size only while GRO is on, so a run queued
//! while it was on cannot be split once it is off. GRO therefore goes off only when
//! a receive has just found the socket empty, and the link looks again right after
//! the switch (`FIONREAD`): anything queued by then goes back to GRO on, and the
//! next quiet spell tries again. One case escapes that: a run the kernel checked
//! before the switch but queued after that look (a window of some hundred
//! nanoseconds in the sender's softirq, at the moment bulk traffic starts after a
//! quiet spell). It is read as one datagram, whose ICRC then fails: it is dropped
//! and counted like any damaged datagram, and RC sends it again.

/// Receives without a sign of bulk traffic after which GRO goes off (a few hundred
/// microseconds of a ping-pong).
pub(crate) const QUIET: u16 = 256;

/// Datagrams one receive must take for a backlog: only a batched receive can.
pub(crate) const BULK: usize = 4;

/// The GRO state of one receive socket; whoever holds the receive buffers owns it.
#[derive(Debug)]
pub(crate) struct Gro {
    /// The kernel has `UDP_GRO` (quinn-udp turned it on at bind).
    capable: bool,
    /// `UDP_GRO` is on.
    on: bool,
    /// `UDP_GRO` is off and the socket was empty when it went off, or found empty
    /// since: every datagram queued now was queued as a datagram of its own.
    plain: bool,
    /// Receives since the last sign of bulk traffic.
    quiet: u16,
}

impl Gro {
    /// The state of a socket that has GRO on if `capable`.
    pub(crate) fn new(capable: bool) -> Gro {
        Gro {
            capable,
            on: capable,
            plain: false,
            quiet: 0,
        }
    }

    /// Whether `UDP_GRO` is on.
    #[cfg(test)]
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// Whether a one-slot receive may read with `recvfrom` (no run can be queued).
    pub(crate) fn plain(&self) -> bool {
        self.plain
    }

    /// After a receive that took `msgs` datagrams or runs from the socket, `datagrams`
    /// once runs were split: where GRO should go, if it should switch. `Some(true)` at
    /// a backlog; `Some(false)` when this receive found the socket empty after
    /// [`QUIET`] receives without bulk. The caller sets the socket option and reports
    /// it with [`Gro::switched`].
    pub(crate) fn after_receive(&mut self, msgs: usize, datagrams: usize) -> Option<bool> {
        let bulk = msgs >= BULK || datagrams > msgs;
        if bulk {
            self.quiet = 0;
        } else {
            self.quiet = self.quiet.saturating_add(1);
        }
        if msgs == 0 && !self.on {
            self.plain = true;
        }
        if self.on {
            (msgs == 0 && self.quiet >= QUIET).then_some(false)
        } else {
            (bulk && self.capable).then_some(true)
        }
    }

    /// The socket option was set to `on`; `empty`: (off) the socket held nothing
    /// right after the switch.
    pub(crate) fn switched(&mut self, on: bool, empty: bool) {
        self.on = on;
        self.plain = !on && empty;
        self.quiet = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ping-pong's receives (one datagram or none at a time) turn GRO off at the
    /// first empty one after [`QUIET`] of them; `recvfrom` as soon as the socket was
    /// empty after the switch, else after the next empty receive.
    #[test]
    fn quiet_traffic_turns_gro_off_at_an_empty_receive() {
        let mut g = Gro::new(true);
        for i in 0..QUIET - 1 {
            let n = usize::from(i % 2 == 0);
            assert_eq!(g.after_receive(n, n), None, "receive {i}");
        }
        assert_eq!(g.after_receive(1, 1), None, "not while a datagram came");
        assert_eq!(g.after_receive(0, 0), Some(false));
        g.switched(false, true);
        assert!(!g.on() && g.plain());
        assert_eq!(g.after_receive(1, 1), None, "off stays off");
        let mut g = Gro::new(true);
        for _ in 0..QUIET {
            g.after_receive(0, 0);
        }
        g.switched(false, false);
        assert!(!g.on() && !g.plain());
        assert_eq!(g.after_receive(1, 1), None);
        assert!(
            !g.plain(),
            "a datagram found: a run queued before may follow"
        );
        assert_eq!(g.after_receive(0, 0), None);
        assert!(g.plain());
    }

    /// GRO runs and backlogs keep GRO on; a backlog turns it back on.
    #[test]
    fn bulk_traffic_keeps_gro_on_and_brings_it_back() {
        let mut g = Gro::new(true);
        for _ in 0..QUIET - 1 {
            assert_eq!(g.after_receive(0, 0), None);
        }
        assert_eq!(g.after_receive(1, 15), None, "a run is bulk");
        assert_eq!(g.after_receive(0, 0), None);
        for _ in 0..QUIET - 2 {
            g.after_receive(1, 1);
        }
        assert_eq!(g.after_receive(BULK, BULK), None, "a backlog is bulk");
        assert_eq!(g.after_receive(0, 0), None);
        for _ in 0..QUIET {
            g.after_receive(1, 1);
        }
        assert_eq!(g.after_receive(0, 0), Some(false));
        g.switched(false, true);
        assert_eq!(g.after_receive(BULK - 1, BULK - 1), None, "no backlog yet");
        assert_eq!(g.after_receive(BULK, BULK), Some(true));
        g.switched(true, true);
        assert!(g.on() && !g.plain());
    }

    /// A kernel without GRO: never switched on, `recvfrom` after the first empty
    /// receive.
    #[test]
    fn without_gro_in_the_kernel_receives_are_plain() {
        let mut g = Gro::new(false);
        assert!(!g.on());
        assert_eq!(g.after_receive(0, 0), None);
        assert!(g.plain());
        assert_eq!(g.after_receive(BULK * 4, BULK * 4), None);
        for _ in 0..QUIET {
            assert_eq!(g.after_receive(0, 0), None);
        }
    }
}
