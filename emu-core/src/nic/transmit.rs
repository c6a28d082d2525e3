//! Transmit batching and ACK ordering: what the engine hands out goes to the link as
//! runs of packets (one destination, one size: one GSO send on UDP), positive ACKs
//! held back behind the requests of the same flush (see [`PacketKind`]), and the
//! engine's notifications handed out after each flush.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Core, Inner, Route, Transmit};
use crate::engine::{Engine, PacketKind, MAX_PACKET};

/// A run of packets being gathered in one buffer, as the engine writes them.
pub(super) struct TxBatch {
    buf: Vec<u8>,
    /// Bytes in the run.
    fill: usize,
    /// Packets in the run.
    pub(super) count: usize,
    /// The size of each packet of the run.
    segment: usize,
    /// The address the run leaves from (one of the device's, `Inner::link_addresses`).
    src: IpAddr,
    dst: IpAddr,
    /// The TOS byte (traffic class) every packet of the run carries.
    tos: u8,
}

impl TxBatch {
    pub(super) fn new(capacity: usize) -> TxBatch {
        TxBatch {
            buf: vec![0; capacity],
            fill: 0,
            count: 0,
            segment: 0,
            src: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            dst: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            tos: 0,
        }
    }

    /// Whether a packet of `size` bytes from `src` to `dst` with TOS `tos` can join
    /// the run.
    pub(super) fn fits(
        &self,
        (src, dst): (IpAddr, IpAddr),
        size: usize,
        tos: u8,
        max_batch: usize,
    ) -> bool {
        self.count == 0
            || (dst == self.dst
                && src == self.src
                && tos == self.tos
                && size == self.segment
                && self.fill + size <= self.buf.len()
                && self.count < max_batch)
    }

    /// Moves all of `other` (a run to the same peer) to the end of this run, in
    /// order, if that makes a valid run: `other`'s packets have this run's size, or
    /// `other` is a single shorter packet (a run's last segment may be shorter), and
    /// there is room. Returns whether it did.
    pub(super) fn absorb(&mut self, other: &mut TxBatch, max_batch: usize) -> bool {
        let shape =
            other.segment == self.segment || (other.count == 1 && other.segment < self.segment);
        if self.count == 0
            || other.count == 0
            || other.dst != self.dst
            || other.src != self.src
            || other.tos != self.tos
            || !shape
            || self.count + other.count > max_batch
            || self.fill + other.fill > self.buf.len()
        {
            return false;
        }
        verbs_api::copy_bytes(
            &mut self.buf[self.fill..self.fill + other.fill],
            &other.buf[..other.fill],
        );
        self.fill += other.fill;
        self.count += other.count;
        other.clear();
        true
    }

    /// Where the run goes.
    fn route(&self) -> Route {
        Route {
            src: self.src,
            dst: self.dst,
            tos: self.tos,
        }
    }

    /// Empties the run (after it was sent or moved elsewhere).
    pub(super) fn clear(&mut self) {
        self.fill = 0;
        self.count = 0;
    }

    /// Appends a packet that [`TxBatch::fits`].
    pub(super) fn push(&mut self, (src, dst): (IpAddr, IpAddr), tos: u8, packet: &[u8]) {
        if self.count == 0 {
            self.src = src;
            self.dst = dst;
            self.tos = tos;
            self.segment = packet.len();
        }
        verbs_api::copy_bytes(&mut self.buf[self.fill..self.fill + packet.len()], packet);
        self.fill += packet.len();
        self.count += 1;
    }
}

impl Inner {
    pub(super) fn with_engine<R>(&self, f: impl FnOnce(&mut Engine, Instant) -> R) -> R {
        let mut core = self.core.lock();
        let now = self.link.now();
        let r = f(&mut core.engine, now);
        self.flush(&mut core, now, false);
        drain_notes(&mut core);
        self.unlock_waking(core);
        r
    }

