//! The fabric: an in-memory network with virtual time that emulated devices attach
//! to through [`Link`], so code written against `verbs_api::Device` runs on it
//! unchanged.
//!
//! # How time moves
//! Time stands still while the program works. When the program finds nothing to do
//! (an empty `poll_cq`, a wait with nothing queued) the device receives
//! ([`Link::receive`]), and the fabric takes one step: it delivers the next packet or fires the next
//! device timer, whichever is due first (packets first on a tie), and jumps the clock
//! to it. A single-threaded program therefore runs deterministically: same seed, same
//! program, same packets at the same virtual times.
//!
//! # What happens to a packet
//! A device's [`Link::send`] only enqueues (it runs under the device's engine lock).
//! In order: no device has the address -> dropped; the two devices are partitioned ->
//! dropped; the direction is held -> kept until released; the [rules](crate::rules)
//! (the first that fires decides, and may replace the random faults below); the MTU
//! (oversize dropped); the transmit queue at the line rate (tail drop); then seeded
//! random loss, corruption (a flipped bit the receiver's ICRC check catches) and
//! duplication; then latency plus jitter, per copy (so packets may overtake).
//!
//! # Locks
//! The fabric never holds its own lock while it calls into a device (delivering a
//! packet, firing a timer, asking for the next timer), and a device calls the fabric
//! (send) with its engine lock held: the lock order is device, then fabric.

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_core::engine::MAX_PACKET;
use emu_core::nic::{
    DeviceDriver, EmuConfig, EmuDevice, Inbound, Link, Receiver, Route, Transmit, ROCE_PORT,
};
use emu_wire::{write_icrc, AethRepr, Ipv4Endpoints, Opcode, PacketRepr, Syndrome};
use parking_lot::{Mutex, RecursiveRwLock};

use crate::fault::{Direction, LinkConfig};
use crate::queue::{EventQueue, Keyed};
use crate::rules::{Action, PacketInfo, Rule};
use crate::trace::{Cause, Fate, HostNote, Label, PacketRecord, Trace, TraceDevice, TraceMode};
use emu_core::engine::Note;
use emu_core::nic::NoteSink;

/// What a fabric delivers packets to and fires timers of: an emulated device (through
/// its `DeviceDriver`), or anything else a test attaches with
/// [`Fabric::add_station`].
pub trait Station: Send + Sync {
    /// A packet (RoCEv2 UDP payload, BTH through ICRC) from `src` to `dst` (the
    /// station's address, or a multicast group it joined) arrived.
    fn deliver(&self, src: Ipv4Addr, dst: Ipv4Addr, packet: &[u8]);
    /// Packets that arrived at the same instant, in order: one call, so a device takes
    /// them under one lock and answers once (ACK coalescing, as with `recvmmsg` on UDP).
    fn deliver_batch(&self, batch: &[(Ipv4Addr, Ipv4Addr, &[u8])]) {
        for &(src, dst, packet) in batch {
            self.deliver(src, dst, packet);
        }
    }
    /// [`Station::deliver`] with the IP header's TOS byte the packet was sent with
    /// (its traffic class, IBTA A17.4.5.2); a station that has no use for it takes
    /// the packet through `deliver`.
    fn deliver_tos(&self, src: Ipv4Addr, dst: Ipv4Addr, tos: u8, packet: &[u8]) {
        let _ = tos;
        self.deliver(src, dst, packet);
    }
    /// [`Station::deliver_batch`] with each packet's TOS byte (see
    /// [`Station::deliver_tos`]).
    fn deliver_batch_tos(&self, batch: &[(Ipv4Addr, Ipv4Addr, u8, &[u8])]) {
        let plain: Vec<(Ipv4Addr, Ipv4Addr, &[u8])> =
            batch.iter().map(|&(s, d, _, p)| (s, d, p)).collect();
        self.deliver_batch(&plain);
    }
    /// When the station's next timer is due.
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
    /// Fires the timers due now (at the fabric's `now`).
    fn handle_timeout(&self) {}
}

/// Something on the fabric's clock but not on its network: the fabric fires its timers
/// at its `now`, in order with the stations' timers and its deliveries (a connection
/// manager on the fabric, `emu-cm`'s `EmuCm::on_fabric`). Attached with
/// [`Fabric::add_timer`].
pub trait Timer: Send + Sync {
    /// When the timer is next due (`None`: not armed).
    fn poll_timeout(&self) -> Option<Instant>;
    /// Fires what is due now (at the fabric's `now`).
    fn handle_timeout(&self);
}

struct Device(DeviceDriver);

impl Station for Device {
    fn deliver(&self, src: Ipv4Addr, dst: Ipv4Addr, packet: &[u8]) {
        self.0.handle_datagram_to(src, dst, packet);
    }
    fn deliver_batch(&self, batch: &[(Ipv4Addr, Ipv4Addr, &[u8])]) {
        self.0.handle_datagrams(batch);
    }
    fn deliver_tos(&self, src: Ipv4Addr, dst: Ipv4Addr, tos: u8, packet: &[u8]) {
        self.0.handle_datagram_tos(src, dst, tos, packet);
    }
    fn deliver_batch_tos(&self, batch: &[(Ipv4Addr, Ipv4Addr, u8, &[u8])]) {
        self.0.handle_datagrams_tos(batch);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.0.poll_timeout()
    }
    fn handle_timeout(&self) {
        self.0.handle_timeout();
    }
}

