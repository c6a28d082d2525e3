//! The completer (IBTA 9.7.5.1, 9.9.2): consumes ACKs, NAKs, READ responses and
//! ATOMIC ACKs, completes send WQEs in posting order, and drives retransmission.
//!
//! - An ACK acknowledges every request up to its PSN (coalesced ACKs complete every WQE
//!   they cover). A READ response or ATOMIC ACK also acknowledges everything before it.
//! - An ACK or response whose PSN lies beyond a READ/ATOMIC still waiting for its
//!   response is an *implied NAK* (IBTA 9.7.5.1.4): the missing responses were lost and
//!   the requester retransmits from the oldest unacknowledged PSN.
//! - A PSN sequence error NAK acknowledges everything before its PSN, then the requester
//!   goes back to that PSN (go-back-N).
//! - Other NAKs complete the WQE with the matching status and move the QP to error.
//! - The local ACK timeout retransmits from the oldest unacknowledged PSN; the retry
//!   budget (see [`retry`](super::retry)) bounds it. RNR NAKs are handled with
//!   [`rnr`](super::rnr).

use emu_wire::{NakCode, PacketRepr, Position, Psn, Syndrome};
use verbs_api::{AsyncEventType, QpState, WcStatus};

use super::ctx::Ctx;
use super::qp::QueuePair;
use super::retry::local_ack_timeout;
use super::rnr::RnrAction;
use super::timers::Timer;
use super::wqe::ReqKind;

/// The status a NAK code completes the WQE with (IBTA 9.7.6, manual 6.2).
fn nak_status(code: NakCode) -> WcStatus {
    match code {
        NakCode::PsnSequenceError => WcStatus::RetryExcErr,
        NakCode::InvalidRequest => WcStatus::RemInvReqErr,
        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
        NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
    }
}

impl QueuePair {
    /// Handles an ACK, NAK, READ response or ATOMIC ACK addressed to this QP.
    pub(crate) fn handle_response(&mut self, ctx: &mut Ctx<'_>, repr: &PacketRepr, payload: &[u8]) {
        if !matches!(self.state(), QpState::Rts | QpState::Sqd) {
            ctx.counters.rx_dropped += 1;
            return;
        }
        let psn = repr.bth.psn;
        // Only PSNs in [oldest unacknowledged, next to send) mean anything; the rest
        // are stale duplicates or ghosts (IBTA 9.7.6).
        if psn.distance(self.comp.psn) < 0 || psn.distance(self.req.sent_end) >= 0 {
            ctx.counters.rx_dropped += 1;
            return;
        }
        let opcode = repr.bth.opcode;
        if opcode.is_read_response() {
            self.on_read_response(ctx, repr, payload);
        } else if opcode.has_atomic_ack_eth() {
            self.on_atomic_ack(ctx, psn, repr.atomic_ack_eth.map_or(0, |a| a.orig));
        } else {
            match repr.aeth.map(|a| a.syndrome) {
                Some(Syndrome::Ack { .. }) => {
                    if self.ack_through(ctx, psn) {
                        self.implied_nak(ctx);
                    }
                }
                Some(Syndrome::RnrNak { timer }) => self.on_rnr_nak(ctx, psn, timer),
                Some(Syndrome::Nak(code)) => self.on_nak(ctx, psn, code),
                None => ctx.counters.rx_dropped += 1,
            }
        }
        self.complete_ready(ctx);
    }

