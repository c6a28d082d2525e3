//! Maps keyed by the engine's own 32-bit ids (QPNs, CQ, SRQ, PD, MR and AH numbers):
//! a multiplicative hash instead of SipHash, which showed in profiles of 10,000 QPs
//! (a lookup per packet). The keys are ids the engine handed out itself; a peer can
//! only look them up (a QPN or R_Key in a packet), never insert one, so there is no
//! flooding to defend against.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by an engine id.
pub(crate) type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing: the key times 2^64 / phi. Distinct keys that differ in their
/// low bits land in distinct buckets, and the high bits (hashbrown's tag) are mixed.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct IdHasher(u64);

const PHI: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(PHI);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(PHI);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_many_sequential_and_sparse_ids() {
        let mut m: IdMap<u32> = IdMap::default();
        for i in 0..20_000u32 {
            m.insert(i, i);
            m.insert(0x0100_0000 + i * 4099, i + 1);
        }
        assert_eq!(m.len(), 40_000);
        for i in 0..20_000u32 {
            assert_eq!(m.get(&i), Some(&i));
            assert_eq!(m.get(&(0x0100_0000 + i * 4099)), Some(&(i + 1)));
        }
        assert_eq!(m.get(&20_000), None);
    }

    #[test]
    fn distinct_small_keys_hash_apart() {
        let h = |n: u32| {
            let mut s = IdHasher::default();
            s.write_u32(n);
            s.finish()
        };
        let mut seen: Vec<u64> = (0..4096).map(h).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 4096);
    }
}
