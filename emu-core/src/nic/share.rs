//! One address, several devices: processes open the emulated device of one address as
//! processes open one kernel rxe device, and each gets the packets of its own QPs.
//!
//! Each device that opens an address is a **member** of it. It binds the address's
//! port with `SO_REUSEPORT` (the kernel then gives each datagram to one member's
//! socket, chosen by a hash of the sender's address and port), holds a slot file in the
//! host's shared folder (`IP-PORT/SLOT` under `crate::host::folder`, with its process,
//! its heartbeat and the port of its **inbox**, a socket of its own on the address),
//! and hands out QP numbers from the block of its slot (`Engine::set_qpn_block`: the
//! slot is a QPN's top six bits). A member that receives a datagram for another
//! member's QP passes it on to that member's inbox, unchanged, behind a small header
//! that says who sent it ([`RELAY_HEADER`]); the owner then checks its ICRC and takes
//! it as if it had received it itself. QP1 is every member's: a CM MAD goes to the
//! process whose CM it is for ([`emu_wire::mad::Addressee`]): a request to the
//! process that claimed its port (`crate::ports`), any other message to the member whose
//! slot is the top six bits of the communication ID it names (the CM numbers its
//! connections in its device's block, as it numbers its QPs).
//!
//! A slot is held by an exclusive `flock` on its file for as long as the device is
//! open: the kernel lets go of it when the process ends, however it ends, so a slot is
//! free exactly when no open device holds it. Slot files are never removed (removing
//! one would let two processes hold the same slot through two files); a member that
//! closes zeroes its record, and one whose process is gone is not a member.

use std::fs::{File, OpenOptions};
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::interop::LinkOptions;
use super::udp::UdpLink;
use crate::engine::{COMM_BLOCK_SHIFT, QPN_BLOCK_BITS, QPN_BLOCK_SHIFT};
use crate::host;
use emu_wire::mad::Addressee;

/// How many devices may share one address: one per QPN block.
pub(crate) const MEMBERS: usize = 1 << QPN_BLOCK_BITS;

/// How a passed-on datagram starts: the sender's address as 16 bytes (an IPv4 one
/// IPv4-mapped) and UDP port (network order), the TOS byte it arrived with, and a
/// marker; the RoCEv2 payload follows.
pub(crate) const RELAY_HEADER: usize = 20;
const RELAY_MARK: u8 = 0xE1;

/// A slot file's record: heartbeat (monotonic ns), process id, inbox port, and a byte
/// that a device joining the address sets in the records of those already there.
const RECORD: usize = 16;
/// Where the "another device joined" byte is in a record.
const JOINED: u64 = 14;

fn dir(ip: IpAddr, port: u16) -> PathBuf {
    host::folder().join(format!("{ip}-{port}"))
}

/// What a slot file says of its member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// When its device thread last ran (monotonic ns).
    pub(crate) beat_ns: u64,
    pub(crate) pid: u32,
    /// The port of its inbox on the address; 0 when it takes no passed-on datagrams
    /// (a device that does not share its address).
    pub(crate) inbox: u16,
}

/// The record of the member in `slot` of `ip:port`, if that member is alive: its
/// process exists and its slot is held (a shared lock on the file is refused; the pid
/// alone could be another process's by now).
pub(crate) fn read_member(ip: IpAddr, port: u16, slot: u8) -> Option<Record> {
    read_record(&dir(ip, port).join(slot.to_string()))
}

fn read_record(path: &std::path::Path) -> Option<Record> {
    let f = File::open(path).ok()?;
    let mut b = [0u8; RECORD];
    f.read_exact_at(&mut b, 0).ok()?;
    let r = Record {
        beat_ns: u64::from_le_bytes(b[..8].try_into().ok()?),
        pid: u32::from_le_bytes(b[8..12].try_into().ok()?),
        inbox: u16::from_le_bytes(b[12..14].try_into().ok()?),
    };
    let held = matches!(
        Flock::lock(f, FlockArg::LockSharedNonblock),
        Err((_, Errno::EWOULDBLOCK))
    );
    (held && host::pid_alive(r.pid)).then_some(r)
}

/// This device's membership of its address: its slot, held while the value lives.
#[derive(Debug)]
pub(crate) struct Member {
    /// The slot's file, locked (exclusive `flock`) while the member lives.
    file: Flock<File>,
    slot: u8,
    inbox: u16,
    last_beat: Instant,
    /// Other devices shared the address when this one joined.
    pub(crate) joined_others: bool,
}

/// How often a device's thread writes its heartbeat (see `liveness`).
pub(crate) const BEAT: Duration = Duration::from_millis(10);