    /// Acknowledges every SEND/WRITE packet up to and including `psn`. Returns true
    /// when a READ/ATOMIC at or before `psn` is still missing its response (an implied
    /// NAK).
    fn ack_through(&mut self, ctx: &mut Ctx<'_>, psn: Psn) -> bool {
        let before = self.comp.psn;
        let mut implied = false;
        for wqe in self.sq.iter_mut() {
            if !wqe.started || wqe.done.is_some() {
                if wqe.done.is_some() && wqe.started {
                    continue;
                }
                break;
            }
            if psn.distance(wqe.first_psn) < 0 {
                break;
            }
            match wqe.kind() {
                ReqKind::Send | ReqKind::Write => {
                    if psn.distance(wqe.last_psn()) >= 0 {
                        wqe.done = Some(WcStatus::Success);
                        self.comp.psn = wqe.last_psn().add(1);
                    } else {
                        self.comp.psn = psn.add(1);
                        break;
                    }
                }
                ReqKind::Read | ReqKind::Atomic | ReqKind::AtomicWrite | ReqKind::Flush => {
                    implied = true;
                    break;
                }
                // Binds and LOCAL_INV are done when they run; they hold no PSN.
                ReqKind::Local => {}
            }
        }
        if self.comp.psn != before {
            self.on_progress(ctx);
        }
        implied
    }

    /// Forward progress: retry budgets are full again and the ACK timer restarts.
    fn on_progress(&mut self, ctx: &mut Ctx<'_>) {
        self.comp.retry_started = false;
        self.comp.retry.reload();
        self.comp.rnr.budget.reload();
        self.restart_retransmit_timer(ctx);
    }

    /// Arms the ACK timer while packets are unacknowledged, stops it otherwise.
    pub(crate) fn restart_retransmit_timer(&mut self, ctx: &Ctx<'_>) {
        let outstanding = self.comp.psn != self.req.sent_end;
        match local_ack_timeout(self.attr.timeout) {
            Some(t) if outstanding && !self.comp.rnr.waiting => {
                self.timers.set(Timer::Retransmit, ctx.now + t)
            }
            _ => self.timers.stop(Timer::Retransmit),
        }
    }

    fn on_read_response(&mut self, ctx: &mut Ctx<'_>, repr: &PacketRepr, payload: &[u8]) {
        let psn = repr.bth.psn;
        let mut implied = self.ack_through(ctx, psn.sub(1));
        let mtu = self.path_mtu() as usize;
        let Some(idx) = self.sq.iter().position(|w| w.done.is_none()) else {
            return;
        };
        let wqe = &mut self.sq[idx];
        if !wqe.started || psn.distance(wqe.first_psn) < 0 {
            return;
        }
        // READ, and the zero-length READ RESPONSE ONLY that answers an ATOMIC WRITE or
        // FLUSH (IBTA 1.5; kernel rxe 6.12 sends it): their WQEs have no local bytes, so
        // the checks below expect an empty ONLY response for them.
        if !wqe.answered_by_read_response() || !wqe.holds_psn(psn) {
            if implied || wqe.is_rd_atomic() {
                // The response for an earlier READ/ATOMIC was lost (IBTA 9.7.5.1.4).
                self.implied_nak(ctx);
            } else {
                // A READ response where a SEND or WRITE is pending: an unexpected
                // opcode, a bad response (IBTA 9.9; kernel rxe says FATAL_ERR).
                self.fail_head(ctx, WcStatus::BadRespErr);
            }
            return;
        }
        if psn != self.comp.psn {
            // Responses before this one were lost: an implied NAK.
            implied |= psn.distance(self.comp.psn) > 0;
            if implied {
                self.implied_nak(ctx);
            }
            return;
        }
        let offset = psn.distance(wqe.first_psn) as usize * mtu;
        let expected = (wqe.length as usize - offset.min(wqe.length as usize)).min(mtu);
        let is_last = psn == wqe.last_psn();
        let tail_opcode = matches!(repr.bth.opcode.position(), Position::Last | Position::Only);
        if payload.len() != expected || is_last != tail_opcode {
            // IBTA 9.9: a response of the wrong length or position is a bad response.
            self.fail_head(ctx, WcStatus::BadRespErr);
            return;
        }
        if let Some(status) = wqe.unusable() {
            // The destination failed its L_Key check (see `Payload::Unusable`).
            self.fail_head(ctx, status);
            return;
        }
        super::mr::scatter(wqe.local(), offset, payload);
        if is_last {
            wqe.done = Some(WcStatus::Success);
        }
        self.comp.psn = psn.add(1);
        self.on_progress(ctx);
    }

