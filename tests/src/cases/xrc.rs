//! XRC, eXtended Reliable Connected transport (IBTA annex A14; manual 3.4.8-3.4.14;
//! libibverbs `ibv_open_xrcd(3)`, `ibv_create_srq_ex(3)`, `ibv_open_qp(3)`): an XRC
//! send QP (send queue only) reaches any XRC SRQ of the target's XRC domain through one
//! XRC receive QP (no queues), each WR naming its SRQ; the receive completes on that
//! SRQ's CQ. A request naming an SRQ that is not an XRC SRQ of the receive QP's domain
//! is an invalid request.
//!
//! A device that does not report `IBV_DEVICE_XRC` skips these cases (kernel rxe has
//! no XRC), and so does a backend whose `open_xrcd` is EOPNOTSUPP (HwDevice, which
//! does not pass the XRC verbs through yet).

use verbs_api::{
    AsyncEventType as E, CqId, DeviceCapFlags, EventElement, MemBuf, MrInfo, PdId, QpInitAttr,
    QpState, QpType, RecvWr, SendFlags, SendWr, Sge, SrqAttr, SrqId, WcOpcode, WcStatus as S,
    WorkCompletion, XrcdId, XrcdOpen,
};

use super::errno::{EBUSY, EINVAL, EOPNOTSUPP};
use super::{assert_errno, assert_untouched, UNTOUCHED};
use crate::env::{all_access, default_cap};
use crate::{Case, Env, Outcome};

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("xrc::send_reaches_the_srq_it_names", "IBTA XRC annex (A14), man page ibv_create_srq_ex(3): each SEND of an XRC send QP goes, through one XRC receive QP, to the XRC SRQ its WR names (remote_srqn, carried in the XRCETH) and completes on that SRQ's CQ with the receive QP's number", send_reaches_each_srq).wc(S::Success));
    v.push(Case::new("xrc::write_read_and_write_with_imm", "IBTA XRC annex (A14): RDMA WRITE and READ through an XRC receive QP check the R_Key in the named XRC SRQ's PD and move the bytes; a WRITE with immediate consumes a receive of that SRQ, completing on its CQ", write_read_imm).wc(S::Success));
    v.push(Case::new("xrc::srq_of_another_domain_is_rem_inv_req_err", "IBTA XRC annex (A14): a request naming an XRC SRQ of another XRC domain is an invalid request: REM_INV_REQ_ERR for the initiator, nothing written, QP_REQ_ERR on the XRC receive QP", srq_of_another_domain).wc(S::RemInvReqErr).event(E::QpReqErr));
    v.push(Case::new("xrc::unknown_srq_number_is_rem_inv_req_err", "IBTA XRC annex (A14): a request naming no XRC SRQ (a number that is no SRQ, or an ordinary SRQ) is an invalid request: REM_INV_REQ_ERR, nothing written", unknown_srq).wc(S::RemInvReqErr));
    v.push(Case::new("xrc::after_an_error_wrs_are_flushed", "IBTA 10.3.1 (RC rules, which XRC keeps): once the XRC send QP is in error, its later WRs complete with WR_FLUSH_ERR", flushed_after_error).wc(S::RemInvReqErr).wc(S::WrFlushErr));
    v.push(Case::new("xrc::verbs_refuse_what_xrc_qps_lack", "man pages ibv_post_recv(3), ibv_post_send(3), ibv_get_srq_num(3): neither XRC QP has a receive queue (EINVAL), an XRC send WR needs remote_srqn (EINVAL), an ordinary SRQ has no XRC number (EINVAL), an XRC receive QP needs an XRC domain (EINVAL)", refusals));
    v.push(Case::new("xrc::xrcd_open_and_close_rules", "man page ibv_open_xrcd(3), manual 3.4.8: an inode without a domain needs O_CREAT, O_CREAT|O_EXCL on an inode with one fails (EINVAL); opens of one inode share the domain; the last close of a domain that has an XRC SRQ is EBUSY", xrcd_rules));
    v.push(Case::new("xrc::open_qp_holds_the_receive_qp", "man page ibv_open_qp(3): an XRC receive QP opened by number in its domain lives until every holder destroyed it; opening it through another domain is EINVAL", open_qp_holds));
}

