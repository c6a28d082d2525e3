//! Datagram rsockets (`SOCK_DGRAM`): rsockets' datagram protocol over UD QPs, so
//! a program here exchanges datagrams with librdmacm's rsockets (rdma-core
//! `librdmacm/rsocket.c`, the `ds_` half).
//!
//! A datagram rsocket is an ordinary kernel UDP socket (its number is that socket's
//! descriptor) plus one UD QP per local address it sends from (a CM id of
//! `RDMA_PS_UDP` bound to that address; the CM gives the QP rdma_cm's Q_Key). The
//! UDP socket resolves peers:
//!
//! * While no address handle reaches a destination, a datagram goes over UDP to
//!   its address, after a 16-byte (IPv4; 28 for IPv6) *UDP header*: tag
//!   0x55555555, IP version, operation (0 data, 7 control), header length, a
//!   reserved byte, the sender's QP number (24 bits, big-endian) and the sender's
//!   IP address.
//! * Whoever receives a UDP header learns the sender's QP and makes an address
//!   handle to the UDP source address; for data it answers with a control header
//!   of its own (so the sender learns its QP) and delivers the data.
//! * Once a destination has an address handle, datagrams go as UD SENDs with
//!   Q_Key `RDMA_UDP_QKEY`, each after an 8-byte (IPv4; 24 for IPv6) *datagram
//!   header*: version, header length, the sender's UDP port and IP address (for
//!   IPv6, the flow label and the address), which is what `rrecvfrom` reports.
//!
//! Each receive WR takes the GRH (40 bytes) and one message of up to 2048 bytes
//! (`RS_SNDLOWAT`), header included; a datagram longer than that is EMSGSIZE. As
//! with UDP, a message that finds no free receive is dropped.
//!
//! librdmacm reads the UDP socket in a thread of its own and hands UDP-borne data to
//! its QP by a SEND to itself; here every call on the rsocket (and `rpoll`) reads
//! the UDP socket first and queues such data directly: the wire is the same.
//!
//! The emulator's devices own addresses of their own (127.0.0.x in a test): a UDP
//! socket not bound by the program is bound to its device's address before it
//! sends, so the peer's address handle for the UDP source reaches that device.
//!
//! # Safety argument
//!
//! Beyond the parent module's (the caller's buffers and addresses), the unsafe
//! code here calls the kernel's socket calls on the rsocket's own UDP socket (or a
//! short-lived one of its own) with buffers and `sockaddr_storage` values that live
//! on this module's stack for the call, their lengths given as they are.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use verbs_api::{
    AccessFlags, AhAttr, AhId, CmChannelId, CmId, ConnectionManager, Gid, GlobalRoute, MemBuf,
    MrInfo, PortSpace, QpCap, QpInitAttr, QpType, RecvWr, SendWr, SgList, Sge, UdDest, WcStatus,
    WorkCompletion,
};

use super::data::{st, Resources, SNDLOWAT};
use crate::rdmacm::Cm;
use crate::sys::rdma as r;
use verbs_ffi::cm::{sockaddr_from_c, sockaddr_to_c};

/// The tag that starts a UDP header (`DS_UDP_TAG`).
const UDP_TAG: u32 = 0x5555_5555;
/// UDP header lengths (`DS_UDP_IPV4_HDR_LEN`, `DS_UDP_IPV6_HDR_LEN`).
const UDP_HDR_V4: usize = 16;
const UDP_HDR_V6: usize = 28;
/// Datagram header lengths (`DS_IPV4_HDR_LEN`, `DS_IPV6_HDR_LEN`).
const HDR_V4: usize = 8;
const HDR_V6: usize = 24;
/// UDP header operations (rsockets' `RS_OP_DATA`, `RS_OP_CTRL`).
const OP_DATA: u8 = 0;
const OP_CTRL: u8 = 7;
/// The GRH in front of every UD receive.
const GRH: usize = 40;
/// One message slot, header included (`RS_SNDLOWAT`).
const MSG: usize = SNDLOWAT as usize;
/// rdma_cm's Q_Key of `RDMA_PS_UDP` QPs (`RDMA_UDP_QKEY`).
const QKEY: u32 = emu_cm::RDMA_UDP_QKEY;
/// A receive WR's id has this bit (and the slot's offset).
const RECV: u64 = 1 << 63;
/// Queue sizes (rsocket.c `RS_QP_MIN_SIZE`, `RS_QP_MAX_SIZE`).
const QP_MIN: u32 = 16;
const QP_MAX: u32 = 0xFFFE;

/// The datagram header: the sender's UDP address as rsockets carries it.
fn emit_hdr(a: SocketAddr, out: &mut Vec<u8>) {
    match a {
        SocketAddr::V4(v) => {
            out.extend_from_slice(&[4, HDR_V4 as u8]);
            out.extend_from_slice(&v.port().to_be_bytes());
            out.extend_from_slice(&v.ip().octets());
        }
        SocketAddr::V6(v) => {
            out.extend_from_slice(&[6, HDR_V6 as u8]);
            out.extend_from_slice(&v.port().to_be_bytes());
            out.extend_from_slice(&v.flowinfo().to_be_bytes());
            out.extend_from_slice(&v.ip().octets());
        }
    }
}

