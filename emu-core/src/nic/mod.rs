//! `EmuDevice`: the [`Device`](verbs_api::Device) trait over the engine, on a UDP link.
//!
//! One device is one engine behind a lock, one [`Link`] (on UDP: one socket, and one
//! more socket and thread for each IPv6 address of a device on both families, see
//! `dual`), and one thread. The thread receives through the link
//! ([`Link::receive`]: datagrams, ICRC checked first, a bad one dropped and counted,
//! fed to the engine), and runs the engine's timers. Verbs called from any thread take the
//! lock, call the engine, and send whatever it wants sent at once. Completion channel
//! wake-ups and asynchronous events are queued for blocking waiters and signalled
//! through pipes for poll/epoll.
//!
//! A device can also sit on another [`Link`], e.g. the simulated fabric of crate `emu-sims`:
//! [`EmuDevice::with_link`] opens it without a thread, the link tells the time, and the
//! fabric delivers packets and fires timers through the device's [`DeviceDriver`]. An
//! empty `poll_cq` or a wait with nothing queued receives ([`Link::receive`]), which
//! lets a fabric with virtual time move the network on: a single-threaded program then
//! runs deterministically.
//!
//! Batching: packets the engine emits back to back to one peer with one size go to
//! the link as one run ([`Link::send`]; UDP sends it with GSO), and the device
//! thread receives with `recvmmsg` and GRO (see `link`).
//!
//! Run to completion: an empty `poll_cq` takes waiting datagrams off the socket and
//! runs them through the engine in the caller's thread, so a polling application sees
//! a completion without waiting for the device thread to be scheduled; while the
//! application polls, the device thread naps instead of waking for every datagram,
//! and a post may leave its packets for the next poll to send (one GSO send for posts
//! to many QPs). Positive ACKs leave after the requests of the same flush, and an
//! inline receive leaves the positive ACKs at the end of a batch to the next poll, so
//! that the completion of what came before them is seen first. The device
//! thread takes the socket back, and sends anything left, within 200 us of the last
//! poll (2 ms with [`EmuConfig::busy_poll`]); until then its naps fire timers and send
//! what posts left, but never receive.
//!
//! Several devices on one host: give each its own address in 127.0.0.0/8 (Linux answers
//! on all of it) and the same port, e.g. `emu0` on 127.0.0.1 and `emu1` on 127.0.0.2.

mod auto;
mod deferred;
mod driver;
mod drops;
mod dual;
mod empty_polls;
mod gro;
pub mod interop;
mod ip_id;
mod link;
mod liveness;
mod management;
mod netdev;
mod open;
mod receive;
mod share;
mod shm;
mod slice;
mod thread;
mod transmit;
mod udp;
mod verbs;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::Mutex;
use verbs_api::{AsyncEvent, CqId, Gid, Result};

use crate::engine::{self, Engine, Limits};
use crate::notify::Notifier;
pub use driver::DeviceDriver;
pub use link::{Link, Receiver, Route, Transmit};
pub use management::Management;
pub use receive::Inbound;
use transmit::TxBatch;
use udp::GSO_MAX_BYTES;

/// The UDP port of RoCEv2 (IBTA Annex A17).
pub const ROCE_PORT: u16 = 4791;

/// The vendor id an emulated device reports (not a registered OUI: 0xFFFFFF is "none";
/// tools that key on vendor ids take the generic paths).
pub const EMU_VENDOR_ID: u32 = 0x00FF_FFFE;

