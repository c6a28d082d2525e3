//! The exact `wc_flags` of every successful work completion, per transport and opcode
//! (manual 3.6.10 `ibv_poll_cq`; IBTA 11.4.2.1 Poll for Completion).
//!
//! The standard defines two of the flags a RoCE completion can carry: `IBV_WC_WITH_IMM`
//! ("immediate data value is valid") on the receive completion of a message with
//! immediate data, and `IBV_WC_GRH` ("GRH is present in UD packet") on a UD receive,
//! whose buffer then starts with the 40-byte GRH. It is silent on the rest: whether an
//! RC or UC receive says `GRH` (every RoCE packet has its IP header), and whether the
//! sender's completion of a "with immediate" WR says `WITH_IMM`. There the cases expect
//! what kernel rxe reports, measured in the VM (`scripts/ci-hw.sh`): its responder
//! (`rxe_resp.c`, `do_complete`) starts every successful receive completion for a user
//! CQ at `GRH` whatever the transport and adds `WITH_IMM` from the packet; its completer
//! (`rxe_comp.c`, `make_send_cqe`) sets `WITH_IMM` on the sender's completion of SEND
//! with immediate and RDMA WRITE with immediate, and nothing on any other opcode.
//! Software compares the flags whole (async-rdma: `wc_flags == 3` for an RC receive
//! with immediate), so the cases do too: `==`, never `contains`. INLINE and a message
//! of several packets change nothing, and each case checks that as well.
//!
//! SEND with Invalidate is left to `mw::send_with_invalidate_invalidates`: rxe's
//! receive completion of it is a listed deviation (the kernel's bit reaches the
//! program unconverted).

use verbs_api::{QpType, RecvWr, SendFlags, SendWr, UdDest, WcFlags, WcOpcode, WcStatus};

use crate::env::{End, Pair};
use crate::{Case, Env, Outcome};

/// Bytes of GRH that precede a UD payload in the receive buffer (IBTA 11.4, manual 2.3.7).
const GRH: u32 = 40;

/// A short message: fits `max_inline_data` (64, `default_cap`) and one packet.
const SHORT: u32 = 16;

/// A message of three packets at the pairs' path MTU of 1024 (`fast_params`).
const LONG: u32 = 3000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    CmpSwap,
    FetchAdd,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::SendImm => "send_with_imm",
            Op::Write => "rdma_write",
            Op::WriteImm => "rdma_write_with_imm",
            Op::Read => "rdma_read",
            Op::CmpSwap => "cmp_swap",
            Op::FetchAdd => "fetch_add",
        }
    }

    /// Whether IBV_SEND_INLINE applies (manual 3.6.5: SEND and RDMA WRITE only).
    fn inlinable(self) -> bool {
        matches!(self, Op::Send | Op::SendImm | Op::Write | Op::WriteImm)
    }

    /// Whether the message consumes a receive WR at the responder (IBTA 9.4.3: SEND,
    /// and RDMA WRITE with immediate).
    fn consumes_recv(self) -> bool {
        matches!(self, Op::Send | Op::SendImm | Op::WriteImm)
    }

    fn has_imm(self) -> bool {
        matches!(self, Op::SendImm | Op::WriteImm)
    }

    /// The sender's completion opcode (manual 3.6.10).
    fn send_opcode(self) -> WcOpcode {
        match self {
            Op::Send | Op::SendImm => WcOpcode::Send,
            Op::Write | Op::WriteImm => WcOpcode::RdmaWrite,
            Op::Read => WcOpcode::RdmaRead,
            Op::CmpSwap => WcOpcode::CompSwap,
            Op::FetchAdd => WcOpcode::FetchAdd,
        }
    }

    /// The sender's `wc_flags`: WITH_IMM on the two "with immediate" opcodes (rxe's
    /// `make_send_cqe`; IBTA 11.4.2.1 defines the indicator for receives only), none
    /// on any other.
    fn send_flags(self) -> WcFlags {
        if self.has_imm() {
            WcFlags::WITH_IMM
        } else {
            WcFlags::empty()
        }
    }

    /// The receiver's `wc_flags`: GRH on every transport (manual 3.6.10 for UD; rxe's
    /// `do_complete` for RC and UC), WITH_IMM when the message carried immediate data
    /// (manual 3.6.10).
    fn recv_flags(self) -> WcFlags {
        if self.has_imm() {
            WcFlags::GRH | WcFlags::WITH_IMM
        } else {
            WcFlags::GRH
        }
    }
}

