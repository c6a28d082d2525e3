//! A same-host link through shared memory (`EmuDevice::open_shm`): devices in
//! different processes of one host exchange their RoCEv2 packets, the same bytes with
//! the same ICRC, through `shm_ring` rings instead of UDP sockets.
//!
//! **Rings.** There is one ring per (sender, receiver) pair, made by the sender (it
//! seals the memfd before anyone else can open it) and taken by the receiver as its
//! consumer. Each device makes a doorbell ([`shm_ring::Bell`]: the word that counts its
//! sleepers, and a generation counter) and offers it in the host's shared folder: the
//! file `shm/IP-PORT` holds its process id, the bell's `/proc/PID/fd/N` path and the
//! name of its wake-up socket (see **Receiving**). An address whose offer belongs to a
//! live process is taken; a dead process's offer is replaced. The first packet for a
//! peer address opens that peer's offer and bell, makes a ring, lists it as
//! `shm/IP-PORT.rings/SRC` (the sender's process id and the ring's path) and
//! announces it on the bell. Each record is the sender's address and
//! TOS ([`PREFIX`] bytes) and then the packet, its ICRC sealed as on a UDP link with IP
//! ID 0 and the RoCEv2 port both ways (what [`DeviceDriver`] checks).
//!
//! **Receiving** ([`Link::receive`]): one load of the bell's generation tells whether a
//! ring was announced since the last look (then the folder is read again); packets are
//! taken from every ring in turn, up to [`BATCH`] under one lock of the engine. The
//! device thread (the UDP device's, `Inner::run`, a [`Receiver::Thread`]) takes what
//! the rings hold, hands it to the engine, fires its timers, and sleeps until the next
//! timer, whatever the number of rings ([`Link::wait_readable`]): the bell's protocol
//! with `poll(2)` on the device's wake-up socket in place of the futex wait
//! ([`ShmLink::sleep_polling`]). The socket is an abstract unix datagram socket named
//! in the offer as a third word; a sender tells its producer to leave the wake-up to it
//! (`Producer::caller_wakes`) and sends a byte there when a push found the receiver
//! asleep. An empty `poll_cq` ([`Receiver::Poll`]) takes the rings itself, so a
//! polling application sees its completion with no thread in between and no system
//! call. A thread that waits for a completion event sleeps in the same `poll(2)` with
//! the channel's descriptor beside the socket and takes the packet that makes its
//! event itself: one wake-up per message, where the device thread's wake-up and then
//! the waiter's took two (a futex cannot be waited on together with a descriptor).
//! While the application polls, the thread naps instead of sleeping, so the peer has
//! no sleeper to wake either.
//!
//! **An auto device** (`SameHost::Auto`, `nic/auto.rs`) holds a link of this kind
//! beside its UDP one; its thread sleeps in the same `poll(2)` with its UDP socket
//! added.
//!
//! **Peers that go.** A peer that dies leaves its rings: what we send it is lost (the
//! sender reads the peer's offer again every [`CHECK_OFFER`] and after its ring stayed
//! full for [`FULL_WAIT`], finds a dead process or a new device's offer, and makes a
//! ring for the new one) and nothing comes from it, so its QPs' retries run out as on
//! a dead link. A live peer's full ring only loses packets, as a full socket buffer
//! does, until it has room again: its thread may be waiting for a core. A receiver
//! drops a ring whose producer closed it, broke it (`Corrupt`: a peer writing garbage
//! loses its own ring and nothing else), was replaced by a newer ring from the same
//! address, or whose process is gone (looked at every [`SWEEP`]): a device that comes
//! back on a dead peer's address makes a new ring, which the receiver takes.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_wire::{write_icrc, write_icrc_v6, Ipv4Endpoints, Ipv6Endpoints};
use parking_lot::Mutex;
use shm_ring::{Bell, Consumer, Producer, Region, Sleeper};
use smallvec::SmallVec;

use super::link::{wait_readable_fds, Link, Receiver, Transmit};
use super::Inbound;
use crate::engine::MAX_PACKET;

/// What precedes a packet in a record: the sender's address (16 bytes, an IPv4 one
/// IPv4-mapped), the TOS byte of its route, and seven zero bytes, so that the packet
/// starts on a word of the ring (copied in whole words, `Producer::push_parts`).
pub(crate) const PREFIX: usize = 24;