/// A station that is not attached yet (or failed to open): it drops everything.
struct Nothing;

impl Station for Nothing {
    fn deliver(&self, _: Ipv4Addr, _: Ipv4Addr, _: &[u8]) {}
}

/// A fabric call named a device the fabric does not have, or an address in use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FabricError {
    /// No device of that name.
    UnknownDevice(String),
    /// Another device has that address or name.
    InUse(String),
}

impl fmt::Display for FabricError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FabricError::UnknownDevice(n) => write!(f, "no device named {n:?}"),
            FabricError::InUse(n) => write!(f, "{n} is already on the fabric"),
        }
    }
}

impl std::error::Error for FabricError {}

/// Packet counts since the fabric was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Packets devices sent (and rules injected).
    pub sent: u64,
    /// Copies delivered to a device.
    pub delivered: u64,
    /// Packets dropped, for any cause.
    pub dropped: u64,
    /// Packets corrupted in flight.
    pub corrupted: u64,
    /// Extra copies made.
    pub duplicated: u64,
}

struct Event {
    at: Duration,
    seq: u64,
    src: usize,
    dst: usize,
    record: Option<usize>,
    pkt: Pkt,
    /// The multicast group it was sent to, if it was.
    group: Option<Ipv4Addr>,
}

impl Keyed for Event {
    fn key(&self) -> (Duration, u64) {
        (self.at, self.seq)
    }
}

/// Packet buffers kept for reuse: a step returns the one it delivered, a send (or a
/// device writing a packet, [`Link::lend`]) takes one. Per thread, so returning a
/// buffer takes no lock. Enough for the packets in flight of a 64 KiB WRITE bench
/// (128 messages of 16 packets); each is [`MAX_PACKET`] long, so a small packet
/// written into a reused buffer zeroes nothing.
const POOL_MAX: usize = 4096;

thread_local! {
    static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A packet in the fabric: its bytes at the start of a pooled buffer the fabric owns.
/// A device lends nothing back: it writes into a pool buffer and gives it to the
/// fabric ([`Link::send_owned`]), so the only copies the fabric makes are the
/// duplicates it creates (a duplicated packet, a multicast group's other members).
pub(crate) struct Pkt {
    buf: Vec<u8>,
    len: usize,
    /// The TOS byte of the IP header it travels in (the sender's traffic class).
    tos: u8,
}

impl fmt::Debug for Pkt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Pkt").field(&self.bytes()).finish()
    }
}

impl Pkt {
    /// A pool buffer at least [`MAX_PACKET`] long (a new one comes zeroed from the
    /// allocator, which need not write fresh pages).
    fn buffer() -> Vec<u8> {
        POOL.with_borrow_mut(Vec::pop)
            .unwrap_or_else(|| vec![0; MAX_PACKET])
    }

    /// A copy of `bytes` in a pool buffer, sent with TOS `tos`.
    fn copy_of(bytes: &[u8], tos: u8) -> Pkt {
        let mut buf = Pkt::buffer();
        if buf.len() < bytes.len() {
            buf.resize(bytes.len(), 0);
        }
        buf[..bytes.len()].copy_from_slice(bytes);
        Pkt {
            buf,
            len: bytes.len(),
            tos,
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Gives the buffer back to this thread's pool.
    fn recycle(self) {
        POOL.with_borrow_mut(|p| {
            if p.len() < POOL_MAX {
                p.push(self.buf);
            }
        });
    }
}

struct Node {
    name: String,
    ip: Ipv4Addr,
    /// IPv4 multicast groups its QPs joined.
    groups: Vec<Ipv4Addr>,
}

/// How a packet crosses the transit stage.
struct Transit {
    copies: usize,
    extra: Duration,
    corrupt_bit: Option<usize>,
    /// The multicast group the packet was sent to, if it was.
    group: Option<Ipv4Addr>,
}

struct State {
    seed: u64,
    nodes: Vec<Node>,
    default_cfg: LinkConfig,
    /// `dirs[src][dst]`, made on first use.
    dirs: Vec<Vec<Option<Direction>>>,
    queue: EventQueue<Event>,
    seq: u64,
    packets: u64,
    rules: Vec<Rule>,
    mode: TraceMode,
    trace: Trace,
    stats: FabricStats,
    /// The trace records of the packets being delivered now (a receiver's discard
    /// note names one of them).
    delivering: Vec<usize>,
}

struct Shared {
    t0: Instant,
    now_ns: AtomicU64,
    port: u16,
    state: Mutex<State>,
    /// Reader-biased: a device stepping the fabric from inside a callback takes the
    /// read lock again while another thread may be waiting to write.
    stations: RecursiveRwLock<Vec<Arc<dyn Station>>>,
    /// Timers with no address ([`Fabric::add_timer`]).
    timers: RecursiveRwLock<Vec<Arc<dyn Timer>>>,
}

/// An in-memory network with virtual time. Cloning gives another handle to the same
/// network.
#[derive(Clone)]
pub struct Fabric {
    shared: Arc<Shared>,
}

impl fmt::Debug for Fabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fabric")
            .field("now", &self.now())
            .field("stats", &self.stats())
            .finish()
    }
}

