//! A two-engine harness on virtual time, after quinn-proto's `tests/util.rs`.
//!
//! Two [`Engine`]s exchange packets through an in-memory wire with a fixed latency.
//! A rule sees every packet (decoded) and may drop, duplicate or delay it. Time only
//! moves when nothing is left to do at the current instant: then it jumps to the next
//! delivery or timer. Every packet is logged with what happened to it.

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use emu_core::engine::{Engine, SrqAttr, MAX_PACKET};
use emu_wire::{Opcode, PacketRepr, Psn};
use verbs_api::{
    AccessFlags, AhAttr, AsyncEvent, Endpoint, Gid, GlobalRoute, MemBuf, Mtu, QpAttr, QpAttrMask,
    QpCap, QpParams, QpState, QpType, RecvWr, SendWr, Sge, WorkCompletion,
};
use verbs_api::{CqId, MrInfo, PdId, QpInitAttr, SrqId};

/// Which engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

impl Side {
    pub fn other(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// What a rule does with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Deliver,
    Drop,
    Duplicate,
    Delay(Duration),
}

/// A packet on the wire: when it arrives, its send order, to which engine, GID and
/// with which TOS byte, and its bytes.
type InFlight = (Instant, u64, (Side, Gid, u8), Vec<u8>);

/// One packet as it crossed (or failed to cross) the wire.
#[derive(Clone, Debug)]
pub struct Record {
    pub at: Duration,
    pub from: Side,
    pub opcode: Opcode,
    pub psn: u32,
    pub ack_req: bool,
    pub syndrome: Option<u8>,
    pub payload_len: usize,
    /// The traffic class it went with (the IPv4 TOS byte).
    pub traffic_class: u8,
    pub action: Action,
}

impl Record {
    pub fn short(&self) -> String {
        let dir = if self.from == Side::A { "A->B" } else { "B->A" };
        let syn = self
            .syndrome
            .map(|s| format!(" aeth={s:#04x}"))
            .unwrap_or_default();
        let act = match self.action {
            Action::Deliver => String::new(),
            a => format!(" [{a:?}]"),
        };
        format!("{dir} {} psn={}{syn}{act}", self.opcode.name(), self.psn)
    }
}

type Rule = Box<dyn FnMut(Side, &PacketRepr, usize) -> Action>;

/// Two engines, a wire, virtual time.
pub struct Engines {
    pub t0: Instant,
    pub now: Instant,
    pub a: Engine,
    pub b: Engine,
    pub latency: Duration,
    wire: Vec<InFlight>,
    seq: u64,
    pub log: Vec<Record>,
    rule: Option<Rule>,
    sent: usize,
    /// The source address each side's packets arrive from (default: its [`gid`]).
    src: [Gid; 2],
}

pub fn gid(side: Side) -> Gid {
    match side {
        Side::A => Gid::from_ipv4([10, 0, 0, 1].into()),
        Side::B => Gid::from_ipv4([10, 0, 0, 2].into()),
    }
}

impl Default for Engines {
    fn default() -> Self {
        let t0 = Instant::now();
        let engine = |side| {
            let mut e = Engine::default();
            e.set_gid(gid(side));
            e
        };
        Engines {
            t0,
            now: t0,
            a: engine(Side::A),
            b: engine(Side::B),
            latency: Duration::from_micros(5),
            wire: Vec::new(),
            seq: 0,
            log: Vec::new(),
            rule: None,
            sent: 0,
            src: [gid(Side::A), gid(Side::B)],
        }
    }
}

impl Engines {
    pub fn engine(&mut self, side: Side) -> &mut Engine {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Makes `side`'s packets arrive from `src` from now on (another route, or the
    /// side's alternate source address).
    pub fn set_src(&mut self, side: Side, src: Gid) {
        self.src[side as usize] = src;
    }

    /// Installs a rule that sees every packet with its index (0-based, in send order).
    pub fn set_rule(&mut self, rule: impl FnMut(Side, &PacketRepr, usize) -> Action + 'static) {
        self.rule = Some(Box::new(rule));
    }

    pub fn clear_rule(&mut self) {
        self.rule = None;
    }

    /// Collects every packet both engines want to send now.
    fn flush(&mut self) -> bool {
        let mut any = false;
        let mut buf = vec![0u8; MAX_PACKET];
        for side in [Side::A, Side::B] {
            loop {
                let now = self.now;
                let Some(t) = self.engine(side).poll_transmit(now, &mut buf) else {
                    break;
                };
                any = true;
                let bytes = buf[..t.size].to_vec();
                let (repr, payload) =
                    PacketRepr::parse(&bytes).expect("engine emits valid packets");
                let index = self.sent;
                self.sent += 1;
                let action = match &mut self.rule {
                    Some(rule) => rule(side, &repr, index),
                    None => Action::Deliver,
                };
                self.log.push(Record {
                    at: self.now - self.t0,
                    from: side,
                    opcode: repr.bth.opcode,
                    psn: repr.bth.psn.value(),
                    ack_req: repr.bth.ack_req,
                    syndrome: repr.aeth.map(|a| a.syndrome.to_u8()),
                    payload_len: payload.len(),
                    traffic_class: t.traffic_class,
                    action,
                });
                let to = (side.other(), t.dest, t.traffic_class);
                let at = self.now + self.latency;
                match action {
                    Action::Deliver => self.push_wire(at, to, bytes),
                    Action::Drop => {}
                    Action::Duplicate => {
                        self.push_wire(at, to, bytes.clone());
                        self.push_wire(at, to, bytes);
                    }
                    Action::Delay(d) => self.push_wire(at + d, to, bytes),
                }
            }
        }
        any
    }

    /// Queues `bytes` for the other engine (`to.0`), addressed to the GID `to.1`, with
    /// the TOS byte `to.2`.
    fn push_wire(&mut self, at: Instant, to: (Side, Gid, u8), bytes: Vec<u8>) {
        self.seq += 1;
        self.wire.push((at, self.seq, to, bytes));
    }

    /// Delivers every packet due now (in order of arrival time, then send order).
    fn deliver_due(&mut self) -> bool {
        self.wire.sort_by_key(|(at, seq, ..)| (*at, *seq));
        let due = self
            .wire
            .iter()
            .take_while(|(at, ..)| *at <= self.now)
            .count();
        if due == 0 {
            return false;
        }
        let batch: Vec<_> = self.wire.drain(..due).collect();
        for (_, _, (to, dst, tos), bytes) in batch {
            let now = self.now;
            let src = self.src[to.other() as usize];
            self.engine(to)
                .handle_datagram_tos(now, src, dst, tos, &bytes);
        }
        true
    }

    fn next_event(&self) -> Option<Instant> {
        let wire = self.wire.iter().map(|w| w.0).min();
        [wire, self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs until nothing is in flight and no timer is armed, or `limit` of virtual time
    /// has passed. Returns false if it stopped at the limit.
    pub fn drive_for(&mut self, limit: Duration) -> bool {
        let end = self.now + limit;
        loop {
            while self.flush() | self.deliver_due() {}
            let Some(next) = self.next_event() else {
                return true;
            };
            if next > end {
                self.now = end;
                return false;
            }
            self.now = self.now.max(next);
            let now = self.now;
            self.a.handle_timeout(now);
            self.b.handle_timeout(now);
        }
    }

    /// Runs to quiescence (panics after a minute of virtual time).
    pub fn drive(&mut self) {
        assert!(
            self.drive_for(Duration::from_secs(60)),
            "no quiescence after 60 s of virtual time"
        );
    }

    /// Moves virtual time forward, running whatever falls due.
    pub fn advance(&mut self, d: Duration) {
        self.drive_for(d);
    }

    pub fn trace(&self) -> Vec<String> {
        self.log.iter().map(Record::short).collect()
    }

    pub fn opcodes(&self, from: Side) -> Vec<Opcode> {
        self.log
            .iter()
            .filter(|r| r.from == from)
            .map(|r| r.opcode)
            .collect()
    }
}

/// One side's verbs objects: a PD, a CQ used by both queues, a QP (RC unless the config says UC) and a buffer
/// registered with every access.
#[derive(Clone, Debug)]
pub struct Node {
    pub side: Side,
    pub pd: PdId,
    pub cq: CqId,
    pub qpn: u32,
    pub buf: MemBuf,
    pub mr: MrInfo,
    /// The SRQ the QP receives from, when the config asked for one.
    pub srq: Option<SrqId>,
}

/// Knobs for [`connect`].
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub mtu: Mtu,
    pub buf_len: usize,
    pub cq_len: u32,
    pub cap: QpCap,
    pub access: AccessFlags,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub sq_psn: [u32; 2],
    pub sq_sig_all: bool,
    pub qp_type: QpType,
    /// Give the QP a shared receive queue sized from `cap.max_recv_wr` and
    /// `cap.max_recv_sge` instead of a receive queue of its own.
    pub srq: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mtu: Mtu::Mtu1024,
            buf_len: 1 << 16,
            cq_len: 1024,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            sq_psn: [100, 0xFF_FFF0],
            sq_sig_all: false,
            qp_type: QpType::Rc,
            srq: false,
        }
    }
}

pub fn setup(e: &mut Engine, side: Side, cfg: &Config) -> Node {
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(cfg.cq_len).unwrap();
    let srq = cfg.srq.then(|| {
        e.create_srq(
            pd,
            SrqAttr {
                max_wr: cfg.cap.max_recv_wr,
                max_sge: cfg.cap.max_recv_sge,
                srq_limit: 0,
            },
        )
        .unwrap()
    });
    let qpn = e
        .create_qp(
            QpInitAttr::new(pd, cq, cfg.qp_type, cfg.cap)
                .srq(srq)
                .sq_sig_all(cfg.sq_sig_all),
        )
        .unwrap();
    let buf = MemBuf::new(cfg.buf_len);
    let mr = e
        .reg_mr(
            pd,
            &buf,
            0,
            cfg.buf_len,
            cfg.access | AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
    Node {
        side,
        pd,
        cq,
        qpn,
        buf,
        mr,
        srq,
    }
}

/// The far end of a connection, as the two sides exchange it out of band.
#[derive(Clone, Copy, Debug)]
pub struct Remote {
    pub qpn: u32,
    pub gid: Gid,
    /// The PSN the remote sends from (our rq_psn).
    pub psn: u32,
}

/// RESET -> INIT -> RTR -> RTS with the required attributes of each step.
pub fn bring_up(e: &mut Engine, now: Instant, qpn: u32, remote: Remote, sq_psn: u32, cfg: &Config) {
    let params = QpParams {
        access: cfg.access,
        path_mtu: cfg.mtu,
        timeout: cfg.timeout,
        retry_cnt: cfg.retry_cnt,
        rnr_retry: cfg.rnr_retry,
        min_rnr_timer: cfg.min_rnr_timer,
        max_rd_atomic: cfg.max_rd_atomic,
        max_dest_rd_atomic: cfg.max_dest_rd_atomic,
        ..QpParams::default()
    };
    let remote = Endpoint {
        lid: 0,
        qpn: remote.qpn,
        psn: remote.psn,
        gid: remote.gid,
    };
    for (attr, mask) in [
        params.init(cfg.qp_type),
        params.rtr(cfg.qp_type, &remote),
        params.rts(cfg.qp_type, sq_psn),
    ] {
        e.modify_qp(now, qpn, &attr, mask).unwrap();
    }
}

/// A connected RC pair.
pub fn connected(cfg: Config) -> (Engines, Node, Node) {
    let mut p = Engines::default();
    let a = setup(&mut p.a, Side::A, &cfg);
    let b = setup(&mut p.b, Side::B, &cfg);
    let now = p.now;
    let to_b = Remote {
        qpn: b.qpn,
        gid: gid(Side::B),
        psn: cfg.sq_psn[1],
    };
    let to_a = Remote {
        qpn: a.qpn,
        gid: gid(Side::A),
        psn: cfg.sq_psn[0],
    };
    bring_up(&mut p.a, now, a.qpn, to_b, cfg.sq_psn[0], &cfg);
    bring_up(&mut p.b, now, b.qpn, to_a, cfg.sq_psn[1], &cfg);
    (p, a, b)
}

impl Node {
    pub fn sge(&self, offset: u64, length: u32) -> Sge {
        Sge {
            addr: self.mr.addr + offset,
            length,
            lkey: self.mr.lkey,
        }
    }

    pub fn post_send(&self, p: &mut Engines, wr: SendWr) {
        let now = p.now;
        p.engine(self.side).post_send(now, self.qpn, &[wr]).unwrap();
    }

    pub fn post_recv(&self, p: &mut Engines, wr_id: u64, offset: u64, length: u32) {
        let now = p.now;
        let wr = RecvWr {
            wr_id,
            sg_list: vec![self.sge(offset, length)].into(),
        };
        p.engine(self.side).post_recv(now, self.qpn, &[wr]).unwrap();
    }

    /// Posts one receive WR to the node's SRQ (the config must have asked for one).
    pub fn post_srq_recv(&self, p: &mut Engines, wr_id: u64, offset: u64, length: u32) {
        let now = p.now;
        let wr = RecvWr {
            wr_id,
            sg_list: vec![self.sge(offset, length)].into(),
        };
        let srq = self.srq.expect("the node has no SRQ");
        p.engine(self.side).post_srq_recv(now, srq, &[wr]).unwrap();
    }

    pub fn poll(&self, p: &mut Engines) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        p.engine(self.side)
            .poll_cq(self.cq, usize::MAX, &mut out)
            .unwrap();
        out
    }

    pub fn events(&self, p: &mut Engines) -> Vec<AsyncEvent> {
        std::iter::from_fn(|| p.engine(self.side).poll_event()).collect()
    }

    pub fn state(&self, p: &mut Engines) -> QpState {
        p.engine(self.side).query_qp(self.qpn).unwrap().0.qp_state
    }

    pub fn write_bytes(&self, offset: usize, data: &[u8]) {
        self.buf.write(offset, data).unwrap();
    }

    pub fn read_bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.buf.read(offset, &mut v).unwrap();
        v
    }
}

