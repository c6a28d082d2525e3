//! The connection protocol of the emulator's CM: ids, their states, the MADs each
//! state sends and takes, and the timers (IBTA 12.6-12.9, 12.11; rdma_cm's events as
//! the kernel's `cma.c` maps them). Time is passed in: no clock is read here.
//!
//! - Active side: REQ (12.6.5), then REP (12.6.8) -> the QP to RTR and RTS, RTU
//!   (12.6.9), `ESTABLISHED`; REJ (12.6.7) -> `REJECTED` with the reason as status. A
//!   REQ unanswered for the response timeout is sent again, up to the max CM retries
//!   (IBTA 12); then the peer gets a REJ "timeout" and the id `UNREACHABLE` (-ETIMEDOUT).
//!   An MRA (12.6.6) extends the wait by its service timeout.
//! - Passive side: a REQ for a listening service ID becomes a new id and
//!   `CONNECT_REQUEST`; a REQ for nobody is answered with REJ "invalid service ID". A
//!   duplicate REQ while the consumer has not decided is answered with an MRA, a
//!   duplicate after the REP with the REP again (IBTA 12). The REP is repeated until
//!   the RTU comes; a duplicate REP at the active side is answered with the RTU again.
//! - Disconnect: DREQ (12.6.10) -> the QP to ERROR and `DISCONNECTED` at the peer,
//!   whose `disconnect` in answer sends the DREP (12.6.11; rdma_cm's order) that gives
//!   the first side its `DISCONNECTED`; after the time-wait (IBTA 12) each side gets
//!   `TIMEWAIT_EXIT`. A DREQ for an unknown connection is still answered. An unanswered
//!   DREQ is repeated, then the side disconnects anyway.
//! - UD (`RDMA_PS_UDP`): SIDR_REQ / SIDR_REP (12.11) carry the QPN and Q_Key.
//! - Address resolution asks the destination's QP1 for its CM ClassPortInfo (13.4.8.1)
//!   in place of ARP: an address no device owns gets no answer, hence `ADDR_ERROR`.
//!   Any `GetResp` counts as the answer: a kernel's MAD layer answers the `Get` its CM
//!   does not take with status "unsupported method/attribute" (see `mad::CmMsg`).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_api::{
    check_private_data, AccessFlags, CmEvent, CmEventParam, CmEventType, CmId, CmIdInfo, ConnParam,
    Endpoint, Error, Gid, Mtu, PortSpace, PortState, PrivateDataUse, QpAttr, QpAttrMask,
    QpInitAttr, QpParams, QpState, QpType, Result, UdParam,
};

mod mcast;

use emu_core::engine::COMM_BLOCK_SHIFT;
use emu_core::ports;
use emu_wire::mad::{self, reason, CmMsg, CmaHdr, Ids, Mra, Rej, Rep, Req, SidrRep, SidrReq};

use crate::agent::Agent;
use crate::EventQueue;
use crate::{CmConfig, CmStats};

/// The Q_Key rdma_cm gives `RDMA_PS_UDP` QPs (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// ETIMEDOUT.
const ETIMEDOUT: i32 = 110;
/// EADDRINUSE.
const EADDRINUSE: i32 = 98;
/// EADDRNOTAVAIL.
const EADDRNOTAVAIL: i32 = 99;
/// ENETUNREACH.
const ENETUNREACH: i32 = 101;
/// EAFNOSUPPORT.
const EAFNOSUPPORT: i32 = 97;
/// Address probes sent before `ADDR_ERROR`.
const PROBES: u8 = 4;
/// The first port `bind_addr` with port 0 picks.
const EPHEMERAL: u16 = 49152;

/// The bits of a communication ID below the device's block.
const COMM_COUNTER: u32 = (1 << COMM_BLOCK_SHIFT) - 1;

/// IBTA's time code: 4.096 us * 2^t.
pub fn cm_time(t: u8) -> Duration {
    Duration::from_nanos(4096u64 << t.min(31))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Idle,
    AddrQuery,
    AddrResolved,
    RouteResolved,
    Listen,
    ReqSent,
    MraRcvd,
    SidrReqSent,
    ReqRcvd,
    RepSent,
    RepRcvd,
    Established,
    DreqSent,
    /// A DREQ came; the DREP waits for the consumer's `disconnect` (as rdma_cm).
    DreqRcvd,
    TimeWait,
    Disconnected,
    Failed,
    /// A REP came but the id's QP could not be brought to RTR and RTS: the consumer
    /// got `CONNECT_ERROR` and the QP is in ERROR (librdmacm's `connect_error`). The
    /// connection stays as it was at the REP, unanswered, until `destroy_id` sends the
    /// REJ; a REJ or DREQ meanwhile is not reported (librdmacm swallows both).
    ConnectError,
}