impl Member {
    /// Takes the first free slot of `ip:port` for a device whose inbox is `inbox` (0:
    /// none). Fails when the shared folder cannot be written or every slot is taken.
    #[cfg(test)]
    pub(crate) fn join(ip: IpAddr, port: u16, inbox: u16) -> io::Result<Member> {
        Member::join_in(ip, port, inbox, None)
    }

    /// Takes slot `want` of `ip:port`, or the first free one when `want` is None;
    /// `AddrInUse` when the slot (every slot) is taken. A device on both address
    /// families takes the slot of its first address on the second one (`dual`): a
    /// member passes datagrams on by the slot in the QPN, which must name the same
    /// device on both.
    pub(crate) fn join_in(
        ip: IpAddr,
        port: u16,
        inbox: u16,
        want: Option<u8>,
    ) -> io::Result<Member> {
        let d = dir(ip, port);
        if d.is_file() {
            // A heartbeat file of an older version, whose device is gone.
            let _ = std::fs::remove_file(&d);
        }
        std::fs::create_dir_all(&d)?;
        let slots = match want {
            Some(s) => s..s.saturating_add(1),
            None => 0..MEMBERS as u8,
        };
        for slot in slots {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(d.join(slot.to_string()))?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(file) => {
                    let mut m = Member {
                        file,
                        slot,
                        inbox,
                        last_beat: Instant::now(),
                        joined_others: false,
                    };
                    m.write(std::process::id());
                    if inbox != 0 {
                        m.joined_others = tell_others(&d, slot);
                    }
                    return Ok(m);
                }
                Err((_, Errno::EWOULDBLOCK)) => continue,
                Err((_, e)) => return Err(e.into()),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            match want {
                Some(s) => format!("slot {s} of {ip}:{port} is another device's"),
                None => format!("{ip}:{port} is shared by {MEMBERS} devices already"),
            },
        ))
    }

    fn write(&self, pid: u32) {
        let mut b = [0u8; RECORD];
        b[..8].copy_from_slice(&host::mono_ns().to_le_bytes());
        b[8..12].copy_from_slice(&pid.to_le_bytes());
        b[12..14].copy_from_slice(&self.inbox.to_le_bytes());
        let _ = self.file.write_at(&b, 0);
    }

    /// The slot: the block of the device's QPNs and communication IDs.
    pub(crate) fn slot(&self) -> u8 {
        self.slot
    }

    /// The device ran at `now`: writes its heartbeat if [`BEAT`] has passed. Returns
    /// whether another device has joined the address since the last look (it passes
    /// datagrams on to this one's inbox from now on).
    pub(crate) fn beat(&mut self, now: Instant) -> bool {
        if now.saturating_duration_since(self.last_beat) < BEAT {
            return false;
        }
        self.last_beat = now;
        let _ = self.file.write_at(&host::mono_ns().to_le_bytes(), 0);
        let mut joined = [0u8];
        if self.file.read_exact_at(&mut joined, JOINED).is_ok() && joined[0] != 0 {
            let _ = self.file.write_at(&[0], JOINED);
            return true;
        }
        false
    }
}

/// Marks the records of the other live members of the address in `d` (all but `slot`)
/// with "another device joined" (they take passed-on datagrams from now on); whether
/// there was any.
fn tell_others(d: &std::path::Path, slot: u8) -> bool {
    let mut any = false;
    for s in (0..MEMBERS as u8).filter(|s| *s != slot) {
        let path = d.join(s.to_string());
        if read_record(&path).is_some_and(|r| r.inbox != 0) {
            if let Ok(f) = OpenOptions::new().write(true).open(&path) {
                let _ = f.write_at(&[1], JOINED);
            }
            any = true;
        }
    }
    any
}

impl Drop for Member {
    fn drop(&mut self) {
        // No longer a member; the lock goes with the file.
        self.write(0);
    }
}