/// A deterministic test pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// PSN helper.
pub fn psn(v: u32) -> Psn {
    Psn::new(v)
}

// ---- UD (tests/ud.rs and others) ----

/// RESET -> INIT (P_Key index, port, Q_Key) -> RTR -> RTS (SQ_PSN): the UD path, no
/// path attributes (IBTA 10.3, table of required attributes).
pub fn ud_bring_up(e: &mut Engine, now: Instant, qpn: u32, qkey: u32, sq_psn: u32) {
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qkey,
        ..QpAttr::default()
    };
    e.modify_qp(
        now,
        qpn,
        &attr,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    attr.qp_state = QpState::Rtr;
    e.modify_qp(now, qpn, &attr, QpAttrMask::STATE).unwrap();
    attr.qp_state = QpState::Rts;
    attr.sq_psn = sq_psn;
    e.modify_qp(now, qpn, &attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .unwrap();
}

/// A UD config: the default knobs with `qp_type` UD.
pub fn ud_config() -> Config {
    Config {
        qp_type: QpType::Ud,
        ..Config::default()
    }
}

/// Two UD QPs in RTS, one per engine, both with Q_Key `qkey`; each engine knows its GID.
pub fn ud_pair(cfg: Config, qkey: u32) -> (Engines, Node, Node) {
    let mut p = Engines::default();
    p.a.set_gid(gid(Side::A));
    p.b.set_gid(gid(Side::B));
    let a = setup(&mut p.a, Side::A, &cfg);
    let b = setup(&mut p.b, Side::B, &cfg);
    let now = p.now;
    ud_bring_up(&mut p.a, now, a.qpn, qkey, cfg.sq_psn[0]);
    ud_bring_up(&mut p.b, now, b.qpn, qkey, cfg.sq_psn[1]);
    (p, a, b)
}

/// The address vector of `to`'s GID.
pub fn ah_attr_to(dgid: Gid) -> AhAttr {
    AhAttr {
        grh: GlobalRoute {
            dgid,
            hop_limit: 64,
            ..GlobalRoute::default()
        },
        is_global: true,
        port_num: 1,
        ..AhAttr::default()
    }
}

impl Node {
    /// An address handle on this node's engine for `dgid`.
    pub fn create_ah(&self, p: &mut Engines, dgid: Gid) -> verbs_api::AhId {
        let pd = self.pd;
        p.engine(self.side)
            .create_ah(pd, &ah_attr_to(dgid))
            .unwrap()
    }
}

/// A signaled UD SEND of `sges` through `ah` to `remote_qpn` with `qkey`.
pub fn ud_send(
    wr_id: u64,
    sges: Vec<Sge>,
    ah: verbs_api::AhId,
    remote_qpn: u32,
    qkey: u32,
) -> SendWr {
    SendWr::send(wr_id, sges)
        .signaled()
        .with_ud(verbs_api::UdDest {
            ah: verbs_api::AhId(ah.0),
            remote_qpn,
            remote_qkey: qkey,
        })
}

/// A signaled SEND of one SGE.
pub fn send(wr_id: u64, sge: Sge) -> SendWr {
    SendWr::send(wr_id, vec![sge]).signaled()
}

/// A signaled send WR (the common case of the scenario tests).
pub fn signaled(wr_id: u64, op: verbs_api::WrOperation, sges: Vec<Sge>) -> SendWr {
    SendWr::new(wr_id, sges, op).signaled()
}
