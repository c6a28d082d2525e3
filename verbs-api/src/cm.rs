//! The RDMA connection manager: librdmacm's `rdma_cm` API (manual chapter 4) and its
//! convenience verbs (manual chapter 5), so that a program connects by IP address and
//! port instead of exchanging QP numbers by hand.
//!
//! [`ConnectionManager`] is object-safe and names objects by number, as [`Device`]
//! does: an event channel is a [`CmChannelId`] (`struct rdma_event_channel`), a CM
//! identifier a [`CmId`] (`struct rdma_cm_id`). Every backend implements it: the
//! emulator's CM speaks the IB CM protocol (IBTA chapter 12) on QP1 inside RoCEv2, the
//! hardware backend calls librdmacm.
//!
//! The flow is librdmacm's (manual 4.1, seed tutorial):
//!
//! - active side: [`create_event_channel`](ConnectionManager::create_event_channel),
//!   [`create_id`](ConnectionManager::create_id), [`resolve_addr`](ConnectionManager::resolve_addr)
//!   (event `ADDR_RESOLVED`), [`resolve_route`](ConnectionManager::resolve_route)
//!   (`ROUTE_RESOLVED`), [`create_qp`](ConnectionManager::create_qp),
//!   [`connect`](ConnectionManager::connect) (`ESTABLISHED`, or `REJECTED` /
//!   `UNREACHABLE` / `CONNECT_ERROR`), then [`disconnect`](ConnectionManager::disconnect)
//!   (`DISCONNECTED`, later `TIMEWAIT_EXIT`);
//! - passive side: [`bind_addr`](ConnectionManager::bind_addr),
//!   [`listen`](ConnectionManager::listen), then per connection a `CONNECT_REQUEST` event
//!   that carries a new id, [`create_qp`](ConnectionManager::create_qp) on it and
//!   [`accept`](ConnectionManager::accept) (`ESTABLISHED`) or
//!   [`reject`](ConnectionManager::reject).
//!
//! The CM drives the QP of an id through INIT, RTR and RTS itself (manual 4.2.25
//! `rdma_create_qp`: "the QP will be transitioned ... by the rdma_cm"). Events are
//! owned values: there is no `rdma_ack_cm_event` to forget.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{
    AccessFlags, AhAttr, Device, Error, Gid, MemBuf, MrInfo, QpInitAttr, QpType, RecvWr, Result,
    SendFlags, SendWr, Sge, WorkCompletion,
};

verbs_enum! {
    /// `enum rdma_port_space` (manual 4.2.2 rdma_create_id): the port space of an id
    /// decides the QP type it connects and the service IDs it uses.
    pub enum PortSpace ("rdma_port_space") {
        /// `RDMA_PS_IPOIB`.
        Ipoib = 0x0002,
        /// `RDMA_PS_TCP`: reliable connected QPs (RC), connection-oriented like TCP.
        Tcp = 0x0106,
        /// `RDMA_PS_UDP`: unreliable datagram QPs (UD), connectionless like UDP.
        Udp = 0x0111,
        /// `RDMA_PS_IB`: any IB QP type.
        Ib = 0x013F,
    }
}

impl PortSpace {
    /// The QP type an id of this port space uses (`RDMA_PS_TCP` -> RC, `RDMA_PS_UDP`
    /// -> UD); `None` for the port spaces the caller picks a type for.
    pub fn qp_type(self) -> Option<QpType> {
        match self {
            PortSpace::Tcp => Some(QpType::Rc),
            PortSpace::Udp | PortSpace::Ipoib => Some(QpType::Ud),
            PortSpace::Ib => None,
        }
    }

    /// The IB service ID that rdma_cm uses for `port` of this port space
    /// (`RDMA_IB_IP_PS_*`: `0x0000_0000_01PP_PPpp`, the port space in bits 16-31 and the
    /// port in bits 0-15; IBTA Annex A11 "RDMA IP CM Service").
    pub fn service_id(self, port: u16) -> u64 {
        (u64::from(self.as_u32()) << 16) | u64::from(port)
    }
}

