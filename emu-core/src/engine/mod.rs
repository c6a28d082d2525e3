//! The sans-IO transport engine: every verb of one emulated device, and the RoCEv2
//! transport that runs under them, as a deterministic state machine.
//!
//! The engine does no I/O and reads no clock. Inputs carry the time:
//! [`Engine::handle_datagram`], [`Engine::handle_timeout`] and the verbs
//! ([`Engine::post_send`], [`Engine::modify_qp`], ...). Outputs are polled, in this
//! order after every input: [`Engine::poll_transmit`] until it returns `None`, then
//! [`Engine::poll_timeout`]; completions with [`Engine::poll_cq`], completion-channel
//! wake-ups with [`Engine::poll_cq_event`], asynchronous events with
//! [`Engine::poll_event`]. This is quinn-proto's `Connection` shape.
//!
//! A transmitted packet is the UDP payload of a RoCEv2 datagram (BTH through a zeroed
//! ICRC slot); the driver fills in the ICRC, because it covers the IP and UDP headers
//! that only the driver knows (IBTA Annex A17.4).

mod ah;
mod apm;
mod completer;
mod counters;
mod cq;
mod ctx;
mod gsi;
mod idmap;
mod kind;
mod manage;
mod modify;
mod mr;
mod mw;
mod note;
mod port;
mod qp;
mod requester;
mod responder;
mod retry;
pub use retry::PeerLiveness;
mod rnr;
mod srq;
mod timers;
mod ud;
mod wqe;
mod xrc;

use std::collections::VecDeque;

use idmap::{IdMap, QpMap};
use std::time::Instant;

use emu_wire::{PacketRepr, Transport};
use verbs_api::{
    AccessFlags, AhAttr, AsyncEvent, AsyncEventType, Error, Gid, MemBuf, Mtu, MwBind, MwType,
    PostError, QpAttr, QpAttrMask, QpType, RecvWr, ReregMrFlags, Result, SendWr, WorkCompletion,
    XrcdId, XrcdOpen,
};

pub use ah::{init_ah_from_wc, is_multicast};
pub use counters::Counters;
pub use gsi::{GSI_QKEY, GSI_QPN};
pub use kind::{connected_dest_qpn, PacketKind};
pub use manage::EIO;
pub use note::{fmt_duration, upper_snake, Note, TimerKind};
pub use port::{PortLink, DEFAULT_PKEY, PORT_NUM};
pub use ud::{GRH_LEN, MULTICAST_QPN};
pub use verbs_api::{SrqAttr, SrqAttrMask};

use ctx::Ctx;
use qp::QueuePair;
use timers::{Timer, TimerIndex};
use verbs_api::{AhId, CqId, MrInfo, MwId, PdId, QpInitAttr, SrqId, WrOpcode};

/// The largest UDP payload the engine produces: BTH, the largest header set, a 4096-byte
/// payload, pad and ICRC. Buffers passed to [`Engine::poll_transmit`] must be this big.
pub const MAX_PACKET: usize = 4096 + 128;

/// Device limits, reported by `query_device` and enforced by the verbs. The defaults
/// follow kernel rxe's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Queue pairs per device.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// SGEs per work request.
    pub max_sge: u32,
    /// INLINE bytes per send work request.
    pub max_inline_data: u32,
    /// Completion queues per device.
    pub max_cq: u32,
    /// Entries per completion queue.
    pub max_cqe: u32,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Outstanding READ/ATOMIC a QP may answer (`max_dest_rd_atomic` bound).
    pub max_qp_rd_atom: u32,
    /// Outstanding READ/ATOMIC a QP may issue (`max_rd_atomic` bound).
    pub max_qp_init_rd_atom: u32,
    /// Largest message (port attribute `max_msg_sz`).
    pub max_msg_sz: u32,
    /// The port's active MTU: the largest `path_mtu` a QP may use.
    pub active_mtu: Mtu,
    /// P_Key table length.
    pub pkey_tbl_len: u32,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Shared receive queues per device.
    pub max_srq: u32,
    /// Work requests per shared receive queue.
    pub max_srq_wr: u32,
    /// SGEs per shared receive queue work request.
    pub max_srq_sge: u32,
    /// Protection domains per device.
    pub max_pd: u32,
    /// Memory regions per device.
    pub max_mr: u32,
    /// Memory windows per device.
    pub max_mw: u32,
    /// Address handles per device.
    pub max_ah: u32,
    /// Multicast groups with at least one QP attached.
    pub max_mcast_grp: u32,
    /// QPs attached to one multicast group.
    pub max_mcast_qp_attach: u32,
    /// QP attachments over all multicast groups.
    pub max_total_mcast_qp_attach: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_qp: 1 << 17,
            max_qp_wr: 1 << 14,
            max_sge: 32,
            max_inline_data: 256,
            max_cq: 1 << 16,
            max_cqe: (1 << 15) - 1,
            max_mr_size: u64::MAX,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_msg_sz: 1 << 31,
            active_mtu: Mtu::Mtu4096,
            pkey_tbl_len: 64,
            gid_tbl_len: 16,
            max_srq: 0x1000,
            max_srq_wr: 1 << 14,
            max_srq_sge: 27,
            max_pd: 1 << 16,
            max_mr: 1 << 18,
            max_mw: 1 << 16,
            max_ah: 1 << 15,
            // Kernel rxe's multicast limits (rxe_param.h), so a program sized for rxe
            // fits.
            max_mcast_grp: 8192,
            max_mcast_qp_attach: 56,
            max_total_mcast_qp_attach: 8192 * 56,
        }
    }
}

/// A packet the engine wants sent: `size` bytes at the start of the buffer given to
/// [`Engine::poll_transmit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// The destination GID (the peer's IPv4-mapped address on RoCEv2).
    pub dest: Gid,
    /// The source GID: the port's GID table entry at the `sgid_index` of the path (a
    /// connected QP's `ah_attr`, a UD WR's address handle), the address the packet
    /// leaves from (IBTA 8.3.1, Annex A17.4.2: a RoCEv2 packet's IP source is its
    /// SGID). A driver with one address per family picks its socket by it.
    pub src: Gid,
    /// The sending QP (a driver may derive the UDP source port from it, as rxe does).
    pub src_qpn: u32,
    /// Bytes of UDP payload, ICRC slot included.
    pub size: usize,
    /// The traffic class of the path (`ibv_ah_attr.grh.traffic_class` of the QP's
    /// path or of a UD WR's address handle): the link puts it in the IPv4 header's
    /// TOS byte (IBTA Annex A17.4.5: on RoCEv2 the GRH's TClass travels as the IP
    /// header's; ECN, its low two bits, is the network's).
    pub traffic_class: u8,
    /// What the packet is: a driver that batches its sends may hold a positive ACK
    /// back behind requests, and must keep every other response in order (see
    /// [`PacketKind`]).
    pub kind: PacketKind,
}

/// The first QP number handed out (kernel rxe starts at 0x11 too; 0 and 1 are the
/// special QPs).
const FIRST_QPN: u32 = 0x11;

/// How many top bits of a QP number name its block ([`Engine::set_qpn_block`]): 64
/// blocks of 2^18 QPNs, each more than `Limits::max_qp`.
pub const QPN_BLOCK_BITS: u32 = 6;
/// Where a QPN's block starts: `qpn >> QPN_BLOCK_SHIFT` is its block.
pub const QPN_BLOCK_SHIFT: u32 = 24 - QPN_BLOCK_BITS;