/// The longest record: prefix and packet.
const RECORD: usize = PREFIX + MAX_PACKET;

/// How many packets the receiver hands the engine at once.
const BATCH: usize = 16;

/// A ring's data bytes: 4 MiB, some 1000 full-size packets (the memfd's pages are
/// allocated as they are first written).
const RING_BYTES: usize = 4 << 20;

/// How long a sender waits for room in a full ring before it drops the packet: longer
/// than the peer's thread may wait for a core on a loaded two-core host (a few
/// milliseconds beside CPU hogs), since each packet lost costs its QP a retry, often
/// an ACK timeout (docs/performance.md, the 10,000-QP rows).
const FULL_WAIT: Duration = Duration::from_millis(5);

/// How often a peer whose offer could not be opened is looked for again.
const RETRY_OFFER: Duration = Duration::from_millis(20);

/// How often a sender reads the offer of a peer it sends to again, to find a peer
/// that died or was replaced by a new device on its address.
const CHECK_OFFER: Duration = Duration::from_millis(50);

/// How often the device thread, while it waits, looks whether the processes that
/// made its rings still run.
const SWEEP: Duration = Duration::from_secs(1);

fn offer_path(ip: IpAddr, port: u16) -> PathBuf {
    crate::host::folder()
        .join("shm")
        .join(format!("{ip}-{port}"))
}

/// The folder where the rings of the device at `ip:port` are listed, one file per
/// sender address.
fn rings_path(ip: IpAddr, port: u16) -> PathBuf {
    crate::host::folder()
        .join("shm")
        .join(format!("{ip}-{port}.rings"))
}

/// Writes `text` to `path` aside and renames it there: a reader sees the old file or
/// the whole new one.
fn write_file(path: &Path, text: &str) -> io::Result<()> {
    let dir = path.parent().expect("a file in a folder");
    let name = path.file_name().expect("a file name").to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Removes `path` if it still holds `text` (a newer writer may have replaced it).
fn remove_own(path: &Path, text: &str) {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        let _ = std::fs::remove_file(path);
    }
}

/// A "PID PATH" line (a ring's listing; an offer, which may name a wake-up socket
/// after the path): the process, if alive, and the path.
fn parse_live(text: &str) -> Option<(u32, &Path)> {
    let mut words = text.split_whitespace();
    let pid = words.next()?.parse().ok()?;
    let path = words.next()?;
    crate::host::pid_alive(pid).then_some((pid, path.as_ref()))
}

/// The wake-up socket an offer names (its third word): the receiver sleeps in
/// `poll(2)` on its sockets (`SameHost::Auto`), and a datagram there wakes it.
fn wake_name(offer: &str) -> Option<&str> {
    offer.split_whitespace().nth(2)
}

/// The process that offers a live ring at `ip:port` (its pid, as the
/// [`TakenAddress`](verbs_api::TakenAddress) holder), if any: an offer whose process is
/// gone is stale and may be replaced.
pub(crate) fn holder(ip: IpAddr, port: u16) -> Option<String> {
    let text = std::fs::read_to_string(offer_path(ip, port)).ok()?;
    let pid: u32 = text.split_whitespace().next()?.parse().ok()?;
    crate::host::pid_alive(pid).then(|| format!("process {pid} (shared-memory link)"))
}

/// A packet taken from a ring: from, to, TOS, bytes (as [`Inbound::deliver`] takes
/// them).
type Arrival<'a> = (IpAddr, IpAddr, u8, &'a [u8]);

/// The ring this device sends to a peer through, as its producer.
struct Outbound {
    tx: Producer,
    /// The peer's offer as read when the ring was made: another text later means
    /// another device (or none) at that address.
    offer: String,
    /// Where the ring is listed for the peer, and what this device wrote there.
    listing: PathBuf,
    listing_text: String,
    /// When the offer was last read again ([`coarse_now`]).
    checked: Duration,
    /// A push found the ring full for [`FULL_WAIT`] and lost its packet; until a push
    /// finds room again, one that finds the ring full loses its packet at once.
    stalled: bool,
    /// The receiver's wake-up socket (it sleeps in `poll(2)`, not on the bell's futex).
    wake: UnixAddr,
}

impl Drop for Outbound {
    fn drop(&mut self) {
        remove_own(&self.listing, &self.listing_text);
    }
}