#[derive(Debug)]
struct Id {
    ch: u32,
    ps: PortSpace,
    st: St,
    dev: Option<usize>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    dgid: Gid,
    qpn: Option<u32>,
    backlog: u32,
    parent: Option<u32>,
    comm: u32,
    remote_comm: u32,
    /// The transaction ID of the connection's REQ (or SIDR_REQ): the REP, RTU, MRA and
    /// REJ of the connection carry it, as the kernel's `cm.c` sends them (IBTA 13.4.6.4:
    /// a transaction keeps its TID).
    tid: u64,
    /// The TID of the DREQ the DREP will answer.
    dreq_tid: u64,
    remote_qpn: u32,
    /// The peer's Starting PSN (REQ or REP): where our sends start.
    remote_psn: u32,
    /// Our Starting PSN (REQ or REP): where our receive queue starts.
    psn: u32,
    /// From the peer's REQ: path MTU code, local ACK timeout, retry count, RNR retry.
    req_path: (u8, u8, u8, u8),
    param: ConnParam,
    last: Option<[u8; mad::MAD_LEN]>,
    retries: u8,
    deadline: Option<Instant>,
    probe_interval: Duration,
    /// The multicast groups the id joined, each with the QP attached to it (`mcast`).
    mcast: Vec<(SocketAddr, Option<u32>)>,
    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`: the local ACK timeout of the
    /// id's QP in place of the path's (kernel cma.c `rdma_set_ack_timeout`, applied
    /// by `rdma_init_qp_attr` whenever its mask has IB_QP_TIMEOUT).
    ack_timeout: Option<u8>,
    /// `rdma_set_option(RDMA_OPTION_ID_TOS)` on an active id, or the REQ's traffic
    /// class on a passive one: the GRH traffic class of the path (kernel cma.c
    /// `rdma_set_service_type`; `cm.c` takes the passive side's path from the REQ).
    tos: u8,
}

impl Id {
    fn new(ch: u32, ps: PortSpace) -> Id {
        Id {
            ch,
            ps,
            st: St::Idle,
            dev: None,
            local: None,
            peer: None,
            dgid: Gid::ZERO,
            qpn: None,
            backlog: 0,
            parent: None,
            comm: 0,
            remote_comm: 0,
            tid: 0,
            dreq_tid: 0,
            remote_qpn: 0,
            remote_psn: 0,
            psn: 0,
            req_path: (0, 0, 0, 0),
            param: ConnParam::default(),
            last: None,
            retries: 0,
            deadline: None,
            probe_interval: Duration::ZERO,
            mcast: Vec::new(),
            ack_timeout: None,
            tos: 0,
        }
    }
}

/// Everything one CM knows: its devices' agents, channels and ids.
pub(crate) struct State {
    pub(crate) agents: Vec<Agent>,
    pub(crate) channels: BTreeMap<u32, Arc<EventQueue>>,
    next_channel: u32,
    ids: BTreeMap<u32, Id>,
    next_id: u32,
    next_comm: u32,
    cfg: CmConfig,
    pub(crate) stats: CmStats,
    rx: Vec<(Gid, [u8; mad::MAD_LEN])>,
    /// Ports are claimed host-wide (`ports`), as the kernel's one port space for
    /// every process: a CM on real time. Virtual-time CMs share a fabric, not a host.
    pub(crate) host_ports: bool,
    /// The host-wide claims of the ids that bound a port.
    claims: BTreeMap<u32, ports::PortClaim>,
}

fn einval(s: &'static str) -> Error {
    Error::InvalidArgument(s)
}

/// The unspecified address of `ip`'s family.
fn unspecified_like(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

impl State {
    /// `instance` varies the first Local Communication ID between CMs on one address
    /// (see `EmuCm::open`); 0 keeps it a function of the address alone.
    pub(crate) fn new(agents: Vec<Agent>, cfg: CmConfig, instance: u32) -> State {
        let seed = agents.first().map_or(0, |a| match a.ip {
            IpAddr::V4(v4) => u32::from(v4),
            // The low four bytes, as an IPv4 address's four.
            IpAddr::V6(v6) => u32::from_be_bytes(v6.octets()[12..].try_into().unwrap_or_default()),
        }) ^ instance;
        State {
            agents,
            channels: BTreeMap::new(),
            next_channel: 1,
            ids: BTreeMap::new(),
            next_id: 1,
            next_comm: seed.rotate_left(16) ^ 0x0100_0001,
            cfg,
            stats: CmStats::default(),
            rx: Vec::new(),
            host_ports: false,
            claims: BTreeMap::new(),
        }
    }

    fn timeout(&self) -> Duration {
        cm_time(self.cfg.response_timeout)
    }

    fn id(&mut self, id: CmId) -> Result<&mut Id> {
        self.ids.get_mut(&id.0).ok_or(einval("no such CM id"))
    }

    fn emit(&self, id: u32, event: CmEventType, status: i32, param: CmEventParam) {
        let Some(i) = self.ids.get(&id) else { return };
        let listen_id = if event == CmEventType::ConnectRequest {
            i.parent.map(CmId)
        } else {
            None
        };
        if let Some(q) = self.channels.get(&i.ch) {
            q.push(CmEvent {
                id: CmId(id),
                listen_id,
                event,
                status,
                param,
            });
        }
    }

    fn send_to(&mut self, dev: usize, dst: Gid, msg: &CmMsg, tid: u64) -> [u8; mad::MAD_LEN] {
        let bytes = msg.encode(tid);
        if self.agents[dev].send(dst, &bytes).is_err() {
            self.stats.send_errors += 1;
        } else {
            self.stats.sent += 1;
            match msg {
                CmMsg::Mra(_) => self.stats.mra_sent += 1,
                CmMsg::Rej(_) => self.stats.rej_sent += 1,
                _ => {}
            }
        }
        bytes
    }

    /// Sends `msg` for id `id` and remembers it for retransmission.
    fn send_id(&mut self, id: u32, msg: &CmMsg, now: Instant) {
        let (dev, dst, tid) = {
            let i = &self.ids[&id];
            (i.dev.expect("bound"), i.dgid, i.tid)
        };
        let bytes = self.send_to(dev, dst, msg, tid);
        let t = self.timeout();
        let i = self.ids.get_mut(&id).expect("exists");
        i.last = Some(bytes);
        i.retries = 0;
        i.deadline = Some(now + t);
    }

    /// A Local Communication ID for a connection on device `dev`: its top bits are the
    /// device's block (`emu_core::nic`'s `share`: a MAD naming it reaches the process
    /// that holds the connection when processes share the device's address).
    fn alloc_comm(&mut self, dev: usize) -> u32 {
        let block = u32::from(self.agents.get(dev).map_or(0, |a| a.block));
        loop {
            self.next_comm = self.next_comm.wrapping_add(1);
            let c = (block << COMM_BLOCK_SHIFT) | (self.next_comm & COMM_COUNTER);
            if c != 0 {
                return c;
            }
        }
    }

    // ---- channels and ids ----

    pub(crate) fn create_channel(&mut self) -> Result<u32> {
        let c = self.next_channel;
        self.next_channel += 1;
        self.channels.insert(c, Arc::new(EventQueue::new()?));
        Ok(c)
    }

    pub(crate) fn destroy_channel(&mut self, ch: u32) -> Result<()> {
        if self.ids.values().any(|i| i.ch == ch) {
            return Err(Error::Busy("CM ids report to the channel"));
        }
        self.channels
            .remove(&ch)
            .map(|_| ())
            .ok_or(einval("no such event channel"))
    }

    pub(crate) fn create_id(&mut self, ch: u32, ps: PortSpace) -> Result<CmId> {
        if !self.channels.contains_key(&ch) {
            return Err(einval("no such event channel"));
        }
        if ps == PortSpace::Ib || ps == PortSpace::Ipoib {
            return Err(Error::Unsupported(
                "the emulator's CM has the TCP and UDP port spaces",
            ));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.ids.insert(id, Id::new(ch, ps));
        Ok(CmId(id))
    }

    pub(crate) fn destroy_id(&mut self, id: CmId, now: Instant) -> Result<()> {
        let i = self.id(id)?;
        if i.qpn.is_some() {
            return Err(Error::Busy("destroy the id's QP first"));
        }
        let (st, ps) = (i.st, i.ps);
        // As the kernel's cm_destroy_id: tell the peer the connection is gone (a UD
        // id has no connection: SIDR leaves nothing to tear down, IBTA 12.11).
        match st {
            St::Established if ps == PortSpace::Tcp => {
                let msg = self.dreq_of(id.0);
                self.send_id(id.0, &msg, now);
            }
            St::ReqRcvd if ps == PortSpace::Tcp => {
                let _ = self.reject(id, &[], reason::CONSUMER, now);
            }
            St::ReqSent | St::MraRcvd => self.send_rej(id.0, reason::TIMEOUT),
            // A connection the consumer never completed: REJ "consumer defined".
            St::RepSent | St::RepRcvd | St::ConnectError => self.send_rej(id.0, reason::CONSUMER),
            St::DreqRcvd => self.send_drep(id.0),
            _ => {}
        }
        let ch = self.ids.remove(&id.0).map(|i| i.ch);
        self.claims.remove(&id.0);
        // As the kernel's ucma_destroy_id (`ucma_cleanup_ctx_events`): the id's
        // events not handed out yet go with it, so no later `rdma_get_cm_event` names
        // a destroyed id; a connection request among them takes its new id along,
        // destroyed (its peer rejected) as the kernel destroys it.
        let dropped = ch
            .and_then(|ch| self.channels.get(&ch))
            .map(|q| q.remove_where(&|e| e.id == id || e.listen_id == Some(id)))
            .unwrap_or_default();
        for e in dropped {
            if e.event == CmEventType::ConnectRequest && e.id != id {
                let _ = self.destroy_id(e.id, now);
            }
        }
        Ok(())
    }

    fn device_of_ip(&self, ip: IpAddr) -> Option<usize> {
        self.agents.iter().position(|a| a.ip == ip)
    }

    fn port_taken(&self, ps: PortSpace, ip: IpAddr, port: u16) -> bool {
        self.ids.values().any(|i| {
            i.ps == ps
                && i.parent.is_none()
                && i.local.is_some_and(|l| {
                    l.port() == port
                        && (l.ip().is_unspecified() || ip.is_unspecified() || l.ip() == ip)
                })
        })
    }

    /// Claims `ip:port` host-wide for `id` (`ports`), bound to device `dev` or to every
    /// device; false when another process's id holds it. A CM that cannot write the
    /// claim (no shared folder) keeps the port to itself, as one without claims.
    fn claim_port(
        &mut self,
        id: CmId,
        ps: PortSpace,
        ip: IpAddr,
        port: u16,
        dev: Option<usize>,
    ) -> bool {
        if !self.host_ports {
            return true;
        }
        let member = dev.and_then(|d| self.agents.get(d)).map(|a| a.block);
        match ports::claim(ps as u16, ip, port, member) {
            Ok(Some(c)) => {
                self.claims.insert(id.0, c);
                true
            }
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// The first free port at or above [`EPHEMERAL`] for `id` on `ip`, claimed.
    fn ephemeral_port(
        &mut self,
        id: CmId,
        ps: PortSpace,
        ip: IpAddr,
        dev: Option<usize>,
    ) -> Option<u16> {
        (EPHEMERAL..=u16::MAX)
            .find(|p| !self.port_taken(ps, ip, *p) && self.claim_port(id, ps, ip, *p, dev))
    }

    pub(crate) fn bind(&mut self, id: CmId, addr: SocketAddr) -> Result<()> {
        let a = addr;
        let (ps, bound) = {
            let i = self.id(id)?;
            (i.ps, i.local.is_some())
        };
        if bound {
            return Err(einval("the id is bound already"));
        }
        let dev = if a.ip().is_unspecified() {
            None
        } else {
            Some(self.device_of_ip(a.ip()).ok_or(Error::Os {
                errno: EADDRNOTAVAIL,
                context: "no device owns the address",
            })?)
        };
        let port = if a.port() == 0 {
            self.ephemeral_port(id, ps, a.ip(), dev).ok_or(Error::Os {
                errno: EADDRINUSE,
                context: "no free port",
            })?
        } else if self.port_taken(ps, a.ip(), a.port())
            || !self.claim_port(id, ps, a.ip(), a.port(), dev)
        {
            return Err(Error::Os {
                errno: EADDRINUSE,
                context: "the port is bound by another id",
            });
        } else {
            a.port()
        };
        let i = self.id(id)?;
        i.local = Some(SocketAddr::new(a.ip(), port));
        i.dev = dev;
        Ok(())
    }

    pub(crate) fn resolve_addr(
        &mut self,
        id: CmId,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
        now: Instant,
    ) -> Result<()> {
        if self.agents.is_empty() {
            return Err(Error::NoDevice("the CM has no device".into()));
        }
        let (st, bound) = {
            let i = self.id(id)?;
            (i.st, i.local.is_some())
        };
        if st != St::Idle {
            return Err(einval("resolve_addr on an id that is not idle"));
        }
        if let Some(src) = src {
            if !bound {
                self.bind(id, src)?;
            }
        }
        let owner = self.device_of_ip(dst.ip());
        // A device of the destination's family (IPv4 or IPv6): the first, when no
        // device owns the destination and the id is not bound.
        let family = self
            .agents
            .iter()
            .position(|a| a.ip.is_ipv4() == dst.is_ipv4());
        let i = self.id(id)?;
        let dev = i.dev.or(owner).or(family).ok_or(Error::Os {
            errno: EAFNOSUPPORT,
            context: "no device of the destination's address family",
        })?;
        if i.local.is_none() {
            i.local = Some(SocketAddr::new(unspecified_like(dst.ip()), 0));
        }
        let ip = self.agents[dev].ip;
        let ps = self.ids[&id.0].ps;
        let port = match self.ids[&id.0].local.map(|l| l.port()) {
            Some(p) if p != 0 => p,
            _ => self
                .ephemeral_port(id, ps, ip, Some(dev))
                .unwrap_or(EPHEMERAL),
        };
        let comm = self.alloc_comm(dev);
        let i = self.id(id)?;
        i.dev = Some(dev);
        i.local = Some(SocketAddr::new(ip, port));
        i.peer = Some(dst);
        i.dgid = emu_core::nic::gid_of(dst.ip());
        i.comm = comm;
        i.tid = u64::from(comm);
        if dst.ip().is_multicast() {
            // A multicast group has no owner to probe: like an IPv4 multicast
            // neighbour (mapped, never ARPed), it resolves at once, on the device the
            // id is bound to (or the first), for rdma_join_multicast (manual 4.2.27).
            i.st = St::AddrResolved;
            self.emit(id.0, CmEventType::AddrResolved, 0, CmEventParam::None);
            return Ok(());
        }
        i.st = St::AddrQuery;
        i.probe_interval = (timeout / u32::from(PROBES)).max(Duration::from_micros(1));
        let interval = i.probe_interval;
        self.send_id(id.0, &CmMsg::ProbeGet, now);
        self.ids.get_mut(&id.0).expect("exists").deadline = Some(now + interval);
        Ok(())
    }

    pub(crate) fn resolve_route(&mut self, id: CmId) -> Result<()> {
        let i = self.id(id)?;
        if i.st != St::AddrResolved {
            return Err(einval("resolve the address first"));
        }
        let dev = i.dev.expect("resolved");
        // rdma_get_cm_event(3) ROUTE_ERROR, "resolution of a route failed": no path
        // leaves a port that is not ACTIVE (the kernel's cma.c returns the id to
        // ADDR_RESOLVED, so the consumer may try again).
        let port = self.agents[dev].dev.query_port(1);
        match port {
            Ok(p) if p.state == PortState::Active => {
                // RoCEv2: the destination's GID is its IPv4-mapped address (Annex A17).
                self.id(id)?.st = St::RouteResolved;
                self.emit(id.0, CmEventType::RouteResolved, 0, CmEventParam::None);
            }
            Ok(_) => self.emit(
                id.0,
                CmEventType::RouteError,
                -ENETUNREACH,
                CmEventParam::None,
            ),
            Err(e) => self.emit(
                id.0,
                CmEventType::RouteError,
                -e.errno(),
                CmEventParam::None,
            ),
        }
        Ok(())
    }

    pub(crate) fn listen(&mut self, id: CmId, backlog: u32) -> Result<()> {
        let bound = {
            let i = self.id(id)?;
            if i.st != St::Idle {
                return Err(einval("listen on an id that is not idle"));
            }
            i.local.is_some()
        };
        if !bound {
            self.bind(id, SocketAddr::from(([0, 0, 0, 0], 0)))?;
        }
        let i = self.id(id)?;
        i.st = St::Listen;
        i.backlog = if backlog == 0 { 128 } else { backlog };
        Ok(())
    }

    // ---- QPs ----

    fn conn_params(&self, i: &Id) -> QpParams {
        self.conn_params_of(i.dev.expect("bound"), i)
    }

    fn conn_params_of(&self, dev: usize, i: &Id) -> QpParams {
        let port = self.agents[dev].mtu;
        let mtu = Mtu::try_from(u32::from(i.req_path.0))
            .ok()
            .filter(|m| m.as_u32() < port.as_u32())
            .unwrap_or(port);
        QpParams {
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            qkey: RDMA_UDP_QKEY,
            path_mtu: mtu,
            timeout: self.cfg.ack_timeout,
            max_rd_atomic: i.param.initiator_depth,
            max_dest_rd_atomic: i.param.responder_resources,
            retry_cnt: i.param.retry_count,
            rnr_retry: i.param.rnr_retry_count,
            ..self.agents[dev].params()
        }
    }

    pub(crate) fn create_qp(&mut self, id: CmId, init: &QpInitAttr) -> Result<u32> {
        let (dev, ps, has) = {
            let i = self.id(id)?;
            (i.dev, i.ps, i.qpn.is_some())
        };
        let dev = dev.ok_or(Error::NoDevice("the id is not bound to a device".into()))?;
        if has {
            return Err(einval("the id has a QP already"));
        }
        if ps.qp_type() != Some(init.qp_type) {
            return Err(einval("the QP type is not the port space's"));
        }
        let d = self.agents[dev].dev.clone();
        let qpn = d.create_qp(init)?;
        let p = self.conn_params(&self.ids[&id.0]);
        let mut steps = vec![p.init(init.qp_type)];
        if init.qp_type == QpType::Ud {
            // rdma_cm brings a UD QP to RTS at once: it needs no peer.
            steps.push(p.rtr(QpType::Ud, &Endpoint::default()));
            steps.push(p.rts(QpType::Ud, 0));
        }
        for (attr, mask) in steps {
            if let Err(e) = d.modify_qp(qpn, &attr, mask) {
                let _ = d.destroy_qp(qpn);
                return Err(e);
            }
        }
        self.id(id)?.qpn = Some(qpn);
        Ok(qpn)
    }

    pub(crate) fn destroy_qp(&mut self, id: CmId) -> Result<()> {
        let i = self.id(id)?;
        let qpn = i.qpn.ok_or(einval("the id has no QP"))?;
        let dev = i.dev.expect("a QP means a device");
        self.agents[dev].dev.destroy_qp(qpn)?;
        self.id(id)?.qpn = None;
        Ok(())
    }

    fn qp_to_error(&self, id: u32) {
        let i = &self.ids[&id];
        if let (Some(qpn), Some(dev)) = (i.qpn, i.dev) {
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            let _ = self.agents[dev]
                .dev
                .modify_qp(qpn, &attr, QpAttrMask::STATE);
        }
    }

    /// INIT -> RTR -> RTS toward the peer the id learnt (rdma_cm's cma_modify_qp_rtr
    /// and _rts).
    fn qp_to_rts(&self, id: u32, peer_ack_timeout: Option<u8>) -> Result<()> {
        let i = &self.ids[&id];
        let Some(qpn) = i.qpn else { return Ok(()) };
        let dev = &self.agents[i.dev.expect("bound")].dev;
        let mut p = self.conn_params(i);
        if let Some(t) = peer_ack_timeout {
            p.timeout = t;
        }
        if let Some(t) = i.ack_timeout {
            p.timeout = t;
        }
        // The Starting PSN a side puts in its REQ or REP is the one its own receive
        // queue expects: the peer sends from it (kernel cm.c takes the REQ's as the
        // active side's rq_psn and the passive side's sq_psn, the REP's the other way
        // round; measured over the wire against kernel rxe, docs/interop.md).
        let remote = Endpoint {
            lid: 0,
            qpn: i.remote_qpn,
            psn: i.psn,
            gid: i.dgid,
        };
        let (mut rtr, rtr_mask) = p.rtr(QpType::Rc, &remote);
        rtr.ah_attr.grh.traffic_class = i.tos;
        for (attr, mask) in [(rtr, rtr_mask), p.rts(QpType::Rc, i.remote_psn)] {
            dev.modify_qp(qpn, &attr, mask)?;
        }
        Ok(())
    }

    /// `rdma_init_qp_attr` (manual 4.2.23): the attributes and mask that move a QP the
    /// program drives itself to `state` for this id, as the kernel gives them
    /// (`cma.c rdma_init_qp_attr`):
    ///
    /// - a UD id, or a connected id with no IB CM connection yet (before `connect`):
    ///   `cma_ib_init_qp_attr`, whatever the state: STATE | PKEY_INDEX | PORT and the
    ///   Q_Key (UD) or access flags 0 (RC);
    /// - a connected id once the REQ is sent or received: `cm.c ib_cm_init_qp_attr`.
    ///   INIT: STATE | ACCESS_FLAGS | PKEY_INDEX | PORT, access REMOTE_WRITE, with
    ///   REMOTE_READ | REMOTE_ATOMIC when the id has responder resources (any state
    ///   from REQ sent on). RTR: STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN |
    ///   MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER (min_rnr_timer 0, as `cm_init_qp_rtr_attr`
    ///   sets it). RTS: STATE | SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY |
    ///   MAX_QP_RD_ATOMIC. RTR and RTS need the peer's REQ or REP (EINVAL while the
    ///   REQ is unanswered), and every state EINVAL once the connection is torn down
    ///   or refused, or on a listening id;
    /// - RTR's rq_psn is the id's own starting PSN, and an
    ///   `RDMA_OPTION_ID_ACK_TIMEOUT` replaces the timeout whenever the mask has it.
    ///
    /// EINVAL for an id not bound to a device (the kernel's `ucma_init_qp_attr`).
    pub(crate) fn init_qp_attr(&self, id: CmId, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        type M = QpAttrMask;
        let i = self.ids.get(&id.0).ok_or(einval("no such CM id"))?;
        let dev = i.dev.ok_or(einval("the id is not bound to a device"))?;
        let p = QpParams {
            timeout: if i.parent.is_some() {
                i.req_path.1 // the passive side sends with the REQ's ACK timeout
            } else {
                self.cfg.ack_timeout
            },
            ..self.conn_params_of(dev, i)
        };
        let ib_cm = match i.st {
            St::Idle | St::AddrQuery | St::AddrResolved | St::RouteResolved => false,
            _ => i.ps != PortSpace::Udp,
        };
        let mut attr = QpAttr {
            qp_state: state,
            pkey_index: 0,
            port_num: 1,
            ..QpAttr::default()
        };
        let mut mask;
        if !ib_cm {
            mask = M::STATE | M::PKEY_INDEX | M::PORT;
            if i.ps == PortSpace::Udp {
                attr.qkey = RDMA_UDP_QKEY;
                mask |= M::QKEY;
            } else {
                attr.qp_access_flags = AccessFlags::empty();
                mask |= M::ACCESS_FLAGS;
            }
        } else {
            let answered = matches!(
                i.st,
                St::ReqRcvd | St::RepSent | St::RepRcvd | St::Established
            );
            let asked = answered || matches!(i.st, St::ReqSent | St::MraRcvd);
            match state {
                QpState::Init if asked => {
                    mask = M::STATE | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PORT;
                    attr.qp_access_flags = AccessFlags::REMOTE_WRITE;
                    if i.param.responder_resources != 0 {
                        attr.qp_access_flags |=
                            AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
                    }
                }
                QpState::Rtr if answered => {
                    let remote = Endpoint {
                        lid: 0,
                        qpn: i.remote_qpn,
                        psn: i.psn,
                        gid: i.dgid,
                    };
                    let (a, m) = p.rtr(QpType::Rc, &remote);
                    attr = QpAttr {
                        min_rnr_timer: 0,
                        ..a
                    };
                    attr.ah_attr.grh.traffic_class = i.tos;
                    mask = m;
                }
                QpState::Rts if answered => {
                    let (a, m) = p.rts(QpType::Rc, i.remote_psn);
                    attr = a;
                    mask = m;
                }
                _ => return Err(einval("the id's connection cannot move a QP to that state")),
            }
        }
        if state == QpState::Rtr {
            attr.rq_psn = i.psn;
        }
        if mask.contains(M::TIMEOUT) {
            if let Some(t) = i.ack_timeout {
                attr.timeout = t;
            }
        }
        Ok((attr, mask))
    }

    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`: EINVAL on an id whose QPs are
    /// not RC (kernel cma.c `rdma_set_ack_timeout`).
    pub(crate) fn set_ack_timeout(&mut self, id: CmId, timeout: u8) -> Result<()> {
        let i = self.id(id)?;
        if i.ps != PortSpace::Tcp {
            return Err(einval("the ACK timeout is for RC ids"));
        }
        i.ack_timeout = Some(timeout);
        Ok(())
    }