/// How an emulated device is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmuConfig {
    /// Device name, e.g. `emu0`.
    pub name: String,
    /// The address the device owns, IPv4 or IPv6 ([`gid_of`] is its GID: `::ffff:ip`
    /// for IPv4, the address itself for IPv6). One field for both families: a device
    /// sits on a UDP socket of its address's family and talks to peers of that
    /// family, as a RoCEv2 GID names one address of one family; `Ipv4Addr` and
    /// `Ipv6Addr` both convert into it with `.into()`. A link-local IPv6 address
    /// (`fe80::/10`) is scoped to the interface that holds it. An IPv4 address whose
    /// interface also holds an IPv6 link-local address makes a device on both
    /// families, which takes the interface's IPv6 addresses too and lists them as
    /// kernel rxe does (module `dual`).
    pub ip: IpAddr,
    /// The UDP port of every device it talks to (4791 by default; 0 picks a free one,
    /// for a device that talks only to itself).
    pub port: u16,
    /// Device limits. A link may lower the multicast ones: a UDP device joins at most
    /// 256 groups (one socket each).
    pub limits: Limits,
    /// Busy-poll mode (UDP only): the device thread stays off the socket for 2 ms
    /// after the last `poll_cq` (instead of 200 us), leaving the datagrams to the
    /// application's empty polls, which receive and process them inline (as in the
    /// default mode). For applications that spin on `poll_cq` with pauses. While
    /// the device thread holds the socket (the application does not poll: the
    /// passive side of RDMA WRITE or READ), it spins for 50 us after each datagram
    /// instead of sleeping (20 us in the default mode), so a streaming peer's sends
    /// do not pay its wake-up.
    pub busy_poll: bool,
    /// How the UDP link works: the default loopback mode, or the interop mode for a
    /// real RoCE peer, with an optional fault hook ([`interop`]).
    pub link: interop::LinkOptions,
    /// Which link [`EmuDevice::open`] puts the device on: UDP (the default), the
    /// same-host shared-memory link ([`SameHost::Shm`]), or UDP with the shared-memory
    /// link to peers on this host that offer it ([`SameHost::Auto`]).
    pub same_host: SameHost,
}

/// The link a device opened with [`EmuDevice::open`] sits on: UDP, the same-host
/// shared-memory link alone, or the automatic choice between them for each peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SameHost {
    /// A UDP socket on the device's address, for peers anywhere.
    #[default]
    Udp,
    /// Shared-memory rings to peers on this host, themselves opened with `Shm` and the
    /// same port (see `nic/shm.rs`): the device offers a doorbell at its address in
    /// the host's shared folder, and each peer that sends to it makes a ring of its
    /// own; no socket, no system call on the data path while both sides poll. No
    /// multicast (`Unsupported`), and not a device of an address another live process
    /// offers already ([`verbs_api::Error::AddressInUse`]).
    Shm,
    /// A UDP device (socket, shared address, interop: all of [`SameHost::Udp`]) that
    /// also offers the shared-memory link, and sends to a destination through it when
    /// that address has a live offer on this host (decided at its first packet and
    /// kept), else over UDP; it receives from both (see `nic/auto.rs`). Multicast goes
    /// over UDP. A device whose address another device shares does not offer it.
    Auto,
}

impl Default for EmuConfig {
    fn default() -> Self {
        EmuConfig {
            name: "emu0".into(),
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: ROCE_PORT,
            limits: Limits::default(),
            busy_poll: false,
            link: interop::LinkOptions::default(),
            same_host: SameHost::Udp,
        }
    }
}