/// Where a CM communication ID's top bits start: an emulated CM (`emu-cm`) numbers a
/// device's connections in the device's block of QPNs ([`verbs_api::Device::qpn_block`]),
/// so that a MAD's [`emu_wire::mad::Addressee::Comm`] names the process holding the
/// connection (`nic::share`).
pub const COMM_BLOCK_SHIFT: u32 = 32 - QPN_BLOCK_BITS;

/// One emulated device's verbs objects and transport.
#[derive(Debug)]
pub struct Engine {
    limits: Limits,
    /// Port 1: state, GID table (entry 0 is where packets given to
    /// [`Engine::handle_datagram`] were addressed), P_Key table, LID/SM fields.
    port: port::Port,
    /// The device failed (`DEVICE_FATAL`): it moves no more packets.
    fatal: bool,
    mrs: mr::MrTable,
    ahs: ah::AhTable,
    mcast: ud::McastTable,
    cqs: IdMap<cq::CompletionQueue>,
    next_cq: u32,
    srqs: IdMap<srq::SharedReceiveQueue>,
    next_srq: u32,
    /// XRC domains (module `xrc`).
    xrcds: xrc::XrcdTable,
    qps: QpMap<QueuePair>,
    next_qpn: u32,
    /// The block QP numbers are handed out from (see [`Engine::set_qpn_block`]).
    qpn_block: u8,
    /// UD QPs other than QP1: the QPs whose receive buffers show the GRH, and with it
    /// the traffic class the packets came with.
    ud_qps: usize,
    events: VecDeque<AsyncEvent>,
    cq_events: VecDeque<CqId>,
    /// CQs whose notification request wakes the device (kept so `cq_armed` scans
    /// nothing).
    armed_cqs: usize,
    ready: VecDeque<u32>,
    /// Buffers of emptied send queues, lent to the next QP that posts (module `wqe`).
    send_queues: wqe::SendQueuePool,
    timers: TimerIndex,
    counters: Counters,
    /// What the driver knows of peer devices on this host (module `retry`).
    liveness: Option<std::sync::Arc<dyn PeerLiveness>>,
    /// What the engine did, while someone traces ([`Engine::set_notes`]).
    notes: note::Notes,
}

impl Default for Engine {
    fn default() -> Self {
        Engine::new(Limits::default())
    }
}

impl Engine {
    /// A device with these limits and no objects.
    pub fn new(limits: Limits) -> Self {
        Engine {
            port: port::Port::new(limits.gid_tbl_len, limits.pkey_tbl_len, limits.active_mtu),
            fatal: false,
            limits,
            mrs: mr::MrTable::default(),
            ahs: ah::AhTable::default(),
            mcast: ud::McastTable::default(),
            cqs: IdMap::default(),
            next_cq: 0,
            srqs: IdMap::default(),
            next_srq: 0,
            xrcds: xrc::XrcdTable::default(),
            qps: QpMap::default(),
            next_qpn: FIRST_QPN,
            qpn_block: 0,
            ud_qps: 0,
            events: VecDeque::new(),
            cq_events: VecDeque::new(),
            armed_cqs: 0,
            ready: VecDeque::new(),
            send_queues: wqe::SendQueuePool::default(),
            timers: TimerIndex::default(),
            counters: Counters::default(),
            liveness: None,
            notes: note::Notes::default(),
        }
    }

    /// Turns the engine's notes on or off (off by default): what it did, for a trace
    /// (see [`Note`]). Off, noting costs one branch and allocates nothing.
    pub fn set_notes(&mut self, on: bool) {
        self.notes.0 = on.then(Vec::new);
    }

    /// Hands each note taken since the last drain to `f`, in order.
    pub fn drain_notes(&mut self, mut f: impl FnMut(Note)) {
        if let Some(v) = &mut self.notes.0 {
            for n in v.drain(..) {
                f(n);
            }
        }
    }

    /// Tells the engine how to know whether a peer device on this host could not run
    /// (see [`PeerLiveness`]): an ACK timeout during which it could not answer
    /// then retransmits without spending a retry. A fabric, whose devices always run,
    /// gives none.
    pub fn set_peer_liveness(&mut self, l: Option<std::sync::Arc<dyn PeerLiveness>>) {
        self.liveness = l;
    }

    /// The device's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Hands out QP numbers from `block` only (the top [`QPN_BLOCK_BITS`] bits of every
    /// QPN this engine gives), starting at `seed` folded into the block, above the
    /// special QPs. Two uses, both by a driver on UDP:
    /// - several processes open the device of one address, as they open one kernel
    ///   rxe device: each gets a block of its own, so a packet's destination QPN
    ///   names the process it is for (`nic::share`);
    /// - QPNs must differ from an earlier process's: a peer CM that still holds that
    ///   process's connection would take a new REQ from the same QPN and GID for a
    ///   stale one (IBTA 12.9.8.3.1, REJ reason 10). Kernel rxe allocates QPNs
    ///   cyclically, so a new process rarely gets the last one's numbers.
    pub fn set_qpn_block(&mut self, block: u8, seed: u32) {
        self.qpn_block = block % (1 << QPN_BLOCK_BITS);
        let (lo, hi) = qpn_block_range(self.qpn_block);
        self.next_qpn = lo + seed % (hi - lo);
    }

    /// The block QP numbers are handed out from ([`Engine::set_qpn_block`]).
    pub fn qpn_block(&self) -> u8 {
        self.qpn_block
    }

    /// Sets the GID of the device's port (GID index 0; the driver's address). UD
    /// receive buffers report it as the destination in their GRH.
    /// Raises no event: this is the driver saying where the device lives, not a
    /// change of a running port (see [`Engine::set_gid_entry`]).
    pub fn set_gid(&mut self, gid: Gid) {
        // Entries 0 and 1 both hold the device's address. A RoCE port of kernel rxe
        // lists its interface's IPv6 link-local default GID first and the IPv4 address
        // after it (ib_cache's default GID), so programs written against rxe ask for
        // index 1 for IPv4 (the ibverbs and async-rdma crates, `-g 1`); programs for
        // any RoCE device commonly ask for 0. A device on one address has both
        // indices name it; one on both families lays its table out as rxe does
        // ([`Engine::set_gid_table`]).
        self.set_gid_table(&[gid, gid]);
    }

    /// Sets the port's GID table to `gids` from index 0 (the rest of the table empty;
    /// entries past its length are dropped): the driver saying which addresses the
    /// device carries traffic on. Entry 0 is what [`Engine::handle_datagram`] takes as
    /// the destination. Raises no event, as [`Engine::set_gid`].
    pub fn set_gid_table(&mut self, gids: &[Gid]) {
        for (i, g) in self.port.gids.iter_mut().enumerate() {
            *g = gids.get(i).copied().unwrap_or(Gid::ZERO);
        }
    }

    /// The GID of the device's port (entry 0).
    pub fn gid(&self) -> Gid {
        self.port.gids.first().copied().unwrap_or(Gid::ZERO)
    }

