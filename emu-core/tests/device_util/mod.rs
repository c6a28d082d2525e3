//! What the tests of devices on a real link (UDP sockets, or the same-host shared-memory
//! link) set up alike: a device on an address (IPv4 or IPv6), a QP with a registered
//! buffer, a posted receive, a UD SEND, the wait for a completion.

#![allow(dead_code, unreachable_pub)]

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::*;

/// Runs `cmd` with `sh -c`; panics if it fails.
pub fn sh(cmd: &str) {
    let st = Command::new("sh").args(["-c", cmd]).status().unwrap();
    assert!(st.success(), "{cmd}");
}

/// A device named `name` on `ip:port`.
pub fn open(name: &str, ip: impl Into<IpAddr>, port: u16) -> EmuDevice {
    let ip = ip.into();
    EmuDevice::open(EmuConfig {
        name: name.into(),
        ip,
        port,
        ..EmuConfig::default()
    })
    .unwrap_or_else(|e| panic!("open a device on {ip}: {e}"))
}

/// A QP with its PD, its one CQ (both queues) and a registered buffer.
pub struct Side {
    pub pd: PdId,
    pub cq: CqId,
    pub qpn: u32,
    pub mr: MrInfo,
    pub buf: MemBuf,
}

/// A QP of `qp_type` (16 WRs of one SGE each way, every send signaled) with a buffer of
/// `len` bytes registered with `access`.
pub fn side(d: &EmuDevice, qp_type: QpType, len: usize, access: AccessFlags) -> Side {
    side_on(d, qp_type, len, access, None)
}

/// [`side`] with its CQ on completion channel `channel`.
pub fn side_on(
    d: &EmuDevice,
    qp_type: QpType,
    len: usize,
    access: AccessFlags,
    channel: Option<ChannelId>,
) -> Side {
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(64, channel).unwrap();
    let qpn = d
        .create_qp(&QpInitAttr::new(pd, cq, qp_type, QpCap::new(16, 16)).sq_sig_all(true))
        .unwrap();
    let buf = MemBuf::new(len);
    let mr = d.reg_mr(pd, &buf, 0, len, access).unwrap();
    Side {
        pd,
        cq,
        qpn,
        mr,
        buf,
    }
}

/// A UD QP in RTS with Q_Key `qkey` and a `len`-byte buffer.
pub fn ud_side(d: &EmuDevice, qkey: u32, len: usize) -> Side {
    let s = side(d, QpType::Ud, len, AccessFlags::LOCAL_WRITE);
    let params = QpParams {
        qkey,
        ..QpParams::default()
    };
    connect_qp(d, s.qpn, QpType::Ud, &params, 7, &Endpoint::default()).unwrap();
    s
}

/// Connects QP `a` on `da` and QP `b` on `db` to each other with `params`: each reaches
/// the other at its GID of index `params.sgid_index`; A sends from PSN 100, B from 200.
pub fn connect(
    da: &EmuDevice,
    a: &Side,
    db: &EmuDevice,
    b: &Side,
    qp_type: QpType,
    params: &QpParams,
) {
    let gid = |d: &EmuDevice| d.query_gid(1, u32::from(params.sgid_index)).unwrap();
    let to_b = Endpoint {
        qpn: b.qpn,
        psn: 200,
        gid: gid(db),
        ..Endpoint::default()
    };
    let to_a = Endpoint {
        qpn: a.qpn,
        psn: 100,
        gid: gid(da),
        ..Endpoint::default()
    };
    connect_qp(da, a.qpn, qp_type, params, 100, &to_b).unwrap();
    connect_qp(db, b.qpn, qp_type, params, 200, &to_a).unwrap();
}

/// Posts a receive of `len` bytes at `offset` into `s`'s buffer.
pub fn post_recv(d: &EmuDevice, s: &Side, wr_id: u64, offset: u64, len: u32) {
    let wr = RecvWr::new(wr_id, vec![Sge::new(s.mr.addr + offset, len, s.mr.lkey)]);
    d.post_recv(s.qpn, &[wr]).unwrap();
}

/// The next completion on `cq` (panics after 10 s).
pub fn wait_one(d: &EmuDevice, cq: CqId) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.is_empty() {
        assert!(Instant::now() < deadline, "no completion within 10 s");
        d.poll_cq(cq, 1, &mut out).unwrap();
        std::thread::yield_now();
    }
    out[0]
}

/// Sends `text` (written at `at` in `from`'s buffer) to `dest`, and waits for its
/// successful completion.
pub fn send_ud(d: &EmuDevice, from: &Side, at: u64, dest: UdDest, text: &[u8]) {
    from.buf.write(at as usize, text).unwrap();
    let len = u32::try_from(text.len()).unwrap();
    let wr = SendWr::send(9, vec![Sge::new(from.mr.addr + at, len, from.mr.lkey)]).with_ud(dest);
    d.post_send(from.qpn, &[wr]).unwrap();
    assert_eq!(wait_one(d, from.cq).status, WcStatus::Success);
}
