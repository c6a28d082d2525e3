//! Memory windows through the `Device` trait on an EmuDevice over UDP: alloc, bind
//! (type 1 verb, type 2 work request), access, remote invalidation, dealloc, errnos.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::*;

fn wait(d: &EmuDevice, cq: CqId) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::new();
    while out.is_empty() {
        assert!(Instant::now() < deadline, "no completion within 5 s");
        d.poll_cq(cq, 1, &mut out).unwrap();
        std::thread::yield_now();
    }
    out[0]
}

/// Two RC QPs of one device connected to each other (the device talks to itself).
fn rc_pair(d: &EmuDevice, pd: PdId, cq: CqId) -> (u32, u32) {
    let cap = QpCap::new(16, 16);
    let init = QpInitAttr::new(pd, cq, QpType::Rc, cap).sq_sig_all(true);
    let (x, y) = (d.create_qp(&init).unwrap(), d.create_qp(&init).unwrap());
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        min_rnr_timer: 1,
        ..QpParams::default()
    };
    for (me, peer) in [(x, y), (y, x)] {
        let remote = Endpoint {
            qpn: peer,
            gid: d.gid(),
            ..Endpoint::default()
        };
        connect_qp(d, me, QpType::Rc, &params, 0, &remote).unwrap();
    }
    (x, y)
}

#[test]
fn memory_windows_through_the_device() {
    let d = EmuDevice::open(EmuConfig {
        name: "mw0".into(),
        ip: Ipv4Addr::new(127, 0, 10, 1).into(),
        port: 0,
        ..EmuConfig::default()
    })
    .unwrap();
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(64, None).unwrap();
    let (x, y) = rc_pair(&d, pd, cq);
    let buf = MemBuf::new(8192);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND | AccessFlags::REMOTE_READ;
    let mr = d.reg_mr(pd, &buf, 0, 8192, access).unwrap();
    let rw = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;

    // Type 1 through the bind verb.
    let mw1 = d.alloc_mw(pd, MwType::Type1).unwrap();
    assert_eq!(mw1.mw_type, MwType::Type1);
    let bind = MwBind {
        wr_id: 5,
        send_flags: SendFlags::SIGNALED,
        bind_info: MwBindInfo {
            mr_lkey: mr.lkey,
            addr: mr.addr + 4096,
            length: 64,
            mw_access_flags: rw,
        },
    };
    let rkey1 = d.bind_mw(y, mw1.id, &bind).unwrap();
    let wc = wait(&d, cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (5, WcStatus::Success, WcOpcode::BindMw)
    );
    buf.write(0, b"through a window").unwrap();
    let wr = SendWr::rdma_write(
        1,
        vec![Sge::new(mr.addr, 16, mr.lkey)],
        mr.addr + 4096,
        rkey1,
    );
    d.post_send(x, &[wr]).unwrap();
    assert_eq!(wait(&d, cq).status, WcStatus::Success);
    let mut got = [0u8; 16];
    buf.read(4096, &mut got).unwrap();
    assert_eq!(&got, b"through a window");
    assert_eq!(d.dereg_mr(mr.lkey).unwrap_err().errno(), 16);

    // Type 2 through a work request, then invalidated by the peer's SEND with Invalidate.
    let mw2 = d.alloc_mw(pd, MwType::Type2).unwrap();
    assert_eq!(d.bind_mw(y, mw2.id, &bind).unwrap_err().errno(), 22);
    let rkey2 = (mw2.rkey & !0xFF) | 0x5A;
    let op = WrOperation::BindMw {
        mw_rkey: mw2.rkey,
        new_rkey: rkey2,
        bind_info: bind.bind_info,
    };
    d.post_send(y, &[SendWr::new(6, vec![], op)]).unwrap();
    assert_eq!(wait(&d, cq).opcode, WcOpcode::BindMw);
    d.post_recv(
        y,
        &[RecvWr::new(7, vec![Sge::new(mr.addr + 1024, 64, mr.lkey)])],
    )
    .unwrap();
    let op = WrOperation::SendWithInv {
        invalidate_rkey: rkey2,
    };
    d.post_send(
        x,
        &[SendWr::new(8, vec![Sge::new(mr.addr, 4, mr.lkey)], op)],
    )
    .unwrap();
    let mut wcs = [wait(&d, cq), wait(&d, cq)];
    wcs.sort_by_key(|w| w.wr_id);
    assert_eq!(wcs[0].wr_id, 7);
    assert!(wcs[0].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(wcs[0].invalidated_rkey, rkey2);
    assert_eq!(wcs[1].status, WcStatus::Success);

    d.dealloc_mw(mw1.id).unwrap();
    d.dealloc_mw(mw2.id).unwrap();
    assert_eq!(d.dealloc_mw(mw2.id).unwrap_err().errno(), 22);
    // rereg_mr through the trait: the region keeps its keys.
    let m = d
        .rereg_mr(
            mr.lkey,
            ReregMrFlags::CHANGE_ACCESS,
            None,
            None,
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
    assert_eq!(m.lkey, mr.lkey);
    d.dereg_mr(m.lkey).unwrap();
    assert_eq!(d.dereg_mr(mr.lkey).unwrap_err().errno(), 22);
}