    /// What the engine has counted.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Runs `f` on QP `qpn` with the rest of the engine at hand, then brings the timer
    /// index, the transmit scheduler and any CQ overrun up to date.
    fn with_qp<R>(
        &mut self,
        now: Instant,
        qpn: u32,
        f: impl FnOnce(&mut QueuePair, &mut Ctx<'_>) -> R,
    ) -> Option<R> {
        let mut overrun = Vec::new();
        let qp = self.qps.get_mut(&qpn)?;
        // Noting: what the QP looked like before, to note what changed.
        let before = self
            .notes
            .on()
            .then(|| (qp.state(), qp.timers.armed(), self.events.len()));
        let mut ctx = Ctx {
            now,
            mrs: &mut self.mrs,
            ahs: &self.ahs,
            cqs: &mut self.cqs,
            srqs: &mut self.srqs,
            events: &mut self.events,
            cq_events: &mut self.cq_events,
            armed_cqs: &mut self.armed_cqs,
            overrun: &mut overrun,
            counters: &mut self.counters,
            limits: &self.limits,
            port: &self.port,
            liveness: self.liveness.as_deref(),
            notes: &mut self.notes,
            send_queues: &mut self.send_queues,
        };
        let r = f(qp, &mut ctx);
        if let Some((state, armed, events)) = before {
            self.note_changes(now, qpn, state, armed, events);
        }
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return Some(r);
        };
        qp.timers.sync(qpn, &mut self.timers);
        if !qp.in_ready && qp.wants_transmit(&self.limits) {
            qp.in_ready = true;
            self.ready.push_back(qpn);
        }
        // Only this QP's entries can have gone stale: the front needs pruning only if
        // it is one of them and no longer exact (checked here, on the QP at hand,
        // rather than by a second lookup in `prune_timers`).
        if self
            .timers
            .first()
            .is_some_and(|(at, q, timer)| q == qpn && !qp.timers.is_exact(timer, at))
        {
            self.prune_timers();
        }
        if self.timers.wants_retain() {
            self.retain_timers();
        }
        for cq in overrun {
            self.cq_overrun(now, cq);
        }
        Some(r)
    }

    /// Keeps the first entry of the lazy timer index exact (module `timers`): drops
    /// the entries of stopped timers that reached the front, and moves those of timers
    /// pushed later to their real deadlines.
    fn prune_timers(&mut self) {
        while let Some((at, qpn, timer)) = self.timers.first() {
            match self.qps.get_mut(&qpn) {
                Some(qp) if qp.timers.is_exact(timer, at) => break,
                Some(qp) if qp.timers.tracks(timer, at) => {
                    self.timers.pop_first();
                    qp.timers.unindexed(timer);
                    qp.timers.sync(qpn, &mut self.timers);
                }
                _ => {
                    self.timers.pop_first();
                    self.timers.dropped_dead();
                }
            }
        }
    }

    /// Drops every timer index entry no QP tracks any more (see module `timers`).
    fn retain_timers(&mut self) {
        let qps = &self.qps;
        self.timers.retain(|&(at, qpn, timer)| {
            qps.get(&qpn).is_some_and(|qp| qp.timers.tracks(timer, at))
        });
        self.prune_timers();
    }

    /// IBTA 11.6.2: a CQ overrun puts every QP on the CQ into the error
    /// state with `QP_FATAL`.
    fn cq_overrun(&mut self, now: Instant, cq: CqId) {
        let mut victims: Vec<u32> = self
            .qps
            .values()
            .filter(|qp| qp.init.send_cq == cq || qp.init.recv_cq == cq)
            .filter(|qp| qp.state() != verbs_api::QpState::Reset)
            .map(|qp| qp.qpn)
            .collect();
        victims.sort_unstable();
        for qpn in victims {
            self.with_qp(now, qpn, |qp, ctx| {
                if qp.state() != verbs_api::QpState::Err {
                    ctx.qp_event(AsyncEventType::QpFatal, qp.qpn);
                    qp.enter_error(ctx);
                }
            });
        }
    }

    /// Notes what input changed on QP `qpn`: its state, timers armed that were not,
    /// async events queued (from index `events` on).
    fn note_changes(
        &mut self,
        now: Instant,
        qpn: u32,
        state: verbs_api::QpState,
        armed: [Option<Instant>; 2],
        events: usize,
    ) {
        let Some(qp) = self.qps.get(&qpn) else { return };
        for e in self.events.iter().skip(events) {
            self.notes.add(|| Note::Event(*e));
        }
        let to = qp.state();
        if to != state {
            self.notes.add(|| Note::State {
                qpn,
                from: state,
                to,
            });
        }
        let now_armed = qp.timers.armed();
        for (i, timer) in [TimerKind::AckTimeout, TimerKind::Rnr]
            .into_iter()
            .enumerate()
        {
            if let (None, Some(at)) = (armed[i], now_armed[i]) {
                self.notes.add(|| Note::TimerArmed {
                    qpn,
                    timer,
                    after: at.saturating_duration_since(now),
                });
            }
        }
    }

    fn qp_missing() -> Error {
        Error::InvalidArgument("no such QP")
    }

