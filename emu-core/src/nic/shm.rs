//! A same-host link through shared memory (`EmuDevice::open_shm`): devices in
//! different processes of one host exchange their RoCEv2 packets, the same bytes with
//! the same ICRC, through `shm_ring` rings instead of UDP sockets.
//!
//! Each device makes one inbound ring (it is the consumer) and offers it in the host's
//! shared folder: the file `shm/IP-PORT` holds its process id and the ring's
//! `/proc/PID/fd/N` path (an address whose offer belongs to a live process is taken;
//! a dead process's offer is replaced). The first packet for a peer address opens that peer's offer
//! and attaches as its producer; each record is the sender's address and TOS
//! ([`PREFIX`] bytes) and then the packet, its ICRC sealed as on a UDP link with IP ID 0
//! and the RoCEv2 port both ways (what [`DeviceDriver`] checks). A device has one
//! inbound ring, so one peer at a time: a second sender finds it taken (`Busy`) and
//! its packets are lost, as on a link that does not reach.
//!
//! Receiving ([`Link::receive`]): the device thread (the UDP device's, `Inner::run`,
//! a [`Receiver::Thread`]) takes what the ring holds, hands it to the engine, fires
//! its timers, and sleeps on the ring's futex ([`Link::wait_readable`]) until the next
//! timer; an empty `poll_cq` ([`Receiver::Poll`]) takes the ring itself, so a polling
//! application sees its completion with no thread in between and no system call; so
//! does a thread that waits for an event ([`Receiver::Idle`]). While the application
//! polls, the thread naps instead of sleeping on the futex, so the peer has no
//! sleeper to wake either.
//!
//! A peer that dies leaves its ring with us: what we send it is lost (once the ring
//! is full its offer is read again, which names a dead process: nothing is sent until
//! a live device offers that address again) and nothing comes from it, so its QPs'
//! retries run out as on a dead link. A peer that writes garbage into a ring makes
//! that ring `Corrupt`: the sender forgets it, the receiver takes nothing more from it.
//! Our own ring stays attached to a producer that died, so a device that comes back on
//! the dead peer's address cannot send to us until we reopen (it is `Busy`).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_wire::{write_icrc, write_icrc_v6, Ipv4Endpoints, Ipv6Endpoints};
use parking_lot::Mutex;
use shm_ring::{Consumer, Producer, Region};
use smallvec::SmallVec;

use super::link::{Link, Receiver, Transmit};
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

/// The inbound ring's data bytes: 4 MiB, some 1000 full-size packets (the memfd's
/// pages are allocated as they are first written).
const RING_BYTES: usize = 4 << 20;

/// How long a sender waits for room in a full ring before it drops the packet.
const FULL_WAIT: Duration = Duration::from_micros(500);

/// How often a peer whose offer could not be opened is looked for again.
const RETRY_OFFER: Duration = Duration::from_millis(20);

fn offer_path(ip: IpAddr, port: u16) -> PathBuf {
    crate::host::folder()
        .join("shm")
        .join(format!("{ip}-{port}"))
}

/// The process that offers a live ring at `ip:port` (its pid, as the
/// [`TakenAddress`](verbs_api::TakenAddress) holder), if any: an offer whose process is
/// gone is stale and may be replaced.
pub(crate) fn holder(ip: IpAddr, port: u16) -> Option<String> {
    let text = std::fs::read_to_string(offer_path(ip, port)).ok()?;
    let pid: u32 = text.split_whitespace().next()?.parse().ok()?;
    crate::host::pid_alive(pid).then(|| format!("process {pid} (shared-memory link)"))
}

/// A packet taken from the ring: from, to, TOS, bytes (as [`Inbound::deliver`] takes
/// them).
type Arrival<'a> = (IpAddr, IpAddr, u8, &'a [u8]);

/// A sending end: the producer of a peer's ring, or when it was last looked for.
enum Peer {
    Attached(Producer),
    Missing(Instant),
}