/// What the device counted outside the engine (the engine's own counters are in
/// [`EmuDevice::counters`]).
#[derive(Debug, Default)]
pub struct LinkCounters {
    /// Datagrams dropped because their ICRC was wrong.
    pub icrc_errors: AtomicU64,
    /// Datagrams that could not be sent (among them `too_big`).
    pub send_errors: AtomicU64,
    /// Datagrams the kernel refused as larger than the path's MTU (EMSGSIZE): the
    /// interface's MTU fell below what a QP was set up with. They are lost, as on a
    /// link that drops them: RC sends them again until its retries run out.
    pub too_big: AtomicU64,
    /// Datagrams the device thread took off the socket; the others were taken by the
    /// application's own threads (an empty `poll_cq`, a wait for an event), which
    /// receive inline. While the application polls, the thread leaves the socket to
    /// it (see [`EmuConfig::busy_poll`]).
    pub thread_datagrams: AtomicU64,
    /// Times the device thread took the socket back from an application that polls
    /// but left a datagram on it (it spins on memory for an RDMA WRITE, which makes no
    /// completion at the responder) and kept it for a while (see the device thread's
    /// schedule, `nic/thread.rs`).
    pub socket_holds: AtomicU64,
    /// Datagrams the kernel dropped on arrival, before the device could read them:
    /// its socket's receive buffer was full (the host or the device was overloaded:
    /// not loss on the path) or a UDP checksum was wrong. Read from the kernel once a
    /// second (see `drops`).
    pub rx_overflow: AtomicU64,
    /// Packets dropped because they came from the address of a connected QP's peer
    /// but not from the port it sends from
    /// ([`interop::LinkOptions::strict_source_port`]).
    pub wrong_source_port: AtomicU64,
    /// Datagrams this device received for a QP of another device of its address and
    /// passed on to it (devices that open one address share it, as processes share
    /// one kernel rxe device; see [`interop::LinkOptions::exclusive`]).
    pub passed_on: AtomicU64,
    /// Packets received through the same-host shared-memory link ([`SameHost::Shm`],
    /// or [`SameHost::Auto`] from a peer on this host that offers it).
    pub shm_packets: AtomicU64,
    /// `poll_cq` calls that found their CQ empty and did not read the socket, as
    /// another CQ's poll had just found it empty (see `nic/empty_polls.rs`).
    pub skipped_receives: AtomicU64,
    /// Naps the device thread took while the application polled, each ending in a
    /// wake-up that, on a host with no spare core, takes one from the application (see
    /// the device thread's schedule, `nic/thread.rs`).
    pub naps: AtomicU64,
}

struct Core {
    engine: Engine,
    /// Packets waiting to leave as one run: same destination, same size (the last may
    /// be shorter), at most [`GSO_MAX_BYTES`] and the link's `max_segments` packets.
    tx: TxBatch,
    /// Positive ACKs held back so that requests gathered in the same flush leave
    /// first (on a link that sends runs: UDP with GSO; see `Inner::flush`).
    acks: TxBatch,
    /// On a link that lends packet buffers ([`Link::lend`]), the one the next packet
    /// is written into.
    lent: Option<Vec<u8>>,
    /// With [`interop::LinkOptions::strict_source_port`]: the sender each connected QP
    /// takes packets from, learnt from the first packet it took; forgotten when the QP
    /// is reset, reconnected or destroyed.
    peers: HashMap<u32, SocketAddr>,
    /// Where the engine's notes go while someone traces ([`EmuDevice::set_note_sink`]).
    note_sink: Option<Arc<dyn NoteSink>>,
}

impl Core {
    /// Whether a deferred flush left packets for the next one (`Inner::may_defer`).
    fn holds_packets(&self) -> bool {
        self.tx.count > 0 || self.acks.count > 0
    }
}

/// Takes what a device's engine did ([`engine::Note`]), at the moment it did it: a
/// trace on a fabric. Called under the device's lock, before the packets of the same
/// input are sent, so notes come before the packets they caused.
pub trait NoteSink: Send + Sync {
    /// The engine did `note`.
    fn note(&self, note: engine::Note);
}