/// Skips unless the device reports XRC and the backend has the XRC verbs (HwDevice
/// does not yet: EOPNOTSUPP, even on a NIC that reports XRC).
fn needs_xrc(env: &Env) -> Option<Outcome> {
    let attr = env.dev.query_device().expect("query_device");
    if !attr.device_cap_flags.contains(DeviceCapFlags::XRC) {
        return Some(Outcome::Skip(
            "the device does not report IBV_DEVICE_XRC (kernel rxe has no XRC)".to_string(),
        ));
    }
    match env.dev.open_xrcd(&PRIVATE) {
        Ok(x) => {
            env.dev.close_xrcd(x).expect("close_xrcd");
            None
        }
        Err(e) if e.errno() == EOPNOTSUPP => {
            Some(Outcome::Skip(format!("the backend has no XRC verbs: {e}")))
        }
        Err(e) => panic!("open_xrcd: {e:?}"),
    }
}

const PRIVATE: XrcdOpen = XrcdOpen {
    inode: None,
    create: true,
    exclusive: false,
};

/// One XRC connection: an XRC send QP `ini` (CQ `ini_cq`) connected to an XRC receive
/// QP `tgt` of a private XRC domain, two XRC SRQs of that domain with a CQ each, memory on
/// both sides in one PD.
struct Xrc {
    pd: PdId,
    ini: u32,
    ini_cq: CqId,
    tgt: u32,
    srqs: [(SrqId, CqId); 2],
    src: (MemBuf, MrInfo),
    dst: (MemBuf, MrInfo),
}

impl Xrc {
    fn new(env: &Env) -> Xrc {
        let dev = &env.dev;
        let pd = env.pd();
        let xrcd = dev.open_xrcd(&PRIVATE).expect("open_xrcd");
        let srqs = [0, 1].map(|_| {
            let cq = env.cq(64);
            (xrc_srq(env, pd, xrcd, cq), cq)
        });
        let ini_cq = env.cq(64);
        let ini = dev
            .create_qp(
                &QpInitAttr::new(pd, ini_cq, QpType::XrcSend, default_cap()).sq_sig_all(true),
            )
            .expect("create_qp XRC_SEND");
        let tgt = dev.create_xrc_recv_qp(xrcd).expect("create XRC_RECV QP");
        let params = env.params();
        env.raise(
            ini,
            QpType::XrcSend,
            &params,
            100,
            &env.endpoint(tgt, 200),
            QpState::Reset,
            QpState::Rts,
        );
        env.raise(
            tgt,
            QpType::XrcRecv,
            &params,
            200,
            &env.endpoint(ini, 100),
            QpState::Reset,
            QpState::Rts,
        );
        let src = env.mr(pd, 4096, all_access());
        let dst = env.mr(pd, 4096, all_access());
        dst.0.fill(UNTOUCHED);
        Xrc {
            pd,
            ini,
            ini_cq,
            tgt,
            srqs,
            src,
            dst,
        }
    }

    fn srqn(&self, env: &Env, i: usize) -> u32 {
        env.dev.get_srq_num(self.srqs[i].0).expect("get_srq_num")
    }

    fn src_sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.src.1.addr + off,
            length: len,
            lkey: self.src.1.lkey,
        }
    }

    /// Posts a receive of `len` bytes at `off` of the target memory on SRQ `i`.
    fn post_srq_recv(&self, env: &Env, i: usize, wr_id: u64, off: u64, len: u32) {
        let sge = Sge {
            addr: self.dst.1.addr + off,
            length: len,
            lkey: self.dst.1.lkey,
        };
        env.dev
            .post_srq_recv(self.srqs[i].0, &[RecvWr::new(wr_id, sge)])
            .expect("post_srq_recv");
    }

    fn send(&self, env: &Env, wr: SendWr) -> WorkCompletion {
        env.post_send(self.ini, wr.with_flags(SendFlags::SIGNALED));
        env.poll_one(self.ini_cq)
    }
}