    /// Whether a post may leave its last, partial run of packets in the batch buffer
    /// (a doorbell batched with the next ones): only on UDP, and only while the
    /// application polls its CQs (the next `poll_cq`, or a wait, sends it first) and
    /// the device thread naps (it sends what is left when it wakes, within [`NAP`]).
    /// Posts to many QPs between two polls then leave in one GSO send instead of one
    /// syscall each.
    pub(super) fn may_defer(&self) -> bool {
        // Only while the device thread naps (the UDP device's: not on a fabric or the
        // shared-memory link, whose threads never nap so), and not where every packet
        // is its own send anyway (interop mode, a hook).
        // Nor while a thread waits for an event receiving (`wait_receiving`): it does
        // not poll, so nothing would send the rest before the device thread's nap ends.
        self.napping.load(Ordering::Acquire)
            && self.link.max_segments() > 1
            && self.waiters.load(Ordering::Acquire) == 0
    }

    /// Sends what a deferred post left in the batch buffer.
    pub(super) fn flush_pending(&self) {
        self.flush_pending_locked(&mut self.core.lock());
    }

    /// [`Inner::flush_pending`] with the engine's lock taken.
    pub(super) fn flush_pending_locked(&self, core: &mut Core) {
        if core.holds_packets() {
            let now = self.link.now();
            self.flush(core, now, false);
            drain_notes(core);
        }
    }

    /// Sends what the engine wants sent and hands out its notifications. The engine
    /// writes each packet straight after the previous one in the run buffer; a packet
    /// that cannot join the run (another peer, another size, or no room) sends the run
    /// and starts the next.
    ///
    /// On a link that sends runs (`max_segments` above 1: UDP with GSO), positive ACKs
    /// go to a second run that leaves after the requests: a responder that answers a
    /// message with a message (a ping-pong) sends its answer before the ACK of the
    /// question, which is off the round trip's critical path.
    /// Any other response (a READ response, an atomic ACK, a NAK) sends the held ACKs
    /// first, so the responder's packets keep their order. A deferred flush (`defer`)
    /// still sends a run that can carry held ACKs to its peer: it answers that peer,
    /// and a one-packet answer leaves ahead of those ACKs as a datagram of its own
    /// (with a single held ACK, both in one [`Link::send`] call).
    pub(super) fn flush(&self, core: &mut Core, now: Instant, defer: bool) {
        let Core {
            engine,
            tx,
            acks,
            lent,
            peers: _,
            note_sink,
        } = core;
        // Notes first: they come before the packets their input sent.
        if let Some(sink) = note_sink {
            engine.drain_notes(|n| sink.note(n));
        }
        if let Some(buf) = lent.take().or_else(|| self.link.lend()) {
            self.send_lent(engine, now, buf, lent);
            self.notify(engine);
            return;
        }
        let max_batch = self.link.max_segments().max(1);
        let hold_acks = !acks.buf.is_empty() && max_batch > 1;
        loop {
            if tx.count > 0 && (tx.fill + MAX_PACKET > tx.buf.len() || tx.count >= max_batch) {
                self.send_run(tx);
            }
            let Some(t) = engine.poll_transmit(now, &mut tx.buf[tx.fill..tx.fill + MAX_PACKET])
            else {
                break;
            };
            let Some(ends) = self.link_addresses(&t) else {
                continue;
            };
            let (src, dst) = ends;
            if hold_acks {
                if t.kind == PacketKind::PositiveAck {
                    if !acks.fits(ends, t.size, t.traffic_class, max_batch) {
                        self.send_run(acks);
                    }
                    acks.push(ends, t.traffic_class, &tx.buf[tx.fill..tx.fill + t.size]);
                    continue;
                }
                if acks.count > 0 && t.kind == PacketKind::Response {
                    // Keep the responder's order: the held ACKs go first.
                    if tx.count > 0 {
                        let at = tx.fill;
                        self.send_run(tx);
                        tx.buf.copy_within(at..at + t.size, 0);
                    }
                    self.send_run(acks);
                }
            }
            if tx.count > 0
                && (dst != tx.dst
                    || src != tx.src
                    || t.size != tx.segment
                    || t.traffic_class != tx.tos)
            {
                // The new packet sits after the run: send the run, move it to the front.
                let at = tx.fill;
                self.send_run(tx);
                tx.buf.copy_within(at..at + t.size, 0);
            }
            if tx.count == 0 {
                tx.src = src;
                tx.dst = dst;
                tx.tos = t.traffic_class;
                tx.segment = t.size;
            }
            tx.fill += t.size;
            tx.count += 1;
        }
        // A run to a peer whose requests wait for their ACK here answers that peer (a
        // ping-pong's answer): it leaves now, with the ACKs, rather than at the next
        // poll; batching it with later posts would only delay both. The ACKs leave with
        // it, so the rest of a burst of posts finds none and still waits for the poll.
        let answers = tx.count > 0 && acks.count > 0 && acks.dst == tx.dst && acks.src == tx.src;
        if !defer || answers {
            if answers && tx.count == 1 && acks.count == 1 && tx.tos == acks.tos {
                // A ping-pong's answer and the ACK of the question: the order below,
                // in one system call rather than two (`bench send_lat --busy-poll`).
                self.send_pair(tx, acks);
            }
            if tx.count > 0 {
                // A lone answer leaves alone and its ACKs after it: on loopback a
                // send delivers to the peer's socket before it returns, so the ACK
                // segment would delay the answer by its own delivery (`bench
                // send_lat --busy-poll`). Held ACKs ride at the end of a longer run:
                // one send instead of two.
                if tx.count > 1 {
                    tx.absorb(acks, max_batch);
                }
                self.send_run(tx);
            }
            if acks.count > 0 {
                self.send_run(acks);
            }
        } else if tx.count > 0 && !self.link.runs_wait_to(tx.route()) {
            // A run that would not grow into one send (a peer on the rings) leaves
            // now: waiting for the next poll only delays it.
            self.send_run(tx);
        }
        self.notify(engine);
    }