    /// `rdma_set_option(RDMA_OPTION_ID_TOS)`: the traffic class of the id's path.
    pub(crate) fn set_tos(&mut self, id: CmId, tos: u8) -> Result<()> {
        self.id(id)?.tos = tos;
        Ok(())
    }

    /// The id goes as when its event channel's file is closed (librdmacm's
    /// `rdma_destroy_event_channel` closes the fd whatever ids report to it, and the
    /// kernel's `ucma_close` destroys them, telling their peers as `destroy_id`
    /// does). A QP the CM made for it stays on the device as the program's own.
    pub(crate) fn abandon_id(&mut self, id: CmId, now: Instant) -> Result<()> {
        self.id(id)?.qpn = None;
        self.destroy_id(id, now)
    }

    // ---- connecting ----

    pub(crate) fn connect(&mut self, id: CmId, param: &ConnParam, now: Instant) -> Result<()> {
        let (st, ps, qpn) = {
            let i = self.id(id)?;
            (i.st, i.ps, i.qpn)
        };
        if st != St::RouteResolved {
            return Err(einval("connect needs a resolved route"));
        }
        check_private_data(ps, PrivateDataUse::Connect, param.private_data.len())?;
        let qpn = match (qpn, param.qp_num) {
            (Some(q), _) => q,
            (None, 0) if ps == PortSpace::Tcp => {
                return Err(einval("connect needs a QP or conn_param.qp_num"))
            }
            (None, q) => q,
        };
        let psn = {
            let i = self.id(id)?;
            // The REQ carries 3-bit retry counts and the QP takes them from there:
            // larger values mean 7 (kernel cma.c `cma_connect_ib`: min(7, ...); libfabric
            // asks for 15).
            i.param = ConnParam {
                retry_count: param.retry_count.min(7),
                rnr_retry_count: param.rnr_retry_count.min(7),
                ..param.clone()
            };
            i.psn = i.comm.wrapping_mul(0x9E37_79B9) & 0x00FF_FFFF;
            i.psn
        };
        let i = &self.ids[&id.0];
        let local = i.local.expect("resolved");
        let peer = i.peer.expect("resolved");
        let hdr = CmaHdr {
            src_port: local.port(),
            src: local.ip(),
            dst: peer.ip(),
        };
        let agent = &self.agents[i.dev.expect("resolved")];
        let service_id = ps.service_id(peer.port());
        let (msg, st) = if ps == PortSpace::Udp {
            let m = CmMsg::SidrReq(SidrReq {
                request_id: i.comm,
                pkey: 0xFFFF,
                service_id,
                private_data: hdr.wrap(&param.private_data),
            });
            (m, St::SidrReqSent)
        } else {
            let t = self.cfg.response_timeout;
            let m = CmMsg::Req(Req {
                local_comm_id: i.comm,
                service_id,
                local_ca_guid: agent.guid,
                local_qpn: qpn,
                responder_resources: param.responder_resources,
                initiator_depth: param.initiator_depth,
                remote_cm_response_timeout: t,
                transport: mad::TRANSPORT_RC,
                flow_control: param.flow_control,
                starting_psn: psn,
                local_cm_response_timeout: t,
                retry_count: param.retry_count.min(7),
                pkey: 0xFFFF,
                path_mtu: agent.mtu.as_u32() as u8,
                rnr_retry_count: param.rnr_retry_count.min(7),
                max_cm_retries: self.cfg.max_retries.min(15),
                srq: param.srq,
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: agent.gid.0,
                remote_gid: i.dgid.0,
                traffic_class: i.tos,
                hop_limit: 64,
                local_ack_timeout: self.cfg.ack_timeout,
                private_data: hdr.wrap(&param.private_data),
            });
            (m, St::ReqSent)
        };
        self.id(id)?.st = st;
        self.send_id(id.0, &msg, now);
        Ok(())
    }

