//! The faults of one direction of a link between two devices: its configuration (loss, duplication,
//! latency and jitter, corruption, MTU, bandwidth and queue) and its state (seeded
//! ChaCha stream, partition, hold, the transmitter's busy time).

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The faults and shape of one direction of a link. `Default` is a perfect link with
/// 1 us latency.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkConfig {
    /// Probability that a packet is lost.
    pub loss: f64,
    /// Probability that a packet arrives twice.
    pub duplicate: f64,
    /// Probability that one bit of a packet is flipped (the receiver's ICRC check
    /// must drop it).
    pub corrupt: f64,
    /// Propagation delay.
    pub latency: Duration,
    /// Up to this much more delay, uniformly drawn per copy: packets overtake each
    /// other when it exceeds their spacing.
    pub jitter: Duration,
    /// The largest IPv4 packet carried (20 IP + 8 UDP + the RoCEv2 packet); larger
    /// ones are dropped, as a switch drops an oversize frame. `None`: no limit.
    pub mtu: Option<usize>,
    /// Line rate in bits per second (Ethernet frames of 14 + IP packet bytes), with a
    /// transmit queue; `None`: infinitely fast.
    pub bandwidth: Option<u64>,
    /// Bytes the transmit queue holds beyond the frame on the wire; a packet that does
    /// not fit is dropped (tail drop). Only with `bandwidth`.
    pub queue_bytes: usize,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            latency: Duration::from_micros(1),
            jitter: Duration::ZERO,
            mtu: None,
            bandwidth: None,
            queue_bytes: 64 * 1024,
        }
    }
}

/// The bytes around a RoCEv2 UDP payload on Ethernet: 14 Ethernet, 20 IPv4, 8 UDP.
pub(crate) const ETH_IP_UDP: usize = 14 + 20 + 8;

/// What the random stage decided for one packet.
#[derive(Debug, Default)]
pub(crate) struct Draw {
    pub(crate) lost: bool,
    pub(crate) corrupt_bit: Option<usize>,
    pub(crate) duplicate: bool,
}

/// A held packet: the packet, its trace record, its packet number, the multicast
/// group it was sent to.
pub(crate) type Held = (
    crate::fabric::Pkt,
    Option<usize>,
    u64,
    Option<std::net::Ipv4Addr>,
);

/// One direction's state.
#[derive(Debug)]
pub(crate) struct Direction {
    pub(crate) cfg: LinkConfig,
    rng: ChaCha8Rng,
    pub(crate) partitioned: bool,
    /// Packets kept while the direction is held.
    pub(crate) held: Option<Vec<Held>>,
    /// When the transmitter finishes the frames queued so far.
    busy_until: Duration,
}

impl Direction {
    /// A direction with its own ChaCha stream: seed `seed`, stream `stream` (one per
    /// ordered device pair), so that adding traffic on one link never changes the
    /// draws of another.
    pub(crate) fn new(cfg: LinkConfig, seed: u64, stream: u64) -> Direction {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        Direction {
            cfg,
            rng,
            partitioned: false,
            held: None,
            busy_until: Duration::ZERO,
        }
    }

    /// Whether an IP packet of `udp_len` bytes of UDP payload fits the MTU.
    pub(crate) fn fits_mtu(&self, udp_len: usize) -> bool {
        self.cfg.mtu.is_none_or(|m| 20 + 8 + udp_len <= m)
    }

    /// Queues a frame of `udp_len` bytes of UDP payload at `now` on the transmitter;
    /// returns when its last bit leaves, or `None` if the queue is full (tail drop).
    pub(crate) fn transmit(&mut self, now: Duration, udp_len: usize) -> Option<Duration> {
        let Some(bps) = self.cfg.bandwidth.filter(|b| *b > 0) else {
            return Some(now);
        };
        let frame = (ETH_IP_UDP + udp_len) as u64;
        let backlog = self.busy_until.saturating_sub(now);
        let backlog_bytes = (backlog.as_nanos() * u128::from(bps) / 8 / 1_000_000_000) as usize;
        if backlog_bytes > self.cfg.queue_bytes {
            return None;
        }
        let tx =
            Duration::from_nanos((u128::from(frame) * 8 * 1_000_000_000 / u128::from(bps)) as u64);
        self.busy_until = self.busy_until.max(now) + tx;
        Some(self.busy_until)
    }

