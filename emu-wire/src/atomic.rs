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
