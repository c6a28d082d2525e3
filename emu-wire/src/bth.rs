//! The Base Transport Header, 12 bytes (IBTA 9.2).

use crate::error::{Error, Result};
use crate::opcode::Opcode;
use crate::psn::Psn;

/// BTH length in bytes.
pub const HEADER_LEN: usize = 12;

/// A view of a BTH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct BthPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BthPacket<T> {
    /// Wraps a buffer without checking its length.
    pub fn new_unchecked(buffer: T) -> Self {
        BthPacket { buffer }
    }

    /// Wraps a buffer of at least [`HEADER_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = BthPacket { buffer };
        p.check_len()?;
        Ok(p)
    }

    /// [`Error::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The opcode byte.
    pub fn opcode(&self) -> u8 {
        self.b()[0]
    }
    /// Solicited event (SE).
    pub fn solicited(&self) -> bool {
        self.b()[1] & 0x80 != 0
    }
    /// Migration request (M).
    pub fn mig_req(&self) -> bool {
        self.b()[1] & 0x40 != 0
    }
    /// Pad count: bytes after the payload that make it a multiple of 4.
    pub fn pad_count(&self) -> u8 {
        (self.b()[1] >> 4) & 0x3
    }
    /// Transport header version.
    pub fn tver(&self) -> u8 {
        self.b()[1] & 0xF
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        u16::from_be_bytes([self.b()[2], self.b()[3]])
    }
    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.b()[4] & 0x80 != 0
    }
    /// Backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.b()[4] & 0x40 != 0
    }
    /// Destination QP number.
    pub fn dest_qp(&self) -> u32 {
        u32::from_be_bytes([0, self.b()[5], self.b()[6], self.b()[7]])
    }
    /// Acknowledge request (A).
    pub fn ack_req(&self) -> bool {
        self.b()[8] & 0x80 != 0
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(u32::from_be_bytes([
            0,
            self.b()[9],
            self.b()[10],
            self.b()[11],
        ]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BthPacket<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets the opcode byte.
    pub fn set_opcode(&mut self, v: u8) {
        self.m()[0] = v;
    }
    /// Sets byte 1: SE, M, pad count, and TVer 0.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8) {
        self.m()[1] =
            (u8::from(solicited) << 7) | (u8::from(mig_req) << 6) | ((pad_count & 3) << 4);
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, v: u16) {
        self.m()[2..4].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets FECN and BECN; the reserved bits are written 0.
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.m()[4] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }
    /// Sets the destination QP number (24 bits).
    pub fn set_dest_qp(&mut self, v: u32) {
        self.m()[5..8].copy_from_slice(&v.to_be_bytes()[1..]);
    }
    /// Sets AckReq and the PSN; the reserved bits are written 0.
    pub fn set_ack_req_psn(&mut self, ack_req: bool, psn: Psn) {
        let b = psn.value().to_be_bytes();
        let m = self.m();
        m[8] = u8::from(ack_req) << 7;
        m[9..12].copy_from_slice(&b[1..]);
    }
}

/// The fields of a BTH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BthRepr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Pad count (0..=3).
    pub pad_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// Parses a BTH: the opcode must be one this crate knows ([`Error::UnknownOpcode`])
    /// and TVer 0 ([`Error::BadVersion`]).
    pub fn parse<T: AsRef<[u8]>>(p: &BthPacket<T>) -> Result<BthRepr> {
        p.check_len()?;
        // IBTA 9.2.1 OpCode.
        let opcode = Opcode::try_from(p.opcode())?;
        // IBTA 9.2 BTH: the transport header version is 0; other versions are dropped.
        if p.tver() != 0 {
            return Err(Error::BadVersion(p.tver()));
        }
        Ok(BthRepr {
            opcode,
            solicited: p.solicited(),
            mig_req: p.mig_req(),
            pad_count: p.pad_count(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }

    /// Writes the BTH: TVer 0 and the reserved bits 0 (IBTA 9.2).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut BthPacket<T>) {
        p.set_opcode(self.opcode as u8);
        p.set_flags(self.solicited, self.mig_req, self.pad_count);
        p.set_pkey(self.pkey);
        p.set_ecn(self.fecn, self.becn);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req_psn(self.ack_req, self.psn);
    }

    /// [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

/// Bytes of pad that make a payload of `payload_len` a multiple of 4.
pub const fn pad_count(payload_len: usize) -> u8 {
    // IBTA 9.2 BTH PadCnt: the payload is padded to a 4-byte boundary before the ICRC.
    ((4 - payload_len % 4) % 4) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The BTH of the corpus's RC_SEND_LAST frame: pad 2, AckReq, PSN 0xfffffb, QP 0x11.
    const SEND_LAST: [u8; 12] = [
        0x02, 0x20, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0xff, 0xff, 0xfb,
    ];

    #[test]
    fn pad_count_reaches_a_multiple_of_four() {
        assert_eq!(pad_count(0), 0);
        assert_eq!(pad_count(1), 3);
        assert_eq!(pad_count(2), 2);
        assert_eq!(pad_count(3), 1);
        assert_eq!(pad_count(4), 0);
        assert_eq!(pad_count(954), 2);
        for n in 0..64 {
            assert_eq!((n + usize::from(pad_count(n))) % 4, 0);
            assert!(pad_count(n) < 4);
        }
    }

    #[test]
    fn parses_and_emits_a_captured_bth() {
        let p = BthPacket::new_checked(&SEND_LAST[..]).unwrap();
        let r = BthRepr::parse(&p).unwrap();
        assert_eq!(r.opcode, Opcode::RcSendLast);
        assert_eq!((r.solicited, r.mig_req, r.pad_count), (false, false, 2));
        assert_eq!((r.pkey, r.fecn, r.becn), (0xffff, false, false));
        assert_eq!(
            (r.dest_qp, r.ack_req, r.psn),
            (0x11, true, Psn::new(0xff_fffb))
        );
        let mut out = [0xAAu8; 12];
        r.emit(&mut BthPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, SEND_LAST);
        assert_eq!(r.buffer_len(), HEADER_LEN);
    }

    #[test]
    fn reserved_bits_are_ignored_on_parse_and_written_zero() {
        let mut b = SEND_LAST;
        b[4] = 0xC0 | 0x3F; // FECN, BECN, resv6
        b[8] = 0x80 | 0x7F; // AckReq, resv7
        let r = BthRepr::parse(&BthPacket::new_unchecked(&b[..])).unwrap();
        assert!(r.fecn && r.becn && r.ack_req);
        let mut out = [0xFFu8; 12];
        r.emit(&mut BthPacket::new_unchecked(&mut out[..]));
        assert_eq!((out[4], out[8]), (0xC0, 0x80));
    }

    #[test]
    fn bad_version_unknown_opcode_and_truncation() {
        let mut b = SEND_LAST;
        b[1] |= 0x01;
        let p = BthPacket::new_unchecked(&b[..]);
        assert_eq!(p.tver(), 1);
        assert_eq!(BthRepr::parse(&p), Err(Error::BadVersion(1)));
        b[0] = 0x15; // RESYNC
        assert_eq!(
            BthRepr::parse(&BthPacket::new_unchecked(&b[..])),
            Err(Error::UnknownOpcode(0x15))
        );
        assert_eq!(
            BthPacket::new_checked(&SEND_LAST[..11]).unwrap_err(),
            Error::Truncated
        );
    }

    #[test]
    fn setters_mask_to_field_width() {
        let mut b = [0u8; 12];
        let mut p = BthPacket::new_unchecked(&mut b[..]);
        p.set_flags(true, true, 0xFF);
        p.set_dest_qp(0xAB12_3456);
        p.set_ack_req_psn(false, Psn::new(0x1FF_FFFF));
        assert!(p.solicited() && p.mig_req());
        assert_eq!((p.pad_count(), p.tver()), (3, 0));
        assert_eq!(p.dest_qp(), 0x12_3456);
        assert_eq!(p.psn(), Psn::new(0xFF_FFFF));
        assert_eq!(p.into_inner()[..2], [0x00, 0xF0]);
    }
}
