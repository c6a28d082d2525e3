//! The junk sender of a UDP soak: a thread that sends datagrams no device should take
//! to each device's port from plain UDP sockets, counts what it sent by kind, and the
//! check that each device counted them under the right counter.
//!
//! Kinds, and where a device counts them:
//! - random bytes (from a junk address): `icrc_errors`;
//! - a header cut short (a WRITE's BTH and RETH cut at a random length) with a valid
//!   ICRC: `rx_malformed`;
//! - a well-formed WRITE with a bad ICRC: `icrc_errors`;
//! - a valid packet for a QPN the device never had: `rx_unknown_qp`;
//! - from the peer's own address, a valid WRITE to a live RC QP, with its R_Key and
//!   an address in its MR, but a PSN 2^21 to 2^22 away from the expected one (ahead or
//!   behind): out of sequence or duplicate (or unknown QP, if the QP was just
//!   destroyed). It must never write a byte; the soak's byte checks see to that.
//!
//! A device cannot see the IPv4 identification its ICRC covers, so it accepts an ICRC
//! that some identification makes right ([`emu_wire::icrc_ip_id`]): one random ICRC in
//! 2^16 passes. Whether one does depends only on the datagram and its addresses, so
//! the sender asks the same function and counts such datagrams apart (`lucky`); the
//! device then counts each of them as malformed, unknown QP or out of sequence, and
//! the `icrc_errors` count is exact.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use emu_wire::{icrc_ip_id, write_icrc, Ipv4Endpoints, Opcode, PacketRepr, Psn, RethRepr};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The kinds of junk, in the order of [`JunkCounts`].
pub const KINDS: [&str; 5] = [
    "random",
    "truncated",
    "bad-icrc",
    "unknown-qpn",
    "wrong-psn",
];

/// Where [`JunkCounts`] keeps, after the kinds, how many of the random and bad-ICRC
/// datagrams carry an ICRC that passes by chance (also counted under their kind).
pub const LUCKY: usize = KINDS.len();

/// Junk datagrams sent to one device instance, by kind (see [`KINDS`]), then the
/// [`LUCKY`] count.
pub type JunkCounts = [u64; LUCKY + 1];

/// A live RC QP the junk may aim wrong PSNs at.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// The RC flow it belongs to.
    pub(crate) flow: usize,
    pub(crate) qpn: u32,
    pub(crate) rkey: u32,
    pub(crate) addr: u64,
    /// Its peer's address (the junk comes from there).
    pub(crate) peer: Ipv4Addr,
    /// The PSN its peer sends next, about (kept by the flow).
    pub(crate) psn: Arc<AtomicU32>,
}

#[derive(Debug, Default)]
struct Dev {
    up: bool,
    targets: Vec<Target>,
    /// Every QPN the device ever had (unknown-QPN junk avoids them).
    qpns: HashSet<u32>,
    sent: JunkCounts,
}

/// What the soak's driver and the junk thread share.
#[derive(Debug)]
pub(crate) struct Junk {
    stop: AtomicBool,
    devs: Mutex<Vec<Dev>>,
}

impl Junk {
    pub(crate) fn new(devices: usize) -> Arc<Junk> {
        Arc::new(Junk {
            stop: AtomicBool::new(false),
            devs: Mutex::new((0..devices).map(|_| Dev::default()).collect()),
        })
    }

    /// Device `d` is open (again): junk to it is counted from zero.
    pub(crate) fn up(&self, d: usize) {
        let mut devs = self.devs.lock();
        devs[d].up = true;
        devs[d].sent = JunkCounts::default();
    }

    /// Device `d` is about to close: no more junk to it; what it was sent.
    pub(crate) fn down(&self, d: usize) -> JunkCounts {
        let mut devs = self.devs.lock();
        devs[d].up = false;
        devs[d].targets.clear();
        devs[d].sent
    }

    /// What device `d`'s current instance was sent.
    pub(crate) fn sent(&self, d: usize) -> JunkCounts {
        self.devs.lock()[d].sent
    }

