//! The XRC Extended Transport Header, 4 bytes (IBTA vol. 1, XRC annex A14; 9.3.x
//! XRCETH): which XRC shared receive queue at the target an XRC request is for.
//!
//! Every XRC *request* packet (opcodes `0xA0 + n`: SEND, RDMA WRITE, RDMA READ
//! REQUEST, COMPARE SWAP, FETCH ADD) carries it right after the BTH and before any
//! RETH, AtomicETH, ImmDt or IETH; XRC responses (ACKs, READ responses) do not.
//!
//! Layout, one big-endian 32-bit word: 8 reserved bits (sent as zero, ignored on
//! receipt), then the 24-bit XRC SRQ number.

/// XRCETH length in bytes.
pub const HEADER_LEN: usize = 4;

const SRQN_MASK: u32 = 0x00FF_FFFF;

header_view!(
    /// A view of an XRCETH.
    XrcEthPacket,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> XrcEthPacket<T> {
    /// The XRC SRQ number (24 bits; the byte before it is reserved).
    pub fn xrc_srqn(&self) -> u32 {
        self.u32_at(0) & SRQN_MASK
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> XrcEthPacket<T> {
    /// Sets the XRC SRQ number (its low 24 bits) and writes the reserved byte 0.
    pub fn set_xrc_srqn(&mut self, srqn: u32) {
        self.put_u32(0, srqn & SRQN_MASK);
    }
}

/// The fields of an XRCETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct XrcEthRepr {
    /// The XRC SRQ number at the target (24 bits).
    pub xrc_srqn: u32,
}

impl XrcEthRepr {
    /// Reads an XRCETH (the reserved byte is ignored).
    pub fn parse<T: AsRef<[u8]>>(p: &XrcEthPacket<T>) -> crate::Result<Self> {
        p.check_len()?;
        Ok(XrcEthRepr {
            xrc_srqn: p.xrc_srqn(),
        })
    }
    /// Writes an XRCETH, reserved byte zero; bits of the SRQ number beyond 24 are
    /// dropped.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut XrcEthPacket<T>) {
        p.set_xrc_srqn(self.xrc_srqn);
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
    fn layout_and_reserved_byte() {
        let b = [0xAB, 0x12, 0x34, 0x56];
        let r = XrcEthRepr::parse(&XrcEthPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.xrc_srqn, 0x12_3456, "reserved byte ignored");
        let mut out = [0xFFu8; 4];
        XrcEthRepr {
            xrc_srqn: 0xFF12_3456,
        }
        .emit(&mut XrcEthPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, [0x00, 0x12, 0x34, 0x56], "reserved byte written 0");
        assert_eq!(r.buffer_len(), HEADER_LEN);
        assert_eq!(
            XrcEthPacket::new_checked(&b[..3]).unwrap_err(),
            crate::Error::Truncated
        );
        assert!(XrcEthRepr::parse(&XrcEthPacket::new_unchecked(&b[..3])).is_err());
    }
}
