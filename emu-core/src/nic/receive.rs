//! The receive path: datagrams off the UDP socket, each ICRC checked outside the
//! engine's lock, into the engine; by the device thread, by an application's
//! `poll_cq` (inline, run to completion) or by a thread waiting for its event.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use verbs_api::{errno, CqId, Error, Result, WorkCompletion};

use super::udp::{RxBufs, UdpLink};
use super::{EmuDevice, Inner};
use crate::engine::{connected_dest_qpn, PacketKind};
use crate::notify::Notifier;

/// Who receives, which decides how ([`Inner::receive`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Receiver {
    /// The device thread, a thread waiting for its event, or the hand-over of what an
    /// inline receive left: waits for the receive lock, hands the engine every
    /// datagram taken and sends all it answers.
    Thread,
    /// The application's `poll_cq`: receives only if no other thread is, leaves the
    /// positive ACKs at the end of a batch for the next call (see
    /// [`before_trailing_acks`]) and, with `defer`, leaves its last partial run of
    /// packets for the next flush.
    Poll {
        /// Leave the last partial run for the next flush (see `Inner::may_defer`).
        defer: bool,
    },
}

/// Whether a received `packet` is a positive ACK (see [`PacketKind`]).
fn is_positive_ack(packet: &[u8]) -> bool {
    PacketKind::of(packet) == Some(PacketKind::PositiveAck)
}

/// How many of a received batch of `n` datagrams to hand the engine at once when the
/// application waits for their completions: all but the positive ACKs at the end
/// (`is_ack(i)` tells), unless the batch is nothing else. An ACK and the requests
/// before it belong to different PSN spaces (the ACK to our requester's, the requests
/// to our responder's), which the engine orders each on its own, so the ACK may be
/// handled after the completions the requests make; it is handled at the next poll
/// or by the device thread within a nap, far inside the requester's local ACK timeout
/// (IBTA 9.7.6.1.3).
pub(super) fn before_trailing_acks(n: usize, is_ack: impl Fn(usize) -> bool) -> usize {
    (0..n).rev().find(|&i| !is_ack(i)).map_or(n, |i| i + 1)
}

impl EmuDevice {
    /// Takes the next event of completion channel `ch`, receiving in the caller's
    /// thread while it waits: it sleeps on the socket and the channel together, and
    /// a datagram wakes it alone, which receives it, runs it through the engine and
    /// finds its own event, without the device thread in between (one wake-up per
    /// message, as a blocking socket program has). The device thread naps meanwhile
    /// and keeps the timers; an event another thread makes (a timer, another
    /// receiver) wakes the waiter through the channel's descriptor. A signal handler
    /// that runs meanwhile ends the wait with `EINTR`, as it ends the read(2) in
    /// libibverbs' `ibv_get_cq_event` (unless an event is there by then).
    pub(super) fn wait_receiving(
        &self,
        udp: &UdpLink,
        ch: &Notifier<CqId>,
        timeout: Option<Duration>,
    ) -> Result<CqId> {
        let inner = &self.inner;
        let deadline = timeout.map(|t| Instant::now() + t);
        inner.flush_pending();
        inner.waits.fetch_add(1, Ordering::Relaxed);
        inner.waiters.fetch_add(1, Ordering::AcqRel);
        // Receive only when poll(2) said so, or when an earlier receive left datagrams
        // (poll cannot see those): an empty receive before each sleep would cost a
        // system call per message.
        let mut readable = false;
        let r = loop {
            if let Ok(item) = ch.pop(Some(Duration::ZERO)) {
                break Ok(item);
            }
            let left_over = || inner.rx.lock().as_ref().is_some_and(RxBufs::has_left);
            if (readable || left_over()) && inner.receive(udp, Receiver::Thread) > 0 {
                readable = false;
                continue;
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                break ch.pop(Some(Duration::ZERO));
            }
            match udp.wait_readable_or(Some(ch.watch_fd()), left) {
                Ok(r) => readable = r,
                Err(_) => {
                    break ch.pop(Some(Duration::ZERO)).map_err(|_| Error::Os {
                        errno: errno::EINTR,
                        context: "a signal handler interrupted the wait for a completion event",
                    })
                }
            }
        };
        inner.waiters.fetch_sub(1, Ordering::AcqRel);
        r
    }

