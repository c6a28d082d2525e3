//! The requester (IBTA 9.7.1-9.7.4): turns send WQEs into request packets.
//!
//! Segmentation by path MTU into FIRST/MIDDLE/LAST/ONLY packets, one PSN per packet
//! (a READ request takes as many PSNs as its response has packets, IBTA 9.7.1.1), the
//! AckReq bit on the last packet of every message and at least every
//! [`ACK_REQ_EVERY`] packets, a window of [`MAX_UNACKED_PSNS`] unacknowledged PSNs,
//! `max_rd_atomic` outstanding READ/ATOMIC requests (IBTA 9.7; ATOMIC WRITE and
//! FLUSH, IBTA 1.5, count among them: the responder answers them as a READ), and FENCE
//! (a fenced WQE waits for every earlier READ/ATOMIC to complete, manual 3.6).

use emu_wire::{pad_count, Opcode, PacketRepr, Position, Transport, ICRC_LEN};
use emu_wire::{AtomicEthRepr, DethRepr, FethRepr, RethRepr, XrcEthRepr};
use verbs_api::{QpState, QpType, SendFlags, WcStatus, WrOperation};

use super::ctx::Ctx;
use super::qp::QueuePair;
use super::retry::local_ack_timeout;
use super::timers::Timer;
use super::wqe::{Payload, ReqKind, Segments};
use super::{Limits, PacketKind, Transmit};

/// The requester asks for an ACK at least this often (kernel rxe uses the same
/// spacing; IBTA 9.7 lets the requester choose).
pub(crate) const ACK_REQ_EVERY: u32 = 64;

/// The requester stops when this many PSNs are unacknowledged (as kernel rxe does).
pub(crate) const MAX_UNACKED_PSNS: i32 = 128;

/// Why the requester can or cannot send now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gate {
    Go,
    Wait,
}

impl QueuePair {
    /// Whether the requester has a packet it may send now.
    pub(crate) fn requester_ready(&self, limits: &Limits) -> bool {
        self.gate(limits) == Gate::Go
    }

    fn gate(&self, _limits: &Limits) -> Gate {
        let state = self.state();
        if !matches!(state, QpState::Rts | QpState::Sqd) || self.comp.rnr.waiting {
            return Gate::Wait;
        }
        let Some(wqe) = self.sq.get(self.req.idx) else {
            return Gate::Wait;
        };
        if wqe.done.is_some() {
            return Gate::Wait;
        }
        if wqe.kind() == ReqKind::Local && !wqe.started {
            // Binds and LOCAL_INV wait for every earlier WQE to complete (kernel rxe
            // makes LOCAL_INV wait so; a bind may overtake nothing either).
            return if self.req.idx == 0 && state == QpState::Rts {
                Gate::Go
            } else {
                Gate::Wait
            };
        }
        let next_psn = if wqe.started {
            wqe.first_psn.add(wqe.next_off)
        } else {
            // IBTA 10.3.1: in SQD no new WQE starts; the started ones finish.
            if state == QpState::Sqd {
                return Gate::Wait;
            }
            if wqe.flags.contains(SendFlags::FENCE) && self.req.rd_atomic_outstanding > 0 {
                return Gate::Wait;
            }
            if wqe.is_rd_atomic()
                && self.attr.max_rd_atomic > 0
                && self.req.rd_atomic_outstanding >= u32::from(self.attr.max_rd_atomic)
            {
                return Gate::Wait;
            }
            self.req.next_psn
        };
        if self.is_reliable() && next_psn.distance(self.comp.psn) >= MAX_UNACKED_PSNS {
            return Gate::Wait;
        }
        Gate::Go
    }