/// Every (transport, opcode) the transport allows (manual 2.2: UC has no READ or
/// atomics, UD has SEND only).
const FAMILY: [(QpType, Op); 13] = [
    (QpType::Rc, Op::Send),
    (QpType::Rc, Op::SendImm),
    (QpType::Rc, Op::Write),
    (QpType::Rc, Op::WriteImm),
    (QpType::Rc, Op::Read),
    (QpType::Rc, Op::CmpSwap),
    (QpType::Rc, Op::FetchAdd),
    (QpType::Uc, Op::Send),
    (QpType::Uc, Op::SendImm),
    (QpType::Uc, Op::Write),
    (QpType::Uc, Op::WriteImm),
    (QpType::Ud, Op::Send),
    (QpType::Ud, Op::SendImm),
];

const RULE: &str = "manual 3.6.10 (ibv_wc.wc_flags: IBV_WC_GRH, a GRH is present in a UD packet; IBV_WC_WITH_IMM, imm_data is valid), IBTA 11.4.2.1 (Poll for Completion): a successful receive completion has WITH_IMM exactly when the message carried immediate data, a UD one has GRH; where IBTA is silent, as kernel rxe reports it (rxe_resp.c do_complete, rxe_comp.c make_send_cqe): RC and UC receives have GRH too, the sender's completion has WITH_IMM for SEND and RDMA WRITE with immediate and no flag for any other opcode; INLINE and a multi-packet message change nothing. The flags are compared whole";

fn transport_name(t: QpType) -> &'static str {
    match t {
        QpType::Rc => "rc",
        QpType::Uc => "uc",
        _ => "ud",
    }
}

pub(super) fn register(v: &mut Vec<Case>) {
    for (i, (t, op)) in FAMILY.iter().enumerate() {
        v.push(
            Case::param(
                format!("wc_flags::{}_{}", transport_name(*t), op.name()),
                RULE,
                exact_flags,
                i as u64,
            )
            .wc(WcStatus::Success),
        );
    }
}

/// The UD destination of `p.b`, through a new address handle.
fn ud_dest(env: &Env, p: &Pair) -> UdDest {
    let ah = env
        .dev
        .create_ah(p.pd, &env.params().ah_attr(env.gid()))
        .expect("create_ah");
    UdDest {
        ah,
        remote_qpn: p.b.qpn,
        remote_qkey: env.params().qkey,
    }
}

/// The variants one case runs: (INLINE, message length).
fn variants(t: QpType, op: Op) -> Vec<(bool, u32)> {
    match op {
        Op::CmpSwap | Op::FetchAdd => vec![(false, 8)],
        _ => {
            let mut v = vec![(false, SHORT)];
            if op.inlinable() {
                v.push((true, SHORT));
            }
            // UD messages are one packet (IBTA 9.8).
            if t != QpType::Ud {
                v.push((false, LONG));
            }
            v
        }
    }
}