    fn on_atomic_ack(&mut self, ctx: &mut Ctx<'_>, psn: Psn, orig: u64) {
        let implied = self.ack_through(ctx, psn.sub(1));
        let Some(idx) = self.sq.iter().position(|w| w.done.is_none()) else {
            return;
        };
        let wqe = &mut self.sq[idx];
        if !wqe.started || psn.distance(wqe.first_psn) < 0 {
            return;
        }
        if wqe.kind() != ReqKind::Atomic || wqe.first_psn != psn {
            if implied || wqe.answered_by_read_response() {
                self.implied_nak(ctx);
            } else {
                self.fail_head(ctx, WcStatus::BadRespErr);
            }
            return;
        }
        if let Some(status) = wqe.unusable() {
            // The destination failed its L_Key check (see `Payload::Unusable`).
            self.fail_head(ctx, status);
            return;
        }
        // The original remote value, in the byte order the responder holds it (IBTA
        // 9.4.5: atomics act on 64-bit words in the responder's memory).
        super::mr::scatter(wqe.local(), 0, &orig.to_le_bytes());
        wqe.done = Some(WcStatus::Success);
        self.comp.psn = psn.add(1);
        self.on_progress(ctx);
    }

    fn on_nak(&mut self, ctx: &mut Ctx<'_>, psn: Psn, code: NakCode) {
        // IBTA 9.7.5.1.2: a NAK acknowledges every request before its PSN.
        let implied = self.ack_through(ctx, psn.sub(1));
        self.complete_ready(ctx);
        if self.state() == QpState::Err {
            return;
        }
        if code == NakCode::PsnSequenceError || implied {
            self.implied_nak(ctx);
            return;
        }
        self.fail_head(ctx, nak_status(code));
    }

    fn on_rnr_nak(&mut self, ctx: &mut Ctx<'_>, psn: Psn, timer: u8) {
        ctx.counters.rnr_naks_received += 1;
        self.ack_through(ctx, psn.sub(1));
        self.complete_ready(ctx);
        if self.state() == QpState::Err {
            return;
        }
        match self.comp.rnr.on_rnr_nak(ctx.now, timer) {
            RnrAction::WaitUntil(at) => {
                self.timers.stop(Timer::Retransmit);
                self.timers.set(Timer::Rnr, at);
            }
            RnrAction::Exhausted => self.fail_head(ctx, WcStatus::RnrRetryExcErr),
        }
    }

    /// The RNR wait is over: retransmit from the NAK's PSN (IBTA 9.7.5.2.8).
    pub(crate) fn on_rnr_timeout(&mut self, ctx: &mut Ctx<'_>) {
        self.comp.rnr.waiting = false;
        if matches!(self.state(), QpState::Rts | QpState::Sqd) {
            self.rewind(ctx);
        }
    }

    /// The local ACK timer expired (IBTA 9.7.6.1.3).
    pub(crate) fn on_retransmit_timeout(&mut self, ctx: &mut Ctx<'_>) {
        if !matches!(self.state(), QpState::Rts | QpState::Sqd)
            || self.comp.psn == self.req.sent_end
        {
            return;
        }
        ctx.counters.ack_timeouts += 1;
        // A peer device on this host that could not run since the timer started could
        // not answer: go back without spending a retry (module `retry`).
        let waited = super::retry::local_ack_timeout(self.attr.timeout).unwrap_or_default();
        let peer = self.attr.ah_attr.grh.dgid;
        let since = ctx.now.checked_sub(waited).unwrap_or(ctx.now);
        if ctx
            .liveness
            .is_some_and(|l| l.stalled_since(&peer, self.attr.dest_qp_num, since))
        {
            ctx.counters.stalled_peer_timeouts += 1;
            self.rewind(ctx);
            return;
        }
        // IBTA 17.2.8: with an armed alternate path, retry exhaustion migrates.
        if !self.comp.retry.spend() && !self.migrate_on_failure(ctx) {
            self.fail_head(ctx, WcStatus::RetryExcErr);
            return;
        }
        self.rewind(ctx);
    }