    pub(crate) fn establish(&mut self, id: CmId, now: Instant) -> Result<()> {
        let i = self.id(id)?;
        if i.st != St::RepRcvd {
            return Err(einval("establish needs a CONNECT_RESPONSE"));
        }
        i.st = St::Established;
        let msg = CmMsg::Rtu(Ids {
            local_comm_id: i.comm,
            remote_comm_id: i.remote_comm,
            ..Ids::default()
        });
        self.send_id(id.0, &msg, now);
        self.id(id)?.deadline = None;
        Ok(())
    }

    pub(crate) fn accept(&mut self, id: CmId, param: &ConnParam, now: Instant) -> Result<()> {
        let (st, ps, qpn) = {
            let i = self.id(id)?;
            (i.st, i.ps, i.qpn)
        };
        if st != St::ReqRcvd {
            return Err(einval("accept needs a CONNECT_REQUEST"));
        }
        let qpn = qpn.unwrap_or(param.qp_num);
        if let Err(e) = check_private_data(ps, PrivateDataUse::Accept, param.private_data.len()) {
            // As the kernel's rdma_accept answers a REP or SIDR REP it cannot send: the
            // id's QP to ERROR and the request rejected (no private data), then the
            // error.
            self.qp_to_error(id.0);
            self.reject(id, &[], reason::CONSUMER, now)?;
            return Err(e);
        }
        if ps == PortSpace::Udp {
            let i = self.id(id)?;
            i.st = St::Established;
            let msg = CmMsg::SidrRep(SidrRep {
                request_id: i.remote_comm,
                status: 0,
                qpn,
                service_id: i.ps.service_id(i.local.map_or(0, |l| l.port())),
                qkey: RDMA_UDP_QKEY,
                private_data: param.private_data.clone(),
            });
            self.send_id(id.0, &msg, now);
            self.id(id)?.deadline = None;
            return Ok(());
        }
        if qpn == 0 {
            return Err(einval("accept needs a QP or conn_param.qp_num"));
        }
        {
            let i = self.id(id)?;
            let (_, _, retry, rnr) = i.req_path;
            i.param = ConnParam {
                // The passive side sends with the active side's retry counts.
                retry_count: retry,
                rnr_retry_count: rnr,
                ..param.clone()
            };
        }
        let ack = self.ids[&id.0].req_path.1;
        self.qp_to_rts(id.0, Some(ack))?;
        let i = &self.ids[&id.0];
        let msg = CmMsg::Rep(Rep {
            local_comm_id: i.comm,
            remote_comm_id: i.remote_comm,
            local_qkey: 0,
            local_qpn: qpn,
            starting_psn: i.psn,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            target_ack_delay: 0,
            flow_control: param.flow_control,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: param.srq,
            local_ca_guid: self.agents[i.dev.expect("bound")].guid,
            private_data: param.private_data.clone(),
        });
        self.id(id)?.st = St::RepSent;
        self.send_id(id.0, &msg, now);
        Ok(())
    }

