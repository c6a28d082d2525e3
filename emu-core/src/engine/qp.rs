//! The queue pair: its queues, its attributes, and the verbs that post to it.
//!
//! The transport behaviour is split by role as IBTA chapter 9 and kernel rxe split it:
//! [`requester`](super::requester) turns send WQEs into packets,
//! [`responder`](super::responder) executes incoming requests and answers them,
//! [`completer`](super::completer) consumes ACKs and responses and completes send WQEs.
//! State transitions live in [`modify`](super::modify).

use std::collections::VecDeque;

use emu_wire::Psn;
use verbs_api::{
    AsyncEventType, Error, FlushPlacement, MemBuf, PostError, QpAttr, QpState, QpType, RecvWr,
    SendFlags, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOperation,
};

use super::ctx::Ctx;
use super::mr::Segment;
use super::mw::BindOrigin;
use super::responder::ResponderState;
use super::retry::RetryBudget;
use super::rnr::RnrState;
use super::timers::TimerTable;
use super::ud::UdDestination;
use super::wqe::{Payload, RecvWqe, Segments, SendWqe, Sges};
use super::Limits;
use verbs_api::{PdId, QpInitAttr};

/// The requester's progress through the send queue.
#[derive(Debug, Default)]
pub(crate) struct RequesterState {
    /// Index into `sq` of the WQE the next packet comes from.
    pub(crate) idx: usize,
    /// The PSN the next WQE to start gets.
    pub(crate) next_psn: Psn,
    /// One past the highest PSN transmitted so far.
    pub(crate) sent_end: Psn,
    /// READ and ATOMIC WQEs started and not yet completed (bounded by max_rd_atomic).
    pub(crate) rd_atomic_outstanding: u32,
    /// Packets sent since the last one that asked for an ACK.
    pub(crate) noack_pkts: u32,
}

/// The completer's view: the oldest unacknowledged PSN and the retry budgets.
#[derive(Debug, Default)]
pub(crate) struct CompleterState {
    /// The oldest PSN not yet acknowledged (or response not yet received).
    pub(crate) psn: Psn,
    pub(crate) retry: RetryBudget,
    pub(crate) rnr: RnrState,
    /// A go-back-N is under way; further implied or sequence NAKs before forward
    /// progress are echoes of the same loss and start no new retry.
    pub(crate) retry_started: bool,
}

/// One queue pair.
#[derive(Debug)]
pub(crate) struct QueuePair {
    pub(crate) qpn: u32,
    pub(crate) init: QpInitAttr,
    pub(crate) attr: QpAttr,
    pub(crate) sq: VecDeque<SendWqe>,
    pub(crate) rq: VecDeque<RecvWqe>,
    pub(crate) req: RequesterState,
    pub(crate) comp: CompleterState,
    pub(crate) resp: ResponderState,
    pub(crate) timers: TimerTable,
    /// `COMM_EST` was raised for this connection (IBTA 11.6.3).
    pub(crate) comm_est_raised: bool,
    /// The engine's transmit scheduler holds this QP.
    pub(crate) in_ready: bool,
    /// An alternate path was loaded (`ALT_PATH`) and not yet migrated to.
    pub(crate) alt_loaded: bool,
    /// An XRC receive QP's domain (module `xrc`).
    pub(crate) xrcd: Option<verbs_api::XrcdId>,
    /// An XRC receive QP's holders: its creator and each `open_qp` not yet destroyed.
    pub(crate) holders: u32,
}

impl QueuePair {
    pub(crate) fn new(qpn: u32, init: QpInitAttr) -> Self {
        let attr = QpAttr {
            cap: init.cap,
            port_num: 1,
            ..QpAttr::default()
        };
        QueuePair {
            qpn,
            init,
            attr,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: RequesterState::default(),
            comp: CompleterState::default(),
            resp: ResponderState::default(),
            timers: TimerTable::default(),
            comm_est_raised: false,
            in_ready: false,
            alt_loaded: false,
            xrcd: None,
            holders: 0,
        }
    }

    /// RC and both XRC halves: acknowledged, retried, NAKed (IBTA 9.7; XRC annex).
    pub(crate) fn is_reliable(&self) -> bool {
        matches!(
            self.init.qp_type,
            QpType::Rc | QpType::XrcSend | QpType::XrcRecv
        )
    }

    pub(crate) fn state(&self) -> QpState {
        self.attr.qp_state
    }