/// A sending end: a ring to a peer, or when its offer was last looked for
/// ([`coarse_now`]).
enum Peer {
    Attached(Box<Outbound>),
    Missing(Duration),
}

/// The coarse monotonic clock (the kernel's last tick, read without the TSC): a
/// sender looks at it once per packet, to read a peer's offer again every
/// [`CHECK_OFFER`], where `Instant::now` cost as much as the ring's own push. If it
/// cannot be read, every offer is due at once (correct, and slow).
fn coarse_now() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .map_or(Duration::MAX, Duration::from)
}

/// A ring a peer sends to this device through.
struct InRing {
    /// Its listing's file name (the sender's address) and text.
    name: String,
    text: String,
    /// The process that made it.
    pid: u32,
    rx: Consumer,
}

/// What the receiving side holds: the rings, what the bell said when they were listed,
/// and [`BATCH`] record buffers to take packets into.
struct Rings {
    rings: Vec<InRing>,
    /// The bell's generation when the folder was last read.
    seen: u64,
    /// Listings that could not be taken (not a ring, or one with a consumer already:
    /// made for an earlier device on this address), not tried again while unchanged.
    refused: HashMap<String, String>,
    /// The ring taken from first next time (each gets its turn at a full batch).
    next: usize,
    /// When the rings' processes were last looked at.
    swept: Instant,
    bufs: Vec<u8>,
}

/// The shared-memory link of one device (see the module's documentation).
pub(crate) struct ShmLink {
    ip: IpAddr,
    port: u16,
    /// The offer file this link wrote (removed when it closes, if still its own).
    offer: PathBuf,
    offer_text: String,
    /// The folder where senders list their rings for this device.
    listings: PathBuf,
    bell: Bell,
    inbound: Mutex<Rings>,
    peers: Mutex<HashMap<IpAddr, Peer>>,
    /// The device's wake-up socket (abstract, named in its offer): producers send a
    /// byte there instead of waking the bell's futex, as its sleepers wait in
    /// `poll(2)` on it (and, for an auto device, on its UDP socket; for a thread
    /// waiting for an event, on the completion channel's descriptor).
    wake_rx: UnixDatagram,
    /// Where this link sends wake-ups from (unbound), made on the first one.
    wake_tx: Mutex<Option<UnixDatagram>>,
    /// How many rings the receiving side holds (as of its last change).
    ring_count: AtomicUsize,
}

impl std::fmt::Debug for ShmLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmLink")
            .field("ip", &self.ip)
            .field("port", &self.port)
            .finish()
    }
}

fn ring_error(e: shm_ring::Error) -> io::Error {
    match e {
        shm_ring::Error::Io(e) => e,
        e => io::Error::other(e.to_string()),
    }
}

impl ShmLink {
    /// Makes the device's doorbell and offers it at `shm/IP-PORT` in the host's shared
    /// folder (replacing an older offer for the address), with a wake-up socket of its
    /// own, which senders write a byte to when it sleeps ([`ShmLink::sleep_polling`]).
    pub(crate) fn new(ip: IpAddr, port: u16) -> io::Result<ShmLink> {
        let bell = Bell::create_shared(&format!("rdma-emu-bell-{ip}")).map_err(ring_error)?;
        let path = bell
            .path()
            .ok_or_else(|| io::Error::other("bell not shared"))?;
        let offer = offer_path(ip, port);
        let listings = rings_path(ip, port);
        std::fs::create_dir_all(&listings)?;
        if holder(ip, port).is_some() {
            return Err(io::ErrorKind::AddrInUse.into());
        }
        let wake = format!("rdma-emu-wake-{}-{}-{port}", std::process::id(), ip);
        let wake_rx = UnixDatagram::bind_addr(&UnixAddr::from_abstract_name(&wake)?)?;
        wake_rx.set_nonblocking(true)?;
        let offer_text = format!("{} {} {wake}\n", std::process::id(), path.display());
        write_file(&offer, &offer_text)?;
        let seen = bell.generation();
        let link = ShmLink {
            ip,
            port,
            offer,
            offer_text,
            listings,
            bell,
            inbound: Mutex::new(Rings {
                rings: Vec::new(),
                seen,
                refused: HashMap::new(),
                next: 0,
                swept: Instant::now(),
                bufs: vec![0; BATCH * RECORD],
            }),
            peers: Mutex::new(HashMap::new()),
            wake_rx,
            wake_tx: Mutex::new(None),
            ring_count: AtomicUsize::new(0),
        };
        // Rings listed before this device offered the address (for an earlier one)
        // are refused unless no consumer took them.
        link.rescan(&mut link.inbound.lock());
        Ok(link)
    }