    /// Produces the next request packet into `buf`, if the requester may send one.
    pub(crate) fn next_request(&mut self, ctx: &mut Ctx<'_>, buf: &mut [u8]) -> Option<Transmit> {
        if self.gate(ctx.limits) != Gate::Go {
            return None;
        }
        let idx = self.req.idx;
        if self.sq[idx].kind() == ReqKind::Local {
            let status = self.execute_local(ctx, idx);
            let wqe = &mut self.sq[idx];
            wqe.started = true;
            wqe.npsn = 0;
            wqe.done = Some(status);
            self.req.idx += 1;
            self.complete_ready(ctx);
            return None;
        }
        if !self.sq[idx].started && !self.start_wqe(ctx, idx) {
            self.complete_ready(ctx);
            return None;
        }
        let mtu = self.path_mtu();
        let qkey = self.attr.qkey;
        let wqe = &mut self.sq[idx];
        let (dest_qp, dest, traffic_class, sgid_index) = match &wqe.ud {
            Some(ud) => (ud.remote_qpn, ud.dgid, ud.traffic_class, ud.sgid_index),
            None => {
                let grh = &self.attr.ah_attr.grh;
                (
                    self.attr.dest_qp_num,
                    grh.dgid,
                    grh.traffic_class,
                    grh.sgid_index,
                )
            }
        };
        let src = ctx.port.source_gid(sgid_index);
        let psn = wqe.first_psn.add(wqe.next_off);
        // The 8 bytes an ATOMIC WRITE carries in its request (not from local memory).
        let mut carried: Option<[u8; 8]> = None;
        let (repr, payload_off, payload_len, consumed) = match wqe.kind() {
            ReqKind::Send | ReqKind::Write => {
                let k = wqe.next_off;
                let n = wqe.npsn;
                let position = match (n, k) {
                    (1, _) => Position::Only,
                    (_, 0) => Position::First,
                    (_, k) if k == n - 1 => Position::Last,
                    _ => Position::Middle,
                };
                let start = k as usize * mtu as usize;
                let len = (wqe.length as usize - start).min(mtu as usize);
                let mut repr = PacketRepr::new(request_opcode(&wqe.op, position), dest_qp, psn);
                let tail = matches!(position, Position::Last | Position::Only);
                match wqe.op {
                    WrOperation::RdmaWrite { remote_addr, rkey }
                    | WrOperation::RdmaWriteWithImm {
                        remote_addr, rkey, ..
                    } => {
                        if matches!(position, Position::First | Position::Only) {
                            repr.reth = Some(RethRepr {
                                va: remote_addr,
                                rkey,
                                dma_len: wqe.length,
                            });
                        }
                    }
                    _ => {}
                }
                if tail {
                    match wqe.op {
                        WrOperation::SendWithImm { imm_data }
                        | WrOperation::RdmaWriteWithImm { imm_data, .. } => {
                            repr.imm_dt = Some(imm_data)
                        }
                        WrOperation::SendWithInv { invalidate_rkey } => {
                            repr.ieth = Some(invalidate_rkey)
                        }
                        _ => {}
                    }
                    // IBTA 9.2.3: SE only on the last packet of a SEND or WRITE with immediate.
                    repr.bth.solicited = wqe.flags.contains(SendFlags::SOLICITED)
                        && (wqe.kind() == ReqKind::Send || repr.imm_dt.is_some());
                }
                repr.bth.ack_req = tail;
                (repr, start, len, 1)
            }
            ReqKind::Read => {
                let WrOperation::RdmaRead { remote_addr, rkey } = wqe.op else {
                    unreachable!()
                };
                let skip = (wqe.next_off as u64 * u64::from(mtu)).min(u64::from(wqe.length));
                let mut repr = PacketRepr::new(Opcode::RcRdmaReadRequest, dest_qp, psn);
                repr.reth = Some(RethRepr {
                    va: remote_addr.wrapping_add(skip),
                    rkey,
                    dma_len: wqe.length - skip as u32,
                });
                repr.bth.ack_req = true;
                (repr, 0, 0, wqe.npsn - wqe.next_off)
            }
            ReqKind::Local => unreachable!("local operations run above"),
            ReqKind::AtomicWrite => {
                // IBTA 1.5 ATOMIC WRITE: a RETH for 8 bytes and the 8 bytes as payload,
                // one packet, AckReq (answered by a READ response).
                let WrOperation::AtomicWrite {
                    remote_addr,
                    rkey,
                    data,
                } = wqe.op
                else {
                    unreachable!("atomic write kind")
                };
                let mut repr = PacketRepr::new(Opcode::RcAtomicWrite, dest_qp, psn);
                repr.reth = Some(RethRepr {
                    va: remote_addr,
                    rkey,
                    dma_len: 8,
                });
                repr.bth.ack_req = true;
                carried = Some(data);
                (repr, 0, 8, 1)
            }
            ReqKind::Flush => {
                // IBTA 1.5 FLUSH: FETH (placement type, selectivity level) and RETH, no
                // payload, one packet, AckReq (answered by a READ response).
                let WrOperation::Flush {
                    remote_addr,
                    rkey,
                    length,
                    placement,
                    level,
                } = wqe.op
                else {
                    unreachable!("flush kind")
                };
                let mut repr = PacketRepr::new(Opcode::RcFlush, dest_qp, psn);
                repr.feth = Some(FethRepr {
                    placement_type: placement.bits(),
                    selectivity_level: level.as_u32() as u8,
                });
                repr.reth = Some(RethRepr {
                    va: remote_addr,
                    rkey,
                    dma_len: length,
                });
                repr.bth.ack_req = true;
                (repr, 0, 0, 1)
            }
            ReqKind::Atomic => {
                let (opcode, eth) = match wqe.op {
                    WrOperation::AtomicCmpAndSwp {
                        remote_addr,
                        rkey,
                        compare,
                        swap,
                    } => (
                        Opcode::RcCompareSwap,
                        AtomicEthRepr {
                            va: remote_addr,
                            rkey,
                            swap_add: swap,
                            compare,
                        },
                    ),
                    WrOperation::AtomicFetchAndAdd {
                        remote_addr,
                        rkey,
                        add,
                    } => (
                        Opcode::RcFetchAdd,
                        AtomicEthRepr {
                            va: remote_addr,
                            rkey,
                            swap_add: add,
                            compare: 0,
                        },
                    ),
                    _ => unreachable!("atomic kind"),
                };
                let mut repr = PacketRepr::new(opcode, dest_qp, psn);
                repr.atomic_eth = Some(eth);
                repr.bth.ack_req = true;
                (repr, 0, 0, 1)
            }
        };
        let mut repr = repr;
        let reliable = self.is_reliable();
        if self.init.qp_type == QpType::XrcSend {
            // XRC annex: the XRC twin of the RC opcode (0xA0 + n), and the XRCETH
            // naming the WR's XRC SRQ at the target.
            repr.bth.opcode = repr
                .bth
                .opcode
                .with_transport(Transport::Xrc)
                .expect("post checked the opcode");
            repr.xrceth = Some(XrcEthRepr {
                xrc_srqn: self.sq[idx].xrc_srqn,
            });
        }
        if reliable {
            self.req.noack_pkts += 1;
            if self.req.noack_pkts >= ACK_REQ_EVERY {
                repr.bth.ack_req = true;
            }
            if repr.bth.ack_req {
                self.req.noack_pkts = 0;
            }
        } else {
            // IBTA 9.8: UC and UD have no acknowledgements; the twin opcode, never
            // AckReq. UD adds the DETH (IBTA 9.3): the Q_Key and our QP number.
            let ud = self.sq[idx].ud;
            let transport = if ud.is_some() {
                Transport::Ud
            } else {
                Transport::Uc
            };
            repr.bth.opcode = repr
                .bth
                .opcode
                .with_transport(transport)
                .expect("post checked the opcode");
            repr.bth.ack_req = false;
            if let Some(ud) = ud {
                repr.deth = Some(DethRepr {
                    qkey: ud.qkey(qkey),
                    src_qp: self.qpn,
                });
            }
        }
        let wqe = &mut self.sq[idx];
        let pkey = ctx.port.pkey_at(self.attr.pkey_index);
        let size = emit(buf, &mut repr, pkey, payload_len, |dst| match carried {
            Some(data) => dst.copy_from_slice(&data),
            None => QueuePair::read_segments(wqe.local(), payload_off, dst),
        });
        wqe.next_off += consumed;
        if wqe.fully_sent() {
            self.req.idx += 1;
            if !reliable {
                // UC: the WQE is done when its last packet is on the wire (IBTA 9.8).
                wqe.done = Some(WcStatus::Success);
            }
        }
        let end = psn.add(consumed);
        if end.distance(self.req.sent_end) > 0 {
            self.req.sent_end = end;
        }
        if !reliable {
            self.comp.psn = self.req.sent_end;
            self.complete_ready(ctx);
        } else if !self.timers.is_armed(Timer::Retransmit) {
            if let Some(t) = local_ack_timeout(self.attr.timeout) {
                self.timers.set(Timer::Retransmit, ctx.now + t);
            }
        }
        Some(Transmit {
            dest,
            src,
            src_qpn: self.qpn,
            size,
            traffic_class,
            kind: PacketKind::Request,
        })
    }

