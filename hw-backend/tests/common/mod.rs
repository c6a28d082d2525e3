//! Helpers for scenario tests written against `&dyn Device`: opening a device or
//! skipping, connecting two RC QPs of one device to each other (loopback), waiting for
//! completions and events. Nothing here is specific to `HwDevice` except [`device`].

#![allow(dead_code)] // each test file uses a different subset

use std::time::{Duration, Instant};

use verbs_api::{
    AccessFlags, AhAttr, AsyncEvent, CqId, Device, Gid, GlobalRoute, MemBuf, MrInfo, Mtu, PdId,
    QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr, Sge, WorkCompletion,
};

/// The device the tests run on: `$RDMA_DEVICE` (default: the first one libibverbs lists).
/// `None`, with the reason printed, when there is none, unless `REQUIRE_RDMA_DEVICE=1`,
/// in which case a missing device fails the test (the VM run sets it).
pub(crate) fn device() -> Option<hw_backend::HwDevice> {
    let name = std::env::var("RDMA_DEVICE").ok();
    match hw_backend::HwDevice::open(name.as_deref()) {
        Ok(d) => Some(d),
        Err(e) => {
            if std::env::var("REQUIRE_RDMA_DEVICE").is_ok_and(|v| v == "1") {
                panic!("REQUIRE_RDMA_DEVICE=1 but no RDMA device could be opened: {e}");
            }
            eprintln!("SKIP: no RDMA device: {e}");
            None
        }
    }
}

/// Opens the device or returns from the test (skipped).
#[macro_export]
macro_rules! dev_or_skip {
    () => {
        match common::device() {
            Some(d) => d,
            None => return,
        }
    };
}

/// Port 1, the GID index to use (`$RDMA_GID_INDEX`, default: 1 if it is set, else 0;
/// on rxe index 1 is the RoCE v2 link-local GID) and that GID.
pub(crate) fn local_gid(dev: &dyn Device) -> (u8, Gid) {
    let idx: u8 = std::env::var("RDMA_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| match dev.query_gid(1, 1) {
            Ok(g) if !g.is_zero() => 1,
            _ => 0,
        });
    let gid = dev.query_gid(1, u32::from(idx)).expect("query_gid");
    assert!(!gid.is_zero(), "GID index {idx} of port 1 is empty");
    (idx, gid)
}

