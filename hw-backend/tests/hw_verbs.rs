//! Scenario tests of `HwDevice` on a real RDMA device (in CI: kernel rxe in a VM, see
//! `scripts/ci-hw.sh`). Each test skips, printing why, when no device can be opened,
//! unless `REQUIRE_RDMA_DEVICE=1`. The scenarios are written against `&dyn Device` so
//! that the conformance suite can run the same steps on every backend.
//!
//! Expected outcomes are those of libibverbs and IBTA Vol 1 (cited per test); where
//! kernel rxe deviates, the test still asserts the standard and the deviation is listed
//! in `scripts/rxe-vm/rxe-deviations.txt` with its citation.
#![forbid(unsafe_code)]

mod common;

use std::time::Duration;

use common::{wait_event, wait_wc, wait_wcs, Loopback, LoopbackOpts};
use verbs_api::{
    errno, AccessFlags, AsyncEventType, Device, EventElement, LinkLayer, MemBuf, MwBind,
    MwBindInfo, MwType, PortState, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr,
    ReregMrFlags, SendFlags, SendWr, Sge, SrqAttr, SrqAttrMask, UdDest, WcFlags, WcOpcode,
    WcStatus,
};

const T: Duration = Duration::from_secs(10);

#[test]
fn missing_device_is_a_clear_error() {
    let e = hw_backend::HwDevice::open(Some("no-such-rdma-device")).unwrap_err();
    if hw_backend::HW_ENABLED {
        // ENODEV for the named device, or ENOSYS when the host has no RDMA at all.
        assert!(
            [errno::ENODEV, errno::ENOSYS].contains(&e.errno()),
            "unexpected error {e}"
        );
    } else {
        assert_eq!(e.errno(), errno::EOPNOTSUPP);
        assert!(e.to_string().contains("`hw` feature"), "{e}");
    }
    eprintln!("open(no-such-rdma-device): {e}");
}

/// manual 3.2.x: ibv_query_device / ibv_query_port / ibv_query_gid / ibv_query_pkey.
#[test]
fn device_port_gid_queries() {
    let dev = dev_or_skip!();
    let list = hw_backend::devices().expect("device list");
    assert!(list.iter().any(|d| d.name == dev.name()), "{list:?}");
    let a = dev.query_device().expect("query_device");
    assert!(a.phys_port_cnt >= 1);
    assert!(a.max_qp > 0 && a.max_cq > 0 && a.max_mr > 0 && a.max_pd > 0);
    assert!(a.max_qp_wr >= 32 && a.max_sge >= 1 && a.max_cqe >= 64);
    let p = dev.query_port(1).expect("query_port");
    assert_eq!(p.state, PortState::Active);
    assert!(p.gid_tbl_len > 0);
    eprintln!(
        "{}: fw {} guid {:#x} vendor {:#x}/{:#x} caps {:?} atomic {:?}; port 1 {} mtu {} \
         link {}",
        dev.name(),
        a.fw_ver,
        a.node_guid,
        a.vendor_id,
        a.vendor_part_id,
        a.device_cap_flags,
        a.atomic_cap,
        p.state,
        p.active_mtu,
        p.link_layer
    );
    if dev.name().starts_with("rxe") {
        assert_eq!(p.link_layer, LinkLayer::Ethernet);
    }
    // Ports are numbered from 1.
    assert_eq!(dev.query_port(0).unwrap_err().errno(), errno::EINVAL);
    let (idx, gid) = common::local_gid(&dev);
    eprintln!("gid[{idx}] = {gid}");
    assert_eq!(dev.query_pkey(1, 0).expect("query_pkey"), 0xffff);
    assert!(dev.query_gid(1, p.gid_tbl_len + 10).is_err());
}