fn exact_flags(env: &Env, param: u64) -> Outcome {
    let (t, op) = FAMILY[param as usize];
    let p = env.pair(t);
    let ud = (t == QpType::Ud).then(|| ud_dest(env, &p));
    let mut wrong = Vec::new();
    for (n, (inline, len)) in variants(t, op).into_iter().enumerate() {
        let what = format!(
            "{} {}{} of {len} bytes",
            transport_name(t).to_uppercase(),
            op.name(),
            if inline { " INLINE" } else { "" }
        );
        let imm = 0x5EED_0000 | n as u32;
        let wr_id = 100 + n as u64;
        let recv_id = 200 + n as u64;
        // Distinct buffer regions per variant: nothing one leaves behind is read by the
        // next.
        let off = 65536 * n as u64;
        p.a.buf
            .write(off as usize, &vec![0x3C; len as usize])
            .unwrap();
        if op.consumes_recv() {
            let sg = match op {
                // An RDMA WRITE with immediate needs no receive buffer (IBTA 9.4.3).
                Op::WriteImm => vec![],
                _ if t == QpType::Ud => vec![p.b.sge(off, len + GRH)],
                _ => vec![p.b.sge(off, len)],
            };
            env.post_recv(p.b.qpn, RecvWr::new(recv_id, sg));
        }
        let wr = build(op, wr_id, &p.a, &p.b, off, len, imm);
        let mut flags = SendFlags::SIGNALED;
        if inline {
            flags |= SendFlags::INLINE;
        }
        let mut wr = wr.with_flags(flags);
        if let Some(d) = ud {
            wr = wr.with_ud(d);
        }
        env.post_send(p.a.qpn, wr);

        let swc = env.poll_one(p.a.cq);
        assert_eq!(
            (swc.wr_id, swc.status, swc.opcode),
            (wr_id, WcStatus::Success, op.send_opcode()),
            "{what}: sender's completion {swc:?}"
        );
        if swc.wc_flags != op.send_flags() {
            wrong.push(format!(
                "{what}: sender's wc_flags {:?}, expected {:?}",
                swc.wc_flags,
                op.send_flags()
            ));
        }
        if op.consumes_recv() {
            let rwc = env.poll_one(p.b.cq);
            let want_op = if op == Op::WriteImm {
                WcOpcode::RecvRdmaWithImm
            } else {
                WcOpcode::Recv
            };
            assert_eq!(
                (rwc.wr_id, rwc.status, rwc.opcode),
                (recv_id, WcStatus::Success, want_op),
                "{what}: receiver's completion {rwc:?}"
            );
            if rwc.wc_flags != op.recv_flags() {
                wrong.push(format!(
                    "{what}: receiver's wc_flags {:?}, expected {:?}",
                    rwc.wc_flags,
                    op.recv_flags()
                ));
            }
            if op.has_imm() {
                assert_eq!(rwc.imm_data, imm, "{what}: receiver's imm_data {rwc:?}");
            }
        }
    }
    // Every difference in one line: the result tables show a failure's first line.
    assert!(wrong.is_empty(), "{}", wrong.join("; "));
    Outcome::Pass
}

/// The send WR of `op` from `a` at `off` to `b` at `off` (atomics on the 8-byte word
/// there), without flags.
fn build(op: Op, wr_id: u64, a: &End, b: &End, off: u64, len: u32, imm: u32) -> SendWr {
    let sg = vec![a.sge(off, len)];
    match op {
        Op::Send => SendWr::send(wr_id, sg),
        Op::SendImm => SendWr::send_with_imm(wr_id, sg, imm),
        Op::Write => SendWr::rdma_write(wr_id, sg, b.addr(off), b.mr.rkey),
        Op::WriteImm => SendWr::rdma_write_with_imm(wr_id, sg, b.addr(off), b.mr.rkey, imm),
        Op::Read => SendWr::rdma_read(wr_id, sg, b.addr(off), b.mr.rkey),
        Op::CmpSwap => SendWr::atomic_cmp_swp(wr_id, a.sge(off, 8), b.addr(off), b.mr.rkey, 0, 1),
        Op::FetchAdd => SendWr::atomic_fetch_add(wr_id, a.sge(off, 8), b.addr(off), b.mr.rkey, 1),
    }
}