    pub(crate) fn reject(
        &mut self,
        id: CmId,
        private_data: &[u8],
        why: u16,
        now: Instant,
    ) -> Result<()> {
        let (st, ps) = {
            let i = self.id(id)?;
            (i.st, i.ps)
        };
        if st != St::ReqRcvd {
            return Err(einval("reject needs a CONNECT_REQUEST"));
        }
        check_private_data(ps, PrivateDataUse::Reject, private_data.len())?;
        let i = &self.ids[&id.0];
        let msg = if ps == PortSpace::Udp {
            CmMsg::SidrRep(SidrRep {
                request_id: i.remote_comm,
                status: 2, // IB_SIDR_REJECT
                private_data: private_data.to_vec(),
                ..SidrRep::default()
            })
        } else {
            CmMsg::Rej(Rej {
                local_comm_id: i.comm,
                remote_comm_id: i.remote_comm,
                message_rejected: 0,
                reason: why,
                private_data: private_data.to_vec(),
            })
        };
        self.send_id(id.0, &msg, now);
        let i = self.id(id)?;
        i.st = St::Failed;
        i.deadline = None;
        Ok(())
    }

    fn dreq_of(&self, id: u32) -> CmMsg {
        let i = &self.ids[&id];
        CmMsg::Dreq(Ids {
            local_comm_id: i.comm,
            remote_comm_id: i.remote_comm,
            remote_qpn: i.remote_qpn,
            private_data: Vec::new(),
        })
    }

    pub(crate) fn disconnect(&mut self, id: CmId, now: Instant) -> Result<()> {
        match self.id(id)?.st {
            St::Established | St::RepSent | St::RepRcvd => {}
            St::DreqSent | St::TimeWait | St::Disconnected => return Ok(()),
            // The answer to DISCONNECTED: the DREP the peer waits for (rdma_cm sends it
            // here too), then the time-wait.
            St::DreqRcvd => {
                self.send_drep(id.0);
                let t = self.timeout();
                let i = self.id(id)?;
                i.st = St::TimeWait;
                i.deadline = Some(now + t);
                return Ok(());
            }
            _ => return Err(einval("the id is not connected")),
        }
        self.qp_to_error(id.0);
        if self.ids[&id.0].ps == PortSpace::Udp {
            self.id(id)?.st = St::Disconnected;
            return Ok(());
        }
        let msg = self.dreq_of(id.0);
        self.id(id)?.st = St::DreqSent;
        self.send_id(id.0, &msg, now);
        Ok(())
    }

    /// A REJ with reason `why` (`reason::TIMEOUT` when the id gave up waiting,
    /// `reason::CONSUMER` when the consumer left a connection it never completed) to
    /// the peer of id `id`. The message rejected is the REQ from a passive id that has
    /// not answered, the REP from an active id that has one, otherwise "other" (IBTA
    /// 12.6.7 table 106; the kernel's `cm_format_rej` maps the states the same way).
    fn send_rej(&mut self, id: u32, why: u16) {
        let i = &self.ids[&id];
        let (Some(dev), dst) = (i.dev, i.dgid) else {
            return;
        };
        let msg = CmMsg::Rej(Rej {
            local_comm_id: i.comm,
            remote_comm_id: i.remote_comm,
            message_rejected: match i.st {
                St::ReqRcvd => 0,
                St::RepRcvd | St::ConnectError => 1,
                _ => 2,
            },
            reason: why,
            private_data: Vec::new(),
        });
        let tid = i.tid;
        self.send_to(dev, dst, &msg, tid);
    }

