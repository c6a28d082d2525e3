//! Maps keyed by the engine's own 32-bit ids (QPNs, CQ, SRQ, PD, MR and AH numbers):
//! a multiplicative hash instead of SipHash, which showed in profiles of 10,000 QPs
//! (a lookup per packet). The keys are ids the engine handed out itself; a peer can
//! only look them up (a QPN or R_Key in a packet), never insert one, so there is no
//! flooding to defend against. QPs, the one map walked in order by a busy device,
//! keep the QPN's order in memory ([`QpMap`]).

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

/// A `HashMap` keyed by QPN whose buckets follow the QPNs' order (see [`QpnHasher`]).
pub(crate) type QpMap<V> = HashMap<u32, V, BuildHasherDefault<QpnHasher>>;

/// The QPN itself in the low bits (which pick the bucket) and a mixed tag in the top
/// seven bits (which hashbrown compares first). The engine hands out QPNs in sequence,
/// so consecutive QPs sit in consecutive buckets: work that visits QPs in QPN order,
/// as a round robin over many QPs does, walks memory the CPU prefetches instead of
/// missing the cache per QP (`bench write_bw --qps 10000`: 10-15% more messages per
/// second than with [`IdHasher`]). A peer cannot insert a QPN, so there is nothing to
/// flood; only QPNs a table size apart share a probe sequence, a pattern sequential
/// allocation does not make.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct QpnHasher(u64);

impl Hasher for QpnHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u32(&mut self, n: u32) {
        let tag = u64::from(n).wrapping_mul(PHI) & (0x7F << 57);
        self.0 = u64::from(n) | tag;
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

    /// What a map with hasher `H` makes of key `n`.
    fn hash<H: Hasher + Default>(n: u32) -> u64 {
        let mut s = H::default();
        s.write_u32(n);
        s.finish()
    }

    #[test]
    fn qpns_pick_buckets_in_order_and_tags_apart() {
        let h = hash::<QpnHasher>;
        // hashbrown picks the bucket from the low bits and compares the top seven
        // first: the low bits are the QPN, the top seven differ between neighbours.
        let tags: Vec<u64> = (0x11..0x11 + 128u32).map(|n| h(n) >> 57).collect();
        for n in (0..0x0100_0000u32).step_by(4099).chain([0x00FF_FFFF]) {
            assert_eq!(h(n) as u32, n);
        }
        let mut distinct = tags.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 64, "{} tags for 128 QPNs", distinct.len());
        assert!(tags.windows(2).all(|w| w[0] != w[1]));
    }

    #[test]
    fn qp_map_holds_sequential_wrapping_and_sparse_qpns() {
        let mut m: QpMap<u32> = QpMap::default();
        let keys: Vec<u32> = (0x00FF_F000..=0x00FF_FFFF)
            .chain(0x11..0x2000)
            .chain((0..5000).map(|i| 0x0010_0000 + i * 65_536 % 0x00F0_0000 + i))
            .collect();
        for &k in &keys {
            m.insert(k, k ^ 1);
        }
        assert_eq!(m.len(), keys.len());
        assert!(keys.iter().all(|k| m.get(k) == Some(&(k ^ 1))));
        assert_eq!(m.get(&0x10), None);
    }

    #[test]
    fn distinct_small_keys_hash_apart() {
        let h = hash::<IdHasher>;
        let mut seen: Vec<u64> = (0..4096).map(h).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 4096);
    }
}
