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