fn xrc_srq(env: &Env, pd: PdId, xrcd: XrcdId, cq: CqId) -> SrqId {
    let attr = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    env.dev
        .create_xrc_srq(pd, xrcd, cq, &attr)
        .expect("create_srq_ex XRC")
}

fn send_reaches_each_srq(env: &Env) -> Outcome {
    if let Some(skip) = needs_xrc(env) {
        return skip;
    }
    let x = Xrc::new(env);
    x.post_srq_recv(env, 0, 10, 0, 64);
    x.post_srq_recv(env, 1, 20, 1024, 64);
    x.src.0.write(0, b"to the first SRQ").unwrap();
    x.src
        .0
        .write(100, b"and to the second, with immediate")
        .unwrap();
    let n = [x.srqn(env, 0), x.srqn(env, 1)];
    assert_ne!(n[0], n[1]);
    let wc = x.send(env, SendWr::send(1, x.src_sge(0, 16)).with_xrc_srqn(n[0]));
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (1, S::Success, WcOpcode::Send),
        "{wc:?}"
    );
    let wc = x.send(
        env,
        SendWr::send_with_imm(2, x.src_sge(100, 33), 0xCAFE).with_xrc_srqn(n[1]),
    );
    assert_eq!((wc.wr_id, wc.status), (2, S::Success), "{wc:?}");
    let r0 = env.poll_one(x.srqs[0].1);
    assert_eq!(
        (r0.wr_id, r0.status, r0.opcode, r0.byte_len, r0.qp_num),
        (10, S::Success, WcOpcode::Recv, 16, x.tgt),
        "{r0:?}"
    );
    let r1 = env.poll_one(x.srqs[1].1);
    assert_eq!(
        (r1.wr_id, r1.status, r1.byte_len, r1.imm_data, r1.qp_num),
        (20, S::Success, 33, 0xCAFE, x.tgt),
        "{r1:?}"
    );
    let mut got = [0u8; 33];
    x.dst.0.read(0, &mut got[..16]).unwrap();
    assert_eq!(&got[..16], b"to the first SRQ");
    x.dst.0.read(1024, &mut got).unwrap();
    assert_eq!(&got, b"and to the second, with immediate");
    Outcome::Pass
}

fn write_read_imm(env: &Env) -> Outcome {
    if let Some(skip) = needs_xrc(env) {
        return skip;
    }
    let x = Xrc::new(env);
    let n0 = x.srqn(env, 0);
    x.src.0.write(0, b"written through XRC").unwrap();
    let wc = x.send(
        env,
        SendWr::rdma_write(1, x.src_sge(0, 19), x.dst.1.addr + 256, x.dst.1.rkey).with_xrc_srqn(n0),
    );
    assert_eq!(
        (wc.status, wc.opcode),
        (S::Success, WcOpcode::RdmaWrite),
        "{wc:?}"
    );
    let mut got = [0u8; 19];
    x.dst.0.read(256, &mut got).unwrap();
    assert_eq!(&got, b"written through XRC");
    x.dst.0.write(2048, b"read back").unwrap();
    let wc = x.send(
        env,
        SendWr::rdma_read(2, x.src_sge(512, 9), x.dst.1.addr + 2048, x.dst.1.rkey)
            .with_xrc_srqn(n0),
    );
    assert_eq!(
        (wc.status, wc.opcode),
        (S::Success, WcOpcode::RdmaRead),
        "{wc:?}"
    );
    let mut back = [0u8; 9];
    x.src.0.read(512, &mut back).unwrap();
    assert_eq!(&back, b"read back");
    x.post_srq_recv(env, 1, 30, 3072, 16);
    let wc = x.send(
        env,
        SendWr::rdma_write_with_imm(3, x.src_sge(0, 8), x.dst.1.addr + 3584, x.dst.1.rkey, 7)
            .with_xrc_srqn(x.srqn(env, 1)),
    );
    assert_eq!(wc.status, S::Success, "{wc:?}");
    let r = env.poll_one(x.srqs[1].1);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.imm_data, r.qp_num),
        (30, S::Success, WcOpcode::RecvRdmaWithImm, 7, x.tgt),
        "{r:?}"
    );
    Outcome::Pass
}