/// Puts a device's engine notes in the trace at the fabric's `now` (called under the
/// device's lock; the lock order is device, then fabric).
struct NoteRecorder {
    shared: Arc<Shared>,
    node: usize,
}

impl NoteSink for NoteRecorder {
    fn note(&self, note: Note) {
        let at = self.shared.now();
        let mut st = self.shared.state.lock();
        if st.mode == TraceMode::Off {
            return;
        }
        // A discard names the packet being delivered: its row says so.
        if let Note::Discard { qpn, psn, reason } = note {
            let State {
                trace, delivering, ..
            } = &mut *st;
            let rec = delivering.iter().rev().find_map(|&r| {
                let p = trace.packets.get(r)?;
                let b = p.repr.as_ref()?.bth;
                (b.dest_qp == qpn && b.psn.value() == psn && p.verdict.is_none()).then_some(r)
            });
            if let Some(r) = rec {
                trace.packets[r].verdict = Some(reason.to_string());
                return;
            }
        }
        let after_packets = st.trace.packets.len();
        st.trace.notes.push(HostNote {
            at,
            device: self.node,
            after_packets,
            note,
        });
    }
}

/// The [`Link`] of one device on the fabric.
struct FabricLink {
    shared: Arc<Shared>,
    node: usize,
}

impl fmt::Debug for FabricLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FabricLink")
            .field("node", &self.node)
            .finish()
    }
}

impl Link for FabricLink {
    fn now(&self) -> Instant {
        self.shared.t0 + self.shared.now()
    }

    fn send(&self, runs: &mut [Transmit<'_>]) -> io::Result<()> {
        for t in runs {
            let (src, dst) = v4_route(&t.route)?;
            let tos = t.route.tos;
            for packet in t.packets() {
                write_icrc(&self.endpoints(src, dst), packet);
                self.enqueue(dst, Pkt::copy_of(packet, tos));
            }
        }
        Ok(())
    }

    fn lend(&self) -> Option<Vec<u8>> {
        Some(Pkt::buffer())
    }

    fn send_owned(&self, route: Route, mut buf: Vec<u8>, len: usize) -> io::Result<()> {
        let (src, dst) = v4_route(&route)?;
        let tos = route.tos;
        write_icrc(&self.endpoints(src, dst), &mut buf[..len]);
        self.enqueue(dst, Pkt { buf, len, tos });
        Ok(())
    }

    /// Whoever receives (an empty poll, a waiting thread), the fabric moves on: it
    /// delivers the next packet through its device's `DeviceDriver` or fires the
    /// next timer.
    fn receive(&self, _into: &Inbound<'_>, _by: Receiver) -> usize {
        usize::from(self.shared.step(None))
    }

    fn join_multicast_group(&self, group: IpAddr) -> io::Result<()> {
        let IpAddr::V4(group) = group else {
            return Err(io::ErrorKind::Unsupported.into());
        };
        let mut st = self.shared.state.lock();
        if let Some(n) = st.nodes.get_mut(self.node) {
            if !n.groups.contains(&group) {
                n.groups.push(group);
            }
        }
        Ok(())
    }

    fn leave_multicast_group(&self, group: IpAddr) {
        let mut st = self.shared.state.lock();
        if let Some(n) = st.nodes.get_mut(self.node) {
            n.groups.retain(|g| *g != group);
        }
    }
}

/// The IPv4 addresses of a route: the fabric carries IPv4 only (its devices are made
/// on IPv4 addresses, [`Fabric::add_device_with`]).
fn v4_route(r: &Route) -> io::Result<(Ipv4Addr, Ipv4Addr)> {
    match (r.src, r.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Ok((s, d)),
        _ => Err(io::ErrorKind::Unsupported.into()),
    }
}

impl FabricLink {
    /// The addresses and ports the ICRC of a packet from `src` to `dst` covers (no IP
    /// header crosses the fabric: its ID is 0, as between emulated devices on UDP).
    fn endpoints(&self, src: Ipv4Addr, dst: Ipv4Addr) -> Ipv4Endpoints {
        Ipv4Endpoints {
            src,
            dst,
            ip_id: 0,
            src_port: self.shared.port,
            dst_port: self.shared.port,
        }
    }