/// Parses a datagram header: the source address and the header's length; `None`
/// unless it is a valid IPv4 or IPv6 one (rsocket.c `ds_valid_recv`).
fn parse_hdr(b: &[u8]) -> Option<(SocketAddr, usize)> {
    let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
    match (b[0], b[1] as usize) {
        (4, HDR_V4) if b.len() >= HDR_V4 => {
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some((SocketAddr::V4(SocketAddrV4::new(ip, port)), HDR_V4))
        }
        (6, HDR_V6) if b.len() >= HDR_V6 => {
            let flow = u32::from_be_bytes(b[4..8].try_into().expect("4"));
            let ip: [u8; 16] = b[8..24].try_into().expect("16");
            let a = SocketAddrV6::new(Ipv6Addr::from(ip), port, flow, 0);
            Some((SocketAddr::V6(a), HDR_V6))
        }
        _ => None,
    }
}

/// A UDP header (operation `op`, our QP `qpn`, our address `ip`).
fn emit_udp_hdr(op: u8, qpn: u32, ip: IpAddr) -> Vec<u8> {
    let mut h = Vec::with_capacity(UDP_HDR_V6);
    h.extend_from_slice(&UDP_TAG.to_be_bytes());
    let (ver, len) = match ip {
        IpAddr::V4(_) => (4, UDP_HDR_V4),
        IpAddr::V6(_) => (6, UDP_HDR_V6),
    };
    h.extend_from_slice(&[ver, op, len as u8, 0]);
    h.extend_from_slice(&(qpn & 0xFF_FFFF).to_be_bytes());
    match ip {
        IpAddr::V4(v) => h.extend_from_slice(&v.octets()),
        IpAddr::V6(v) => h.extend_from_slice(&v.octets()),
    }
    h
}

/// A UDP header from `from` parsed: its operation, the sender's QP number and the
/// header's length; `None` unless the tag, version and length agree with the
/// source's family (rsocket.c `udp_svc_valid_udp_hdr`).
fn parse_udp_hdr(b: &[u8], from: SocketAddr) -> Option<(u8, u32, usize)> {
    if b.len() < UDP_HDR_V4 || u32::from_be_bytes(b[0..4].try_into().expect("4")) != UDP_TAG {
        return None;
    }
    let len = b[6] as usize;
    let ok = match from {
        SocketAddr::V4(_) => b[4] == 4 && len == UDP_HDR_V4,
        SocketAddr::V6(_) => b[4] == 6 && len == UDP_HDR_V6,
    };
    if !ok || b.len() < len {
        return None;
    }
    let qpn = u32::from_be_bytes(b[8..12].try_into().expect("4")) & 0xFF_FFFF;
    Some((b[5], qpn, len))
}

/// The last OS error's errno.
fn os_errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// getsockname(2) of `fd`.
fn sock_name(fd: c_int) -> Result<SocketAddr, c_int> {
    let mut ss = r::sockaddr_storage::default();
    let mut len = std::mem::size_of::<r::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: our buffer and its length.
    if unsafe { libc::getsockname(fd, std::ptr::from_mut(&mut ss).cast(), &mut len) } != 0 {
        return Err(os_errno());
    }
    sockaddr_from_c(&ss).map_err(|_| libc::EAFNOSUPPORT)
}

/// One UD QP of a datagram rsocket and its buffers: the source of datagrams from
/// one local address (rsocket.c `struct ds_qp`).
struct DsQp {
    id: CmId,
    res: Resources,
    qpn: u32,
    cq: verbs_api::CqId,
    comp: verbs_api::ChannelId,
    /// The local address it sends from, with the UDP socket's port: its datagram
    /// header.
    local: SocketAddr,
    sgid_index: u8,
    /// Send slots of [`MSG`] bytes.
    sbuf: MemBuf,
    smr: MrInfo,
    free: Vec<u32>,
    /// Receive slots of [`MSG`] bytes, then one GRH area all receives share.
    rbuf: MemBuf,
    rmr: MrInfo,
    rq: u32,
    cq_armed: bool,
}

impl DsQp {
    /// Posts the receive of slot `offset`.
    fn post_recv(&self, offset: u32) -> Result<(), c_int> {
        let grh = Sge {
            addr: self.rmr.addr + u64::from(self.rq) * MSG as u64,
            length: GRH as u32,
            lkey: self.rmr.lkey,
        };
        let data = Sge {
            addr: self.rmr.addr + u64::from(offset),
            length: MSG as u32,
            lkey: self.rmr.lkey,
        };
        self.res
            .dev
            .post_recv(
                self.qpn,
                &[RecvWr::new(RECV | u64::from(offset), vec![grh, data])],
            )
            .map_err(|e| e.error.errno())
    }

    fn arm(&mut self) {
        if !self.cq_armed && self.res.dev.req_notify_cq(self.cq, false).is_ok() {
            self.cq_armed = true;
        }
    }
}

/// What a destination address resolves to (rsocket.c `struct ds_dest`).
#[derive(Clone, Copy)]
struct Dest {
    /// The index of the QP that sends to it.
    qp: usize,
    /// The address handle and the peer's QP, once its UDP header told it.
    ah: Option<AhId>,
    qpn: u32,
}

/// A datagram received: where from and its bytes.
struct RMsg {
    from: SocketAddr,
    data: Vec<u8>,
}