    /// A QPN device `d` has (made by the soak).
    pub(crate) fn add_qpn(&self, d: usize, qpn: u32) {
        self.devs.lock()[d].qpns.insert(qpn);
    }

    /// RC flow `t.flow`'s responder QP on device `d` (replacing the flow's last one).
    pub(crate) fn set_target(&self, d: usize, t: Target) {
        let mut devs = self.devs.lock();
        let ts = &mut devs[d].targets;
        ts.retain(|o| o.flow != t.flow);
        ts.push(t);
    }

    /// RC flow `flow` has no responder QP on device `d` now.
    pub(crate) fn clear_target(&self, d: usize, flow: usize) {
        self.devs.lock()[d].targets.retain(|o| o.flow != flow);
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Starts the thread: `rate` datagrams a second to each device in `ips` on `port`,
    /// from `junk_ip` (and from the devices' own addresses for wrong PSNs and bad
    /// ICRCs), drawn from ChaCha seeded with `seed`.
    pub(crate) fn start(
        self: &Arc<Self>,
        seed: u64,
        rate: u32,
        ips: Vec<Ipv4Addr>,
        junk_ip: Ipv4Addr,
        port: u16,
    ) -> std::io::Result<JoinHandle<()>> {
        let stranger = UdpSocket::bind((junk_ip, 0))?;
        let peers = ips
            .iter()
            .map(|&ip| UdpSocket::bind((ip, 0)))
            .collect::<std::io::Result<Vec<_>>>()?;
        let me = self.clone();
        Ok(std::thread::spawn(move || {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let tick = Duration::from_millis(2);
            let per_tick = f64::from(rate) * tick.as_secs_f64();
            let mut owed = 0.0;
            let mut next = Instant::now();
            while !me.stop.load(Ordering::Relaxed) {
                owed += per_tick;
                while owed >= 1.0 {
                    owed -= 1.0;
                    for (d, &ip) in ips.iter().enumerate() {
                        me.send_one(
                            &mut rng,
                            d,
                            SocketAddrV4::new(ip, port),
                            &stranger,
                            &peers,
                            &ips,
                        );
                    }
                }
                next += tick;
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                } else {
                    next = now;
                }
            }
        }))
    }

    fn send_one(
        &self,
        rng: &mut ChaCha8Rng,
        d: usize,
        to: SocketAddrV4,
        stranger: &UdpSocket,
        peers: &[UdpSocket],
        ips: &[Ipv4Addr],
    ) {
        let mut devs = self.devs.lock();
        let dev = &mut devs[d];
        if !dev.up {
            return;
        }
        let mut kind = rng.gen_range(0..KINDS.len());
        let target = (!dev.targets.is_empty())
            .then(|| dev.targets[rng.gen_range(0..dev.targets.len())].clone());
        if target.is_none() && kind >= 2 && kind != 3 {
            kind = 3;
        }
        let from_sock = |ip: Ipv4Addr| {
            let i = ips.iter().position(|&x| x == ip);
            i.map_or(stranger, |i| &peers[i])
        };
        let (sock, bytes) = match kind {
            0 => {
                let len = rng.gen_range(0..160);
                let b: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                (stranger, b)
            }
            1 => {
                let qpn = dev.targets.first().map_or(0x12, |t| t.qpn);
                let full = write_packet(qpn, Psn::new(rng.gen_range(0..1 << 24)), 0, 0, &[]);
                // BTH (12) and RETH (16), cut inside them, then an ICRC slot.
                let mut b = full[..rng.gen_range(0..28)].to_vec();
                b.extend([0; 4]);
                (stranger, b)
            }
            2 | 4 => {
                let t = target.expect("a target");
                let expected = t.psn.load(Ordering::Relaxed);
                let away = (1u32 << 21) + rng.gen_range(0..1u32 << 21);
                let psn = if rng.gen() {
                    expected.wrapping_add(away)
                } else {
                    expected.wrapping_sub(away)
                };
                let payload: Vec<u8> = (0..rng.gen_range(1..64)).map(|_| rng.gen()).collect();
                let b = write_packet(t.qpn, Psn::new(psn & 0xFF_FFFF), t.addr, t.rkey, &payload);
                (from_sock(t.peer), b)
            }
            _ => {
                let qpn = loop {
                    let q = rng.gen_range(0x100..0xFF_FFFF);
                    if !dev.qpns.contains(&q) {
                        break q;
                    }
                };
                let b = write_packet(
                    qpn,
                    Psn::new(rng.gen_range(0..1 << 24)),
                    0x1000,
                    1,
                    &[7; 32],
                );
                (stranger, b)
            }
        };
        let mut bytes = bytes;
        let Ok(std::net::SocketAddr::V4(local)) = sock.local_addr() else {
            return;
        };
        let ep = Ipv4Endpoints {
            src: *local.ip(),
            dst: *to.ip(),
            ip_id: 0,
            src_port: local.port(),
            dst_port: to.port(),
        };
        if kind != 0 {
            write_icrc(&ep, &mut bytes);
            if kind == 2 {
                let n = bytes.len();
                let flip: u32 = rng.gen_range(1..=u32::MAX);
                for (b, f) in bytes[n - 4..].iter_mut().zip(flip.to_le_bytes()) {
                    *b ^= f;
                }
            }
        }
        let lucky = matches!(kind, 0 | 2) && icrc_ip_id(&ep, &bytes).is_some();
        if sock.send_to(&bytes, to).is_ok() {
            dev.sent[kind] += 1;
            dev.sent[LUCKY] += u64::from(lucky);
        }
    }
}