fn srq_of_another_domain(env: &Env) -> Outcome {
    if let Some(skip) = needs_xrc(env) {
        return skip;
    }
    let x = Xrc::new(env);
    let other = env.dev.open_xrcd(&PRIVATE).expect("open_xrcd");
    let cq = env.cq(16);
    let foreign = xrc_srq(env, x.pd, other, cq);
    let sge = Sge {
        addr: x.dst.1.addr,
        length: 64,
        lkey: x.dst.1.lkey,
    };
    env.dev
        .post_srq_recv(foreign, &[RecvWr::new(40, sge)])
        .expect("post_srq_recv");
    let n = env.dev.get_srq_num(foreign).expect("get_srq_num");
    let wc = x.send(env, SendWr::send(1, x.src_sge(0, 32)).with_xrc_srqn(n));
    assert_eq!(wc.status, S::RemInvReqErr, "{wc:?}");
    assert_untouched(&x.dst.0, "the other domain's receive buffer");
    let ev = env.next_event();
    assert_eq!(
        (ev.event_type, ev.element),
        (E::QpReqErr, EventElement::Qp(x.tgt)),
        "{ev:?}"
    );
    assert_eq!(env.state_of(x.tgt), QpState::Err);
    Outcome::Pass
}

fn unknown_srq(env: &Env) -> Outcome {
    if let Some(skip) = needs_xrc(env) {
        return skip;
    }
    let x = Xrc::new(env);
    // An ordinary SRQ of the same PD: not an XRC SRQ. Its handle is tried as a
    // number, as is a number far from any SRQ.
    let plain = env
        .dev
        .create_srq(
            x.pd,
            &SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .expect("create_srq");
    let wc = x.send(
        env,
        SendWr::send(1, x.src_sge(0, 8)).with_xrc_srqn(0xFF_FFF0),
    );
    assert_eq!(wc.status, S::RemInvReqErr, "{wc:?}");
    let y = Xrc::new(env);
    let wc = y.send(env, SendWr::send(2, y.src_sge(0, 8)).with_xrc_srqn(plain.0));
    assert_eq!(wc.status, S::RemInvReqErr, "{wc:?}");
    assert_untouched(&x.dst.0, "the target memory");
    assert_untouched(&y.dst.0, "the target memory");
    Outcome::Pass
}

fn flushed_after_error(env: &Env) -> Outcome {
    if let Some(skip) = needs_xrc(env) {
        return skip;
    }
    let x = Xrc::new(env);
    env.post_send(
        x.ini,
        SendWr::send(1, x.src_sge(0, 8)).with_xrc_srqn(0xFF_FFF0),
    );
    env.post_send(
        x.ini,
        SendWr::send(2, x.src_sge(0, 8)).with_xrc_srqn(x.srqn(env, 0)),
    );
    let first = env.poll_one(x.ini_cq);
    assert_eq!(
        (first.wr_id, first.status),
        (1, S::RemInvReqErr),
        "{first:?}"
    );
    let second = env.poll_one(x.ini_cq);
    assert_eq!(
        (second.wr_id, second.status),
        (2, S::WrFlushErr),
        "{second:?}"
    );
    let wc = x.send(
        env,
        SendWr::send(3, x.src_sge(0, 8)).with_xrc_srqn(x.srqn(env, 0)),
    );
    assert_eq!((wc.wr_id, wc.status), (3, S::WrFlushErr), "{wc:?}");
    Outcome::Pass
}

fn refusals(env: &Env) -> Outcome {
    if let Some(skip) = needs_xrc(env) {
        return skip;
    }
    let x = Xrc::new(env);
    let recv = RecvWr::new(1, x.src_sge(0, 8));
    for qpn in [x.ini, x.tgt] {
        let e = env
            .dev
            .post_recv(qpn, std::slice::from_ref(&recv))
            .unwrap_err();
        assert_eq!(
            (e.index, e.error.errno()),
            (0, EINVAL),
            "post_recv on {qpn}"
        );
    }
    let e = env
        .dev
        .post_send(x.ini, &[SendWr::send(2, x.src_sge(0, 8))])
        .unwrap_err();
    assert_eq!(e.error.errno(), EINVAL, "a WR without remote_srqn");
    let plain = env
        .dev
        .create_srq(
            x.pd,
            &SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .expect("create_srq");
    assert_errno(env.dev.get_srq_num(plain), EINVAL);
    let cq = env.cq(4);
    assert_errno(
        env.dev
            .create_qp(&QpInitAttr::new(x.pd, cq, QpType::XrcRecv, default_cap())),
        EINVAL,
    );
    Outcome::Pass
}

fn xrcd_rules(env: &Env) -> Outcome {
    if let Some(skip) = needs_xrc(env) {
        return skip;
    }
    let dev = &env.dev;
    // An inode no domain has (the emulator and the kernel key domains by inode).
    let file = |create, exclusive| XrcdOpen {
        inode: Some(0x5852_4300_0000_0001),
        create,
        exclusive,
    };
    assert_errno(dev.open_xrcd(&file(false, false)), EINVAL);
    let a = dev
        .open_xrcd(&file(true, true))
        .expect("O_CREAT|O_EXCL on a new inode");
    assert_errno(dev.open_xrcd(&file(true, true)), EINVAL);
    let b = dev
        .open_xrcd(&file(false, false))
        .expect("joining the inode's domain");
    let pd = env.pd();
    let cq = env.cq(4);
    // A SRQ made through the second open belongs to the shared domain.
    let srq = xrc_srq(env, pd, b, cq);
    dev.close_xrcd(a).expect("the first close keeps the domain");
    assert_errno(dev.close_xrcd(b), EBUSY);
    dev.destroy_srq(srq).expect("destroy_srq");
    dev.close_xrcd(b).expect("the last close");
    assert_errno(dev.open_xrcd(&file(false, false)), EINVAL);
    Outcome::Pass
}

fn open_qp_holds(env: &Env) -> Outcome {
    if let Some(skip) = needs_xrc(env) {
        return skip;
    }
    let dev = &env.dev;
    let xrcd = dev.open_xrcd(&PRIVATE).expect("open_xrcd");
    let other = dev.open_xrcd(&PRIVATE).expect("open_xrcd");
    let qpn = dev.create_xrc_recv_qp(xrcd).expect("XRC_RECV QP");
    assert_errno(dev.open_qp(other, qpn), EINVAL);
    dev.open_qp(xrcd, qpn).expect("ibv_open_qp in its domain");
    assert_errno(dev.close_xrcd(xrcd), EBUSY);
    dev.destroy_qp(qpn).expect("the creator's destroy");
    let (attr, _) = dev.query_qp(qpn).expect("the opener still holds the QP");
    assert_eq!(attr.qp_state, QpState::Reset);
    dev.destroy_qp(qpn).expect("the opener's destroy");
    assert_errno(dev.query_qp(qpn), EINVAL);
    dev.close_xrcd(xrcd).expect("close_xrcd");
    dev.close_xrcd(other).expect("close_xrcd");
    Outcome::Pass
}