/// An address vector to this device's own GID (loopback).
pub(crate) fn self_av(dev: &dyn Device) -> AhAttr {
    let (sgid_index, dgid) = local_gid(dev);
    AhAttr {
        grh: GlobalRoute {
            dgid,
            flow_label: 0,
            sgid_index,
            hop_limit: 64,
            traffic_class: 0,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: true,
        port_num: 1,
    }
}

/// Polls `cq` until `n` completions arrived or `timeout` passed (then panics).
pub(crate) fn wait_wcs(
    dev: &dyn Device,
    cq: CqId,
    n: usize,
    timeout: Duration,
) -> Vec<WorkCompletion> {
    let end = Instant::now() + timeout;
    let mut out = Vec::new();
    while out.len() < n {
        let want = n - out.len();
        dev.poll_cq(cq, want, &mut out).expect("poll_cq");
        if out.len() < n {
            assert!(
                Instant::now() < end,
                "timed out waiting for {n} completions on CQ {cq:?}, got {out:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    out
}

/// One completion (panics after 10 s).
pub(crate) fn wait_wc(dev: &dyn Device, cq: CqId) -> WorkCompletion {
    wait_wcs(dev, cq, 1, Duration::from_secs(10))[0]
}

/// Asserts that `cq` stays empty for `d`.
pub(crate) fn assert_no_wc(dev: &dyn Device, cq: CqId, d: Duration) {
    std::thread::sleep(d);
    let mut out = Vec::new();
    dev.poll_cq(cq, 16, &mut out).expect("poll_cq");
    assert!(out.is_empty(), "unexpected completions {out:?}");
}

/// The next async event of a given type (others are skipped), within `timeout`.
pub(crate) fn wait_event(
    dev: &dyn Device,
    timeout: Duration,
    pred: impl Fn(&AsyncEvent) -> bool,
) -> AsyncEvent {
    let end = Instant::now() + timeout;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match dev.get_async_event(Some(left)) {
            Ok(ev) if pred(&ev) => return ev,
            Ok(ev) => eprintln!("(skipping async event {ev})"),
            Err(e) => panic!("no matching async event within {timeout:?}: {e}"),
        }
    }
}

/// How to set up a loopback pair.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LoopbackOpts {
    /// Entries of each CQ.
    pub(crate) cqe: u32,
    /// Send/receive queue depth of each QP.
    pub(crate) depth: u32,
    /// `retry_cnt` of both QPs.
    pub(crate) retry_cnt: u8,
    /// `rnr_retry` of both QPs.
    pub(crate) rnr_retry: u8,
    /// Local ACK timeout code of both QPs.
    pub(crate) timeout: u8,
    /// Bytes of each side's buffer.
    pub(crate) buf_len: usize,
}

impl Default for LoopbackOpts {
    fn default() -> Self {
        LoopbackOpts {
            cqe: 64,
            depth: 32,
            retry_cnt: 7,
            rnr_retry: 7,
            timeout: 14,
            buf_len: 8192,
        }
    }
}

/// One side of a loopback pair.
pub(crate) struct Side {
    pub(crate) qpn: u32,
    pub(crate) cq: CqId,
    pub(crate) buf: MemBuf,
    pub(crate) mr: MrInfo,
}

impl Side {
    /// An SGE over `len` bytes at `off` of this side's buffer.
    pub(crate) fn sge(&self, off: usize, len: u32) -> Sge {
        Sge::new(self.buf.addr() + off as u64, len, self.mr.lkey)
    }
}

/// Two RC QPs of one device, connected to each other through the device's own GID.
pub(crate) struct Loopback {
    pub(crate) pd: PdId,
    pub(crate) a: Side,
    pub(crate) b: Side,
    pub(crate) opts: LoopbackOpts,
}

const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn side(dev: &dyn Device, pd: PdId, o: &LoopbackOpts, qp_type: QpType) -> Side {
    let cq = dev.create_cq(o.cqe, None).expect("create_cq");
    let buf = MemBuf::new(o.buf_len);
    let mr = dev
        .reg_mr(pd, &buf, 0, o.buf_len, ALL_ACCESS)
        .expect("reg_mr");
    let qpn = dev
        .create_qp(
            &QpInitAttr::new(
                pd,
                cq,
                qp_type,
                QpCap {
                    max_send_wr: o.depth,
                    max_recv_wr: o.depth,
                    max_send_sge: 2,
                    max_recv_sge: 2,
                    max_inline_data: 64,
                },
            )
            .sq_sig_all(true),
        )
        .expect("create_qp");
    Side { qpn, cq, buf, mr }
}

/// RESET -> INIT -> RTR -> RTS of an RC QP towards `dest` on this device.
pub(crate) fn connect_rc(dev: &dyn Device, qpn: u32, dest: u32, o: &LoopbackOpts) {
    let (sgid_index, gid) = local_gid(dev);
    let params = verbs_api::QpParams {
        access: ALL_ACCESS,
        path_mtu: dev
            .query_port(1)
            .map(|p| p.active_mtu)
            .unwrap_or(Mtu::Mtu1024),
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
        rnr_retry: o.rnr_retry,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        sgid_index,
        ..verbs_api::QpParams::default()
    };
    let remote = verbs_api::Endpoint {
        lid: 0,
        qpn: dest,
        psn: 0x100,
        gid,
    };
    verbs_api::connect_qp(dev, qpn, QpType::Rc, &params, 0x100, &remote)
        .expect("modify_qp INIT/RTR/RTS");
}

/// Moves a QP to `state` (ERR or RESET).
pub(crate) fn set_state(dev: &dyn Device, qpn: u32, state: QpState) {
    let attr = QpAttr {
        qp_state: state,
        ..QpAttr::default()
    };
    dev.modify_qp(qpn, &attr, QpAttrMask::STATE)
        .expect("modify_qp state");
}

impl Loopback {
    /// A connected pair.
    pub(crate) fn new(dev: &dyn Device, opts: LoopbackOpts) -> Loopback {
        let pd = dev.alloc_pd().expect("alloc_pd");
        let a = side(dev, pd, &opts, QpType::Rc);
        let b = side(dev, pd, &opts, QpType::Rc);
        connect_rc(dev, a.qpn, b.qpn, &opts);
        connect_rc(dev, b.qpn, a.qpn, &opts);
        Loopback { pd, a, b, opts }
    }

    /// Posts one receive of `len` bytes at offset 0 on side B.
    pub(crate) fn recv_b(&self, dev: &dyn Device, wr_id: u64, len: u32) {
        dev.post_recv(self.b.qpn, &[RecvWr::new(wr_id, vec![self.b.sge(0, len)])])
            .expect("post_recv");
    }

    /// Frees everything in a legal order, checking each verb succeeds.
    pub(crate) fn destroy(self, dev: &dyn Device) {
        for s in [&self.a, &self.b] {
            dev.destroy_qp(s.qpn).expect("destroy_qp");
            dev.dereg_mr(s.mr.lkey).expect("dereg_mr");
            dev.destroy_cq(s.cq).expect("destroy_cq");
        }
        dev.dealloc_pd(self.pd).expect("dealloc_pd");
    }
}

/// The address the CM tests connect through: with `$RDMA_GID_INDEX` set, that GID's
/// address (IPv4 for an IPv4-mapped GID, else IPv6: set it to the index of a global
/// IPv6 GID to run them over IPv6, as `scripts/rxe-vm/hw-job.sh` does); else the first
/// IPv4 RoCE GID's.
pub(crate) fn cm_ip(dev: &dyn Device) -> Option<std::net::IpAddr> {
    if std::env::var_os("RDMA_GID_INDEX").is_none() {
        return ipv4(dev).map(std::net::IpAddr::V4);
    }
    let (_, gid) = local_gid(dev);
    Some(match gid.to_ipv4() {
        Some(v4) => std::net::IpAddr::V4(v4),
        None => std::net::IpAddr::V6(gid.to_ipv6()),
    })
}

/// The device's first IPv4 RoCE GID, as an address.
pub(crate) fn ipv4(dev: &dyn Device) -> Option<std::net::Ipv4Addr> {
    let n = dev.query_port(1).ok()?.gid_tbl_len;
    (0..n).find_map(|i| {
        dev.query_gid(1, i)
            .ok()?
            .to_ipv4()
            .filter(|a| !a.is_unspecified())
    })
}
