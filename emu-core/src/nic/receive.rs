//! The device's side of receiving: what a link takes it hands to the device's
//! [`Inbound`] (into the engine under one lock, timers, the answers sent); who calls
//! [`Link::receive`](super::Link::receive) and when: an application's `poll_cq`
//! (inline, run to completion), a thread waiting for its event, the device thread
//! (`thread.rs`).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_api::{errno, CqId, Error, Result, WorkCompletion};

use super::link::Receiver;
use super::{EmuDevice, Inner, LinkCounters};
use crate::engine::{connected_dest_qpn, PacketKind};
use crate::notify::Notifier;

/// The device a link hands what it receives to, for one [`Link::receive`](super::Link::receive).
pub struct Inbound<'a>(pub(super) &'a Inner);

impl Inbound<'_> {
    /// Delivers datagrams `(src, dst, tos, packet)` that the link did not check, as
    /// [`DeviceDriver::handle_datagrams_tos`](super::DeviceDriver::handle_datagrams_tos)
    /// does: each ICRC checked with IP ID 0 and the device port both ways (a wrong one
    /// dropped and counted), the good ones to the engine in order under one lock, the
    /// output sent once.
    pub fn deliver(&self, batch: &[(IpAddr, IpAddr, u8, &[u8])]) {
        self.0.deliver(batch.iter().copied());
    }

    /// Hands the engine datagrams whose ICRC the link checked, `(from, to, tos,
    /// packet)`, in order under one lock (with `strict_source_port`, one for a
    /// connected QP from its peer's address but another port is dropped and counted),
    /// fires due timers and sends the output, leaving the last partial run for the
    /// next flush with `defer`.
    pub(crate) fn checked<'p>(
        &self,
        datagrams: impl Iterator<Item = (SocketAddr, IpAddr, u8, &'p [u8])>,
        defer: bool,
    ) {
        let inner = self.0;
        let mut core = inner.core.lock();
        let now = Instant::now();
        let strict = inner.cfg.link.strict_source_port;
        for (from, dst, tos, bytes) in datagrams {
            let pinned = strict.then(|| connected_dest_qpn(bytes)).flatten();
            if let Some(peer) = pinned.and_then(|q| core.peers.get(&q)) {
                if peer.ip() == from.ip() && peer.port() != from.port() {
                    inner
                        .link_counters
                        .wrong_source_port
                        .fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            let taken = core.engine.handle_datagram_tos(
                now,
                super::gid_of(from.ip()),
                super::gid_of(dst),
                tos,
                bytes,
            );
            if let (Some(qpn), true) = (pinned, taken) {
                core.peers.entry(qpn).or_insert(from);
            }
        }
        core.engine.handle_timeout(now);
        inner.flush(&mut core, now, defer);
        inner.unlock_waking(core);
    }

    /// The device's link counters (ICRC errors, datagrams passed on).
    pub(crate) fn counters(&self) -> &LinkCounters {
        &self.0.link_counters
    }
}

/// Whether a received `packet` is a positive ACK (see [`PacketKind`]).
pub(super) fn is_positive_ack(packet: &[u8]) -> bool {
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
        ch: &Notifier<CqId>,
        timeout: Option<Duration>,
    ) -> Result<CqId> {
        let inner = &self.inner;
        let deadline = timeout.map(|t| Instant::now() + t);
        super::deferred::send_elsewhere(inner);
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
            if (readable || inner.link.pending())
                && inner.link.receive(&Inbound(inner), Receiver::Thread) > 0
            {
                readable = false;
                continue;
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                break ch.pop(Some(Duration::ZERO));
            }
            match inner.link.wait_readable(Some(ch.watch_fd()), left) {
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
        super::deferred::send_elsewhere(&self.inner);
        self.inner.flush_pending();
        self.inner.receive_left();
        loop {
            if let Ok(item) = n.pop(Some(Duration::ZERO)) {
                return Ok(item);
            }
            if self
                .inner
                .link
                .receive(&Inbound(&self.inner), Receiver::Idle)
                == 0
            {
                return n.pop(timeout);
            }
        }
    }
}

impl Inner {
    /// `poll_cq`, run to completion: sends what a deferred post left waiting (see
    /// `Inner::may_defer`), polls, and on an empty CQ receives in this thread (unless
    /// another CQ's poll just found nothing to receive, `nic/empty_polls.rs`)
    /// ([`Receiver::Poll`]: what waits on the socket or the ring, unless another
    /// thread is at it, rather than wait for the device thread to be scheduled, which
    /// naps meanwhile, `run`; on a link with virtual time the network moves on). Then
    /// it polls once more.
    pub(super) fn poll_cq(
        self: &Arc<Self>,
        c: CqId,
        max: usize,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<usize> {
        let _at = self.at_verbs(&self.polls);
        super::deferred::send_elsewhere(self);
        let n = {
            let mut core = self.core.lock();
            self.flush_pending_locked(&mut core);
            core.engine.poll_cq(c, max, out)?
        };
        if n > 0 {
            return Ok(n);
        }
        let empty = self
            .empty_polls
            .as_ref()
            .filter(|_| self.link.receive_costs_a_system_call());
        if empty.is_some_and(|e| e.skip(c)) {
            self.link_counters
                .skipped_receives
                .fetch_add(1, Ordering::Relaxed);
            return Ok(0);
        }
        let defer = self.may_defer();
        let got = self.link.receive(&Inbound(self), Receiver::Poll { defer });
        if let Some(e) = empty {
            e.received(c, got);
        }
        if got > 0 {
            let mut core = self.core.lock();
            if core.holds_packets() {
                super::deferred::left_in(self);
            }
            core.engine.poll_cq(c, max, out)
        } else {
            Ok(0)
        }
    }

    /// Hands the engine the datagrams an inline receive left ([`Link::pending`](super::Link::pending)).
    pub(super) fn receive_left(&self) {
        if self.link.pending() {
            self.link.receive(&Inbound(self), Receiver::Thread);
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