struct Inner {
    cfg: EmuConfig,
    gid: Gid,
    /// The link the device sits on: everything it sends and receives goes through it.
    link: Arc<dyn Link>,
    core: Mutex<Core>,
    channels: Mutex<HashMap<u32, Arc<Notifier<CqId>>>>,
    next_channel: AtomicU64,
    cq_channel: Mutex<HashMap<u32, u32>>,
    events: Notifier<AsyncEvent>,
    /// Serialises multicast attach/detach with the link's group membership.
    mcast: Mutex<()>,
    stop: AtomicBool,
    link_counters: LinkCounters,
    /// `poll_cq` calls so far: the device thread compares it between its wake-ups to
    /// tell whether the application is polling (a counter costs less than a clock
    /// read per poll).
    polls: AtomicU64,
    /// Posts (`post_send`, `post_recv`, ...) so far: a device thread that finds a
    /// datagram left on the socket while the polls stop compares it, since an
    /// application that posts will poll again (see `Inner::left_on_socket`).
    posts: AtomicU64,
    /// Application threads inside `poll_cq` or a post right now (see
    /// `Inner::at_verbs`): one such call that outlasts the device thread's look at
    /// the socket (a poll that runs thousands of ACKs through the engine) still says
    /// the application is at its verbs.
    in_verbs: AtomicU32,
    /// The thread id of the last application thread at its verbs (see
    /// `Inner::left_on_socket`).
    poller_tid: AtomicU32,
    /// The last empty receive of a `poll_cq`, which the polls of other CQs skip
    /// theirs after (`nic/empty_polls.rs`); none on a link whose empty receive costs
    /// no system call (`Link::receive_costs_a_system_call`, asked at open), and not
    /// used while the link says so (an auto device whose peers use the rings).
    empty_polls: Option<empty_polls::EmptyPolls>,
    /// The device thread naps (`thread::NAP` or `LONG_NAP` at most) and leaves the
    /// socket to the polling application; false while it blocks on the socket. Posts
    /// defer only while it naps (see `Inner::may_defer`).
    napping: AtomicBool,
    /// When the device thread's nap ends, in nanoseconds since `born` (`u64::MAX`
    /// while it does not nap): a timer that the application's call arms for earlier
    /// wakes it ([`Inner::unlock_waking`]).
    nap_until: AtomicU64,
    /// The device thread, as it runs (set when it starts).
    thread: std::sync::OnceLock<std::thread::Thread>,
    /// Threads in `get_cq_event` that receive while they wait (see
    /// `EmuDevice::wait_receiving`): the device thread naps meanwhile.
    waiters: AtomicUsize,
    /// Such waits so far: the device thread compares it between its wake-ups, as
    /// `polls`, to tell whether the application waits for its events that way.
    waits: AtomicU64,
    /// Set by the device thread while the application waits for events receiving
    /// (`waits` moved within its last nap): arming a CQ then leaves it napping.
    waiter_mode: AtomicBool,
    /// The network interface under the port (UDP devices), which the device thread
    /// follows (`netdev`): MTU, state, width and speed.
    netdev: Option<Mutex<netdev::Follower>>,
    /// When the device thread next looks at the interface and the kernel's drop count,
    /// in milliseconds since `born`: one atomic load per loop turn in between.
    next_watch: AtomicU64,
    born: Instant,
}

/// An emulated RDMA device on UDP.
pub struct EmuDevice {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
    /// The threads that receive on the extra addresses of a device on both families.
    extra_threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for EmuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmuDevice")
            .field("name", &self.inner.cfg.name)
            .field("ip", &self.inner.cfg.ip)
            .finish()
    }
}

impl EmuDevice {
    /// The network interface that carries the device's address (a UDP device's port
    /// follows its MTU and state), once found; None on other links.
    pub fn netdev(&self) -> Option<String> {
        let f = self.inner.netdev.as_ref()?;
        let name = f.lock().name().map(str::to_owned);
        name
    }

    /// The device's management handle: what a subnet manager, a cable or a hardware
    /// fault does to it (port state, GID/P_Key tables, LID, SM, device and SRQ
    /// failures), each with its asynchronous event.
    pub fn management(&self) -> Management {
        Management(Arc::downgrade(&self.inner))
    }

    /// The handle through which a link without sockets feeds this device.
    pub fn driver(&self) -> DeviceDriver {
        DeviceDriver(Arc::downgrade(&self.inner))
    }

    /// The device's GID ([`gid_of`] its address): indices 0 and 1 of port 1 on a
    /// device on one family, index 1 on a device on both (whose index 0 is its
    /// interface's IPv6 link-local address, as on kernel rxe).
    pub fn gid(&self) -> Gid {
        self.inner.gid
    }

    /// The device's address.
    pub fn ip(&self) -> IpAddr {
        self.inner.cfg.ip
    }

