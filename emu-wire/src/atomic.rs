//! AtomicETH, 28 bytes (IBTA 9.3.4), and AtomicAckETH, 8 bytes (IBTA 9.3.6).

/// AtomicETH length in bytes.
pub const ATOMIC_ETH_LEN: usize = 28;
/// AtomicAckETH length in bytes.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;

header_view!(
    /// A view of an AtomicETH.
    AtomicEthPacket,
    ATOMIC_ETH_LEN
);

impl<T: AsRef<[u8]>> AtomicEthPacket<T> {
    /// Virtual address of the 8-byte target.
    pub fn va(&self) -> u64 {
        self.u64_at(0)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.u32_at(8)
    }
    /// Swap value (COMPARE_SWAP) or addend (FETCH_ADD).
    pub fn swap_add(&self) -> u64 {
        self.u64_at(12)
    }
    /// Compare value (COMPARE_SWAP).
    pub fn compare(&self) -> u64 {
        self.u64_at(20)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEthPacket<T> {
    /// Sets every field.
    pub fn set(&mut self, va: u64, rkey: u32, swap_add: u64, compare: u64) {
        self.put_u64(0, va);
        self.put_u32(8, rkey);
        self.put_u64(12, swap_add);
        self.put_u64(20, compare);
    }
}

/// The fields of an AtomicETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AtomicEthRepr {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value or addend.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads an AtomicETH.
    pub fn parse<T: AsRef<[u8]>>(p: &AtomicEthPacket<T>) -> crate::Result<Self> {
        p.check_len()?;
        Ok(AtomicEthRepr {
            va: p.va(),
            rkey: p.rkey(),
            swap_add: p.swap_add(),
            compare: p.compare(),
        })
    }
    /// Writes an AtomicETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AtomicEthPacket<T>) {
        p.set(self.va, self.rkey, self.swap_add, self.compare);
    }
    /// [`ATOMIC_ETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ETH_LEN
    }
}

header_view!(
    /// A view of an AtomicAckETH.
    AtomicAckEthPacket,
    ATOMIC_ACK_ETH_LEN
);

impl<T: AsRef<[u8]>> AtomicAckEthPacket<T> {
    /// The original remote value.
    pub fn orig(&self) -> u64 {
        self.u64_at(0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEthPacket<T> {
    /// Sets the original remote value.
    pub fn set_orig(&mut self, v: u64) {
        self.put_u64(0, v);
    }
}

/// The fields of an AtomicAckETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AtomicAckEthRepr {
    /// The value at the target before the atomic operation.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Reads an AtomicAckETH.
    pub fn parse<T: AsRef<[u8]>>(p: &AtomicAckEthPacket<T>) -> crate::Result<Self> {
        p.check_len()?;
        Ok(AtomicAckEthRepr { orig: p.orig() })
    }
    /// Writes an AtomicAckETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AtomicAckEthPacket<T>) {
        p.set_orig(self.orig);
    }
    /// [`ATOMIC_ACK_ETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ACK_ETH_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let r = AtomicEthRepr {
            va: 0x0102_0304_0506_0708,
            rkey: 0x1112_1314,
            swap_add: 0x2122_2324_2526_2728,
            compare: 0x3132_3334_3536_3738,
        };
        let mut b = [0u8; ATOMIC_ETH_LEN];
        r.emit(&mut AtomicEthPacket::new_unchecked(&mut b[..]));
        assert_eq!(&b[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[8..12], &[0x11, 0x12, 0x13, 0x14]);
        assert_eq!(b[12], 0x21);
        assert_eq!(b[20], 0x31);
        assert_eq!(b[27], 0x38);
        assert_eq!(
            AtomicEthRepr::parse(&AtomicEthPacket::new_checked(&b[..]).unwrap()),
            Ok(r)
        );
        assert!(AtomicEthPacket::new_checked(&b[..27]).is_err());
        let a = AtomicAckEthRepr {
            orig: 0x1122_3344_5566_7788,
        };
        let mut b = [0u8; ATOMIC_ACK_ETH_LEN];
        a.emit(&mut AtomicAckEthPacket::new_unchecked(&mut b[..]));
        assert_eq!(b, [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        assert_eq!(
            AtomicAckEthRepr::parse(&AtomicAckEthPacket::new_unchecked(&b[..])),
            Ok(a)
        );
        assert_eq!(a.buffer_len() + r.buffer_len(), 36);
    }
}