    /// Takes the next item of `n`; on a link with virtual time, moves the network on
    /// while nothing is queued.
    pub(super) fn wait<T>(&self, n: &Notifier<T>, timeout: Option<Duration>) -> Result<T> {
        self.inner.flush_pending();
        self.inner.receive_left();
        loop {
            if let Ok(item) = n.pop(Some(Duration::ZERO)) {
                return Ok(item);
            }
            if !self.inner.link.idle() {
                return n.pop(timeout);
            }
        }
    }
}

impl Inner {
    /// `poll_cq`, run to completion: sends what a deferred post left waiting (see
    /// `Inner::may_defer`), polls, and on an empty CQ takes what waits on the socket
    /// in this thread (unless the device thread is at it) rather than wait for the
    /// device thread to be scheduled, which naps meanwhile (`run`); on a link without
    /// sockets it lets the link move time on ([`Link::idle`](super::Link::idle)).
    /// Then it polls once more.
    pub(super) fn poll_cq(
        &self,
        c: CqId,
        max: usize,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<usize> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        let n = {
            let mut core = self.core.lock();
            self.flush_pending_locked(&mut core);
            core.engine.poll_cq(c, max, out)?
        };
        if n > 0 {
            return Ok(n);
        }
        let progressed = match self.link.udp() {
            Some(udp) => {
                let defer = self.may_defer();
                self.receive(udp, Receiver::Poll { defer }) > 0
            }
            None => self.link.idle(),
        };
        if progressed {
            self.core.lock().engine.poll_cq(c, max, out)
        } else {
            Ok(0)
        }
    }

    /// Takes what waits on the socket (a [`Receiver::Poll`] only if no other thread is
    /// receiving), checks each ICRC outside the engine lock, then feeds the good ones
    /// to the engine under one lock, fires due timers and sends the output. Returns
    /// how many datagrams it handed the engine.
    ///
    /// Datagrams a previous call left go first, and alone (no socket read). A
    /// [`Receiver::Poll`] leaves positive ACKs at the end of a batch for the next call
    /// when something precedes them: the completion of that something is then visible
    /// without waiting for the ACKs (a ping-pong's answer arrives with the ACK of the
    /// question behind it; see `flush`), and the next poll or the device thread hands
    /// them over.
    pub(super) fn receive(&self, udp: &UdpLink, by: Receiver) -> usize {
        self.receive_on(udp, &self.rx, by)
    }

