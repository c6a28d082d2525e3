//! The FLUSH Extended Transport Header, 4 bytes (IBTA 1.5, Annex A19 "RDMA FLUSH",
//! 9.3.x FETH): what a FLUSH makes durable (placement type) and over what (selectivity
//! level). It follows the BTH and precedes the RETH on an RC FLUSH (opcode 0x1C), as
//! kernel rxe 6.12 sends it (`tests/data/rxe-corpus.txt`).
//!
//! Layout, one big-endian 32-bit word: bits 3..0 the placement type, bits 5..4 the
//! selectivity level, the rest reserved (sent as zero, ignored on receipt).

/// FETH length in bytes.
pub const HEADER_LEN: usize = 4;

/// Placement type bit: make the data globally visible (`IB_FLUSH_GLOBAL`,
/// libibverbs `IBV_FLUSH_GLOBAL`).
pub const PLACEMENT_GLOBAL: u8 = 1 << 0;
/// Placement type bit: make the data persistent (`IB_FLUSH_PERSISTENT`,
/// libibverbs `IBV_FLUSH_PERSISTENT`).
pub const PLACEMENT_PERSISTENT: u8 = 1 << 1;
/// Selectivity level: the memory range of the RETH (`IBV_FLUSH_RANGE`).
pub const SELECTIVITY_RANGE: u8 = 0;
/// Selectivity level: the whole memory region the R_Key names; the RETH's address
/// and length are not looked at (`IBV_FLUSH_MR`).
pub const SELECTIVITY_MR: u8 = 1;

const PLACEMENT_MASK: u32 = 0x0F;
const SELECTIVITY_MASK: u32 = 0x30;
const SELECTIVITY_SHIFT: u32 = 4;

header_view!(
    /// A view of a FETH.
    FethPacket,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> FethPacket<T> {
    /// The placement type (4 bits).
    pub fn placement_type(&self) -> u8 {
        (self.u32_at(0) & PLACEMENT_MASK) as u8
    }
    /// The selectivity level (2 bits).
    pub fn selectivity_level(&self) -> u8 {
        ((self.u32_at(0) & SELECTIVITY_MASK) >> SELECTIVITY_SHIFT) as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> FethPacket<T> {
    /// Sets the placement type (the low 4 bits of `v`) and clears the reserved bits.
    pub fn set_placement_type(&mut self, v: u8) {
        let w = self.u32_at(0) & SELECTIVITY_MASK;
        self.put_u32(0, w | (u32::from(v) & PLACEMENT_MASK));
    }
    /// Sets the selectivity level (the low 2 bits of `v`) and clears the reserved bits.
    pub fn set_selectivity_level(&mut self, v: u8) {
        let w = self.u32_at(0) & PLACEMENT_MASK;
        self.put_u32(
            0,
            w | ((u32::from(v) << SELECTIVITY_SHIFT) & SELECTIVITY_MASK),
        );
    }
}

/// The fields of a FETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FethRepr {
    /// Placement type bits ([`PLACEMENT_GLOBAL`], [`PLACEMENT_PERSISTENT`]); 4 bits.
    pub placement_type: u8,
    /// Selectivity level ([`SELECTIVITY_RANGE`], [`SELECTIVITY_MR`]); 2 bits.
    pub selectivity_level: u8,
}

impl FethRepr {
    /// Reads a FETH (reserved bits are ignored).
    pub fn parse<T: AsRef<[u8]>>(p: &FethPacket<T>) -> crate::Result<Self> {
        p.check_len()?;
        Ok(FethRepr {
            placement_type: p.placement_type(),
            selectivity_level: p.selectivity_level(),
        })
    }
    /// Writes a FETH, reserved bits zero. Bits of the fields beyond their widths are
    /// dropped.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut FethPacket<T>) {
        p.put_u32(0, 0);
        p.set_placement_type(self.placement_type);
        p.set_selectivity_level(self.selectivity_level);
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
        let r = FethRepr {
            placement_type: PLACEMENT_GLOBAL | PLACEMENT_PERSISTENT,
            selectivity_level: SELECTIVITY_MR,
        };
        let mut b = [0xFFu8; 4];
        r.emit(&mut FethPacket::new_unchecked(&mut b[..]));
        assert_eq!(b, [0, 0, 0, 0x13]);
        let p = FethPacket::new_checked(&b[..]).unwrap();
        assert_eq!(FethRepr::parse(&p), Ok(r));
        assert_eq!(r.buffer_len(), HEADER_LEN);
        assert_eq!(
            FethPacket::new_checked(&b[..3]).unwrap_err(),
            crate::Error::Truncated
        );
    }

    #[test]
    fn reserved_bits_are_ignored_and_widths_kept() {
        let b = [0xFF, 0xFF, 0xFF, 0xC6];
        let r = FethRepr::parse(&FethPacket::new_unchecked(&b[..])).unwrap();
        assert_eq!((r.placement_type, r.selectivity_level), (0x6, 0));
        let mut out = [0u8; 4];
        let wide = FethRepr {
            placement_type: 0xFF,
            selectivity_level: 0xFF,
        };
        wide.emit(&mut FethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, [0, 0, 0, 0x3F]);
    }
}
