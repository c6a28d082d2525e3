//! Connection set-up over the CM: the endpoint (CQ, QP, buffers) of a stream
//! rsocket, the connection data both sides exchange in the CM's private data, and
//! the connect and accept sequences.
//!
//! The connection data (rsocket.c `struct rs_conn_data`, 40 bytes, every multi-byte
//! field big-endian): version (1), flags (bit 0: the sender is big-endian, so its
//! SGL updates are in that order; bit 1: it has an iomap area, `target_iomap_size`
//! entries after its target SGL), the receive credits (the receive queue size),
//! three reserved bytes, the iomap size (a power-of-two scale), the target SGL array
//! (address, rkey, entry count) and the first half of the receive buffer (address,
//! rkey, length). The peer's first target SGE is that half; its later ones arrive
//! as SGL updates into entries 1, 0, 1, ... of the array.

use std::ffi::c_int;
use std::net::SocketAddr;
use std::time::Duration;

use verbs_api::{
    AccessFlags, CmChannelId, CmEvent, CmEventType, CmId, ConnParam, ConnectionManager, MemBuf,
    QpCap, QpInitAttr, QpType,
};

use super::data::{st, Conn, Resources, RsSge, CTRL_SLOTS, SGE_BYTES, SGL_SIZE};
use super::{Sizes, Sock};
use crate::rdmacm::Cm;

/// The size of `struct rs_conn_data`.
pub(crate) const CONN_DATA_LEN: usize = 40;
/// Flag: the sender's SGL updates are big-endian.
const FLAG_NET: u8 = 1 << 0;
/// Flag: the sender has an iomap area after its target SGL.
const FLAG_IOMAP: u8 = 1 << 1;
/// Queue sizes the endpoint keeps to (rsocket.c `RS_QP_MIN_SIZE`, `RS_QP_MAX_SIZE`).
const QP_MIN: u32 = 16;
const QP_MAX: u32 = 0xFFFE;
/// How long an address or route resolution may take.
const RESOLVE: Duration = Duration::from_secs(2);

/// The connection data a side sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConnData {
    pub(crate) flags: u8,
    pub(crate) credits: u16,
    pub(crate) iomap_scale: u8,
    pub(crate) target_sgl: RsSge,
    pub(crate) data_buf: RsSge,
}

impl ConnData {
    /// The 40 bytes on the wire.
    pub(crate) fn emit(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0] = 1;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        b[7] = self.iomap_scale;
        for (at, s) in [(8, self.target_sgl), (24, self.data_buf)] {
            b[at..at + 8].copy_from_slice(&s.addr.to_be_bytes());
            b[at + 8..at + 12].copy_from_slice(&s.key.to_be_bytes());
            b[at + 12..at + 16].copy_from_slice(&s.length.to_be_bytes());
        }
        b
    }

    /// Parses the connection data at the start of a CM message's private data;
    /// `None` if it is too short or not version 1.
    pub(crate) fn parse(b: &[u8]) -> Option<ConnData> {
        if b.len() < CONN_DATA_LEN || b[0] != 1 {
            return None;
        }
        let sge = |at: usize| RsSge {
            addr: u64::from_be_bytes(b[at..at + 8].try_into().expect("8")),
            key: u32::from_be_bytes(b[at + 8..at + 12].try_into().expect("4")),
            length: u32::from_be_bytes(b[at + 12..at + 16].try_into().expect("4")),
        };
        Some(ConnData {
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            iomap_scale: b[7],
            target_sgl: sge(8),
            data_buf: sge(24),
        })
    }
}

/// An iomap size as the connection data's byte carries it (rsocket.c
/// `rs_value_to_scale` with 8 bits: up to 128 as is, larger ones in units of 256
/// with the top bit set).
pub(crate) fn value_to_scale(v: u16) -> u8 {
    if v <= 128 {
        v as u8
    } else {
        (0x80 | (v >> 8)) as u8
    }
}

/// The inverse of [`value_to_scale`] (`rs_scale_to_value`).
pub(crate) fn scale_to_value(s: u8) -> u32 {
    if s <= 128 {
        u32::from(s)
    } else {
        u32::from(s & 0x7F) << 8
    }
}

/// Whether this host is big-endian (rsocket.c `rs_host_is_net`).
fn host_is_net() -> bool {
    cfg!(target_endian = "big")
}