verbs_enum! {
    /// `enum rdma_cm_event_type` (manual 4.3.1 rdma_get_cm_event).
    pub enum CmEventType ("rdma_cm_event_type") {
        /// `RDMA_CM_EVENT_ADDR_RESOLVED`: address resolution completed.
        AddrResolved = 0,
        /// `RDMA_CM_EVENT_ADDR_ERROR`: address resolution failed.
        AddrError = 1,
        /// `RDMA_CM_EVENT_ROUTE_RESOLVED`: route resolution completed.
        RouteResolved = 2,
        /// `RDMA_CM_EVENT_ROUTE_ERROR`: route resolution failed.
        RouteError = 3,
        /// `RDMA_CM_EVENT_CONNECT_REQUEST`: a new connection request on a listening id.
        ConnectRequest = 4,
        /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: the peer answered a connect of an id without
        /// a QP; [`ConnectionManager::establish`] completes it.
        ConnectResponse = 5,
        /// `RDMA_CM_EVENT_CONNECT_ERROR`: an error occurred while connecting.
        ConnectError = 6,
        /// `RDMA_CM_EVENT_UNREACHABLE`: the peer did not answer (or its answer could not
        /// be used).
        Unreachable = 7,
        /// `RDMA_CM_EVENT_REJECTED`: the peer rejected the connection; `status` holds
        /// the reject reason (IBTA 12.6.7 table 103).
        Rejected = 8,
        /// `RDMA_CM_EVENT_ESTABLISHED`: the connection is up.
        Established = 9,
        /// `RDMA_CM_EVENT_DISCONNECTED`: the connection was disconnected.
        Disconnected = 10,
        /// `RDMA_CM_EVENT_DEVICE_REMOVAL`: the id's device was removed.
        DeviceRemoval = 11,
        /// `RDMA_CM_EVENT_MULTICAST_JOIN`: a multicast join completed.
        MulticastJoin = 12,
        /// `RDMA_CM_EVENT_MULTICAST_ERROR`: a multicast join failed.
        MulticastError = 13,
        /// `RDMA_CM_EVENT_ADDR_CHANGE`: the address of the id's device changed.
        AddrChange = 14,
        /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`: the QP of a disconnected id left the time-wait
        /// state and may be reused.
        TimewaitExit = 15,
    }
}

impl CmEventType {
    /// Exactly `rdma_event_str` (manual 4.3.3).
    pub fn as_str(self) -> &'static str {
        match self {
            CmEventType::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            CmEventType::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            CmEventType::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            CmEventType::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            CmEventType::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            CmEventType::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            CmEventType::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            CmEventType::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            CmEventType::Rejected => "RDMA_CM_EVENT_REJECTED",
            CmEventType::Established => "RDMA_CM_EVENT_ESTABLISHED",
            CmEventType::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            CmEventType::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            CmEventType::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            CmEventType::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            CmEventType::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            CmEventType::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

impl std::fmt::Display for CmEventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The IB CM reject reason rdma_cm uses for `rdma_reject` (IBTA 12.6.7 table 103,
/// "Consumer Reject"): the `status` of the peer's `REJECTED` event.
pub const REJECT_CONSUMER: i32 = 28;

/// The length of rdma_cm's header at the front of the private data of a REQ or SIDR
/// REQ toward an IP address (`struct cma_hdr`: version, IP version, port, two 16-byte
/// addresses; IBTA Annex A11 "RDMA IP CM Service"). The REP, REJ and SIDR REP carry
/// none.
pub const CMA_HDR_LEN: usize = 36;

/// The largest private data of `rdma_connect` on a connected port space (manual 4.2.9:
/// 56 bytes; the REQ's 92 bytes, IBTA 12.6.5, less rdma_cm's [`CMA_HDR_LEN`]).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 92 - CMA_HDR_LEN;
/// The largest private data of `rdma_accept` on a connected port space (the REP's 196
/// bytes, IBTA 12.6.8).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// The largest private data of `rdma_reject` on a connected port space (the REJ's 148
/// bytes, IBTA 12.6.7).
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;
/// The largest private data of `rdma_connect` on a UD port space (`RDMA_PS_UDP`,
/// `RDMA_PS_IPOIB`): the SIDR REQ's 216 bytes (IBTA 12.11.1) less rdma_cm's
/// [`CMA_HDR_LEN`].
pub const MAX_UD_CONNECT_PRIVATE_DATA: usize = 216 - CMA_HDR_LEN;
/// The largest private data of `rdma_accept` and of `rdma_reject` on a UD port space:
/// both answer with a SIDR REP (status 0, or 2 "rejected"), whose private data is 136
/// bytes (IBTA 12.11.2).
pub const MAX_UD_REPLY_PRIVATE_DATA: usize = 136;

/// The rdma_cm call private data goes with: it picks, with the port space, the IB CM
/// message that carries the data and so how much fits ([`PortSpace::max_private_data`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PrivateDataUse {
    /// `rdma_connect`: a REQ, or on a UD port space a SIDR REQ.
    Connect,
    /// `rdma_accept`: a REP, or on a UD port space a SIDR REP.
    Accept,
    /// `rdma_reject`: a REJ, or on a UD port space a SIDR REP with status 2.
    Reject,
}

impl PrivateDataUse {
    /// The three calls.
    pub const ALL: [PrivateDataUse; 3] = [
        PrivateDataUse::Connect,
        PrivateDataUse::Accept,
        PrivateDataUse::Reject,
    ];
}

impl PortSpace {
    /// Whether rdma_cm connects ids of this port space with SIDR (IBTA 12.11) rather
    /// than REQ/REP: `RDMA_PS_UDP` and `RDMA_PS_IPOIB`, the two UD port spaces (the
    /// kernel's `cma_is_ud_ps`). `RDMA_PS_IB` connects with a REQ whatever its QP type.
    pub fn is_ud(self) -> bool {
        matches!(self, PortSpace::Udp | PortSpace::Ipoib)
    }

    /// The most private data `what` may carry on an id of this port space toward an IP
    /// address (manual 4.2.9, 4.2.12, 4.2.13): the private data of the IB CM message
    /// the call sends, less rdma_cm's header on a REQ or SIDR REQ.
    ///
    /// | call    | connected (TCP, IB)            | UD (UDP, IPOIB)                     |
    /// |---------|--------------------------------|-------------------------------------|
    /// | connect | REQ 92 - 36 = 56               | SIDR REQ 216 - 36 = 180             |
    /// | accept  | REP 196                        | SIDR REP 136                        |
    /// | reject  | REJ 148                        | SIDR REP 136                        |
    ///
    /// The kernel's rdma_cm refuses more with EINVAL (librdmacm passes the data on
    /// unchecked), as [`check_private_data`] does.
    pub fn max_private_data(self, what: PrivateDataUse) -> usize {
        match (what, self.is_ud()) {
            (PrivateDataUse::Connect, false) => MAX_CONNECT_PRIVATE_DATA,
            (PrivateDataUse::Connect, true) => MAX_UD_CONNECT_PRIVATE_DATA,
            (PrivateDataUse::Accept, false) => MAX_ACCEPT_PRIVATE_DATA,
            (PrivateDataUse::Reject, false) => MAX_REJECT_PRIVATE_DATA,
            (PrivateDataUse::Accept | PrivateDataUse::Reject, true) => MAX_UD_REPLY_PRIVATE_DATA,
        }
    }
}

/// EINVAL when `len` bytes of private data are more than `what` may carry on an id of
/// port space `ps` ([`PortSpace::max_private_data`]), as the kernel's rdma_cm answers
/// `rdma_connect`, `rdma_accept` and `rdma_reject`.
pub fn check_private_data(ps: PortSpace, what: PrivateDataUse, len: usize) -> Result<()> {
    if len > ps.max_private_data(what) {
        return Err(Error::InvalidArgument("private data too long"));
    }
    Ok(())
}

/// `struct rdma_conn_param` (manual 4.2.9 rdma_connect, 4.2.12 rdma_accept).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data handed to the peer (at most [`PortSpace::max_private_data`] of
    /// the id's port space and the call: 56 bytes on a connect of `RDMA_PS_TCP`).
    pub private_data: Vec<u8>,
    /// RDMA READs and atomics the local side accepts as responder (the QP's
    /// `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// RDMA READs and atomics the local side has outstanding as requester (the QP's
    /// `max_rd_atomic`).
    pub initiator_depth: u8,
    /// Whether the local side does end-to-end flow control.
    pub flow_control: bool,
    /// Retries after a transport timeout (0-7; connect only).
    pub retry_count: u8,
    /// Retries after an RNR NAK (0-7, 7 = forever).
    pub rnr_retry_count: u8,
    /// Whether the QP takes its receives from an SRQ.
    pub srq: bool,
    /// The QP number, for an id without a QP of its own.
    pub qp_num: u32,
}

impl Default for ConnParam {
    /// One outstanding READ each way, 7 retries, RNR retry forever (as the seed
    /// tutorial's programs set them).
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

/// `struct rdma_ud_param` (manual 4.3.1): what a UD (`RDMA_PS_UDP`) connection
/// resolves to.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct UdParam {
    /// Private data from the peer.
    pub private_data: Vec<u8>,
    /// The address vector that reaches the peer (for `create_ah`).
    pub ah_attr: AhAttr,
    /// The peer's QP number.
    pub qp_num: u32,
    /// The peer's Q_Key.
    pub qkey: u32,
}

/// The data an event carries (the `param` union of `struct rdma_cm_event`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum CmEventParam {
    /// No data.
    #[default]
    None,
    /// Connection parameters (connected port spaces): the peer's private data and
    /// resources.
    Conn(ConnParam),
    /// UD parameters (`RDMA_PS_UDP`).
    Ud(UdParam),
}