/// Binds the UDP link of a device on `ip:port` and makes the device a member of its
/// address: shared (`SO_REUSEPORT`, an inbox, a slot whose block its QPNs come from)
/// unless the link keeps the address to itself (`UdpLink::shares`), in which case it
/// still takes a slot for its heartbeat. Without a shared folder the device keeps the
/// address to itself and has no slot. With `want`, the device takes that slot or none
/// (see [`Member::join_in`]). An error says what failed.
pub(crate) fn bind(
    ip: IpAddr,
    port: u16,
    opts: &LinkOptions,
    want: Option<u8>,
) -> Result<(UdpLink, Option<Member>), (&'static str, io::Error)> {
    // A slot for its heartbeat only, when `slot`.
    let alone = |slot: bool| {
        let udp =
            UdpLink::bind(ip, port, opts, None).map_err(|e| ("bind the device's UDP socket", e))?;
        let m = slot
            .then(|| Member::join_in(ip, udp.port(), 0, want).ok())
            .flatten();
        Ok((udp, m))
    };
    if !UdpLink::shares(port, opts) {
        return alone(true);
    }
    let inbox = UdpLink::open_inbox(ip).map_err(|e| ("open the device's inbox", e))?;
    let inbox_port = inbox.local_addr().map_or(0, |a| a.port());
    let member = match Member::join_in(ip, port, inbox_port, want) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            return Err(("share the device's address", e))
        }
        // No shared folder: the address is this device's alone.
        Err(_) => return alone(false),
    };
    let mut udp = UdpLink::bind(ip, port, opts, Some(inbox))
        .map_err(|e| ("bind the device's UDP socket", e))?;
    udp.join_address(member.slot(), member.joined_others);
    Ok((udp, Some(member)))
}

/// Who holds the UDP socket bound to `ip:port`: `process PID (COMMAND)`, from the
/// socket's inode in `/proc/net/udp` and the process with a descriptor on it. None when
/// it cannot be told (another user's process, a socket bound to every address).
pub(crate) fn holder(ip: IpAddr, port: u16) -> Option<String> {
    // /proc/net/udp writes the address as the bytes of the (network order) u32 in host
    // order, then the port: "0100007F:12B7" for 127.0.0.1:4791; /proc/net/udp6 each of
    // the four u32 of an IPv6 address so.
    let words = |o: &[u8]| -> String {
        o.chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect()
    };
    let (want, file) = match ip {
        IpAddr::V4(v4) => (format!("{}:{port:04X}", words(&v4.octets())), "udp"),
        IpAddr::V6(v6) => (format!("{}:{port:04X}", words(&v6.octets())), "udp6"),
    };
    let table = std::fs::read_to_string(format!("/proc/net/{file}")).ok()?;
    let inode = table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&want.as_str())).then(|| f.get(9).map(|s| s.to_string()))?
    })?;
    let target = format!("socket:[{inode}]");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str())
        });
        if holds {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            return Some(format!("process {pid} ({})", comm.trim()));
        }
    }
    None
}

/// Where a received datagram goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// To this device's engine.
    Here,
    /// To another member's inbox.
    To(SocketAddr),
}

/// How long a reading of the members is trusted before a datagram for a member not in
/// it makes the router read again. A member that joins tells those there (their next
/// heartbeat, [`Router::forget`]), so this only bounds the cost of datagrams for QPNs
/// no member holds (junk with a right ICRC), a reading of up to 64 files each.
const REREAD: Duration = Duration::from_secs(1);

/// A member's view of the others, to pass their datagrams on.
#[derive(Debug)]
pub(crate) struct Router {
    ip: IpAddr,
    /// The scope of a link-local `ip` (its interface's index).
    scope: u32,
    port: u16,
    slot: u8,
    pid: u32,
    /// Each slot's process and inbox port, as last read.
    members: [Option<(u32, u16)>; MEMBERS],
    read_at: Option<Instant>,
}

impl Router {
    /// The router of the member in `slot` of `ip:port`.
    pub(crate) fn new(ip: IpAddr, scope: u32, port: u16, slot: u8) -> Router {
        Router {
            ip,
            scope,
            port,
            slot,
            pid: std::process::id(),
            members: [None; MEMBERS],
            read_at: None,
        }
    }

    /// Another device joined the address: read the members again at the next datagram
    /// for another member. The whole reading goes, not only the read time: the newcomer
    /// may have taken the slot of a member that left, with an inbox of its own, and
    /// what is passed on to the old inbox is lost.
    pub(crate) fn forget(&mut self) {
        self.members = [None; MEMBERS];
        self.read_at = None;
    }

    fn reread(&mut self, now: Instant) {
        if self
            .read_at
            .is_some_and(|t| now.saturating_duration_since(t) < REREAD)
        {
            return;
        }
        self.read_at = Some(now);
        for s in 0..MEMBERS {
            self.members[s] = (s != usize::from(self.slot))
                .then(|| read_member(self.ip, self.port, s as u8))
                .flatten()
                .filter(|r| r.inbox != 0)
                .map(|r| (r.pid, r.inbox));
        }
    }

