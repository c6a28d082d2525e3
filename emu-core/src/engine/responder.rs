//! The responder (IBTA 9.7.4-9.7.5, 9.9.3): checks and executes incoming requests and
//! answers them.
//!
//! Checks run in this order, before any byte moves: PSN (duplicate or out of
//! sequence), opcode sequence, opcode allowed by the QP, resources (a receive WQE for
//! SEND and WRITE with immediate, from the QP's receive queue or its shared receive
//! queue — see [`srq`](super::srq) — else an RNR NAK — see [`rnr`](super::rnr)), lengths,
//! then the R_Key. Then the request executes and is acknowledged when the requester
//! asked (AckReq), which coalesces ACKs. READ and ATOMIC requests are remembered in a
//! ring of `max_dest_rd_atomic` resources, so that a duplicate READ is replayed and a
//! duplicate ATOMIC answered with its saved result, never executed twice.
//!
//! IBTA 1.5 adds ATOMIC WRITE (8 bytes written as one unit, with remote write access)
//! and FLUSH (make a range or a whole region globally visible or persistent, with the
//! region's FLUSH access for each placement type asked). Both take a responder
//! resource and are answered by a zero-length RDMA READ RESPONSE ONLY, as kernel rxe
//! 6.12 answers them (the rxe corpus has the frames); a duplicate is answered again,
//! never executed twice. Requests execute in PSN order, so every WRITE before a
//! FLUSH has landed when the FLUSH executes; the emulator's memory is the placement
//! target, globally visible and as persistent as it gets, so there is nothing more to
//! wait for.

use std::collections::VecDeque;