impl CmEventParam {
    /// The private data the event carries (empty if none).
    pub fn private_data(&self) -> &[u8] {
        match self {
            CmEventParam::None => &[],
            CmEventParam::Conn(c) => &c.private_data,
            CmEventParam::Ud(u) => &u.private_data,
        }
    }
}

/// An event channel (`struct rdma_event_channel`, manual 4.2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmChannelId(pub u32);

/// A CM identifier (`struct rdma_cm_id`, manual 4.2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmId(pub u32);

/// `struct rdma_cm_event` (manual 4.3.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmEvent {
    /// The id the event is about; for `CONNECT_REQUEST` the new id of the connection.
    pub id: CmId,
    /// For `CONNECT_REQUEST`, the listening id the request came to.
    pub listen_id: Option<CmId>,
    /// What happened.
    pub event: CmEventType,
    /// 0, a negative errno (`-ETIMEDOUT` for `UNREACHABLE` after the peer did not
    /// answer), or for `REJECTED` the reject reason.
    pub status: i32,
    /// The data of the event.
    pub param: CmEventParam,
}

/// What is known about an id (the public fields of `struct rdma_cm_id` and
/// `rdma_get_local_addr`/`rdma_get_peer_addr`, manual 4.2.19-4.2.20).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmIdInfo {
    /// The port space.
    pub ps: PortSpace,
    /// The name of the device the id is bound to, once it is.
    pub device: Option<String>,
    /// The port of that device (1 is the first).
    pub port_num: u8,
    /// The id's QP, once created.
    pub qp_num: Option<u32>,
    /// The local address (after bind, resolve or a connection request).
    pub local: Option<SocketAddr>,
    /// The peer's address.
    pub peer: Option<SocketAddr>,
    /// The local GID (RoCE: the IPv4-mapped local address).
    pub sgid: Gid,
    /// The peer's GID, once the route is resolved.
    pub dgid: Gid,
}