    /// Reads `dst`'s offer, opens its bell, makes a ring for it, lists the ring in its
    /// folder and announces it.
    fn attach(&self, dst: IpAddr) -> Option<Outbound> {
        let offer = std::fs::read_to_string(offer_path(dst, self.port)).ok()?;
        let (_, bell_path) = parse_live(&offer)?;
        let bell = Bell::open_shared(bell_path).ok()?;
        let wake = UnixAddr::from_abstract_name(wake_name(&offer)?).ok()?;
        let region =
            Region::create_shared(&format!("rdma-emu-{}-{dst}", self.ip), RING_BYTES, RECORD)
                .ok()?;
        let ring_path = region.path()?;
        let mut tx = Producer::attach_with_bell(Arc::new(region), &bell).ok()?;
        tx.caller_wakes();
        let listing = rings_path(dst, self.port).join(self.ip.to_string());
        let listing_text = format!("{} {}\n", std::process::id(), ring_path.display());
        std::fs::create_dir_all(listing.parent()?).ok()?;
        write_file(&listing, &listing_text).ok()?;
        if bell.announce_owed() {
            self.wake(&wake);
        }
        Some(Outbound {
            tx,
            offer,
            listing,
            listing_text,
            checked: coarse_now(),
            stalled: false,
            wake,
        })
    }

    /// Wakes a receiver that sleeps in `poll(2)`: a byte to its wake-up socket. A
    /// failure is ignored: a full socket already holds a wake-up, and a receiver that
    /// is gone needs none.
    fn wake(&self, to: &UnixAddr) {
        let mut tx = self.wake_tx.lock();
        if tx.is_none() {
            *tx = UnixDatagram::unbound().ok();
            if let Some(s) = tx.as_ref() {
                let _ = s.set_nonblocking(true);
            }
        }
        if let Some(s) = tx.as_ref() {
            let _ = s.send_to_addr(&[1], to);
        }
    }

    /// Seals `packet`'s ICRC for `dst` and pushes it with its prefix to the ring for
    /// `dst`.
    fn push(
        &self,
        peers: &mut HashMap<IpAddr, Peer>,
        dst: IpAddr,
        tos: u8,
        packet: &mut [u8],
    ) -> io::Result<()> {
        match (self.ip, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => write_icrc(
                &Ipv4Endpoints {
                    src,
                    dst,
                    ip_id: 0,
                    src_port: self.port,
                    dst_port: self.port,
                },
                packet,
            ),
            (IpAddr::V6(src), IpAddr::V6(dst)) => write_icrc_v6(
                &Ipv6Endpoints {
                    src,
                    dst,
                    src_port: self.port,
                    dst_port: self.port,
                },
                packet,
            ),
            _ => return Err(io::ErrorKind::AddrNotAvailable.into()),
        }
        let now = coarse_now();
        let peer = peers
            .entry(dst)
            .or_insert(Peer::Missing(now.saturating_sub(RETRY_OFFER)));
        // The peer's offer, read again now and then: a dead peer's names a dead
        // process, a new device's another bell (it gets a new ring).
        if let Peer::Attached(out) = peer {
            if now.saturating_sub(out.checked) >= CHECK_OFFER {
                out.checked = now;
                let offer = std::fs::read_to_string(offer_path(dst, self.port));
                if !offer.is_ok_and(|o| o == out.offer && parse_live(&o).is_some()) {
                    *peer = Peer::Missing(now.saturating_sub(RETRY_OFFER));
                }
            }
        }
        if let Peer::Missing(at) = peer {
            if now.saturating_sub(*at) < RETRY_OFFER {
                return Err(io::ErrorKind::NotConnected.into());
            }
            *peer = match self.attach(dst) {
                Some(out) => Peer::Attached(Box::new(out)),
                None => Peer::Missing(now),
            };
        }
        let Peer::Attached(out) = peer else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        let from = match self.ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        let mut prefix = [0u8; PREFIX];
        prefix[..16].copy_from_slice(&from.octets());
        // The TOS word in one store, as the ring loads it (see `shm-ring`'s `store_run`:
        // a byte store inside a zeroed word makes the load wait for the push's stores).
        prefix[16..].copy_from_slice(&u64::from(tos).to_le_bytes());
        let mut full_since = None;
        let r = loop {
            match out.tx.push_parts(&[&prefix, packet]) {
                // The peer's thread drains the ring; give it a moment before the
                // packet is dropped (a peer that stopped taking packets, or both rings
                // full while each side's receiver waits for its own engine, must not
                // hold this sender for long, nor for each packet while it lasts).
                Err(shm_ring::Error::Full)
                    if !out.stalled
                        && full_since.get_or_insert_with(Instant::now).elapsed() < FULL_WAIT =>
                {
                    std::thread::yield_now();
                }
                r => break r,
            }
        };
        match r {
            Ok(()) => {
                out.stalled = false;
                if out.tx.wake_owed() {
                    self.wake(&out.wake);
                }
                Ok(())
            }
            // Lost, as a datagram a full socket buffer drops; RC sends it again. The
            // ring stays: its peer may only be waiting for a core, and dropping the
            // ring would lose every packet until the offer is looked for again
            // (RETRY_OFFER), each a retry of its QP. A ring that stayed full that long
            // may be a dead peer's: its offer is read again at the next packet.
            Err(shm_ring::Error::Full) => {
                out.stalled = true;
                out.checked = Duration::ZERO;
                Err(io::ErrorKind::WouldBlock.into())
            }
            // The peer left or broke the ring: look for a new offer later.
            Err(e) => {
                *peer = Peer::Missing(now);
                Err(ring_error(e))
            }
        }
    }