    /// Hands a packet (ICRC filled in) to the fabric, at the fabric's time now.
    fn enqueue(&self, dst: Ipv4Addr, pkt: Pkt) {
        let now = self.shared.now();
        self.shared.state.lock().send(now, self.node, dst, pkt);
    }
}

impl Shared {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns.load(Ordering::Relaxed))
    }

    fn set_now(&self, t: Duration) {
        self.now_ns
            .fetch_max(t.as_nanos() as u64, Ordering::Relaxed);
    }

    /// When the next timer of any station or [`Timer`] is due (no earlier than `now`),
    /// and whose: an index into the stations, then on into the timers.
    fn next_timer(
        &self,
        eps: &[Arc<dyn Station>],
        timers: &[Arc<dyn Timer>],
        now: Duration,
    ) -> Option<(Duration, usize)> {
        let mut timer: Option<(Duration, usize)> = None;
        let due = eps
            .iter()
            .map(|e| e.poll_timeout())
            .chain(timers.iter().map(|t| t.poll_timeout()));
        for (i, due) in due.enumerate() {
            if let Some(t) = due {
                let at = t.saturating_duration_since(self.t0).max(now);
                if timer.is_none_or(|(best, _)| at < best) {
                    timer = Some((at, i));
                }
            }
        }
        timer
    }

    /// One step: the next delivery or timer due no later than `limit`.
    fn step(&self, limit: Option<Duration>) -> bool {
        let now = self.now();
        let eps = self.stations.read();
        let timers = self.timers.read();
        let mut st = self.state.lock();
        // A packet due now goes first without asking the stations for their timers
        // (asking takes each device's lock): no timer is due before now, and packets
        // win ties. Otherwise the timers are read without the fabric's lock (the lock
        // order is device, then fabric).
        let due_now = st.queue.peek_key().is_some_and(|(at, _)| at <= now);
        let timer = if due_now {
            None
        } else {
            drop(st);
            let t = self.next_timer(&eps, &timers, now);
            st = self.state.lock();
            t
        };
        let packet_at = st.queue.peek_key().map(|(at, _)| at.max(now));
        let deliver = match (packet_at, timer) {
            (Some(p), Some((t, _))) => p <= t,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return false,
        };
        let at = if deliver {
            packet_at.unwrap_or(now)
        } else {
            timer.map_or(now, |(t, _)| t)
        };
        if limit.is_some_and(|l| at > l) {
            return false;
        }
        self.set_now(at);
        if deliver {
            let Some(first) = st.queue.pop() else {
                return false;
            };
            // Everything else due at this instant for the same device arrives with it,
            // in order, as one batch.
            let mut batch = vec![first];
            while st.queue.peek_key().is_some_and(|(t, _)| t <= at) {
                let Some(ev) = st.queue.pop() else { break };
                if ev.dst == batch[0].dst {
                    batch.push(ev);
                } else {
                    st.queue.push(ev);
                    break;
                }
            }
            let mut addrs = Vec::with_capacity(batch.len());
            for ev in &batch {
                if let Some(r) = ev.record {
                    if let Some(rec) = st.trace.packets.get_mut(r) {
                        rec.arrivals.push(at);
                    }
                }
                st.stats.delivered += 1;
                addrs.push((st.nodes[ev.src].ip, ev.group.unwrap_or(st.nodes[ev.dst].ip)));
            }
            let dst = batch[0].dst;
            st.delivering.clear();
            st.delivering
                .extend(batch.iter().filter_map(|ev| ev.record));
            drop(st);
            if let [ev] = batch.as_slice() {
                eps[dst].deliver_tos(addrs[0].0, addrs[0].1, ev.pkt.tos, ev.pkt.bytes());
            } else {
                let list: Vec<(Ipv4Addr, Ipv4Addr, u8, &[u8])> = batch
                    .iter()
                    .zip(&addrs)
                    .map(|(ev, &(s, d))| (s, d, ev.pkt.tos, ev.pkt.bytes()))
                    .collect();
                eps[dst].deliver_batch_tos(&list);
            }
            for ev in batch {
                ev.pkt.recycle();
            }
        } else if let Some((_, i)) = timer {
            drop(st);
            match eps.get(i) {
                Some(e) => e.handle_timeout(),
                None => timers[i - eps.len()].handle_timeout(),
            }
        }
        true
    }
}

impl State {
    fn dir(&mut self, src: usize, dst: usize) -> &mut Direction {
        // The default configuration is copied only for a new direction (it is large,
        // and this runs three times per packet).
        let State {
            dirs,
            seed,
            default_cfg,
            ..
        } = self;
        if dirs.len() <= src {
            dirs.resize_with(src + 1, Vec::new);
        }
        let row = &mut dirs[src];
        if row.len() <= dst {
            row.resize_with(dst + 1, || None);
        }
        row[dst].get_or_insert_with(|| {
            Direction::new(*default_cfg, *seed, ((src as u64) << 32) | dst as u64)
        })
    }

    fn set_fate(&mut self, rec: Option<usize>, fate: Fate) {
        if let Fate::Dropped(_) = fate {
            self.stats.dropped += 1;
        }
        if let Some(r) = rec.and_then(|r| self.trace.packets.get_mut(r)) {
            r.fate = fate;
        }
    }

