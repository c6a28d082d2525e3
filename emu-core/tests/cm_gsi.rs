//! QP1, the GSI QP, in the engine (IBTA 13.5.1): made with `QpType::Driver`, number 1,
//! one per device, its Q_Key fixed at 0x8001_0000 whatever `modify_qp` says; a datagram
//! with another Q_Key is dropped and counted.

use std::net::Ipv4Addr;

use emu_core::engine::{GSI_QKEY, GSI_QPN};
use emu_sims::Fabric;
use verbs_api::*;

fn ud_init(dev: &dyn Device, pd: PdId, cq: CqId, qp_type: QpType) -> u32 {
    dev.create_qp(&QpInitAttr::new(pd, cq, qp_type, QpCap::new(8, 8)).sq_sig_all(true))
        .unwrap()
}

#[test]
fn qp1_takes_only_the_gsi_qkey() {
    let fabric = Fabric::new(1);
    let dev = fabric
        .add_device("dut", Ipv4Addr::new(192, 0, 2, 9))
        .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(32, None).unwrap();
    let gsi = ud_init(&*dev, pd, cq, QpType::Driver);
    assert_eq!(gsi, GSI_QPN);
    let again = dev.create_qp(&QpInitAttr::new(pd, cq, QpType::Driver, QpCap::default()));
    assert_eq!(again.unwrap_err().errno(), 16);
    let wrong = QpParams {
        qkey: 0x1234,
        ..QpParams::default()
    };
    connect_qp(&*dev, gsi, QpType::Ud, &wrong, 0, &Endpoint::default()).unwrap();
    let (attr, init) = dev.query_qp(gsi).unwrap();
    assert_eq!((attr.qkey, init.qp_type), (GSI_QKEY, QpType::Ud));

    let sender = ud_init(&*dev, pd, cq, QpType::Ud);
    connect_qp(&*dev, sender, QpType::Ud, &wrong, 0, &Endpoint::default()).unwrap();
    let buf = MemBuf::new(1024);
    let mr = dev
        .reg_mr(pd, &buf, 0, 1024, AccessFlags::LOCAL_WRITE)
        .unwrap();
    dev.post_recv(
        gsi,
        &[RecvWr::new(
            7,
            vec![Sge {
                addr: mr.addr,
                length: 512,
                lkey: mr.lkey,
            }],
        )],
    )
    .unwrap();
    let ah = dev
        .create_ah(pd, &QpParams::default().ah_attr(dev.gid()))
        .unwrap();
    // A Q_Key with the high bit set is a controlled one (IBTA 10.2.5): the WR's says
    // "take the QP's", so only a QP whose own Q_Key is the GSI one can send it.
    let gsi_sender = ud_init(&*dev, pd, cq, QpType::Ud);
    let gsi_params = QpParams {
        qkey: GSI_QKEY,
        ..QpParams::default()
    };
    connect_qp(
        &*dev,
        gsi_sender,
        QpType::Ud,
        &gsi_params,
        0,
        &Endpoint::default(),
    )
    .unwrap();
    let send = |from: u32, qkey: u32, wr_id: u64| {
        let wr = SendWr::send(
            wr_id,
            vec![Sge {
                addr: mr.addr + 512,
                length: 256,
                lkey: mr.lkey,
            }],
        )
        .with_ud(UdDest {
            ah,
            remote_qpn: GSI_QPN,
            remote_qkey: qkey,
        });
        dev.post_send(from, &[wr]).unwrap();
    };
    let poll_all = || {
        let mut out = Vec::new();
        for _ in 0..100 {
            dev.poll_cq(cq, 16, &mut out).unwrap();
        }
        out
    };
    send(sender, 0x1234, 1);
    let wcs = poll_all();
    assert!(wcs.iter().all(|w| w.wr_id != 7), "{wcs:?}");
    assert_eq!(dev.counters().qkey_violations, 1);
    send(sender, GSI_QKEY, 2);
    assert!(poll_all().iter().all(|w| w.wr_id != 7));
    assert_eq!(dev.counters().qkey_violations, 2);
    send(gsi_sender, GSI_QKEY, 3);
    let wcs = poll_all();
    let rx = wcs.iter().find(|w| w.wr_id == 7).expect("QP1 received");
    assert_eq!(
        (rx.status, rx.src_qp, rx.byte_len),
        (WcStatus::Success, gsi_sender, 296)
    );
}