    /// Hands out the engine's completion-channel wake-ups and async events.
    pub(super) fn notify(&self, engine: &mut Engine) {
        while let Some(cq) = engine.poll_cq_event() {
            let channel = self.cq_channel.lock().get(&cq.0).copied();
            if let Some(ch) = channel.and_then(|c| self.channels.lock().get(&c).cloned()) {
                ch.push(cq);
            }
        }
        while let Some(ev) = engine.poll_event() {
            self.events.push(ev);
        }
    }

    /// Sends what the engine wants sent on a link that lends buffers ([`Link::lend`]):
    /// each packet is written straight into a lent buffer, which the link keeps (no
    /// copy). The buffer left over waits in `spare` for the next flush.
    pub(super) fn send_lent(
        &self,
        engine: &mut Engine,
        now: Instant,
        mut buf: Vec<u8>,
        spare: &mut Option<Vec<u8>>,
    ) {
        loop {
            if buf.len() < MAX_PACKET {
                buf.resize(MAX_PACKET, 0);
            }
            let Some(t) = engine.poll_transmit(now, &mut buf[..MAX_PACKET]) else {
                break;
            };
            let Some((src, dst)) = self.link_addresses(&t) else {
                continue;
            };
            let route = Route {
                src,
                dst,
                tos: t.traffic_class,
            };
            if let Err(e) = self.link.send_owned(route, buf, t.size) {
                self.send_failed(&e, 1, t.size);
            }
            match self.link.lend() {
                Some(b) => buf = b,
                None => return,
            }
        }
        *spare = Some(buf);
    }

    /// Sends the one packet of `first` and then the one of `then`, to the same peer,
    /// in one [`Link::send`] (one `sendmmsg` on UDP), and empties both.
    pub(super) fn send_pair(&self, first: &mut TxBatch, then: &mut TxBatch) {
        let (a, b) = (first.route(), then.route());
        let r = self.link.send(&mut [
            Transmit::one(a, &mut first.buf[..first.fill]),
            Transmit::one(b, &mut then.buf[..then.fill]),
        ]);
        if let Err(e) = r {
            self.send_failed(&e, 2, first.fill.max(then.fill));
        }
        first.clear();
        then.clear();
    }