    fn record(
        &mut self,
        now: Duration,
        src: usize,
        dst: Option<usize>,
        dst_ip: Ipv4Addr,
        bytes: &[u8],
        fate: Fate,
    ) -> Option<usize> {
        let index = self.packets;
        self.packets += 1;
        self.stats.sent += 1;
        if self.mode == TraceMode::Off {
            return None;
        }
        let parsed = PacketRepr::parse(bytes).ok();
        self.trace.packets.push(PacketRecord {
            index,
            sent: now,
            arrivals: Vec::new(),
            src,
            dst,
            dst_ip,
            repr: parsed.map(|p| p.0),
            payload_len: parsed.map_or(0, |p| p.1.len()),
            bytes: (self.mode == TraceMode::Full).then(|| bytes.to_vec()),
            fate,
            verdict: None,
        });
        Some(self.trace.packets.len() - 1)
    }

    /// A device sent `bytes` (ICRC filled in) to `dst_ip`.
    /// A packet to a multicast group goes, as one traced packet each, to every device
    /// that joined the group (the sender too, as IP multicast loops back).
    fn send(&mut self, now: Duration, src: usize, dst_ip: Ipv4Addr, pkt: Pkt) {
        let dst = if dst_ip.is_multicast() {
            let members: Vec<usize> = (0..self.nodes.len())
                .filter(|&i| self.nodes[i].groups.contains(&dst_ip))
                .collect();
            if let Some((&last, others)) = members.split_last() {
                for &m in others {
                    let copy = Pkt::copy_of(pkt.bytes(), pkt.tos);
                    self.send_one(now, src, m, dst_ip, Some(dst_ip), copy);
                }
                return self.send_one(now, src, last, dst_ip, Some(dst_ip), pkt);
            }
            None
        } else {
            self.nodes.iter().position(|n| n.ip == dst_ip)
        };
        match dst {
            Some(dst) => self.send_one(now, src, dst, dst_ip, None, pkt),
            None => {
                let rec = self.record(now, src, None, dst_ip, pkt.bytes(), Fate::Delivered);
                self.set_fate(rec, Fate::Dropped(Cause::NoRoute));
                pkt.recycle();
            }
        }
    }

    /// One packet from `src` to node `dst`: partition, hold, then the rules and the link.
    fn send_one(
        &mut self,
        now: Duration,
        src: usize,
        dst: usize,
        dst_ip: Ipv4Addr,
        group: Option<Ipv4Addr>,
        pkt: Pkt,
    ) {
        let rec = self.record(now, src, Some(dst), dst_ip, pkt.bytes(), Fate::Delivered);
        let index = self.packets - 1;
        let dir = self.dir(src, dst);
        if dir.partitioned {
            self.set_fate(rec, Fate::Dropped(Cause::Partition));
            return pkt.recycle();
        }
        if let Some(held) = &mut dir.held {
            held.push((pkt, rec, index, group));
            self.set_fate(rec, Fate::Held);
            return;
        }
        self.route(now, (src, dst), pkt, rec, index, group);
    }