/// An RC WRITE ONLY to `qpn` at `psn` with `payload`, its ICRC slot zeroed.
fn write_packet(qpn: u32, psn: Psn, va: u64, rkey: u32, payload: &[u8]) -> Vec<u8> {
    let mut r = PacketRepr::new(Opcode::RcRdmaWriteOnly, qpn, psn);
    r.reth = Some(RethRepr {
        va,
        rkey,
        dma_len: payload.len() as u32,
    });
    let mut b = vec![0u8; r.buffer_len(payload.len())];
    let n = r.emit(&mut b, payload);
    b.truncate(n);
    b
}

/// Datagrams the kernel dropped at the socket bound to `ip:port` (the last column of
/// `/proc/net/udp`), if the kernel says.
pub(crate) fn kernel_drops(ip: Ipv4Addr, port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/udp").ok()?;
    let local = format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), port);
    let mut total = None;
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.get(1) == Some(&local.as_str()) {
            let n: u64 = f.last()?.parse().ok()?;
            *total.get_or_insert(0) += n;
        }
    }
    total
}

/// What one device counted, against what it was sent: the problems found (empty when
/// the counts add up). `icrc` is the device's `icrc_errors`; `c` its engine counters;
/// `drops` what the kernel dropped at its socket (legitimate datagrams too), if known.
pub(crate) fn check_counts(
    sent: &JunkCounts,
    icrc: u64,
    c: &emu_core::engine::Counters,
    drops: Option<u64>,
) -> Vec<String> {
    let [random, truncated, bad_icrc, unknown, wrong_psn, lucky] = *sent;
    let lost = drops.unwrap_or(u64::MAX / 4);
    let mut bad = Vec::new();
    let mut want = |ok: bool, what: String| {
        if !ok {
            bad.push(what);
        }
    };
    let icrc_sent = random + bad_icrc - lucky;
    want(
        icrc <= icrc_sent,
        format!("icrc_errors {icrc} > {icrc_sent} junk datagrams with a bad ICRC: a good datagram failed its ICRC check"),
    );
    want(
        icrc + lost >= icrc_sent,
        format!("icrc_errors {icrc} < {icrc_sent} sent with a bad ICRC (kernel drops {drops:?})"),
    );
    want(
        c.rx_malformed <= truncated + lucky,
        format!(
            "rx_malformed {} > {truncated} truncated junk datagrams",
            c.rx_malformed
        ),
    );
    want(
        c.rx_malformed + lost >= truncated,
        format!(
            "rx_malformed {} < {truncated} truncated junk datagrams",
            c.rx_malformed
        ),
    );
    want(
        c.rx_unknown_qp + lost >= unknown,
        format!(
            "rx_unknown_qp {} < {unknown} sent to unknown QPNs",
            c.rx_unknown_qp
        ),
    );
    let psn_counted = c.out_of_sequence + c.duplicate_requests + c.rx_unknown_qp;
    want(
        psn_counted + lost >= unknown + wrong_psn,
        format!(
            "out_of_sequence + duplicate_requests + rx_unknown_qp = {psn_counted} < {} wrong-PSN and unknown-QPN junk datagrams",
            unknown + wrong_psn
        ),
    );
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_that_add_up_pass_and_others_are_named() {
        let c = emu_core::engine::Counters {
            rx_malformed: 10,
            rx_unknown_qp: 25,
            out_of_sequence: 18,
            duplicate_requests: 3,
            ..Default::default()
        };
        assert!(check_counts(&[100, 10, 20, 20, 20, 0], 120, &c, Some(0)).is_empty());
        let bad = check_counts(&[100, 10, 20, 20, 20, 0], 121, &c, Some(0));
        assert!(bad[0].contains("a good datagram failed"), "{bad:?}");
        let bad = check_counts(&[100, 12, 20, 20, 20, 0], 120, &c, Some(1));
        assert!(bad[0].contains("rx_malformed 10 < 12"), "{bad:?}");
        // Drops the kernel made excuse a shortfall.
        assert!(check_counts(&[100, 12, 20, 20, 20, 0], 120, &c, Some(2)).is_empty());
        // Junk whose ICRC passed by chance is not an ICRC error, and may show as
        // malformed; nothing else excuses a shortfall.
        assert!(check_counts(&[100, 8, 20, 20, 20, 2], 118, &c, Some(0)).is_empty());
        let bad = check_counts(&[100, 8, 20, 20, 20, 2], 117, &c, Some(0));
        assert!(bad[0].contains("icrc_errors 117 < 118"), "{bad:?}");
        let bad = check_counts(&[100, 8, 20, 20, 20, 1], 119, &c, Some(0));
        assert!(bad[0].contains("rx_malformed 10 > 8"), "{bad:?}");
    }

    /// The sender's "passes by chance" is the device's ICRC check: a random datagram
    /// that passes it is rare (about 2^-16) but exists, and a changed byte fails it.
    #[test]
    fn some_random_datagrams_pass_the_icrc_check() {
        let ep = Ipv4Endpoints {
            src: Ipv4Addr::new(127, 0, 62, 9),
            dst: Ipv4Addr::new(127, 0, 62, 1),
            ip_id: 0,
            src_port: 40_000,
            dst_port: 4791,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut passed = 0;
        for _ in 0..400_000 {
            let b: Vec<u8> = (0..rng.gen_range(4..64)).map(|_| rng.gen()).collect();
            if icrc_ip_id(&ep, &b).is_some() {
                passed += 1;
                let mut c = b.clone();
                c[0] ^= 1;
                assert!(icrc_ip_id(&ep, &c).is_none());
            }
        }
        assert!((1..=20).contains(&passed), "{passed} of 400000 passed");
    }

    #[test]
    fn kernel_drops_finds_a_bound_socket() {
        let s = UdpSocket::bind((Ipv4Addr::new(127, 0, 69, 77), 0)).unwrap();
        let port = s.local_addr().unwrap().port();
        if std::fs::metadata("/proc/net/udp").is_err() {
            return;
        }
        assert_eq!(kernel_drops(Ipv4Addr::new(127, 0, 69, 77), port), Some(0));
        assert_eq!(kernel_drops(Ipv4Addr::new(127, 0, 69, 78), port), None);
    }
}