    // ---- protection domains and memory regions (manual 3.4) ----

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&mut self) -> Result<PdId> {
        if self.mrs.pd_count() >= self.limits.max_pd as usize {
            return Err(Error::NoMemory("max_pd reached"));
        }
        Ok(self.mrs.alloc_pd())
    }

    /// `ibv_dealloc_pd`: EBUSY while MRs, QPs or SRQs use it.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        self.mrs.dealloc_pd(pd)
    }

    /// `ibv_reg_mr` over `length` bytes of `buf` starting at `offset`.
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        buf: &MemBuf,
        offset: usize,
        length: usize,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        if self.mrs.mr_count() >= self.limits.max_mr as usize {
            return Err(Error::NoMemory("max_mr reached"));
        }
        self.mrs
            .reg_mr(pd, buf, offset, length, access, self.limits.max_mr_size)
    }

    /// `ibv_rereg_mr`: see the module `mr` for the rules. Returns the region with its
    /// new keys.
    pub fn rereg_mr(
        &mut self,
        lkey: u32,
        flags: ReregMrFlags,
        pd: Option<PdId>,
        range: Option<(&MemBuf, usize, usize)>,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        self.mrs
            .rereg_mr(lkey, flags, pd, range, access, self.limits.max_mr_size)
    }

    /// `ibv_dereg_mr`: EBUSY while memory windows are bound to the region.
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<()> {
        self.mrs.dereg_mr(lkey)
    }

    // ---- memory windows (manual 2.3.5; see the module `mw`) ----

    /// `ibv_alloc_mw`: EINVAL for an unknown PD. Returns the window's handle and its
    /// first R_Key.
    pub fn alloc_mw(&mut self, pd: PdId, mw_type: MwType) -> Result<(MwId, u32)> {
        if self.mrs.mws.len() >= self.limits.max_mw as usize {
            return Err(Error::NoMemory("max_mw reached"));
        }
        let (id, rkey) = self.mrs.alloc_mw(pd, mw_type)?;
        Ok((MwId(id), rkey))
    }

    /// `ibv_dealloc_mw`: EINVAL for an unknown window.
    pub fn dealloc_mw(&mut self, mw: MwId) -> Result<()> {
        self.mrs.dealloc_mw(mw.0)
    }

    /// The window's R_Key now (after the binds that have run) and its type.
    pub fn mw_info(&self, mw: MwId) -> Result<(u32, MwType)> {
        self.mrs
            .mw_info(mw.0)
            .ok_or(Error::InvalidArgument("no such memory window"))
    }

    /// `ibv_bind_mw` (type 1): posts a bind WQE on the send queue of `qpn` and returns
    /// the window's new R_Key, which it answers to once the bind has run. EINVAL for an
    /// unknown QP, a type 2 window (libibverbs' `ibv_bind_mw` refuses those itself), a
    /// UD QP or a QP not ready to send; ENOMEM when the send queue is full. A bad bind
    /// completes with `MW_BIND_ERR`, and so does the bind of a window that does not
    /// exist: as with kernel rxe, where libibverbs posts the bind for the R_Key the
    /// `ibv_mw` holds and the window is looked up when the WQE runs, the post succeeds
    /// and the completion reports the error (IBTA 10.6.7.2: a bind's errors are
    /// completion errors; google/rdma-unit-test's BindInvalidMw waits for one).
    pub fn bind_mw(&mut self, now: Instant, qpn: u32, mw: MwId, bind: &MwBind) -> Result<u32> {
        if !self.qps.contains_key(&qpn) {
            return Err(Self::qp_missing());
        }
        let new_rkey = match self.mrs.next_type1_rkey(mw.0) {
            Ok(rkey) => rkey,
            Err(_) if self.mrs.mw_info(mw.0).is_none() => mw.0.wrapping_shl(8),
            Err(e) => return Err(e),
        };
        self.with_qp(now, qpn, |qp, ctx| {
            qp.post_bind_verb(ctx, mw.0, new_rkey, bind)
        })
        .unwrap_or_else(|| Err(Self::qp_missing()))?;
        Ok(new_rkey)
    }

    // ---- completion queues (manual 3.5) ----

    /// `ibv_create_cq` with at least `cqe` entries: EINVAL for 0 or more than `max_cqe`.
    pub fn create_cq(&mut self, cqe: u32) -> Result<CqId> {
        if cqe == 0 || cqe > self.limits.max_cqe {
            return Err(Error::InvalidArgument("cqe must be 1..=max_cqe"));
        }
        if self.cqs.len() >= self.limits.max_cq as usize {
            return Err(Error::NoMemory("max_cq reached"));
        }
        self.next_cq += 1;
        self.cqs
            .insert(self.next_cq, cq::CompletionQueue::new(cqe as usize));
        Ok(CqId(self.next_cq))
    }

    /// `ibv_destroy_cq`: EBUSY while a QP uses it.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<()> {
        match self.cqs.get(&cq.0) {
            None => Err(Error::InvalidArgument("no such CQ")),
            Some(q) if q.users > 0 => Err(Error::Busy("CQ is used by a QP")),
            Some(q) => {
                if q.wakes_device() {
                    self.armed_cqs -= 1;
                }
                self.cqs.remove(&cq.0);
                self.cq_events.retain(|c| *c != cq);
                Ok(())
            }
        }
    }

    /// `ibv_resize_cq`: EINVAL if the completions it holds would not fit.
    pub fn resize_cq(&mut self, cq: CqId, cqe: u32) -> Result<()> {
        if cqe == 0 || cqe > self.limits.max_cqe {
            return Err(Error::InvalidArgument("cqe must be 1..=max_cqe"));
        }
        let q = self
            .cqs
            .get_mut(&cq.0)
            .ok_or(Error::InvalidArgument("no such CQ"))?;
        if q.resize(cqe as usize) {
            Ok(())
        } else {
            Err(Error::InvalidArgument(
                "CQ holds more completions than the new size",
            ))
        }
    }

    /// The capacity of a CQ.
    pub fn cq_capacity(&self, cq: CqId) -> Result<u32> {
        self.cqs
            .get(&cq.0)
            .map(|q| q.capacity() as u32)
            .ok_or(Error::InvalidArgument("no such CQ"))
    }

    /// `ibv_poll_cq`: moves up to `max` completions into `out`, oldest first.
    pub fn poll_cq(
        &mut self,
        cq: CqId,
        max: usize,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<usize> {
        let q = self
            .cqs
            .get_mut(&cq.0)
            .ok_or(Error::InvalidArgument("no such CQ"))?;
        Ok(q.poll(max, out))
    }

    /// Completions waiting on a CQ.
    pub fn cq_len(&self, cq: CqId) -> usize {
        self.cqs.get(&cq.0).map_or(0, |q| q.len())
    }

    /// `ibv_req_notify_cq`.
    pub fn req_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<()> {
        let q = self
            .cqs
            .get_mut(&cq.0)
            .ok_or(Error::InvalidArgument("no such CQ"))?;
        if !q.is_armed() && !q.gsi {
            self.armed_cqs += 1;
        }
        q.req_notify(solicited_only);
        Ok(())
    }

    /// Whether some CQ has a notification request pending: an application waits (or
    /// will) on a completion channel rather than polling. QP1's CQ does not count:
    /// the CM agent keeps it armed, and its MADs are received as fast by whoever
    /// receives (the application's polls, or the device thread within a nap).
    pub fn cq_armed(&self) -> bool {
        debug_assert_eq!(
            self.armed_cqs,
            self.cqs.values().filter(|q| q.wakes_device()).count()
        );
        self.armed_cqs > 0
    }

    /// Whether QP1 uses this CQ (the CM agent's; see [`Engine::cq_armed`]).
    pub fn cq_is_gsi(&self, cq: CqId) -> bool {
        self.cqs.get(&cq.0).is_some_and(|q| q.gsi)
    }

    /// The next CQ whose completion channel must be woken (one per arming).
    pub fn poll_cq_event(&mut self) -> Option<CqId> {
        self.cq_events.pop_front()
    }

    // ---- shared receive queues (manual 3.4.5-3.4.7, 3.6.2, 3.6.6) ----

    /// `ibv_create_srq` (manual 3.4.5): EINVAL for an unknown PD, `max_wr` 0 or over
    /// `max_srq_wr`, `max_sge` 0 or over `max_srq_sge`; ENOMEM at `max_srq` SRQs.
    /// `attr.srq_limit` is ignored ("irrelevant for ibv_create_srq"): the SRQ starts
    /// unarmed. The SRQ gets exactly `max_wr` and `max_sge` ([`Engine::query_srq`]).
    pub fn create_srq(&mut self, pd: PdId, attr: SrqAttr) -> Result<SrqId> {
        if !self.mrs.pd_exists(pd) {
            return Err(Error::InvalidArgument("no such protection domain"));
        }
        let q = srq::SharedReceiveQueue::new(pd, &attr, &self.limits)?;
        if self.srqs.len() >= self.limits.max_srq as usize {
            return Err(Error::NoMemory("max_srq reached"));
        }
        self.next_srq += 1;
        while self.srqs.contains_key(&self.next_srq) {
            self.next_srq = self.next_srq.wrapping_add(1);
        }
        self.srqs.insert(self.next_srq, q);
        self.mrs.pd_ref(pd, 1);
        Ok(SrqId(self.next_srq))
    }

    /// `ibv_modify_srq` (manual 3.4.6): all or nothing. `MAX_WR` resizes the SRQ (the
    /// emulator can always resize, as kernel rxe, which sets `IBV_DEVICE_SRQ_RESIZE`):
    /// EINVAL for 0, over `max_srq_wr`, fewer than the WQEs the SRQ holds, or below an
    /// armed limit. `LIMIT` arms the limit event with `srq_limit` > 0, or disarms it
    /// with 0: EINVAL above `max_wr`.
    pub fn modify_srq(&mut self, srq: SrqId, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        let limits = self.limits;
        self.srqs
            .get_mut(&srq.0)
            .ok_or(Error::InvalidArgument("no such SRQ"))?
            .modify(attr, mask, &limits)
    }

    /// `ibv_query_srq` (manual 3.6.2): `srq_limit` is 0 when the limit event is not
    /// (or no longer) armed.
    pub fn query_srq(&self, srq: SrqId) -> Result<SrqAttr> {
        self.srqs
            .get(&srq.0)
            .map(|q| q.attr)
            .ok_or(Error::InvalidArgument("no such SRQ"))
    }

    /// Receive WQEs waiting in an SRQ (not yet taken by a QP).
    pub fn srq_len(&self, srq: SrqId) -> usize {
        self.srqs.get(&srq.0).map_or(0, |q| q.wqes.len())
    }

    /// `ibv_destroy_srq` (manual 3.4.7): EBUSY while a QP is associated with it. WQEs
    /// still posted vanish without completions.
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<()> {
        match self.srqs.get(&srq.0) {
            None => Err(Error::InvalidArgument("no such SRQ")),
            Some(q) if q.users > 0 => Err(Error::Busy("SRQ is used by a QP")),
            Some(q) => {
                let (pd, xrc) = (q.pd, q.xrc);
                self.srqs.remove(&srq.0);
                self.mrs.pd_ref(pd, -1);
                if let Some((xrcd, cq)) = xrc {
                    self.xrcds.user(xrcd, -1);
                    if let Some(c) = self.cqs.get_mut(&cq.0) {
                        c.users -= 1;
                    }
                }
                Ok(())
            }
        }
    }

    // ---- XRC (module `xrc`; manual 3.4.8-3.4.14) ----

    /// `ibv_open_xrcd` (see [`verbs_api::Device::open_xrcd`]).
    pub fn open_xrcd(&mut self, open: &XrcdOpen) -> Result<XrcdId> {
        self.xrcds.open(open)
    }

    /// `ibv_close_xrcd`: the last reference destroys the domain; EBUSY while an XRC SRQ
    /// or XRC receive QP belongs to it.
    pub fn close_xrcd(&mut self, xrcd: XrcdId) -> Result<()> {
        self.xrcds.close(xrcd)
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an SRQ of `pd` in domain `xrcd` whose
    /// receives complete on `cq`. EINVAL for an unknown PD, domain or CQ and the sizes
    /// [`Engine::create_srq`] refuses; ENOMEM at `max_srq`.
    pub fn create_xrc_srq(
        &mut self,
        pd: PdId,
        xrcd: XrcdId,
        cq: CqId,
        attr: SrqAttr,
    ) -> Result<SrqId> {
        if !self.xrcds.exists(xrcd) {
            return Err(Error::InvalidArgument("no such XRC domain"));
        }
        if !self.cqs.contains_key(&cq.0) {
            return Err(Error::InvalidArgument("no such CQ"));
        }
        let srq = self.create_srq(pd, attr)?;
        if let Some(q) = self.srqs.get_mut(&srq.0) {
            q.xrc = Some((xrcd, cq));
        }
        self.xrcds.user(xrcd, 1);
        if let Some(c) = self.cqs.get_mut(&cq.0) {
            c.users += 1;
        }
        Ok(srq)
    }

    /// `ibv_get_srq_num`: the XRC SRQ number initiators address (the SRQ's handle,
    /// which fits the XRCETH's 24 bits). EINVAL for an SRQ that is not an XRC SRQ.
    pub fn get_srq_num(&self, srq: SrqId) -> Result<u32> {
        match self.srqs.get(&srq.0) {
            Some(q) if q.xrc.is_some() => Ok(srq.0 & 0x00FF_FFFF),
            Some(_) => Err(Error::InvalidArgument("not an XRC SRQ")),
            None => Err(Error::InvalidArgument("no such SRQ")),
        }
    }

    /// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV` and an XRC domain: an XRC receive QP
    /// (no queues, PD or CQs; module `xrc`), held once by its creator. EINVAL for an
    /// unknown domain; ENOMEM at `max_qp`.
    pub fn create_xrc_recv_qp(&mut self, xrcd: XrcdId) -> Result<u32> {
        if !self.xrcds.exists(xrcd) {
            return Err(Error::InvalidArgument("no such XRC domain"));
        }
        if self.qps.len() >= self.limits.max_qp as usize {
            return Err(Error::NoMemory("max_qp reached"));
        }
        let mut qpn = self.next_qpn;
        while self.qps.contains_key(&qpn) {
            qpn = next_qpn(self.qpn_block, qpn);
        }
        self.next_qpn = next_qpn(self.qpn_block, qpn);
        // No PD, CQs or SRQ until a request names its XRC SRQ (`responder`); the
        // handles here name nothing (the engine numbers PDs and CQs from 1).
        let init = QpInitAttr::new(
            PdId(0),
            CqId(0),
            QpType::XrcRecv,
            verbs_api::QpCap::default(),
        );
        let mut qp = QueuePair::new(qpn, init);
        qp.xrcd = Some(xrcd);
        qp.holders = 1;
        self.qps.insert(qpn, qp);
        self.xrcds.user(xrcd, 1);
        Ok(qpn)
    }

    /// `ibv_open_qp`: one more hold on XRC receive QP `qpn` of domain `xrcd`. EINVAL
    /// when `qpn` is not an XRC receive QP of that domain.
    pub fn open_qp(&mut self, xrcd: XrcdId, qpn: u32) -> Result<()> {
        match self.qps.get_mut(&qpn) {
            Some(qp) if qp.xrcd == Some(xrcd) && qp.init.qp_type == QpType::XrcRecv => {
                qp.holders += 1;
                Ok(())
            }
            _ => Err(Error::InvalidArgument(
                "no XRC receive QP with that number in the XRC domain",
            )),
        }
    }

    /// `ibv_post_srq_recv` (manual 3.6.6): on failure, `PostError::index` is the first
    /// WR not posted (EINVAL for more SGEs than `max_sge`, ENOMEM when the SRQ is full).
    pub fn post_srq_recv(
        &mut self,
        now: Instant,
        srq: SrqId,
        wrs: &[RecvWr],
    ) -> std::result::Result<(), PostError> {
        // Posting needs no clock: the parameter keeps the verbs' shape uniform.
        let _ = now;
        let q = self.srqs.get_mut(&srq.0).ok_or(PostError {
            index: 0,
            error: Error::InvalidArgument("no such SRQ"),
        })?;
        let r = q.post(wrs);
        // Noted after the post, the WRs it took only: posting to an SRQ makes nothing
        // that a note would have to follow.
        let taken = r.as_ref().err().map_or(wrs.len(), |e| e.index);
        if self.notes.on() {
            for w in &wrs[..taken] {
                self.notes.add(|| Note::PostSrqRecv {
                    srq: srq.0,
                    wr_id: w.wr_id,
                    len: w.total_len(),
                });
            }
        }
        r
    }

    // ---- queue pairs (manual 3.5) ----

    /// `ibv_create_qp`. Returns the QP number. EINVAL for an unknown PD, CQ or SRQ, or
    /// capacities over the device limits (an SRQ of another PD is fine); EOPNOTSUPP for QP types
    /// not implemented yet; `QpType::Driver` makes the device's QP1, the GSI QP (see
    /// the module `gsi`; EBUSY if it exists). With an SRQ the receive capacities are
    /// ignored and set to 0 (manual 3.4.1: "max_recv_wr ... ignored if srq is not
    /// NULL"; kernel rxe reports 0 too).
    pub fn create_qp(&mut self, mut init: QpInitAttr) -> Result<u32> {
        if !self.mrs.pd_exists(init.pd) {
            return Err(Error::InvalidArgument("no such protection domain"));
        }
        if !self.cqs.contains_key(&init.send_cq.0) || !self.cqs.contains_key(&init.recv_cq.0) {
            return Err(Error::InvalidArgument("no such CQ"));
        }
        if let Some(srq) = init.srq {
            // The SRQ may belong to another PD than the QP (IBTA 10.2.9 associates an
            // SRQ with a PD of its own and asks nothing of the QPs' PDs; kernel rxe and
            // mlx5 accept it, google/rdma-unit-test's PdSrqTest relies on it): its
            // receive WQEs' L_Keys are checked in the SRQ's PD (`QueuePair::recv_pd`).
            if !self.srqs.contains_key(&srq.0) {
                return Err(Error::InvalidArgument("no such SRQ"));
            }
            init.cap.max_recv_wr = 0;
            init.cap.max_recv_sge = 0;
        }
        let gsi = init.qp_type == QpType::Driver;
        if gsi {
            if self.qps.contains_key(&GSI_QPN) {
                return Err(Error::Busy("the device has its QP1 already"));
            }
            init.qp_type = QpType::Ud;
        }
        match init.qp_type {
            QpType::Rc | QpType::Uc | QpType::Ud => {}
            QpType::XrcSend => {
                // An XRC initiator has a send queue only (module `xrc`): no receive
                // queue, SRQ or receive CQ of its own.
                if init.srq.is_some() {
                    return Err(Error::InvalidArgument("an XRC send QP has no SRQ"));
                }
                init.recv_cq = init.send_cq;
                init.cap.max_recv_wr = 0;
                init.cap.max_recv_sge = 0;
            }
            QpType::XrcRecv => {
                return Err(Error::InvalidArgument(
                    "an XRC receive QP needs an XRC domain (create_xrc_recv_qp)",
                ))
            }
            _ => return Err(Error::Unsupported("QP type not supported by the emulator")),
        }
        let l = &self.limits;
        let c = &init.cap;
        if c.max_send_wr > l.max_qp_wr
            || c.max_recv_wr > l.max_qp_wr
            || c.max_send_sge > l.max_sge
            || c.max_recv_sge > l.max_sge
            || c.max_inline_data > l.max_inline_data
        {
            return Err(Error::InvalidArgument(
                "QP capabilities over the device limits",
            ));
        }
        if self.qps.len() >= l.max_qp as usize {
            return Err(Error::NoMemory("max_qp reached"));
        }
        let qpn = if gsi {
            GSI_QPN
        } else {
            let mut qpn = self.next_qpn;
            while self.qps.contains_key(&qpn) {
                qpn = next_qpn(self.qpn_block, qpn);
            }
            self.next_qpn = next_qpn(self.qpn_block, qpn);
            qpn
        };
        self.mrs.pd_ref(init.pd, 1);
        for cq in [init.send_cq, init.recv_cq] {
            if let Some(q) = self.cqs.get_mut(&cq.0) {
                q.users += 1;
                if gsi && !q.gsi {
                    if q.wakes_device() {
                        self.armed_cqs -= 1;
                    }
                    q.gsi = true;
                }
            }
        }
        if let Some(q) = init.srq.and_then(|s| self.srqs.get_mut(&s.0)) {
            q.users += 1;
        }
        let mut qp = QueuePair::new(qpn, init);
        if init.qp_type == QpType::Ud {
            // A UD QP sends with the port's active MTU (IBTA 9.8; no path attributes).
            qp.attr.path_mtu = self.port.link.active_mtu;
        }
        if gsi {
            qp.attr.qkey = GSI_QKEY;
        } else if init.qp_type == QpType::Ud {
            self.ud_qps += 1;
        }
        self.qps.insert(qpn, qp);
        Ok(qpn)
    }

    /// Whether the device has UD QPs (QP1 aside): only their receives show the IP
    /// header's TOS byte (in the GRH), so a link need only read it while there are
    /// some ([`Engine::handle_datagram_tos`]).
    pub fn has_ud_qps(&self) -> bool {
        self.ud_qps > 0
    }

    /// `ibv_destroy_qp`. Outstanding work requests vanish without completions, as in
    /// libibverbs. EBUSY while the QP is attached to a multicast group (the IB core
    /// counts attachments in the QP's `usecnt`).
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        if !self.qps.contains_key(&qpn) {
            return Err(Self::qp_missing());
        }
        if self.mcast.is_attached(qpn) {
            return Err(Error::Busy("the QP is attached to a multicast group"));
        }
        if let Some(qp) = self.qps.get_mut(&qpn) {
            // An XRC receive QP lives while a holder has not destroyed its handle.
            if qp.holders > 1 {
                qp.holders -= 1;
                return Ok(());
            }
        }
        let mut qp = self.qps.remove(&qpn).ok_or_else(Self::qp_missing)?;
        if qp.init.qp_type == QpType::Ud && qpn != GSI_QPN {
            self.ud_qps -= 1;
        }
        qp.timers.unindex(&mut self.timers);
        self.prune_timers();
        if self.timers.wants_retain() {
            self.retain_timers();
        }
        self.ready.retain(|q| *q != qpn);
        if let Some(xrcd) = qp.xrcd {
            // An XRC receive QP holds no PD, CQ or SRQ (module `xrc`).
            self.xrcds.user(xrcd, -1);
            return Ok(());
        }
        self.mrs.pd_ref(qp.init.pd, -1);
        for cq in [qp.init.send_cq, qp.init.recv_cq] {
            if let Some(q) = self.cqs.get_mut(&cq.0) {
                q.users -= 1;
            }
        }
        if let Some(q) = qp.init.srq.and_then(|s| self.srqs.get_mut(&s.0)) {
            q.users -= 1;
        }
        Ok(())
    }

    /// `ibv_modify_qp` (see the module `modify` for the rules).
    pub fn modify_qp(
        &mut self,
        now: Instant,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<()> {
        let r = self.with_qp(now, qpn, |qp, ctx| qp.modify(ctx, attr, mask));
        if qpn == GSI_QPN {
            // IBTA 13.5: QP1's Q_Key is the well-known one, whatever is asked.
            if let Some(qp) = self.qps.get_mut(&qpn) {
                qp.attr.qkey = GSI_QKEY;
            }
        }
        r.unwrap_or_else(|| Err(Self::qp_missing()))
    }

    /// `ibv_query_qp`: the current attributes and the creation attributes.
    pub fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInitAttr)> {
        let qp = self.qps.get(&qpn).ok_or_else(Self::qp_missing)?;
        let mut attr = qp.attr;
        attr.cur_qp_state = attr.qp_state;
        Ok((attr, qp.init))
    }

    /// `ibv_post_send`: on failure, `PostError::index` is the first WR not posted.
    pub fn post_send(
        &mut self,
        now: Instant,
        qpn: u32,
        wrs: &[SendWr],
    ) -> std::result::Result<(), PostError> {
        self.note_posts(
            qpn,
            wrs.iter()
                .map(|w| (w.wr_id, Some(w.op.opcode()), w.total_len())),
        );
        self.with_qp(now, qpn, |qp, ctx| qp.post_send(ctx, wrs))
            .unwrap_or_else(|| {
                Err(PostError {
                    index: 0,
                    error: Self::qp_missing(),
                })
            })
    }

    /// Notes the WRs of a post (`(wr_id, send opcode or None for a receive, bytes)`).
    fn note_posts(&mut self, qpn: u32, wrs: impl Iterator<Item = (u64, Option<WrOpcode>, u64)>) {
        if !self.notes.on() {
            return;
        }
        for (wr_id, op, len) in wrs {
            self.notes.add(|| match op {
                Some(opcode) => Note::PostSend {
                    qpn,
                    wr_id,
                    opcode,
                    len,
                },
                None => Note::PostRecv { qpn, wr_id, len },
            });
        }
    }

    /// `ibv_post_recv`: on failure, `PostError::index` is the first WR not posted.
    pub fn post_recv(
        &mut self,
        now: Instant,
        qpn: u32,
        wrs: &[RecvWr],
    ) -> std::result::Result<(), PostError> {
        self.note_posts(qpn, wrs.iter().map(|w| (w.wr_id, None, w.total_len())));
        self.with_qp(now, qpn, |qp, ctx| qp.post_recv(ctx, wrs))
            .unwrap_or_else(|| {
                Err(PostError {
                    index: 0,
                    error: Self::qp_missing(),
                })
            })
    }

    // ---- address handles and multicast (manual 3.4.15-3.4.16, 3.6.11-3.6.14) ----

    /// `ibv_create_ah`: EINVAL for an unknown PD, an address vector without a GRH
    /// (RoCE needs one), a source GID index outside the table or a port other than 1.
    pub fn create_ah(&mut self, pd: PdId, attr: &AhAttr) -> Result<AhId> {
        if self.ahs.len() >= self.limits.max_ah as usize {
            return Err(Error::NoMemory("max_ah reached"));
        }
        if !self.port.gid_valid(attr.grh.sgid_index)
            && u32::from(attr.grh.sgid_index) < self.limits.gid_tbl_len
        {
            return Err(empty_sgid());
        }
        self.ahs.create(&mut self.mrs, &self.limits, pd, attr)
    }

    /// `ibv_destroy_ah`: EINVAL for an unknown handle. WRs already posted with it keep
    /// their copy of the address.
    pub fn destroy_ah(&mut self, ah: AhId) -> Result<()> {
        self.ahs.destroy(&mut self.mrs, ah)
    }

    /// The address vector of an AH (`ibv_query_ah`-like; for tests and drivers).
    pub fn ah_attr(&self, ah: AhId) -> Result<AhAttr> {
        self.ahs
            .get(ah)
            .map(|h| h.attr)
            .ok_or(Error::InvalidArgument("no such address handle"))
    }

    /// `ibv_create_ah_from_wc` (manual 3.6.12): an AH that answers the sender of the UD
    /// receive completion `wc`, whose buffer began with `grh`. See
    /// [`init_ah_from_wc`]; the GID table is the device's one GID.
    pub fn create_ah_from_wc(&mut self, pd: PdId, wc: &WorkCompletion, grh: &[u8]) -> Result<AhId> {
        let attr = init_ah_from_wc(1, wc, grh, &self.port.gids)?;
        self.create_ah(pd, &attr)
    }

    /// `ibv_attach_mcast` (manual 3.6.13): the UD QP receives what is sent to `gid`
    /// (`lid` is not used on RoCE). EINVAL for an unknown or non-UD QP or a GID that
    /// is not multicast.
    pub fn attach_mcast(&mut self, qpn: u32, gid: &Gid, lid: u16) -> Result<()> {
        let _ = lid;
        let qp = self.qps.get(&qpn).ok_or_else(Self::qp_missing)?;
        self.mcast.attach(qp.init.qp_type, qpn, gid, &self.limits)
    }

    /// `ibv_detach_mcast` (manual 3.6.14): EINVAL when the QP is not attached to `gid`.
    pub fn detach_mcast(&mut self, qpn: u32, gid: &Gid, lid: u16) -> Result<()> {
        let _ = lid;
        if !self.qps.contains_key(&qpn) {
            return Err(Self::qp_missing());
        }
        self.mcast.detach(qpn, gid)
    }

    /// Whether some QP of the device is attached to `gid` (a driver joins the group on
    /// its link while one is).
    pub fn has_mcast_group(&self, gid: &Gid) -> bool {
        self.mcast.has_group(gid)
    }

    /// The multicast groups `qpn` is attached to.
    pub fn mcast_groups_of(&self, qpn: u32) -> Vec<Gid> {
        self.mcast.groups_of(qpn)
    }

    /// The multicast GIDs some QP of the device is attached to, in order.
    pub fn mcast_groups(&self) -> Vec<Gid> {
        let mut v: Vec<Gid> = self.mcast.groups().copied().collect();
        v.sort();
        v
    }

    /// The next asynchronous event (`ibv_get_async_event`).
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    // ---- the transport ----

    /// A RoCEv2 UDP payload (BTH through ICRC) arrived from `src`, addressed to this
    /// device's GID ([`Engine::set_gid`]). See [`Engine::handle_datagram_to`].
    pub fn handle_datagram(&mut self, now: Instant, src: Gid, data: &[u8]) {
        let dst = self.gid();
        self.handle_datagram_to(now, src, dst, data);
    }

    /// A RoCEv2 UDP payload (BTH through ICRC) arrived from `src`, addressed to `dst`
    /// (the device's GID, or a multicast GID), from a link that does not tell the IP
    /// header's TOS byte (taken as 0). See [`Engine::handle_datagram_tos`].
    pub fn handle_datagram_to(&mut self, now: Instant, src: Gid, dst: Gid, data: &[u8]) {
        self.handle_datagram_tos(now, src, dst, 0, data);
    }

    /// A RoCEv2 UDP payload (BTH through ICRC) arrived from `src`, addressed to `dst`
    /// (the device's GID, or a multicast GID), in an IP packet whose TOS byte (IPv6:
    /// traffic class) was `tos`; a UD receive buffer's GRH shows it (IBTA 8.3 TClass,
    /// Annex A17.4.5.1). The caller has checked the ICRC.
    /// Malformed packets, packets for unknown QPs and packets the QP cannot take are
    /// dropped and counted; none of them disturbs a live QP. Packets are routed by the
    /// BTH destination QP; a UD packet to QP 0xFFFFFF and a multicast `dst` goes to
    /// every QP attached to that group. Returns whether a QP took the packet (it passed
    /// the port, transport, P_Key and address checks; the QP's own PSN and key checks
    /// may still refuse it).
    pub fn handle_datagram_tos(
        &mut self,
        now: Instant,
        src: Gid,
        dst: Gid,
        tos: u8,
        data: &[u8],
    ) -> bool {
        self.counters.rx_packets += 1;
        // A port that is not ACTIVE, or a failed device, receives nothing (IBTA 7.2).
        if self.fatal || !self.port.is_active() {
            self.counters.rx_port_down += 1;
            return false;
        }
        let Ok((repr, payload)) = PacketRepr::parse(data) else {
            self.counters.rx_malformed += 1;
            return false;
        };
        if repr.bth.opcode.transport() == Transport::Ud {
            return self.handle_ud(now, (src, dst, tos), &repr, payload, data.len());
        }
        let qpn = repr.bth.dest_qp;
        let Some(qp) = self.qps.get(&qpn) else {
            self.counters.rx_unknown_qp += 1;
            return false;
        };
        let request = repr.bth.opcode.is_request();
        // XRC (module `xrc`): the initiator takes responses only, the target requests.
        let transport_ok = match (qp.init.qp_type, repr.bth.opcode.transport()) {
            (QpType::Rc, Transport::Rc)
            | (QpType::Uc, Transport::Uc)
            | (QpType::Ud, Transport::Ud) => true,
            (QpType::XrcSend, Transport::Xrc) => !request,
            (QpType::XrcRecv, Transport::Xrc) => request,
            _ => false,
        };
        if !self.port.admits(qpn, qp.attr.pkey_index, repr.bth.pkey) {
            self.counters.bad_pkey += 1;
            return false;
        }
        // A connected QP takes packets only from its peer (kernel rxe's check_addr),
        // over its path or its armed alternate path (IBTA 17.2.8, module `apm`).
        let from_primary = qp.init.qp_type == QpType::Ud || qp.attr.ah_attr.grh.dgid == src;
        let from_alternate = !from_primary && qp.came_over_alternate(&src);
        if !transport_ok || !(from_primary || from_alternate) {
            self.counters.rx_dropped += 1;
            return false;
        }
        self.with_qp(now, qpn, |qp, ctx| {
            if from_alternate && !qp.migrate(ctx) {
                ctx.counters.rx_dropped += 1;
                return;
            }
            if request {
                qp.handle_request(ctx, &repr, payload);
            } else {
                qp.handle_response(ctx, &repr, payload);
            }
        });
        true
    }

    /// Routes a UD packet to its QP, or to every member of its multicast group, each
    /// with the GRH its receive buffer gets first.
    fn handle_ud(
        &mut self,
        now: Instant,
        (src, dst, tos): (Gid, Gid, u8),
        repr: &PacketRepr,
        payload: &[u8],
        len: usize,
    ) -> bool {
        let qpn = repr.bth.dest_qp;
        let targets = if qpn == ud::MULTICAST_QPN {
            if !is_multicast(&dst) {
                self.counters.rx_dropped += 1;
                return false;
            }
            self.mcast.members(&dst)
        } else {
            vec![qpn]
        };
        if targets.is_empty() {
            self.counters.rx_unknown_qp += 1;
            return false;
        }
        let grh = ah::grh_bytes(&src, &dst, tos, len);
        let mut taken = false;
        for qpn in targets {
            match self.qps.get(&qpn) {
                None => self.counters.rx_unknown_qp += 1,
                Some(qp) if qp.init.qp_type != QpType::Ud => self.counters.rx_dropped += 1,
                Some(qp) if !self.port.admits(qpn, qp.attr.pkey_index, repr.bth.pkey) => {
                    self.counters.bad_pkey += 1
                }
                Some(_) => {
                    taken = true;
                    self.with_qp(now, qpn, |qp, ctx| {
                        qp.handle_ud_request(ctx, repr, payload, &grh)
                    });
                }
            }
        }
        taken
    }

    /// The next packet to send, written into `buf` (at least [`MAX_PACKET`] bytes).
    ///
    /// While the port is not ACTIVE the QPs go on producing packets, which are lost
    /// as on a dead link (counted in `tx_port_down`): RC retries run out as they
    /// would with the cable pulled (manual 6.1.11). A failed device sends nothing.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if self.fatal {
            self.ready.clear();
            return None;
        }
        while let Some(qpn) = self.ready.pop_front() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            qp.in_ready = false;
            let t = self
                .with_qp(now, qpn, |qp, ctx| {
                    let pkey = ctx.port.pkey_at(qp.attr.pkey_index);
                    let src = ctx.port.source_gid(qp.attr.ah_attr.grh.sgid_index);
                    match qp.next_response(pkey, src, buf) {
                        Some(t) => Some(t),
                        None => qp.next_request(ctx, buf),
                    }
                })
                .flatten();
            if let Some(t) = t {
                if !self.port.is_active() {
                    self.counters.tx_port_down += 1;
                    continue;
                }
                self.counters.tx_packets += 1;
                return Some(t);
            }
        }
        None
    }

    /// When [`Engine::handle_timeout`] must next be called, if a timer is armed.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|e| e.0)
    }

    /// Runs every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((at, qpn, timer)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            let Some(qp) = self.qps.get_mut(&qpn) else {
                self.timers.dropped_dead();
                continue;
            };
            if qp.timers.tracks(timer, at) {
                qp.timers.unindexed(timer);
            } else {
                self.timers.dropped_dead();
            }
            // Most entries that come due stand for a timer stopped or pushed later
            // since (an ACK timeout stops when its ACKs come, and restarts on each,
            // IBTA 9.7.6.1.3): the timer is indexed again at its deadline, if it is
            // armed, and nothing else of the QP is read. With many QPs taking turns,
            // nearly every QP's entry comes due this way once a turn, and the rest of
            // the QP (its queues, the scheduler's checks) would be out of cache.
            if !qp.timers.is_due(timer, now) {
                qp.timers.sync(qpn, &mut self.timers);
                continue;
            }
            self.with_qp(now, qpn, |qp, ctx| {
                if qp.timers.take_expired(timer, now) {
                    let timer_kind = match timer {
                        Timer::Retransmit => TimerKind::AckTimeout,
                        Timer::Rnr => TimerKind::Rnr,
                    };
                    ctx.notes.add(|| Note::TimerFired {
                        qpn,
                        timer: timer_kind,
                    });
                    match timer {
                        Timer::Retransmit => qp.on_retransmit_timeout(ctx),
                        Timer::Rnr => qp.on_rnr_timeout(ctx),
                    }
                }
            });
        }
        if self.timers.wants_retain() {
            self.retain_timers();
        }
        // Popping may have left a stale entry in front.
        self.prune_timers();
    }
}

/// The QPNs of `block`: its whole range, less the special QPs (0, 1 and the ones below
/// [`FIRST_QPN`]) in the first block and the multicast QPN (0xFFFFFF) in the last.
fn qpn_block_range(block: u8) -> (u32, u32) {
    let lo = (u32::from(block) << QPN_BLOCK_SHIFT).max(FIRST_QPN);
    let hi = ((u32::from(block) + 1) << QPN_BLOCK_SHIFT).min(0x00FF_FFFF);
    (lo, hi)
}

/// The QPN after `qpn`, wrapping within `block`.
fn next_qpn(block: u8, qpn: u32) -> u32 {
    let (lo, hi) = qpn_block_range(block);
    if qpn + 1 >= hi {
        lo
    } else {
        qpn + 1
    }
}

/// ENODATA: a source GID index that names an empty GID table entry, as the kernel
/// refuses it in `ibv_create_ah` and `ibv_modify_qp` (`rdma_get_gid_attr`).
pub(crate) fn empty_sgid() -> verbs_api::Error {
    verbs_api::Error::Os {
        errno: verbs_api::errno::ENODATA,
        context: "sgid_index names an empty GID table entry",
    }
}