    /// Reads the folder of ring listings again: takes the new rings of live processes
    /// (a newer ring from an address replaces the older), drops those whose listing
    /// went or whose process is gone.
    fn rescan(&self, st: &mut Rings) {
        let mut listed: HashMap<String, String> = HashMap::new();
        if let Ok(dir) = std::fs::read_dir(&self.listings) {
            for entry in dir.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    continue;
                }
                if let Ok(text) = std::fs::read_to_string(entry.path()) {
                    listed.insert(name, text);
                }
            }
        }
        st.rings
            .retain(|r| listed.get(&r.name) == Some(&r.text) && crate::host::pid_alive(r.pid));
        st.refused
            .retain(|name, text| listed.get(name) == Some(text));
        for (name, text) in listed {
            if st.rings.iter().any(|r| r.name == name) || st.refused.contains_key(&name) {
                continue;
            }
            let taken = parse_live(&text).and_then(|(pid, path)| {
                let region = Region::open_shared(path).ok()?;
                let rx = Consumer::attach(Arc::new(region)).ok()?;
                Some((pid, rx))
            });
            match taken {
                Some((pid, rx)) => st.rings.push(InRing {
                    name,
                    text,
                    pid,
                    rx,
                }),
                None => {
                    st.refused.insert(name, text);
                }
            }
        }
    }

    /// Hands `into` up to [`BATCH`] packets from the rings, under one lock of the
    /// engine; how many. `block`: wait for the rings' lock (the device thread), else
    /// give up if another thread holds it (an application's poll or wait).
    fn take(&self, into: &Inbound<'_>, block: bool) -> usize {
        let mut st = if block {
            self.inbound.lock()
        } else {
            match self.inbound.try_lock() {
                Some(g) => g,
                None => return 0,
            }
        };
        let generation = self.bell.generation();
        if generation != st.seen {
            st.seen = generation;
            self.rescan(&mut st);
        }
        let Rings {
            rings, next, bufs, ..
        } = &mut *st;
        let mut lens = [0usize; BATCH];
        let mut n = 0;
        let mut gone: SmallVec<[usize; 4]> = SmallVec::new();
        let count = rings.len();
        for k in 0..count {
            let i = (*next + k) % count;
            while n < BATCH {
                let slot = &mut bufs[n * RECORD..(n + 1) * RECORD];
                match rings[i].rx.pop(slot) {
                    Ok(Some(len)) if len > PREFIX => {
                        lens[n] = len;
                        n += 1;
                    }
                    // A record too short to be a packet: dropped.
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    // The peer left or broke its ring: nothing more from it.
                    Err(_) => {
                        gone.push(i);
                        break;
                    }
                }
            }
        }
        if count > 0 {
            *next = (*next + 1) % count;
        }
        if n > 0 {
            into.counters()
                .shm_packets
                .fetch_add(n as u64, Ordering::Relaxed);
            let batch: SmallVec<[Arrival<'_>; BATCH]> = (0..n)
                .map(|i| {
                    let rec = &bufs[i * RECORD..i * RECORD + lens[i]];
                    let from = Ipv6Addr::from(<[u8; 16]>::try_from(&rec[..16]).expect("16 bytes"));
                    let src = match (self.ip, from.to_ipv4_mapped()) {
                        (IpAddr::V4(_), Some(v4)) => IpAddr::V4(v4),
                        (IpAddr::V4(_), None) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                        (IpAddr::V6(_), _) => IpAddr::V6(from),
                    };
                    (src, self.ip, rec[16], &rec[PREFIX..])
                })
                .collect();
            into.deliver(&batch);
        }
        // Dropped after the packets taken before the end were delivered. A dropped
        // ring's listing stays refused until its sender lists another one.
        gone.sort_unstable();
        for i in gone.into_iter().rev() {
            let r = st.rings.swap_remove(i);
            st.refused.insert(r.name, r.text);
        }
        self.ring_count.store(st.rings.len(), Ordering::Relaxed);
        n
    }

    /// Sleeps until a ring has a packet or a ring was announced: the bell's protocol,
    /// with `block` (a `poll(2)` on [`ShmLink::wake_fd`], and on whatever else the
    /// sleeper waits for) in place of the futex wait, without holding the rings (an
    /// application's poll may take them meanwhile). True if a ring has a packet or
    /// `block` said something it watches is readable (as [`Link::wait_readable`]);
    /// true at once if a ring was ready and `block` did not run. The wake-up socket is
    /// drained first: a byte sent for an earlier sleep may still be there (it only
    /// makes this sleep return early). Every [`SWEEP`] it first drops the rings of
    /// processes that are gone.
    pub(crate) fn sleep_polling(
        &self,
        block: impl FnOnce() -> io::Result<bool>,
    ) -> io::Result<bool> {
        let mut sink = [0u8; 16];
        while self.wake_rx.recv(&mut sink).is_ok() {}
        let (sleepers, seen) = self.sleepers();
        let mut out = None;
        self.bell.sleep(&sleepers, seen, || out = Some(block()));
        match out {
            Some(r) => Ok(r? || self.ready()),
            // A ring had a packet, or a new one was announced.
            None => Ok(true),
        }
    }

    /// The device's wake-up socket, for its sleepers' `poll(2)`.
    pub(crate) fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake_rx.as_fd()
    }

    /// Whether `dst` has a live offer of the link on this host (an auto device sends
    /// to it through the rings).
    pub(crate) fn offered(&self, dst: IpAddr) -> bool {
        std::fs::read_to_string(offer_path(dst, self.port)).is_ok_and(|o| parse_live(&o).is_some())
    }

    /// Sends `runs` through the rings, as [`Link::send`] does.
    pub(crate) fn send_runs(&self, runs: &mut [Transmit<'_>]) -> io::Result<()> {
        let mut peers = self.peers.lock();
        let mut first = Ok(());
        for run in runs {
            let route = run.route;
            for packet in run.packets() {
                if let Err(e) = self.push(&mut peers, route.dst, route.tos, packet) {
                    if first.is_ok() {
                        first = Err(e);
                    }
                }
            }
        }
        first
    }

    /// Hands `into` what the rings hold, as [`Link::receive`] does.
    pub(crate) fn receive_rings(&self, into: &Inbound<'_>, by: Receiver) -> usize {
        self.take(into, by == Receiver::Thread)
    }

    /// Whether any peer sends to this device through a ring (as of the last receive).
    pub(crate) fn has_rings(&self) -> bool {
        self.ring_count.load(Ordering::Relaxed) > 0
    }

    /// Stops offering the link (an auto device whose address another device came
    /// to share: a peer's rings would bring it that device's packets too). Senders
    /// find no offer when they next read it, and go over UDP.
    pub(crate) fn withdraw(&self) {
        remove_own(&self.offer, &self.offer_text);
    }

    /// The rings' sleepers and the generation they were listed at.
    fn sleepers(&self) -> (SmallVec<[Sleeper; 8]>, u64) {
        let mut st = self.inbound.lock();
        if st.swept.elapsed() >= SWEEP {
            st.swept = Instant::now();
            st.rings.retain(|r| crate::host::pid_alive(r.pid));
            self.ring_count.store(st.rings.len(), Ordering::Relaxed);
        }
        let sleepers = st.rings.iter().map(|r| r.rx.sleeper()).collect();
        (sleepers, st.seen)
    }

    /// Whether a ring has a packet or one was announced (false while another thread
    /// takes packets).
    pub(crate) fn ready(&self) -> bool {
        self.inbound.try_lock().is_some_and(|mut st| {
            self.bell.generation() != st.seen
                || st.rings.iter_mut().any(|r| r.rx.ready().unwrap_or(true))
        })
    }
}