/// librdmacm's connection manager (manual chapter 4). See the [module docs](self).
///
/// Errors are those of librdmacm: EINVAL for a call in the wrong state of the id,
/// EADDRINUSE for a port already bound, EADDRNOTAVAIL for a local address no device
/// owns, ENODEV when no device is bound, EOPNOTSUPP for what the backend lacks.
pub trait ConnectionManager: Send + Sync {
    /// `rdma_create_event_channel` (manual 4.2.1).
    fn create_event_channel(&self) -> Result<CmChannelId>;
    /// `rdma_destroy_event_channel`: EBUSY while ids report to it.
    fn destroy_event_channel(&self, ch: CmChannelId) -> Result<()>;
    /// The channel's file descriptor: readable while an event is pending, for
    /// poll/epoll (`rdma_event_channel.fd`).
    fn event_channel_fd(&self, ch: CmChannelId) -> Result<i32>;
    /// `rdma_get_cm_event` (manual 4.3.1): the next event of the channel, waiting up
    /// to `timeout` (`None`: forever). ETIMEDOUT when the time runs out.
    fn get_cm_event(&self, ch: CmChannelId, timeout: Option<Duration>) -> Result<CmEvent>;

    /// `rdma_create_id` (manual 4.2.2): an id reporting to `ch`.
    fn create_id(&self, ch: CmChannelId, ps: PortSpace) -> Result<CmId>;
    /// `rdma_migrate_id` (man page `rdma_migrate_id(3)`): the id, and the
    /// connection requests of a listening id, report to `ch` from now on; its events
    /// not yet taken move there too. EOPNOTSUPP where the backend lacks it.
    fn migrate_id(&self, id: CmId, ch: CmChannelId) -> Result<()> {
        let _ = (id, ch);
        Err(Error::Unsupported("rdma_migrate_id"))
    }
    /// `rdma_destroy_id` (manual 4.2.3): EBUSY while the id has a QP.
    fn destroy_id(&self, id: CmId) -> Result<()>;