/// manual 3.4 / 3.5: EBUSY while children exist, then every object frees in order.
#[test]
fn lifecycle_and_ebusy_ordering() {
    let dev = dev_or_skip!();
    let pd = dev.alloc_pd().unwrap();
    let buf = MemBuf::new(4096);
    let mr = dev
        .reg_mr(pd, &buf, 0, 4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_eq!(mr.addr, buf.addr());
    assert_eq!(mr.length, 4096);
    let ch = dev.create_comp_channel().unwrap();
    let cq = dev.create_cq(16, Some(ch)).unwrap();
    let qpn = dev
        .create_qp(&QpInitAttr::new(pd, cq, QpType::Rc, QpCap::new(4, 4)))
        .unwrap();
    let (attr, init) = dev.query_qp(qpn).unwrap();
    assert_eq!(attr.qp_state, QpState::Reset);
    assert_eq!(init.pd, pd);
    assert_eq!(init.send_cq, cq);
    assert_eq!(init.qp_type, QpType::Rc);
    assert!(init.cap.max_send_wr >= 4);

    assert_eq!(dev.dealloc_pd(pd).unwrap_err().errno(), errno::EBUSY);
    assert_eq!(dev.destroy_cq(cq).unwrap_err().errno(), errno::EBUSY);
    assert_eq!(
        dev.destroy_comp_channel(ch).unwrap_err().errno(),
        errno::EBUSY
    );
    dev.destroy_qp(qpn).unwrap();
    assert_eq!(dev.destroy_qp(qpn).unwrap_err().errno(), errno::EINVAL);
    assert_eq!(dev.dealloc_pd(pd).unwrap_err().errno(), errno::EBUSY);
    dev.destroy_cq(cq).unwrap();
    dev.destroy_comp_channel(ch).unwrap();
    dev.dereg_mr(mr.lkey).unwrap();
    assert_eq!(dev.dereg_mr(mr.lkey).unwrap_err().errno(), errno::EINVAL);
    dev.dealloc_pd(pd).unwrap();
    // A range outside the buffer is refused before reaching the NIC.
    let pd = dev.alloc_pd().unwrap();
    assert_eq!(
        dev.reg_mr(pd, &buf, 4000, 200, AccessFlags::LOCAL_WRITE)
            .unwrap_err()
            .errno(),
        errno::EINVAL
    );
    dev.dealloc_pd(pd).unwrap();
}

/// manual 2.1.1 SEND, 3.6.10: receive completions carry byte_len and immediate data.
#[test]
fn rc_send_recv_and_send_with_imm() {
    let dev = dev_or_skip!();
    let p = Loopback::new(&dev, LoopbackOpts::default());
    p.a.buf.write(0, b"hello, rxe").unwrap();
    p.recv_b(&dev, 11, 64);
    dev.post_send(p.a.qpn, &[SendWr::send(1, vec![p.a.sge(0, 10)])])
        .unwrap();
    let s = wait_wc(&dev, p.a.cq);
    assert_eq!(
        (s.wr_id, s.status, s.opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    let r = wait_wc(&dev, p.b.cq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode),
        (11, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(r.byte_len, 10);
    assert_eq!(r.qp_num, p.b.qpn);
    assert_eq!(r.imm(), None);
    let mut got = [0u8; 10];
    p.b.buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"hello, rxe");

    p.recv_b(&dev, 12, 64);
    dev.post_send(
        p.a.qpn,
        &[SendWr::send_with_imm(2, vec![p.a.sge(0, 5)], 0xdead_beef)],
    )
    .unwrap();
    assert_eq!(wait_wc(&dev, p.a.cq).status, WcStatus::Success);
    let r = wait_wc(&dev, p.b.cq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode),
        (12, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(r.imm(), Some(0xdead_beef));
    assert!(r.wc_flags.contains(WcFlags::WITH_IMM));

    // An inline SEND (copied at post time) and a two-SGE gather.
    p.a.buf.write(100, b"inline!").unwrap();
    p.recv_b(&dev, 13, 64);
    dev.post_send(
        p.a.qpn,
        &[SendWr::send(3, vec![p.a.sge(100, 7)]).with_flags(SendFlags::INLINE)],
    )
    .unwrap();
    assert_eq!(wait_wc(&dev, p.a.cq).status, WcStatus::Success);
    assert_eq!(wait_wc(&dev, p.b.cq).byte_len, 7);
    let mut got = [0u8; 7];
    p.b.buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"inline!");
    // An inline SGE outside every registered buffer is refused (EINVAL), never read.
    let bad = SendWr::send(4, vec![Sge::new(0x1000, 8, p.a.mr.lkey)]).with_flags(SendFlags::INLINE);
    let e = dev.post_send(p.a.qpn, &[bad]).unwrap_err();
    assert_eq!((e.index, e.error.errno()), (0, errno::EINVAL));
    p.destroy(&dev);
}

/// manual 2.1.4 RDMA Write (with immediate), 2.1.3 RDMA Read.
#[test]
fn rc_rdma_write_write_imm_read() {
    let dev = dev_or_skip!();
    let p = Loopback::new(&dev, LoopbackOpts::default());
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    p.a.buf.write(0, &data).unwrap();
    let remote = p.b.buf.addr() + 1000;
    dev.post_send(
        p.a.qpn,
        &[SendWr::rdma_write(
            1,
            vec![p.a.sge(0, 3000)],
            remote,
            p.b.mr.rkey,
        )],
    )
    .unwrap();
    let s = wait_wc(&dev, p.a.cq);
    assert_eq!(
        (s.status, s.opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let mut got = vec![0u8; 3000];
    p.b.buf.read(1000, &mut got).unwrap();
    assert_eq!(got, data);
    common::assert_no_wc(&dev, p.b.cq, Duration::from_millis(50));

    p.recv_b(&dev, 21, 0);
    dev.post_send(
        p.a.qpn,
        &[SendWr::rdma_write_with_imm(
            2,
            vec![p.a.sge(0, 16)],
            remote,
            p.b.mr.rkey,
            42,
        )],
    )
    .unwrap();
    assert_eq!(wait_wc(&dev, p.a.cq).status, WcStatus::Success);
    let r = wait_wc(&dev, p.b.cq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.imm()),
        (21, WcStatus::Success, WcOpcode::RecvRdmaWithImm, Some(42))
    );
    assert_eq!(r.byte_len, 16);

    p.b.buf.write(5000, b"read me back").unwrap();
    dev.post_send(
        p.a.qpn,
        &[SendWr::rdma_read(
            3,
            vec![p.a.sge(4000, 12)],
            p.b.buf.addr() + 5000,
            p.b.mr.rkey,
        )],
    )
    .unwrap();
    let s = wait_wc(&dev, p.a.cq);
    assert_eq!(
        (s.status, s.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    let mut got = [0u8; 12];
    p.a.buf.read(4000, &mut got).unwrap();
    assert_eq!(&got, b"read me back");
    p.destroy(&dev);
}

/// manual 2.1.5 Atomic operations: the original value lands in the local SGE.
#[test]
fn rc_atomics_cas_and_faa() {
    let dev = dev_or_skip!();
    let p = Loopback::new(&dev, LoopbackOpts::default());
    p.b.buf.write_u64(64, 100).unwrap();
    let target = p.b.buf.addr() + 64;
    dev.post_send(
        p.a.qpn,
        &[SendWr::atomic_fetch_add(
            1,
            p.a.sge(0, 8),
            target,
            p.b.mr.rkey,
            5,
        )],
    )
    .unwrap();
    let s = wait_wc(&dev, p.a.cq);
    assert_eq!(
        (s.status, s.opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    assert_eq!(p.a.buf.read_u64(0).unwrap(), 100);
    assert_eq!(p.b.buf.read_u64(64).unwrap(), 105);

    // A compare that fails leaves the word alone; one that matches swaps it.
    dev.post_send(
        p.a.qpn,
        &[
            SendWr::atomic_cmp_swp(2, p.a.sge(8, 8), target, p.b.mr.rkey, 1, 7),
            SendWr::atomic_cmp_swp(3, p.a.sge(16, 8), target, p.b.mr.rkey, 105, 7),
        ],
    )
    .unwrap();
    let w = wait_wcs(&dev, p.a.cq, 2, T);
    assert!(w
        .iter()
        .all(|c| c.status == WcStatus::Success && c.opcode == WcOpcode::CompSwap));
    assert_eq!(p.a.buf.read_u64(8).unwrap(), 105);
    assert_eq!(p.a.buf.read_u64(16).unwrap(), 105);
    assert_eq!(p.b.buf.read_u64(64).unwrap(), 7);
    p.destroy(&dev);
}

/// IBTA Vol 1 9.7.5.2.2 / o9-... : an invalid rkey is NAKed (remote access error);
/// the requester completes with REM_ACCESS_ERR and not one byte is written.
#[test]
fn bad_rkey_is_rem_access_err() {
    let dev = dev_or_skip!();
    let p = Loopback::new(&dev, LoopbackOpts::default());
    p.a.buf.write(0, &[0xaa; 64]).unwrap();
    dev.post_send(
        p.a.qpn,
        &[SendWr::rdma_write(
            1,
            vec![p.a.sge(0, 64)],
            p.b.buf.addr(),
            p.b.mr.rkey ^ 0x5500,
        )],
    )
    .unwrap();
    let s = wait_wc(&dev, p.a.cq);
    assert_eq!((s.wr_id, s.status), (1, WcStatus::RemAccessErr));
    assert!(p.b.buf.to_vec().iter().all(|&b| b == 0));
    // Out of bounds with the right rkey: the same.
    let p2 = Loopback::new(&dev, LoopbackOpts::default());
    dev.post_send(
        p2.a.qpn,
        &[SendWr::rdma_write(
            2,
            vec![p2.a.sge(0, 64)],
            p2.b.buf.addr() + p2.b.buf.len() as u64 - 32,
            p2.b.mr.rkey,
        )],
    )
    .unwrap();
    assert_eq!(wait_wc(&dev, p2.a.cq).status, WcStatus::RemAccessErr);
    assert!(p2.b.buf.to_vec().iter().all(|&b| b == 0));
}

/// IBTA Vol 1 9.7.5.2.8 / manual 3.5 rnr_retry: with rnr_retry 0 the first RNR NAK
/// ends the WR with RNR_RETRY_EXC_ERR.
#[test]
fn rnr_with_zero_retry_is_rnr_retry_exc_err() {
    let dev = dev_or_skip!();
    let p = Loopback::new(
        &dev,
        LoopbackOpts {
            rnr_retry: 0,
            ..LoopbackOpts::default()
        },
    );
    dev.post_send(p.a.qpn, &[SendWr::send(1, vec![p.a.sge(0, 8)])])
        .unwrap();
    let s = wait_wc(&dev, p.a.cq);
    assert_eq!((s.wr_id, s.status), (1, WcStatus::RnrRetryExcErr));
    p.destroy(&dev);
}

/// IBTA Vol 1 9.7.6.1.3 (transport timer) / manual retry_cnt: a peer that never answers
/// (its QP in ERR, so it drops every packet) exhausts the retries: RETRY_EXC_ERR.
#[test]
fn silent_peer_is_retry_exc_err() {
    let dev = dev_or_skip!();
    let p = Loopback::new(
        &dev,
        LoopbackOpts {
            retry_cnt: 1,
            timeout: 10,
            ..LoopbackOpts::default()
        },
    );
    common::set_state(&dev, p.b.qpn, QpState::Err);
    dev.post_send(
        p.a.qpn,
        &[SendWr::rdma_write(
            1,
            vec![p.a.sge(0, 8)],
            p.b.buf.addr(),
            p.b.mr.rkey,
        )],
    )
    .unwrap();
    let s = wait_wcs(&dev, p.a.cq, 1, Duration::from_secs(30))[0];
    assert_eq!((s.wr_id, s.status), (1, WcStatus::RetryExcErr));
}

/// The same with the peer QP back in RESET (it no longer exists for the wire).
#[test]
fn peer_in_reset_is_retry_exc_err() {
    let dev = dev_or_skip!();
    let p = Loopback::new(
        &dev,
        LoopbackOpts {
            retry_cnt: 1,
            timeout: 10,
            ..LoopbackOpts::default()
        },
    );
    common::set_state(&dev, p.b.qpn, QpState::Reset);
    dev.post_send(p.a.qpn, &[SendWr::send(1, vec![p.a.sge(0, 8)])])
        .unwrap();
    let s = wait_wcs(&dev, p.a.cq, 1, Duration::from_secs(30))[0];
    assert_eq!((s.wr_id, s.status), (1, WcStatus::RetryExcErr));
}

/// manual 3.5.x / IBTA Vol 1 10.3.1: a QP moved to ERR flushes its outstanding WRs
/// with WR_FLUSH_ERR; a post to the flushed QP completes with WR_FLUSH_ERR as well.
#[test]
fn err_state_flushes_with_wr_flush_err() {
    let dev = dev_or_skip!();
    let p = Loopback::new(&dev, LoopbackOpts::default());
    for i in 0..3 {
        p.recv_b(&dev, 100 + i, 64);
    }
    common::set_state(&dev, p.b.qpn, QpState::Err);
    let w = wait_wcs(&dev, p.b.cq, 3, T);
    let mut ids: Vec<u64> = w.iter().map(|c| c.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [100, 101, 102]);
    assert!(w.iter().all(|c| c.status == WcStatus::WrFlushErr), "{w:?}");
    assert_eq!(dev.query_qp(p.b.qpn).unwrap().0.qp_state, QpState::Err);
}

/// IBTA Vol 1 10.3.1 (QP state Error): a WR posted to a QP already in ERR completes with
/// WR_FLUSH_ERR.
#[test]
fn post_recv_in_err_state_completes_with_flush_err() {
    let dev = dev_or_skip!();
    let p = Loopback::new(&dev, LoopbackOpts::default());
    common::set_state(&dev, p.b.qpn, QpState::Err);
    p.recv_b(&dev, 200, 64);
    let c = wait_wc(&dev, p.b.cq);
    assert_eq!((c.wr_id, c.status), (200, WcStatus::WrFlushErr));
}

/// IBTA Vol 1 11.6.2 / manual 3.5 CQ overrun: more completions than the CQ holds raise
/// IBV_EVENT_CQ_ERR for that CQ, delivered through ibv_get_async_event; the async fd
/// is readable while the event is pending.
#[test]
fn cq_overrun_raises_cq_err_async_event() {
    let dev = dev_or_skip!();
    let p = Loopback::new(
        &dev,
        LoopbackOpts {
            cqe: 1,
            depth: 64,
            ..LoopbackOpts::default()
        },
    );
    let wrs: Vec<SendWr> = (0..48)
        .map(|i| SendWr::rdma_write(i, vec![p.a.sge(0, 8)], p.b.buf.addr(), p.b.mr.rkey))
        .collect();
    dev.post_send(p.a.qpn, &wrs).unwrap();
    // The async fd is a real fd: readable while the event is pending (manual 3.7.1).
    let fd = dev.async_fd().unwrap();
    assert!(
        hw_backend::wait_fd_readable(fd, Some(T)).unwrap(),
        "async fd never became readable"
    );
    let ev = wait_event(&dev, T, |e| e.event_type == AsyncEventType::CqErr);
    assert_eq!(ev.element, EventElement::Cq(p.a.cq.0));
    assert!(ev.is_well_formed());
}

/// manual 6.1.4 IBV_EVENT_QP_ACCESS_ERR: an R_Key violation detected by the responder
/// moves the responder's QP to ERR and raises IBV_EVENT_QP_ACCESS_ERR for it (IBTA Vol 1
/// 11.6.3.2, "Local Access Violation Work Queue Error").
#[test]
fn rkey_violation_raises_qp_access_err_on_responder() {
    let dev = dev_or_skip!();
    let p = Loopback::new(&dev, LoopbackOpts::default());
    dev.post_send(
        p.a.qpn,
        &[SendWr::rdma_write(
            1,
            vec![p.a.sge(0, 8)],
            p.b.buf.addr(),
            p.b.mr.rkey ^ 0x100,
        )],
    )
    .unwrap();
    assert_eq!(wait_wc(&dev, p.a.cq).status, WcStatus::RemAccessErr);
    let ev = wait_event(&dev, Duration::from_secs(3), |e| {
        e.event_type == AsyncEventType::QpAccessErr
    });
    assert_eq!(ev.element, EventElement::Qp(p.b.qpn));
    assert_eq!(dev.query_qp(p.b.qpn).unwrap().0.qp_state, QpState::Err);
}

/// manual 3.5.x ibv_req_notify_cq / ibv_get_cq_event: an armed CQ signals its channel's
/// fd; the event names the CQ.
#[test]
fn completion_channel_events_via_fd() {
    let dev = dev_or_skip!();
    let p = Loopback::new(&dev, LoopbackOpts::default());
    let ch = dev.create_comp_channel().unwrap();
    let cq = dev.create_cq(16, Some(ch)).unwrap();
    // A fresh QP pair whose receiver's CQ is on the channel.
    let qpn = dev
        .create_qp(&QpInitAttr::new(p.pd, cq, QpType::Rc, QpCap::new(4, 4)).sq_sig_all(true))
        .unwrap();
    let o = LoopbackOpts::default();
    common::connect_rc(&dev, qpn, p.a.qpn, &o);
    common::set_state(&dev, p.a.qpn, QpState::Reset);
    common::connect_rc(&dev, p.a.qpn, qpn, &o);
    let fd = dev.comp_channel_fd(ch).unwrap();
    assert_eq!(
        dev.get_cq_event(ch, Some(Duration::from_millis(20))),
        Err(verbs_api::Error::TimedOut)
    );
    dev.req_notify_cq(cq, false).unwrap();
    dev.post_recv(qpn, &[RecvWr::new(7, vec![p.b.sge(0, 0)])])
        .unwrap();
    dev.post_send(p.a.qpn, &[SendWr::send(1, vec![])]).unwrap();
    assert!(
        hw_backend::wait_fd_readable(fd, Some(T)).unwrap(),
        "channel fd never became readable"
    );
    assert_eq!(dev.get_cq_event(ch, Some(T)).unwrap(), cq);
    let r = wait_wc(&dev, cq);
    assert_eq!((r.wr_id, r.status), (7, WcStatus::Success));
    dev.destroy_qp(qpn).unwrap();
    dev.destroy_cq(cq).unwrap();
    dev.destroy_comp_channel(ch).unwrap();
}

/// manual 2.3.6 / 3.4.15: a UD SEND through an address handle with a GRH; the receive
/// buffer starts with the 40-byte GRH, the completion has IBV_WC_GRH and the sender's
/// QP number.
#[test]
fn ud_send_with_grh() {
    let dev = dev_or_skip!();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16, None).unwrap();
    let buf = MemBuf::new(4096);
    let mr = dev
        .reg_mr(pd, &buf, 0, 4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let qkey = 0x1111_1111;
    let mk = || {
        let qpn = dev
            .create_qp(&QpInitAttr::new(pd, cq, QpType::Ud, QpCap::new(4, 4)).sq_sig_all(true))
            .unwrap();
        let a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        dev.modify_qp(
            qpn,
            &a,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
        )
        .unwrap();
        common::set_state(&dev, qpn, QpState::Rtr);
        let a = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 0,
            ..QpAttr::default()
        };
        dev.modify_qp(qpn, &a, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
            .unwrap();
        qpn
    };
    let (sender, receiver) = (mk(), mk());
    let ah = dev.create_ah(pd, &common::self_av(&dev)).unwrap();
    buf.write(0, b"datagram").unwrap();
    dev.post_recv(
        receiver,
        &[RecvWr::new(
            9,
            vec![Sge::new(buf.addr() + 1024, 40 + 64, mr.lkey)],
        )],
    )
    .unwrap();
    let wr = SendWr::send(1, vec![Sge::new(buf.addr(), 8, mr.lkey)]).with_ud(UdDest {
        ah,
        remote_qpn: receiver,
        remote_qkey: qkey,
    });
    dev.post_send(sender, &[wr]).unwrap();
    let w = wait_wcs(&dev, cq, 2, T);
    let r = w
        .iter()
        .find(|c| c.opcode.is_recv())
        .expect("receive completion");
    let s = w
        .iter()
        .find(|c| !c.opcode.is_recv())
        .expect("send completion");
    assert_eq!(s.status, WcStatus::Success);
    assert_eq!((r.wr_id, r.status), (9, WcStatus::Success));
    assert!(r.wc_flags.contains(WcFlags::GRH), "{r:?}");
    assert_eq!(r.byte_len, 40 + 8);
    assert_eq!(r.src_qp, sender);
    let mut got = [0u8; 8];
    buf.read(1024 + 40, &mut got).unwrap();
    assert_eq!(&got, b"datagram");
    // An unknown AH is refused at post time.
    let bad = SendWr::send(2, vec![]).with_ud(UdDest {
        ah: verbs_api::AhId(ah.0 + 1000),
        remote_qpn: receiver,
        remote_qkey: qkey,
    });
    assert_eq!(
        dev.post_send(sender, &[bad]).unwrap_err().error.errno(),
        errno::EINVAL
    );
    dev.destroy_qp(sender).unwrap();
    dev.destroy_qp(receiver).unwrap();
    dev.destroy_ah(ah).unwrap();
    dev.dereg_mr(mr.lkey).unwrap();
    dev.destroy_cq(cq).unwrap();
    dev.dealloc_pd(pd).unwrap();
}

/// manual 3.4.5-3.6.6: receives come from the SRQ; EBUSY while a QP uses it; arming the
/// limit raises IBV_EVENT_SRQ_LIMIT_REACHED once fewer WRs remain (IBTA Vol 1 10.2.9.4).
#[test]
fn srq_receive_query_and_limit_event() {
    let dev = dev_or_skip!();
    let p = Loopback::new(&dev, LoopbackOpts::default());
    let srq = dev
        .create_srq(
            p.pd,
            &SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let q = dev.query_srq(srq).unwrap();
    assert!(q.max_wr >= 16, "{q:?}");
    let rx = dev
        .create_qp(
            &QpInitAttr::new(p.pd, p.b.cq, QpType::Rc, QpCap::new(4, 0))
                .srq(srq)
                .sq_sig_all(true),
        )
        .unwrap();
    assert_eq!(dev.query_qp(rx).unwrap().1.srq, Some(srq));
    let o = LoopbackOpts::default();
    common::connect_rc(&dev, rx, p.a.qpn, &o);
    common::set_state(&dev, p.a.qpn, QpState::Reset);
    common::connect_rc(&dev, p.a.qpn, rx, &o);
    let wrs: Vec<RecvWr> = (0..4)
        .map(|i| RecvWr::new(300 + i, vec![p.b.sge(64 * i as usize, 64)]))
        .collect();
    dev.post_srq_recv(srq, &wrs).unwrap();
    // A QP on an SRQ has no receive queue of its own.
    assert!(dev.post_recv(rx, &[RecvWr::new(1, vec![])]).is_err());
    dev.modify_srq(
        srq,
        &SrqAttr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: 2,
        },
        SrqAttrMask::LIMIT,
    )
    .unwrap();
    for i in 0..3 {
        dev.post_send(p.a.qpn, &[SendWr::send(i, vec![p.a.sge(0, 8)])])
            .unwrap();
    }
    let w = wait_wcs(&dev, p.b.cq, 3, T);
    assert!(
        w.iter()
            .all(|c| c.status == WcStatus::Success && c.qp_num == rx),
        "{w:?}"
    );
    let mut ids: Vec<u64> = w.iter().map(|c| c.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [300, 301, 302]);
    let ev = wait_event(&dev, T, |e| e.event_type == AsyncEventType::SrqLimitReached);
    assert_eq!(ev.element, EventElement::Srq(srq.0));
    assert_eq!(dev.destroy_srq(srq).unwrap_err().errno(), errno::EBUSY);
    dev.destroy_qp(rx).unwrap();
    dev.destroy_srq(srq).unwrap();
}

/// ibv_rereg_mr(3): changing the access flags of a region keeps it usable and applies
/// the new rights (a READ of a region re-registered without REMOTE_READ fails).
#[test]
fn rereg_mr_access() {
    let dev = dev_or_skip!();
    let p = Loopback::new(&dev, LoopbackOpts::default());
    let info = dev
        .rereg_mr(
            p.b.mr.lkey,
            ReregMrFlags::CHANGE_ACCESS,
            None,
            None,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .expect("rereg_mr CHANGE_ACCESS");
    assert_eq!(info.addr, p.b.buf.addr());
    dev.post_send(
        p.a.qpn,
        &[SendWr::rdma_read(
            1,
            vec![p.a.sge(0, 8)],
            p.b.buf.addr(),
            info.rkey,
        )],
    )
    .unwrap();
    assert_eq!(wait_wc(&dev, p.a.cq).status, WcStatus::RemAccessErr);
    dev.dereg_mr(info.lkey).unwrap();
}

/// ibv_alloc_mw(3) / ibv_bind_mw(3), manual 2.3.5: a type 1 window bound over part of a
/// region grants remote access through its own rkey, and only inside the window.
#[test]
fn memory_window_type1_bind_and_access() {
    let dev = dev_or_skip!();
    let p = Loopback::new(&dev, LoopbackOpts::default());
    let mw = dev.alloc_mw(p.pd, MwType::Type1).expect("alloc_mw");
    // The MR must allow binding.
    let buf = MemBuf::new(4096);
    let mr = dev
        .reg_mr(
            p.pd,
            &buf,
            0,
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND,
        )
        .unwrap();
    let rkey = dev
        .bind_mw(
            p.b.qpn,
            mw.id,
            &MwBind {
                wr_id: 77,
                send_flags: SendFlags::SIGNALED,
                bind_info: MwBindInfo {
                    mr_lkey: mr.lkey,
                    addr: buf.addr() + 1024,
                    length: 1024,
                    mw_access_flags: AccessFlags::REMOTE_WRITE,
                },
            },
        )
        .expect("bind_mw");
    let c = wait_wc(&dev, p.b.cq);
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (77, WcStatus::Success, WcOpcode::BindMw)
    );
    p.a.buf.write(0, b"through the window").unwrap();
    dev.post_send(
        p.a.qpn,
        &[SendWr::rdma_write(
            1,
            vec![p.a.sge(0, 18)],
            buf.addr() + 1024,
            rkey,
        )],
    )
    .unwrap();
    assert_eq!(wait_wc(&dev, p.a.cq).status, WcStatus::Success);
    let mut got = [0u8; 18];
    buf.read(1024, &mut got).unwrap();
    assert_eq!(&got, b"through the window");
    dev.dealloc_mw(mw.id).unwrap();
    dev.dereg_mr(mr.lkey).unwrap();
}

/// manual 3.6.13 / 3.6.14: a UD QP attaches to and detaches from a multicast group.
#[test]
fn multicast_attach_detach() {
    let dev = dev_or_skip!();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4, None).unwrap();
    let qpn = dev
        .create_qp(&QpInitAttr::new(pd, cq, QpType::Ud, QpCap::new(2, 2)).sq_sig_all(true))
        .unwrap();
    let group = verbs_api::Gid::from("ff0e::1:2".parse::<std::net::Ipv6Addr>().unwrap());
    dev.attach_mcast(qpn, &group, 0).expect("attach_mcast");
    dev.detach_mcast(qpn, &group, 0).expect("detach_mcast");
    dev.destroy_qp(qpn).unwrap();
    dev.destroy_cq(cq).unwrap();
    dev.dealloc_pd(pd).unwrap();
}