    /// The UDP port the device is bound to.
    pub fn port(&self) -> u16 {
        self.inner.cfg.port
    }

    /// Sends the engine's notes (verbs posted, completions, events, state changes,
    /// timers, discards) to `sink`, or stops them (`None`, the default: no cost).
    pub fn set_note_sink(&self, sink: Option<Arc<dyn NoteSink>>) {
        let mut core = self.inner.core.lock();
        core.engine.set_notes(sink.is_some());
        core.note_sink = sink;
    }

    /// The engine's counters (packets, drops, retransmissions, ...).
    pub fn counters(&self) -> engine::Counters {
        *self.inner.core.lock().engine.counters()
    }

    /// Counters of the link.
    pub fn link_counters(&self) -> &LinkCounters {
        &self.inner.link_counters
    }
}

impl Inner {
    pub(super) fn new(mut cfg: EmuConfig, link: Arc<dyn Link>) -> Result<Arc<Inner>> {
        // The device promises no more groups than its link can deliver (manual 3.3.1:
        // max_mcast_grp is what the device supports).
        if let Some(g) = link.max_multicast_groups() {
            let l = &mut cfg.limits;
            l.max_mcast_grp = l.max_mcast_grp.min(g);
            l.max_total_mcast_qp_attach = l
                .max_total_mcast_qp_attach
                .min(l.max_mcast_grp.saturating_mul(l.max_mcast_qp_attach));
        }
        let empty_polls = link
            .receive_costs_a_system_call()
            .then(empty_polls::EmptyPolls::new);
        Ok(Arc::new(Inner {
            gid: gid_of(cfg.ip),
            core: Mutex::new(Core {
                engine: {
                    let mut e = Engine::new(cfg.limits);
                    e.set_gid(gid_of(cfg.ip));
                    // A fabric device keeps the engine's fixed start (reproducible); a
                    // UDP device's block and start are set when it opens.
                    e
                },
                tx: TxBatch::new(GSO_MAX_BYTES),
                acks: TxBatch::new(if link.max_segments() > 1 { 4096 } else { 0 }),
                lent: None,
                peers: HashMap::new(),
                note_sink: None,
            }),
            cfg,
            link,
            channels: Mutex::new(HashMap::new()),
            next_channel: AtomicU64::new(1),
            cq_channel: Mutex::new(HashMap::new()),
            events: Notifier::new()?,
            mcast: Mutex::new(()),
            stop: AtomicBool::new(false),
            link_counters: LinkCounters::default(),
            polls: AtomicU64::new(0),
            posts: AtomicU64::new(0),
            in_verbs: AtomicU32::new(0),
            poller_tid: AtomicU32::new(0),
            empty_polls,
            napping: AtomicBool::new(false),
            nap_until: AtomicU64::new(u64::MAX),
            thread: std::sync::OnceLock::new(),
            waiters: AtomicUsize::new(0),
            waits: AtomicU64::new(0),
            waiter_mode: AtomicBool::new(false),
            netdev: None,
            next_watch: AtomicU64::new(0),
            born: Instant::now(),
        }))
    }

    /// The addresses on the link a packet goes between, (source, destination), if the
    /// device can send it: it leaves from the address of its source GID when that is
    /// one of the device's extra addresses (`dual`), else from the device's address,
    /// to the address its destination GID names (the IPv4 address of an IPv4-mapped
    /// GID, any other as an IPv6 address) if that is of the source's family. A packet
    /// for a GID of the other family has no route and is not sent (a requester's
    /// retries run out, as on a network without that route).
    #[inline]
    pub(super) fn link_addresses(&self, t: &engine::Transmit) -> Option<(IpAddr, IpAddr)> {
        let extra = self.link.extra_addresses();
        let src = if extra.is_empty() {
            self.cfg.ip
        } else {
            let s = ip_of(&t.src);
            if extra.contains(&s) {
                s
            } else {
                self.cfg.ip
            }
        };
        let dst = match t.dest.to_ipv4() {
            Some(v4) => src.is_ipv4().then_some(IpAddr::V4(v4))?,
            None => src.is_ipv6().then(|| IpAddr::V6(t.dest.to_ipv6()))?,
        };
        Some((src, dst))
    }