    /// [`Inner::receive`] from `udp` into the buffers `bufs`: the device's address's, or
    /// an extra address's of a device on both families (`dual`), each with its own.
    pub(super) fn receive_on(
        &self,
        udp: &UdpLink,
        bufs: &parking_lot::Mutex<Option<RxBufs>>,
        by: Receiver,
    ) -> usize {
        let (poll, defer) = match by {
            Receiver::Thread => (false, false),
            Receiver::Poll { defer } => (true, defer),
        };
        let Some(mut guard) = (if poll {
            bufs.try_lock()
        } else {
            Some(bufs.lock())
        }) else {
            return 0;
        };
        let Some(rx) = guard.as_mut() else {
            return 0;
        };
        let (start, end) = if rx.has_left() {
            (rx.next, rx.got.len())
        } else {
            let n = udp.recv_batch(rx);
            if n == 0 {
                return 0;
            }
            if poll {
                (
                    0,
                    before_trailing_acks(n, |i| is_positive_ack(rx.bytes(&rx.got[i]))),
                )
            } else {
                (0, n)
            }
        };
        let mut bad = 0;
        for i in start..end {
            let d = rx.got[i];
            match udp.icrc_ip_id(&d, rx.bytes(&d), rx.guess_ip_id(d.from)) {
                Some(id) => rx.saw_ip_id(d.from, id),
                None => {
                    rx.got[i].from = super::udp::NOWHERE;
                    bad += 1;
                }
            }
        }
        if bad > 0 {
            self.link_counters
                .icrc_errors
                .fetch_add(bad, Ordering::Relaxed);
        }
        let passed = udp.pass_on(rx, start..end);
        if passed > 0 {
            self.link_counters
                .passed_on
                .fetch_add(passed, Ordering::Relaxed);
        }
        let mut core = self.core.lock();
        let now = Instant::now();
        let strict = self.cfg.link.strict_source_port;
        for d in &rx.got[start..end] {
            if d.from.port() == 0 && d.from.ip().is_unspecified() {
                continue;
            }
            let bytes = rx.bytes(d);
            let pinned = strict.then(|| connected_dest_qpn(bytes)).flatten();
            if let Some(peer) = pinned.and_then(|q| core.peers.get(&q)) {
                if peer.ip() == d.from.ip() && peer.port() != d.from.port() {
                    self.link_counters
                        .wrong_source_port
                        .fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            let taken = core.engine.handle_datagram_tos(
                now,
                super::gid_of(d.from.ip()),
                super::gid_of(d.dst),
                d.tos,
                bytes,
            );
            if let (Some(qpn), true) = (pinned, taken) {
                core.peers.entry(qpn).or_insert(d.from);
            }
        }
        rx.next = end;
        core.engine.handle_timeout(now);
        self.flush(&mut core, now, defer);
        end - start
    }

    /// Hands the engine the datagrams an inline receive left (see `receive`).
    pub(super) fn receive_left(&self) {
        if let Some(udp) = self.link.udp() {
            if self.rx.lock().as_ref().is_some_and(RxBufs::has_left) {
                self.receive(udp, Receiver::Thread);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use emu_wire::{AethRepr, NakCode, Opcode, PacketRepr, Psn, Syndrome};

    fn packet(opcode: Opcode, syndrome: Option<Syndrome>) -> Vec<u8> {
        let mut r = PacketRepr::new(opcode, 0x12, Psn::new(7));
        if let Some(syndrome) = syndrome {
            r.aeth = Some(AethRepr { syndrome, msn: 3 });
        }
        let payload = if opcode.is_ack() {
            &[][..]
        } else {
            &[1, 2, 3, 4][..]
        };
        let mut buf = vec![0; r.buffer_len(payload.len())];
        let n = r.emit(&mut buf, payload);
        buf.truncate(n);
        buf
    }

    #[test]
    fn trailing_positive_acks_wait_behind_what_precedes_them() {
        let ack = packet(Opcode::RcAcknowledge, Some(Syndrome::Ack { credits: 31 }));
        let nak = packet(
            Opcode::RcAcknowledge,
            Some(Syndrome::Nak(NakCode::PsnSequenceError)),
        );
        let send = packet(Opcode::RcSendOnly, None);
        let cut =
            |batch: &[&Vec<u8>]| before_trailing_acks(batch.len(), |i| is_positive_ack(batch[i]));
        // A ping-pong's answer with the ACK of the question behind it.
        assert_eq!(cut(&[&send, &ack]), 1);
        assert_eq!(cut(&[&send, &ack, &ack]), 1);
        // ACKs before a request go with it; only the tail waits.
        assert_eq!(cut(&[&ack, &send, &ack]), 2);
        // Nothing but ACKs, nothing but requests, a NAK last, an empty batch: all.
        assert_eq!(cut(&[&ack, &ack]), 2);
        assert_eq!(cut(&[&send, &send]), 2);
        assert_eq!(cut(&[&send, &nak]), 2);
        assert_eq!(cut(&[]), 0);
    }
}