    /// The rule stage, then transit, for packet number `index`.
    fn route(
        &mut self,
        now: Duration,
        (src, dst): (usize, usize),
        pkt: Pkt,
        rec: Option<usize>,
        index: u64,
        group: Option<Ipv4Addr>,
    ) {
        let bytes = pkt.bytes();
        let mut decided = None;
        if !self.rules.is_empty() {
            if let Ok((repr, payload)) = PacketRepr::parse(bytes) {
                let info = PacketInfo {
                    index,
                    src: &self.nodes[src].name,
                    dst: &self.nodes[dst].name,
                    repr: &repr,
                    payload_len: payload.len(),
                };
                for rule in &mut self.rules {
                    if let Some(a) = rule.apply(&info) {
                        decided = Some((a, rule.name().to_owned(), rule.last_msn(), repr));
                        break;
                    }
                }
            }
        }
        let Some((action, name, msn, repr)) = decided else {
            // The random faults of the direction.
            let draw = self.dir(src, dst).draw(bytes.len());
            if draw.lost {
                self.set_fate(rec, Fate::Dropped(Cause::Random));
                return pkt.recycle();
            }
            if draw.corrupt_bit.is_some() {
                self.set_fate(rec, Fate::Corrupted(Cause::Random));
            } else if draw.duplicate {
                self.set_fate(rec, Fate::Duplicated(Cause::Random));
            }
            let t = Transit {
                copies: 1 + usize::from(draw.duplicate),
                extra: Duration::ZERO,
                corrupt_bit: draw.corrupt_bit,
                group,
            };
            self.transit(now, src, dst, pkt, rec, t);
            return;
        };
        let cause = Cause::Rule(name.clone());
        let mut t = Transit {
            copies: 1,
            extra: Duration::ZERO,
            corrupt_bit: None,
            group,
        };
        match action {
            Action::Drop => {
                self.set_fate(rec, Fate::Dropped(cause));
                return pkt.recycle();
            }
            Action::Duplicate => {
                t.copies = 2;
                self.set_fate(rec, Fate::Duplicated(cause));
            }
            Action::Delay(d) => {
                t.extra = d;
                self.set_fate(rec, Fate::Delayed(cause));
            }
            Action::CorruptIcrc => {
                // The ICRC's first byte, lowest bit.
                t.corrupt_bit = Some((bytes.len() - 4) * 8);
                self.set_fate(rec, Fate::Corrupted(cause));
            }
            Action::Truncate(n) => {
                self.set_fate(rec, Fate::Dropped(cause));
                let Ok((_, payload)) = PacketRepr::parse(bytes) else {
                    return pkt.recycle();
                };
                let keep = payload.len().saturating_sub(n);
                let mut buf = vec![0u8; bytes.len()];
                let len = repr.emit(&mut buf, &payload[..keep]);
                let ep = Ipv4Endpoints {
                    src: self.nodes[src].ip,
                    dst: self.nodes[dst].ip,
                    ip_id: 0,
                    src_port: ROCE_PORT,
                    dst_port: ROCE_PORT,
                };
                write_icrc(&ep, &mut buf[..len]);
                let dst_ip = self.nodes[dst].ip;
                let r = self.record(
                    now,
                    src,
                    Some(dst),
                    dst_ip,
                    &buf[..len],
                    Fate::Injected(name),
                );
                let tos = pkt.tos;
                pkt.recycle();
                self.transit(now, src, dst, Pkt::copy_of(&buf[..len], tos), r, t);
                return;
            }
            Action::RnrNak {
                requester_qpn,
                timer,
            } => {
                self.set_fate(rec, Fate::Dropped(cause));
                pkt.recycle();
                // IBTA 9.7.5.2.8: an RNR NAK is an ACKNOWLEDGE with the PSN of the
                // request and an AETH of type RNR NAK carrying the timer code.
                let mut nak = PacketRepr::new(Opcode::RcAcknowledge, requester_qpn, repr.bth.psn);
                nak.aeth = Some(AethRepr {
                    syndrome: Syndrome::RnrNak { timer },
                    msn,
                });
                let mut buf = [0u8; 32];
                let n = nak.emit(&mut buf, &[]);
                let ep = Ipv4Endpoints {
                    src: self.nodes[dst].ip,
                    dst: self.nodes[src].ip,
                    ip_id: 0,
                    src_port: ROCE_PORT,
                    dst_port: ROCE_PORT,
                };
                write_icrc(&ep, &mut buf[..n]);
                let src_ip = self.nodes[src].ip;
                let r = self.record(now, dst, Some(src), src_ip, &buf[..n], Fate::Injected(name));
                t.group = None;
                self.transit(now, dst, src, Pkt::copy_of(&buf[..n], 0), r, t);
                return;
            }
        }
        self.transit(now, src, dst, pkt, rec, t);
    }

    /// MTU, the transmit queue, then latency and jitter per copy.
    fn transit(
        &mut self,
        now: Duration,
        src: usize,
        dst: usize,
        pkt: Pkt,
        rec: Option<usize>,
        t: Transit,
    ) {
        let dir = self.dir(src, dst);
        if !dir.fits_mtu(pkt.len) {
            self.set_fate(rec, Fate::Dropped(Cause::Mtu));
            return pkt.recycle();
        }
        let Some(done) = dir.transmit(now, pkt.len) else {
            self.set_fate(rec, Fate::Dropped(Cause::QueueFull));
            return pkt.recycle();
        };
        let mut delays = [Duration::ZERO; 2];
        for d in delays.iter_mut().take(t.copies) {
            *d = dir.delay();
        }
        if t.corrupt_bit.is_some() {
            self.stats.corrupted += 1;
        }
        self.stats.duplicated += t.copies as u64 - 1;
        // A duplicate goes first, in a copy; the packet itself travels in its own buffer.
        let enqueue = |st: &mut State, mut p: Pkt, delay: Duration| {
            if let Some(bit) = t.corrupt_bit {
                p.buf[bit / 8] ^= 1 << (bit % 8);
            }
            st.seq += 1;
            st.queue.push(Event {
                at: done + delay + t.extra,
                seq: st.seq,
                src,
                dst,
                record: rec,
                pkt: p,
                group: t.group,
            });
        };
        if t.copies > 1 {
            enqueue(self, Pkt::copy_of(pkt.bytes(), pkt.tos), delays[0]);
            enqueue(self, pkt, delays[1]);
        } else {
            enqueue(self, pkt, delays[0]);
        }
    }
}