    /// A NAK (sequence error or implied): spend a retry and go back, once per loss:
    /// the out-of-order responses that follow a lost one are echoes of it.
    fn implied_nak(&mut self, ctx: &mut Ctx<'_>) {
        if self.comp.retry_started {
            return;
        }
        if !self.comp.retry.spend() && !self.migrate_on_failure(ctx) {
            self.fail_head(ctx, WcStatus::RetryExcErr);
            return;
        }
        self.rewind(ctx);
    }

    /// Go-back-N: the requester resumes at the oldest unacknowledged PSN. WQEs keep
    /// the PSNs they were given, so every retransmitted packet is byte-identical to the
    /// original except a READ, which resumes at the first missing response (IBTA
    /// 9.7.5.1.5: the retried READ asks only for what is missing).
    fn rewind(&mut self, ctx: &mut Ctx<'_>) {
        ctx.counters.retransmissions += 1;
        let p = self.comp.psn;
        let mut first = None;
        for (i, wqe) in self.sq.iter_mut().enumerate() {
            if !wqe.started {
                break;
            }
            if wqe.done.is_some() {
                continue;
            }
            if wqe.holds_psn(p) {
                wqe.next_off = p.distance(wqe.first_psn) as u32;
            } else if wqe.first_psn.distance(p) > 0 {
                wqe.next_off = 0;
            } else {
                continue;
            }
            first.get_or_insert(i);
        }
        if let Some(i) = first {
            self.req.idx = i;
        }
        self.req.noack_pkts = 0;
        self.comp.retry_started = true;
        self.timers.stop(Timer::Retransmit);
    }

    /// Completes finished WQEs at the head of the send queue, in posting order
    /// (IBTA 10.8: completions are returned in the order WRs were posted).
    pub(crate) fn complete_ready(&mut self, ctx: &mut Ctx<'_>) {
        // The finished WQEs are read where they lie and dropped there in one go:
        // moving each out of the queue copied a whole WQE per message.
        let (mut n, mut rd_atomics, mut failed) = (0, 0, false);
        for wqe in &self.sq {
            let Some(status) = wqe.done else { break };
            n += 1;
            if wqe.started && wqe.is_rd_atomic() {
                rd_atomics += 1;
            }
            if status != WcStatus::Success {
                ctx.complete(self.init.send_cq, self.send_wc(wqe, status), true);
                failed = true;
                break;
            }
            if wqe.signaled {
                ctx.complete(self.init.send_cq, self.send_wc(wqe, status), false);
            }
        }
        self.sq.drain(..n);
        ctx.send_queues.give(&mut self.sq);
        self.req.idx = self.req.idx.saturating_sub(n);
        self.req.rd_atomic_outstanding -= rd_atomics;
        if failed {
            if self.is_reliable() {
                self.enter_error(ctx);
            } else {
                self.enter_sq_error(ctx);
            }
            return;
        }
        self.check_drained(ctx);
    }

    /// SQD: once no started WQE is left, the send queue is drained; raise
    /// `SQ_DRAINED` if it was asked for (IBTA 10.3, manual 3.5 ibv_modify_qp, 6.1.6).
    pub(crate) fn check_drained(&mut self, ctx: &mut Ctx<'_>) {
        if self.state() != QpState::Sqd || !self.attr.sq_draining {
            return;
        }
        if self.sq.front().is_some_and(|w| w.started) {
            return;
        }
        self.attr.sq_draining = false;
        if self.attr.en_sqd_async_notify {
            ctx.qp_event(AsyncEventType::SqDrained, self.qpn);
        }
    }
}