    /// Hands the gathered run to the link and empties it.
    pub(super) fn send_run(&self, tx: &mut TxBatch) {
        let segment_size = if tx.count == 1 { tx.fill } else { tx.segment };
        let route = tx.route();
        let r = self.link.send(&mut [Transmit {
            route,
            contents: &mut tx.buf[..tx.fill],
            segment_size,
        }]);
        if let Err(e) = r {
            let size = if tx.count == 1 { tx.fill } else { tx.segment };
            self.send_failed(&e, tx.count, size);
        }
        tx.clear();
    }
}

/// Hands the engine's notes to the note sink, if any (what sending did: timers armed,
/// UC completions).
pub(super) fn drain_notes(core: &mut Core) {
    if let Some(sink) = &core.note_sink {
        core.engine.drain_notes(|n| sink.note(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_one_destination_and_size_up_to_its_limits() {
        let me = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9));
        let a = (me, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        let b = (me, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
        // The same peer from another address of the device (one on both families).
        let other_src = (IpAddr::V6("fe80::9".parse().unwrap()), a.1);
        let mut t = TxBatch::new(64);
        assert!(t.fits(a, 20, 0, 2));
        t.push(a, 0, &[1; 20]);
        assert!(t.fits(a, 20, 0, 2));
        assert!(!t.fits(b, 20, 0, 2));
        assert!(!t.fits(other_src, 20, 0, 2));
        assert!(!t.fits(a, 24, 0, 2));
        assert!(!t.fits(a, 20, 0xB8, 2), "another traffic class");
        t.push(a, 0, &[2; 20]);
        assert!(!t.fits(a, 20, 0, 2), "max_batch");
        assert!(t.fits(a, 20, 0, 4));
        t.push(a, 0, &[3; 20]);
        assert!(!t.fits(a, 20, 0, 8), "room");
        assert_eq!((t.count, t.fill, t.segment, (t.src, t.dst)), (3, 60, 20, a));
        assert_eq!(&t.buf[40..60], &[3; 20]);
    }

    #[test]
    fn a_run_absorbs_same_size_packets_or_one_shorter_last_one() {
        let me = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9));
        let a = (me, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        let b = (me, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
        let run = |ends: (IpAddr, IpAddr), size: usize, n: u8| {
            let mut t = TxBatch::new(256);
            for i in 0..n {
                t.push(ends, 0, &vec![i + 1; size]);
            }
            t
        };
        // One shorter packet becomes the last segment.
        let (mut tx, mut acks) = (run(a, 24, 2), run(a, 20, 1));
        assert!(tx.absorb(&mut acks, 64));
        assert_eq!((tx.count, tx.fill, acks.count, acks.fill), (3, 68, 0, 0));
        assert_eq!(&tx.buf[48..68], &[1; 20]);
        // Two shorter ones cannot both be last; another peer, a longer packet, an
        // empty run or max_batch refuse too, and leave both runs as they were.
        let (mut tx, mut acks) = (run(a, 24, 2), run(a, 20, 2));
        assert!(!tx.absorb(&mut acks, 64));
        assert_eq!((tx.count, acks.count), (2, 2));
        assert!(!run(a, 24, 1).absorb(&mut run(b, 20, 1), 64));
        let other_src = (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 8)), a.1);
        assert!(!run(a, 20, 1).absorb(&mut run(other_src, 20, 1), 64));
        assert!(!run(a, 20, 1).absorb(&mut run(a, 24, 1), 64));
        assert!(!run(a, 20, 0).absorb(&mut run(a, 20, 1), 64));
        assert!(!run(a, 20, 2).absorb(&mut run(a, 20, 1), 2));
        let mut other_class = run(a, 20, 1);
        other_class.tos = 0xB8;
        assert!(!run(a, 20, 1).absorb(&mut other_class, 64));
        // Same size: all of them, in order.
        let (mut tx, mut acks) = (run(a, 20, 2), run(a, 20, 3));
        assert!(tx.absorb(&mut acks, 64));
        assert_eq!(tx.count, 5);
        assert_eq!(
            tx.buf[40..100].chunks(20).map(|c| c[0]).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        // No room in the buffer.
        let (mut tx, mut acks) = (run(a, 20, 12), run(a, 20, 1));
        assert!(!tx.absorb(&mut acks, 64));
    }
}