impl Link for ShmLink {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn send(&self, runs: &mut [Transmit<'_>]) -> io::Result<()> {
        self.send_runs(runs)
    }

    /// The device thread waits for the rings; an application that polls, or waits
    /// for an event, takes the rings itself unless another thread has them.
    fn receive(&self, into: &Inbound<'_>, by: Receiver) -> usize {
        self.take(into, by == Receiver::Thread)
    }

    /// The device thread, and a thread that waits for its completion event (`also`,
    /// the channel's descriptor), sleep in `poll(2)` on the wake-up socket
    /// ([`ShmLink::sleep_polling`]): such a thread receives for itself what makes its
    /// event, with no wake-up of the device thread in between.
    fn wait_readable(
        &self,
        also: Option<BorrowedFd<'_>>,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        if timeout.is_some_and(|t| t.is_zero()) {
            return Ok(self.ready());
        }
        let fds = [Some(self.wake_fd()), also];
        self.sleep_polling(|| wait_readable_fds(fds.into_iter().flatten(), timeout))
    }

    fn waitable(&self) -> bool {
        true
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        // The offer goes if it is still this link's (a newer device of the address may
        // have replaced it); the rings' listings go with the peers.
        remove_own(&self.offer, &self.offer_text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring that stays full loses packets and stays: once its consumer takes them,
    /// the next packet goes through it.
    #[test]
    fn a_full_ring_loses_packets_and_stays() {
        let port = 30000 + (std::process::id() % 30000) as u16;
        let (ia, ib): (IpAddr, IpAddr) = (
            Ipv4Addr::new(127, 78, 0, 1).into(),
            Ipv4Addr::new(127, 78, 0, 2).into(),
        );
        let (a, b) = (
            ShmLink::new(ia, port).unwrap(),
            ShmLink::new(ib, port).unwrap(),
        );
        let mut packet = vec![7u8; 4096];
        let push = |packet: &mut [u8]| a.push(&mut a.peers.lock(), ib, 0, packet);
        let stalled = || match a.peers.lock().get(&ib) {
            Some(Peer::Attached(out)) => Some(out.stalled),
            _ => None,
        };
        // Nothing takes from b's ring: it fills (some 1000 packets of 4 KiB).
        let mut sent = 0;
        let lost = loop {
            match push(&mut packet) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
            assert!(sent < 2000, "a 4 MiB ring took {sent} packets of 4 KiB");
        };
        assert_eq!(lost.kind(), io::ErrorKind::WouldBlock);
        assert!(sent > 500, "the ring was full after {sent} packets");
        assert_eq!(stalled(), Some(true), "the full ring was dropped");
        // Still full: lost again, the ring still there.
        assert_eq!(
            push(&mut packet).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert_eq!(stalled(), Some(true));
        // The consumer takes them all; the next packet goes through the same ring.
        let mut st = b.inbound.lock();
        b.rescan(&mut st);
        assert_eq!(st.rings.len(), 1);
        let mut buf = vec![0u8; RECORD];
        let mut taken = 0;
        while let Some(len) = st.rings[0].rx.pop(&mut buf).unwrap() {
            assert_eq!(len, PREFIX + 4096);
            taken += 1;
        }
        assert_eq!(taken, sent);
        push(&mut packet).unwrap();
        assert_eq!(stalled(), Some(false));
        assert_eq!(st.rings[0].rx.pop(&mut buf).unwrap(), Some(PREFIX + 4096));
    }
}