/// The state of a datagram rsocket, under its lock.
pub(crate) struct DState {
    pub(crate) fs_flags: c_int,
    pub(crate) fd_flags: c_int,
    /// AF_INET or AF_INET6.
    domain: c_int,
    /// `st::READABLE | st::WRITABLE` once set up (rsocket.c `ds_init_ep`), cleared
    /// by close.
    state: u32,
    /// Queue sizes and buffer sizes as the options set them (fixed at set-up).
    pub(crate) sq_size: u32,
    pub(crate) rq_size: u32,
    pub(crate) sq_inline: u32,
    pub(crate) rbuf_size: u32,
    pub(crate) sbuf_size: u32,
    qps: Vec<DsQp>,
    dests: HashMap<SocketAddr, Dest>,
    /// The destination of `rsend` (rconnect) or of the last `rsendto`.
    conn_dest: Option<SocketAddr>,
    /// The connected peer (`rconnect`).
    peer: Option<SocketAddr>,
    rmsgs: VecDeque<RMsg>,
    /// Sends not yet completed, over all QPs.
    sends: u32,
}

impl DState {
    fn nonblocking(&self, flags: c_int) -> bool {
        self.fs_flags & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0
    }

    fn have_rdata(&self) -> bool {
        !self.rmsgs.is_empty()
    }

    /// A send slot is free (rsocket.c `ds_can_send`).
    fn can_send(&self) -> bool {
        self.sends < self.sq_size
    }

    fn all_sends_done(&self) -> bool {
        self.sends == 0
    }
}

/// A datagram rsocket: its number (the UDP socket), a CM channel for its ids, and
/// its state.
pub(crate) struct DSocket {
    pub(crate) fd: c_int,
    ch: CmChannelId,
    pub(crate) s: Mutex<DState>,
}

/// The datagram rsockets of the process by number.
static DGRAMS: LazyLock<Mutex<HashMap<c_int, Arc<DSocket>>>> = LazyLock::new(Mutex::default);

/// The datagram rsocket numbered `fd`.
pub(crate) fn lookup(fd: c_int) -> Option<Arc<DSocket>> {
    DGRAMS.lock().get(&fd).cloned()
}

/// `rsocket(domain, SOCK_DGRAM, ...)`: a UDP socket of the domain and a CM channel.
pub(crate) fn socket(cm: &Cm, domain: c_int, kind: c_int) -> Result<c_int, c_int> {
    // SAFETY: socket(2).
    let fd = unsafe { libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(os_errno());
    }
    let ch = match cm.cm.create_event_channel() {
        Ok(ch) => ch,
        Err(e) => {
            // SAFETY: our socket.
            unsafe { libc::close(fd) };
            return Err(e.errno());
        }
    };
    let d = super::Sizes::default();
    let ds = Arc::new(DSocket {
        fd,
        ch,
        s: Mutex::new(DState {
            fs_flags: if kind & libc::SOCK_NONBLOCK != 0 {
                libc::O_NONBLOCK
            } else {
                0
            },
            fd_flags: if kind & libc::SOCK_CLOEXEC != 0 {
                libc::FD_CLOEXEC
            } else {
                0
            },
            domain,
            state: 0,
            sq_size: d.sq_size,
            rq_size: d.rq_size,
            sq_inline: d.sq_inline,
            rbuf_size: d.rbuf_size,
            sbuf_size: d.sbuf_size,
            qps: Vec::new(),
            dests: HashMap::new(),
            conn_dest: None,
            peer: None,
            rmsgs: VecDeque::new(),
            sends: 0,
        }),
    });
    DGRAMS.lock().insert(fd, ds);
    Ok(fd)
}

/// The addresses of this process's devices.
fn device_ips(cm: &Cm) -> Vec<IpAddr> {
    let mut v = Vec::new();
    for (_, ctx) in &cm.contexts {
        // SAFETY: one of the CM's open contexts.
        let Some(c) = (unsafe { crate::objects::Context::from_ptr(*ctx as *mut _) }) else {
            continue;
        };
        use verbs_api::Device;
        if let Ok(g) = c.dev.query_gid(1, 0) {
            v.push(g.to_ipv4().map_or(IpAddr::V6(g.to_ipv6()), IpAddr::V4));
        }
    }
    v
}

impl DSocket {
    /// rsocket.c `ds_init_ep`, once: the queue sizes from the buffer sizes; an
    /// unbound UDP socket bound to its device's address (see the module docs).
    fn init_ep(&self, cm: &Cm, s: &mut DState, bind_device: bool) -> Result<(), c_int> {
        if s.state != 0 {
            return Ok(());
        }
        let max = QP_MAX;
        s.sq_size = s.sq_size.clamp(QP_MIN, max);
        s.rq_size = s.rq_size.clamp(QP_MIN, max);
        // As many receives as the receive buffer has message slots, and sends alike.
        s.rq_size = s.rq_size.min((s.rbuf_size / SNDLOWAT).max(1));
        s.rbuf_size = s.rq_size * SNDLOWAT;
        s.sq_size = s.sq_size.min((s.sbuf_size / SNDLOWAT).max(1));
        s.sbuf_size = s.sq_size * SNDLOWAT;
        if bind_device && sock_name(self.fd)?.port() == 0 {
            let fam = |ip: &IpAddr| ip.is_ipv4() == (s.domain == libc::AF_INET);
            if let Some(ip) = device_ips(cm).into_iter().find(fam) {
                let (ss, len) = sockaddr_to_c(SocketAddr::new(ip, 0));
                // SAFETY: our socket and address.
                if unsafe { libc::bind(self.fd, std::ptr::from_ref(&ss).cast(), len) } != 0 {
                    return Err(os_errno());
                }
            }
        }
        s.state = st::READABLE | st::WRITABLE;
        Ok(())
    }

