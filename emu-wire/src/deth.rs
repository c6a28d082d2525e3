//! The Datagram Extended Transport Header, 8 bytes (IBTA 9.3.2): Q_Key and source QP.

/// DETH length in bytes.
pub const HEADER_LEN: usize = 8;

header_view!(
    /// A view of a DETH.
    DethPacket,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> DethPacket<T> {
    /// Queue key.
    pub fn qkey(&self) -> u32 {
        self.u32_at(0)
    }
    /// Source QP number (24 bits; the byte before it is reserved).
    pub fn src_qp(&self) -> u32 {
        self.u32_at(4) & 0x00FF_FFFF
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DethPacket<T> {
    /// Sets Q_Key and source QP; the reserved byte is written 0.
    pub fn set(&mut self, qkey: u32, src_qp: u32) {
        self.put_u32(0, qkey);
        self.put_u32(4, src_qp & 0x00FF_FFFF);
    }
}

/// The fields of a DETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP number.
    pub src_qp: u32,
}

impl DethRepr {
    /// Reads a DETH.
    pub fn parse<T: AsRef<[u8]>>(p: &DethPacket<T>) -> crate::Result<Self> {
        p.check_len()?;
        Ok(DethRepr {
            qkey: p.qkey(),
            src_qp: p.src_qp(),
        })
    }
    /// Writes a DETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut DethPacket<T>) {
        p.set(self.qkey, self.src_qp);
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
        // the corpus's UD SEND ONLY: Q_Key 0x11111111, SrcQP 0x16
        let b = [0x11, 0x11, 0x11, 0x11, 0xAB, 0x00, 0x00, 0x16];
        let r = DethRepr::parse(&DethPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            DethRepr {
                qkey: 0x1111_1111,
                src_qp: 0x16
            }
        );
        let mut out = [0xFFu8; 8];
        DethRepr {
            qkey: 0x1111_1111,
            src_qp: 0xFF00_0016,
        }
        .emit(&mut DethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out[4], 0, "reserved byte written 0");
        assert_eq!(&out[5..], &[0, 0, 0x16]);
        assert_eq!(r.buffer_len(), HEADER_LEN);
        assert!(DethPacket::new_checked(&b[..7]).is_err());
        assert!(DethRepr::parse(&DethPacket::new_unchecked(&b[..7])).is_err());
    }
}
