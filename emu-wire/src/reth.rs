//! The RDMA Extended Transport Header, 16 bytes (IBTA 9.3.3): VA, R_Key, DMA length.

/// RETH length in bytes.
pub const HEADER_LEN: usize = 16;

header_view!(
    /// A view of a RETH.
    RethPacket,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> RethPacket<T> {
    /// Virtual address.
    pub fn va(&self) -> u64 {
        self.u64_at(0)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.u32_at(8)
    }
    /// DMA length.
    pub fn dma_len(&self) -> u32 {
        self.u32_at(12)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RethPacket<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        self.put_u64(0, v)
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, v: u32) {
        self.put_u32(8, v)
    }
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        self.put_u32(12, v)
    }
}

/// The fields of a RETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RethRepr {
    /// Virtual address of the remote buffer.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole RDMA operation.
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads a RETH.
    pub fn parse<T: AsRef<[u8]>>(p: &RethPacket<T>) -> crate::Result<Self> {
        p.check_len()?;
        Ok(RethRepr {
            va: p.va(),
            rkey: p.rkey(),
            dma_len: p.dma_len(),
        })
    }
    /// Writes a RETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut RethPacket<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_dma_len(self.dma_len);
    }
    /// [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let r = RethRepr {
            va: 0x0000_7fa9_d4ea_f000,
            rkey: 0x25a,
            dma_len: 3003,
        };
        let mut b = [0u8; 16];
        r.emit(&mut RethPacket::new_unchecked(&mut b[..]));
        assert_eq!(
            b,
            [0, 0, 0x7f, 0xa9, 0xd4, 0xea, 0xf0, 0, 0, 0, 0x02, 0x5a, 0, 0, 0x0b, 0xbb]
        );
        let p = RethPacket::new_checked(&b[..]).unwrap();
        assert_eq!(RethRepr::parse(&p), Ok(r));
        assert_eq!(r.buffer_len(), HEADER_LEN);
        assert_eq!(
            RethPacket::new_checked(&b[..15]).unwrap_err(),
            crate::Error::Truncated
        );
    }
}
