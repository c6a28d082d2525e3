//! XRC on the wire, two engines on virtual time (engine module `xrc`): an XRC send QP
//! on A, an XRC receive QP with two XRC SRQs of one domain on B. Every request A sends
//! is an XRC opcode (0xA0 + n) whose XRCETH names the WR's SRQ, in every packet of a
//! multi-packet message; B answers with XRC responses, which carry no XRCETH; a SEND
//! to an empty XRC SRQ is RNR-NAKed and delivered once a receive is posted.

mod util;

use std::cell::RefCell;
use std::rc::Rc;

use emu_core::engine::SrqAttr;
use emu_wire::Opcode;
use util::*;
use verbs_api::{
    QpCap, QpInitAttr, QpType, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus, XrcdOpen,
};

/// (from, opcode, XRC SRQ number in the XRCETH, if any) of every packet.
type Seen = Rc<RefCell<Vec<(Side, Opcode, Option<u32>)>>>;

struct Setup {
    p: Engines,
    a: Node,
    xrc_qpn: u32,
    tgt: u32,
    srqs: [(u32, verbs_api::SrqId, verbs_api::CqId); 2],
    b: Node,
    seen: Seen,
}

fn setup() -> Setup {
    let cfg = Config::default();
    let mut p = Engines::default();
    // A: an XRC send QP (its node's RC QP is unused).
    let a = util::setup(&mut p.a, Side::A, &cfg);
    let xrc_qpn =
        p.a.create_qp(
            QpInitAttr::new(
                a.pd,
                a.cq,
                QpType::XrcSend,
                QpCap {
                    max_send_wr: 16,
                    max_send_sge: 2,
                    ..QpCap::default()
                },
            )
            .sq_sig_all(true),
        )
        .unwrap();
    // B: a domain, two XRC SRQs with a CQ each, an XRC receive QP; memory in B's PD.
    let b = util::setup(&mut p.b, Side::B, &cfg);
    let xrcd =
        p.b.open_xrcd(&XrcdOpen {
            inode: None,
            create: true,
            exclusive: false,
        })
        .unwrap();
    let srqs = [0, 1].map(|_| {
        let cq = p.b.create_cq(16).unwrap();
        let attr = SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        };
        let srq = p.b.create_xrc_srq(b.pd, xrcd, cq, attr).unwrap();
        (p.b.get_srq_num(srq).unwrap(), srq, cq)
    });
    let tgt = p.b.create_xrc_recv_qp(xrcd).unwrap();
    let now = p.now;
    let mut ini_cfg = cfg;
    ini_cfg.qp_type = QpType::XrcSend;
    let mut tgt_cfg = cfg;
    tgt_cfg.qp_type = QpType::XrcRecv;
    let to_b = Remote {
        qpn: tgt,
        gid: gid(Side::B),
        psn: cfg.sq_psn[1],
    };
    let to_a = Remote {
        qpn: xrc_qpn,
        gid: gid(Side::A),
        psn: cfg.sq_psn[0],
    };
    bring_up(&mut p.a, now, xrc_qpn, to_b, cfg.sq_psn[0], &ini_cfg);
    bring_up(&mut p.b, now, tgt, to_a, cfg.sq_psn[1], &tgt_cfg);
    let seen: Seen = Rc::default();
    let s = seen.clone();
    p.set_rule(move |side, repr, _| {
        s.borrow_mut()
            .push((side, repr.bth.opcode, repr.xrceth.map(|x| x.xrc_srqn)));
        Action::Deliver
    });
    Setup {
        p,
        a,
        xrc_qpn,
        tgt,
        srqs,
        b,
        seen,
    }
}

impl Setup {
    fn post(&mut self, wr: SendWr) {
        let now = self.p.now;
        self.p
            .a
            .post_send(now, self.xrc_qpn, &[wr.with_flags(SendFlags::SIGNALED)])
            .unwrap();
    }