    /// The inbox of the member in `slot`, reading the members again if it is not known.
    fn inbox(&mut self, slot: u8, now: Instant) -> Route {
        if slot == self.slot {
            return Route::Here;
        }
        let s = usize::from(slot) % MEMBERS;
        if self.members[s].is_none() {
            self.reread(now);
        }
        match self.members[s] {
            Some((_, inbox)) => Route::To(self.inbox_addr(inbox)),
            None => Route::Here,
        }
    }

    /// The socket address of the inbox on `port` of our address.
    fn inbox_addr(&self, port: u16) -> SocketAddr {
        match self.ip {
            IpAddr::V4(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
            IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, port, 0, self.scope)),
        }
    }

    /// Where the RoCEv2 payload `packet`, received for `dst`, goes. What is not
    /// another member's (multicast, this member's QPs, junk) stays here, where the
    /// engine takes or counts it.
    pub(crate) fn route(&mut self, packet: &[u8], dst: IpAddr, now: Instant) -> Route {
        if dst != self.ip || packet.len() < 12 {
            return Route::Here;
        }
        let qpn = u32::from_be_bytes([0, packet[5], packet[6], packet[7]]);
        match qpn {
            0x00FF_FFFF => Route::Here,
            // QP1: the BTH, a DETH, then the MAD.
            1 => match packet.get(20..).and_then(Addressee::of) {
                Some(Addressee::Comm(c)) => self.inbox((c >> COMM_BLOCK_SHIFT) as u8, now),
                Some(Addressee::Service(sid)) => self.listener(sid, now),
                Some(Addressee::Any) | None => Route::Here,
            },
            q => self.inbox((q >> QPN_BLOCK_SHIFT) as u8, now),
        }
    }

    /// The member whose process listens on service ID `sid` (an RDMA CM service ID:
    /// port space and port, [`crate::ports`]).
    fn listener(&mut self, sid: u64, now: Instant) -> Route {
        if sid >> 32 != 0 {
            return Route::Here;
        }
        let (ps, port) = ((sid >> 16) as u16, sid as u16);
        let Some(h) = crate::ports::holder(ps, self.ip, port) else {
            return Route::Here;
        };
        if let Some(slot) = h.member {
            return self.inbox(slot, now);
        }
        if h.pid == self.pid {
            return Route::Here;
        }
        let find = |r: &Router| {
            r.members
                .iter()
                .flatten()
                .find(|(pid, _)| *pid == h.pid)
                .copied()
        };
        let found = find(self).or_else(|| {
            self.reread(now);
            find(self)
        });
        match found {
            Some((_, inbox)) => Route::To(self.inbox_addr(inbox)),
            None => Route::Here,
        }
    }
}

/// The header that goes before a datagram passed on to another member.
pub(crate) fn relay_header(from: SocketAddr, tos: u8) -> [u8; RELAY_HEADER] {
    let mut h = [0u8; RELAY_HEADER];
    let ip = match from.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    h[..16].copy_from_slice(&ip.octets());
    h[16..18].copy_from_slice(&from.port().to_be_bytes());
    h[18] = tos;
    h[19] = RELAY_MARK;
    h
}