impl Fabric {
    /// An empty fabric whose random faults draw from ChaCha seeded with `seed`
    /// (one stream per direction of each device pair). Records headers and bytes
    /// ([`TraceMode::Full`]).
    pub fn new(seed: u64) -> Fabric {
        Fabric {
            shared: Arc::new(Shared {
                t0: Instant::now(),
                now_ns: AtomicU64::new(0),
                port: ROCE_PORT,
                state: Mutex::new(State {
                    seed,
                    nodes: Vec::new(),
                    default_cfg: LinkConfig::default(),
                    dirs: Vec::new(),
                    queue: EventQueue::new(),
                    seq: 0,
                    packets: 0,
                    rules: Vec::new(),
                    mode: TraceMode::Full,
                    trace: Trace {
                        port: ROCE_PORT,
                        ..Trace::default()
                    },
                    stats: FabricStats::default(),
                    delivering: Vec::new(),
                }),
                stations: RecursiveRwLock::new(Vec::new()),
                timers: RecursiveRwLock::new(Vec::new()),
            }),
        }
    }

    /// Attaches a new emulated device named `name` with address `ip` (default limits).
    /// Use it through `verbs_api::Device` (e.g. `Context::new(dev)`).
    pub fn add_device(&self, name: &str, ip: Ipv4Addr) -> verbs_api::Result<Arc<EmuDevice>> {
        self.add_device_with(EmuConfig {
            name: name.into(),
            ip: ip.into(),
            ..EmuConfig::default()
        })
    }

    /// Attaches a new emulated device configured by `cfg` (its port is the fabric's,
    /// 4791). The fabric carries IPv4: an IPv6 `cfg.ip` is `Unsupported`.
    pub fn add_device_with(&self, mut cfg: EmuConfig) -> verbs_api::Result<Arc<EmuDevice>> {
        cfg.port = self.shared.port;
        let IpAddr::V4(ip) = cfg.ip else {
            return Err(verbs_api::Error::Unsupported(
                "the simulated fabric carries IPv4 only",
            ));
        };
        let (node, link) = self
            .attach(&cfg.name, ip)
            .map_err(|_| verbs_api::Error::InvalidArgument("device name or address in use"))?;
        let dev = Arc::new(EmuDevice::with_link(cfg, link)?);
        self.trace_notes(&dev, node);
        self.shared.stations.write()[node] = Arc::new(Device(dev.driver()));
        Ok(dev)
    }

    /// Sends `dev`'s engine notes into the trace as node `node`'s host events.
    fn trace_notes(&self, dev: &EmuDevice, node: usize) {
        dev.set_note_sink(Some(Arc::new(NoteRecorder {
            shared: self.shared.clone(),
            node,
        })));
    }

    /// A new device in the place of one that was on the fabric (same name and address,
    /// `cfg.name` and `cfg.ip`), as a peer process that restarts opens a new device on
    /// the same address: packets still in flight to the old one reach the new one.
    /// Drop the old device first (until then both would be fed). EINVAL if no node has
    /// that name and address.
    pub fn replace_device(&self, mut cfg: EmuConfig) -> verbs_api::Result<Arc<EmuDevice>> {
        cfg.port = self.shared.port;
        let node = {
            let st = self.shared.state.lock();
            st.nodes
                .iter()
                .position(|n| n.name == cfg.name && n.ip == cfg.ip)
                .ok_or(verbs_api::Error::InvalidArgument(
                    "no device of that name and address",
                ))?
        };
        let link: Arc<dyn Link> = Arc::new(FabricLink {
            shared: self.shared.clone(),
            node,
        });
        let dev = Arc::new(EmuDevice::with_link(cfg, link)?);
        self.trace_notes(&dev, node);
        self.shared.stations.write()[node] = Arc::new(Device(dev.driver()));
        Ok(dev)
    }

    /// Attaches any [`Station`]; returns the link it sends through.
    pub fn add_station(
        &self,
        name: &str,
        ip: Ipv4Addr,
        ep: Arc<dyn Station>,
    ) -> Result<Arc<dyn Link>, FabricError> {
        let (node, link) = self.attach(name, ip)?;
        self.shared.stations.write()[node] = ep;
        Ok(link)
    }

    /// Attaches a [`Timer`]: the fabric fires it at its `now` from then on.
    pub fn add_timer(&self, t: Arc<dyn Timer>) {
        self.shared.timers.write().push(t);
    }

    fn attach(&self, name: &str, ip: Ipv4Addr) -> Result<(usize, Arc<dyn Link>), FabricError> {
        let mut st = self.shared.state.lock();
        if st.nodes.iter().any(|n| n.name == name || n.ip == ip) {
            return Err(FabricError::InUse(format!("{name} ({ip})")));
        }
        st.nodes.push(Node {
            name: name.into(),
            ip,
            groups: Vec::new(),
        });
        st.trace.devices.push(TraceDevice {
            name: name.into(),
            ip,
        });
        let node = st.nodes.len() - 1;
        drop(st);
        self.shared.stations.write().push(Arc::new(Nothing));
        let link: Arc<dyn Link> = Arc::new(FabricLink {
            shared: self.shared.clone(),
            node,
        });
        Ok((node, link))
    }