/// Our connection data for `c` (rsocket.c `rs_format_conn_data`).
pub(crate) fn format_conn_data(c: &Conn) -> ConnData {
    ConnData {
        flags: FLAG_IOMAP | if host_is_net() { FLAG_NET } else { 0 },
        credits: c.rq_size,
        iomap_scale: value_to_scale(c.iomap_size),
        target_sgl: RsSge {
            addr: c.tmr.addr,
            key: c.tmr.rkey,
            length: SGL_SIZE,
        },
        data_buf: RsSge {
            addr: c.rmr.addr,
            key: c.rmr.rkey,
            length: c.rbuf_size >> 1,
        },
    }
}

/// Takes in the peer's connection data (rsocket.c `rs_save_conn_data`).
pub(crate) fn save_conn_data(c: &mut Conn, d: &ConnData) {
    c.remote_sgl = d.target_sgl;
    c.remote_sge = 1;
    c.swap_sgl = (d.flags & FLAG_NET != 0) != host_is_net();
    if d.flags & FLAG_IOMAP != 0 {
        // The peer's iomap area follows its target SGL.
        c.remote_iomap = RsSge {
            addr: d.target_sgl.addr + u64::from(d.target_sgl.length) * SGE_BYTES as u64,
            key: d.target_sgl.key,
            length: scale_to_value(d.iomap_scale),
        };
    }
    c.set_target(0, d.data_buf);
    c.sseq_comp = d.credits;
}

/// What an rsocket's end sends in its connect or accept: its connection data (QPN,
/// buffer, credits) as private data, for an RC QP on no SRQ, with the highest retry
/// and RNR retry counts.
fn conn_param(c: &Conn) -> ConnParam {
    ConnParam {
        private_data: format_conn_data(c).emit().to_vec(),
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: true,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        qp_num: c.qpn,
    }
}