    /// Resolves the WQE's local memory and assigns its PSNs. A local error marks the
    /// WQE done with that status; the completer reports it in order (IBTA 10.8).
    fn start_wqe(&mut self, ctx: &mut Ctx<'_>, idx: usize) -> bool {
        let mtu = self.path_mtu();
        let pd = self.init.pd;
        let max_rd_atomic = self.attr.max_rd_atomic;
        let wqe = &mut self.sq[idx];
        let kind = wqe.kind();
        let result: Result<(), WcStatus> = (|| {
            if u64::from(wqe.length) > u64::from(ctx.limits.max_msg_sz) {
                return Err(WcStatus::LocLenErr);
            }
            // IBTA 9.4.5, 10.7: an atomic returns one 64-bit word, so its local buffer
            // is exactly 8 bytes; another length is a local length error, found before
            // anything is sent (fewer than 8 are refused at post, as rdma-core's rxe
            // provider does; kernel rxe sends one with more and writes 8 of them).
            if kind == ReqKind::Atomic && wqe.length != 8 {
                return Err(WcStatus::LocLenErr);
            }
            if wqe.length.div_ceil(mtu) >= super::responder::MAX_PSNS_PER_MESSAGE {
                return Err(WcStatus::LocLenErr);
            }
            if let Some(ud) = &wqe.ud {
                // IBTA 9.8: a UD message is one packet; a longer one is a local
                // length error (kernel rxe completes it successfully and sends nothing).
                if wqe.length > mtu {
                    return Err(WcStatus::LocLenErr);
                }
                // The address handle must belong to the QP's PD (kernel rxe's
                // `rxe_get_av` refuses it; the WQE fails with LOC_QP_OP_ERR there too).
                if ud.ah_pd != pd {
                    return Err(WcStatus::LocQpOpErr);
                }
            }
            if wqe.is_rd_atomic() && max_rd_atomic == 0 {
                // IBTA 9.7, max_rd_atomic 0: the QP may not initiate READ/ATOMIC.
                return Err(WcStatus::LocQpOpErr);
            }
            let Payload::Posted(sges) = &wqe.payload else {
                // INLINE data, resolved at post time.
                return Ok(());
            };
            let write = matches!(kind, ReqKind::Read | ReqKind::Atomic);
            let mut local = Segments::with_capacity(sges.len());
            let mut unusable = None;
            for sge in sges.iter().filter(|s| s.length > 0) {
                match ctx
                    .mrs
                    .resolve_local(pd, sge.lkey, sge.addr, sge.length, write)
                {
                    Ok(seg) => local.push(seg),
                    // A READ's or atomic's destination fails when the response lands
                    // (see `Payload::Unusable`).
                    Err(status) if write => {
                        unusable = Some(status);
                        break;
                    }
                    Err(status) => return Err(status),
                }
            }
            wqe.payload = match unusable {
                Some(status) => Payload::Unusable(status),
                None => Payload::Resolved(local),
            };
            Ok(())
        })();
        if let Err(status) = result {
            wqe.done = Some(status);
            return false;
        }
        wqe.started = true;
        wqe.first_psn = self.req.next_psn;
        wqe.next_off = 0;
        wqe.npsn = match kind {
            ReqKind::Atomic => 1,
            _ => wqe.length.div_ceil(mtu).max(1),
        };
        self.req.next_psn = self.req.next_psn.add(wqe.npsn);
        if wqe.is_rd_atomic() {
            self.req.rd_atomic_outstanding += 1;
        }
        true
    }
}