    /// `rdma_bind_addr` (manual 4.2.5): binds the id to a local address (IP 0.0.0.0:
    /// every device) and port (0 picks one).
    fn bind_addr(&self, id: CmId, addr: SocketAddr) -> Result<()>;
    /// `rdma_resolve_addr` (manual 4.2.6): finds the device that reaches `dst` (from
    /// `src` if given); `ADDR_RESOLVED` or `ADDR_ERROR` follows within `timeout`.
    fn resolve_addr(
        &self,
        id: CmId,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()>;
    /// `rdma_resolve_route` (manual 4.2.7): on RoCE the destination IP address becomes
    /// its GID; `ROUTE_RESOLVED` or `ROUTE_ERROR` follows.
    fn resolve_route(&self, id: CmId, timeout: Duration) -> Result<()>;
    /// `rdma_listen` (manual 4.2.8): connection requests to the bound address become
    /// `CONNECT_REQUEST` events; at most `backlog` wait for an answer (0: a default).
    fn listen(&self, id: CmId, backlog: u32) -> Result<()>;
    /// `rdma_get_request` (manual 4.2.11): waits for the next `CONNECT_REQUEST` of the
    /// listening id (other events stay queued) and returns it; `event.id` is the new id.
    fn get_request(&self, listen: CmId, timeout: Option<Duration>) -> Result<CmEvent>;

    /// `rdma_create_qp` (manual 4.2.25): creates the id's QP on its device with
    /// `init` (the QP type must be the port space's) and brings it to INIT. Returns
    /// the QP number.
    fn create_qp(&self, id: CmId, init: &QpInitAttr) -> Result<u32>;
    /// `rdma_destroy_qp` (manual 4.2.26).
    fn destroy_qp(&self, id: CmId) -> Result<()>;

    /// `rdma_connect` (manual 4.2.9): sends the connection request (UD: the service
    /// ID resolution request). More private data than
    /// [`PortSpace::max_private_data`] is EINVAL and leaves the id as it was.
    fn connect(&self, id: CmId, param: &ConnParam) -> Result<()>;
    /// `rdma_establish` (manual 4.2.10): completes a connect after `CONNECT_RESPONSE`
    /// (ids without a QP).
    fn establish(&self, id: CmId) -> Result<()>;
    /// `rdma_accept` (manual 4.2.12): accepts a `CONNECT_REQUEST`; the id's QP goes to
    /// RTR and RTS. More private data than [`PortSpace::max_private_data`] is EINVAL,
    /// and (as the kernel's rdma_cm) the QP goes to ERROR and the request is rejected.
    fn accept(&self, id: CmId, param: &ConnParam) -> Result<()>;
    /// `rdma_reject` (manual 4.2.13): rejects a `CONNECT_REQUEST` with private data
    /// (more than [`PortSpace::max_private_data`]: EINVAL, nothing sent). A UD id's
    /// peer gets `UNREACHABLE` with SIDR status 2, a connected id's `REJECTED`.
    fn reject(&self, id: CmId, private_data: &[u8]) -> Result<()>;
    /// `rdma_disconnect` (manual 4.2.15): the QP goes to the error state (its WRs are
    /// flushed) and the peer is told; `DISCONNECTED` follows on both sides.
    fn disconnect(&self, id: CmId) -> Result<()>;

    /// `rdma_join_multicast` (manual 4.2.27).
    fn join_multicast(&self, id: CmId, addr: SocketAddr) -> Result<()>;
    /// `rdma_leave_multicast` (manual 4.2.28).
    fn leave_multicast(&self, id: CmId, addr: SocketAddr) -> Result<()>;

    /// What is known about the id.
    fn id_info(&self, id: CmId) -> Result<CmIdInfo>;
    /// The device the id is bound to (`id->verbs`): ENODEV before it is bound.
    fn device(&self, id: CmId) -> Result<Arc<dyn Device>>;
}

/// Waits for the next event of `ch` and checks that it is `expected` about `id`
/// (any id when `None`); anything else is EPROTO with the event's name. The usual
/// step of a program that drives one connection at a time.
pub fn expect_cm_event(
    cm: &dyn ConnectionManager,
    ch: CmChannelId,
    id: Option<CmId>,
    expected: CmEventType,
    timeout: Option<Duration>,
) -> Result<CmEvent> {
    let ev = cm.get_cm_event(ch, timeout)?;
    if ev.event != expected || id.is_some_and(|i| i != ev.id) {
        return Err(Error::Os {
            errno: 71, // EPROTO
            context: ev.event.as_str(),
        });
    }
    Ok(ev)
}

// ---- the convenience verbs of manual chapter 5 (rdma_verbs.h) ----

fn qp_of(cm: &dyn ConnectionManager, id: CmId) -> Result<(Arc<dyn Device>, u32)> {
    let qpn = cm
        .id_info(id)?
        .qp_num
        .ok_or(Error::InvalidArgument("the id has no QP"))?;
    Ok((cm.device(id)?, qpn))
}

fn reg(
    cm: &dyn ConnectionManager,
    id: CmId,
    buf: &MemBuf,
    offset: usize,
    length: usize,
    access: AccessFlags,
) -> Result<MrInfo> {
    let (dev, qpn) = qp_of(cm, id)?;
    let pd = dev.query_qp(qpn)?.1.pd;
    dev.reg_mr(pd, buf, offset, length, access)
}

/// `rdma_reg_msgs` (manual 5.1.1): registers memory for sends and receives in the PD
/// of the id's QP (local write).
pub fn reg_msgs(
    cm: &dyn ConnectionManager,
    id: CmId,
    buf: &MemBuf,
    offset: usize,
    length: usize,
) -> Result<MrInfo> {
    reg(cm, id, buf, offset, length, AccessFlags::LOCAL_WRITE)
}

/// `rdma_reg_read` (manual 5.1.2): registers memory the peer may RDMA-read.
pub fn reg_read(
    cm: &dyn ConnectionManager,
    id: CmId,
    buf: &MemBuf,
    offset: usize,
    length: usize,
) -> Result<MrInfo> {
    reg(
        cm,
        id,
        buf,
        offset,
        length,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
    )
}

/// `rdma_reg_write` (manual 5.1.3): registers memory the peer may RDMA-write.
pub fn reg_write(
    cm: &dyn ConnectionManager,
    id: CmId,
    buf: &MemBuf,
    offset: usize,
    length: usize,
) -> Result<MrInfo> {
    reg(
        cm,
        id,
        buf,
        offset,
        length,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )
}

/// `rdma_dereg_mr` (manual 5.1.4).
pub fn dereg_mr(cm: &dyn ConnectionManager, id: CmId, mr: &MrInfo) -> Result<()> {
    cm.device(id)?.dereg_mr(mr.lkey)
}

fn post(cm: &dyn ConnectionManager, id: CmId, wr: SendWr) -> Result<()> {
    let (dev, qpn) = qp_of(cm, id)?;
    dev.post_send(qpn, &[wr]).map_err(|e| e.error)
}

fn sge(addr: u64, length: u32, mr: &MrInfo) -> Vec<Sge> {
    vec![Sge {
        addr,
        length,
        lkey: mr.lkey,
    }]
}

/// `rdma_post_recv` (manual 5.2.5): one receive of `length` bytes at `addr` of `mr`.
pub fn post_recv(
    cm: &dyn ConnectionManager,
    id: CmId,
    wr_id: u64,
    addr: u64,
    length: u32,
    mr: &MrInfo,
) -> Result<()> {
    let (dev, qpn) = qp_of(cm, id)?;
    dev.post_recv(qpn, &[RecvWr::new(wr_id, sge(addr, length, mr))])
        .map_err(|e| e.error)
}

/// `rdma_post_send` (manual 5.2.6): a SEND of `length` bytes at `addr` of `mr`
/// (`mr` may be `None` with `SendFlags::INLINE`).
pub fn post_send(
    cm: &dyn ConnectionManager,
    id: CmId,
    wr_id: u64,
    addr: u64,
    length: u32,
    mr: Option<&MrInfo>,
    flags: SendFlags,
) -> Result<()> {
    let lkey = mr.map_or(0, |m| m.lkey);
    let sg = vec![Sge { addr, length, lkey }];
    post(cm, id, SendWr::send(wr_id, sg).with_flags(flags))
}

/// `rdma_post_read` (manual 5.2.7): reads `length` bytes of the peer's
/// `remote_addr`/`rkey` into `addr` of `mr`.
#[allow(clippy::too_many_arguments)]
pub fn post_read(
    cm: &dyn ConnectionManager,
    id: CmId,
    wr_id: u64,
    addr: u64,
    length: u32,
    mr: &MrInfo,
    flags: SendFlags,
    remote_addr: u64,
    rkey: u32,
) -> Result<()> {
    let wr = SendWr::rdma_read(wr_id, sge(addr, length, mr), remote_addr, rkey);
    post(cm, id, wr.with_flags(flags))
}

/// `rdma_post_write` (manual 5.2.8): writes `length` bytes at `addr` of `mr` to the
/// peer's `remote_addr`/`rkey`.
#[allow(clippy::too_many_arguments)]
pub fn post_write(
    cm: &dyn ConnectionManager,
    id: CmId,
    wr_id: u64,
    addr: u64,
    length: u32,
    mr: &MrInfo,
    flags: SendFlags,
    remote_addr: u64,
    rkey: u32,
) -> Result<()> {
    let wr = SendWr::rdma_write(wr_id, sge(addr, length, mr), remote_addr, rkey);
    post(cm, id, wr.with_flags(flags))
}

fn get_comp(
    cm: &dyn ConnectionManager,
    id: CmId,
    send: bool,
    timeout: Option<Duration>,
) -> Result<WorkCompletion> {
    let (dev, qpn) = qp_of(cm, id)?;
    let init = dev.query_qp(qpn)?.1;
    let cq = if send { init.send_cq } else { init.recv_cq };
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut out = Vec::with_capacity(1);
    let mut spins = 0u32;
    loop {
        if dev.poll_cq(cq, 1, &mut out)? == 1 {
            return Ok(out.pop().expect("one completion polled"));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::TimedOut);
        }
        // Spin a little, then yield the core: the CQ may have no channel to sleep on.
        spins += 1;
        if spins > 64 {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// `rdma_get_send_comp` (manual 5.2.10): waits for the next completion on the send CQ
/// of the id's QP (up to `timeout`; ETIMEDOUT then). Polls, so the CQ needs no channel.
pub fn get_send_comp(
    cm: &dyn ConnectionManager,
    id: CmId,
    timeout: Option<Duration>,
) -> Result<WorkCompletion> {
    get_comp(cm, id, true, timeout)
}

/// `rdma_get_recv_comp` (manual 5.2.11): the same on the receive CQ.
pub fn get_recv_comp(
    cm: &dyn ConnectionManager,
    id: CmId,
    timeout: Option<Duration>,
) -> Result<WorkCompletion> {
    get_comp(cm, id, false, timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_strings_are_rdma_event_str() {
        assert_eq!(CmEventType::ALL.len(), 16);
        for (i, e) in CmEventType::ALL.iter().enumerate() {
            assert_eq!(e.as_u32(), i as u32);
            assert!(e.to_string().starts_with("RDMA_CM_EVENT_"));
        }
        assert_eq!(
            CmEventType::TimewaitExit.to_string(),
            "RDMA_CM_EVENT_TIMEWAIT_EXIT"
        );
    }

    #[test]
    fn service_ids_are_rdma_cms() {
        // RDMA_IB_IP_PS_TCP | port, as the kernel's cma_get_service_id.
        assert_eq!(PortSpace::Tcp.service_id(7471), 0x0000_0000_0106_1D2F);
        assert_eq!(PortSpace::Udp.service_id(1), 0x0000_0000_0111_0001);
        assert_eq!(PortSpace::Tcp.qp_type(), Some(QpType::Rc));
        assert_eq!(PortSpace::Udp.qp_type(), Some(QpType::Ud));
    }

    /// The table of [`PortSpace::max_private_data`], written out from the MAD sizes
    /// (IBTA 12.6.5 REQ 92, 12.6.8 REP 196, 12.6.7 REJ 148, 12.11.1 SIDR REQ 216,
    /// 12.11.2 SIDR REP 136) and the 36-byte rdma_cm header on the two REQs.
    #[test]
    fn private_data_limits_per_port_space_and_call() {
        use PrivateDataUse::*;
        let table = [
            (PortSpace::Tcp, [56, 196, 148]),
            (PortSpace::Ib, [56, 196, 148]),
            (PortSpace::Udp, [180, 136, 136]),
            (PortSpace::Ipoib, [180, 136, 136]),
        ];
        assert_eq!(table.len(), PortSpace::ALL.len());
        for (ps, max) in table {
            for (what, max) in [Connect, Accept, Reject].into_iter().zip(max) {
                assert_eq!(ps.max_private_data(what), max, "{ps:?} {what:?}");
            }
        }
        assert_eq!(PrivateDataUse::ALL, [Connect, Accept, Reject]);
        // The UD port spaces are exactly those whose ids get UD QPs.
        for ps in PortSpace::ALL {
            assert_eq!(ps.is_ud(), ps.qp_type() == Some(QpType::Ud), "{ps:?}");
        }
    }

    proptest::proptest! {
        /// Any length up to the limit passes, any above it is EINVAL.
        #[test]
        fn check_private_data_is_the_limit(
            ps in proptest::sample::select(PortSpace::ALL.to_vec()),
            what in proptest::sample::select(PrivateDataUse::ALL.to_vec()),
            len in 0usize..=300,
        ) {
            let r = check_private_data(ps, what, len);
            if len <= ps.max_private_data(what) {
                proptest::prop_assert!(r.is_ok());
            } else {
                proptest::prop_assert_eq!(r.map_err(|e| e.errno()), Err(crate::errno::EINVAL));
            }
        }
    }
}