    fn node(&self, st: &State, name: &str) -> Result<usize, FabricError> {
        st.nodes
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| FabricError::UnknownDevice(name.into()))
    }

    /// The configuration links get unless set otherwise (applies to directions that
    /// carried no packet yet).
    pub fn set_default_link(&self, cfg: LinkConfig) {
        self.shared.state.lock().default_cfg = cfg;
    }

    /// Configures the direction `from` -> `to`.
    pub fn set_direction(&self, from: &str, to: &str, cfg: LinkConfig) -> Result<(), FabricError> {
        let mut st = self.shared.state.lock();
        let (a, b) = (self.node(&st, from)?, self.node(&st, to)?);
        st.dir(a, b).cfg = cfg;
        Ok(())
    }

    /// Configures both directions between `a` and `b`.
    pub fn set_link(&self, a: &str, b: &str, cfg: LinkConfig) -> Result<(), FabricError> {
        self.set_direction(a, b, cfg)?;
        self.set_direction(b, a, cfg)
    }

    fn both(&self, a: &str, b: &str, f: impl Fn(&mut Direction)) -> Result<(), FabricError> {
        let mut st = self.shared.state.lock();
        let (x, y) = (self.node(&st, a)?, self.node(&st, b)?);
        f(st.dir(x, y));
        f(st.dir(y, x));
        Ok(())
    }

    /// Cuts `a` and `b` apart: every packet between them is dropped until
    /// [`Fabric::heal`].
    pub fn partition(&self, a: &str, b: &str) -> Result<(), FabricError> {
        self.both(a, b, |d| d.partitioned = true)
    }

    /// Ends a partition.
    pub fn heal(&self, a: &str, b: &str) -> Result<(), FabricError> {
        self.both(a, b, |d| d.partitioned = false)
    }

    /// Holds every packet `from` sends to `to` until [`Fabric::release`].
    pub fn hold(&self, from: &str, to: &str) -> Result<(), FabricError> {
        let mut st = self.shared.state.lock();
        let (a, b) = (self.node(&st, from)?, self.node(&st, to)?);
        let d = st.dir(a, b);
        if d.held.is_none() {
            d.held = Some(Vec::new());
        }
        Ok(())
    }

    /// Sends on the packets held on `from` -> `to`, in order, now (through the rules
    /// and the link as if just sent).
    pub fn release(&self, from: &str, to: &str) -> Result<(), FabricError> {
        let mut st = self.shared.state.lock();
        let (a, b) = (self.node(&st, from)?, self.node(&st, to)?);
        let held = st.dir(a, b).held.take().unwrap_or_default();
        let now = self.now();
        for (pkt, rec, index, group) in held {
            st.route(now, (a, b), pkt, rec, index, group);
        }
        Ok(())
    }

    /// Adds a per-packet rule after the others; returns its number.
    pub fn add_rule(&self, rule: Rule) -> usize {
        let mut st = self.shared.state.lock();
        st.rules.push(rule);
        st.rules.len() - 1
    }

    /// How many packets rule number `id` acted on.
    pub fn rule_fired(&self, id: usize) -> u64 {
        self.shared
            .state
            .lock()
            .rules
            .get(id)
            .map_or(0, Rule::fired)
    }

    /// Removes every rule.
    pub fn clear_rules(&self) {
        self.shared.state.lock().rules.clear();
    }

    /// Names the address range `[addr, addr + len)` in traces (see [`Label`]).
    pub fn label(&self, name: &str, addr: u64, len: u64) {
        self.shared.state.lock().trace.labels.push(Label {
            name: name.into(),
            addr,
            len,
        });
    }

    /// How much is recorded from now on.
    pub fn set_trace_mode(&self, mode: TraceMode) {
        self.shared.state.lock().mode = mode;
    }

    /// A copy of the trace so far.
    pub fn trace(&self) -> Trace {
        self.shared.state.lock().trace.clone()
    }

    /// Packet counts.
    pub fn stats(&self) -> FabricStats {
        self.shared.state.lock().stats
    }

    /// Virtual time since the fabric was made.
    pub fn now(&self) -> Duration {
        self.shared.now()
    }

    /// The fabric's now as an `Instant`: the clock of its links (`Link::now`) and of
    /// the timers of its stations and [`Timer`]s.
    pub fn instant(&self) -> Instant {
        self.shared.t0 + self.shared.now()
    }

    /// One step: delivers the next packet or fires the next timer (advancing time to
    /// it). False when nothing is left to happen.
    pub fn step(&self) -> bool {
        self.shared.step(None)
    }

    /// Steps until nothing is left to happen or virtual time would pass `limit`
    /// (from now); returns the steps taken.
    pub fn run(&self, limit: Duration) -> u64 {
        let deadline = self.now() + limit;
        let mut n = 0;
        while self.shared.step(Some(deadline)) {
            n += 1;
        }
        n
    }

    /// Lets `d` of virtual time pass, with everything due in it happening.
    pub fn run_for(&self, d: Duration) {
        let deadline = self.now() + d;
        while self.shared.step(Some(deadline)) {}
        self.shared.set_now(deadline);
    }
}