    // ---- queries ----

    pub(crate) fn info(&self, id: CmId) -> Result<CmIdInfo> {
        let i = self.ids.get(&id.0).ok_or(einval("no such CM id"))?;
        let agent = i.dev.map(|d| &self.agents[d]);
        Ok(CmIdInfo {
            ps: i.ps,
            device: agent.map(|a| a.dev.name().to_owned()),
            port_num: 1,
            qp_num: i.qpn,
            local: i.local,
            peer: i.peer,
            sgid: agent.map_or(Gid::ZERO, |a| a.gid),
            dgid: i.dgid,
        })
    }

    pub(crate) fn device(&self, id: CmId) -> Result<Arc<dyn verbs_api::Device>> {
        let i = self.ids.get(&id.0).ok_or(einval("no such CM id"))?;
        i.dev
            .map(|d| self.agents[d].dev.clone())
            .ok_or(Error::NoDevice("the id is not bound to a device".into()))
    }

    /// `rdma_migrate_id`: `id` reports to channel `ch` from now on, and so do the
    /// connection requests of a listening id (new ids take their listener's channel);
    /// the events it has not taken yet move along, as the kernel's `ucma_migrate_id`
    /// moves them to the new file.
    pub(crate) fn migrate_id(&mut self, id: CmId, ch: u32) -> Result<()> {
        let new = self
            .channels
            .get(&ch)
            .ok_or(einval("no such event channel"))?
            .clone();
        let i = self.id(id)?;
        let old_ch = std::mem::replace(&mut i.ch, ch);
        if old_ch == ch {
            return Ok(());
        }
        if let Some(old) = self.channels.get(&old_ch) {
            for e in old.remove_where(&|e: &CmEvent| e.id == id || e.listen_id == Some(id)) {
                new.push(e);
            }
        }
        Ok(())
    }

    pub(crate) fn channel_of(&self, id: CmId) -> Result<u32> {
        Ok(self.ids.get(&id.0).ok_or(einval("no such CM id"))?.ch)
    }