    /// Counts `count` datagrams of up to `size` bytes the link could not send. The first
    /// that is too big for the path (EMSGSIZE) is also reported on stderr with the
    /// MTUs involved, so a user can tell a too-small link from loss.
    pub(super) fn send_failed(&self, e: &std::io::Error, count: usize, size: usize) {
        let c = &self.link_counters;
        c.send_errors.fetch_add(count as u64, Ordering::Relaxed);
        if e.raw_os_error() == Some(nix::errno::Errno::EMSGSIZE as i32)
            && c.too_big.fetch_add(count as u64, Ordering::Relaxed) == 0
        {
            let iface = self
                .netdev
                .as_ref()
                .and_then(|f| f.lock().name().map(str::to_owned))
                .unwrap_or_else(|| "?".into());
            let mtu = std::fs::read_to_string(format!("/sys/class/net/{iface}/mtu"))
                .map_or_else(|_| "?".into(), |m| m.trim().to_owned());
            eprintln!(
                "rdma-emu: {}: a {size}-byte RoCE payload does not fit the path (interface \
                 {iface}, MTU {mtu}): dropped as lost; set a path MTU of at most the \
                 port's active MTU (ibv_query_port) and mind routers with smaller MTUs",
                self.cfg.name
            );
        }
    }

    /// Once a second (the device thread calls it every turn): follows the interface
    /// and counts what the kernel dropped (`rx_overflow`).
    pub(super) fn watch(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.born).as_millis() as u64;
        if ms < self.next_watch.load(Ordering::Relaxed) {
            return;
        }
        self.next_watch.store(ms + 1000, Ordering::Relaxed);
        self.follow_interface(now);
        if let Some(n) = self.link.kernel_drops() {
            self.link_counters
                .rx_overflow
                .fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Applies what the port's network interface says now, if it changed (see
    /// `netdev`): the link's MTU, width and speed, and the port's state (`PORT_ERR`
    /// when the interface goes down, `PORT_ACTIVE` when it comes back).
    pub(super) fn follow_interface(&self, now: Instant) {
        let Some(follower) = &self.netdev else {
            return;
        };
        let Some(r) = follower.lock().poll(now) else {
            return;
        };
        self.with_engine(|e, _| {
            // A device that had a fatal error stays as it is.
            if e.set_link(r.link).is_ok() && e.query_port(1).is_ok_and(|p| p.state != r.state) {
                let _ = e.set_port_state(r.state);
            }
        });
    }
}

impl Drop for EmuDevice {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for t in self.extra_threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The node GUID of a device on `ip`: a locally administered EUI-64 (`02:00:ff:fe`)
/// followed by the four bytes of an IPv4 address (the last four of an IPv6 one), so
/// each device's GUID is its own and says which address it has.
#[must_use]
pub fn node_guid(ip: IpAddr) -> u64 {
    let [a, b, c, d] = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    u64::from_be_bytes([0x02, 0x00, 0xFF, 0xFE, a, b, c, d])
}

/// The RoCEv2 GID of a device address: `::ffff:a.b.c.d` for IPv4 (IPv4-mapped, as
/// kernel rxe lists an interface's IPv4 addresses), the address itself for IPv6.
#[must_use]
pub fn gid_of(ip: IpAddr) -> Gid {
    match ip {
        IpAddr::V4(v4) => Gid::from_ipv4(v4),
        IpAddr::V6(v6) => Gid::from_ipv6(v6),
    }
}

/// The address a GID names: the IPv4 address of an IPv4-mapped GID, else the GID as an
/// IPv6 address (the inverse of [`gid_of`]).
#[must_use]
pub fn ip_of(gid: &Gid) -> IpAddr {
    match gid.to_ipv4() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(gid.to_ipv6()),
    }
}