/// The RC opcode for a SEND or WRITE packet at `position` (IBTA 9.2.1 table 38).
fn request_opcode(op: &WrOperation, position: Position) -> Opcode {
    use Opcode::*;
    use Position::*;
    match (op, position) {
        (WrOperation::RdmaWrite { .. } | WrOperation::RdmaWriteWithImm { .. }, First) => {
            RcRdmaWriteFirst
        }
        (WrOperation::RdmaWrite { .. } | WrOperation::RdmaWriteWithImm { .. }, Middle) => {
            RcRdmaWriteMiddle
        }
        (WrOperation::RdmaWrite { .. }, Last) => RcRdmaWriteLast,
        (WrOperation::RdmaWrite { .. }, Only) => RcRdmaWriteOnly,
        (WrOperation::RdmaWriteWithImm { .. }, Last) => RcRdmaWriteLastWithImmediate,
        (WrOperation::RdmaWriteWithImm { .. }, Only) => RcRdmaWriteOnlyWithImmediate,
        (_, First) => RcSendFirst,
        (_, Middle) => RcSendMiddle,
        (WrOperation::SendWithImm { .. }, Last) => RcSendLastWithImmediate,
        (WrOperation::SendWithImm { .. }, Only) => RcSendOnlyWithImmediate,
        (WrOperation::SendWithInv { .. }, Last) => RcSendLastWithInvalidate,
        (WrOperation::SendWithInv { .. }, Only) => RcSendOnlyWithInvalidate,
        (_, Last) => RcSendLast,
        (_, Only) => RcSendOnly,
    }
}

/// Writes headers (the BTH with the QP's P_Key, IBTA 9.2), `payload_len` bytes from
/// `fill`, zero pad and a zero ICRC slot into `buf` (and may zero up to 7 bytes past
/// them, where `buf` has room); returns the UDP payload length. The link fills in the ICRC, since it
/// covers the IP and UDP headers only the link knows (IBTA Annex A17.4).
pub(crate) fn emit(
    buf: &mut [u8],
    repr: &mut PacketRepr,
    pkey: u16,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]),
) -> usize {
    repr.bth.pkey = pkey;
    repr.bth.pad_count = pad_count(payload_len);
    let h = repr.emit_headers(buf);
    fill(&mut buf[h..h + payload_len]);
    let end = h + payload_len;
    let total = end + usize::from(repr.bth.pad_count) + ICRC_LEN;
    // Pad and ICRC slot, at most 7 bytes: one 8-byte store where the buffer has room
    // past the packet (scratch space), rather than a `fill` of run-time length, which
    // is a call to memset per packet (1% of the fabric's WRITE bench).
    match buf.get_mut(end..end + 8) {
        Some(tail) => tail.copy_from_slice(&[0; 8]),
        None => buf[end..total].fill(0),
    }
    total
}