    pub(crate) fn path_mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    /// `ibv_post_send` (manual 3.6). Immediate errors are those libibverbs returns:
    /// EINVAL for a QP in RESET/INIT/RTR, too many SGEs, INLINE data over
    /// `max_inline_data`, or an operation the transport cannot carry; ENOMEM when the
    /// send queue is full. In ERR the WR is accepted and flushed at once.
    pub(crate) fn post_send(&mut self, ctx: &mut Ctx<'_>, wrs: &[SendWr]) -> Result<(), PostError> {
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |error| PostError { index, error };
            match self.state() {
                QpState::Rts | QpState::Sqd | QpState::Err | QpState::Sqe => {}
                _ => return Err(fail(Error::InvalidArgument("QP is not ready to send"))),
            }
            self.check_send_wr(wr).map_err(fail)?;
            let ud = self.ud_destination(ctx, wr).map_err(fail)?;
            if self.sq.len() >= self.attr.cap.max_send_wr as usize {
                return Err(fail(Error::NoMemory("send queue is full")));
            }
            let length = wr.sg_list.iter().map(|s| u64::from(s.length)).sum::<u64>();
            let length = u32::try_from(length)
                .map_err(|_| fail(Error::InvalidArgument("message longer than 2^32-1")))?;
            let payload = if wr.send_flags.contains(SendFlags::INLINE) {
                let data = self.copy_inline(ctx, wr).map_err(fail)?;
                Payload::Resolved(Segments::from_buf([QueuePair::inline_segment(data)]))
            } else {
                Payload::Posted(Sges::from_slice(&wr.sg_list))
            };
            let wqe = SendWqe {
                wr_id: wr.wr_id,
                op: wr.op.clone(),
                flags: wr.send_flags,
                signaled: self.init.sq_sig_all || wr.send_flags.contains(SendFlags::SIGNALED),
                payload,
                length,
                started: false,
                first_psn: Psn::default(),
                npsn: 0,
                next_off: 0,
                done: None,
                ud,
                bind_origin: matches!(wr.op, WrOperation::BindMw { .. })
                    .then_some(BindOrigin::WorkRequest),
                xrc_srqn: wr.xrc_remote_srqn.unwrap_or(0) & 0x00FF_FFFF,
            };
            // IBTA 10.3 (QP states), manual 6.2.6: WRs posted in ERR (and, for UC/UD, SQE)
            // are flushed.
            if matches!(self.state(), QpState::Err | QpState::Sqe) {
                self.flush_send(ctx, &wqe);
            } else {
                ctx.send_queues.lend(&mut self.sq);
                self.sq.push_back(wqe);
            }
        }
        Ok(())
    }

    fn check_send_wr(&self, wr: &SendWr) -> verbs_api::Result<()> {
        if wr.sg_list.len() > self.attr.cap.max_send_sge as usize {
            return Err(Error::InvalidArgument("more SGEs than max_send_sge"));
        }
        match (&wr.op, self.init.qp_type) {
            (_, QpType::Rc) => Ok(()),
            // XRC annex: the RC operations (0xA0 + n) but IBTA 1.5's, and every WR
            // names the XRC SRQ at the target.
            (WrOperation::AtomicWrite { .. } | WrOperation::Flush { .. }, QpType::XrcSend) => Err(
                Error::InvalidArgument("XRC has no ATOMIC WRITE or FLUSH opcode"),
            ),
            (_, QpType::XrcSend) if wr.xrc_remote_srqn.is_none() => Err(Error::InvalidArgument(
                "an XRC send WR needs the remote XRC SRQ number",
            )),
            (_, QpType::XrcSend) => Ok(()),
            // IBTA 10.6.7: windows are bound and invalidated through connected QPs.
            (WrOperation::LocalInv { .. } | WrOperation::BindMw { .. }, QpType::Uc) => Ok(()),
            // IBTA 9.8: UD carries SEND only, with or without immediate.
            (WrOperation::Send | WrOperation::SendWithImm { .. }, QpType::Ud) => Ok(()),
            // IBTA 9.8 (table 38): UC carries SEND and RDMA WRITE, with or without
            // immediate; no READ, no atomics, no SEND with invalidate.
            (
                WrOperation::Send
                | WrOperation::SendWithImm { .. }
                | WrOperation::RdmaWrite { .. }
                | WrOperation::RdmaWriteWithImm { .. },
                QpType::Uc,
            ) => Ok(()),
            _ => Err(Error::InvalidArgument(
                "operation not supported by this QP type",
            )),
        }?;
        if let WrOperation::AtomicCmpAndSwp { remote_addr, .. }
        | WrOperation::AtomicFetchAndAdd { remote_addr, .. } = wr.op
        {
            // As rdma-core's rxe provider: 8 local bytes and an 8-byte aligned target.
            let total: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
            if total < 8 || remote_addr % 8 != 0 {
                return Err(Error::InvalidArgument(
                    "atomics need 8 local bytes and an 8-byte aligned remote address",
                ));
            }
        }
        if let WrOperation::AtomicWrite { .. } | WrOperation::Flush { .. } = wr.op {
            // IBTA 1.5: ATOMIC WRITE carries its 8 bytes in the request and FLUSH
            // moves no data: neither has local memory (libibverbs' `ibv_wr_atomic_write`
            // and `ibv_wr_flush` take none).
            if !wr.sg_list.is_empty() || wr.send_flags.contains(SendFlags::INLINE) {
                return Err(Error::InvalidArgument(
                    "ATOMIC WRITE and FLUSH take no scatter/gather list",
                ));
            }
        }
        if let WrOperation::Flush { placement, .. } = wr.op {
            // IBTA 1.5 FETH: at least one placement type, and only the two defined.
            if placement.is_empty() || placement.bits() & !FlushPlacement::all().bits() != 0 {
                return Err(Error::InvalidArgument(
                    "FLUSH needs the GLOBAL or PERSISTENT placement type",
                ));
            }
        }
        if wr.send_flags.contains(SendFlags::INLINE) {
            let total: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
            if total > u64::from(self.attr.cap.max_inline_data) {
                return Err(Error::InvalidArgument(
                    "INLINE data larger than max_inline_data",
                ));
            }
            if matches!(
                wr.op,
                WrOperation::RdmaRead { .. }
                    | WrOperation::AtomicCmpAndSwp { .. }
                    | WrOperation::AtomicFetchAndAdd { .. }
            ) {
                return Err(Error::InvalidArgument(
                    "INLINE is only for SEND and RDMA WRITE",
                ));
            }
        }
        Ok(())
    }

    /// `ibv_bind_mw` (type 1): a bind WQE for window `id` with R_Key `new_rkey`, posted
    /// as `ibv_post_send` posts (the same EINVAL/ENOMEM rules). EINVAL on a UD QP.
    pub(crate) fn post_bind_verb(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u32,
        new_rkey: u32,
        bind: &verbs_api::MwBind,
    ) -> verbs_api::Result<()> {
        let op = WrOperation::BindMw {
            mw_rkey: new_rkey,
            new_rkey,
            bind_info: bind.bind_info,
        };
        let wr = SendWr::new(bind.wr_id, Vec::new(), op).with_flags(bind.send_flags);
        if self.init.qp_type == QpType::Ud {
            return Err(Error::InvalidArgument(
                "windows are not bound through UD QPs",
            ));
        }
        self.post_send(ctx, std::slice::from_ref(&wr))
            .map_err(|e| e.error)?;
        if let Some(w) = self.sq.back_mut() {
            if w.wr_id == bind.wr_id && matches!(w.op, WrOperation::BindMw { .. }) {
                w.bind_origin = Some(BindOrigin::Verb(id));
            }
        }
        Ok(())
    }

    /// UD: the destination of the WR, with its address vector copied from the address
    /// handle (as kernel rxe copies it into the WQE). EINVAL without a destination or
    /// for an unknown AH. `None` on connected QPs.
    fn ud_destination(
        &self,
        ctx: &Ctx<'_>,
        wr: &SendWr,
    ) -> verbs_api::Result<Option<UdDestination>> {
        if self.init.qp_type != QpType::Ud {
            return Ok(None);
        }
        let d = wr.ud.ok_or(Error::InvalidArgument(
            "a UD send needs a destination (wr.ud)",
        ))?;
        let ah = ctx
            .ahs
            .get(d.ah)
            .ok_or(Error::InvalidArgument("no such address handle"))?;
        // The BTH's DestQP has 24 bits (IBTA 9.2): the upper 8 bits of the WR's 32-bit
        // remote_qpn have nowhere to go and are dropped (kernel rxe's BTH setter masks
        // the number the same way; the reserved byte beside it is sent as 0). The
        // sender cannot know whether the QP exists: UD is unacknowledged, and a
        // datagram for a QP that does not exist is dropped by the receiver (IBTA
        // 9.6.1.4), so the WR completes successfully either way.
        Ok(Some(UdDestination {
            dgid: ah.attr.grh.dgid,
            remote_qpn: d.remote_qpn & 0x00FF_FFFF,
            remote_qkey: d.remote_qkey,
            ah_pd: ah.pd,
            traffic_class: ah.attr.grh.traffic_class,
            sgid_index: ah.attr.grh.sgid_index,
        }))
    }

    /// INLINE data is copied when posted; libibverbs does not check the SGE keys, so
    /// the bytes are found by address among the PD's registered regions.
    fn copy_inline(&self, ctx: &Ctx<'_>, wr: &SendWr) -> verbs_api::Result<Vec<u8>> {
        let mut data = Vec::new();
        for sge in &wr.sg_list {
            let seg = ctx
                .mrs
                .resolve_local(self.init.pd, sge.lkey, sge.addr, sge.length, false)
                .ok()
                .or_else(|| ctx.mrs.find_containing(self.init.pd, sge.addr, sge.length))
                .ok_or(Error::InvalidArgument(
                    "INLINE data is not in registered memory",
                ))?;
            let start = data.len();
            data.resize(start + seg.len, 0);
            seg.buf
                .read(seg.offset, &mut data[start..])
                .map_err(|_| Error::InvalidArgument("INLINE data out of range"))?;
        }
        Ok(data)
    }

    /// `ibv_post_recv` (manual 3.6): EINVAL in RESET, for too many SGEs, or on a QP
    /// that uses an SRQ (its receive WQEs are posted with `post_srq_recv`, manual
    /// 3.6.6; kernel rxe refuses the same); ENOMEM when full. In ERR the WR is accepted
    /// and flushed at once.
    pub(crate) fn post_recv(&mut self, ctx: &mut Ctx<'_>, wrs: &[RecvWr]) -> Result<(), PostError> {
        if self.init.srq.is_some() && !wrs.is_empty() {
            return Err(PostError {
                index: 0,
                error: Error::InvalidArgument("the QP receives from an SRQ"),
            });
        }
        if matches!(self.init.qp_type, QpType::XrcSend | QpType::XrcRecv) && !wrs.is_empty() {
            // Module `xrc`: neither XRC QP has a receive queue.
            return Err(PostError {
                index: 0,
                error: Error::InvalidArgument("an XRC QP has no receive queue"),
            });
        }
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |error| PostError { index, error };
            if self.state() == QpState::Reset {
                return Err(fail(Error::InvalidArgument("QP is in RESET")));
            }
            if wr.sg_list.len() > self.attr.cap.max_recv_sge as usize {
                return Err(fail(Error::InvalidArgument("more SGEs than max_recv_sge")));
            }
            let in_progress = usize::from(self.resp.has_current_recv());
            if self.rq.len() + in_progress >= self.attr.cap.max_recv_wr as usize {
                return Err(fail(Error::NoMemory("receive queue is full")));
            }
            let wqe = RecvWqe {
                wr_id: wr.wr_id,
                sges: Sges::from_slice(&wr.sg_list),
                length: wr.sg_list.iter().map(|s| u64::from(s.length)).sum(),
            };
            if self.state() == QpState::Err {
                self.flush_recv(ctx, &wqe);
            } else {
                self.rq.push_back(wqe);
            }
        }
        Ok(())
    }

    /// A send completion for `wqe` with `status`.
    pub(crate) fn send_wc(&self, wqe: &SendWqe, status: WcStatus) -> WorkCompletion {
        let mut wc = WorkCompletion::new(wqe.wr_id, status, wqe.op.wc_opcode(), self.qpn);
        wc.byte_len = match wqe.op {
            WrOperation::AtomicCmpAndSwp { .. } | WrOperation::AtomicFetchAndAdd { .. } => 8,
            // The 8 bytes it carries, as kernel rxe reports its DMA length.
            WrOperation::AtomicWrite { .. } => 8,
            _ => wqe.length,
        };
        // The sender's completion of a message with immediate data carries WITH_IMM
        // when it succeeds, as kernel rxe's completer writes it (`make_send_cqe`);
        // `imm_data` itself is the receiver's (manual 3.6.10).
        if status == WcStatus::Success
            && matches!(
                wqe.op,
                WrOperation::SendWithImm { .. } | WrOperation::RdmaWriteWithImm { .. }
            )
        {
            wc.wc_flags = verbs_api::WcFlags::WITH_IMM;
        }
        wc
    }

    fn flush_send(&self, ctx: &mut Ctx<'_>, wqe: &SendWqe) {
        ctx.complete(
            self.init.send_cq,
            self.send_wc(wqe, WcStatus::WrFlushErr),
            true,
        );
    }

    pub(crate) fn flush_recv(&self, ctx: &mut Ctx<'_>, wqe: &RecvWqe) {
        let wc = WorkCompletion::new(wqe.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
        ctx.complete(self.init.recv_cq, wc, true);
    }

    /// Moves the QP to the error state (IBTA 10.3.1): every outstanding WR
    /// completes with `WR_FLUSH_ERR`, in posting order, send queue then receive queue.
    pub(crate) fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        if self.state() == QpState::Err {
            return;
        }
        self.attr.qp_state = QpState::Err;
        self.attr.sq_draining = false;
        self.timers.stop_all();
        self.comp.rnr.waiting = false;
        let sq = std::mem::take(&mut self.sq);
        for wqe in &sq {
            self.flush_send(ctx, wqe);
        }
        if let Some(wqe) = self.resp.take_current_recv() {
            self.flush_recv(ctx, &wqe);
        }
        // On an SRQ, `rq` holds at most the WQE a dropped UC message left with the QP;
        // the WQEs still in the SRQ are not this QP's and are not flushed.
        let rq = std::mem::take(&mut self.rq);
        for wqe in &rq {
            self.flush_recv(ctx, wqe);
        }
        self.resp.clear_output();
        self.req = RequesterState::default();
        // Manual 6.1.17, IBTA 11.6.3 (Last WQE Reached): a QP on an SRQ that enters the
        // error state reports when it holds no more receive WQEs. The one it had in
        // progress was just flushed, so that is now.
        if self.init.srq.is_some() {
            ctx.qp_event(AsyncEventType::QpLastWqeReached, self.qpn);
        }
    }

    /// An adapter error ([`Engine::fail_qp`](super::Engine::fail_qp)): the oldest send
    /// WQE not yet completed completes with `status`, even before its first packet
    /// left (the adapter was working on it), then as [`QueuePair::abort`].
    pub(crate) fn fail(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        if matches!(self.state(), QpState::Reset | QpState::Err) {
            return;
        }
        if let Some(w) = self.sq.front_mut() {
            w.started = true;
        }
        self.abort(ctx, Some(status));
    }

    /// A fault (not the user) moves the QP to the error state: the device failed
    /// (`send_status` `FATAL_ERR`, manual 6.2.20) or the QP is affected by a
    /// catastrophic error of its SRQ (manual 6.1.15). The send WQE being transmitted
    /// completes with `send_status`, if given; the receive WQE a message was being
    /// placed in completes with `REM_ABORT_ERR` (manual 6.2.17: an error on the
    /// responder side aborted the operation); everything else is flushed as in
    /// [`QueuePair::enter_error`]. A QP in RESET or ERR is left alone.
    pub(crate) fn abort(&mut self, ctx: &mut Ctx<'_>, send_status: Option<WcStatus>) {
        if matches!(self.state(), QpState::Reset | QpState::Err) {
            return;
        }
        if let Some(status) = send_status {
            if self
                .sq
                .front()
                .is_some_and(|w| w.started && w.done.is_none())
            {
                let wqe = self.sq.pop_front().expect("front exists");
                ctx.complete(self.init.send_cq, self.send_wc(&wqe, status), true);
            }
        }
        if let Some(wqe) = self.resp.take_current_recv() {
            let wc =
                WorkCompletion::new(wqe.wr_id, WcStatus::RemAbortErr, WcOpcode::Recv, self.qpn);
            ctx.complete(self.init.recv_cq, wc, true);
        }
        self.enter_error(ctx);
    }

    /// Whether a receive WQE is ready for the next SEND or WRITE with immediate: one
    /// the QP holds, or else one in its SRQ.
    pub(crate) fn recv_available(&self, ctx: &Ctx<'_>) -> bool {
        if !self.rq.is_empty() {
            return true;
        }
        self.init
            .srq
            .and_then(|srq| ctx.srqs.get(&srq.0))
            .is_some_and(|q| !q.wqes.is_empty())
    }

    /// The PD in which the L_Keys of the receive WQEs this QP takes are checked
    /// (IBTA 10.6.3.1): the SRQ's when the QP receives from one (it then has no
    /// receive queue of its own), else the QP's. rdma-unit-test's PdSrqTest expects the
    /// SRQ's, as mlx5 does; kernel rxe checks them in the QP's PD (`copy_data(qp->pd,
    /// ...)` in `rxe_resp.c`), a deviation listed in the conformance document.
    pub(crate) fn recv_pd(&self, ctx: &Ctx<'_>) -> PdId {
        self.init
            .srq
            .and_then(|srq| ctx.srqs.get(&srq.0))
            .map_or(self.init.pd, |q| q.pd)
    }

    /// Takes the receive WQE for a new message: the QP's own, else the SRQ's oldest.
    /// Taking from an armed SRQ may raise `SRQ_LIMIT_REACHED` (manual 6.1.16).
    pub(crate) fn take_recv(&mut self, ctx: &mut Ctx<'_>) -> Option<RecvWqe> {
        if let Some(wqe) = self.rq.pop_front() {
            return Some(wqe);
        }
        let srq = self.init.srq?;
        let (wqe, fire) = ctx.srqs.get_mut(&srq.0)?.take()?;
        if fire {
            ctx.srq_event(AsyncEventType::SrqLimitReached, srq);
        }
        Some(wqe)
    }

    /// UC/UD send queue error (IBTA 10.3, SQE): the send queue is flushed and stops;
    /// the receive side keeps working; SQE->RTS resumes.
    pub(crate) fn enter_sq_error(&mut self, ctx: &mut Ctx<'_>) {
        self.attr.qp_state = QpState::Sqe;
        let sq = std::mem::take(&mut self.sq);
        for wqe in &sq {
            self.flush_send(ctx, wqe);
        }
        let next = self.req.next_psn;
        self.req = RequesterState {
            next_psn: next,
            sent_end: next,
            ..RequesterState::default()
        };
        self.comp.psn = next;
    }

    /// Fails the oldest WQE with `status` (it always generates a completion), then moves
    /// the QP to the error state. Used for every requester-side error (IBTA 9.9.2).
    pub(crate) fn fail_head(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        // WQEs this very packet acknowledged complete first, successfully.
        self.complete_ready(ctx);
        if matches!(self.state(), QpState::Err | QpState::Sqe) {
            return;
        }
        if let Some(wqe) = self.sq.pop_front() {
            let wc = self.send_wc(&wqe, status);
            ctx.complete(self.init.send_cq, wc, true);
        }
        self.enter_error(ctx);
    }

    /// Back to RESET: every queue emptied, every counter back to its initial value
    /// (IBTA 10.3.1: completions already on the CQ stay there).
    pub(crate) fn reset(&mut self) {
        let (qpn, init, cap, mtu) = (self.qpn, self.init, self.attr.cap, self.attr.path_mtu);
        let (in_ready, xrcd, holders) = (self.in_ready, self.xrcd, self.holders);
        let mut timers = std::mem::take(&mut self.timers);
        timers.stop_all();
        *self = QueuePair::new(qpn, init);
        self.xrcd = xrcd;
        self.holders = holders;
        self.attr.cap = cap;
        if init.qp_type == QpType::Ud {
            // A UD QP's path MTU is the port's active MTU, set at creation.
            self.attr.path_mtu = mtu;
        }
        self.timers = timers;
        self.in_ready = in_ready;
    }

    /// Whether the QP has a packet to send now.
    pub(crate) fn wants_transmit(&self, limits: &Limits) -> bool {
        self.resp.has_output() || self.requester_ready(limits)
    }

    /// Reads `len` bytes of `segs` starting at `offset` into `dst`; a helper for the
    /// requester and the responder.
    pub(crate) fn read_segments(segs: &[Segment], offset: usize, dst: &mut [u8]) {
        super::mr::gather(segs, offset, dst);
    }

    /// Private registered copy of INLINE data, so it reads like any other segment.
    pub(crate) fn inline_segment(data: Vec<u8>) -> Segment {
        Segment {
            offset: 0,
            len: data.len(),
            buf: MemBuf::from_vec(data),
        }
    }
}