/// The shared-memory link of one device (see the module's documentation).
pub(crate) struct ShmLink {
    ip: IpAddr,
    port: u16,
    /// The offer file this link wrote (removed when it closes, if still its own).
    offer: PathBuf,
    offer_text: String,
    /// The inbound ring and [`BATCH`] record buffers to take packets into.
    inbound: Mutex<(Consumer, Vec<u8>)>,
    /// The inbound ring's region, kept so its /proc path stays valid.
    _region: Arc<Region>,
    /// The inbound ring's producer left or broke it (see [`ShmLink::wait`]).
    inbound_dead: AtomicBool,
    peers: Mutex<HashMap<IpAddr, Peer>>,
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
    /// Makes the device's inbound ring and offers it at `shm/IP-PORT` in the host's
    /// shared folder (replacing an older offer for the address).
    pub(crate) fn new(ip: IpAddr, port: u16) -> io::Result<ShmLink> {
        let region = Arc::new(
            Region::create_shared(&format!("rdma-emu-{ip}"), RING_BYTES, RECORD)
                .map_err(ring_error)?,
        );
        let inbound = Consumer::attach(region.clone()).map_err(ring_error)?;
        let path = region
            .path()
            .ok_or_else(|| io::Error::other("ring not shared"))?;
        let offer = offer_path(ip, port);
        let dir = offer.parent().expect("the offer has a folder");
        std::fs::create_dir_all(dir)?;
        if holder(ip, port).is_some() {
            return Err(io::ErrorKind::AddrInUse.into());
        }
        let offer_text = format!("{} {}\n", std::process::id(), path.display());
        // Written aside and renamed: a reader sees the old offer or the whole new one.
        let tmp = dir.join(format!(".{ip}-{port}.{}", std::process::id()));
        std::fs::write(&tmp, &offer_text)?;
        std::fs::rename(&tmp, &offer)?;
        Ok(ShmLink {
            ip,
            port,
            offer,
            offer_text,
            inbound: Mutex::new((inbound, vec![0; BATCH * RECORD])),
            _region: region,
            inbound_dead: AtomicBool::new(false),
            peers: Mutex::new(HashMap::new()),
        })
    }

    /// Opens `dst`'s offer and attaches to its ring as the producer.
    fn attach(&self, dst: IpAddr) -> Option<Producer> {
        let text = std::fs::read_to_string(offer_path(dst, self.port)).ok()?;
        let (pid, path) = text.trim().split_once(' ')?;
        if !crate::host::pid_alive(pid.parse().ok()?) {
            return None;
        }
        let region = Region::open_shared(path.as_ref()).ok()?;
        Producer::attach(Arc::new(region)).ok()
    }