use emu_wire::feth::{PLACEMENT_GLOBAL, PLACEMENT_PERSISTENT, SELECTIVITY_MR, SELECTIVITY_RANGE};
use emu_wire::{AethRepr, AtomicAckEthRepr, NakCode, Opcode, PacketRepr, Position, Psn, Syndrome};
use verbs_api::{
    AccessFlags, AsyncEventType, QpState, QpType, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

use super::ctx::Ctx;
use super::mr::{AccessError, Segment};
use super::note::Note;
use super::qp::QueuePair;
use super::requester::emit;
use super::wqe::{RecvWqe, Segments};
use super::{PacketKind, Transmit};

/// A message may span fewer PSNs than half the PSN space less the requester's window,
/// or PSN comparisons would flip (IBTA 9.7.1).
pub(crate) const MAX_PSNS_PER_MESSAGE: u32 = (1 << 23) - 256;

/// A multi-packet request in progress.
#[derive(Debug)]
enum InProgress {
    Send {
        wqe: RecvWqe,
        segs: Segments,
        received: u64,
    },
    Write {
        seg: Option<Segment>,
        received: u64,
        length: u64,
    },
}

/// A remembered READ or ATOMIC (IBTA 9.7.5.1.2: responder resources).
#[derive(Debug, Clone, Copy)]
struct RdAtomicResource {
    first_psn: Psn,
    npsn: u32,
    kind: ResourceKind,
}

#[derive(Debug, Clone, Copy)]
enum ResourceKind {
    Read {
        va: u64,
        length: u64,
        rkey: u32,
    },
    Atomic {
        orig: u64,
    },
    /// An executed ATOMIC WRITE or FLUSH (IBTA 1.5): a duplicate gets its empty READ
    /// response again and is not executed.
    Replay,
}

/// A response waiting to be sent.
#[derive(Debug)]
enum Response {
    /// An ACK, NAK or RNR NAK.
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    /// READ response packets still to send.
    Read {
        first_psn: Psn,
        next: u32,
        seg: Option<Segment>,
        length: usize,
        msn: u32,
    },
    /// An ATOMIC ACK.
    Atomic { psn: Psn, orig: u64, msn: u32 },
}

/// The responder's state.
#[derive(Debug, Default)]
pub(crate) struct ResponderState {
    /// The expected PSN.
    pub(crate) epsn: Psn,
    /// The message sequence number: messages completed (24 bits, IBTA 9.7.5.1).
    pub(crate) msn: u32,
    /// A sequence-error or RNR NAK was sent for `epsn`; later out-of-sequence packets
    /// are dropped silently until `epsn` arrives (IBTA 9.7.5).
    nak_outstanding: bool,
    /// UC: the message in progress was damaged; drop packets until the next FIRST or
    /// ONLY (IBTA 9.8).
    drop_msg: bool,
    cur: Option<InProgress>,
    resources: VecDeque<RdAtomicResource>,
    out: VecDeque<Response>,
}

impl ResponderState {
    pub(crate) fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    pub(crate) fn clear_output(&mut self) {
        self.out.clear();
        self.cur = None;
    }

    /// UC: abandons the message in progress; its receive WQE goes back to the head
    /// of the receive queue for the next message (IBTA 9.8). On a QP with an SRQ the
    /// WQE stays with the QP (at the head of its otherwise empty `rq`), as kernel rxe
    /// keeps `resp.wqe`.
    fn abort_message(&mut self, rq: &mut VecDeque<RecvWqe>) {
        if let Some(wqe) = self.take_current_recv() {
            rq.push_front(wqe);
        }
        self.cur = None;
        self.drop_msg = true;
    }

    pub(crate) fn has_current_recv(&self) -> bool {
        matches!(self.cur, Some(InProgress::Send { .. }))
    }

    pub(crate) fn take_current_recv(&mut self) -> Option<RecvWqe> {
        match self.cur.take() {
            Some(InProgress::Send { wqe, .. }) => Some(wqe),
            other => {
                self.cur = other;
                None
            }
        }
    }

    fn push(&mut self, r: Response) {
        // Coalesce: a newer positive ACK supersedes one not yet sent (IBTA 9.7.5.1.2).
        if let (
            Response::Ack {
                syndrome: Syndrome::Ack { .. },
                ..
            },
            Some(Response::Ack {
                syndrome: Syndrome::Ack { .. },
                ..
            }),
        ) = (&r, self.out.back())
        {
            self.out.pop_back();
        }
        self.out.push_back(r);
    }

    fn ack(&mut self, psn: Psn, syndrome: Syndrome) {
        let msn = self.msn;
        self.push(Response::Ack { psn, syndrome, msn });
    }

    fn remember(&mut self, r: RdAtomicResource, max: u8) {
        self.resources.push_back(r);
        while self.resources.len() > usize::from(max.max(1)) {
            self.resources.pop_front();
        }
    }

    fn complete_message(&mut self) {
        self.msn = (self.msn + 1) & 0x00FF_FFFF;
    }
}

/// What a request error does (IBTA 9.9.3.1). On RC every one is fatal: a NAK, the
/// receive WQE in progress completes in error, an event, the QP to error. On UC only
/// class A errors (the responder's own receive WQE is bad) are; the others drop the
/// message silently (IBTA 9.9, "class D").
struct Fatal {
    /// The NAK for the requester; none for a class J error (IBTA 9.9.6.3).
    nak: Option<NakCode>,
    /// The status of the receive WQE in progress, if one is.
    recv_status: Option<WcStatus>,
    event: Option<AsyncEventType>,
    class_a: bool,
}

/// Why a request was not executed.
enum Refusal {
    /// No receive WQE (RC: RNR NAK; UC: the message is dropped).
    NotReady,
    Error(Fatal),
}

impl From<Fatal> for Refusal {
    fn from(f: Fatal) -> Self {
        Refusal::Error(f)
    }
}

const INVALID_REQUEST: Fatal = Fatal {
    nak: Some(NakCode::InvalidRequest),
    recv_status: Some(WcStatus::RemInvReqErr),
    event: Some(AsyncEventType::QpReqErr),
    class_a: false,
};

/// A SEND with Invalidate whose R_Key cannot be invalidated: a class J error (IBTA
/// 9.9.6.3), no NAK; see `execute_send`.
const INVALIDATE_ERROR: Fatal = Fatal {
    nak: None,
    recv_status: Some(WcStatus::MwBindErr),
    event: None,
    class_a: false,
};

/// Length errors, misaligned atomics, READ/ATOMIC beyond the responder resources: an
/// invalid request NAK, and the "local access violation" event (manual 6.1.4).
const LENGTH_ERROR: Fatal = Fatal {
    nak: Some(NakCode::InvalidRequest),
    recv_status: Some(WcStatus::RemInvReqErr),
    event: Some(AsyncEventType::QpAccessErr),
    class_a: false,
};

/// The largest RDMA length a RETH may ask for: 2^31, the largest message IBTA allows
/// (ch. 9), as kernel rxe.
const MAX_DMA_LEN: u32 = 1 << 31;

const ACCESS_ERROR: Fatal = Fatal {
    nak: Some(NakCode::RemoteAccessError),
    recv_status: Some(WcStatus::RemAccessErr),
    event: Some(AsyncEventType::QpAccessErr),
    class_a: false,
};

impl QueuePair {
    /// Handles a request packet (SEND, WRITE, READ request, ATOMIC).
    pub(crate) fn handle_request(&mut self, ctx: &mut Ctx<'_>, repr: &PacketRepr, payload: &[u8]) {
        if !matches!(
            self.state(),
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            ctx.counters.rx_dropped += 1;
            let (qpn, psn) = (self.qpn, repr.bth.psn.value());
            ctx.notes.add(|| Note::Discard {
                qpn,
                psn,
                reason: "discarded: QP not ready to receive",
            });
            return;
        }
        if self.init.qp_type == QpType::Uc {
            self.handle_uc_request(ctx, repr, payload);
            return;
        }
        let psn = repr.bth.psn;
        let d = psn.distance(self.resp.epsn);
        if d > 0 {
            // IBTA 9.7.5.1.1: out of sequence: one NAK, then silence until epsn arrives.
            ctx.counters.out_of_sequence += 1;
            let qpn = self.qpn;
            let nak = !self.resp.nak_outstanding;
            ctx.notes.add(|| Note::Discard {
                qpn,
                psn: psn.value(),
                reason: if nak {
                    "discarded: PSN gap, NAK sent (9.7.5.1.1)"
                } else {
                    "discarded: PSN gap, NAK already sent"
                },
            });
            if !self.resp.nak_outstanding {
                self.resp.nak_outstanding = true;
                ctx.counters.seq_naks_sent += 1;
                let epsn = self.resp.epsn;
                self.resp
                    .ack(epsn, Syndrome::Nak(NakCode::PsnSequenceError));
            }
            return;
        }
        if d < 0 {
            ctx.counters.duplicate_requests += 1;
            let qpn = self.qpn;
            ctx.notes.add(|| Note::Discard {
                qpn,
                psn: psn.value(),
                reason: "duplicate: answered again, not executed (9.7.5.1.2)",
            });
            self.handle_duplicate(ctx, repr);
            return;
        }
        match self.execute(ctx, repr, payload) {
            Ok(()) => self.communication_established(ctx),
            Err(Refusal::NotReady) => {
                let qpn = self.qpn;
                ctx.notes.add(|| Note::Discard {
                    qpn,
                    psn: psn.value(),
                    reason: "not taken: no receive WQE, RNR NAK sent",
                });
                // IBTA 9.7.5.2.8: RNR NAK; the PSN does not advance.
                ctx.counters.rnr_naks_sent += 1;
                self.resp.nak_outstanding = true;
                let timer = self.attr.min_rnr_timer;
                self.resp.ack(psn, Syndrome::RnrNak { timer });
            }
            Err(Refusal::Error(fatal)) => self.fatal_request_error(ctx, psn, fatal),
        }
    }

    /// UC (IBTA 9.8): no ACK, no NAK, no duplicates. A PSN gap or any error drops the
    /// message in progress silently; the responder resynchronises on the next FIRST or
    /// ONLY packet, whatever its PSN.
    fn handle_uc_request(&mut self, ctx: &mut Ctx<'_>, repr: &PacketRepr, payload: &[u8]) {
        let psn = repr.bth.psn;
        let starts = matches!(repr.bth.opcode.position(), Position::First | Position::Only);
        if psn != self.resp.epsn {
            ctx.counters.out_of_sequence += 1;
            if self.resp.cur.is_some() {
                ctx.counters.uc_dropped_messages += 1;
            }
            self.resp.abort_message(&mut self.rq);
        }
        self.resp.epsn = psn.add(1);
        if starts {
            self.resp.drop_msg = false;
        }
        if self.resp.drop_msg {
            ctx.counters.rx_dropped += 1;
            let qpn = self.qpn;
            ctx.notes.add(|| Note::Discard {
                qpn,
                psn: psn.value(),
                reason: "discarded: PSN gap, message dropped (UC, 9.8)",
            });
            return;
        }
        match self.execute(ctx, repr, payload) {
            Ok(()) => self.communication_established(ctx),
            Err(Refusal::Error(fatal)) if fatal.class_a => {
                self.fatal_request_error(ctx, psn, fatal)
            }
            Err(_) => {
                ctx.counters.uc_dropped_messages += 1;
                let qpn = self.qpn;
                ctx.notes.add(|| Note::Discard {
                    qpn,
                    psn: psn.value(),
                    reason: "discarded: message dropped (UC, 9.8)",
                });
                self.resp.abort_message(&mut self.rq);
            }
        }
    }

    /// IBTA 11.6.3, manual 6.1.5: the first packet an RTR QP processes without error
    /// establishes communication.
    fn communication_established(&mut self, ctx: &mut Ctx<'_>) {
        if self.state() == QpState::Rtr && !self.comm_est_raised {
            self.comm_est_raised = true;
            ctx.qp_event(AsyncEventType::CommEst, self.qpn);
        }
    }

    fn fatal_request_error(&mut self, ctx: &mut Ctx<'_>, psn: Psn, fatal: Fatal) {
        if let (Some(status), Some(wqe)) = (fatal.recv_status, self.resp.take_current_recv()) {
            let wc = WorkCompletion::new(wqe.wr_id, status, WcOpcode::Recv, self.qpn);
            ctx.complete(self.init.recv_cq, wc, true);
        }
        if let Some(event) = fatal.event {
            ctx.qp_event(event, self.qpn);
        }
        self.enter_error(ctx);
        if let (true, Some(nak)) = (self.is_reliable(), fatal.nak) {
            // The NAK still goes out from the error state (IBTA 9.9).
            self.resp.ack(psn, Syndrome::Nak(nak));
        }
    }

    /// Executes the request at the expected PSN. Nothing is written before every check
    /// has passed.
    fn execute(
        &mut self,
        ctx: &mut Ctx<'_>,
        repr: &PacketRepr,
        payload: &[u8],
    ) -> Result<(), Refusal> {
        let opcode = repr.bth.opcode;
        let position = opcode.position();
        let mtu = self.path_mtu() as usize;

        if self.init.qp_type == QpType::XrcRecv {
            self.xrc_target(ctx, repr)?;
        }
        // Opcode sequence (IBTA 9.7.4.1): MIDDLE/LAST continue the message in
        // progress; FIRST/ONLY may not interrupt one.
        let continuing = matches!(position, Position::Middle | Position::Last);
        match (&self.resp.cur, continuing) {
            (None, false) => {}
            (Some(InProgress::Send { .. }), true) if opcode.is_send() => {}
            (Some(InProgress::Write { .. }), true) if opcode.is_write() => {}
            _ => return Err(INVALID_REQUEST.into()),
        }
        // The QP's own remote access rights (IBTA 9.7.4.1: qp_access_flags).
        let need = if opcode.is_write() {
            Some(AccessFlags::REMOTE_WRITE)
        } else if opcode.is_read_request() {
            Some(AccessFlags::REMOTE_READ)
        } else if opcode.is_atomic() {
            Some(AccessFlags::REMOTE_ATOMIC)
        } else if opcode.is_atomic_write() {
            // IBTA 1.5: an ATOMIC WRITE is a write (kernel rxe checks REMOTE_WRITE on
            // the QP and the region).
            Some(AccessFlags::REMOTE_WRITE)
        } else if opcode.is_flush() {
            // IBTA 1.5 FETH: the QP must allow each placement type asked for, which
            // must be at least one of the two defined.
            Some(flush_access(repr).ok_or(INVALID_REQUEST)?)
        } else {
            None
        };
        if let Some(need) = need {
            if !self.attr.qp_access_flags.contains(need) {
                return Err(INVALID_REQUEST.into());
            }
        }
        // Packet lengths: FIRST and MIDDLE carry exactly one MTU, LAST and ONLY at most
        // one (IBTA 9.7.4.1).
        let len_ok = match position {
            Position::First | Position::Middle => payload.len() == mtu,
            Position::Last => !payload.is_empty() && payload.len() <= mtu,
            Position::Only => payload.len() <= mtu,
        };
        if (opcode.is_send() || opcode.is_write()) && !len_ok {
            return Err(LENGTH_ERROR.into());
        }
        // Resources: a receive WQE for SEND and WRITE with immediate, else RNR NAK.
        let needs_recv =
            (opcode.is_send() && !continuing) || (opcode.is_write() && opcode.has_immediate());
        if needs_recv && !self.recv_available(ctx) {
            return Err(Refusal::NotReady);
        }
        let done = if opcode.is_send() {
            self.execute_send(ctx, repr, payload)
        } else if opcode.is_write() {
            self.execute_write(ctx, repr, payload)
        } else if opcode.is_read_request() {
            self.execute_read(ctx, repr)
        } else if opcode.is_atomic() {
            self.execute_atomic(ctx, repr)
        } else if opcode.is_atomic_write() {
            self.execute_atomic_write(ctx, repr, payload)
        } else if opcode.is_flush() {
            self.execute_flush(ctx, repr)
        } else {
            // IBTA 9.7.4.1: an opcode the responder does not implement.
            Err(INVALID_REQUEST)
        };
        Ok(done?)
    }

    /// An XRC receive QP (module `xrc`): the XRC SRQ the XRCETH names must be an XRC
    /// SRQ of the QP's domain (else an invalid request); a message's MIDDLE and LAST
    /// packets must name its FIRST's. A new message takes the SRQ's PD (for its keys),
    /// the SRQ (for its receive WQE) and the SRQ's CQ (for its completion).
    fn xrc_target(&mut self, ctx: &Ctx<'_>, repr: &PacketRepr) -> Result<(), Refusal> {
        let srqn = repr.xrceth.map_or(0, |x| x.xrc_srqn);
        if matches!(
            repr.bth.opcode.position(),
            Position::Middle | Position::Last
        ) {
            if self.init.srq.map(|s| s.0) != Some(srqn) {
                return Err(INVALID_REQUEST.into());
            }
            return Ok(());
        }
        let Some(q) = ctx.srqs.get(&srqn) else {
            return Err(INVALID_REQUEST.into());
        };
        match q.xrc {
            Some((xrcd, cq)) if Some(xrcd) == self.xrcd => {
                self.init.srq = Some(verbs_api::SrqId(srqn));
                self.init.recv_cq = cq;
                self.init.pd = q.pd;
                Ok(())
            }
            _ => Err(INVALID_REQUEST.into()),
        }
    }

    fn execute_send(
        &mut self,
        ctx: &mut Ctx<'_>,
        repr: &PacketRepr,
        payload: &[u8],
    ) -> Result<(), Fatal> {
        let opcode = repr.bth.opcode;
        if matches!(opcode.position(), Position::First | Position::Only) {
            let wqe = self.take_recv(ctx).expect("checked above");
            let mut segs = Segments::with_capacity(wqe.sges.len());
            let pd = self.recv_pd(ctx);
            for sge in wqe.sges.iter().filter(|s| s.length > 0) {
                match ctx
                    .mrs
                    .resolve_local(pd, sge.lkey, sge.addr, sge.length, true)
                {
                    Ok(seg) => segs.push(seg),
                    Err(status) => {
                        // Our own receive buffer is bad: a local protection error here and
                        // a remote operational error for the requester (IBTA 9.9).
                        self.resp.cur = Some(InProgress::Send {
                            wqe,
                            segs: Segments::new(),
                            received: 0,
                        });
                        return Err(Fatal {
                            nak: Some(NakCode::RemoteOperationalError),
                            recv_status: Some(status),
                            event: None,
                            class_a: true,
                        });
                    }
                }
            }
            self.resp.cur = Some(InProgress::Send {
                wqe,
                segs,
                received: 0,
            });
        }
        let Some(InProgress::Send {
            wqe,
            segs,
            received,
        }) = &mut self.resp.cur
        else {
            unreachable!("sequence checked")
        };
        if *received + payload.len() as u64 > wqe.length {
            // IBTA 9.9: the message does not fit the receive buffer.
            return Err(Fatal {
                nak: Some(NakCode::InvalidRequest),
                recv_status: Some(WcStatus::LocLenErr),
                event: None,
                class_a: false,
            });
        }
        if let Some(rkey) = repr.ieth {
            // IBTA 10.6.7, 9.4: SEND with Invalidate unbinds a type 2 memory window
            // of our PD bound through this QP. Anything else (a window bound through
            // another QP, a region from reg_mr, a type 1 window, which
            // IBTA 10.6.7.2.4 / o10-37.2.26 says cannot be invalidated, an unknown or
            // unbound key) fails, found before the last bytes land, as a class J error
            // (IBTA 9.9.6.3): no NAK and no ACK for the requester, whose SEND then runs
            // out of retries; the receive WQE completes with the memory management
            // operation error (IBV_WC_MW_BIND_ERR, as a failed LOCAL_INV); the QP goes
            // to ERR. (Kernel rxe completes the receive with REM_INV_REQ_ERR and
            // acknowledges the SEND, which then completes successfully.)
            if ctx.mrs.invalidate(self.init.pd, self.qpn, rkey).is_err() {
                return Err(INVALIDATE_ERROR);
            }
        }
        super::mr::scatter(segs, *received as usize, payload);
        *received += payload.len() as u64;
        self.resp.epsn = repr.bth.psn.add(1);
        self.resp.nak_outstanding = false;
        if matches!(opcode.position(), Position::Last | Position::Only) {
            let Some(InProgress::Send { wqe, received, .. }) = self.resp.cur.take() else {
                unreachable!()
            };
            let mut wc =
                WorkCompletion::new(wqe.wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
            wc.byte_len = received as u32;
            wc.src_qp = self.attr.dest_qp_num;
            // Every RoCE packet carries its routing header (the IP header standing in
            // for the GRH, IBTA Annex A17.4.5), and RoCE devices say so on every
            // successful receive, RC and UC too: kernel rxe's `do_complete` starts from
            // IB_WC_GRH; software written against it (async-rdma) compares the flags
            // whole. Only UD places the GRH in the receive buffer.
            wc.wc_flags = WcFlags::GRH;
            if let Some(imm) = repr.imm_dt {
                wc.imm_data = imm;
                wc.wc_flags |= WcFlags::WITH_IMM;
            }
            if let Some(rkey) = repr.ieth {
                wc.invalidated_rkey = rkey;
                wc.wc_flags |= WcFlags::WITH_INV;
            }
            self.resp.complete_message();
            ctx.complete(self.init.recv_cq, wc, repr.bth.solicited);
        }
        if repr.bth.ack_req && self.is_reliable() {
            self.resp.ack(repr.bth.psn, Syndrome::ACK_NO_CREDIT);
        }
        Ok(())
    }

    fn execute_write(
        &mut self,
        ctx: &mut Ctx<'_>,
        repr: &PacketRepr,
        payload: &[u8],
    ) -> Result<(), Fatal> {
        let opcode = repr.bth.opcode;
        let position = opcode.position();
        if matches!(position, Position::First | Position::Only) {
            let reth = repr.reth.ok_or(INVALID_REQUEST)?;
            if reth.dma_len > MAX_DMA_LEN {
                return Err(LENGTH_ERROR);
            }
            let length = u64::from(reth.dma_len);
            // IBTA 9.7.4.1 (C9-88 in release 1.5): a zero-length WRITE accesses no memory and its
            // R_Key is not checked.
            let seg = if length == 0 {
                None
            } else {
                match self.remote(ctx, reth.rkey, reth.va, length, AccessFlags::REMOTE_WRITE) {
                    Ok(seg) => Some(seg),
                    Err(fatal) => {
                        // IBTA 10.8 (Local Access Error): an RDMA WRITE with
                        // immediate that fails its access check consumes the receive WQE
                        // it would have completed, which completes with LOC_ACCESS_ERR.
                        // (A multi-packet one is refused at its FIRST packet, before its
                        // immediate data is known: its WQE is flushed.)
                        if opcode.has_immediate() {
                            if let Some(wqe) = self.take_recv(ctx) {
                                let wc = WorkCompletion::new(
                                    wqe.wr_id,
                                    WcStatus::LocAccessErr,
                                    WcOpcode::RecvRdmaWithImm,
                                    self.qpn,
                                );
                                ctx.complete(self.init.recv_cq, wc, true);
                            }
                        }
                        return Err(fatal);
                    }
                }
            };
            self.resp.cur = Some(InProgress::Write {
                seg,
                received: 0,
                length,
            });
        }
        let Some(InProgress::Write {
            seg,
            received,
            length,
        }) = &mut self.resp.cur
        else {
            unreachable!("sequence checked")
        };
        let end = *received + payload.len() as u64;
        let tail = matches!(position, Position::Last | Position::Only);
        if end > *length || (tail && end != *length) {
            return Err(LENGTH_ERROR);
        }
        if let Some(seg) = seg {
            super::mr::scatter(std::slice::from_ref(seg), *received as usize, payload);
        }
        *received = end;
        let total = *length;
        self.resp.epsn = repr.bth.psn.add(1);
        self.resp.nak_outstanding = false;
        if tail {
            self.resp.cur = None;
            self.resp.complete_message();
            if let Some(imm) = repr.imm_dt {
                let wqe = self.take_recv(ctx).expect("checked above");
                let mut wc = WorkCompletion::new(
                    wqe.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    self.qpn,
                );
                wc.byte_len = total as u32;
                wc.imm_data = imm;
                // GRH as for a SEND's receive completion (see `Recv` above).
                wc.wc_flags = WcFlags::GRH | WcFlags::WITH_IMM;
                wc.src_qp = self.attr.dest_qp_num;
                ctx.complete(self.init.recv_cq, wc, repr.bth.solicited);
            }
        }
        if repr.bth.ack_req && self.is_reliable() {
            self.resp.ack(repr.bth.psn, Syndrome::ACK_NO_CREDIT);
        }
        Ok(())
    }

    fn execute_read(&mut self, ctx: &mut Ctx<'_>, repr: &PacketRepr) -> Result<(), Fatal> {
        if self.attr.max_dest_rd_atomic == 0 {
            // IBTA 9.7.4.1: no responder resources, no READ.
            return Err(LENGTH_ERROR);
        }
        let reth = repr.reth.ok_or(INVALID_REQUEST)?;
        if reth.dma_len > MAX_DMA_LEN
            || reth.dma_len.div_ceil(self.path_mtu()) >= MAX_PSNS_PER_MESSAGE
        {
            return Err(LENGTH_ERROR);
        }
        let length = u64::from(reth.dma_len);
        let seg = if length == 0 {
            None
        } else {
            Some(self.remote(ctx, reth.rkey, reth.va, length, AccessFlags::REMOTE_READ)?)
        };
        let mtu = self.path_mtu();
        let npsn = reth.dma_len.div_ceil(mtu).max(1);
        let psn = repr.bth.psn;
        self.resp.remember(
            RdAtomicResource {
                first_psn: psn,
                npsn,
                kind: ResourceKind::Read {
                    va: reth.va,
                    length,
                    rkey: reth.rkey,
                },
            },
            self.attr.max_dest_rd_atomic,
        );
        self.resp.complete_message();
        let msn = self.resp.msn;
        self.resp.push(Response::Read {
            first_psn: psn,
            next: 0,
            seg,
            length: length as usize,
            msn,
        });
        self.resp.epsn = psn.add(npsn);
        self.resp.nak_outstanding = false;
        Ok(())
    }

    fn execute_atomic(&mut self, ctx: &mut Ctx<'_>, repr: &PacketRepr) -> Result<(), Fatal> {
        if self.attr.max_dest_rd_atomic == 0 {
            return Err(LENGTH_ERROR);
        }
        let eth = repr.atomic_eth.ok_or(INVALID_REQUEST)?;
        if eth.va % 8 != 0 {
            // IBTA 9.4.5: the address of an atomic must be 8-byte aligned.
            return Err(LENGTH_ERROR);
        }
        let seg = self.remote(ctx, eth.rkey, eth.va, 8, AccessFlags::REMOTE_ATOMIC)?;
        // MemBuf holds its lock for the whole read-modify-write, so the atomic is atomic
        // with respect to every other access; words are little-endian (IBTA 9.4.5).
        let done = if matches!(
            repr.bth.opcode,
            Opcode::RcCompareSwap | Opcode::XrcCompareSwap
        ) {
            seg.buf
                .compare_swap_u64(seg.offset, eth.compare, eth.swap_add)
        } else {
            seg.buf.fetch_add_u64(seg.offset, eth.swap_add)
        };
        let orig = done.expect("the R_Key check bounded the 8 bytes");
        let psn = repr.bth.psn;
        self.resp.remember(
            RdAtomicResource {
                first_psn: psn,
                npsn: 1,
                kind: ResourceKind::Atomic { orig },
            },
            self.attr.max_dest_rd_atomic,
        );
        self.resp.complete_message();
        let msn = self.resp.msn;
        self.resp.push(Response::Atomic { psn, orig, msn });
        self.resp.epsn = psn.add(1);
        self.resp.nak_outstanding = false;
        Ok(())
    }

    /// ATOMIC WRITE (IBTA 1.5): the R_Key and range checks of a WRITE, then exactly 8
    /// bytes (RETH DMA length and payload) at an 8-byte aligned address, written while
    /// the region's lock is held, so no other access sees half of them. A length or
    /// alignment error is an invalid request (kernel rxe: `RESPST_ERR_LENGTH`,
    /// `RESPST_ERR_MISALIGNED_ATOMIC`); nothing is written before every check passed.
    fn execute_atomic_write(
        &mut self,
        ctx: &mut Ctx<'_>,
        repr: &PacketRepr,
        payload: &[u8],
    ) -> Result<(), Fatal> {
        if self.attr.max_dest_rd_atomic == 0 {
            // It takes a responder resource, as a READ does (IBTA 9.7.4.1).
            return Err(LENGTH_ERROR);
        }
        let reth = repr.reth.ok_or(INVALID_REQUEST)?;
        let seg = self.remote(
            ctx,
            reth.rkey,
            reth.va,
            u64::from(reth.dma_len),
            AccessFlags::REMOTE_WRITE,
        )?;
        if reth.dma_len != 8 || payload.len() != 8 {
            return Err(LENGTH_ERROR);
        }
        if reth.va % 8 != 0 {
            return Err(LENGTH_ERROR);
        }
        super::mr::scatter(std::slice::from_ref(&seg), 0, payload);
        self.replayable_done(repr.bth.psn);
        Ok(())
    }

    /// FLUSH (IBTA 1.5): the R_Key must grant the FLUSH access of every placement type
    /// asked for; at the memory range level the RETH's range must lie in the region,
    /// at the memory region level only the key counts. Every earlier request has
    /// executed (PSN order) and the memory is the placement target, so the FLUSH is
    /// done once checked.
    fn execute_flush(&mut self, ctx: &mut Ctx<'_>, repr: &PacketRepr) -> Result<(), Fatal> {
        if self.attr.max_dest_rd_atomic == 0 {
            return Err(LENGTH_ERROR);
        }
        let (Some(feth), Some(reth)) = (repr.feth, repr.reth) else {
            return Err(INVALID_REQUEST);
        };
        let need = flush_access(repr).ok_or(INVALID_REQUEST)?;
        match feth.selectivity_level {
            SELECTIVITY_RANGE => {
                self.remote(ctx, reth.rkey, reth.va, u64::from(reth.dma_len), need)?;
            }
            SELECTIVITY_MR => ctx
                .mrs
                .check_remote_region(self.init.pd, self.qpn, reth.rkey, reth.va, need)
                .map_err(|_: AccessError| ACCESS_ERROR)?,
            // Levels 2 and 3 are reserved.
            _ => return Err(INVALID_REQUEST),
        }
        self.replayable_done(repr.bth.psn);
        Ok(())
    }

    /// An ATOMIC WRITE or FLUSH at `psn` executed: remember it for duplicates and
    /// answer it with a zero-length READ RESPONSE ONLY.
    fn replayable_done(&mut self, psn: Psn) {
        self.resp.remember(
            RdAtomicResource {
                first_psn: psn,
                npsn: 1,
                kind: ResourceKind::Replay,
            },
            self.attr.max_dest_rd_atomic,
        );
        self.resp.complete_message();
        let msn = self.resp.msn;
        self.resp.push(Response::Read {
            first_psn: psn,
            next: 0,
            seg: None,
            length: 0,
            msn,
        });
        self.resp.epsn = psn.add(1);
        self.resp.nak_outstanding = false;
    }

    /// R_Key checks (IBTA 9.7.4.1); any failure is a remote access error.
    fn remote(
        &self,
        ctx: &Ctx<'_>,
        rkey: u32,
        va: u64,
        length: u64,
        need: AccessFlags,
    ) -> Result<Segment, Fatal> {
        ctx.mrs
            .resolve_remote(self.init.pd, self.qpn, rkey, va, length, need)
            .map_err(|_: AccessError| ACCESS_ERROR)
    }

    /// A request at a PSN already executed (IBTA 9.7.5.1.2).
    fn handle_duplicate(&mut self, ctx: &mut Ctx<'_>, repr: &PacketRepr) {
        let psn = repr.bth.psn;
        let opcode = repr.bth.opcode;
        if opcode.is_read_request() {
            let Some(reth) = repr.reth else { return };
            let found = self.resp.resources.iter().rev().find(|r| {
                let d = psn.distance(r.first_psn);
                d >= 0 && (d as u32) < r.npsn && matches!(r.kind, ResourceKind::Read { .. })
            });
            let Some(&RdAtomicResource {
                first_psn,
                kind: ResourceKind::Read { va, length, rkey },
                ..
            }) = found
            else {
                return;
            };
            // The retried READ must ask for the rest of the original from the PSN it
            // carries: same R_Key, the same end, and a start that matches its PSN
            // (IBTA 9.7; kernel rxe checks the same).
            let skip = u64::from(psn.distance(first_psn) as u32) * u64::from(self.path_mtu());
            let expect_va = va.wrapping_add(skip.min(length));
            if reth.rkey != rkey
                || reth.va != expect_va
                || u64::from(reth.dma_len) != length - skip.min(length)
            {
                return;
            }
            let seg = if reth.dma_len == 0 {
                None
            } else {
                match ctx.mrs.resolve_remote(
                    self.init.pd,
                    self.qpn,
                    reth.rkey,
                    reth.va,
                    u64::from(reth.dma_len),
                    AccessFlags::REMOTE_READ,
                ) {
                    Ok(seg) => Some(seg),
                    Err(_) => return,
                }
            };
            let msn = self.resp.msn;
            self.resp.push(Response::Read {
                first_psn: psn,
                next: 0,
                seg,
                length: reth.dma_len as usize,
                msn,
            });
        } else if opcode.is_atomic() {
            let found = self
                .resp
                .resources
                .iter()
                .rev()
                .find(|r| r.first_psn == psn);
            if let Some(&RdAtomicResource {
                kind: ResourceKind::Atomic { orig },
                ..
            }) = found
            {
                let msn = self.resp.msn;
                self.resp.push(Response::Atomic { psn, orig, msn });
            }
        } else if opcode.is_atomic_write() || opcode.is_flush() {
            // IBTA 1.5: executed once; a duplicate whose resource is still held gets
            // the same empty READ response again.
            let found = self
                .resp
                .resources
                .iter()
                .rev()
                .any(|r| r.first_psn == psn && matches!(r.kind, ResourceKind::Replay));
            if found {
                let msn = self.resp.msn;
                self.resp.push(Response::Read {
                    first_psn: psn,
                    next: 0,
                    seg: None,
                    length: 0,
                    msn,
                });
            }
        } else {
            // Every duplicate SEND/WRITE is acknowledged again (C9-105, as kernel rxe);
            // unsent ACKs coalesce, so a retransmitted burst costs one ACK.
            let last = self.resp.epsn.sub(1);
            self.resp.ack(last, Syndrome::ACK_NO_CREDIT);
        }
    }

    /// Produces the next response packet (ACK, NAK, READ response, ATOMIC ACK), with
    /// P_Key `pkey` (the QP's), from `src` (the GID at its path's `sgid_index`).
    pub(crate) fn next_response(
        &mut self,
        pkey: u16,
        src: verbs_api::Gid,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let mtu = self.path_mtu() as usize;
        let dest_qp = self.attr.dest_qp_num;
        // An XRC receive QP answers with the XRC twins (0xA0 + n; XRC annex).
        let transport = if self.init.qp_type == QpType::XrcRecv {
            emu_wire::Transport::Xrc
        } else {
            emu_wire::Transport::Rc
        };
        let op = |o: Opcode| o.with_transport(transport).unwrap_or(o);
        let front = self.resp.out.front_mut()?;
        let kind = match front {
            Response::Ack { syndrome, .. } => PacketKind::for_ack(*syndrome),
            _ => PacketKind::Response,
        };
        let size = match front {
            Response::Ack { psn, syndrome, msn } => {
                let mut repr = PacketRepr::new(op(Opcode::RcAcknowledge), dest_qp, *psn);
                repr.aeth = Some(AethRepr {
                    syndrome: *syndrome,
                    msn: *msn,
                });
                let size = emit(buf, &mut repr, pkey, 0, |_| {});
                self.resp.out.pop_front();
                size
            }
            Response::Atomic { psn, orig, msn } => {
                let mut repr = PacketRepr::new(op(Opcode::RcAtomicAcknowledge), dest_qp, *psn);
                repr.aeth = Some(AethRepr {
                    syndrome: Syndrome::ACK_NO_CREDIT,
                    msn: *msn,
                });
                repr.atomic_ack_eth = Some(AtomicAckEthRepr { orig: *orig });
                let size = emit(buf, &mut repr, pkey, 0, |_| {});
                self.resp.out.pop_front();
                size
            }
            Response::Read {
                first_psn,
                next,
                seg,
                length,
                msn,
            } => {
                let n = length.div_ceil(mtu).max(1) as u32;
                let k = *next;
                let opcode = op(match (n, k) {
                    (1, _) => Opcode::RcRdmaReadResponseOnly,
                    (_, 0) => Opcode::RcRdmaReadResponseFirst,
                    (_, k) if k == n - 1 => Opcode::RcRdmaReadResponseLast,
                    _ => Opcode::RcRdmaReadResponseMiddle,
                });
                let mut repr = PacketRepr::new(opcode, dest_qp, first_psn.add(k));
                if opcode.has_aeth() {
                    repr.aeth = Some(AethRepr {
                        syndrome: Syndrome::ACK_NO_CREDIT,
                        msn: *msn,
                    });
                }
                let start = k as usize * mtu;
                let len = (*length - start.min(*length)).min(mtu);
                let size = emit(buf, &mut repr, pkey, len, |dst| {
                    if let Some(seg) = seg {
                        super::mr::gather(std::slice::from_ref(seg), start, dst);
                    }
                });
                *next += 1;
                if *next >= n {
                    self.resp.out.pop_front();
                }
                size
            }
        };
        Some(Transmit {
            dest: self.attr.ah_attr.grh.dgid,
            src,
            src_qpn: self.qpn,
            size,
            traffic_class: self.attr.ah_attr.grh.traffic_class,
            kind,
        })
    }
}

/// The region access a FLUSH needs: FLUSH_GLOBAL and/or FLUSH_PERSISTENT for the
/// placement types of its FETH (IBTA 1.5); `None` when it asks for none or for a
/// reserved one.
fn flush_access(repr: &PacketRepr) -> Option<AccessFlags> {
    let placement = repr.feth?.placement_type;
    if placement == 0 || placement & !(PLACEMENT_GLOBAL | PLACEMENT_PERSISTENT) != 0 {
        return None;
    }
    let mut need = AccessFlags::empty();
    if placement & PLACEMENT_GLOBAL != 0 {
        need |= AccessFlags::FLUSH_GLOBAL;
    }
    if placement & PLACEMENT_PERSISTENT != 0 {
        need |= AccessFlags::FLUSH_PERSISTENT;
    }
    Some(need)
}