    /// The earliest timer of any id.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.ids.values().filter_map(|i| i.deadline).min()
    }

    // ---- the wire ----

    /// Takes every MAD that arrived and fires every due timer. Returns whether
    /// anything happened.
    pub(crate) fn pump(&mut self, now: Instant) -> bool {
        let mut did = self.watch();
        for a in 0..self.agents.len() {
            if self.agents[a].dead {
                continue;
            }
            let mut rx = std::mem::take(&mut self.rx);
            match self.agents[a].poll(&mut rx) {
                Ok(bad) => self.stats.dropped += bad,
                Err(_) => self.stats.dropped += 1,
            }
            for (src, bytes) in rx.drain(..) {
                did = true;
                self.stats.received += 1;
                match CmMsg::decode(&bytes) {
                    Ok((tid, msg)) => self.handle(a, src, tid, msg, now),
                    Err(_) => self.stats.dropped += 1,
                }
            }
            self.rx = rx;
        }
        while let Some((id, at)) = self
            .ids
            .iter()
            .filter_map(|(k, i)| i.deadline.map(|d| (*k, d)))
            .min_by_key(|(_, d)| *d)
        {
            if at > now {
                break;
            }
            did = true;
            self.ids.get_mut(&id).expect("exists").deadline = None;
            self.on_timeout(id, now);
        }
        did
    }

    /// Looks at each device through its verbs (so any `Device` will do) and reports
    /// what changed under the ids bound to it (rdma_get_cm_event(3)):
    /// - a verb returns EIO: the device is gone, `DEVICE_REMOVAL` on every id on it
    ///   ("the RDMA device associated with the rdma_cm_id has been removed"); their
    ///   timers stop and the consumer is left to destroy them;
    /// - the device's address left port 1's GID table: `ADDR_CHANGE` on every id
    ///   bound to that address ("the network device associated with this ID ...
    ///   changed its HW address"); the ids live on. Reported once per removal.
    ///
    /// Runs on each pump (the CM's tick) and each CM call. Returns whether it
    /// reported anything.
    pub(crate) fn watch(&mut self) -> bool {
        let mut did = false;
        for d in 0..self.agents.len() {
            let a = &self.agents[d];
            if a.dead {
                continue;
            }
            if !a.alive() {
                self.agents[d].dead = true;
                let on: Vec<u32> = self
                    .ids
                    .iter()
                    .filter(|(_, i)| i.dev == Some(d))
                    .map(|(k, _)| *k)
                    .collect();
                for id in on {
                    let i = self.ids.get_mut(&id).expect("exists");
                    i.st = St::Failed;
                    i.deadline = None;
                    self.emit(id, CmEventType::DeviceRemoval, 0, CmEventParam::None);
                }
                did = true;
                continue;
            }
            let present = a.addr_present();
            if present != a.addr_gone {
                continue;
            }
            self.agents[d].addr_gone = !present;
            if present {
                continue;
            }
            let ip = self.agents[d].ip;
            let on: Vec<u32> = self
                .ids
                .iter()
                .filter(|(_, i)| i.dev == Some(d) && i.local.is_some_and(|l| l.ip() == ip))
                .map(|(k, _)| *k)
                .collect();
            for id in on {
                self.emit(id, CmEventType::AddrChange, 0, CmEventParam::None);
            }
            did = true;
        }
        did
    }

    fn find_comm(&self, comm: u32) -> Option<u32> {
        self.ids
            .iter()
            .find(|(_, i)| i.comm == comm && i.st != St::Idle)
            .map(|(k, _)| *k)
    }

    fn handle(&mut self, dev: usize, src: Gid, tid: u64, msg: CmMsg, now: Instant) {
        match msg {
            CmMsg::ProbeGet => {
                self.send_to(dev, src, &CmMsg::ProbeResp, tid);
            }
            CmMsg::ProbeResp => {
                let hit = self.ids.iter().find(|(_, i)| {
                    i.st == St::AddrQuery && u64::from(i.comm) == tid && i.dgid == src
                });
                if let Some((&id, _)) = hit {
                    let i = self.ids.get_mut(&id).expect("exists");
                    i.st = St::AddrResolved;
                    i.deadline = None;
                    self.emit(id, CmEventType::AddrResolved, 0, CmEventParam::None);
                } else {
                    self.stats.unmatched += 1;
                }
            }
            CmMsg::Req(r) => self.on_req(dev, src, tid, r, now),
            CmMsg::SidrReq(r) => self.on_sidr_req(dev, src, tid, r, now),
            CmMsg::Mra(m) => self.on_mra(m, now),
            CmMsg::Rej(r) => self.on_rej(r),
            CmMsg::Rep(r) => self.on_rep(r, now),
            CmMsg::Rtu(m) => match self.find_comm(m.remote_comm_id) {
                Some(id) if self.ids[&id].st == St::RepSent => {
                    let i = self.ids.get_mut(&id).expect("exists");
                    i.st = St::Established;
                    i.deadline = None;
                    self.emit(id, CmEventType::Established, 0, CmEventParam::None);
                }
                _ => self.stats.unmatched += 1,
            },
            CmMsg::Dreq(m) => self.on_dreq(dev, src, tid, m, now),
            CmMsg::Drep(m) => match self.find_comm(m.remote_comm_id) {
                Some(id) if self.ids[&id].st == St::DreqSent => self.disconnected(id, now),
                _ => self.stats.unmatched += 1,
            },
            CmMsg::SidrRep(s) => match self.find_comm(s.request_id) {
                Some(id) if self.ids[&id].st == St::SidrReqSent => {
                    let i = self.ids.get_mut(&id).expect("exists");
                    i.deadline = None;
                    if s.status == 0 {
                        i.st = St::Established;
                        i.remote_qpn = s.qpn;
                        let param = CmEventParam::Ud(UdParam {
                            private_data: s.private_data,
                            ah_attr: self.agents[dev].params().ah_attr(i.dgid),
                            qp_num: s.qpn,
                            qkey: s.qkey,
                        });
                        self.emit(id, CmEventType::Established, 0, param);
                    } else {
                        i.st = St::Failed;
                        let param = CmEventParam::Ud(UdParam {
                            private_data: s.private_data,
                            ..UdParam::default()
                        });
                        self.emit(id, CmEventType::Unreachable, i32::from(s.status), param);
                    }
                }
                _ => self.stats.unmatched += 1,
            },
        }
    }

    /// The listening id for a request to `service_id` that arrived on device `dev`.
    fn listener(&self, dev: usize, service_id: u64, hdr: &CmaHdr) -> Option<u32> {
        if service_id >> 32 != 0 {
            return None;
        }
        let ps = PortSpace::try_from(((service_id >> 16) & 0xFFFF) as u32).ok()?;
        let port = (service_id & 0xFFFF) as u16;
        self.ids
            .iter()
            .find(|(_, i)| {
                i.st == St::Listen
                    && i.ps == ps
                    && i.dev.is_none_or(|d| d == dev)
                    && i.local.is_some_and(|l| {
                        l.port() == port && (l.ip().is_unspecified() || l.ip() == hdr.dst)
                    })
            })
            .map(|(k, _)| *k)
    }

    fn duplicate(&self, src: Gid, remote_comm: u32) -> Option<u32> {
        self.ids
            .iter()
            .find(|(_, i)| i.parent.is_some() && i.dgid == src && i.remote_comm == remote_comm)
            .map(|(k, _)| *k)
    }

    /// A new id for a request that came to `listener`.
    fn child(&mut self, listener: u32, dev: usize, src: Gid, hdr: &CmaHdr) -> Option<u32> {
        let l = &self.ids[&listener];
        let pending = self
            .ids
            .values()
            .filter(|i| i.parent == Some(listener) && i.st == St::ReqRcvd)
            .count();
        if pending >= l.backlog as usize {
            return None;
        }
        let mut c = Id::new(l.ch, l.ps);
        c.st = St::ReqRcvd;
        c.dev = Some(dev);
        c.local = Some(SocketAddr::new(hdr.dst, l.local.map_or(0, |a| a.port())));
        c.peer = Some(SocketAddr::new(hdr.src, hdr.src_port));
        c.dgid = src;
        c.parent = Some(listener);
        c.comm = self.alloc_comm(dev);
        c.psn = c.comm.wrapping_mul(0x9E37_79B9) & 0x00FF_FFFF;
        let id = self.next_id;
        self.next_id += 1;
        self.ids.insert(id, c);
        Some(id)
    }

    fn on_req(&mut self, dev: usize, src: Gid, tid: u64, r: Req, now: Instant) {
        if let Some(id) = self.duplicate(src, r.local_comm_id) {
            match self.ids[&id].st {
                // The consumer has not decided: ask for patience (IBTA 12.6.6).
                St::ReqRcvd => {
                    let i = &self.ids[&id];
                    let m = CmMsg::Mra(Mra {
                        local_comm_id: i.comm,
                        remote_comm_id: i.remote_comm,
                        message_mraed: 0,
                        service_timeout: self.cfg.mra_service_timeout,
                    });
                    self.send_to(dev, src, &m, tid);
                }
                St::RepSent => {
                    if let Some(bytes) = self.ids[&id].last {
                        let _ = self.agents[dev].send(src, &bytes);
                        self.stats.sent += 1;
                    }
                }
                _ => self.stats.unmatched += 1,
            }
            return;
        }
        let refuse = |s: &mut State, why: u16| {
            let m = CmMsg::Rej(Rej {
                local_comm_id: 0,
                remote_comm_id: r.local_comm_id,
                message_rejected: 0,
                reason: why,
                private_data: Vec::new(),
            });
            s.send_to(dev, src, &m, tid);
        };
        let Some((hdr, user)) = CmaHdr::unwrap(&r.private_data) else {
            return refuse(self, reason::INVALID_SERVICE_ID);
        };
        let Some(listener) = self.listener(dev, r.service_id, &hdr) else {
            return refuse(self, reason::INVALID_SERVICE_ID);
        };
        if self.ids[&listener].ps != PortSpace::Tcp || r.transport != mad::TRANSPORT_RC {
            return refuse(self, reason::INVALID_TRANSPORT);
        }
        let Some(id) = self.child(listener, dev, src, &hdr) else {
            return refuse(self, reason::NO_RESOURCES);
        };
        let user = user.to_vec();
        let c = self.ids.get_mut(&id).expect("made");
        c.tid = tid;
        c.remote_comm = r.local_comm_id;
        c.remote_qpn = r.local_qpn;
        c.remote_psn = r.starting_psn;
        c.req_path = (
            r.path_mtu,
            r.local_ack_timeout,
            r.retry_count,
            r.rnr_retry_count,
        );
        c.tos = r.traffic_class;
        // Until the accept, the passive side's resources are the REQ's seen from
        // here (kernel cm.c `cm_req_handler`: its responder resources are the
        // REQ's initiator depth and the other way round), and it sends with the
        // REQ's retry counts.
        c.param.responder_resources = r.initiator_depth;
        c.param.initiator_depth = r.responder_resources;
        c.param.retry_count = r.retry_count;
        c.param.rnr_retry_count = r.rnr_retry_count;
        let _ = now;
        // Seen from this side, as the kernel's cm.c `cm_format_req_event` reports
        // them: the peer's initiator depth is what this side must answer.
        let param = CmEventParam::Conn(ConnParam {
            private_data: user,
            responder_resources: r.initiator_depth,
            initiator_depth: r.responder_resources,
            flow_control: r.flow_control,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
            qp_num: r.local_qpn,
        });
        self.emit(id, CmEventType::ConnectRequest, 0, param);
    }

    fn on_sidr_req(&mut self, dev: usize, src: Gid, tid: u64, r: SidrReq, _now: Instant) {
        if let Some(id) = self.duplicate(src, r.request_id) {
            if let (St::Established | St::Failed, Some(bytes)) =
                (self.ids[&id].st, self.ids[&id].last)
            {
                let _ = self.agents[dev].send(src, &bytes);
                self.stats.sent += 1;
            }
            return;
        }
        let refuse = |s: &mut State, status: u8| {
            let m = CmMsg::SidrRep(SidrRep {
                request_id: r.request_id,
                status,
                service_id: r.service_id,
                ..SidrRep::default()
            });
            s.send_to(dev, src, &m, tid);
        };
        let Some((hdr, user)) = CmaHdr::unwrap(&r.private_data) else {
            return refuse(self, 1);
        };
        let Some(listener) = self.listener(dev, r.service_id, &hdr) else {
            return refuse(self, 1); // IB_SIDR_UNSUPPORTED
        };
        let Some(id) = self.child(listener, dev, src, &hdr) else {
            return refuse(self, 2);
        };
        let user = user.to_vec();
        let c = self.ids.get_mut(&id).expect("made");
        c.tid = tid;
        c.remote_comm = r.request_id;
        let param = CmEventParam::Ud(UdParam {
            private_data: user,
            ah_attr: self.agents[dev].params().ah_attr(src),
            qp_num: 0,
            qkey: 0,
        });
        self.emit(id, CmEventType::ConnectRequest, 0, param);
    }

    fn on_mra(&mut self, m: Mra, now: Instant) {
        let t = self.timeout();
        match self.find_comm(m.remote_comm_id) {
            Some(id) => {
                let i = self.ids.get_mut(&id).expect("exists");
                match (i.st, m.message_mraed) {
                    (St::ReqSent | St::MraRcvd, 0) => i.st = St::MraRcvd,
                    (St::RepSent, 1) => {}
                    _ => {
                        self.stats.unmatched += 1;
                        return;
                    }
                }
                // IBTA 12.6.6: wait the service timeout more before giving up.
                i.deadline = Some(now + cm_time(m.service_timeout) + t);
            }
            None => self.stats.unmatched += 1,
        }
    }

    fn on_rej(&mut self, r: Rej) {
        let Some(id) = self.find_comm(r.remote_comm_id) else {
            self.stats.unmatched += 1;
            return;
        };
        match self.ids[&id].st {
            St::ReqSent | St::MraRcvd | St::RepSent | St::RepRcvd | St::ReqRcvd => {
                let i = self.ids.get_mut(&id).expect("exists");
                i.st = St::Failed;
                i.deadline = None;
                let param = CmEventParam::Conn(ConnParam {
                    private_data: r.private_data,
                    ..ConnParam::default()
                });
                self.emit(id, CmEventType::Rejected, i32::from(r.reason), param);
            }
            // The consumer knows already (CONNECT_ERROR); librdmacm drops the REJECTED.
            St::ConnectError => self.ids.get_mut(&id).expect("exists").st = St::Failed,
            _ => self.stats.unmatched += 1,
        }
    }

    fn on_rep(&mut self, r: Rep, now: Instant) {
        let Some(id) = self.find_comm(r.remote_comm_id) else {
            self.stats.unmatched += 1;
            return;
        };
        match self.ids[&id].st {
            St::ReqSent | St::MraRcvd => {}
            // The RTU was lost: send it again (IBTA 12.6.8).
            St::Established if self.ids[&id].remote_comm == r.local_comm_id => {
                let i = &self.ids[&id];
                if let (Some(bytes), Some(dev)) = (i.last, i.dev) {
                    let dst = i.dgid;
                    let _ = self.agents[dev].send(dst, &bytes);
                    self.stats.sent += 1;
                }
                return;
            }
            _ => {
                self.stats.unmatched += 1;
                return;
            }
        }
        let has_qp = {
            let i = self.ids.get_mut(&id).expect("exists");
            i.deadline = None;
            i.remote_comm = r.local_comm_id;
            i.remote_qpn = r.local_qpn;
            i.remote_psn = r.starting_psn;
            i.param.rnr_retry_count = r.rnr_retry_count;
            i.param.initiator_depth = i.param.initiator_depth.min(r.responder_resources);
            // kernel cm.c `cm_rep_handler`: the active side's responder resources
            // become the REP's initiator depth.
            i.param.responder_resources = r.initiator_depth;
            i.qpn.is_some()
        };
        // Seen from this side (kernel cm.c `cm_format_rep_event`).
        let param = CmEventParam::Conn(ConnParam {
            private_data: r.private_data.clone(),
            responder_resources: r.initiator_depth,
            initiator_depth: r.responder_resources,
            flow_control: r.flow_control,
            retry_count: self.ids[&id].param.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
            qp_num: r.local_qpn,
        });
        if !has_qp {
            self.ids.get_mut(&id).expect("exists").st = St::RepRcvd;
            self.emit(id, CmEventType::ConnectResponse, 0, param);
            return;
        }
        if let Err(e) = self.qp_to_rts(id, None) {
            // The REP cannot be used (librdmacm's `ucma_process_conn_resp`): the QP goes
            // to ERROR, the consumer gets CONNECT_ERROR, and no RTU is sent. The peer
            // hears of it when the id is destroyed (a REJ, as the kernel's
            // `cm_destroy_id` sends from REP_RCVD) or when its REP times out.
            self.qp_to_error(id);
            self.ids.get_mut(&id).expect("exists").st = St::ConnectError;
            self.emit(id, CmEventType::ConnectError, -e.errno(), param);
            return;
        }
        let i = &self.ids[&id];
        let m = CmMsg::Rtu(Ids {
            local_comm_id: i.comm,
            remote_comm_id: i.remote_comm,
            ..Ids::default()
        });
        self.ids.get_mut(&id).expect("exists").st = St::Established;
        self.send_id(id, &m, now);
        self.ids.get_mut(&id).expect("exists").deadline = None;
        self.emit(id, CmEventType::Established, 0, param);
    }

    /// DREP for id `id`'s connection.
    fn send_drep(&mut self, id: u32) {
        let i = &self.ids[&id];
        let Some(dev) = i.dev else { return };
        let (dst, tid) = (i.dgid, i.dreq_tid);
        let drep = CmMsg::Drep(Ids {
            local_comm_id: i.comm,
            remote_comm_id: i.remote_comm,
            ..Ids::default()
        });
        self.send_to(dev, dst, &drep, tid);
    }

    fn on_dreq(&mut self, dev: usize, src: Gid, tid: u64, m: Ids, now: Instant) {
        let hit = self.find_comm(m.remote_comm_id);
        match hit.map(|id| (id, self.ids[&id].st)) {
            // The consumer is told and answers with `disconnect`, which sends the DREP
            // (rdma_cm's order; IBTA 12.6.10 lets the DREP wait for the QP to be
            // quiesced).
            Some((id, St::Established | St::RepSent | St::RepRcvd)) => {
                self.qp_to_error(id);
                let i = self.ids.get_mut(&id).expect("exists");
                i.st = St::DreqRcvd;
                i.dreq_tid = tid;
                i.deadline = None;
                self.emit(id, CmEventType::Disconnected, 0, CmEventParam::None);
                return;
            }
            // The consumer has not answered the first DREQ yet.
            Some((_, St::DreqRcvd)) => return,
            // Both sides disconnect at once: answer, and this side is done too.
            Some((id, St::DreqSent)) => self.disconnected(id, now),
            Some(_) => {}
            None => self.stats.unmatched += 1,
        }
        // IBTA 12.6.10: a DREQ is otherwise always answered, even for a connection gone.
        let (local, remote) = hit.map_or((0, m.local_comm_id), |id| {
            (self.ids[&id].comm, self.ids[&id].remote_comm)
        });
        let drep = CmMsg::Drep(Ids {
            local_comm_id: local,
            remote_comm_id: remote,
            ..Ids::default()
        });
        self.send_to(dev, src, &drep, tid);
    }

    /// `DISCONNECTED`, then the time-wait.
    fn disconnected(&mut self, id: u32, now: Instant) {
        let t = self.timeout();
        let i = self.ids.get_mut(&id).expect("exists");
        i.st = St::TimeWait;
        i.deadline = Some(now + t);
        self.emit(id, CmEventType::Disconnected, 0, CmEventParam::None);
    }

    fn on_timeout(&mut self, id: u32, now: Instant) {
        let st = self.ids[&id].st;
        let max = self.cfg.max_retries;
        match st {
            St::AddrQuery => {
                let i = self.ids.get_mut(&id).expect("exists");
                if i.retries + 1 < PROBES {
                    i.retries += 1;
                    let (retries, interval) = (i.retries, i.probe_interval);
                    self.resend(id);
                    let i = self.ids.get_mut(&id).expect("exists");
                    i.retries = retries;
                    i.deadline = Some(now + interval);
                } else {
                    i.st = St::Idle;
                    i.dev = None;
                    i.peer = None;
                    self.emit(id, CmEventType::AddrError, -ETIMEDOUT, CmEventParam::None);
                }
            }
            St::ReqSent | St::MraRcvd | St::SidrReqSent | St::RepSent | St::DreqSent => {
                let retries = self.ids[&id].retries;
                if retries < max {
                    self.resend(id);
                    self.stats.retransmits += 1;
                    let t = self.timeout();
                    let i = self.ids.get_mut(&id).expect("exists");
                    i.retries = retries + 1;
                    i.deadline = Some(now + t);
                    return;
                }
                match st {
                    St::DreqSent => self.disconnected(id, now),
                    _ => {
                        if st != St::SidrReqSent {
                            self.send_rej(id, reason::TIMEOUT);
                        }
                        if st == St::RepSent {
                            self.qp_to_error(id);
                        }
                        self.ids.get_mut(&id).expect("exists").st = St::Failed;
                        self.emit(id, CmEventType::Unreachable, -ETIMEDOUT, CmEventParam::None);
                    }
                }
            }
            St::TimeWait => {
                self.ids.get_mut(&id).expect("exists").st = St::Disconnected;
                self.emit(id, CmEventType::TimewaitExit, 0, CmEventParam::None);
            }
            _ => {}
        }
    }

    fn resend(&mut self, id: u32) {
        let i = &self.ids[&id];
        if let (Some(bytes), Some(dev)) = (i.last, i.dev) {
            let dst = i.dgid;
            if self.agents[dev].send(dst, &bytes).is_ok() {
                self.stats.sent += 1;
            }
        }
    }

    /// Frees every agent's QP1.
    pub(crate) fn close(&mut self) {
        for a in &mut self.agents {
            a.close();
        }
    }
}