    /// The local address datagrams to `dst` go from (rsocket.c `ds_get_src_addr`):
    /// the UDP socket's, or when that is a wildcard or loopback address the one the
    /// kernel's routing picks, with the socket's port; an address none of our
    /// devices owns is replaced by the first device address of the family.
    fn src_addr(&self, cm: &Cm, dst: SocketAddr) -> Result<SocketAddr, c_int> {
        let local = sock_name(self.fd)?;
        let mut ip = local.ip();
        if ip.is_unspecified() || ip.is_loopback() {
            let fam = if dst.is_ipv4() {
                libc::AF_INET
            } else {
                libc::AF_INET6
            };
            // SAFETY: socket(2); closed below.
            let t = unsafe { libc::socket(fam, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
            if t < 0 {
                return Err(os_errno());
            }
            let (ss, len) = sockaddr_to_c(dst);
            // SAFETY: our socket and address.
            let r = unsafe { libc::connect(t, std::ptr::from_ref(&ss).cast(), len) };
            let routed = if r == 0 {
                sock_name(t)
            } else {
                Err(os_errno())
            };
            // SAFETY: our socket.
            unsafe { libc::close(t) };
            ip = routed?.ip();
        }
        let ours = device_ips(cm);
        if !ours.contains(&ip) {
            if let Some(d) = ours.iter().find(|d| d.is_ipv4() == ip.is_ipv4()) {
                ip = *d;
            }
        }
        Ok(SocketAddr::new(ip, local.port()))
    }

    /// The destination `dst` (rsocket.c `ds_get_dest`): known, or new with the QP
    /// of its source address (made if there is none yet).
    fn dest(&self, cm: &Cm, s: &mut DState, dst: SocketAddr) -> Result<Dest, c_int> {
        if let Some(d) = s.dests.get(&dst) {
            return Ok(*d);
        }
        let src = self.src_addr(cm, dst)?;
        let qp = match s.qps.iter().position(|q| q.local.ip() == src.ip()) {
            Some(i) => i,
            None => {
                let q = self.create_qp(cm, s, src)?;
                s.qps.push(q);
                s.qps.len() - 1
            }
        };
        let d = Dest {
            qp,
            ah: None,
            qpn: 0,
        };
        s.dests.insert(dst, d);
        Ok(d)
    }

    /// A UD QP sending from `src` (rsocket.c `ds_create_qp`): a `RDMA_PS_UDP` id
    /// bound to its address, a CQ with its channel (armed), the QP (the CM brings
    /// it to RTS with rdma_cm's Q_Key), the send and receive slots, every receive
    /// posted.
    fn create_qp(&self, cm: &Cm, s: &DState, src: SocketAddr) -> Result<DsQp, c_int> {
        let e = |e: verbs_api::Error| e.errno();
        let id = cm.cm.create_id(self.ch, PortSpace::Udp).map_err(e)?;
        let built = (|| {
            // The id's own port is not part of the protocol (the header carries the
            // UDP socket's): any free one.
            cm.cm
                .bind_addr(id, SocketAddr::new(src.ip(), 0))
                .map_err(e)?;
            let dev = cm.cm.device(id).map_err(e)?;
            let (mut res, pd, comp, cq) =
                Resources::open(&dev, s.sq_size + s.rq_size).map_err(e)?;
            let sbuf = MemBuf::new(s.sq_size as usize * MSG);
            let smr = dev
                .reg_mr(pd, &sbuf, 0, sbuf.len(), AccessFlags::LOCAL_WRITE)
                .map_err(e)?;
            res.lkeys.push(smr.lkey);
            let rbuf = MemBuf::new(s.rq_size as usize * MSG + GRH);
            let rmr = dev
                .reg_mr(pd, &rbuf, 0, rbuf.len(), AccessFlags::LOCAL_WRITE)
                .map_err(e)?;
            res.lkeys.push(rmr.lkey);
            let init = QpInitAttr::new(
                pd,
                cq,
                QpType::Ud,
                QpCap {
                    max_send_wr: s.sq_size,
                    max_recv_wr: s.rq_size,
                    max_send_sge: 1,
                    max_recv_sge: 2,
                    max_inline_data: 0,
                },
            )
            .sq_sig_all(true);
            let qpn = cm.cm.create_qp(id, &init).map_err(e)?;
            let want = match src.ip() {
                IpAddr::V4(v) => Gid::from(v),
                IpAddr::V6(v) => Gid::from(v),
            };
            let sgid_index = (0..16u8)
                .find(|&i| dev.query_gid(1, u32::from(i)).is_ok_and(|g| g == want))
                .unwrap_or(0);
            let mut q = DsQp {
                id,
                res,
                qpn,
                cq,
                comp,
                local: src,
                sgid_index,
                sbuf,
                smr,
                free: (0..s.sq_size).rev().map(|i| i * MSG as u32).collect(),
                rbuf,
                rmr,
                rq: s.rq_size,
                cq_armed: false,
            };
            for i in 0..s.rq_size {
                if let Err(x) = q.post_recv(i * MSG as u32) {
                    let _ = cm.cm.destroy_qp(id);
                    return Err(x);
                }
            }
            q.arm();
            Ok(q)
        })();
        if built.is_err() {
            let _ = cm.cm.destroy_id(id);
        }
        built
    }

    /// An address handle from QP `qp` to `dst`'s device (rsocket.c
    /// `udp_svc_create_ah`; on RoCE the GID is the address).
    fn create_ah(s: &DState, qp: usize, dst: IpAddr) -> Result<AhId, c_int> {
        let q = &s.qps[qp];
        let dgid = match dst {
            IpAddr::V4(v) => Gid::from(v),
            IpAddr::V6(v) => Gid::from(v),
        };
        let attr = AhAttr {
            grh: GlobalRoute {
                dgid,
                flow_label: 0,
                sgid_index: q.sgid_index,
                hop_limit: 64,
                traffic_class: 0,
            },
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        };
        let pd = q.res.pd.ok_or(libc::EINVAL)?;
        q.res.dev.create_ah(pd, &attr).map_err(|e| e.errno())
    }

    /// Sends a UDP header (and `data`) from QP `qp` to `dst` over the UDP socket
    /// (rsocket.c `ds_sendv_udp`); the bytes of `data` sent.
    fn send_udp(&self, s: &DState, qp: usize, dst: SocketAddr, op: u8, data: &[u8]) -> isize {
        let q = &s.qps[qp];
        let mut b = emit_udp_hdr(op, q.qpn, q.local.ip());
        let hl = b.len();
        b.extend_from_slice(data);
        let (ss, len) = sockaddr_to_c(dst);
        // SAFETY: our socket, buffer and address.
        let n = unsafe {
            libc::sendto(
                self.fd,
                b.as_ptr().cast(),
                b.len(),
                libc::MSG_DONTWAIT,
                std::ptr::from_ref(&ss).cast(),
                len,
            )
        };
        if n < 0 {
            n
        } else {
            n - hl as isize
        }
    }

    /// Reads what waits on the UDP socket (rsocket.c `udp_svc_process_rs`, for each
    /// datagram): the sender's QP becomes its destination's address handle; data
    /// is answered with a control header and queued for reading.
    fn process_udp(&self, cm: &Cm, s: &mut DState) {
        let mut buf = [0u8; MSG + UDP_HDR_V6];
        loop {
            let mut ss = r::sockaddr_storage::default();
            let mut sl = std::mem::size_of::<r::sockaddr_storage>() as libc::socklen_t;
            // SAFETY: our socket, buffer and address buffer.
            let n = unsafe {
                libc::recvfrom(
                    self.fd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    std::ptr::from_mut(&mut ss).cast(),
                    &mut sl,
                )
            };
            if n < 0 {
                return;
            }
            let b = &buf[..n as usize];
            let Ok(from) = sockaddr_from_c(&ss) else {
                continue;
            };
            let Some((op, qpn, hl)) = parse_udp_hdr(b, from) else {
                continue;
            };
            let Ok(d) = self.dest(cm, s, from) else {
                continue;
            };
            if op == OP_DATA {
                self.send_udp(s, d.qp, from, OP_CTRL, &[]);
            }
            if d.ah.is_none() || d.qpn != qpn {
                if let Some(old) = d.ah {
                    let _ = s.qps[d.qp].res.dev.destroy_ah(old);
                }
                let ah = Self::create_ah(s, d.qp, from.ip()).ok();
                s.dests.insert(from, Dest { qp: d.qp, ah, qpn });
            }
            if op == OP_DATA && s.rmsgs.len() < s.rq_size as usize {
                s.rmsgs.push_back(RMsg {
                    from,
                    data: b[hl..].to_vec(),
                });
            }
        }
    }

    /// Takes the completions of every QP (rsocket.c `ds_poll_cqs`): valid receives
    /// are queued while there is room (else dropped) and their slots posted again;
    /// completed sends free their slots.
    fn poll_cqs(s: &mut DState) {
        let mut wcs: Vec<WorkCompletion> = Vec::with_capacity(32);
        let cap = s.rq_size as usize;
        for qi in 0..s.qps.len() {
            loop {
                wcs.clear();
                let q = &s.qps[qi];
                match q.res.dev.poll_cq(q.cq, 32, &mut wcs) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                for wc in &wcs {
                    let q = &mut s.qps[qi];
                    if wc.wr_id & RECV == 0 {
                        q.free.push(wc.wr_id as u32);
                        s.sends = s.sends.saturating_sub(1);
                        continue;
                    }
                    let off = (wc.wr_id & 0xFFFF_FFFF) as u32;
                    let len = (wc.byte_len as usize).saturating_sub(GRH).min(MSG);
                    if wc.status == WcStatus::Success && s.rmsgs.len() < cap {
                        let mut m = vec![0u8; len];
                        if q.rbuf.read(off as usize, &mut m).is_ok() {
                            if let Some((from, hl)) = parse_hdr(&m) {
                                m.drain(..hl);
                                s.rmsgs.push_back(RMsg { from, data: m });
                            }
                        }
                    }
                    let _ = s.qps[qi].post_recv(off);
                }
            }
        }
    }

    /// One round of progress: the UDP socket, then the CQs.
    fn progress(&self, cm: &Cm, s: &mut DState) {
        self.process_udp(cm, s);
        Self::poll_cqs(s);
    }

    /// Makes progress until `test` holds, waiting on the UDP socket and the CQs'
    /// channels unless `nonblock` (then EWOULDBLOCK); returns the locked state.
    fn process(
        &self,
        cm: &Cm,
        nonblock: bool,
        test: fn(&DState) -> bool,
    ) -> Result<MutexGuard<'_, DState>, c_int> {
        loop {
            let mut s = self.s.lock();
            self.progress(cm, &mut s);
            if test(&s) {
                return Ok(s);
            }
            if nonblock {
                return Err(libc::EWOULDBLOCK);
            }
            let mut fds = Vec::with_capacity(s.qps.len() + 1);
            self.wait_fds(&mut s, &mut fds);
            self.progress(cm, &mut s);
            if test(&s) {
                return Ok(s);
            }
            drop(s);
            // Bounded: another thread may take the events or change the state.
            // SAFETY: our own array.
            unsafe { super::poll::sys_poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
            self.take_events();
        }
    }

    /// Arms every CQ and adds what stands for this rsocket while waiting: the UDP
    /// socket and the CQs' channels.
    fn wait_fds(&self, s: &mut DState, out: &mut Vec<libc::pollfd>) {
        let fd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        out.push(fd(self.fd));
        for q in &mut s.qps {
            q.arm();
            if let Ok(f) = q.res.dev.comp_channel_fd(q.comp) {
                out.push(fd(f));
            }
        }
    }

    /// Takes the CQ events pending without waiting (each CQ is disarmed by one).
    fn take_events(&self) {
        let mut s = self.s.lock();
        for q in &mut s.qps {
            while q.res.dev.get_cq_event(q.comp, Some(Duration::ZERO)).is_ok() {
                q.cq_armed = false;
            }
        }
    }
}

/// rpoll's part: the events ready on `ds` now (progress made, nothing waited for).
pub(crate) fn revents(cm: &Cm, ds: &DSocket, events: i16) -> i16 {
    let mut s = ds.s.lock();
    ds.progress(cm, &mut s);
    let mut re = 0;
    if events & libc::POLLIN != 0 && s.have_rdata() {
        re |= libc::POLLIN;
    }
    if events & libc::POLLOUT != 0 && s.can_send() {
        re |= libc::POLLOUT;
    }
    re
}

/// rpoll's part: the descriptors to wait on for `ds` (its CQs armed).
pub(crate) fn poll_wait_fds(ds: &DSocket, out: &mut Vec<libc::pollfd>) {
    let mut s = ds.s.lock();
    ds.wait_fds(&mut s, out);
}

/// rpoll's part: the CQ events after a wait.
pub(crate) fn poll_take_events(ds: &DSocket) {
    ds.take_events();
}

/// `rbind`: sets the rsocket up and binds its UDP socket.
pub(crate) fn bind(cm: &Cm, ds: &DSocket, a: SocketAddr) -> Result<(), c_int> {
    let mut s = ds.s.lock();
    ds.init_ep(cm, &mut s, false)?;
    let (ss, len) = sockaddr_to_c(a);
    // SAFETY: our socket and address.
    if unsafe { libc::bind(ds.fd, std::ptr::from_ref(&ss).cast(), len) } != 0 {
        return Err(os_errno());
    }
    Ok(())
}

/// `rconnect`: connects the UDP socket (so the kernel checks the address and picks
/// the source) and makes `a` the destination of `rsend`.
pub(crate) fn connect(cm: &Cm, ds: &DSocket, a: SocketAddr) -> Result<(), c_int> {
    let mut s = ds.s.lock();
    ds.init_ep(cm, &mut s, true)?;
    let (ss, len) = sockaddr_to_c(a);
    // SAFETY: our socket and address.
    if unsafe { libc::connect(ds.fd, std::ptr::from_ref(&ss).cast(), len) } != 0 {
        return Err(os_errno());
    }
    ds.dest(cm, &mut s, a)?;
    s.conn_dest = Some(a);
    s.peer = Some(a);
    Ok(())
}

/// `rsend`/`rsendto`: one datagram to `to` (the connected peer when `None`): over
/// UDP while the destination has no address handle, else a UD SEND (waiting for
/// a free send slot unless non-blocking).
pub(crate) fn send(
    cm: &Cm,
    ds: &DSocket,
    data: &[u8],
    flags: c_int,
    to: Option<SocketAddr>,
) -> Result<usize, c_int> {
    let nonblock = {
        let mut s = ds.s.lock();
        if s.state == 0 {
            if to.is_none() {
                return Err(libc::EDESTADDRREQ);
            }
            ds.init_ep(cm, &mut s, true)?;
        }
        if s.state & st::WRITABLE == 0 {
            return Err(libc::EPIPE);
        }
        s.nonblocking(flags)
    };
    let mut s = ds.s.lock();
    let dst = match to.or(s.conn_dest) {
        Some(d) => d,
        None => return Err(libc::EDESTADDRREQ),
    };
    let d = ds.dest(cm, &mut s, dst)?;
    let hl = if s.qps[d.qp].local.is_ipv4() {
        HDR_V4
    } else {
        HDR_V6
    };
    if data.len() + hl > MSG {
        return Err(libc::EMSGSIZE);
    }
    s.conn_dest = Some(dst);
    let Some(ah) = d.ah else {
        let n = ds.send_udp(&s, d.qp, dst, OP_DATA, data);
        return if n < 0 {
            Err(os_errno())
        } else {
            Ok(n as usize)
        };
    };
    if !s.can_send() {
        drop(s);
        s = ds.process(cm, nonblock, DState::can_send)?;
    }
    // The destination may have changed while unlocked.
    let d = *s.dests.get(&dst).ok_or(libc::EAGAIN)?;
    let ah = d.ah.unwrap_or(ah);
    let q = &mut s.qps[d.qp];
    let Some(slot) = q.free.pop() else {
        return Err(libc::EAGAIN);
    };
    let mut m = Vec::with_capacity(hl + data.len());
    emit_hdr(q.local, &mut m);
    m.extend_from_slice(data);
    if q.sbuf.write(slot as usize, &m).is_err() {
        q.free.push(slot);
        return Err(libc::EFAULT);
    }
    let sge = Sge {
        addr: q.smr.addr + u64::from(slot),
        length: m.len() as u32,
        lkey: q.smr.lkey,
    };
    let mut wr = SendWr::send(u64::from(slot), SgList::from(sge));
    wr.ud = Some(UdDest {
        ah,
        remote_qpn: d.qpn,
        remote_qkey: QKEY,
    });
    if let Err(e) = q.res.dev.post_send(q.qpn, &[wr]) {
        q.free.push(slot);
        return Err(e.error.errno());
    }
    s.sends += 1;
    Ok(data.len())
}

/// `rrecv`/`rrecvfrom`: the next datagram (truncated to `buf`, the rest dropped,
/// as UDP does; kept with MSG_PEEK) and its source.
pub(crate) fn recv(
    cm: &Cm,
    ds: &DSocket,
    buf: &mut [u8],
    flags: c_int,
) -> Result<(usize, SocketAddr), c_int> {
    let nonblock = {
        let s = ds.s.lock();
        if s.state & st::READABLE == 0 {
            return Err(libc::EINVAL);
        }
        s.nonblocking(flags)
    };
    let mut s = ds.process(cm, nonblock, DState::have_rdata)?;
    let peek = flags & libc::MSG_PEEK != 0;
    let m = s.rmsgs.front().ok_or(libc::EAGAIN)?;
    let n = m.data.len().min(buf.len());
    buf[..n].copy_from_slice(&m.data[..n]);
    let from = m.from;
    if !peek {
        s.rmsgs.pop_front();
    }
    Ok((n, from))
}

/// `rclose` (rsocket.c `ds_shutdown`, `ds_free`): waits for the sends under way,
/// then frees the QPs, ids, channel and the UDP socket.
pub(crate) fn close(cm: &Cm, fd: c_int) -> Result<(), c_int> {
    let Some(ds) = DGRAMS.lock().remove(&fd) else {
        return Err(libc::EBADF);
    };
    {
        let mut s = ds.s.lock();
        s.state &= !(st::READABLE | st::WRITABLE);
    }
    // Bounded: a send to a peer that is gone completes anyway on UD.
    for _ in 0..50 {
        match ds.process(cm, true, DState::all_sends_done) {
            Ok(_) => break,
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    let mut s = ds.s.lock();
    let dests: Vec<Dest> = s.dests.drain().map(|(_, d)| d).collect();
    for d in dests {
        if let Some(ah) = d.ah {
            let _ = s.qps[d.qp].res.dev.destroy_ah(ah);
        }
    }
    for q in s.qps.drain(..) {
        let _ = cm.cm.destroy_qp(q.id);
        let _ = cm.cm.destroy_id(q.id);
        drop(q);
    }
    drop(s);
    let _ = cm.cm.destroy_event_channel(ds.ch);
    // SAFETY: the UDP socket is ours, and no longer in the table.
    unsafe { libc::close(fd) };
    Ok(())
}

/// `rshutdown`: no more receiving (SHUT_RD), sending (SHUT_WR) or either.
pub(crate) fn shutdown(ds: &DSocket, how: c_int) -> Result<(), c_int> {
    let mut s = ds.s.lock();
    s.state &= !match how {
        libc::SHUT_RD => st::READABLE,
        libc::SHUT_WR => st::WRITABLE,
        libc::SHUT_RDWR => st::READABLE | st::WRITABLE,
        _ => return Err(libc::EINVAL),
    };
    Ok(())
}

/// `rgetsockname` / `rgetpeername`: the UDP socket's addresses.
pub(crate) fn name(ds: &DSocket, peer: bool) -> Result<Option<SocketAddr>, c_int> {
    if peer {
        let s = ds.s.lock();
        return s.peer.map(Some).ok_or(libc::ENOTCONN);
    }
    sock_name(ds.fd).map(Some)
}

/// `rsetsockopt` on a datagram rsocket (rsocket.c): options other than SOL_RDMA's
/// go to the UDP socket too; SO_RCVBUF and SO_SNDBUF (doubled) and SOL_RDMA's
/// queue sizes set the sizes until the first QP is made.
pub(crate) fn setsockopt(
    ds: &DSocket,
    level: c_int,
    name: c_int,
    val: *const std::ffi::c_void,
    len: u32,
    v: Option<c_int>,
) -> Result<(), c_int> {
    if level != super::opts::SOL_RDMA {
        // SAFETY: the caller's option value of len bytes, as setsockopt(2) takes it.
        if unsafe { libc::setsockopt(ds.fd, level, name, val, len) } != 0 {
            return Err(os_errno());
        }
    }
    let mut s = ds.s.lock();
    let fixed = !s.qps.is_empty();
    let v = v.unwrap_or(0).max(0) as u32;
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_RCVBUF) if !fixed => s.rbuf_size = v << 1,
        (libc::SOL_SOCKET, libc::SO_SNDBUF) if !fixed => {
            s.sbuf_size = (v << 1).max(SNDLOWAT << 1);
        }
        (super::opts::SOL_RDMA, _) if fixed => return Err(libc::EINVAL),
        (super::opts::SOL_RDMA, super::opts::RDMA_SQSIZE) => s.sq_size = v.min(QP_MAX),
        (super::opts::SOL_RDMA, super::opts::RDMA_RQSIZE) => s.rq_size = v.min(QP_MAX),
        (super::opts::SOL_RDMA, super::opts::RDMA_INLINE) => s.sq_inline = v.min(QP_MAX),
        (super::opts::SOL_RDMA, _) => return Err(libc::EOPNOTSUPP),
        _ => {}
    }
    Ok(())
}

/// `rgetsockopt` on a datagram rsocket: the sizes as rsockets keeps them, the rest
/// from the UDP socket.
pub(crate) fn getsockopt(
    ds: &DSocket,
    level: c_int,
    name: c_int,
    val: *mut std::ffi::c_void,
    len: *mut u32,
) -> Result<Option<c_int>, c_int> {
    let s = ds.s.lock();
    Ok(Some(match (level, name) {
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => s.rbuf_size as c_int,
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => s.sbuf_size as c_int,
        (super::opts::SOL_RDMA, super::opts::RDMA_SQSIZE) => s.sq_size as c_int,
        (super::opts::SOL_RDMA, super::opts::RDMA_RQSIZE) => s.rq_size as c_int,
        (super::opts::SOL_RDMA, super::opts::RDMA_INLINE) => s.sq_inline as c_int,
        (super::opts::SOL_RDMA, _) => return Err(libc::EOPNOTSUPP),
        _ => {
            // SAFETY: the caller's buffer of *len bytes, as getsockopt(2) takes it.
            if unsafe { libc::getsockopt(ds.fd, level, name, val, len) } != 0 {
                return Err(os_errno());
            }
            return Ok(None);
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_headers_round_trip_and_layout() {
        let a: SocketAddr = "192.168.77.1:7174".parse().unwrap();
        let mut b = Vec::new();
        emit_hdr(a, &mut b);
        assert_eq!(b, [4, 8, 0x1C, 0x06, 192, 168, 77, 1]);
        assert_eq!(parse_hdr(&b), Some((a, HDR_V4)));
        let a6 = SocketAddr::V6(SocketAddrV6::new("fd00::7".parse().unwrap(), 9, 0x12345, 0));
        let mut b6 = Vec::new();
        emit_hdr(a6, &mut b6);
        assert_eq!(b6.len(), HDR_V6);
        assert_eq!(&b6[..4], &[6, 24, 0, 9]);
        assert_eq!(&b6[4..8], &0x12345u32.to_be_bytes());
        assert_eq!(parse_hdr(&b6), Some((a6, HDR_V6)));
        // A version and length that disagree, or too short: not a header.
        assert_eq!(parse_hdr(&[4, 24, 0, 1, 1, 2, 3, 4]), None);
        assert_eq!(parse_hdr(&b[..7]), None);
        assert_eq!(parse_hdr(&[5, 8, 0, 1, 1, 2, 3, 4]), None);
    }

    #[test]
    fn udp_headers_round_trip_and_layout() {
        let from: SocketAddr = "127.0.0.2:5000".parse().unwrap();
        let h = emit_udp_hdr(OP_DATA, 0xAB_CDEF, "127.0.0.2".parse().unwrap());
        assert_eq!(
            h,
            [0x55, 0x55, 0x55, 0x55, 4, 0, 16, 0, 0, 0xAB, 0xCD, 0xEF, 127, 0, 0, 2]
        );
        assert_eq!(parse_udp_hdr(&h, from), Some((OP_DATA, 0xAB_CDEF, 16)));
        // The QP number is 24 bits; the top byte is reserved.
        let mut t = h.clone();
        t[8] = 0xFF;
        assert_eq!(parse_udp_hdr(&t, from), Some((OP_DATA, 0xAB_CDEF, 16)));
        // A wrong tag, or a version other than the source's family: ignored.
        let mut t = h.clone();
        t[0] = 0x54;
        assert_eq!(parse_udp_hdr(&t, from), None);
        let from6: SocketAddr = "[::1]:5000".parse().unwrap();
        assert_eq!(parse_udp_hdr(&h, from6), None);
        let h6 = emit_udp_hdr(OP_CTRL, 7, "::1".parse().unwrap());
        assert_eq!(h6.len(), UDP_HDR_V6);
        assert_eq!(parse_udp_hdr(&h6, from6), Some((OP_CTRL, 7, UDP_HDR_V6)));
        assert_eq!(parse_udp_hdr(&h6[..20], from6), None);
    }
}