    fn srq_recv(&mut self, i: usize, wr_id: u64, off: u64, len: u32) {
        let now = self.p.now;
        let wr = RecvWr::new(wr_id, self.b.sge(off, len));
        self.p.b.post_srq_recv(now, self.srqs[i].1, &[wr]).unwrap();
    }

    fn srq_cq(&mut self, i: usize) -> Vec<verbs_api::WorkCompletion> {
        let mut out = Vec::new();
        self.p.b.poll_cq(self.srqs[i].2, 16, &mut out).unwrap();
        out
    }
}

#[test]
fn requests_carry_the_xrceth_responses_do_not() {
    let mut s = setup();
    let data = pattern(3000, 7);
    s.a.write_bytes(0, &data);
    s.srq_recv(1, 20, 0, 4096);
    let n1 = s.srqs[1].0;
    // 3000 bytes at MTU 1024: FIRST, MIDDLE, LAST, each naming SRQ 1.
    s.post(SendWr::send(1, s.a.sge(0, 3000)).with_xrc_srqn(n1));
    s.p.drive();
    let wcs = s.a.poll(&mut s.p);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    let r = s.srq_cq(1);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].byte_len, r[0].qp_num),
        (20, WcOpcode::Recv, 3000, s.tgt)
    );
    assert!(s.srq_cq(0).is_empty());
    assert_eq!(s.b.read_bytes(0, 3000), data);
    let seen = s.seen.borrow().clone();
    let requests: Vec<_> = seen.iter().filter(|x| x.0 == Side::A).collect();
    assert_eq!(
        requests.iter().map(|x| (x.1, x.2)).collect::<Vec<_>>(),
        vec![
            (Opcode::XrcSendFirst, Some(n1)),
            (Opcode::XrcSendMiddle, Some(n1)),
            (Opcode::XrcSendLast, Some(n1)),
        ]
    );
    let responses: Vec<_> = seen.iter().filter(|x| x.0 == Side::B).collect();
    assert!(!responses.is_empty());
    for r in responses {
        assert_eq!((r.1, r.2), (Opcode::XrcAcknowledge, None), "{r:?}");
    }

    // A READ: request with XRCETH (and RETH), responses XRC READ RESPONSEs.
    s.seen.borrow_mut().clear();
    s.b.write_bytes(8192, b"read me back");
    let n0 = s.srqs[0].0;
    let raddr = s.b.mr.addr + 8192;
    let rkey = s.b.mr.rkey;
    s.post(SendWr::rdma_read(2, s.a.sge(4096, 12), raddr, rkey).with_xrc_srqn(n0));
    s.p.drive();
    let wcs = s.a.poll(&mut s.p);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, WcStatus::Success));
    assert_eq!(s.a.read_bytes(4096, 12), b"read me back");
    assert_eq!(
        s.seen.borrow().clone(),
        vec![
            (Side::A, Opcode::XrcRdmaReadRequest, Some(n0)),
            (Side::B, Opcode::XrcRdmaReadResponseOnly, None),
        ]
    );
}

#[test]
fn an_empty_xrc_srq_is_rnr_naked_until_a_receive_is_posted() {
    let mut s = setup();
    s.a.write_bytes(0, b"wait for it");
    let n0 = s.srqs[0].0;
    s.post(SendWr::send(1, s.a.sge(0, 11)).with_xrc_srqn(n0));
    s.p.drive_for(std::time::Duration::from_millis(1));
    assert!(s.a.poll(&mut s.p).is_empty(), "not before a receive");
    let rnr =
        s.p.log
            .iter()
            .any(|r| r.opcode == Opcode::XrcAcknowledge && r.syndrome.is_some_and(|x| x >> 5 == 1));
    assert!(rnr, "an RNR NAK: {:?}", s.p.trace());
    s.srq_recv(0, 30, 100, 64);
    s.p.drive();
    let wcs = s.a.poll(&mut s.p);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    let r = s.srq_cq(0);
    assert_eq!((r[0].wr_id, r[0].byte_len), (30, 11));
    assert_eq!(s.b.read_bytes(100, 11), b"wait for it");
}