    /// The random faults for one packet of `len` bytes. Nothing is drawn for a fault
    /// whose probability is 0, so a perfect link costs no random numbers.
    pub(crate) fn draw(&mut self, len: usize) -> Draw {
        let mut d = Draw::default();
        if self.cfg.loss > 0.0 && self.rng.gen_bool(self.cfg.loss.min(1.0)) {
            d.lost = true;
            return d;
        }
        if self.cfg.corrupt > 0.0 && self.rng.gen_bool(self.cfg.corrupt.min(1.0)) {
            // Any bit but those of BTH byte 4 (FECN, BECN, reserved), which the ICRC
            // does not cover (IBTA Annex A17.4: variant fields); on a real wire the
            // Ethernet FCS would catch that flip instead.
            let bits = len * 8;
            let mut bit = self.rng.gen_range(0..bits - 8);
            if bit >= 4 * 8 {
                bit += 8;
            }
            d.corrupt_bit = Some(bit);
        }
        if self.cfg.duplicate > 0.0 && self.rng.gen_bool(self.cfg.duplicate.min(1.0)) {
            d.duplicate = true;
        }
        d
    }

    /// Latency plus a fresh jitter draw.
    pub(crate) fn delay(&mut self) -> Duration {
        let j = self.cfg.jitter.as_nanos() as u64;
        let extra = if j > 0 { self.rng.gen_range(0..=j) } else { 0 };
        self.cfg.latency + Duration::from_nanos(extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_tail_drops_and_drains_at_line_rate() {
        let cfg = LinkConfig {
            bandwidth: Some(8_000_000_000), // 1 byte per ns
            queue_bytes: 2000,
            ..LinkConfig::default()
        };
        let mut d = Direction::new(cfg, 1, 0);
        let n = 1000 - ETH_IP_UDP; // 1000-byte frames: 1 us each
        let t0 = Duration::ZERO;
        assert_eq!(d.transmit(t0, n), Some(Duration::from_micros(1)));
        assert_eq!(d.transmit(t0, n), Some(Duration::from_micros(2)));
        assert_eq!(d.transmit(t0, n), Some(Duration::from_micros(3)));
        assert_eq!(d.transmit(t0, n), None, "2000 bytes queued: full");
        assert_eq!(
            d.transmit(Duration::from_micros(2), n),
            Some(Duration::from_micros(4)),
            "drained"
        );
    }

    #[test]
    fn draws_are_seeded_and_streams_independent() {
        let cfg = LinkConfig {
            loss: 0.5,
            ..LinkConfig::default()
        };
        let run = |seed, stream| {
            let mut d = Direction::new(cfg, seed, stream);
            (0..64).map(|_| d.draw(100).lost).collect::<Vec<_>>()
        };
        assert_eq!(run(7, 1), run(7, 1));
        assert_ne!(run(7, 1), run(7, 2));
        assert_ne!(run(7, 1), run(8, 1));
    }

    #[test]
    fn corruption_never_touches_bth_byte_4() {
        let cfg = LinkConfig {
            corrupt: 1.0,
            ..LinkConfig::default()
        };
        let mut d = Direction::new(cfg, 3, 0);
        for _ in 0..10_000 {
            let bit = d.draw(20).corrupt_bit.unwrap();
            assert!(bit < 160 && bit / 8 != 4, "{bit}");
        }
    }

    #[test]
    fn mtu_counts_ip_and_udp_headers() {
        let d = Direction::new(
            LinkConfig {
                mtu: Some(1500),
                ..LinkConfig::default()
            },
            0,
            0,
        );
        assert!(d.fits_mtu(1472));
        assert!(!d.fits_mtu(1473));
    }
}