    /// Seals `packet`'s ICRC for `dst` and pushes it with its prefix to `dst`'s ring.
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
        let now = Instant::now();
        let peer = peers.entry(dst).or_insert(Peer::Missing(now - RETRY_OFFER));
        if let Peer::Missing(at) = peer {
            if now.duration_since(*at) < RETRY_OFFER {
                return Err(io::ErrorKind::NotConnected.into());
            }
            *peer = match self.attach(dst) {
                Some(p) => Peer::Attached(p),
                None => Peer::Missing(now),
            };
        }
        let Peer::Attached(tx) = peer else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        let from = match self.ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        let mut prefix = [0u8; PREFIX];
        prefix[..16].copy_from_slice(&from.octets());
        prefix[16] = tos;
        let mut full_since = None;
        let r = loop {
            match tx.push_parts(&[&prefix, packet]) {
                // The peer's thread drains the ring; give it a moment before the
                // packet is dropped (a peer that stopped taking packets, or both rings
                // full while each side's receiver waits for its own engine, must not
                // hold this sender for long).
                Err(shm_ring::Error::Full)
                    if full_since.get_or_insert_with(Instant::now).elapsed() < FULL_WAIT =>
                {
                    std::thread::yield_now();
                }
                r => break r,
            }
        };
        match r {
            Ok(()) => Ok(()),
            // Lost, as a datagram a full socket buffer drops; RC sends it again. A ring
            // that stayed full that long may be a dead peer's: its offer is read again
            // (a live peer's ring is found again, a dead one's is not, and a peer
            // that came back offers a new one) before the next packet, not before
            // RETRY_OFFER, so a dead peer costs no more waits.
            Err(shm_ring::Error::Full) => {
                *peer = Peer::Missing(now);
                Err(io::ErrorKind::WouldBlock.into())
            }
            // The peer left or broke its ring: look for a new offer later.
            Err(e) => {
                *peer = Peer::Missing(now);
                Err(ring_error(e))
            }
        }
    }

    /// Hands `into` up to [`BATCH`] packets from the inbound ring, under one lock of
    /// the engine; how many. `block`: wait for the ring's lock (the device thread),
    /// else give up if another thread holds it (an application's poll or wait).
    fn take(&self, into: &Inbound<'_>, block: bool) -> usize {
        let mut rx = if block {
            self.inbound.lock()
        } else {
            match self.inbound.try_lock() {
                Some(g) => g,
                None => return 0,
            }
        };
        let (rx, bufs) = &mut *rx;
        let mut lens = [0usize; BATCH];
        let mut n = 0;
        while n < BATCH {
            let slot = &mut bufs[n * RECORD..(n + 1) * RECORD];
            match rx.pop(slot) {
                Ok(Some(len)) if len > PREFIX => {
                    lens[n] = len;
                    n += 1;
                }
                // A record too short to be a packet: dropped.
                Ok(Some(_)) => {}
                Ok(None) => break,
                // The peer left or broke the ring: nothing more from it.
                Err(_) => {
                    self.inbound_dead.store(true, Ordering::Relaxed);
                    break;
                }
            }
        }
        if n == 0 {
            return 0;
        }
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
        n
    }

    /// Sleeps until the inbound ring has a packet or `timeout` passed, without holding
    /// the ring: an application's poll may take it meanwhile.
    ///
    /// A ring whose producer left or broke it never has a packet again, and its futex
    /// wait would return at once: the thread then sleeps the whole `timeout` instead of
    /// spinning.
    fn wait(&self, timeout: Duration) {
        if !self.inbound_dead.load(Ordering::Relaxed) {
            let sleeper = self.inbound.lock().0.sleeper();
            if sleeper.wait(Some(timeout)).is_ok() && !sleeper.closed() {
                return;
            }
            self.inbound_dead.store(true, Ordering::Relaxed);
        }
        std::thread::sleep(timeout);
    }

    /// Whether a packet waits in the inbound ring (false while another thread takes
    /// packets from it).
    fn ready(&self) -> bool {
        !self.inbound_dead.load(Ordering::Relaxed)
            && self
                .inbound
                .try_lock()
                .is_some_and(|mut g| g.0.ready().unwrap_or(false))
    }
}

impl Link for ShmLink {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn send(&self, runs: &mut [Transmit<'_>]) -> io::Result<()> {
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

    /// The device thread waits for the ring; an application that polls, or waits
    /// for an event, takes the ring itself unless another thread has it.
    fn receive(&self, into: &Inbound<'_>, by: Receiver) -> usize {
        self.take(into, by == Receiver::Thread)
    }

    /// The device thread sleeps on the ring's futex (no second descriptor to wait
    /// for: not [`Link::waitable`]).
    fn wait_readable(
        &self,
        also: Option<BorrowedFd<'_>>,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        if also.is_some() {
            return Err(io::ErrorKind::Unsupported.into());
        }
        match timeout {
            Some(t) if t.is_zero() => Ok(self.ready()),
            t => {
                self.wait(t.unwrap_or(Duration::from_secs(1)));
                Ok(self.ready())
            }
        }
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        // The offer goes if it is still this link's (a newer device of the address may
        // have replaced it).
        if std::fs::read_to_string(&self.offer).is_ok_and(|t| t == self.offer_text) {
            let _ = std::fs::remove_file(&self.offer);
        }
    }
}
