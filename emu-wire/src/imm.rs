//! ImmDt (IBTA 9.3.7) and IETH (IBTA 9.3.8): one big-endian 32-bit word each.

/// ImmDt and IETH length in bytes.
pub const HEADER_LEN: usize = 4;

header_view!(
    /// A view of an ImmDt header: the immediate data.
    ImmDtPacket,
    HEADER_LEN
);

header_view!(
    /// A view of an IETH: the R_Key to invalidate.
    IethPacket,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> ImmDtPacket<T> {
    /// The immediate data, as carried on the wire (big-endian), in host order.
    pub fn imm_data(&self) -> u32 {
        self.u32_at(0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDtPacket<T> {
    /// Sets the immediate data.
    pub fn set_imm_data(&mut self, v: u32) {
        self.put_u32(0, v)
    }
}

impl<T: AsRef<[u8]>> IethPacket<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        self.u32_at(0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IethPacket<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, v: u32) {
        self.put_u32(0, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_endian_words() {
        let mut b = [0u8; 4];
        ImmDtPacket::new_unchecked(&mut b[..]).set_imm_data(0x1234_5678);
        assert_eq!(b, [0x12, 0x34, 0x56, 0x78]);
        assert_eq!(
            ImmDtPacket::new_checked(&b[..]).unwrap().imm_data(),
            0x1234_5678
        );
        IethPacket::new_unchecked(&mut b[..]).set_rkey(0x0800_01f7);
        assert_eq!(IethPacket::new_checked(&b[..]).unwrap().rkey(), 0x0800_01f7);
        assert!(ImmDtPacket::new_checked(&b[..3]).is_err());
        assert!(IethPacket::new_checked(&b[..0]).is_err());
    }
}
