//! The soak's seeded fault schedule: whether a packet is dropped, duplicated or
//! delayed is a function of the seed and the packet's identity (sender, receiver,
//! opcode, PSN, and how many packets of that identity came before it), not of when it
//! was sent. So the UDP run (a [`RuleHook`](crate::RuleHook) per device) and its replay
//! on the [`Fabric`](crate::Fabric) (a [`Rule`] per device) do the same thing to the
//! same packet, whatever the threads' timing: a retransmission is a new occurrence
//! and draws again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::rules::{Action, PacketInfo, Rule};

/// The rates of the random faults (each a probability per packet).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultRates {
    /// A packet is lost.
    pub loss: f64,
    /// A packet arrives twice.
    pub duplicate: f64,
    /// A packet is held back (0.2 to 3 ms), so later ones overtake it.
    pub reorder: f64,
}

/// What the schedule did, counted over every device's rule.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Packets the schedule saw.
    pub seen: AtomicU64,
    /// Packets dropped.
    pub dropped: AtomicU64,
    /// Packets duplicated.
    pub duplicated: AtomicU64,
    /// Packets delayed.
    pub delayed: AtomicU64,
}

/// FNV-1a, 64 bits: a hash that is the same on every platform and Rust version.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// SplitMix64's finaliser: mixes all 64 bits.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Buckets of the occurrence counts (packets whose identities share a bucket share a
/// count, which keeps the memory fixed; the schedule stays a function of the packets).
const BUCKETS: usize = 1 << 14;

/// The schedule of one sending device.
pub(crate) struct Schedule {
    seed: u64,
    me: String,
    rates: FaultRates,
    occurrences: Vec<u32>,
    counts: Arc<FaultCounts>,
}

impl Schedule {
    pub(crate) fn new(seed: u64, me: &str, rates: FaultRates, counts: Arc<FaultCounts>) -> Self {
        Schedule {
            seed,
            me: me.to_owned(),
            rates,
            occurrences: vec![0; BUCKETS],
            counts,
        }
    }

    /// The fault for one packet `me` sends (None: it goes on untouched).
    pub(crate) fn decide(&mut self, p: &PacketInfo<'_>) -> Option<Action> {
        if p.src != self.me {
            return None;
        }
        let c = &self.counts;
        c.seen.fetch_add(1, Ordering::Relaxed);
        let identity = mix(self.seed
            ^ fnv(p.src.as_bytes())
            ^ fnv(p.dst.as_bytes()).rotate_left(17)
            ^ (u64::from(u8::from(p.repr.bth.opcode)) << 32)
            ^ u64::from(p.repr.bth.psn.value()));
        let bucket = &mut self.occurrences[(identity as usize) % BUCKETS];
        let nth = *bucket;
        *bucket = bucket.wrapping_add(1);
        let draw = mix(identity ^ u64::from(nth).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        let u = (draw >> 11) as f64 / (1u64 << 53) as f64;
        let r = self.rates;
        if u < r.loss {
            c.dropped.fetch_add(1, Ordering::Relaxed);
            Some(Action::Drop)
        } else if u < r.loss + r.duplicate {
            c.duplicated.fetch_add(1, Ordering::Relaxed);
            Some(Action::Duplicate)
        } else if u < r.loss + r.duplicate + r.reorder {
            c.delayed.fetch_add(1, Ordering::Relaxed);
            let us = 200 + (mix(draw) % 2800);
            Some(Action::Delay(Duration::from_micros(us)))
        } else {
            None
        }
    }
}

/// The rule that applies the schedule to the packets device `me` (named by its
/// address in text, as [`RuleHook`](crate::RuleHook) names devices) sends.
pub(crate) fn rule(seed: u64, me: &str, rates: FaultRates, counts: Arc<FaultCounts>) -> Rule {
    let mut s = Schedule::new(seed, me, rates, counts);
    Rule::custom(format!("chaos {me}"), move |p| s.decide(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use emu_wire::{Opcode, PacketRepr, Psn};

    fn info<'a>(repr: &'a PacketRepr, src: &'a str) -> PacketInfo<'a> {
        PacketInfo {
            index: 0,
            src,
            dst: "127.0.60.2",
            repr,
            payload_len: 0,
        }
    }

    const RATES: FaultRates = FaultRates {
        loss: 0.1,
        duplicate: 0.1,
        reorder: 0.1,
    };

    #[test]
    fn the_same_packets_get_the_same_faults_and_other_devices_none() {
        let run = |seed| {
            let mut s = Schedule::new(seed, "127.0.60.1", RATES, Arc::default());
            (0..2000u32)
                .map(|i| {
                    // Every PSN twice: a retransmission draws again.
                    let r = PacketRepr::new(Opcode::RcRdmaWriteOnly, 9, Psn::new(i / 2));
                    s.decide(&info(&r, "127.0.60.1"))
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let faults = run(7).iter().filter(|a| a.is_some()).count();
        assert!((450..750).contains(&faults), "{faults} of 2000 at 30%");
        let mut s = Schedule::new(7, "127.0.60.1", RATES, Arc::default());
        let r = PacketRepr::new(Opcode::RcAcknowledge, 9, Psn::new(1));
        assert!((0..100).all(|_| s.decide(&info(&r, "127.0.60.2")).is_none()));
    }

    #[test]
    fn counts_follow_the_actions() {
        let counts = Arc::new(FaultCounts::default());
        let mut s = Schedule::new(1, "a", RATES, counts.clone());
        let mut drops = 0;
        for i in 0..1000 {
            let r = PacketRepr::new(Opcode::RcSendOnly, 3, Psn::new(i));
            drops += u64::from(s.decide(&info(&r, "a")) == Some(Action::Drop));
        }
        assert_eq!(counts.seen.load(Ordering::Relaxed), 1000);
        assert_eq!(counts.dropped.load(Ordering::Relaxed), drops);
    }
}