/// Makes the endpoint of CM id `id` (rsocket.c `rs_create_ep` and `rs_init_bufs`):
/// one CQ with its channel for both queues, an RC QP through the CM, the send ring
/// (with control slots), the target SGL array and the receive ring, registered, and
/// the receive queue filled.
pub(crate) fn create_ep(cm: &Cm, id: CmId, z: &Sizes) -> Result<Conn, c_int> {
    let e = |e: verbs_api::Error| e.errno();
    let dev = cm.cm.device(id).map_err(e)?;
    let max = dev
        .query_device()
        .map(|a| a.max_qp_wr.min(QP_MAX))
        .unwrap_or(QP_MAX);
    let sq = z.sq_size.clamp(QP_MIN, max.max(QP_MIN));
    let rq = z.rq_size.clamp(QP_MIN, max.max(QP_MIN));
    let (mut res, pd, comp, cq) = Resources::open(&dev, sq + rq).map_err(e)?;
    let init = QpInitAttr::new(
        pd,
        cq,
        QpType::Rc,
        QpCap {
            max_send_wr: sq,
            max_recv_wr: rq,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
    )
    .sq_sig_all(true);
    let qpn = cm.cm.create_qp(id, &init).map_err(e)?;
    let built = (|| {
        let rbuf_size = z.rbuf_size.max(2 * super::data::SNDLOWAT) & !1;
        let sbuf_size = z.sbuf_size.max(super::data::SNDLOWAT);
        let sbuf = MemBuf::new(sbuf_size as usize + usize::from(CTRL_SLOTS) * SGE_BYTES);
        let smr = dev
            .reg_mr(pd, &sbuf, 0, sbuf.len(), AccessFlags::LOCAL_WRITE)
            .map_err(e)?;
        res.lkeys.push(smr.lkey);
        let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let tbuf = MemBuf::new(
            SGL_SIZE as usize * SGE_BYTES + usize::from(z.iomap_size) * super::iomap::IOMAP_BYTES,
        );
        let tmr = dev.reg_mr(pd, &tbuf, 0, tbuf.len(), remote).map_err(e)?;
        res.lkeys.push(tmr.lkey);
        let rbuf = MemBuf::new(rbuf_size as usize);
        let rmr = dev.reg_mr(pd, &rbuf, 0, rbuf.len(), remote).map_err(e)?;
        res.lkeys.push(rmr.lkey);
        let res = std::mem::replace(
            &mut res,
            Resources {
                dev: dev.clone(),
                pd: None,
                comp: None,
                cq: None,
                lkeys: Vec::new(),
            },
        );
        let c = Conn {
            res,
            qpn,
            cq,
            comp,
            sq_size: sq as u16,
            rq_size: rq as u16,
            rbuf,
            rmr,
            rbuf_size,
            sbuf,
            smr,
            sbuf_size,
            tbuf,
            tmr,
            swap_sgl: false,
            sseq_no: 0,
            sseq_comp: 0,
            sqe_avail: sq - u32::from(CTRL_SLOTS),
            sbuf_bytes_avail: sbuf_size,
            shead: 0,
            target_sge: 0,
            ctrl_seqno: 0,
            ctrl_max_seqno: CTRL_SLOTS,
            remote_sgl: RsSge::default(),
            remote_sge: 1,
            rmsg: std::collections::VecDeque::new(),
            rbuf_offset: 0,
            rbuf_bytes_avail: rbuf_size >> 1,
            rbuf_free_offset: rbuf_size >> 1,
            rseq_no: 0,
            rseq_comp: (rq >> 1) as u16,
            cq_armed: false,
            iomap_size: z.iomap_size,
            remote_iomap: RsSge::default(),
            iomaps: Vec::new(),
        };
        for _ in 0..rq {
            c.post_recv()?;
        }
        Ok(c)
    })();
    if built.is_err() {
        let _ = cm.cm.destroy_qp(id);
    }
    built
}

/// The next event of channel `ch` (waiting), as an errno when it is a failure:
/// librdmacm's mapping (ECONNREFUSED for a reject, the negated status otherwise).
pub(crate) fn next_event(cm: &Cm, ch: CmChannelId) -> Result<CmEvent, c_int> {
    classify(cm.cm.get_cm_event(ch, None).map_err(|e| e.errno())?)
}

/// An event, or the errno it stands for when it is a failure (see [`next_event`]).
fn classify(ev: CmEvent) -> Result<CmEvent, c_int> {
    match ev.event {
        CmEventType::Rejected => Err(libc::ECONNREFUSED),
        CmEventType::AddrError | CmEventType::RouteError => Err(if ev.status < 0 {
            -ev.status
        } else {
            libc::EHOSTUNREACH
        }),
        CmEventType::Unreachable | CmEventType::ConnectError => Err(if ev.status < 0 {
            -ev.status
        } else {
            libc::ECONNREFUSED
        }),
        _ => Ok(ev),
    }
}

/// Starts the active side (rsocket.c `rs_do_connect`): address resolution; the
/// CM's events then drive [`connect_step`]. The rsocket is `OPENING` meanwhile.
pub(crate) fn connect_start(cm: &Cm, s: &mut Sock, dst: SocketAddr) -> Result<(), c_int> {
    cm.cm
        .resolve_addr(s.id, None, dst, RESOLVE)
        .map_err(|e| e.errno())?;
    s.state = st::OPENING;
    Ok(())
}

/// Takes one CM event of a connecting rsocket: the route is resolved after the
/// address; then the endpoint is made and the REQ sent with our connection data;
/// ESTABLISHED brings the peer's, and the rsocket is connected. A failure leaves
/// the endpoint destroyed and returns its errno.
pub(crate) fn connect_step(cm: &Cm, s: &mut Sock, ev: Result<CmEvent, c_int>) -> Result<(), c_int> {
    let e = |e: verbs_api::Error| e.errno();
    let r = ev.and_then(|ev| match ev.event {
        CmEventType::AddrResolved => cm.cm.resolve_route(s.id, RESOLVE).map_err(e),
        CmEventType::RouteResolved => {
            let c = create_ep(cm, s.id, &s.sizes)?;
            let p = conn_param(&c);
            s.pending = Some(c);
            cm.cm.connect(s.id, &p).map_err(e)
        }
        CmEventType::Established => {
            let d = ConnData::parse(ev.param.private_data()).ok_or(libc::EPROTO)?;
            let mut c = s.pending.take().ok_or(libc::EPROTO)?;
            save_conn_data(&mut c, &d);
            s.conn = Some(c);
            s.state = st::RDWR;
            Ok(())
        }
        _ => Ok(()),
    });
    if r.is_err() && s.pending.take().is_some() {
        let _ = cm.cm.destroy_qp(s.id);
    }
    r
}

/// The whole active side, waiting for each event (a blocking `rconnect`).
pub(crate) fn connect(
    cm: &Cm,
    ch: CmChannelId,
    s: &mut Sock,
    dst: SocketAddr,
) -> Result<(), c_int> {
    connect_start(cm, s, dst)?;
    while s.state & st::CONNECTED == 0 {
        let ev = next_event(cm, ch);
        connect_step(cm, s, ev)?;
    }
    Ok(())
}

/// Drives a non-blocking connection with the events there now: `Ok(true)` once
/// connected, `Ok(false)` while it goes on.
pub(crate) fn connect_poll(cm: &Cm, ch: CmChannelId, s: &mut Sock) -> Result<bool, c_int> {
    while s.state == st::OPENING {
        let ev = match cm.cm.get_cm_event(ch, Some(Duration::ZERO)) {
            Err(verbs_api::Error::TimedOut) => return Ok(false),
            Err(x) => Err(x.errno()),
            Ok(ev) => classify(ev),
        };
        connect_step(cm, s, ev)?;
    }
    Ok(s.state & st::CONNECTED != 0)
}

/// Starts the passive side of connection request `req` (rsocket.c `rs_accept`): the
/// new id moves to its own channel `ch`, gets its endpoint and answers with our
/// connection data; [`accept_poll`] then waits for ESTABLISHED. A request without
/// rsockets' connection data is rejected.
pub(crate) fn accept_start(
    cm: &Cm,
    ch: CmChannelId,
    req: &CmEvent,
    s: &mut Sock,
) -> Result<(), c_int> {
    let e = |e: verbs_api::Error| e.errno();
    let Some(d) = ConnData::parse(req.param.private_data()) else {
        let _ = cm.cm.reject(s.id, &[]);
        return Err(libc::ECONNREFUSED);
    };
    cm.cm.migrate_id(s.id, ch).map_err(e)?;
    let mut c = match create_ep(cm, s.id, &s.sizes) {
        Ok(c) => c,
        Err(errno) => {
            let _ = cm.cm.reject(s.id, &[]);
            return Err(errno);
        }
    };
    save_conn_data(&mut c, &d);
    let p = conn_param(&c);
    if let Err(errno) = cm.cm.accept(s.id, &p).map_err(e) {
        let _ = cm.cm.destroy_qp(s.id);
        return Err(errno);
    }
    s.pending = Some(c);
    Ok(())
}

/// Takes the events there now on the channel `ch` of a connection [`accept_start`]
/// answered: `Ok(true)` once it is established (the rsocket connected), `Ok(false)`
/// while the peer's RTU has not come; a failure, or a disconnect first, destroys the
/// endpoint and returns its errno.
pub(crate) fn accept_poll(cm: &Cm, ch: CmChannelId, s: &mut Sock) -> Result<bool, c_int> {
    loop {
        let ev = match cm.cm.get_cm_event(ch, Some(Duration::ZERO)) {
            Err(verbs_api::Error::TimedOut) => return Ok(false),
            Err(x) => Err(x.errno()),
            Ok(ev) => classify(ev),
        };
        let r = ev.and_then(|ev| match ev.event {
            CmEventType::Established => Ok(true),
            CmEventType::Disconnected | CmEventType::TimewaitExit => Err(libc::ECONNRESET),
            _ => Ok(false),
        });
        match r {
            Ok(true) => {
                s.conn = s.pending.take();
                s.state = st::RDWR;
                return Ok(true);
            }
            Ok(false) => {}
            Err(errno) => {
                if s.pending.take().is_some() {
                    let _ = cm.cm.destroy_qp(s.id);
                }
                return Err(errno);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_data_round_trip_and_layout() {
        let d = ConnData {
            flags: FLAG_IOMAP,
            credits: 384,
            iomap_scale: 0,
            target_sgl: RsSge {
                addr: 0x1122_3344_5566_7788,
                key: 0xAABB_CCDD,
                length: 2,
            },
            data_buf: RsSge {
                addr: 0x10_0000,
                key: 7,
                length: 65536,
            },
        };
        let b = d.emit();
        assert_eq!(&b[..4], &[1, FLAG_IOMAP, 0x01, 0x80]);
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(&b[16..20], &0xAABB_CCDDu32.to_be_bytes());
        assert_eq!(&b[20..24], &2u32.to_be_bytes());
        assert_eq!(ConnData::parse(&b), Some(d));
        let mut v2 = b;
        v2[0] = 2;
        assert_eq!(ConnData::parse(&v2), None);
        assert_eq!(ConnData::parse(&b[..39]), None);
    }

    #[test]
    fn iomap_sizes_scale_as_librdmacm() {
        for v in [0u16, 1, 64, 128] {
            assert_eq!(scale_to_value(value_to_scale(v)), u32::from(v));
        }
        assert_eq!(value_to_scale(512), 0x82);
        assert_eq!(scale_to_value(0x82), 512);
        // What does not fit a unit of 256 rounds down.
        assert_eq!(scale_to_value(value_to_scale(300)), 256);
    }
}