/// Reads a passed-on datagram's header: its original sender and TOS byte.
pub(crate) fn parse_relay_header(b: &[u8]) -> Option<(SocketAddr, u8)> {
    let h = b.get(..RELAY_HEADER)?;
    (h[19] == RELAY_MARK).then(|| {
        let a: [u8; 16] = h[..16].try_into().unwrap_or_default();
        let ip = Ipv6Addr::from(a);
        let port = u16::from_be_bytes([h[16], h[17]]);
        let from = match ip.to_ipv4_mapped() {
            Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
            None => SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0)),
        };
        (from, h[18])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn unique_ip() -> IpAddr {
        let p = std::process::id();
        IpAddr::V4(Ipv4Addr::new(127, 96, (p >> 8) as u8, p as u8))
    }

    /// Slots are taken lowest first and held while the member lives; a member's
    /// record names its process and inbox; a closed member is no member.
    #[test]
    fn members_take_the_first_free_slot() {
        let ip = unique_ip();
        let a = Member::join(ip, 4791, 1111).unwrap();
        let b = Member::join(ip, 4791, 2222).unwrap();
        assert_eq!((a.slot(), b.slot()), (0, 1));
        let r = read_member(ip, 4791, 1).unwrap();
        assert_eq!((r.pid, r.inbox), (std::process::id(), 2222));
        drop(a);
        assert_eq!(read_member(ip, 4791, 0), None);
        let c = Member::join(ip, 4791, 3333).unwrap();
        assert_eq!(c.slot(), 0, "a freed slot is taken again");
        drop((b, c));
        // A record naming a live process (this one) in a slot nobody holds: the pid
        // was reused, the member is gone.
        let mut rec = [0u8; RECORD];
        rec[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        rec[12..14].copy_from_slice(&4444u16.to_le_bytes());
        std::fs::write(dir(ip, 4791).join("5"), rec).unwrap();
        assert_eq!(read_member(ip, 4791, 5), None);
        // Where an older version left a heartbeat file under the address's name.
        let old = dir(ip, 4794);
        std::fs::write(&old, [0u8; 16]).unwrap();
        assert_eq!(Member::join(ip, 4794, 1).unwrap().slot(), 0);
    }

    /// A device that joins an address tells those already there, once, at their next
    /// heartbeat; a device alone is told nothing.
    #[test]
    fn members_learn_that_another_joined() {
        let ip = unique_ip();
        let mut a = Member::join(ip, 4793, 1111).unwrap();
        assert!(!a.joined_others);
        let later = Instant::now() + BEAT;
        assert!(!a.beat(later), "alone");
        let b = Member::join(ip, 4793, 2222).unwrap();
        assert!(b.joined_others);
        assert!(a.beat(later + BEAT), "told at its next beat");
        assert!(!a.beat(later + 2 * BEAT), "told once");
        drop(b);
    }

    fn bth(qpn: u32) -> Vec<u8> {
        let mut p = vec![0u8; 12];
        p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        p
    }

    /// A datagram goes to the member whose block holds its QPN; one for a slot with
    /// no member, for this member, or multicast stays here.
    #[test]
    fn datagrams_go_to_the_member_of_their_qpn() {
        let ip = unique_ip();
        let port = 4792;
        let me = Member::join(ip, port, 1111).unwrap();
        let other = Member::join(ip, port, 2222).unwrap();
        let mut r = Router::new(ip, 0, port, me.slot());
        let now = Instant::now();
        let theirs = u32::from(other.slot()) << QPN_BLOCK_SHIFT | 0x42;
        let mine = u32::from(me.slot()) << QPN_BLOCK_SHIFT | 0x42;
        assert_eq!(
            r.route(&bth(theirs), ip, now),
            Route::To(SocketAddr::new(ip, 2222))
        );
        assert_eq!(r.route(&bth(mine), ip, now), Route::Here);
        assert_eq!(r.route(&bth(0xFF_FFFF), ip, now), Route::Here);
        assert_eq!(
            r.route(&bth(theirs), Ipv4Addr::new(239, 1, 1, 1).into(), now),
            Route::Here
        );
        assert_eq!(r.route(&bth(5 << QPN_BLOCK_SHIFT), ip, now), Route::Here);
        assert_eq!(r.route(&[0u8; 5], ip, now), Route::Here);
        drop(other);
    }

    /// A member that leaves and a newcomer that takes its slot: once told (the
    /// newcomer's join, [`Router::forget`]), the router passes the slot's datagrams to
    /// the newcomer's inbox, not the old one.
    #[test]
    fn a_reused_slot_gets_the_newcomers_inbox() {
        let ip = unique_ip();
        let port = 4795;
        let me = Member::join(ip, port, 1111).unwrap();
        let old = Member::join(ip, port, 2222).unwrap();
        let slot = old.slot();
        let mut r = Router::new(ip, 0, port, me.slot());
        let now = Instant::now();
        let qpn = u32::from(slot) << QPN_BLOCK_SHIFT | 7;
        assert_eq!(
            r.route(&bth(qpn), ip, now),
            Route::To(SocketAddr::new(ip, 2222))
        );
        drop(old);
        let new = Member::join(ip, port, 3333).unwrap();
        assert_eq!(new.slot(), slot, "the freed slot is taken again");
        r.forget();
        assert_eq!(
            r.route(&bth(qpn), ip, now),
            Route::To(SocketAddr::new(ip, 3333))
        );
        drop((me, new));
    }

    /// The header carries the sender and TOS; anything without the marker is refused.
    #[test]
    fn relay_header_round_trips() {
        let from = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 3), 50_000));
        let mut b = relay_header(from, 0x88).to_vec();
        b.extend_from_slice(b"payload");
        assert_eq!(parse_relay_header(&b), Some((from, 0x88)));
        let v6 = SocketAddr::V6(SocketAddrV6::new("fd00::5".parse().unwrap(), 4791, 0, 0));
        assert_eq!(parse_relay_header(&relay_header(v6, 2)), Some((v6, 2)));
        b[19] = 0;
        assert_eq!(parse_relay_header(&b), None);
        assert_eq!(parse_relay_header(&b[..3]), None);
    }
}
