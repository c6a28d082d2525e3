//! The Starting PSN of a REQ and of a REP, as a kernel's CM means them: each side puts
//! in its message the PSN its own receive queue expects, and the peer sends from it
//! (kernel cm.c: the REQ's is the active side's rq_psn and the passive side's sq_psn,
//! the REP's the other way round; seen on the wire against kernel rxe, docs/interop.md).
//! The REP also carries the REQ's transaction ID, as the kernel's does.
//! Here a peer made of bare verbs (its own QP1, the MADs built by hand, as a kernel
//! would send them) connects to an emulated listener.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use emu_cm::{CmConfig, EmuCm};
use emu_core::engine::{GRH_LEN, GSI_QKEY, GSI_QPN};
use emu_sims::Fabric;
use emu_wire::mad::{CmMsg, CmaHdr, Req, MAD_LEN, TRANSPORT_RC};
use verbs_api::*;

const S: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const P: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);
const PORT: u16 = 7174;

fn init(pd: PdId, cq: CqId, qp_type: QpType) -> QpInitAttr {
    QpInitAttr::new(pd, cq, qp_type, QpCap::new(8, 8)).sq_sig_all(true)
}

#[test]
fn each_side_sends_from_the_psn_the_other_announced() {
    let fabric = Fabric::new(3);
    let sdev: Arc<dyn Device> = fabric.add_device("server", S).unwrap();
    let cm = EmuCm::on_fabric(&fabric, vec![sdev.clone()], CmConfig::default()).unwrap();
    let ch = cm.create_event_channel().unwrap();
    let l = cm.create_id(ch, PortSpace::Tcp).unwrap();
    cm.bind_addr(l, SocketAddr::from((S, PORT))).unwrap();
    cm.listen(l, 0).unwrap();

    // The bare peer: QP1 at RTS, one receive posted, and an RC QP the REQ names.
    let peer = fabric.add_device("peer", P).unwrap();
    let pd = peer.alloc_pd().unwrap();
    let cq = peer.create_cq(32, None).unwrap();
    let gsi = peer.create_qp(&init(pd, cq, QpType::Driver)).unwrap();
    assert_eq!(gsi, GSI_QPN);
    let ud = QpParams {
        qkey: GSI_QKEY,
        ..QpParams::default()
    };
    connect_qp(&*peer, gsi, QpType::Ud, &ud, 0, &Endpoint::default()).unwrap();
    let rc = peer.create_qp(&init(pd, cq, QpType::Rc)).unwrap();
    let buf = MemBuf::new(1024);
    let mr = peer
        .reg_mr(pd, &buf, 0, 1024, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let sge = |off: u64, length: u32| Sge {
        addr: mr.addr + off,
        length,
        lkey: mr.lkey,
    };
    peer.post_recv(gsi, &[RecvWr::new(1, vec![sge(0, 512)])])
        .unwrap();

    let req_psn = 0x12_3456;
    let req = CmMsg::Req(Req {
        local_comm_id: 0x0C9C_76AD,
        service_id: PortSpace::Tcp.service_id(PORT),
        local_ca_guid: 0x5054_00FF_FE12_3456,
        local_qpn: rc,
        responder_resources: 1,
        initiator_depth: 1,
        remote_cm_response_timeout: 20,
        transport: TRANSPORT_RC,
        starting_psn: req_psn,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu: 3,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        local_lid: 0xFFFF,
        remote_lid: 0xFFFF,
        local_gid: Gid::from_ipv4(P).0,
        remote_gid: Gid::from_ipv4(S).0,
        hop_limit: 64,
        local_ack_timeout: 19,
        private_data: CmaHdr {
            src_port: 40000,
            src: P.into(),
            dst: S.into(),
        }
        .wrap(&[]),
        ..Req::default()
    })
    .encode(0x2_0C9C_76AD);
    buf.write(512, &req).unwrap();
    let ah = peer
        .create_ah(pd, &QpParams::default().ah_attr(Gid::from_ipv4(S)))
        .unwrap();
    let wr = SendWr::send(2, vec![sge(512, MAD_LEN as u32)]).with_ud(UdDest {
        ah,
        remote_qpn: GSI_QPN,
        remote_qkey: GSI_QKEY,
    });
    peer.post_send(gsi, &[wr]).unwrap();

    let e = cm.get_cm_event(ch, None).unwrap();
    assert_eq!(e.event, CmEventType::ConnectRequest, "{e:?}");
    let spd = sdev.alloc_pd().unwrap();
    let scq = sdev.create_cq(32, None).unwrap();
    let sqp = cm.create_qp(e.id, &init(spd, scq, QpType::Rc)).unwrap();
    cm.accept(
        e.id,
        &ConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            ..ConnParam::default()
        },
    )
    .unwrap();

    // The REP on the peer's QP1.
    let mut wcs = Vec::new();
    for _ in 0..1000 {
        peer.poll_cq(cq, 8, &mut wcs).unwrap();
        if wcs.iter().any(|w| w.wr_id == 1) || !fabric.step() {
            break;
        }
    }
    let rx = wcs.iter().find(|w| w.wr_id == 1).expect("a REP came");
    assert_eq!(rx.status, WcStatus::Success);
    let mut mad = [0u8; MAD_LEN];
    buf.read(GRH_LEN, &mut mad).unwrap();
    let Ok((tid, CmMsg::Rep(rep))) = CmMsg::decode(&mad) else {
        panic!("not a REP: {mad:?}");
    };
    // The REP answers in the REQ's transaction (kernel cm.c keeps the REQ's TID).
    assert_eq!(tid, 0x2_0C9C_76AD);

    let (attr, _) = sdev.query_qp(sqp).unwrap();
    // The passive side sends from the REQ's Starting PSN and expects the REP's.
    assert_eq!(attr.sq_psn, req_psn);
    assert_eq!(attr.rq_psn, rep.starting_psn);
    assert_ne!(rep.starting_psn, req_psn);
}
